//! The election gate: a replica starts elections in a group only while it can
//! reach a majority of that group's voters.
//!
//! openraft 0.9 has no pre-vote. Without this gate, a replica cut off from its
//! peers keeps starting elections, and each one raises its term. When the link
//! heals, that higher term makes the healthy leaders step down: a second
//! outage, after the first one has ended. Here every replica pings each peer
//! every [`REACH_PING_MS`]; a peer counts as reachable while a ping answered
//! within the last [`REACH_WINDOW_MS`]. A ping needs both directions, so
//! one-way loss counts as unreachable. The gate also carries a leader
//! transfer's hold (a voter that promised its vote to the transfer target).
//!
//! Invariant: elections are enabled in a group exactly when self plus reachable
//! voters form a majority and no transfer hold is running. Owned by the host
//! (`RaftHost::start` spawns both loops; they stop at shutdown).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::types::NodeId;

/// Interval between pings to each peer, and between gate updates.
pub const REACH_PING_MS: u64 = 50;
/// A peer is reachable while it answered a ping this recently; also a ping's timeout.
pub const REACH_WINDOW_MS: u64 = 200;

/// Which peers answered pings, and when.
#[derive(Default)]
pub(crate) struct Reachability {
    answered: Mutex<HashMap<NodeId, Instant>>,
    in_flight: Mutex<HashSet<NodeId>>,
}

impl Reachability {
    /// Records that `peer` answered a ping now.
    pub(crate) fn answered(&self, peer: NodeId) {
        if let Ok(mut a) = self.answered.lock() {
            a.insert(peer, Instant::now());
        }
    }

    /// Whether `peer` answered within the window.
    pub(crate) fn reachable(&self, peer: NodeId, now: Instant) -> bool {
        self.answered
            .lock()
            .ok()
            .and_then(|a| a.get(&peer).copied())
            .is_some_and(|t| now.duration_since(t) <= Duration::from_millis(REACH_WINDOW_MS))
    }

    /// Marks a ping to `peer` as started; false if one is already in flight.
    pub(crate) fn start_ping(&self, peer: NodeId) -> bool {
        self.in_flight
            .lock()
            .map(|mut f| f.insert(peer))
            .unwrap_or(false)
    }

    /// Marks the ping to `peer` as ended.
    pub(crate) fn end_ping(&self, peer: NodeId) {
        if let Ok(mut f) = self.in_flight.lock() {
            f.remove(&peer);
        }
    }
}

/// Whether `me`, with the reachable voters, is a majority of `voters` (always
/// true for a replica that is no voter: it never campaigns anyway).
pub(crate) fn majority_reachable(
    me: NodeId,
    voters: &[NodeId],
    reachable: impl Fn(NodeId) -> bool,
) -> bool {
    if !voters.contains(&me) {
        return true;
    }
    let reach = voters
        .iter()
        .filter(|v| **v == me || reachable(**v))
        .count();
    reach * 2 > voters.len()
}

/// The gate's last decision per group, so openraft is told only of changes.
#[derive(Default)]
pub(crate) struct GateState {
    pub(crate) enabled: BTreeMap<u64, bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_campaigns_only_with_a_majority_in_reach() {
        let all = |_| true;
        let none = |_| false;
        assert!(majority_reachable(1, &[1, 2, 3], all));
        assert!(!majority_reachable(1, &[1, 2, 3], none));
        assert!(majority_reachable(1, &[1, 2, 3], |p| p == 3));
        assert!(!majority_reachable(1, &[1, 2, 3, 4, 5], |p| p == 3));
        assert!(majority_reachable(1, &[1], none));
        // A learner never campaigns; the gate leaves it alone.
        assert!(majority_reachable(9, &[1, 2, 3], none));
    }

    #[test]
    fn a_peer_is_reachable_only_within_the_window() {
        let r = Reachability::default();
        let now = Instant::now();
        assert!(!r.reachable(2, now));
        r.answered(2);
        assert!(r.reachable(2, Instant::now()));
        let later = Instant::now() + Duration::from_millis(REACH_WINDOW_MS + 1);
        assert!(!r.reachable(2, later));
        assert!(r.start_ping(2));
        assert!(!r.start_ping(2));
        r.end_ping(2);
        assert!(r.start_ping(2));
    }
}
