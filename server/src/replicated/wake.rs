//! The wake board: per shard, how many applied operations on this replica may have
//! helped a group parked because it fit nowhere (nodes changed, room freed;
//! `gangway_core::ledger::Wake`). The replica's shard state machines count them as
//! they apply entries (and count both at a snapshot restore, which may jump over any
//! change); its coordinator compares the counts with those it saw when it parked a
//! group (docs/ARCHITECTURE.md §4, "Parking").
//!
//! Not replicated state: counts differ between replicas and restart at zero with the
//! process, which also restarts the coordinator that reads them; only their changes
//! mean anything. Every entry applies on every replica, so a change the coordinator
//! missed through its own replica's lag shows up as soon as that replica applies it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gangway_core::ledger::Wake;
use gangway_core::plan::parking::ChangeCounts;

/// The counts of every shard of one replica, shared by its state machines and its
/// coordinator.
#[derive(Debug, Clone, Default)]
pub struct WakeBoard(Arc<Mutex<BTreeMap<u32, ChangeCounts>>>);

impl WakeBoard {
    /// Counts what an applied operation of `shard` may have done.
    pub fn note(&self, shard: u32, wake: Wake) {
        if wake == Wake::default() {
            return;
        }
        let mut board = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let counts = board.entry(shard).or_default();
        counts.nodes += u64::from(wake.nodes);
        counts.room += u64::from(wake.room);
    }

    /// Every shard's counts now.
    pub fn read(&self) -> BTreeMap<u32, ChangeCounts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
