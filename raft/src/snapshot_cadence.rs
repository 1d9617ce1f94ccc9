//! When a group builds a snapshot: once at least `every_entries` entries *and* a
//! quarter of the last snapshot's size in command bytes were applied since the last
//! one. With a small state the entry count decides (as before); with a large one the
//! bytes do, so building a snapshot (which encodes the whole state) costs a bounded
//! multiple of the log written since, however much history the state holds, and a
//! restart replays at most that quarter on top of the snapshot. Owned by the host, one
//! task per group, stopped with the host; openraft's own policy is off
//! (`SnapshotPolicy::Never`), compaction after a snapshot is openraft's as before.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::sm_store::SmShared;
use crate::types::Raft;

/// How often a group checks whether a snapshot is due.
pub const SNAPSHOT_CHECK_MS: u64 = 200;
/// A snapshot is due once the command bytes applied since the last one reach its
/// size divided by this.
pub const SNAPSHOT_SIZE_DIVISOR: u64 = 4;

/// What a group applied since its last snapshot, and that snapshot's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinceSnapshot {
    /// Log entries applied since.
    pub entries: u64,
    /// Bytes of the commands in them.
    pub command_bytes: u64,
    /// Bytes of the last snapshot (0: none yet).
    pub snapshot_bytes: u64,
}

/// Whether a snapshot is due after `since`, with at least `every_entries` entries.
pub fn due(since: SinceSnapshot, every_entries: u64) -> bool {
    since.entries >= every_entries
        && since.command_bytes >= since.snapshot_bytes / SNAPSHOT_SIZE_DIVISOR
}

/// Triggers a snapshot of the group whenever one is due, until `stop` fires.
pub(crate) async fn run(
    group: u64,
    raft: Raft,
    sm: Arc<SmShared>,
    every_entries: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(SNAPSHOT_CHECK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let since = sm.since_snapshot();
        if !due(since, every_entries) {
            continue;
        }
        tracing::debug!(group, ?since, "snapshot due");
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::warn!(group, error = %e, "could not trigger a snapshot");
            return;
        }
    }
}

#[cfg(test)]
#[path = "snapshot_cadence_tests.rs"]
mod tests;
