//! Unit tests of `events.rs`.

use super::*;

#[tokio::test]
async fn a_browser_that_stops_reading_is_dropped_and_the_others_keep_their_events() {
    let hub = Hub::default();
    let mut reader = hub.subscribe().expect("first browser");
    let mut stalled = hub.subscribe().expect("second browser");
    for _ in 0..UI_CLIENT_EVENTS_MAX {
        assert_eq!(hub.publish(Panel::Gangs), 0);
        assert_eq!(reader.recv().await, Some(Panel::Gangs));
    }
    assert_eq!(
        hub.publish(Panel::Fleet),
        1,
        "the stalled browser is dropped"
    );
    assert_eq!(reader.recv().await, Some(Panel::Fleet));
    assert_eq!(hub.subscribers(), 1);
    for _ in 0..UI_CLIENT_EVENTS_MAX {
        assert_eq!(stalled.recv().await, Some(Panel::Gangs), "what was queued");
    }
    assert_eq!(stalled.recv().await, None, "then its stream ends");
}

#[tokio::test]
async fn subscribers_are_bounded_and_closing_ends_every_stream() {
    let hub = Hub::default();
    let mut held: Vec<_> = (0..UI_CLIENTS_MAX)
        .map(|_| hub.subscribe().expect("within the bound"))
        .collect();
    assert_eq!(hub.subscribe().err(), Some(SubscribeError::Full));
    drop(held.pop());
    let mut late = hub
        .subscribe()
        .expect("a slot freed by a browser that left");
    hub.close();
    assert_eq!(late.recv().await, None);
    assert_eq!(held[0].recv().await, None);
    assert_eq!(hub.subscribe().err(), Some(SubscribeError::Closed));
}
