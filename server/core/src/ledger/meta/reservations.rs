//! Reservations for the head of the line (docs/ARCHITECTURE.md §4, "Reservations"): nodes
//! a queued group that lacked room will take once what runs there ends, kept free of
//! groups that would delay it. Meta keeps them so that a new coordinator (another
//! replica, after a failover) enforces the same ones.
//!
//! Invariants: at most [`RESERVATIONS_MAX`]; a node is in at most one; a reservation's
//! group is queued (or being placed) and holds nothing; none outlives its
//! `expires_at_ms`: every command carrying a time prunes the expired ones and those
//! whose group moved on, and reads leave out any past their time. Pure and
//! deterministic: times come only from the commands. Written by the coordinator
//! (`MetaCommand::ReserveForHead`, `EndHeadReservation`), read by it each round and by the
//! admin API, the web view and the metrics.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{GroupRecord, GroupSeq, GroupState, RejectionKind};

/// Most reservations at once (the first groups in the fair order that lack room).
pub const RESERVATIONS_MAX: usize = 4;
/// Most nodes one reservation names, over every shard.
pub const RESERVED_NODES_MAX: usize = 16_384;
/// Longest a reservation may be made for, in ms (the coordinator renews it while its
/// group still waits).
pub const RESERVATION_TTL_MS_MAX: u64 = 3_600_000;
/// How soon a group holding a reservation is tried again after an attempt, in ms: it
/// neither parks nor backs off, so it starts within this of its room freeing.
pub const RESERVED_RETRY_MS: u64 = 500;

/// Nodes held for one queued group until it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadReservation {
    /// The group it is for.
    pub seq: GroupSeq,
    /// Its highest priority when made: groups of higher priority are not held back.
    pub priority: i32,
    /// Shard → the nodes held there, in name order.
    pub nodes: BTreeMap<u32, Vec<String>>,
    /// When its group is expected to start: the latest declared end of the groups on
    /// its nodes (None: some of them declared no run-time limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_by_ms: Option<u64>,
    /// Set when its group preempts by priority: groups below this priority on its nodes
    /// are ones it may evict when the rest of its room frees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempts_below: Option<i32>,
    /// When it was made (proposer's clock).
    pub made_at_ms: u64,
    /// When it lapses unless renewed.
    pub expires_at_ms: u64,
}

impl HeadReservation {
    /// How many nodes it holds.
    pub fn node_count(&self) -> usize {
        self.nodes.values().map(Vec::len).sum()
    }

    /// Every node it holds.
    pub fn all_nodes(&self) -> impl Iterator<Item = &String> {
        self.nodes.values().flatten()
    }

    /// Whether it still holds at `at_ms`.
    pub fn holds_at(&self, at_ms: u64) -> bool {
        at_ms < self.expires_at_ms
    }
}

/// The reservations meta keeps, by group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservations(BTreeMap<GroupSeq, HeadReservation>);

/// Why a reservation was refused.
pub type Refusal = (RejectionKind, String);

impl Reservations {
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `seq` holds one (expired ones included until pruned).
    pub fn holds(&self, seq: GroupSeq) -> bool {
        self.0.contains_key(&seq)
    }

    /// The ones still holding at `at_ms`, by group.
    pub fn active(&self, at_ms: u64) -> Vec<HeadReservation> {
        self.0
            .values()
            .filter(|r| r.holds_at(at_ms))
            .cloned()
            .collect()
    }

    /// Every one kept (tests and the checker).
    pub fn all(&self) -> impl Iterator<Item = &HeadReservation> {
        self.0.values()
    }

    /// Records `r` for `group` (replacing the group's own), or says why not: the
    /// group is not queued or holds members, the bound is reached, a node is held for
    /// another group, or its fields are out of range.
    pub fn make(&mut self, r: HeadReservation, group: Option<&GroupRecord>) -> Result<(), Refusal> {
        let refused = |why: String| Err((RejectionKind::Refused, why));
        let Some(group) = group else {
            return Err((
                RejectionKind::NotFound,
                format!("seq: no gang group {}", r.seq),
            ));
        };
        if !waits_for_room(group) {
            return refused(format!(
                "seq: gang group {} is {} or holds members; only a queued group that holds nothing is reserved for",
                r.seq,
                group.state.name()
            ));
        }
        if r.expires_at_ms <= r.made_at_ms
            || r.expires_at_ms - r.made_at_ms > RESERVATION_TTL_MS_MAX
        {
            return refused(format!(
                "expires_at_ms: {} ms after it is made, not between 1 and {RESERVATION_TTL_MS_MAX}",
                r.expires_at_ms.saturating_sub(r.made_at_ms)
            ));
        }
        let count = r.node_count();
        if count == 0 || count > RESERVED_NODES_MAX {
            return refused(format!(
                "nodes: {count} nodes, not between 1 and {RESERVED_NODES_MAX}"
            ));
        }
        // Lapsed ones hold nothing, whether or not a command pruned them yet.
        self.0.retain(|_, o| o.holds_at(r.made_at_ms));
        let mut seen = BTreeSet::new();
        if let Some(node) = r.all_nodes().find(|n| !seen.insert(n.as_str())) {
            return refused(format!("nodes: node {node} is named twice"));
        }
        if let Some((other, node)) = self.0.values().filter(|o| o.seq != r.seq).find_map(|o| {
            o.all_nodes()
                .find(|n| seen.contains(n.as_str()))
                .map(|n| (o.seq, n))
        }) {
            return Err((
                RejectionKind::Conflict,
                format!("nodes: node {node} is reserved for gang group {other}"),
            ));
        }
        if !self.0.contains_key(&r.seq) && self.0.len() >= RESERVATIONS_MAX {
            return Err((
                RejectionKind::Exhausted,
                format!("seq: {RESERVATIONS_MAX} reservations are held already"),
            ));
        }
        self.0.insert(r.seq, r);
        Ok(())
    }

    /// Drops `seq`'s reservation; whether it had one.
    pub fn end(&mut self, seq: GroupSeq) -> bool {
        self.0.remove(&seq).is_some()
    }

    /// Drops the reservations past their time at `at_ms` (when known) and those whose
    /// group no longer waits for room (`group` answers for a seq).
    pub fn prune<'a>(
        &mut self,
        at_ms: Option<u64>,
        group: impl Fn(GroupSeq) -> Option<&'a GroupRecord>,
    ) {
        self.0.retain(|seq, r| {
            at_ms.is_none_or(|at| r.holds_at(at)) && group(*seq).is_some_and(waits_for_room)
        });
    }
}

/// Whether `g` may hold a reservation: queued or being placed, holding nothing.
fn waits_for_room(g: &GroupRecord) -> bool {
    matches!(g.state, GroupState::Queued | GroupState::Placing { .. }) && g.holds_nothing()
}
