//! The reservation and backfill rule (docs/ARCHITECTURE.md §4, "Reservations"): which
//! groups may use the nodes meta holds for a group at the head of the line, and which
//! instants a reservation's search tries.
//!
//! A group may be planned on a reservation's nodes when it is the reservation's own, or
//! is of higher priority (it is ahead in the order anyway), or, with backfill on,
//! cannot delay it: it declares a run-time limit that ends, counted from now, no later
//! than the reserved group's expected start; or it is of lower priority than a reserved
//! group that preempts by priority, which evicts it once the rest of its room frees.
//! Every other group plans as if those nodes were not there. Pure; the coordinator
//! asks it per group and per round.

use std::collections::{BTreeMap, BTreeSet};

use crate::ledger::meta::{GroupSeq, HeadReservation, PlacedEnd};
use crate::model::GangId;

/// Whether gangway reserves room for the head of the line, and lets others backfill it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReservationMode {
    /// No reservations: a group that lacks room waits until enough frees at once.
    #[default]
    Off,
    /// Reservations, kept free of every group of lower or equal priority.
    Reserve,
    /// Reservations, which groups that cannot delay them may use.
    Backfill,
}

impl ReservationMode {
    /// Every mode, in the order the flag lists them.
    pub const ALL: [ReservationMode; 3] = [
        ReservationMode::Off,
        ReservationMode::Reserve,
        ReservationMode::Backfill,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ReservationMode::Off => "off",
            ReservationMode::Reserve => "reserve",
            ReservationMode::Backfill => "backfill",
        }
    }
}

/// A mode name that is not one.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a reservation mode (off, reserve or backfill)")]
pub struct UnknownReservationMode(pub String);

impl std::str::FromStr for ReservationMode {
    type Err = UnknownReservationMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ReservationMode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| UnknownReservationMode(text.to_string()))
    }
}

/// What the rule needs of a group about to be planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The group.
    pub seq: GroupSeq,
    /// Its highest priority.
    pub priority: i32,
    /// Its run-time limit, in ms (None: not declared).
    pub run_limit_ms: Option<u64>,
}

/// How a group stands toward one reservation's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The reservation is its own.
    Own,
    /// It is of higher priority than the reserved group.
    Ahead,
    /// Backfill: its run-time limit ends before the reserved group's expected start.
    EndsBefore,
    /// Backfill: the reserved group may preempt it.
    Preemptible,
    /// It may not use them.
    Kept,
}

impl Use {
    /// Whether the nodes are open to it.
    pub fn allowed(self) -> bool {
        self != Use::Kept
    }
}

/// How `c`, planned at `now_ms`, stands toward reservation `r` under `mode`.
pub fn use_of(c: &Candidate, r: &HeadReservation, mode: ReservationMode, now_ms: u64) -> Use {
    if c.seq == r.seq {
        return Use::Own;
    }
    if mode == ReservationMode::Off || c.priority > r.priority {
        return Use::Ahead;
    }
    if mode == ReservationMode::Reserve {
        return Use::Kept;
    }
    let ends_before = match (c.run_limit_ms, r.starts_by_ms) {
        (Some(limit), Some(start)) => now_ms.saturating_add(limit) <= start,
        _ => false,
    };
    if ends_before {
        return Use::EndsBefore;
    }
    if r.preempts_below.is_some_and(|below| c.priority < below) {
        return Use::Preemptible;
    }
    Use::Kept
}

/// The nodes of `shard` that `c` may not be planned on at `now_ms`, in name order.
pub fn kept_from(
    c: &Candidate,
    reservations: &[HeadReservation],
    mode: ReservationMode,
    now_ms: u64,
    shard: u32,
) -> Vec<String> {
    let kept: BTreeSet<&String> = reservations
        .iter()
        .filter(|r| !use_of(c, r, mode, now_ms).allowed())
        .filter_map(|r| r.nodes.get(&shard))
        .flatten()
        .collect();
    kept.into_iter().cloned().collect()
}

/// Every reserved node of each shard, in name order: what a batch of groups none of
/// which holds a reservation is planned without.
pub fn all_reserved(reservations: &[HeadReservation]) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, BTreeSet<&String>> = BTreeMap::new();
    for r in reservations {
        for (shard, nodes) in &r.nodes {
            out.entry(*shard).or_default().extend(nodes);
        }
    }
    out.into_iter()
        .map(|(shard, nodes)| (shard, nodes.into_iter().cloned().collect()))
        .collect()
}

/// The instants a reservation's search tries, earliest first: each distinct declared
/// end after `now_ms` of the groups placed (those past theirs count as ending now), at
/// most `steps_max` of them kept evenly so the search stays bounded.
pub fn search_instants(placed: &[PlacedEnd], now_ms: u64, steps_max: usize) -> Vec<u64> {
    let ends: BTreeSet<u64> = placed
        .iter()
        .filter_map(|p| p.ends_at_ms)
        .map(|end| end.max(now_ms))
        .collect();
    let ends: Vec<u64> = ends.into_iter().collect();
    if ends.len() <= steps_max || steps_max < 2 {
        return ends;
    }
    // The last is always kept: the instant every declared end has passed.
    (0..steps_max)
        .map(|i| ends[i * (ends.len() - 1) / (steps_max - 1)])
        .collect::<BTreeSet<u64>>()
        .into_iter()
        .collect()
}

/// The gangs of the placed groups gone by `at_ms` (declared ends at or before it).
pub fn gone_by(placed: &[PlacedEnd], at_ms: u64) -> Vec<GangId> {
    placed
        .iter()
        .filter(|p| p.ends_at_ms.is_some_and(|end| end <= at_ms))
        .flat_map(|p| p.gangs.iter().cloned())
        .collect()
}

#[cfg(test)]
#[path = "backfill_tests.rs"]
mod tests;
