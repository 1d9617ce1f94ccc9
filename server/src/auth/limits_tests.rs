//! Unit tests of `limits.rs`.

use super::*;

#[test]
fn streams_are_bounded_per_identity_and_freed_when_dropped() {
    let limits = StreamLimits::default();
    let slots: Vec<_> = (0..STREAMS_PER_IDENTITY_MAX)
        .map(|_| limits.open("team-a").expect("within the bound"))
        .collect();
    let refused = limits.open("team-a").expect_err("past the bound");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("team-a has 256 streams"),
        "{}",
        refused.message()
    );
    assert!(
        limits.open("team-b").is_ok(),
        "another identity is not affected"
    );
    drop(slots);
    assert_eq!(limits.count("team-a"), 0);
    assert!(limits.open("team-a").is_ok());
}

#[test]
fn state_hashes_are_spaced() {
    let rate = HashRate::default();
    let t0 = Instant::now();
    assert!(rate.take(t0).is_ok());
    let early = rate
        .take(t0 + Duration::from_millis(STATE_HASH_INTERVAL_MS / 2))
        .expect_err("too soon");
    assert_eq!(early.code(), tonic::Code::ResourceExhausted);
    assert!(rate
        .take(t0 + Duration::from_millis(STATE_HASH_INTERVAL_MS))
        .is_ok());
}
