//! The cadence rule alone.

use super::*;

fn since(entries: u64, command_bytes: u64, snapshot_bytes: u64) -> SinceSnapshot {
    SinceSnapshot {
        entries,
        command_bytes,
        snapshot_bytes,
    }
}

#[test]
fn a_small_state_snapshots_by_entries() {
    assert!(!due(since(9_999, 5_000_000, 1_000), 10_000));
    assert!(due(since(10_000, 5_000_000, 1_000), 10_000));
    assert!(
        due(since(10_000, 0, 0), 10_000),
        "no snapshot yet: entries decide"
    );
}

#[test]
fn a_large_state_waits_for_a_quarter_of_its_size_in_commands() {
    let snapshot = 680_000_000;
    assert!(!due(since(1_000_000, snapshot / 4 - 1, snapshot), 10_000));
    assert!(due(since(1_000_000, snapshot / 4, snapshot), 10_000));
}
