//! The coordinator: on the meta group's leader, it takes gang groups from the
//! durable queue in order and places each all-or-nothing across shards with
//! two-phase reservation (docs/ARCHITECTURE.md §4, §5): plan on every shard, assign, begin a
//! transaction, reserve on every participant (one entry per shard), record
//! the decision in the meta log, then commit or abort everywhere. A group that
//! fits in one shard skips the protocol (reserve and commit in one entry).
//!
//! Invariants: the decision is written before any participant hears it; a
//! participant's reservation is never dropped on its own (resolvers ask the
//! decision log at the deadline); after a meta failover, undecided
//! transactions resolve to abort and decided ones are driven to completion:
//! every round delivers, in bulk, the decisions some participant has not
//! acknowledged (work that grows with undelivered decisions, not with placed
//! groups); a group planned again plans only members it does not hold.
//! One task per replica, owned by the `Replica`; it acts only while this
//! replica leads the meta group.
//!
//! The loop and its rounds live here; a round's steps in `admission.rs`, `quotes.rs`,
//! `batch.rs` and `transaction.rs`, preemption in `preempt.rs`, shard moves in
//! `moves.rs`; its pure decisions come from `gangway_core::plan`.

mod admission;
mod batch;
mod head_of_line;
mod parking;
pub mod preempt;
mod quotes;
mod transaction;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use gangway_raft::META_GROUP;
use tokio::sync::watch;
use tracing::Instrument;

use crate::failpoints::{self, Failpoints};
use crate::observe::placement::{transaction_ended, Phase, PhaseTimer};
use crate::replicated::growth::ShardCount;
use crate::replicated::moves;
use crate::replicated::release;
use crate::replicated::{now_ms, GroupError, Groups, ShardOutcome};
use gangway_core::engine::{GangPlacement, Profile, Unplaced};
use gangway_core::ledger::command::{HoldKind, NetworkHold};
use gangway_core::ledger::meta::{
    Decision, GroupRecord, GroupSeq, GroupState, MetaCommand, MetaQuery, MetaReply, PlacedDevice,
    Placement, Retry,
};
use gangway_core::ledger::{LedgerError, LedgerOp, LedgerReply, ReserveMember, TxnId, TxnOutcome};
use gangway_core::model::LearnedHierarchies;
use gangway_core::model::{MemberKey, PodSpec};
use gangway_core::plan::assign::{self, assign, AssignOutcome, Assignment};
use gangway_core::plan::backfill::ReservationMode;
use gangway_core::plan::budgets::DisruptionBudgets;
use gangway_core::plan::rebalance::RebalancePolicy;
use gangway_core::query::{listed_topologies, ListedTopology, ShardAnswer, ShardQuery};
use head_of_line::KeptNodes;

/// Period between the coordinator's reads of the shards' capacity (recorded in meta
/// when it changed: the pool top-level queues lend in), in ms.
pub const CAPACITY_REFRESH_MS: u64 = 5_000;
/// Shortest period between the coordinator's usage samples for fair sharing over
/// time, in ms (a sixteenth of the half-life, within these bounds).
pub const FAIR_SHARE_SAMPLE_MS_MIN: u64 = 250;
/// Longest period between the coordinator's usage samples, in ms.
pub const FAIR_SHARE_SAMPLE_MS_MAX: u64 = 5_000;
/// Longest a round waits for a shard's capacity, in ms (the round goes on without it).
pub const CAPACITY_READ_TIMEOUT_MS: u64 = 250;
/// Longest pause between the coordinator's rounds, in ms.
pub const COORDINATOR_TICK_MS: u64 = 20;
/// Period of rounds, in ms, while the last round found nothing to do (no group
/// pending, no decision undelivered): nothing can come due by time then, and any
/// change of the meta group still starts a round at once.
pub const COORDINATOR_IDLE_TICK_MS: u64 = 500;
/// Shortest pause between rounds woken by a meta group change, in ms (a burst of
/// submissions lands in one round).
pub const COORDINATOR_ROUND_GAP_MS: u64 = 2;
/// Longest a parked group due by its safety net waits while other groups are ready,
/// in ms: re-plans of groups that rarely fit do not share rounds with placements
/// unless they have waited this long.
pub const PARKED_RECHECK_DEFER_MAX_MS: u64 = 10_000;
/// Whether a round found work (the next comes after `COORDINATOR_TICK_MS`), none
/// (after `COORDINATOR_IDLE_TICK_MS`), or only groups that come due later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activity {
    Idle,
    Busy,
    /// Nothing to act on before this instant (ms since the epoch): the next round comes
    /// then, within `COORDINATOR_TICK_MS..=COORDINATOR_IDLE_TICK_MS`.
    DueAt(u64),
}

impl Activity {
    /// The pause before the next round, in ms.
    fn pause_ms(self, now_ms: u64) -> u64 {
        match self {
            Activity::Idle => COORDINATOR_IDLE_TICK_MS,
            Activity::Busy => COORDINATOR_TICK_MS,
            Activity::DueAt(at) => at
                .saturating_sub(now_ms)
                .clamp(COORDINATOR_TICK_MS, COORDINATOR_IDLE_TICK_MS),
        }
    }

    /// What a round that read `records` (the pending window) finds: busy when it
    /// delivers, moves, or holds a group it can act on now; else due at the earliest
    /// backoff, safety net or deadline among them.
    fn of(records: &[GroupRecord], undelivered: usize, moving: bool, now: u64) -> Self {
        if undelivered > 0 || moving {
            return Activity::Busy;
        }
        let mut due_at: Option<u64> = None;
        for r in records {
            if r.is_due(Some(now)) {
                return Activity::Busy;
            }
            let at = r
                .deadline_ms
                .map_or(r.not_before_ms, |d| d.min(r.not_before_ms));
            due_at = Some(due_at.map_or(at, |earliest| earliest.min(at)));
        }
        due_at.map_or(Activity::Idle, Activity::DueAt)
    }
}

/// How long a participant holds a reservation before asking for the decision.
pub const RESERVE_TTL_MS: u64 = 10_000;
const _: () = assert!(RESERVE_TTL_MS <= gangway_core::ledger::RESERVE_HOLD_MS_MAX);
/// Most groups looked at in one round.
pub const GROUPS_PER_ROUND_MAX: usize = 256;
// A round's batched writes carry one command per group: they must fit one batch.
const _: () = assert!(GROUPS_PER_ROUND_MAX <= gangway_core::ledger::meta::META_BATCH_MAX);
// The batch's begins and requeues carry one command per ready group: the window and the
// safety nets' re-checks read beside it.
const _: () = assert!(
    GROUPS_PER_ROUND_MAX + gangway_core::ledger::meta::PARKED_RECHECKS_PER_READ_MAX
        <= gangway_core::ledger::meta::META_BATCH_MAX
);
const _: () = assert!(GROUPS_PER_ROUND_MAX <= gangway_core::ledger::command::LEDGER_BATCH_MAX);
/// Most members planned together in one batched round.
pub const BATCH_MEMBERS_MAX: usize = 8_192;
/// Most preemption attempts in one round: each asks every shard for offers (up to
/// `OFFER_STEPS_MAX` placements each) and plans, so a round with many high-priority
/// groups that do not fit would otherwise delay every other group's placement.
pub const PREEMPTION_ATTEMPTS_PER_ROUND_MAX: u32 = 2;
/// Most undelivered decisions delivered in one round.
pub const UNDELIVERED_PER_ROUND_MAX: u32 = 4_096;

/// Whether a periodic step last taken at `last` is due again after `period_ms`; if so,
/// records it as taken now.
fn take_if_due(last: &std::sync::Mutex<Option<std::time::Instant>>, period_ms: u64) -> bool {
    let now = std::time::Instant::now();
    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|at| now.duration_since(at) < Duration::from_millis(period_ms)) {
        return false;
    }
    *last = Some(now);
    true
}

/// What a round's batch did with the ready groups.
struct BatchOutcome {
    /// Groups it placed (or left to recovery when its writes were interrupted).
    handled: BTreeSet<GroupSeq>,
    /// Groups left for the next round's batch: earlier ones spent the member budget.
    deferred: BTreeSet<GroupSeq>,
    /// Groups the batch's plans showed only a node change could help: parked from them.
    parked: BTreeSet<GroupSeq>,
}

/// The coordinator of one replica.
pub struct Coordinator {
    groups: Groups,
    shards: ShardCount,
    profile: Profile,
    failpoints: Failpoints,
    /// Rounds run, to rotate the shard asked first.
    rounds: AtomicU32,
    /// Preemption attempts left in the current round (reset to
    /// [`PREEMPTION_ATTEMPTS_PER_ROUND_MAX`] as each round starts).
    preemptions_left: AtomicU32,
    /// The PodDisruptionBudgets victims are chosen by (filled by the Kubernetes ingest).
    budgets: Arc<DisruptionBudgets>,
    /// Topology hierarchies Kueue's Topology objects define (the ingest keeps them).
    learned: Arc<LearnedHierarchies>,
    /// When the shards' capacity was last read (a monotonic clock; None: never).
    capacity_read_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Automatic rebalancing.
    rebalance: RebalancePolicy,
    /// When the balance was last checked (None: check at the next idle moment).
    balance_checked_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The half-life of fair sharing over time, in ms; 0: off.
    fair_share_half_life_ms: u64,
    /// When usage was last sampled for fair sharing over time (None: never).
    usage_sampled_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Groups parked because they fit nowhere, and what wakes them.
    parking: parking::Parking,
    /// Reservations for the head of the line, as this round sees them.
    head_of_line: head_of_line::HeadOfLine,
}

/// Whether a group that did not fit tries to preempt this round.
enum PreemptionChance {
    /// It may not (it holds members, a pod never preempts, or no placed group is of
    /// lower priority).
    None,
    /// It may, but the round's attempts are spent: requeued, it tries at its next attempt.
    Deferred,
    /// It tries now.
    Try,
}

/// Whether a group that did not fit reclaims its queue's guarantee.
enum Reclaim {
    /// It has no queue with a `min`, may not preempt, or nothing is reclaimable.
    None,
    /// Its queue may not reclaim for it, and why (it would pass its `min`).
    Refused(String),
    /// It may, but the round's preemption attempts are spent.
    Deferred,
    /// It tries now, from these groups (youngest first).
    Try(Vec<GroupSeq>),
}

/// What a reservation attempt on one participant came to.
enum Vote {
    Yes,
    No(String),
}

impl Coordinator {
    /// The profile plans are made with: the configured one, with the hierarchies Kueue's
    /// Topology objects define after the configured ones.
    pub(super) fn plan_profile(&self) -> Profile {
        let mut profile = self.profile.clone();
        profile.topologies = self.learned.merged(&self.profile.topologies);
        profile
    }

    /// A coordinator over `shards` shards, choosing preemption victims by `budgets`.
    pub fn new(
        groups: Groups,
        shards: ShardCount,
        profile: Profile,
        failpoints: Failpoints,
        budgets: Arc<DisruptionBudgets>,
        learned: Arc<LearnedHierarchies>,
    ) -> Self {
        let reservations_ignored = failpoints.armed(failpoints::RESERVATIONS_IGNORED);
        Self {
            groups,
            shards,
            profile,
            learned,
            failpoints,
            rounds: AtomicU32::new(0),
            preemptions_left: AtomicU32::new(0),
            budgets,
            capacity_read_at: std::sync::Mutex::new(None),
            rebalance: RebalancePolicy::default(),
            // The first check comes a period after the coordinator starts: a fleet
            // registering at start-up is not rebalanced half registered.
            balance_checked_at: std::sync::Mutex::new(Some(std::time::Instant::now())),
            fair_share_half_life_ms: 0,
            usage_sampled_at: std::sync::Mutex::new(None),
            parking: parking::Parking::new(crate::replicated::wake::WakeBoard::default()),
            head_of_line: head_of_line::HeadOfLine::new(
                ReservationMode::Off,
                crate::replicated::wake::WakeBoard::default(),
                reservations_ignored,
            ),
        }
    }

    /// The same coordinator reading its replica's shard change counts from `board`
    /// (without one, parked groups wait for the safety net).
    pub fn with_wake_board(mut self, board: crate::replicated::wake::WakeBoard) -> Self {
        self.head_of_line = self.head_of_line.with_board(board.clone());
        self.parking = parking::Parking::new(board);
        self
    }

    /// The same coordinator reserving room for the head of the line as `mode` says.
    pub fn with_reservations(mut self, mode: ReservationMode) -> Self {
        self.head_of_line = self.head_of_line.with_mode(mode);
        self
    }

    /// The same coordinator with fair sharing over time at `half_life_ms` (0: off).
    pub fn with_fair_share(mut self, half_life_ms: u64) -> Self {
        self.fair_share_half_life_ms = half_life_ms;
        self
    }

    /// The same coordinator with rebalancing `policy`.
    pub fn with_rebalance(mut self, policy: RebalancePolicy) -> Self {
        self.rebalance = policy;
        self
    }

    fn leads_meta(&self) -> bool {
        let host = self.groups.host();
        host.leader_of(META_GROUP) == Some(host.node_id())
    }

    /// Runs rounds until `stop` fires: one as soon as the meta group changes (a
    /// submission, say), at most every [`COORDINATOR_ROUND_GAP_MS`], and one every
    /// [`COORDINATOR_TICK_MS`] otherwise (backoffs and deadlines come due by time), or
    /// every [`COORDINATOR_IDLE_TICK_MS`] after a round that found nothing to do.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut leading = false;
        let mut rounds: u64 = 0;
        let mut tick_ms = COORDINATOR_TICK_MS;
        let mut changes = match self.groups.host().changes(META_GROUP) {
            Ok(changes) => changes,
            Err(e) => {
                tracing::error!(error = %e, "the coordinator has no meta group to follow");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(tick_ms)) => {}
                alive = changes.changed() => {
                    if !alive {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(COORDINATOR_ROUND_GAP_MS)).await;
                }
                _ = stop.changed() => return,
            }
            if !self.leads_meta() {
                if leading {
                    self.parking.lost_leadership();
                }
                leading = false;
                tick_ms = COORDINATOR_TICK_MS;
                continue;
            }
            // Until a round completes, every round is a first one (it finishes the
            // commits a previous leader left and reads linearizably).
            let first_round = !leading;
            rounds += 1;
            let span = tracing::info_span!("placement_round", round = rounds);
            match self.round(first_round).instrument(span).await {
                Ok(activity) => {
                    leading = true;
                    tick_ms = activity.pause_ms(now_ms());
                }
                Err(e) => {
                    tick_ms = COORDINATOR_TICK_MS;
                    tracing::debug!(error = %e, "coordinator round interrupted");
                }
            }
        }
    }

    async fn round(&self, first_round: bool) -> Result<Activity, GroupError> {
        self.preemptions_left
            .store(PREEMPTION_ATTEMPTS_PER_ROUND_MAX, Ordering::Relaxed);
        let undelivered = self.deliver_undelivered(first_round).await?;
        if let Err(e) = self.wake_parked().await {
            tracing::debug!(error = %e, "parked groups not woken this round");
        }
        let (moving, sealed) = self.advance_move(first_round).await;
        if let Err(e) = self.refresh_capacity().await {
            tracing::debug!(error = %e, "cluster capacity not recorded this round");
        }
        if let Err(e) = self.sample_usage().await {
            tracing::debug!(error = %e, "queue usage not sampled this round");
        }
        if let Err(e) = self.refresh_reservations().await {
            tracing::debug!(error = %e, "reservations not read this round");
        }
        if let Err(e) = self.end_overrun_groups().await {
            tracing::debug!(error = %e, "run-time limits not checked this round");
        }
        let _round = PhaseTimer::start(Phase::Round);
        let pending = MetaQuery::Pending {
            limit: GROUPS_PER_ROUND_MAX as u32,
            // Groups that come due before an idle tick stay in the window, so a round
            // that finds only them is busy and the next comes at the busy pace.
            due_at_ms: (!self.failpoints.armed(failpoints::PENDING_KEEPS_BACKED_OFF))
                .then(|| now_ms() + COORDINATOR_IDLE_TICK_MS),
        };
        // The first round as leader reads linearizably (the log may hold entries this
        // replica has not applied yet); later ones read the leader's own applied state.
        // A stale read is harmless: every step is re-checked when the meta group applies it.
        let timer = PhaseTimer::start(Phase::Pending);
        let reply = if first_round {
            self.groups.meta_query(&pending).await?
        } else {
            self.groups.meta_query_local(&pending)?
        };
        let MetaReply::Groups { records } = reply else {
            return Ok(Activity::Busy);
        };
        drop(timer);
        let now = now_ms();
        let activity = Activity::of(&records, undelivered, moving, now);
        let no_room = self.quota_refusals(&records)?;
        let ready: Vec<&GroupRecord> = records
            .iter()
            .filter(|r| {
                r.state == GroupState::Queued
                    && r.not_before_ms <= now
                    && r.deadline_ms.is_none_or(|d| d > now)
                    && !no_room.contains_key(&r.seq)
            })
            .collect();
        // Safety-net re-checks wait while other groups are ready (they rarely fit, and a
        // round that re-plans them delays those placements), up to a bound.
        let others_ready = ready.iter().any(|r| !r.is_parked());
        let deferred_recheck = |r: &GroupRecord| {
            others_ready
                && r.is_parked()
                && now < r.not_before_ms.saturating_add(PARKED_RECHECK_DEFER_MAX_MS)
        };
        let ready: Vec<&GroupRecord> = ready.into_iter().filter(|r| !deferred_recheck(r)).collect();
        let batch = self.place_batch(&ready).await;
        let waits_for_move = |r: &GroupRecord| {
            r.placements
                .values()
                .chain(r.releasing.values())
                .any(|p| sealed.contains(&p.node))
        };
        // Parked groups due by their safety net (at most a few per read) are tried
        // together after the others: they rarely fit, and their requeues then share
        // one log flush instead of one each.
        let (rechecks, records): (Vec<&GroupRecord>, Vec<&GroupRecord>) =
            records.iter().partition(|r| {
                r.is_parked()
                    && !batch.handled.contains(&r.seq)
                    && !batch.deferred.contains(&r.seq)
                    && !batch.parked.contains(&r.seq)
                    && !no_room.contains_key(&r.seq)
            });
        let rechecks: Vec<&GroupRecord> = rechecks
            .into_iter()
            .filter(|r| !deferred_recheck(r))
            .collect();
        for record in records {
            let seq = record.seq;
            let result = match record.state {
                GroupState::Queued if batch.handled.contains(&seq) => Ok(()),
                GroupState::Queued if batch.parked.contains(&seq) => Ok(()),
                // The next round (at once: this one is busy) batches them.
                GroupState::Queued if batch.deferred.contains(&seq) => Ok(()),
                GroupState::Queued if no_room.contains_key(&seq) => {
                    self.wait_for_room(record, &no_room[&seq]).await
                }
                GroupState::Queued => self.queued(record).await,
                GroupState::Placing { txn } => self.recover(txn).await,
                // Its members may be between shards: released once the move committed.
                GroupState::Releasing { .. } if waits_for_move(record) => Ok(()),
                GroupState::Releasing { .. } => self.release(record).await,
                GroupState::Placed => self.finish_member_release(record).await,
                GroupState::Done { .. } | GroupState::Preempting { .. } => Ok(()),
            };
            if let Err(e) = result {
                tracing::warn!(group = seq, error = %e, "gang group step failed; retrying next round");
            }
        }
        let tried = join_all(rechecks.iter().map(|r| self.queued(r))).await;
        for (r, result) in rechecks.iter().zip(tried) {
            if let Err(e) = result {
                tracing::warn!(group = r.seq, error = %e, "parked group's recheck failed; retrying next round");
            }
        }
        Ok(activity)
    }

    /// Takes the running shard move a step further, or (automatic rebalancing on, and
    /// due) begins one; whether a move runs, and the nodes of a move left sealed (their
    /// releases wait). One local read of meta a round when no move runs. Failures are
    /// logged and retried next round.
    async fn advance_move(&self, first_round: bool) -> (bool, BTreeSet<String>) {
        let running = match moves::running(&self.groups, first_round).await {
            Ok(running) => running,
            Err(e) => {
                tracing::debug!(error = %e, "shard moves not read this round");
                return (false, BTreeSet::new());
            }
        };
        let Some(m) = running else {
            return (self.rebalance_if_due().await, BTreeSet::new());
        };
        match moves::advance(&self.groups, &self.failpoints, &m).await {
            Ok(moves::MoveProgress::Waiting(why)) => {
                tracing::debug!(shard_move = m.id, why, "shard move waits");
            }
            Ok(moves::MoveProgress::Ended(_)) => {
                // A rebalance's next move is planned at once.
                let mut checked = self
                    .balance_checked_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                *checked = None;
            }
            Err(e) => {
                tracing::warn!(shard_move = m.id, error = %e, "shard move step failed; retrying next round");
            }
        }
        let sealed = moves::sealed_nodes(&self.groups).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "a sealed move's nodes not read; its releases wait too");
            m.nodes().cloned().collect()
        });
        (true, sealed)
    }

    /// Every `check_ms` with automatic rebalancing on: begins the first move
    /// of a rebalance when a shard holds more than the bound over the mean capacity.
    async fn rebalance_if_due(&self) -> bool {
        // A replica writing for the first rollout of an upgrade begins no move: replicas
        // of the release before could not read it.
        if !self.rebalance.auto || self.shards.get() < 2 || self.groups.legacy_writer() {
            return false;
        }
        {
            let now = std::time::Instant::now();
            let mut last = self
                .balance_checked_at
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| {
                now.duration_since(at) < Duration::from_millis(self.rebalance.check_ms)
            }) {
                return false;
            }
            *last = Some(now);
        }
        let bound = self.rebalance.bound_percent;
        let (plan, peak) = match moves::plan_rebalance(&self.groups, self.shards.get(), bound).await
        {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(error = %e, "shard balance not checked");
                return false;
            }
        };
        let Some(first) = plan.first() else {
            return false;
        };
        let reason = format!(
            "rebalance: the heaviest shard holds {peak}% of the mean capacity, above {bound}%"
        );
        match moves::begin_planned(&self.groups, first, reason).await {
            Ok(Ok(m)) => {
                tracing::info!(
                    shard_move = m.id,
                    from = first.from,
                    to = first.to,
                    nodes = first.nodes.len(),
                    peak,
                    "rebalancing shards"
                );
                true
            }
            Ok(Err(why)) => {
                tracing::debug!(why, "rebalance move not begun");
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "rebalance move not begun");
                false
            }
        }
    }
}

/// What meta records of an assignment's members (of a cluster of `shards` shards):
/// node, shard and devices, and the other shards that hold their network-attached
/// devices.
fn placements(a: &Assignment, shards: u32) -> BTreeMap<String, Placement> {
    a.per_shard
        .iter()
        .flat_map(|(shard, members)| {
            members.iter().map(move |m: &ReserveMember| {
                // Its own network devices and a shared claim's it carries or uses.
                let holds: Vec<&NetworkHold> =
                    a.network.iter().filter(|h| h.member == m.member).collect();
                let network_devices = holds.iter().flat_map(|h| &h.devices);
                (
                    m.member.to_string(),
                    Placement {
                        txn: None,
                        node: m.node.clone(),
                        shard: *shard,
                        devices: m
                            .pod
                            .devices
                            .iter()
                            .chain(network_devices)
                            .map(PlacedDevice::of)
                            .collect(),
                        network_shards: if holds.is_empty() {
                            Vec::new()
                        } else {
                            (1..=shards).filter(|s| s != shard).collect()
                        },
                        allocations: Vec::new(),
                    },
                )
            })
        })
        .collect()
}

/// The decision a one-shard reserve-and-commit reply calls for.
fn one_shard_vote(shard: u32, reply: LedgerReply) -> (Decision, String) {
    match reply {
        LedgerReply::Committed { .. }
        | LedgerReply::AlreadyFinished {
            outcome: TxnOutcome::Committed,
            ..
        } => (Decision::Commit, String::new()),
        other => (
            Decision::Abort,
            refusal_reason(shard, &ShardOutcome::Applied(other)),
        ),
    }
}

fn refusal_reason(shard: u32, outcome: &ShardOutcome) -> String {
    match outcome {
        ShardOutcome::Applied(LedgerReply::ReserveRefused { refusals, .. }) => {
            match refusals.first() {
                Some(r) => format!("shard {shard} refused the reservation: {r}"),
                None => format!("shard {shard} refused the reservation"),
            }
        }
        ShardOutcome::Applied(LedgerReply::Rejected { error }) => format!("shard {shard}: {error}"),
        other => format!("shard {shard}: {other:?}"),
    }
}

#[cfg(test)]
#[path = "activity_tests.rs"]
mod activity_tests;
