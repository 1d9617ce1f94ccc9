//! The coordinator's parked groups (docs/ARCHITECTURE.md §4, "Parking"): a group that
//! fit nowhere, for reasons that last, is requeued parked (meta leaves it out of the
//! rounds until its safety net, `parked_recheck_ms`) and remembered here with what could help it
//! and the shards' change counts when it was planned. Each round wakes (one meta entry)
//! the groups a later change could help, at most once per their backoff (doubling up to
//! [`WAKE_BACKOFF_MAX_MS`]), so parking is never more eager than the backoff it replaces. Part of [`Coordinator`]'s `impl`.
//!
//! Kept in memory on the meta leader only; a replica that becomes leader starts empty
//! and wakes every group meta holds parked once, so no change during the handover is
//! missed. Bounded by [`PARKED_GROUPS_MAX`]: past it, groups keep their backoff.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::*;
use crate::replicated::wake::WakeBoard;
use gangway_core::ledger::meta::{Woken, RETRY_BACKOFF_BASE_MS, WAKE_GROUPS_MAX};
use gangway_core::plan::parking::{helped, node_bound, what_helps, ChangeCounts, Helps};

/// Most groups the coordinator keeps parked; later ones retry on their backoff.
pub const PARKED_GROUPS_MAX: usize = 65_536;
/// Longest a parked group waits, after it was parked, before a change may wake it, in
/// ms: its backoff doubles per attempt up to this (kube-scheduler's longest backoff of
/// pods an event moved out of its unschedulable queue), so a group woken by every
/// release, only to find it still fits nowhere, is planned at most this often.
pub const WAKE_BACKOFF_MAX_MS: u64 = 10_000;
/// Longest a parked group is remembered, in ms: past twice the longest safety net
/// (spread included) it has come due and was planned again, or it ended.
pub const PARKED_REMEMBERED_MS: u64 = 4 * gangway_core::ledger::meta::PARKED_RECHECK_MAX_MS;

/// One parked group: what could help it, and the counts its plans saw.
struct Parked {
    helps: BTreeMap<u32, Helps>,
    counts: BTreeMap<u32, ChangeCounts>,
    /// Not woken before this instant: its backoff.
    not_before: Instant,
    /// When it was parked.
    since: Instant,
}

/// The parked groups, and when scanning them last found nothing to wake.
#[derive(Default)]
struct ParkedSet {
    groups: BTreeMap<GroupSeq, Parked>,
    /// The counts a scan saw when no group was helped (none woken, none waiting out
    /// its backoff). While the counts stay these and no group is parked anew, a scan
    /// would find nothing, so each round need not visit every parked group.
    quiet_at: Option<BTreeMap<u32, ChangeCounts>>,
}

/// The parked groups of one coordinator.
pub(super) struct Parking {
    board: WakeBoard,
    groups: std::sync::Mutex<ParkedSet>,
    /// Whether every group meta holds parked must be woken (this replica has just
    /// become the meta leader, or never woke them).
    wake_all: AtomicBool,
}

impl Parking {
    pub(super) fn new(board: WakeBoard) -> Self {
        Self {
            board,
            groups: std::sync::Mutex::new(ParkedSet::default()),
            wake_all: AtomicBool::new(true),
        }
    }

    fn groups(&self) -> std::sync::MutexGuard<'_, ParkedSet> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shards' change counts now (taken before a group's plans).
    pub(super) fn counts(&self) -> BTreeMap<u32, ChangeCounts> {
        self.board.read()
    }

    /// Remembers `seq` as parked; false when the map is full (it keeps its backoff).
    fn park(
        &self,
        seq: GroupSeq,
        helps: BTreeMap<u32, Helps>,
        counts: BTreeMap<u32, ChangeCounts>,
        attempts: u32,
    ) -> bool {
        let mut set = self.groups();
        if set.groups.len() >= PARKED_GROUPS_MAX && !set.groups.contains_key(&seq) {
            return false;
        }
        // Its counts predate the last scan's: the next scan must look at it.
        set.quiet_at = None;
        let shift = attempts.min(16);
        let backoff =
            Duration::from_millis((RETRY_BACKOFF_BASE_MS << shift).min(WAKE_BACKOFF_MAX_MS));
        let now = Instant::now();
        set.groups.insert(
            seq,
            Parked {
                helps,
                counts,
                not_before: now + backoff,
                since: now,
            },
        );
        true
    }

    /// Forgets `seq` (it is being planned again, or was woken).
    pub(super) fn forget(&self, seq: GroupSeq) {
        self.groups().groups.remove(&seq);
    }

    /// The parked groups a change since their plans could help, past their backoff;
    /// forgets those parked too long ago to be parked still (cancelled ones, say). Visits
    /// no group while nothing changed since a scan that found none helped.
    fn woken(&self) -> Vec<GroupSeq> {
        let now_counts = self.board.read();
        let mut set = self.groups();
        if set.quiet_at.as_ref() == Some(&now_counts) {
            return Vec::new();
        }
        let now = Instant::now();
        let remembered = Duration::from_millis(PARKED_REMEMBERED_MS);
        set.groups
            .retain(|_, p| now.duration_since(p.since) < remembered);
        let mut any_helped = false;
        let woken: Vec<GroupSeq> = set
            .groups
            .iter()
            .filter(|(_, p)| helped(&p.helps, &p.counts, &now_counts))
            .inspect(|_| any_helped = true)
            .filter(|(_, p)| p.not_before <= now)
            .map(|(seq, _)| *seq)
            .take(WAKE_GROUPS_MAX)
            .collect();
        set.quiet_at = (!any_helped).then_some(now_counts);
        woken
    }

    /// This replica no longer leads meta: a later leadership starts over.
    pub(super) fn lost_leadership(&self) {
        *self.groups() = ParkedSet::default();
        self.wake_all.store(true, Ordering::Relaxed);
    }
}

/// A parked group's reason: why it fell short, and that it waits for a change.
pub(super) fn parked_reason(reason: &str) -> String {
    format!("{reason}; parked until the nodes change or room frees")
}

impl Coordinator {
    /// Wakes the parked groups a change could help (one meta entry), or, first as
    /// leader, every group meta holds parked.
    pub(super) async fn wake_parked(&self) -> Result<(), GroupError> {
        if self.parking.wake_all.load(Ordering::Relaxed) {
            self.groups
                .meta(&MetaCommand::Wake {
                    which: Woken::AllParked,
                    at_ms: now_ms(),
                })
                .await?;
            self.parking.wake_all.store(false, Ordering::Relaxed);
            return Ok(());
        }
        let seqs = self.parking.woken();
        if seqs.is_empty() {
            return Ok(());
        }
        self.groups
            .meta(&MetaCommand::Wake {
                which: Woken::Groups(seqs.clone()),
                at_ms: now_ms(),
            })
            .await?;
        for seq in seqs {
            self.parking.forget(seq);
        }
        Ok(())
    }

    /// Parks, from a batch's plans and in one meta entry, the groups (a first attempt,
    /// a woken group, a safety net's re-check) that every shard refused in the batch with
    /// every node, for every member, for a reason only a change to the nodes lifts
    /// (selector, taint, a node smaller than the request...), as their own plans would
    /// have. Such a group is not planned on its own: other
    /// members of the batch cannot have changed those reasons, and neither preemption
    /// nor a reservation can lift them. `misses` are the members each shard left
    /// unplaced, `assigned` those any shard planned, `counts` the change counts taken
    /// before the plans. Returns the groups requeued; the others take the
    /// one-at-a-time path.
    pub(super) async fn park_from_batch(
        &self,
        failed: &[(&GroupRecord, &[(MemberKey, PodSpec)])],
        misses: &BTreeMap<u32, Vec<Unplaced>>,
        assigned: &BTreeSet<MemberKey>,
        counts: &BTreeMap<u32, ChangeCounts>,
    ) -> BTreeSet<GroupSeq> {
        if self.failpoints.armed(failpoints::PARKING_OFF) {
            return BTreeSet::new();
        }
        let mut requeues = Vec::new();
        let mut seqs = Vec::new();
        for (r, members) in failed {
            if !r.holds_nothing() {
                continue;
            }
            let keys: BTreeSet<MemberKey> = members.iter().map(|(k, _)| k.clone()).collect();
            let Some((helps, reason)) =
                node_bound(&r.group, &keys, misses, assigned, self.shards.ids())
            else {
                continue;
            };
            if !self.parking.park(r.seq, helps, counts.clone(), r.attempts) {
                continue;
            }
            requeues.push(MetaCommand::Requeue {
                seq: r.seq,
                reason: parked_reason(&reason),
                at_ms: now_ms(),
                attempts: Some(r.attempts),
                retry: Retry::Parked,
            });
            seqs.push(r.seq);
        }
        if requeues.is_empty() {
            return BTreeSet::new();
        }
        match self.meta_batch(requeues).await {
            Ok(replies) => {
                for (seq, reply) in seqs.iter().zip(replies) {
                    if !matches!(reply, MetaReply::Group { .. }) {
                        self.parking.forget(*seq);
                    }
                }
                seqs.into_iter().collect()
            }
            Err(e) => {
                tracing::debug!(error = %e, "parked groups not requeued from the batch");
                for seq in seqs {
                    self.parking.forget(seq);
                }
                BTreeSet::new()
            }
        }
    }

    /// How a group that fell short is tried again: parked when every shard's plan
    /// says why in lasting terms and it holds nothing (remembered here first), else on
    /// its backoff. The bug switch [`failpoints::PARKING_OFF`] never parks.
    pub(super) fn retry_of(
        &self,
        r: &GroupRecord,
        plans: &BTreeMap<u32, GangPlacement>,
        counts: BTreeMap<u32, ChangeCounts>,
    ) -> Retry {
        if self.failpoints.armed(failpoints::PARKING_OFF) || !r.holds_nothing() {
            return Retry::Backoff;
        }
        let Some(helps) = what_helps(plans, self.shards.ids()) else {
            return Retry::Backoff;
        };
        if self.parking.park(r.seq, helps, counts, r.attempts) {
            Retry::Parked
        } else {
            Retry::Backoff
        }
    }
}
