//! The meta group's state: the shard map (node -> shard), the durable queue of
//! gang groups with their states, and the 2PC decision log.
//!
//! Invariants: deterministic (ordered maps, times only from commands); a node's
//! shard changes only by a shard move's commit (`shard_map.rs`); an idempotency key names one group and one
//! body; a gang (namespace/name) belongs to at most one live group; a
//! transaction's decision never changes once written and is kept until every
//! participant acknowledged it; a COMMIT never places a member the group already
//! holds (it is recorded as ABORT instead); members leave a group's placements
//! only through meta first (ReleaseMembers, then MembersReleased once the shards
//! freed them); a terminal group holds nothing. Every command is idempotent, so a
//! retried proposal that applies twice changes nothing the second time. Called
//! through `replicated::MetaMachine`; the coordinator, the resolvers, the front
//! door and the kube adapter write its commands.
//!
//! The state and its dispatch live here; its messages in `messages.rs`, and the `impl`
//! by responsibility in `admission.rs`, `transactions.rs`, `lifecycle.rs` and
//! `reads.rs`, beside the parts of the state with their own files (`groups.rs`,
//! `decisions.rs`, `queues.rs`, `shard_map.rs`).

pub mod decisions;
pub mod groups;
mod index;
pub mod messages;
mod placements;
pub mod queues;
pub mod reservations;
pub mod shard_map;
mod table;
pub mod usage_history;

mod admission;
mod lifecycle;
mod reads;
mod transactions;

use std::collections::{BTreeMap, BTreeSet};

use index::GroupIndex;
use table::GroupTable;

use serde::{Deserialize, Serialize};

pub use decisions::{Decision, TxnRecord, Undelivered};
pub use groups::{
    GroupRecord, GroupSeq, GroupState, GroupSummary, PlacedDevice, Placement, PreemptionNotice,
    SubmittedPods, Terminal,
};
pub use index::ChangeStamps;
pub use messages::{
    MetaCommand, MetaQuery, MetaReply, PlacedEnd, RejectionKind, Retry, Woken, WAKE_GROUPS_MAX,
};
pub use placements::MemberPlacements;
pub use queues::{QueueStatus, Queues};
pub use reservations::{
    HeadReservation, Reservations, RESERVATIONS_MAX, RESERVATION_TTL_MS_MAX, RESERVED_NODES_MAX,
    RESERVED_RETRY_MS,
};
pub use shard_map::{
    domain_of, hashed_shard, shard_command, MappedNode, MovePhase, MoveTarget, ShardMove,
    ShardShare, MOVES_ACTIVE_MAX, MOVES_KEPT_MAX,
};
pub use usage_history::{UsageHistory, FAIR_SHARE_HALF_LIFE_MS_MAX, FAIR_SHARE_HALF_LIFE_MS_MIN};

use crate::ledger::TxnId;
use crate::model::{GangGroup, MemberKey, QueueSpec, Resources};

/// Terminal groups kept (with their idempotency keys); older ones are forgotten.
pub const FINISHED_GROUPS_MAX: usize = 10_000;
/// Decided transactions kept once every participant acknowledged them; older ones
/// are forgotten (unacknowledged ones never are).
pub const DECIDED_TXNS_MAX: usize = 50_000;
/// First retry delay after an aborted attempt.
pub const RETRY_BACKOFF_BASE_MS: u64 = 100;
/// Longest retry delay.
pub const RETRY_BACKOFF_MAX_MS: u64 = 5_000;
/// Longest a group parked at its first attempt waits for a wake before it is tried
/// again anyway: the safety net under event-driven requeueing (docs/ARCHITECTURE.md §4,
/// "Parking"). It doubles with each later attempt, up to [`PARKED_RECHECK_MAX_MS`].
pub const PARKED_RECHECK_MS: u64 = 30_000;
/// Longest safety net of a parked group (kube-scheduler flushes unschedulable pods
/// after as long).
pub const PARKED_RECHECK_MAX_MS: u64 = 300_000;

/// Most parked groups come due by their safety net that one pending read lists, beside
/// the groups it can act on otherwise: however many come due at once, a round re-plans
/// a few of them and they never fill the window the others are read through.
pub const PARKED_RECHECKS_PER_READ_MAX: usize = 64;
/// Grid the safety nets fall on, in ms: a parked group comes due at the next multiple of
/// it, so the groups due within one step are re-planned in the same round and their
/// requeues share a log entry, instead of one round (and a lone entry) each. Small
/// beside the shortest safety net ([`PARKED_RECHECK_MS`]).
pub const PARKED_RECHECK_GRID_MS: u64 = 5_000;
const _: () = assert!(PARKED_RECHECK_GRID_MS * 4 <= PARKED_RECHECK_MS);

/// `at_ms` moved up to the next point of [`PARKED_RECHECK_GRID_MS`] (itself if on one).
pub fn on_recheck_grid(at_ms: u64) -> u64 {
    at_ms
        .div_ceil(PARKED_RECHECK_GRID_MS)
        .saturating_mul(PARKED_RECHECK_GRID_MS)
}

/// The safety net of a group parked at attempt `attempts` (1-based): doubling from
/// [`PARKED_RECHECK_MS`] to [`PARKED_RECHECK_MAX_MS`], plus up to 63/64 more by its
/// sequence number, so groups parked together come due spread over as long again.
pub fn parked_recheck_ms(seq: GroupSeq, attempts: u32) -> u64 {
    let shift = attempts.saturating_sub(1).min(16);
    let base = (PARKED_RECHECK_MS << shift).min(PARKED_RECHECK_MAX_MS);
    base + base * (seq % 64) / 64
}

/// The meta group's replicated state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaState {
    shards: u32,
    shard_map: BTreeMap<String, u32>,
    groups: GroupTable,
    keys: BTreeMap<String, GroupSeq>,
    txns: BTreeMap<TxnId, TxnRecord>,
    next_seq: GroupSeq,
    next_txn: u64,
    /// Decided transactions with participants still to acknowledge (an index of `txns`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    undelivered: BTreeSet<TxnId>,
    /// `namespace/gang` -> the group that declared it last; the claim lapses when that
    /// group ends or is forgotten (checked at admission, so no transition updates it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    gang_owners: BTreeMap<String, GroupSeq>,
    /// Kubernetes pod (`namespace/name`) -> the group whose member named it last; the
    /// claim lapses as a gang's does (one live group per pod, so no pod is bound twice).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    named_pods: BTreeMap<String, GroupSeq>,
    /// The last change stamp given to a group ([`GroupRecord::bump`]).
    #[serde(default)]
    last_version: ChangeStamps,
    /// Groups forgotten so far: a reader that keeps summaries compares it to learn
    /// that some of them are gone.
    #[serde(default)]
    forgotten: u64,
    /// The queues, with what their groups are charged (I8).
    #[serde(default, skip_serializing_if = "Queues::is_empty")]
    queues: Queues,
    /// Nodes held for the head of the line (`reservations.rs`).
    #[serde(default, skip_serializing_if = "Reservations::is_empty")]
    reservations: Reservations,
    /// Bug switch `meta-admits-over-quota` only: charges without asking the queue.
    #[serde(skip)]
    quota_unchecked: bool,
    /// Bug switch `meta-seals-moves-in-flight` only: seals moves without looking.
    #[serde(skip)]
    seal_unchecked: bool,
    /// Bug switch `meta-admits-twins-of-placed-groups` only: a Placed group's gangs
    /// may be declared again.
    #[serde(skip)]
    twins_of_placed_admitted: bool,
    /// Topology domain → its home shard (where its new nodes go).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    domains: BTreeMap<String, u32>,
    /// Node → its topology domain (nodes registered with one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    node_domains: BTreeMap<String, String>,
    /// Shard moves: the running one and the last finished ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    moves: BTreeMap<u64, ShardMove>,
    /// The last move id given.
    #[serde(default, skip_serializing_if = "is_zero")]
    next_move: u64,
    /// Shards added on a live cluster (`GrowShards`) -> the voters their groups were
    /// created with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    added_shards: BTreeMap<u32, BTreeMap<u64, String>>,
    /// Nodes per shard (derived, never encoded).
    #[serde(skip)]
    node_counts: shard_map::NodeCounts,
    /// Owner -> its groups that may be live (derived, never encoded).
    #[serde(skip)]
    owned: OwnedGroups,
    /// Ended, pending, by-stamp and by-priority indexes of the groups (derived, never
    /// encoded).
    #[serde(skip)]
    index: GroupIndex,
}

/// Owner -> the groups it submitted that may not have ended: built from the groups on
/// first use (so a snapshot restores it without encoding it), added to at every
/// submission, pruned of ended groups when its owner's live groups are counted and of
/// forgotten ones when they are forgotten, so it holds at most the groups meta keeps.
/// Compared equal always, being a cache; a clone starts without it (it is built again
/// on first use), as the group index does.
#[derive(Debug, Default)]
struct OwnedGroups(Option<BTreeMap<String, BTreeSet<GroupSeq>>>);

impl Clone for OwnedGroups {
    fn clone(&self) -> Self {
        OwnedGroups(None)
    }
}

impl PartialEq for OwnedGroups {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The key a submission is stored under: the owner's own key space (the Kubernetes
/// ingest's and unauthenticated callers' keys, owner empty, are stored as given).
fn owned_key(owner: &str, key: &str) -> String {
    if owner.is_empty() {
        key.to_string()
    } else {
        // A unit separator: neither an owner nor a key written by a person holds one
        // (owners are checked free of control characters).
        format!("{owner}\u{1f}{key}")
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn rejected(reason: impl Into<String>) -> MetaReply {
    MetaReply::Rejected {
        reason: reason.into(),
        kind: RejectionKind::Refused,
    }
}

fn missing(seq: GroupSeq) -> MetaReply {
    MetaReply::Rejected {
        reason: format!("id: no gang group {seq}"),
        kind: RejectionKind::NotFound,
    }
}

fn conflict(reason: String) -> MetaReply {
    MetaReply::Rejected {
        reason,
        kind: RejectionKind::Conflict,
    }
}

/// Most pod choices one [`MetaCommand::ChoosePods`] records (as many as a group may have members).
pub const CHOICES_PER_COMMAND_MAX: usize = 10_000;

/// Most commands in one meta batch.
pub const META_BATCH_MAX: usize = 1_024;

/// Delay before retry number `attempts` (1-based), doubling up to the cap.
pub fn retry_backoff_ms(attempts: u32) -> u64 {
    let shift = attempts.saturating_sub(1).min(16);
    (RETRY_BACKOFF_BASE_MS << shift).min(RETRY_BACKOFF_MAX_MS)
}

impl MetaState {
    /// Groups in queue order (all, or only those not terminal).
    fn in_queue_order(&self, active_only: bool) -> impl Iterator<Item = &GroupRecord> {
        let mut records: Vec<&GroupRecord> = self
            .groups
            .values()
            .filter(|r| !active_only || !r.state.is_terminal())
            .collect();
        records.sort_by_key(|r| r.order_key());
        records.into_iter()
    }

    /// The full record of one group.
    pub fn record(&self, seq: GroupSeq) -> Option<&GroupRecord> {
        self.groups.get(&seq)
    }

    /// An empty state over `shards` shards.
    pub fn new(shards: u32) -> Self {
        Self {
            shards,
            next_seq: 1,
            next_txn: 1,
            ..Self::default()
        }
    }

    /// Applies one command, then brings the charges of the groups it touched, and the
    /// index of every group it changed, up to date.
    pub fn apply(&mut self, cmd: &MetaCommand) -> MetaReply {
        self.index.ensure(&self.groups);
        let touched = self.touched_by(cmd);
        let reply = self.apply_one(cmd);
        for seq in touched {
            self.recharge(seq);
        }
        if !self.reservations.is_empty() {
            let groups = &self.groups;
            self.reservations.prune(cmd.at_ms(), |seq| groups.get(&seq));
        }
        self.catch_up_index();
        #[cfg(debug_assertions)]
        self.check_index(cmd);
        reply
    }

    /// Builds the group index now (a restored state), so no read builds its own.
    pub fn index_groups(&mut self) {
        self.index.ensure(&self.groups);
    }

    /// Reindexes the groups stamped so far in the command being applied (every change
    /// of a group stamps it; a charge, which no index reads, may change unstamped).
    fn catch_up_index(&mut self) {
        let changed = self.last_version.take_changed();
        self.index.reindex(&self.groups, changed);
    }

    /// Debug builds: the index equals one built from the groups (on states small enough
    /// that the check does not dominate a test's time).
    #[cfg(debug_assertions)]
    fn check_index(&self, cmd: &MetaCommand) {
        const CHECKED_GROUPS_MAX: usize = 1_024;
        if self.groups.len() <= CHECKED_GROUPS_MAX {
            self.index.check(&self.groups, cmd);
        }
    }

    /// Group records visited by passes over the groups so far, by commands and reads
    /// alike (tests).
    #[cfg(test)]
    pub(crate) fn groups_scanned(&self) -> u64 {
        self.groups.visited()
    }

    /// The groups whose charge `cmd` may change (read before it applies, while its
    /// transaction is still on record).
    fn touched_by(&self, cmd: &MetaCommand) -> Vec<GroupSeq> {
        let of_txn = |txn: &TxnId| -> Vec<GroupSeq> {
            self.txns
                .get(txn)
                .map(|t| {
                    t.group
                        .into_iter()
                        .chain(t.victims.iter().copied())
                        .collect()
                })
                .unwrap_or_default()
        };
        match cmd {
            MetaCommand::BeginTxn { seq, .. }
            | MetaCommand::Requeue { seq, .. }
            | MetaCommand::Expire { seq, .. }
            | MetaCommand::Cancel { seq, .. }
            | MetaCommand::Release { seq, .. }
            | MetaCommand::ReleaseMembers { seq, .. }
            | MetaCommand::MembersReleased { seq, .. }
            | MetaCommand::ReleaseDone { seq, .. } => vec![*seq],
            MetaCommand::BeginPreemption { seq, victims, .. } => std::iter::once(*seq)
                .chain(victims.iter().copied())
                .collect(),
            MetaCommand::Decide { txn, .. }
            | MetaCommand::AbortIfUndecided { txn, .. }
            | MetaCommand::Delivered { txn, .. } => of_txn(txn),
            MetaCommand::AssignNode { .. }
            | MetaCommand::PlaceNode { .. }
            | MetaCommand::BeginMove { .. }
            | MetaCommand::SealMove { .. }
            | MetaCommand::CommitMove { .. }
            | MetaCommand::EndMove { .. }
            | MetaCommand::CancelMove { .. }
            | MetaCommand::GrowShards { .. }
            | MetaCommand::Submit { .. }
            | MetaCommand::Batch { .. }
            | MetaCommand::NoteWaiting { .. }
            | MetaCommand::NoteBinding { .. }
            | MetaCommand::ChoosePods { .. }
            | MetaCommand::PutQueue { .. }
            | MetaCommand::DeleteQueue { .. }
            | MetaCommand::NoteCapacity { .. }
            | MetaCommand::SampleUsage { .. }
            | MetaCommand::ReserveForHead { .. }
            | MetaCommand::EndHeadReservation { .. }
            | MetaCommand::Wake { .. }
            | MetaCommand::NoteNodeAllocation { .. } => Vec::new(),
        }
    }

    /// Sets group `seq`'s charge to what its state is due, moving the difference on
    /// its queue's chain.
    fn recharge(&mut self, seq: GroupSeq) {
        let Some(g) = self.groups.get_mut(&seq) else {
            return;
        };
        let due = g.charge_due();
        if due == g.charge {
            return;
        }
        let old = std::mem::replace(&mut g.charge, due.clone());
        let queue = g.group.queue.clone();
        self.queues.refund(&queue, &old);
        self.queues.charge(&queue, &due);
    }

    /// Bug switch `meta-admits-over-quota` (and the tests' checker) only: charges
    /// groups without asking their queues, as a scheduler with no quota check would.
    pub fn set_quota_unchecked(&mut self, unchecked: bool) {
        self.quota_unchecked = unchecked;
    }

    /// Bug switch `meta-seals-moves-in-flight` (and the tests' checker) only: seals a
    /// shard move without asking whether a transaction on its shards is in flight.
    pub fn set_seal_unchecked(&mut self, unchecked: bool) {
        self.seal_unchecked = unchecked;
    }

    /// Bug switch `meta-admits-twins-of-placed-groups` (and its tests) only: a gang a
    /// Placed group declares is taken as free, so a second live group may declare it.
    pub fn set_twins_of_placed_admitted(&mut self, admitted: bool) {
        self.twins_of_placed_admitted = admitted;
    }

    /// Why queue accounting is inconsistent, if it is: a group's charge differs from
    /// what its state is due, a queue's usage from the sum of its subtree's charges, or
    /// some usage passes its queue's `max` (I8). The tests' checker calls it after
    /// every command.
    pub fn quota_violation(&self) -> Option<String> {
        for g in self.groups.values() {
            if g.charge != g.charge_due() {
                return Some(format!(
                    "group {} is charged {:?} but due {:?}",
                    g.seq,
                    g.charge,
                    g.charge_due()
                ));
            }
        }
        let fresh = self.queues.recomputed(
            self.groups
                .values()
                .filter(|g| !g.charge.is_zero())
                .map(|g| (g.group.queue.as_str(), &g.charge)),
        );
        if &fresh != self.queues.all_usage() {
            return Some(format!(
                "kept usage {:?} differs from the groups' charges {fresh:?}",
                self.queues.all_usage()
            ));
        }
        self.queues.specs().find_map(|q| {
            let used = self.queues.usage(&q.name);
            q.max.first_exceeded(&used).map(|(resource, used, max)| {
                format!(
                    "I8: queue {} uses {resource} {used} above its max {max}",
                    q.name
                )
            })
        })
    }

    fn apply_one(&mut self, cmd: &MetaCommand) -> MetaReply {
        match cmd {
            MetaCommand::AssignNode { node, shard, .. } => self.assign_node(node, *shard),
            MetaCommand::PlaceNode { node, domain, .. } => self.place_node(node, domain.as_deref()),
            MetaCommand::BeginMove {
                target,
                to,
                reason,
                at_ms,
            } => self.begin_move(target, *to, reason, *at_ms),
            MetaCommand::SealMove { id } => self.seal_move(*id),
            MetaCommand::CommitMove { id } => self.commit_move(*id),
            MetaCommand::EndMove { id, at_ms } => self.end_move(*id, *at_ms),
            MetaCommand::CancelMove { id, reason, at_ms } => self.cancel_move(*id, reason, *at_ms),
            MetaCommand::GrowShards { shards, voters } => self.grow_shards(*shards, voters),
            MetaCommand::Submit {
                key,
                group,
                at_ms,
                live_max,
            } => self.submit(key, group, *at_ms, *live_max),
            MetaCommand::BeginTxn {
                seq,
                participants,
                at_ms,
            } => self.begin_txn(*seq, participants, *at_ms),
            MetaCommand::BeginPreemption {
                seq,
                victims,
                participants,
                at_ms,
                reclaim,
            } => self.begin_preemption(*seq, victims, participants, *at_ms, *reclaim),
            MetaCommand::Decide {
                txn,
                decision,
                placements,
                reason,
                at_ms,
                delivered,
            } => self.decide(*txn, *decision, placements, reason, *at_ms, delivered),
            MetaCommand::AbortIfUndecided { txn, at_ms, shard } => {
                self.abort_if_undecided(*txn, *at_ms, *shard)
            }
            MetaCommand::Delivered { txn, shards } => self.delivered(*txn, shards),
            MetaCommand::Requeue {
                seq,
                reason,
                at_ms,
                attempts,
                retry,
            } => self.requeue(*seq, reason, *at_ms, *attempts, *retry),
            MetaCommand::Wake { which, at_ms } => self.wake(which, *at_ms),
            MetaCommand::Expire { seq, at_ms } => self.expire(*seq, *at_ms),
            MetaCommand::Cancel { seq, at_ms } => self.cancel(*seq, *at_ms),
            MetaCommand::Release { seq, at_ms } => self.release(*seq, *at_ms),
            MetaCommand::ReleaseMembers { seq, members, .. } => self.release_members(*seq, members),
            MetaCommand::MembersReleased { seq, members, .. } => {
                self.members_released(*seq, members)
            }
            MetaCommand::ReleaseDone { seq, .. } => self.release_done(*seq),
            MetaCommand::Batch { commands } => self.batch(commands),
            MetaCommand::NoteWaiting { seq, reason } => self.note_waiting(*seq, reason),
            MetaCommand::NoteBinding { seq, reason } => self.note_binding(*seq, reason),
            MetaCommand::ChoosePods { seq, choices } => self.choose_pods(*seq, choices),
            MetaCommand::NoteNodeAllocation {
                member,
                node,
                allocation,
            } => self.note_node_allocation(member, node, allocation),
            MetaCommand::SampleUsage {
                at_ms,
                half_life_ms,
            } => match self.queues.sample_usage(*at_ms, *half_life_ms) {
                Ok(()) => MetaReply::Queues { queues: Vec::new() },
                Err(reason) => rejected(reason),
            },
            MetaCommand::ReserveForHead { reservation } => {
                let group = self.groups.get(&reservation.seq);
                match self.reservations.make(reservation.clone(), group) {
                    Ok(()) => MetaReply::HeadReservations {
                        reservations: vec![reservation.clone()],
                    },
                    Err((kind, reason)) => MetaReply::Rejected { reason, kind },
                }
            }
            MetaCommand::EndHeadReservation { seq, .. } => {
                self.reservations.end(*seq);
                MetaReply::HeadReservations {
                    reservations: Vec::new(),
                }
            }
            MetaCommand::NoteCapacity { capacity } => {
                self.queues.set_capacity(capacity.clone());
                MetaReply::Capacity {
                    capacity: Some(capacity.clone()),
                }
            }
            MetaCommand::PutQueue { queue }
                if self.kept_by_another(&queue.name, &queue.managed_by) =>
            {
                conflict(self.keeper_refusal(&queue.name))
            }
            MetaCommand::DeleteQueue { name, managed_by }
                if self.kept_by_another(name, managed_by) =>
            {
                conflict(self.keeper_refusal(name))
            }
            MetaCommand::PutQueue { queue } => match self.queues.put(queue) {
                Ok(()) => MetaReply::Queues {
                    queues: self.queue_statuses(Some(&queue.name)),
                },
                Err(reason) => rejected(reason),
            },
            MetaCommand::DeleteQueue { name, .. } => {
                let live = self.live_groups_of(name);
                match self.queues.delete(name, live) {
                    Ok(()) => MetaReply::Queues { queues: Vec::new() },
                    Err(reason) if self.queues.spec(name).is_none() => MetaReply::Rejected {
                        reason,
                        kind: RejectionKind::NotFound,
                    },
                    Err(reason) => conflict(reason),
                }
            }
        }
    }

    fn batch(&mut self, commands: &[MetaCommand]) -> MetaReply {
        if commands.len() > META_BATCH_MAX {
            return rejected(format!(
                "commands: {} in one batch, at most {META_BATCH_MAX}",
                commands.len()
            ));
        }
        let replies = commands
            .iter()
            .map(|cmd| match cmd {
                MetaCommand::Batch { .. } => rejected("commands: a batch cannot hold a batch"),
                one => self.apply(one),
            })
            .collect();
        MetaReply::Batch { replies }
    }
}

/// Most characters of client input echoed in a refusal.
pub const ECHO_CHARS_MAX: usize = 128;

/// `text`, cut to [`ECHO_CHARS_MAX`] characters for a message.
fn short(text: &str) -> String {
    match text.char_indices().nth(ECHO_CHARS_MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

fn gang_name(gang: &crate::model::Gang) -> String {
    format!("{}/{}", gang.namespace, gang.name)
}

/// Whether a resubmission carries the body first stored under its key (the stored
/// gangs' `creation_order` is the group's seq, set at admission).
fn same_body(stored: &GangGroup, offered: &GangGroup) -> bool {
    stored.id == offered.id
        && stored.queue == offered.queue
        && stored.run_limit_ms == offered.run_limit_ms
        && stored.gangs.len() == offered.gangs.len()
        && stored.gangs.iter().zip(&offered.gangs).all(|(a, b)| {
            let mut b = b.clone();
            b.creation_order = a.creation_order;
            *a == b
        })
}

fn apply_decision(
    g: &mut GroupRecord,
    last_version: &mut ChangeStamps,
    txn: TxnId,
    decision: Decision,
    placements: &BTreeMap<String, Placement>,
    reason: &str,
    at_ms: u64,
) {
    g.bump(last_version);
    match decision {
        Decision::Commit => {
            g.placed_at_ms.get_or_insert(at_ms);
            g.placements.extend(placements.iter().map(|(k, p)| {
                let mut p = p.clone();
                p.txn = Some(txn);
                (k.clone(), p)
            }));
            if g.every_gang_at_min() {
                g.state = GroupState::Placed;
                g.reason.clear();
            } else {
                // NonStrict: placed members accumulate until every gang reaches minMember.
                g.state = GroupState::Queued;
                g.reason = format!(
                    "{} members placed, accumulating toward minMember",
                    g.placements.len()
                );
                g.not_before_ms = at_ms.saturating_add(RETRY_BACKOFF_BASE_MS);
            }
        }
        Decision::Abort => {
            g.attempts += 1;
            g.reason = reason.to_string();
            if g.deadline_ms.is_some_and(|d| d <= at_ms) {
                g.state = g.timed_out();
            } else {
                g.state = GroupState::Queued;
                g.not_before_ms = at_ms.saturating_add(retry_backoff_ms(g.attempts));
            }
        }
    }
}

#[cfg(test)]
mod parking_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod queue_tests;
#[cfg(test)]
mod reservations_tests;
#[cfg(test)]
mod shard_map_tests;
#[cfg(test)]
mod tests;
