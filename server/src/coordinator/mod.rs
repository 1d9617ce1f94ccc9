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

pub mod metrics;
pub mod moves;
pub mod preempt;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use gangway_raft::META_GROUP;
use tokio::sync::watch;
use tracing::Instrument;

use crate::failpoints::{self, Failpoints};
use crate::replicated::growth::ShardCount;
use crate::replicated::release;
use crate::replicated::{now_ms, GroupError, Groups, ShardOutcome};
use gangway_core::engine::{GangPlacement, Profile};
use gangway_core::ledger::command::{HoldKind, NetworkHold};
use gangway_core::ledger::meta::{
    Decision, GroupRecord, GroupSeq, GroupState, MetaCommand, MetaQuery, MetaReply, PlacedDevice,
    Placement,
};
use gangway_core::ledger::{LedgerError, LedgerOp, LedgerReply, ReserveMember, TxnId, TxnOutcome};
use gangway_core::model::{MemberKey, PodSpec};
use gangway_core::plan::assign::{self, assign, AssignOutcome, Assignment};
use gangway_core::plan::budgets::DisruptionBudgets;
use gangway_core::plan::rebalance;
use gangway_core::query::{ShardAnswer, ShardQuery};
use metrics::{transaction_ended, Phase, PhaseTimer};

/// Period between the coordinator's reads of the shards' capacity (recorded in meta
/// when it changed: the pool top-level queues lend in), in ms.
pub const CAPACITY_REFRESH_MS: u64 = 5_000;
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
/// Whether a round found work (the next comes after `COORDINATOR_TICK_MS`) or none
/// (after `COORDINATOR_IDLE_TICK_MS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activity {
    Idle,
    Busy,
}

/// How long a participant holds a reservation before asking for the decision.
pub const RESERVE_TTL_MS: u64 = 10_000;
const _: () = assert!(RESERVE_TTL_MS <= gangway_core::ledger::RESERVE_HOLD_MS_MAX);
/// Most groups looked at in one round.
pub const GROUPS_PER_ROUND_MAX: usize = 256;
// A round's batched writes carry one command per group: they must fit one batch.
const _: () = assert!(GROUPS_PER_ROUND_MAX <= gangway_core::ledger::meta::META_BATCH_MAX);
const _: () = assert!(GROUPS_PER_ROUND_MAX <= gangway_core::ledger::command::LEDGER_BATCH_MAX);
/// Most members planned together in one batched round.
pub const BATCH_MEMBERS_MAX: usize = 8_192;
/// Most preemption attempts in one round: each asks every shard for offers (up to
/// `OFFER_STEPS_MAX` placements each) and plans, so a round with many high-priority
/// groups that do not fit would otherwise delay every other group's placement.
pub const PREEMPTION_ATTEMPTS_PER_ROUND_MAX: u32 = 2;
/// Most undelivered decisions delivered in one round.
pub const UNDELIVERED_PER_ROUND_MAX: u32 = 4_096;

/// Default period of the coordinator's checks of the shards' balance, in ms (when no
/// move runs; right after a move ends, the next check comes at once).
pub const REBALANCE_CHECK_MS_DEFAULT: u64 = 30_000;

/// Whether and when the coordinator rebalances shards on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebalancePolicy {
    /// Off: only `gangctl shards rebalance` and `move` move nodes.
    pub auto: bool,
    /// A shard above this percentage of the mean capacity starts a rebalance.
    pub bound_percent: u64,
    /// Period of the checks, in ms.
    pub check_ms: u64,
}

impl Default for RebalancePolicy {
    fn default() -> Self {
        Self {
            auto: true,
            bound_percent: rebalance::REBALANCE_BOUND_PERCENT_DEFAULT,
            check_ms: REBALANCE_CHECK_MS_DEFAULT,
        }
    }
}

/// What a round's batch did with the ready groups.
struct BatchOutcome {
    /// Groups it placed (or left to recovery when its writes were interrupted).
    handled: BTreeSet<GroupSeq>,
    /// Groups left for the next round's batch: earlier ones spent the member budget.
    deferred: BTreeSet<GroupSeq>,
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
    /// When the shards' capacity was last read (a monotonic clock; None: never).
    capacity_read_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Automatic rebalancing.
    rebalance: RebalancePolicy,
    /// When the balance was last checked (None: check at the next idle moment).
    balance_checked_at: std::sync::Mutex<Option<std::time::Instant>>,
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
    /// A coordinator over `shards` shards, choosing preemption victims by `budgets`.
    pub fn new(
        groups: Groups,
        shards: ShardCount,
        profile: Profile,
        failpoints: Failpoints,
        budgets: Arc<DisruptionBudgets>,
    ) -> Self {
        Self {
            groups,
            shards,
            profile,
            failpoints,
            rounds: AtomicU32::new(0),
            preemptions_left: AtomicU32::new(0),
            budgets,
            capacity_read_at: std::sync::Mutex::new(None),
            rebalance: RebalancePolicy::default(),
            // The first check comes a period after the coordinator starts: a fleet
            // registering at start-up is not rebalanced half registered.
            balance_checked_at: std::sync::Mutex::new(Some(std::time::Instant::now())),
        }
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
                    tick_ms = match activity {
                        Activity::Idle => COORDINATOR_IDLE_TICK_MS,
                        Activity::Busy => COORDINATOR_TICK_MS,
                    };
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
        let (moving, sealed) = self.advance_move(first_round).await;
        if let Err(e) = self.refresh_capacity().await {
            tracing::debug!(error = %e, "cluster capacity not recorded this round");
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
        let activity = match (undelivered, records.is_empty(), moving) {
            (0, true, false) => Activity::Idle,
            _ => Activity::Busy,
        };
        let now = now_ms();
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
        let batch = self.place_batch(&ready).await;
        let waits_for_move = |r: &GroupRecord| {
            r.placements
                .values()
                .chain(r.releasing.values())
                .any(|p| sealed.contains(&p.node))
        };
        for record in &records {
            let seq = record.seq;
            let result = match record.state {
                GroupState::Queued if batch.handled.contains(&seq) => Ok(()),
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

    /// Every [`CAPACITY_REFRESH_MS`], sums the shards' allocatable resources and records
    /// the total in meta if it changed. A shard that cannot answer within
    /// [`CAPACITY_READ_TIMEOUT_MS`] leaves the old record.
    async fn refresh_capacity(&self) -> Result<(), GroupError> {
        {
            let now = std::time::Instant::now();
            let mut last = self
                .capacity_read_at
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let due = last.is_none_or(|at| {
                now.duration_since(at) >= Duration::from_millis(CAPACITY_REFRESH_MS)
            });
            if !due {
                return Ok(());
            }
            *last = Some(now);
        }
        let reads = self.shards.ids().map(|shard| async move {
            let read = self.groups.shard_query(shard, &ShardQuery::Capacity);
            match tokio::time::timeout(Duration::from_millis(CAPACITY_READ_TIMEOUT_MS), read).await
            {
                Ok(Ok(ShardAnswer::Capacity { allocatable })) => Some(allocatable),
                _ => None,
            }
        });
        let mut total = gangway_core::model::Resources::zero();
        for read in join_all(reads).await {
            // A shard that cannot answer now (an election, say) leaves the old record.
            let Some(allocatable) = read else {
                return Ok(());
            };
            total = total.saturating_add(&allocatable);
        }
        let recorded = match self.groups.meta_query_local(&MetaQuery::Capacity)? {
            MetaReply::Capacity { capacity } => capacity,
            _ => None,
        };
        if recorded.as_ref() != Some(&total) {
            self.groups
                .meta(&MetaCommand::NoteCapacity { capacity: total })
                .await?;
        }
        Ok(())
    }

    /// The queued groups among `records` whose queues have no room for them now, with
    /// why (a local read: meta checks again when the transaction begins, I8).
    fn quota_refusals(
        &self,
        records: &[GroupRecord],
    ) -> Result<BTreeMap<GroupSeq, String>, GroupError> {
        let seqs: Vec<GroupSeq> = records
            .iter()
            .filter(|r| r.state == GroupState::Queued && !r.group.queue.is_empty())
            .map(|r| r.seq)
            .collect();
        if seqs.is_empty() {
            return Ok(BTreeMap::new());
        }
        match self
            .groups
            .meta_query_local(&MetaQuery::QuotaRefusals { seqs })?
        {
            MetaReply::QuotaRefusals { refusals } => Ok(refusals.into_iter().collect()),
            _ => Ok(BTreeMap::new()),
        }
    }

    /// A group whose queue has no room: it times out at its deadline, else says why it
    /// waits (once) and is looked at again next round, with no backoff.
    async fn wait_for_room(&self, r: &GroupRecord, why: &str) -> Result<(), GroupError> {
        if self.expire_if_due(r).await? {
            return Ok(());
        }
        if r.reason != why {
            self.groups
                .meta(&MetaCommand::NoteWaiting {
                    seq: r.seq,
                    reason: why.to_string(),
                })
                .await?;
        }
        Ok(())
    }

    /// Places, in one pass, every ready group that one shard can hold whole.
    /// Shards are asked in turn (starting at a shard that rotates per round):
    /// each plans only the groups no earlier shard could hold, in one query
    /// (the engine accounts the capacity each takes), so a group that fits
    /// the first shard costs one plan, not one per shard. Then all chosen
    /// groups commit concurrently (their Raft writes batch). Groups past the
    /// batch's member budget wait for the next round's batch, if this one began a
    /// transaction (placed one at a time, each costs a plan and three writes: a burst
    /// of 512-member gangs reached 16k pods/s instead of 25k). The rest of the ready
    /// groups take the one-at-a-time path, which can split a group over shards: those
    /// larger than the budget and those holding members already go this round, ahead
    /// of deferred ones.
    async fn place_batch(&self, ready: &[&GroupRecord]) -> BatchOutcome {
        let mut batch: Vec<(&GroupRecord, Vec<(MemberKey, PodSpec)>)> = Vec::new();
        let mut deferred = BTreeSet::new();
        let mut total = 0usize;
        for r in ready.iter().filter(|r| r.placements.is_empty()) {
            let members = Self::members(r);
            // Too large for any batch: one at a time.
            if members.len() > BATCH_MEMBERS_MAX {
                continue;
            }
            // Order is kept: once one waits, every later one waits too.
            if !deferred.is_empty() || total + members.len() > BATCH_MEMBERS_MAX {
                deferred.insert(r.seq);
                continue;
            }
            total += members.len();
            batch.push((r, members));
        }
        if batch.is_empty() {
            return BatchOutcome {
                handled: BTreeSet::new(),
                deferred,
            };
        }
        let mut chosen = Vec::new();
        let mut left: Vec<&(&GroupRecord, Vec<(MemberKey, PodSpec)>)> = batch.iter().collect();
        // One count for the whole pass: a shard added meanwhile joins the next round.
        let shard_count = self.shards.get();
        let start = self.rounds.fetch_add(1, Ordering::Relaxed) % shard_count;
        for k in 0..shard_count {
            if left.is_empty() {
                break;
            }
            let shard = 1 + (start + k) % shard_count;
            let members: Vec<(MemberKey, PodSpec)> =
                left.iter().flat_map(|(_, m)| m.iter().cloned()).collect();
            let timer = PhaseTimer::start(Phase::Quote);
            let Some(plan) = self.plan(shard, &members).await else {
                continue;
            };
            drop(timer);
            let placed: BTreeMap<MemberKey, ReserveMember> = plan
                .assignments
                .into_iter()
                .map(|a| (a.member.clone(), a))
                .collect();
            let holds: BTreeMap<MemberKey, NetworkHold> = plan
                .network
                .into_iter()
                .map(|h| (h.member.clone(), h))
                .collect();
            let shards = self.shards.get();
            left.retain(|(r, members)| {
                let mine: Option<Vec<ReserveMember>> = members
                    .iter()
                    .map(|(k, _)| placed.get(k).cloned())
                    .collect();
                let network: Vec<NetworkHold> = members
                    .iter()
                    .filter_map(|(k, _)| holds.get(k).cloned())
                    .collect();
                match mine {
                    // Network-attached devices are held on every shard: such a group
                    // is placed on its own, as a multi-shard transaction (no other shard
                    // plans it here).
                    Some(_) if !network.is_empty() && shards > 1 => false,
                    Some(mut m) => {
                        assign::stamp_uids(&r.group, m.iter_mut());
                        let a = Assignment {
                            per_shard: BTreeMap::from([(shard, m)]),
                            network,
                        };
                        chosen.push((*r, shard, a));
                        false
                    }
                    None => true,
                }
            });
        }
        let begun = match self.commit_batch(&chosen).await {
            Ok(begun) => begun,
            Err(e) => {
                tracing::warn!(error = %e, "batched placement interrupted; recovering next round");
                0
            }
        };
        // Waiting is only worth it behind a batch that moved: a batch that began
        // nothing (groups meta refused, or none fit one shard) would stand in front
        // of the deferred ones again next round.
        if begun == 0 {
            deferred.clear();
        }
        BatchOutcome {
            handled: chosen.iter().map(|(r, _, _)| r.seq).collect(),
            deferred,
        }
    }

    /// Places groups that each fit one shard with three batched writes in all: one meta
    /// entry begins every transaction, one entry per shard reserves and commits its
    /// groups, one meta entry records every decision. Each operation in a batch is
    /// applied as if alone, so the protocol is the one-shard path's; a write that fails
    /// leaves its groups Placing, and the next round recovers them. Returns how many
    /// transactions meta began.
    async fn commit_batch(
        &self,
        chosen: &[(&GroupRecord, u32, Assignment)],
    ) -> Result<usize, GroupError> {
        if chosen.is_empty() {
            return Ok(0);
        }
        let at_ms = now_ms();
        let begins = chosen
            .iter()
            .map(|(r, shard, _)| MetaCommand::BeginTxn {
                seq: r.seq,
                participants: vec![*shard],
                at_ms,
            })
            .collect();
        let timer = PhaseTimer::start(Phase::Begin);
        let begun = self.meta_batch(begins).await?;
        drop(timer);
        let mut per_shard: BTreeMap<u32, Vec<(TxnId, &Assignment)>> = BTreeMap::new();
        let mut began = 0;
        for ((_, shard, assignment), reply) in chosen.iter().zip(begun) {
            if let MetaReply::TxnBegun { txn } = reply {
                per_shard.entry(*shard).or_default().push((txn, assignment));
                began += 1;
            }
        }
        let timer = PhaseTimer::start(Phase::Reserve);
        let writes = per_shard.iter().map(|(shard, txns)| async move {
            let ops = txns
                .iter()
                .map(|(txn, a)| LedgerOp::ReserveAndCommit {
                    txn_id: *txn,
                    members: a.per_shard.get(shard).cloned().unwrap_or_default(),
                    network: a.network.clone(),
                })
                .collect();
            (
                *shard,
                self.groups.shard(*shard, LedgerOp::Batch { ops }).await,
            )
        });
        let outcomes = join_all(writes).await;
        drop(timer);
        let mut decides = Vec::new();
        let mut counts = Vec::new();
        for (shard, outcome) in outcomes {
            let txns = per_shard.get(&shard).map(Vec::as_slice).unwrap_or_default();
            let replies = match outcome {
                Ok(ShardOutcome::Applied(LedgerReply::Batch { replies })) => replies,
                Ok(other) => {
                    tracing::warn!(shard, ?other, "a batched reserve was not applied");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "a batched reserve failed");
                    continue;
                }
            };
            for ((txn, a), reply) in txns.iter().zip(replies) {
                // The shard applied the entry: it holds the outcome already.
                let (decision, reason) = one_shard_vote(shard, reply);
                counts.push(a.members());
                decides.push(MetaCommand::Decide {
                    txn: *txn,
                    decision,
                    placements: placements(a, self.shards.get()),
                    reason,
                    at_ms: now_ms(),
                    delivered: vec![shard],
                });
            }
        }
        if decides.is_empty() {
            return Ok(began);
        }
        let timer = PhaseTimer::start(Phase::Decide);
        let decided = self.meta_batch(decides).await?;
        drop(timer);
        for (reply, pods) in decided.into_iter().zip(counts) {
            if let MetaReply::Decided { decision, .. } = reply {
                transaction_ended(decision, pods);
            }
        }
        // A decision meta changed (a member held twice) is delivered at the next round.
        Ok(began)
    }

    /// Whether `r`, which did not fit, tries to preempt: only if it may, and some placed
    /// group has a lower priority (a local read), and the round has an attempt left.
    fn preemption_chance(&self, r: &GroupRecord) -> Result<PreemptionChance, GroupError> {
        if !preempt::may_preempt(r) {
            return Ok(PreemptionChance::None);
        }
        let query = match &r.group.preempts_within {
            Some(root) => MetaQuery::LowestPlacedPriorityWithin { root: root.clone() },
            None => MetaQuery::LowestPlacedPriority,
        };
        let lowest = match self.groups.meta_query_local(&query)? {
            MetaReply::LowestPriority { priority } => priority,
            _ => None,
        };
        if lowest.is_none_or(|p| p >= r.highest_priority()) {
            return Ok(PreemptionChance::None);
        }
        let taken = self
            .preemptions_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        Ok(if taken {
            PreemptionChance::Try
        } else {
            PreemptionChance::Deferred
        })
    }

    /// Whether `r` tries to reclaim its queue's guarantee, and from which groups (a
    /// local read; meta checks again): when its queue is below its `min` with room for
    /// it there, some group of another queue is above theirs, and the round has a
    /// preemption attempt left.
    fn reclaim_chance(&self, r: &GroupRecord) -> Result<Reclaim, GroupError> {
        if r.group.queue.is_empty() || !preempt::may_preempt(r) {
            return Ok(Reclaim::None);
        }
        let victims = match self
            .groups
            .meta_query_local(&MetaQuery::Reclaimable { seq: r.seq })?
        {
            MetaReply::Reclaimable { victims } if !victims.is_empty() => victims,
            MetaReply::Rejected { reason, .. } => return Ok(Reclaim::Refused(reason)),
            _ => return Ok(Reclaim::None),
        };
        let taken = self
            .preemptions_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        Ok(match taken {
            true => Reclaim::Try(victims),
            false => Reclaim::Deferred,
        })
    }

    /// Applies `commands` as one meta entry; one reply per command.
    async fn meta_batch(&self, commands: Vec<MetaCommand>) -> Result<Vec<MetaReply>, GroupError> {
        let n = commands.len();
        match self.groups.meta(&MetaCommand::Batch { commands }).await? {
            MetaReply::Batch { replies } if replies.len() == n => Ok(replies),
            other => Err(GroupError::Decode {
                group: META_GROUP,
                reason: format!("a batch of {n} was answered with {other:?}"),
            }),
        }
    }

    /// Times `r` out when its waitTime has passed; whether it did.
    async fn expire_if_due(&self, r: &GroupRecord) -> Result<bool, GroupError> {
        let now = now_ms();
        if r.deadline_ms.is_none_or(|d| d > now) {
            return Ok(false);
        }
        self.groups
            .meta(&MetaCommand::Expire {
                seq: r.seq,
                at_ms: now,
            })
            .await?;
        Ok(true)
    }

    async fn queued(&self, r: &GroupRecord) -> Result<(), GroupError> {
        if self.expire_if_due(r).await? {
            return Ok(());
        }
        if r.not_before_ms > now_ms() {
            return Ok(());
        }
        self.place(r).await
    }

    /// The members of `r` a placement attempt plans: those the group does not hold
    /// already (a NonStrict group planned again keeps what it has; planning those
    /// again placed them twice). The bug switch [`failpoints::REPLAN_HELD_MEMBERS`]
    /// plans them all, as gangway once did.
    fn members_to_plan(&self, r: &GroupRecord) -> Vec<(MemberKey, PodSpec)> {
        let mut members = Self::members(r);
        if !self.failpoints.armed(failpoints::REPLAN_HELD_MEMBERS) {
            members.retain(|(key, _)| !r.holds(&key.to_string()));
        }
        members
    }

    fn members(r: &GroupRecord) -> Vec<(MemberKey, PodSpec)> {
        r.group
            .gangs
            .iter()
            .flat_map(|g| {
                g.members
                    .iter()
                    .map(move |m| (g.member_key(m), m.spec.clone()))
            })
            .collect()
    }

    async fn plan(&self, shard: u32, members: &[(MemberKey, PodSpec)]) -> Option<GangPlacement> {
        let query = ShardQuery::Plan {
            members: members.to_vec(),
            profile: Box::new(self.profile.clone()),
            carried: Vec::new(),
        };
        match self.groups.shard_query(shard, &query).await {
            Ok(ShardAnswer::Plan { placement }) => Some(placement),
            Ok(other) => {
                tracing::warn!(shard, ?other, "unexpected plan answer");
                None
            }
            Err(e) => {
                tracing::warn!(shard, error = %e, "shard could not plan; leaving it out");
                None
            }
        }
    }

    async fn plans(&self, members: &[(MemberKey, PodSpec)]) -> BTreeMap<u32, GangPlacement> {
        let every: Vec<u32> = self.shards.ids().collect();
        self.plans_on(&every, members, &[]).await
    }

    /// The plans of `shards` for `members`, with `carried` (shared claims other
    /// members carry with network devices) planned as held.
    async fn plans_on(
        &self,
        shards: &[u32],
        members: &[(MemberKey, PodSpec)],
        carried: &[NetworkHold],
    ) -> BTreeMap<u32, GangPlacement> {
        let query = ShardQuery::Plan {
            members: members.to_vec(),
            profile: Box::new(self.profile.clone()),
            carried: carried.to_vec(),
        };
        let asks = shards.iter().map(|&s| {
            let query = &query;
            async move { (s, self.groups.shard_query(s, query).await) }
        });
        let mut plans = BTreeMap::new();
        for (shard, answer) in join_all(asks).await {
            match answer {
                Ok(ShardAnswer::Plan { placement }) => {
                    plans.insert(shard, placement);
                }
                Ok(other) => tracing::warn!(shard, ?other, "unexpected plan answer"),
                Err(e) => tracing::warn!(shard, error = %e, "shard could not plan; leaving it out"),
            }
        }
        plans
    }

    /// A second pass for a group short because each shard planned it alone: members
    /// that follow a shared claim another shard's member carries with network devices
    /// could not be planned beside that carrier. The shards the first pass left unused
    /// plan the rest with those claims held, and both passes make one assignment (one
    /// transaction). `None` when the first pass carries no such claim or nothing is left
    /// to try.
    async fn beside_carriers(
        &self,
        r: &GroupRecord,
        members: &[(MemberKey, PodSpec)],
        placed_before: &BTreeSet<String>,
        partial: &Assignment,
        reason: &str,
    ) -> Option<AssignOutcome> {
        let carried: Vec<NetworkHold> = partial
            .network
            .iter()
            .filter(|h| matches!(h.kind(), HoldKind::Carry(_)))
            .cloned()
            .collect();
        let assigned: BTreeSet<&MemberKey> = partial
            .per_shard
            .values()
            .flatten()
            .map(|m| &m.member)
            .collect();
        let rest: Vec<(MemberKey, PodSpec)> = members
            .iter()
            .filter(|(key, _)| !assigned.contains(key))
            .cloned()
            .collect();
        let others: Vec<u32> = self
            .shards
            .ids()
            .filter(|s| !partial.per_shard.contains_key(s))
            .collect();
        if carried.is_empty() || rest.is_empty() || others.is_empty() {
            return None;
        }
        let plans = self.plans_on(&others, &rest, &carried).await;
        let mut before = placed_before.clone();
        before.extend(assigned.iter().map(|k| k.to_string()));
        let (second, ready) = match assign(&r.group, &plans, &before) {
            AssignOutcome::Ready(a) => (a, true),
            AssignOutcome::Short { partial, .. } => (partial, false),
        };
        let mut joined = partial.clone();
        for (shard, more) in second.per_shard {
            joined.per_shard.entry(shard).or_default().extend(more);
        }
        joined.network.extend(second.network);
        Some(if ready {
            AssignOutcome::Ready(joined)
        } else {
            AssignOutcome::Short {
                reason: reason.to_string(),
                partial: joined,
            }
        })
    }

    async fn place(&self, r: &GroupRecord) -> Result<(), GroupError> {
        tracing::debug!(
            group = r.seq,
            waited_ms = now_ms().saturating_sub(r.submitted_at_ms),
            "placing"
        );
        let members = self.members_to_plan(r);
        let timer = PhaseTimer::start(Phase::Quote);
        let plans = self.plans(&members).await;
        drop(timer);
        let placed_before: BTreeSet<String> = r.placements.keys().cloned().collect();
        let mut outcome = assign(&r.group, &plans, &placed_before);
        if let AssignOutcome::Short { reason, partial } = &outcome {
            let second = self.beside_carriers(r, &members, &placed_before, partial, reason);
            if let Some(second) = second.await {
                outcome = second;
            }
        }
        let assignment = match outcome {
            AssignOutcome::Ready(a) => a,
            AssignOutcome::Short { partial, .. }
                if r.accumulates() && !partial.per_shard.is_empty() =>
            {
                partial
            }
            AssignOutcome::Short { reason, .. } => {
                let tried = std::time::Instant::now();
                let reason = match self.preemption_chance(r)? {
                    PreemptionChance::None => reason,
                    PreemptionChance::Deferred => format!(
                        "{reason}; preemption deferred: {PREEMPTION_ATTEMPTS_PER_ROUND_MAX} attempts per round"
                    ),
                    PreemptionChance::Try => {
                        match self.preempt(r, &preempt::Grounds::Priority).await? {
                            preempt::Preemption::Ran => return Ok(()),
                            preempt::Preemption::NotBegun(why) => {
                                let ms = tried.elapsed().as_millis() as u64;
                                tracing::debug!(group = r.seq, %why, ms, "no preemption");
                                format!("{reason}; no preemption: {why}")
                            }
                        }
                    }
                };
                let reason = match self.reclaim_chance(r)? {
                    Reclaim::None => reason,
                    Reclaim::Refused(why) => format!("{reason}; no reclaim: {why}"),
                    Reclaim::Deferred => format!(
                        "{reason}; reclaim deferred: {PREEMPTION_ATTEMPTS_PER_ROUND_MAX} attempts per round"
                    ),
                    Reclaim::Try(victims) => {
                        match self.preempt(r, &preempt::Grounds::Reclaim(victims)).await? {
                            preempt::Preemption::Ran => return Ok(()),
                            preempt::Preemption::NotBegun(why) => {
                                tracing::debug!(group = r.seq, %why, "no reclaim");
                                format!("{reason}; no reclaim: {why}")
                            }
                        }
                    }
                };
                self.groups
                    .meta(&MetaCommand::Requeue {
                        seq: r.seq,
                        reason,
                        at_ms: now_ms(),
                        attempts: Some(r.attempts),
                    })
                    .await?;
                return Ok(());
            }
        };
        let participants = assignment.participants(self.shards.get());
        let begin = MetaCommand::BeginTxn {
            seq: r.seq,
            participants: participants.clone(),
            at_ms: now_ms(),
        };
        let timer = PhaseTimer::start(Phase::Begin);
        let MetaReply::TxnBegun { txn } = self.groups.meta(&begin).await? else {
            return Ok(());
        };
        drop(timer);
        let span =
            tracing::info_span!("transaction", group = r.seq, %txn, shards = participants.len());
        self.run_txn(txn, &participants, &assignment)
            .instrument(span)
            .await
    }

    /// Reserves, decides and commits (or aborts) transaction `txn`.
    async fn run_txn(
        &self,
        txn: TxnId,
        participants: &[u32],
        assignment: &Assignment,
    ) -> Result<(), GroupError> {
        if participants.len() == 1 {
            return self
                .place_in_one_shard(txn, participants[0], assignment)
                .await;
        }
        let timer = PhaseTimer::start(Phase::Reserve);
        let votes = self.reserve_all(txn, participants, assignment).await;
        drop(timer);
        let no = votes.iter().find_map(|v| match v {
            Vote::No(why) => Some(why.clone()),
            Vote::Yes => None,
        });
        let (decision, reason) = match no {
            None => {
                self.failpoints.hit(failpoints::AFTER_RESERVE);
                (Decision::Commit, String::new())
            }
            Some(why) => (Decision::Abort, why),
        };
        if decision == Decision::Commit
            && self
                .failpoints
                .armed(failpoints::COORDINATOR_SKIPS_DECISION)
        {
            tracing::error!(%txn, "bug switch {}: telling COMMIT with no recorded decision", failpoints::COORDINATOR_SKIPS_DECISION);
            let ops = gangway_core::plan::decision::decision_ops(txn, Decision::Commit, false);
            for shard in participants {
                let _ = self
                    .groups
                    .shard(*shard, LedgerOp::Batch { ops: ops.clone() })
                    .await;
            }
            return Ok(());
        }
        let decided = self
            .decide(
                txn,
                decision,
                placements(assignment, self.shards.get()),
                reason,
                Vec::new(),
            )
            .await?;
        if decided == Decision::Commit {
            self.failpoints.hit(failpoints::AFTER_DECIDE);
        }
        let timer = PhaseTimer::start(Phase::Commit);
        release::tell(
            &self.groups,
            txn,
            decided,
            participants,
            participants.len() == 1,
        )
        .await;
        drop(timer);
        transaction_ended(decided, assignment.members());
        Ok(())
    }

    async fn place_in_one_shard(
        &self,
        txn: TxnId,
        shard: u32,
        a: &Assignment,
    ) -> Result<(), GroupError> {
        let members = a.per_shard.get(&shard).cloned().unwrap_or_default();
        let timer = PhaseTimer::start(Phase::Reserve);
        let outcome = self
            .groups
            .shard(
                shard,
                LedgerOp::ReserveAndCommit {
                    txn_id: txn,
                    members,
                    network: a.network.clone(),
                },
            )
            .await?;
        drop(timer);
        let (decision, reason, delivered) = match outcome {
            ShardOutcome::Applied(reply) => {
                let (decision, reason) = one_shard_vote(shard, reply);
                (decision, reason, vec![shard])
            }
            other => (Decision::Abort, refusal_reason(shard, &other), Vec::new()),
        };
        let decided = self
            .decide(
                txn,
                decision,
                placements(a, self.shards.get()),
                reason,
                delivered,
            )
            .await?;
        if decided != decision {
            release::tell(&self.groups, txn, decided, &[shard], true).await;
        }
        tracing::debug!(%txn, ?decided, "one-shard placement decided");
        transaction_ended(decided, a.members());
        Ok(())
    }

    async fn reserve_all(&self, txn: TxnId, participants: &[u32], a: &Assignment) -> Vec<Vote> {
        let deadline_ms = now_ms() + RESERVE_TTL_MS;
        let asks = participants.iter().map(|shard| {
            let op = LedgerOp::Reserve {
                txn_id: txn,
                members: a.per_shard.get(shard).cloned().unwrap_or_default(),
                deadline_ms,
                network: a.network.clone(),
            };
            async move {
                match self.groups.shard(*shard, op).await {
                    Ok(ShardOutcome::Applied(LedgerReply::Reserved { .. })) => Vote::Yes,
                    Ok(other) => Vote::No(refusal_reason(*shard, &other)),
                    Err(e) => Vote::No(format!("shard {shard}: {e}")),
                }
            }
        });
        join_all(asks).await
    }

    /// Writes the decision; returns the one recorded (a tombstone may have won).
    async fn decide(
        &self,
        txn: TxnId,
        decision: Decision,
        placements: BTreeMap<String, Placement>,
        reason: String,
        delivered: Vec<u32>,
    ) -> Result<Decision, GroupError> {
        let _timer = PhaseTimer::start(Phase::Decide);
        let cmd = MetaCommand::Decide {
            txn,
            decision,
            placements,
            reason,
            at_ms: now_ms(),
            delivered,
        };
        match self.groups.meta(&cmd).await? {
            MetaReply::Decided { decision, .. } => Ok(decision),
            other => {
                tracing::warn!(%txn, ?other, "decision not recorded");
                Ok(Decision::Abort)
            }
        }
    }

    /// Delivers, in bulk, decisions some participant has not acknowledged (a tell that
    /// failed, a coordinator that died between deciding and telling): a cheap local
    /// read when there are none, so it runs every round; after a failover it reads
    /// linearizably. Work grows with undelivered decisions, not with placed groups.
    /// Delivers decisions participants have not acknowledged; answers how many there were.
    async fn deliver_undelivered(&self, first_round: bool) -> Result<usize, GroupError> {
        let query = MetaQuery::Undelivered {
            limit: UNDELIVERED_PER_ROUND_MAX,
        };
        let reply = if first_round {
            self.groups.meta_query(&query).await?
        } else {
            self.groups.meta_query_local(&query)?
        };
        let MetaReply::Undelivered { txns } = reply else {
            return Ok(0);
        };
        if txns.is_empty() {
            return Ok(0);
        }
        tracing::info!(
            decisions = txns.len(),
            "delivering decisions participants have not acknowledged"
        );
        let acked = release::deliver(&self.groups, &txns).await;
        release::record_delivered(&self.groups, &acked).await?;
        Ok(txns.len())
    }

    /// A group left in Placing by an earlier coordinator: its transaction is undecided.
    async fn recover(&self, txn: TxnId) -> Result<(), GroupError> {
        let MetaReply::Txn { record: Some(t) } =
            self.groups.meta_query(&MetaQuery::Txn { txn }).await?
        else {
            return Ok(());
        };
        if let Some(decision) = t.decision {
            release::tell(
                &self.groups,
                txn,
                decision,
                &t.participants,
                t.participants.len() == 1,
            )
            .await;
            return Ok(());
        }
        if let [shard] = t.participants[..] {
            return self.recover_one_shard(txn, shard).await;
        }
        let decided = self
            .decide(
                txn,
                Decision::Abort,
                BTreeMap::new(),
                "coordinator failover".into(),
                Vec::new(),
            )
            .await?;
        release::tell(&self.groups, txn, decided, &t.participants, false).await;
        Ok(())
    }

    /// In the one-shard path the shard is authoritative: abort there first (a
    /// tombstone if it never saw the entry); if it had committed, record that, with
    /// the devices the shard allocated.
    async fn recover_one_shard(&self, txn: TxnId, shard: u32) -> Result<(), GroupError> {
        let outcome = self
            .groups
            .shard(shard, LedgerOp::Abort { txn_id: txn })
            .await?;
        let committed = matches!(
            outcome,
            ShardOutcome::Applied(LedgerReply::Rejected {
                error: LedgerError::TxnCommitted { .. },
            })
        );
        if !committed {
            self.decide(
                txn,
                Decision::Abort,
                BTreeMap::new(),
                "coordinator failover".into(),
                vec![shard],
            )
            .await?;
            return Ok(());
        }
        let ShardAnswer::Txn {
            members, devices, ..
        } = self
            .groups
            .shard_query(shard, &ShardQuery::Txn { txn })
            .await?
        else {
            return Ok(());
        };
        let mut devices: BTreeMap<MemberKey, Vec<PlacedDevice>> = devices
            .into_iter()
            .map(|(m, list)| (m, list.iter().map(PlacedDevice::of).collect()))
            .collect();
        let placements = members
            .into_iter()
            .map(|(m, node)| {
                let placement = Placement {
                    node,
                    shard,
                    devices: devices.remove(&m).unwrap_or_default(),
                    txn: Some(txn),
                    network_shards: Vec::new(),
                    allocations: Vec::new(),
                };
                (m.to_string(), placement)
            })
            .collect();
        let decided = self
            .decide(
                txn,
                Decision::Commit,
                placements,
                String::new(),
                vec![shard],
            )
            .await?;
        if decided != Decision::Commit {
            release::tell(&self.groups, txn, decided, &[shard], true).await;
        }
        Ok(())
    }

    /// A placed group whose member release (ReleaseMembers) recorded in meta did not
    /// reach its shards (the caller died): finish it.
    async fn finish_member_release(&self, r: &GroupRecord) -> Result<(), GroupError> {
        if r.releasing.is_empty() {
            return Ok(());
        }
        release::free_members(&self.groups, &r.releasing).await?;
        self.groups
            .meta(&MetaCommand::MembersReleased {
                seq: r.seq,
                members: r.releasing.keys().cloned().collect(),
                at_ms: now_ms(),
            })
            .await?;
        Ok(())
    }

    /// Gives back everything a releasing group holds: an aborted transaction on its
    /// participants (a cancel while placing), then every member it holds, placed or
    /// releasing, each with the transaction that placed it committed first.
    async fn release(&self, r: &GroupRecord) -> Result<(), GroupError> {
        let mut latest_committed = None;
        if let Some(txn) = r.txn {
            if let MetaReply::Txn { record: Some(t) } =
                self.groups.meta_query(&MetaQuery::Txn { txn }).await?
            {
                if t.decision == Some(Decision::Commit) {
                    latest_committed = Some(txn);
                }
                if t.decision == Some(Decision::Abort) && !t.unacked.is_empty() {
                    let alone = t.participants.len() == 1;
                    let all =
                        release::tell(&self.groups, txn, Decision::Abort, &t.unacked, alone).await;
                    if !all {
                        return Err(GroupError::StepRefused {
                            shard: t.unacked.first().copied().unwrap_or(0),
                            reason: format!("{txn}: ABORT not delivered yet"),
                        });
                    }
                }
            }
        }
        let mut held = r.placements.clone();
        held.extend(r.releasing.iter().map(|(k, p)| (k.clone(), p.clone())));
        // Placements recorded before each kept its transaction were placed by the
        // group's latest one, if that one committed.
        for p in held.values_mut() {
            p.txn = p.txn.or(latest_committed);
        }
        release::free_members(&self.groups, &held).await?;
        self.groups
            .meta(&MetaCommand::ReleaseDone {
                seq: r.seq,
                at_ms: now_ms(),
            })
            .await?;
        Ok(())
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
