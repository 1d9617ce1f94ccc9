//! Unit tests of `informer.rs`.

use super::*;

fn node(name: &str) -> DynamicObject {
    let resource = Slot::Nodes.resource();
    DynamicObject::new(name, &resource)
}

#[test]
fn changes_are_everything_after_a_list_then_the_keys_touched() {
    let cache = Cache::default();
    let mut buffer = None;
    assert_eq!(cache.take_changes(Slot::Nodes), Changes::All, "never read");
    cache.apply(Slot::Nodes, Event::Init, &mut buffer);
    cache.apply(Slot::Nodes, Event::InitApply(node("a")), &mut buffer);
    cache.apply(Slot::Nodes, Event::InitDone, &mut buffer);
    assert_eq!(cache.take_changes(Slot::Nodes), Changes::All, "listed");
    assert_eq!(
        cache.take_changes(Slot::Nodes),
        Changes::Keys(BTreeSet::new())
    );
    cache.apply(Slot::Nodes, Event::Apply(node("b")), &mut buffer);
    cache.apply(Slot::Nodes, Event::Delete(node("a")), &mut buffer);
    let touched: BTreeSet<Key> = [("".into(), "a".into()), ("".into(), "b".into())].into();
    assert_eq!(cache.take_changes(Slot::Nodes), Changes::Keys(touched));
    assert!(cache.get(Slot::Nodes, "", "a").is_none());
    assert!(cache.get(Slot::Nodes, "", "b").is_some());
    // A re-list (after a 410, say) may have missed deletions: everything again.
    cache.apply(Slot::Nodes, Event::Init, &mut buffer);
    cache.apply(Slot::Nodes, Event::InitDone, &mut buffer);
    assert_eq!(cache.take_changes(Slot::Nodes), Changes::All);
}

#[test]
fn retries_back_off_doubling_to_the_cap() {
    let delays: Vec<u64> = (1..=9).map(retry_delay_ms).collect();
    assert_eq!(
        delays,
        vec![500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]
    );
    assert_eq!(retry_delay_ms(u32::MAX), WATCH_RETRY_MAX_MS);
    assert_eq!(retry_delay_ms(0), WATCH_RETRY_FIRST_MS);
}
