//! The coordinator: on the meta group's leader, it takes gang groups from the
//! durable queue in order and places each all-or-nothing across shards with
//! two-phase reservation (DESIGN §5, §6): plan on every shard, assign, begin a
//! transaction, reserve on every participant (one entry per shard), record
//! the decision in the meta log, then commit or abort everywhere. A group that
//! fits in one shard skips the protocol (reserve and commit in one entry).
//!
//! Invariants: the decision is written before any participant hears it; a
//! participant's reservation is never dropped on its own (resolvers ask the
//! decision log at the deadline); after a meta failover, undecided
//! transactions resolve to abort and decided ones are driven to completion.
//! One task per replica, owned by the `Replica`; it acts only while this
//! replica leads the meta group.

pub mod assign;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::join_all;
use gangway_raft::META_GROUP;
use tokio::sync::watch;

use crate::engine::{GangPlacement, Profile};
use crate::failpoints::{self, Failpoints};
use crate::ledger::meta::{
    Decision, GroupRecord, GroupSeq, GroupState, MetaCommand, MetaQuery, MetaReply, PlacedDevice,
    Placement,
};
use crate::ledger::query::{ShardAnswer, ShardQuery};
use crate::ledger::{
    LedgerError, LedgerOp, LedgerReply, ReleaseTarget, ReserveMember, TxnId, TxnOutcome,
};
use crate::model::{MemberKey, PodSpec};
use crate::replicated::{now_ms, GroupError, Groups, ShardOutcome};
use assign::{assign, AssignOutcome, Assignment};

/// Period of the coordinator's rounds.
pub const COORDINATOR_TICK_MS: u64 = 20;
/// How long a participant holds a reservation before asking for the decision.
pub const RESERVE_TTL_MS: u64 = 10_000;
/// Most groups looked at in one round.
pub const GROUPS_PER_ROUND_MAX: usize = 256;
/// Most members planned together in one batched round.
pub const BATCH_MEMBERS_MAX: usize = 8_192;

/// The coordinator of one replica.
pub struct Coordinator {
    groups: Groups,
    shards: u32,
    profile: Profile,
    failpoints: Failpoints,
    /// Rounds run, to rotate the shard asked first.
    rounds: AtomicU32,
}

/// What a reservation attempt on one participant came to.
enum Vote {
    Yes,
    No(String),
}

impl Coordinator {
    /// A coordinator over `shards` shards.
    pub fn new(groups: Groups, shards: u32, profile: Profile, failpoints: Failpoints) -> Self {
        Self {
            groups,
            shards,
            profile,
            failpoints,
            rounds: AtomicU32::new(0),
        }
    }

    fn leads_meta(&self) -> bool {
        let host = self.groups.host();
        host.leader_of(META_GROUP) == Some(host.node_id())
    }

    /// Runs rounds until `stop` fires.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut leading = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(COORDINATOR_TICK_MS)) => {}
                _ = stop.changed() => return,
            }
            if !self.leads_meta() {
                leading = false;
                continue;
            }
            let first_round = !leading;
            leading = true;
            if let Err(e) = self.round(first_round).await {
                tracing::debug!(error = %e, "coordinator round interrupted");
            }
        }
    }

    async fn round(&self, first_round: bool) -> Result<(), GroupError> {
        if first_round {
            self.finish_commits().await?;
        }
        let pending = MetaQuery::Pending {
            limit: GROUPS_PER_ROUND_MAX as u32,
        };
        let MetaReply::Groups { records } = self.groups.meta_query(&pending).await? else {
            return Ok(());
        };
        let now = now_ms();
        let ready: Vec<&GroupRecord> = records
            .iter()
            .filter(|r| {
                r.state == GroupState::Queued
                    && r.not_before_ms <= now
                    && r.deadline_ms.is_none_or(|d| d > now)
            })
            .collect();
        let batched = self.place_batch(&ready).await;
        for record in &records {
            let seq = record.seq;
            let result = match record.state {
                GroupState::Queued if batched.contains(&seq) => Ok(()),
                GroupState::Queued => self.queued(record).await,
                GroupState::Placing { txn } => self.recover(txn).await,
                GroupState::Releasing { .. } => self.release(record).await,
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::warn!(group = seq, error = %e, "gang group step failed; retrying next round");
            }
        }
        Ok(())
    }

    /// Places, in one pass, every ready group that one shard can hold whole.
    /// Shards are asked in turn (starting at a shard that rotates per round):
    /// each plans only the groups no earlier shard could hold, in one query
    /// (the engine accounts the capacity each takes). Then all chosen groups
    /// commit concurrently (their Raft writes batch). Returns the groups it
    /// handled; the rest take the one-at-a-time path, which can split a group
    /// over shards.
    async fn place_batch(&self, ready: &[&GroupRecord]) -> BTreeSet<GroupSeq> {
        let mut batch: Vec<(&GroupRecord, Vec<(MemberKey, PodSpec)>)> = Vec::new();
        let mut total = 0usize;
        for r in ready.iter().filter(|r| r.placements.is_empty()) {
            let members = Self::members(r);
            if total + members.len() > BATCH_MEMBERS_MAX {
                break;
            }
            total += members.len();
            batch.push((r, members));
        }
        if batch.len() < 2 {
            return BTreeSet::new();
        }
        let mut chosen = Vec::new();
        let mut left: Vec<&(&GroupRecord, Vec<(MemberKey, PodSpec)>)> = batch.iter().collect();
        let start = self.rounds.fetch_add(1, Ordering::Relaxed) % self.shards;
        for k in 0..self.shards {
            if left.is_empty() {
                break;
            }
            let shard = 1 + (start + k) % self.shards;
            let members: Vec<(MemberKey, PodSpec)> =
                left.iter().flat_map(|(_, m)| m.iter().cloned()).collect();
            let Some(plan) = self.plan(shard, &members).await else {
                continue;
            };
            let placed: BTreeMap<MemberKey, ReserveMember> = plan
                .assignments
                .into_iter()
                .map(|a| (a.member.clone(), a))
                .collect();
            left.retain(|(r, members)| {
                let mine: Option<Vec<ReserveMember>> = members
                    .iter()
                    .map(|(k, _)| placed.get(k).cloned())
                    .collect();
                match mine {
                    Some(m) => {
                        chosen.push((*r, shard, m));
                        false
                    }
                    None => true,
                }
            });
        }
        let runs = chosen.iter().map(|(r, shard, members)| async move {
            let a = Assignment { per_shard: BTreeMap::from([(*shard, members.clone())]) };
            if let Err(e) = self.commit_in_one_shard(r, *shard, &a).await {
                tracing::warn!(group = r.seq, error = %e, "batched placement failed; retrying next round");
            }
        });
        join_all(runs).await;
        chosen.iter().map(|(r, _, _)| r.seq).collect()
    }

    async fn commit_in_one_shard(
        &self,
        r: &GroupRecord,
        shard: u32,
        a: &Assignment,
    ) -> Result<(), GroupError> {
        let begin = MetaCommand::BeginTxn {
            seq: r.seq,
            participants: vec![shard],
            at_ms: now_ms(),
        };
        let MetaReply::TxnBegun { txn } = self.groups.meta(&begin).await? else {
            return Ok(());
        };
        self.place_in_one_shard(txn, shard, a).await
    }

    async fn queued(&self, r: &GroupRecord) -> Result<(), GroupError> {
        let now = now_ms();
        if r.deadline_ms.is_some_and(|d| d <= now) {
            self.groups
                .meta(&MetaCommand::Expire {
                    seq: r.seq,
                    at_ms: now,
                })
                .await?;
            return Ok(());
        }
        if r.not_before_ms > now {
            return Ok(());
        }
        self.place(r).await
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
        let query = ShardQuery::Plan {
            members: members.to_vec(),
            profile: Box::new(self.profile.clone()),
        };
        let asks = (1..=self.shards).map(|s| {
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

    async fn place(&self, r: &GroupRecord) -> Result<(), GroupError> {
        let members = Self::members(r);
        let plans = self.plans(&members).await;
        let placed_before: BTreeSet<String> = r.placements.keys().cloned().collect();
        let assignment = match assign(&r.group, &plans, &placed_before) {
            AssignOutcome::Ready(a) => a,
            AssignOutcome::Short { partial, .. }
                if r.accumulates() && !partial.per_shard.is_empty() =>
            {
                partial
            }
            AssignOutcome::Short { reason, .. } => {
                self.groups
                    .meta(&MetaCommand::Requeue {
                        seq: r.seq,
                        reason,
                        at_ms: now_ms(),
                    })
                    .await?;
                return Ok(());
            }
        };
        let participants: Vec<u32> = assignment.per_shard.keys().copied().collect();
        let begin = MetaCommand::BeginTxn {
            seq: r.seq,
            participants: participants.clone(),
            at_ms: now_ms(),
        };
        let MetaReply::TxnBegun { txn } = self.groups.meta(&begin).await? else {
            return Ok(());
        };
        let span =
            tracing::info_span!("placement", group = r.seq, %txn, shards = participants.len());
        let _enter = span.enter();
        if participants.len() == 1 {
            return self
                .place_in_one_shard(txn, participants[0], &assignment)
                .await;
        }
        let votes = self.reserve_all(txn, &assignment).await;
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
        let decided = self
            .decide(txn, decision, placements(&assignment), reason)
            .await?;
        if decided == Decision::Commit {
            self.failpoints.hit(failpoints::AFTER_DECIDE);
        }
        self.tell(txn, &participants, decided).await;
        Ok(())
    }

    async fn place_in_one_shard(
        &self,
        txn: TxnId,
        shard: u32,
        a: &Assignment,
    ) -> Result<(), GroupError> {
        let members = a.per_shard.get(&shard).cloned().unwrap_or_default();
        let outcome = self
            .groups
            .shard(
                shard,
                LedgerOp::ReserveAndCommit {
                    txn_id: txn,
                    members,
                },
            )
            .await?;
        let (decision, reason) = match outcome {
            ShardOutcome::Applied(LedgerReply::Committed { .. })
            | ShardOutcome::Applied(LedgerReply::AlreadyFinished {
                outcome: TxnOutcome::Committed,
                ..
            }) => (Decision::Commit, String::new()),
            other => (Decision::Abort, refusal_reason(shard, &other)),
        };
        self.decide(txn, decision, placements(a), reason).await?;
        Ok(())
    }

    async fn reserve_all(&self, txn: TxnId, a: &Assignment) -> Vec<Vote> {
        let deadline_ms = now_ms() + RESERVE_TTL_MS;
        let asks = a.per_shard.iter().map(|(shard, members)| {
            let op = LedgerOp::Reserve {
                txn_id: txn,
                members: members.clone(),
                deadline_ms,
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
    ) -> Result<Decision, GroupError> {
        let cmd = MetaCommand::Decide {
            txn,
            decision,
            placements,
            reason,
            at_ms: now_ms(),
        };
        match self.groups.meta(&cmd).await? {
            MetaReply::Decided { decision, .. } => Ok(decision),
            other => {
                tracing::warn!(%txn, ?other, "decision not recorded");
                Ok(Decision::Abort)
            }
        }
    }

    /// Pushes the decision to the participants (they would otherwise ask at their deadline).
    async fn tell(&self, txn: TxnId, participants: &[u32], decision: Decision) {
        let pushes = participants.iter().map(|shard| {
            let op = match decision {
                Decision::Commit => LedgerOp::Commit { txn_id: txn },
                Decision::Abort => LedgerOp::Abort { txn_id: txn },
            };
            async move {
                if let Err(e) = self.groups.shard(*shard, op).await {
                    tracing::warn!(shard, %txn, error = %e, "participant not told; it will ask at its deadline");
                }
            }
        });
        join_all(pushes).await;
    }

    /// A group left in Placing by an earlier coordinator: its transaction is undecided.
    async fn recover(&self, txn: TxnId) -> Result<(), GroupError> {
        let MetaReply::Txn { record: Some(t) } =
            self.groups.meta_query(&MetaQuery::Txn { txn }).await?
        else {
            return Ok(());
        };
        if let Some(decision) = t.decision {
            self.tell(txn, &t.participants, decision).await;
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
            )
            .await?;
        self.tell(txn, &t.participants, decided).await;
        Ok(())
    }

    /// In the one-shard path the shard is authoritative: abort there first (a
    /// tombstone if it never saw the entry); if it had committed, record that.
    async fn recover_one_shard(&self, txn: TxnId, shard: u32) -> Result<(), GroupError> {
        match self
            .groups
            .shard(shard, LedgerOp::Abort { txn_id: txn })
            .await?
        {
            ShardOutcome::Applied(LedgerReply::Rejected {
                error: LedgerError::TxnCommitted { .. },
            }) => {
                let ShardAnswer::Txn { members, .. } = self
                    .groups
                    .shard_query(shard, &ShardQuery::Txn { txn })
                    .await?
                else {
                    return Ok(());
                };
                let placements = members
                    .into_iter()
                    .map(|(m, node)| {
                        let placement = Placement {
                            node,
                            shard,
                            devices: Vec::new(),
                        };
                        (m.to_string(), placement)
                    })
                    .collect();
                self.decide(txn, Decision::Commit, placements, String::new())
                    .await?;
            }
            _ => {
                self.decide(
                    txn,
                    Decision::Abort,
                    BTreeMap::new(),
                    "coordinator failover".into(),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// After a meta failover, commits of placed groups may not have reached
    /// every participant: push them again (commits are idempotent).
    async fn finish_commits(&self) -> Result<(), GroupError> {
        let MetaReply::Groups { records } = self
            .groups
            .meta_query(&MetaQuery::Groups { active_only: true })
            .await?
        else {
            return Ok(());
        };
        for r in records.iter().filter(|r| r.state == GroupState::Placed) {
            self.finish_commit(r).await?;
        }
        Ok(())
    }

    async fn finish_commit(&self, r: &GroupRecord) -> Result<(), GroupError> {
        let Some(txn) = r.txn else { return Ok(()) };
        if let MetaReply::Txn { record: Some(t) } =
            self.groups.meta_query(&MetaQuery::Txn { txn }).await?
        {
            if t.decision == Some(Decision::Commit) {
                self.tell(txn, &t.participants, Decision::Commit).await;
            }
        }
        Ok(())
    }

    /// Gives back everything a releasing group holds: an undecided (now
    /// aborted) transaction on its participants, then every placed member.
    async fn release(&self, r: &GroupRecord) -> Result<(), GroupError> {
        if let Some(txn) = r.txn {
            if let MetaReply::Txn { record: Some(t) } =
                self.groups.meta_query(&MetaQuery::Txn { txn }).await?
            {
                if t.decision != Some(Decision::Commit) {
                    self.tell(txn, &t.participants, Decision::Abort).await;
                }
            }
        }
        let mut per_shard: BTreeMap<u32, Vec<MemberKey>> = BTreeMap::new();
        for (key, p) in &r.placements {
            if let Ok(member) = MemberKey::try_from(key.clone()) {
                per_shard.entry(p.shard).or_default().push(member);
            }
        }
        for (shard, members) in per_shard {
            let op = LedgerOp::Release {
                target: ReleaseTarget::Members(members),
            };
            self.groups.shard(shard, op).await?;
        }
        self.groups
            .meta(&MetaCommand::ReleaseDone {
                seq: r.seq,
                at_ms: now_ms(),
            })
            .await?;
        Ok(())
    }
}

fn placements(a: &Assignment) -> BTreeMap<String, Placement> {
    a.per_shard
        .iter()
        .flat_map(|(shard, members)| {
            members.iter().map(move |m: &ReserveMember| {
                (
                    m.member.to_string(),
                    Placement {
                        node: m.node.clone(),
                        shard: *shard,
                        devices: m
                            .pod
                            .devices
                            .iter()
                            .map(|d| PlacedDevice {
                                claim: d.claim.clone(),
                                request: d.request.clone(),
                                device: d.device.clone(),
                            })
                            .collect(),
                    },
                )
            })
        })
        .collect()
}

fn refusal_reason(shard: u32, outcome: &ShardOutcome) -> String {
    match outcome {
        ShardOutcome::Applied(LedgerReply::ReserveRefused { refusals, .. }) => {
            match refusals.first() {
                Some(r) => format!("shard {shard} refused the reservation: {r:?}"),
                None => format!("shard {shard} refused the reservation"),
            }
        }
        ShardOutcome::Applied(LedgerReply::Rejected { error }) => format!("shard {shard}: {error}"),
        other => format!("shard {shard}: {other:?}"),
    }
}
