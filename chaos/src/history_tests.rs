//! Unit tests of `history.rs`.

use super::*;

#[test]
fn events_round_trip_through_jsonl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("h.jsonl");
    let h = History::new(Some(&path)).expect("history");
    h.record(Event::Invoke {
        op: 1,
        f: "place".into(),
        key: "k".into(),
        gangs: vec![],
        members: vec![],
    });
    h.record(Event::Unknown {
        op: 1,
        error: "timeout".into(),
    });
    let entries = h.entries();
    let text = std::fs::read_to_string(&path).expect("read");
    let parsed: Vec<Entry> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(parsed, entries);
    assert!(text.contains(r#""kind":"unknown""#), "{text}");
}
