//! Preemption, on the meta leader (docs/ARCHITECTURE.md §5 rule 14): a queued group
//! that did not fit, and whose priority is above some placed groups', asks every shard
//! for an offer (`ShardQuery::PreemptionOffer`), chooses the cheapest victims across
//! shards (`victims.rs`), checks in meta that each victim gang's group may go (Placed,
//! of lower priority, gRPC-submitted), plans the group with the victim groups gone
//! (`ShardQuery::PlanWithout`) and, only if that places every gang at minMember, runs
//! one transaction: `BeginPreemption` marks the victims Preempting, every participant
//! (the preemptor's shards and the victims') reserves with `ReserveDisplacing`, and
//! the decision settles preemptor and victims together. Victims whose eviction would
//! break a PodDisruptionBudget (`budgets.rs`) are spared when a choice without them
//! makes room; otherwise the preemption breaks it and says so. A *reclaim* (a queue
//! below its `min` taking back what other queues borrowed, docs/ARCHITECTURE.md 5a)
//! runs the same way on other grounds ([`Grounds::Reclaim`]): shards offer every gang,
//! only the reclaimable groups meta listed may go, the youngest weigh least, and meta
//! checks the same rule at `BeginPreemption { reclaim: true }`.
//!
//! Invariants: victims are whole groups; nothing is written unless the plan places the
//! whole group; victims end Preempted only through a COMMIT, which only follows a yes
//! from every participant, so no victim is evicted while the preemptor is not held.
//! Called by the coordinator's placement of one group (`Coordinator::place`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use futures::future::join_all;

use super::{placements, refusal_reason, Coordinator, KeptNodes, Vote, RESERVE_TTL_MS};
use crate::failpoints;
use crate::replicated::{now_ms, GroupError, ShardOutcome};
use gangway_core::engine::group_preemption::GroupOffer;
use gangway_core::engine::GangPlacement;
use gangway_core::ledger::meta::{
    Decision, GroupRecord, GroupSeq, GroupState, MetaCommand, MetaQuery, MetaReply,
};
use gangway_core::ledger::{LedgerOp, LedgerReply, TxnId};
use gangway_core::model::{GangId, MemberKey, PodSpec};
use gangway_core::plan::assign::{assign, AssignOutcome, Assignment};
use gangway_core::plan::budgets::{broken, placed_pods};
use gangway_core::plan::victims::{by_group, choose_victims, from_group_offers};
use gangway_core::query::{listed_topologies, ListedTopology};
use gangway_core::query::{ShardAnswer, ShardQuery};

/// What a preemption attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Preemption {
    /// A preemption transaction ran (committed or aborted; its decision is recorded).
    Ran,
    /// None was begun, for this reason.
    NotBegun(String),
}

/// Most offer rounds per attempt: each asks again without the units the previous
/// one offered whose groups may not go (a unit the coordinator cannot use cuts its
/// shard's offer at that step).
pub const OFFER_ROUNDS_MAX: usize = 3;

/// `gangway_preemptions_total{outcome}` labels.
pub const PREEMPTION_OUTCOMES: [&str; 3] = ["committed", "aborted", "no_plan"];

/// Registers the counters of preemptions and of reservations for the head of the line
/// at zero.
pub fn register() {
    for outcome in PREEMPTION_OUTCOMES {
        metrics::counter!("gangway_preemptions_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("gangway_preempted_groups_total").increment(0);
    metrics::counter!("gangway_preemption_budget_violations_total").increment(0);
    metrics::counter!("gangway_preempted_pods_total").increment(0);
    metrics::counter!("gangway_reservations_made_total").increment(0);
}

/// Whether `r` may preempt at all: it holds nothing (a NonStrict group that holds
/// members waits for room) and no member has preemptionPolicy Never.
pub(super) fn may_preempt(r: &GroupRecord) -> bool {
    r.holds_nothing()
        && !r
            .group
            .gangs
            .iter()
            .any(|g| g.members.iter().any(|m| m.spec.preemption_policy.never()))
}

/// On what grounds a preemption displaces placed groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Grounds {
    /// The preemptor's priority is above every victim's.
    Priority,
    /// The preemptor's queue takes back its `min` from these groups of queues above
    /// theirs, youngest first ([`gangway_core::ledger::meta::MetaState::reclaimable`]); the
    /// choice prefers the youngest.
    Reclaim(Vec<GroupSeq>),
}

impl Grounds {
    /// The priority shards offer below: every gang, for a reclaim (the coordinator and
    /// meta keep to the reclaimable groups).
    fn offer_priority(&self, r: &GroupRecord) -> i32 {
        match self {
            Self::Priority => r.highest_priority(),
            Self::Reclaim(_) => i32::MAX,
        }
    }

    /// Whether the group owning a victim gang may be displaced by `preemptor`, whose
    /// boundary admits the queues `within` (`None`: any); the same rules meta checks at
    /// `BeginPreemption`.
    fn displaceable(
        &self,
        owner: &GroupRecord,
        preemptor: &GroupRecord,
        within: Option<&BTreeSet<String>>,
    ) -> bool {
        let placed = owner.seq != preemptor.seq
            && owner.state == GroupState::Placed
            && owner.releasing.is_empty();
        placed
            && match self {
                Self::Priority => {
                    owner.highest_priority() < preemptor.highest_priority()
                        && within.is_none_or(|queues| queues.contains(&owner.group.queue))
                }
                Self::Reclaim(groups) => groups.contains(&owner.seq),
            }
    }

    /// The priority victim choice weighs a unit at: its own, or for a reclaim its rank
    /// from the youngest (0), so the choice takes the youngest it can.
    fn weight(&self, owner: &GroupRecord) -> i32 {
        match self {
            Self::Priority => owner.highest_priority(),
            Self::Reclaim(groups) => groups
                .iter()
                .position(|g| *g == owner.seq)
                .map_or(i32::MAX, |i| i32::try_from(i).unwrap_or(i32::MAX)),
        }
    }

    /// The preemptor's priority as victim choice compares it with the units' weights.
    fn bar(&self, r: &GroupRecord) -> i32 {
        match self {
            Self::Priority => r.highest_priority(),
            Self::Reclaim(groups) => i32::try_from(groups.len()).unwrap_or(i32::MAX),
        }
    }
}

impl Coordinator {
    /// The queues `r`'s preemption boundary admits (`None`: no boundary): its root and
    /// every queue under it, from this replica's meta state (meta checks again).
    fn boundary(&self, r: &GroupRecord) -> Result<Option<BTreeSet<String>>, GroupError> {
        let Some(root) = &r.group.preempts_within else {
            return Ok(None);
        };
        let parents: BTreeMap<String, String> =
            match self.groups.meta_query_local(&MetaQuery::Queues)? {
                MetaReply::Queues { queues } => queues
                    .into_iter()
                    .map(|q| (q.spec.name, q.spec.parent))
                    .collect(),
                _ => BTreeMap::new(),
            };
        let under = |queue: &str| {
            let mut next = queue;
            for _ in 0..=parents.len() {
                if next == root.as_str() {
                    return true;
                }
                match parents.get(next) {
                    Some(parent) if !parent.is_empty() => next = parent,
                    _ => return false,
                }
            }
            false
        };
        Ok(Some(
            parents
                .keys()
                .filter(|q| !root.is_empty() && under(q))
                .cloned()
                .collect(),
        ))
    }

    /// Tries to place `r` by preemption on `grounds`; see the module header.
    pub(super) async fn preempt(
        &self,
        r: &GroupRecord,
        grounds: &Grounds,
    ) -> Result<Preemption, GroupError> {
        let started = Instant::now();
        let priority = grounds.offer_priority(r);
        let within = self.boundary(r)?;
        let mut keep: BTreeSet<GangId> = BTreeSet::new();
        let mut round = 0;
        let (units, shard_offers, owners, ineligible) = loop {
            round += 1;
            let offers = self.offers(r, priority, &keep).await;
            let (mut units, shard_offers) = from_group_offers(&offers);
            let ineligible: BTreeSet<GangId> = offers
                .values()
                .flat_map(|o| o.ineligible.iter().cloned())
                .collect();
            if units.is_empty() {
                return Ok(Preemption::NotBegun(match grounds {
                    Grounds::Priority => "no lower-priority gang could make room".into(),
                    Grounds::Reclaim(_) => "no group its queue may reclaim could make room".into(),
                }));
            }
            let owners = self.owners_of(units.keys()).await?;
            let before = units.len();
            units.retain(|gang, _| {
                owners
                    .get(gang)
                    .is_some_and(|o| grounds.displaceable(o, r, within.as_ref()))
            });
            for (gang, unit) in units.iter_mut() {
                if let Some(o) = owners.get(gang) {
                    unit.priority = grounds.weight(o);
                }
            }
            if units.len() == before || round == OFFER_ROUNDS_MAX {
                break (units, shard_offers, owners, ineligible);
            }
            keep.extend(
                owners
                    .iter()
                    .filter(|(_, o)| !grounds.displaceable(o, r, within.as_ref()))
                    .map(|(g, _)| g.clone()),
            );
            keep.extend(shard_offers_units(&offers).filter(|g| !owners.contains_key(g)));
        };
        let need: BTreeMap<GangId, u32> = r
            .group
            .gangs
            .iter()
            .map(|g| (g.id(), g.min_member))
            .collect();
        // A victim group goes whole: its gangs are one unit, costed together.
        let gangs_of: BTreeMap<GangId, Vec<GangId>> = owners
            .iter()
            .map(|(gang, o)| (gang.clone(), o.group.gangs.iter().map(|g| g.id()).collect()))
            .collect();
        let (units, shard_offers) = by_group(&units, &shard_offers, &gangs_of, &ineligible);
        // Groups whose eviction alone would break a PodDisruptionBudget are spared if a
        // choice without them makes room.
        let budgets = self.budgets.current();
        let spared: BTreeMap<GangId, _> = units
            .iter()
            .filter(|(gang, _)| {
                owners
                    .get(*gang)
                    .is_none_or(|o| broken(&budgets, &placed_pods(o)).is_empty())
            })
            .map(|(gang, unit)| (gang.clone(), unit.clone()))
            .collect();
        let bar = grounds.bar(r);
        let choice = match spared.len() == units.len() {
            true => None,
            false => choose_victims(&spared, &shard_offers, &need, bar),
        };
        let Some(choice) = choice.or_else(|| choose_victims(&units, &shard_offers, &need, bar))
        else {
            return Ok(no_plan(match grounds {
                Grounds::Priority => {
                    "evicting every lower-priority gang that may go would not make room"
                }
                Grounds::Reclaim(_) => {
                    "evicting every group its queue may reclaim would not make room"
                }
            }));
        };
        if choice.evict.is_empty() {
            return Ok(no_plan("it fits without evicting anything now"));
        }
        // Victims are whole groups: a gang group's gangs go together.
        let victims: BTreeMap<GroupSeq, &GroupRecord> = choice
            .evict
            .iter()
            .filter_map(|g| owners.get(g))
            .map(|o| (o.seq, o))
            .collect();
        let gone: Vec<GangId> = victims
            .values()
            .flat_map(|v| v.group.gangs.iter().map(|g| g.id()))
            .collect();
        let members = Self::members(r);
        let topologies = listed_topologies(&r.group.gangs);
        let kept = self.head_of_line.kept_for(r);
        let plans = self
            .plans_without(&members, &gone, &topologies, &kept)
            .await;
        let assignment = match assign(&r.group, &plans, &BTreeSet::new()) {
            AssignOutcome::Ready(a) => a,
            AssignOutcome::Short { reason, .. } => {
                return Ok(no_plan(&format!(
                    "planned with the chosen victims gone, it still does not fit: {reason}"
                )))
            }
        };
        let victim_pods: Vec<_> = victims.values().flat_map(|v| placed_pods(v)).collect();
        let breaks: Vec<String> = broken(&budgets, &victim_pods)
            .iter()
            .map(|b| b.id())
            .collect();
        let victims_here = victims_per_shard(&victims)?;
        let participants: Vec<u32> = assignment
            .per_shard
            .keys()
            .chain(victims_here.keys())
            .copied()
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        let begin = MetaCommand::BeginPreemption {
            seq: r.seq,
            victims: victims.keys().copied().collect(),
            participants: participants.clone(),
            at_ms: now_ms(),
            reclaim: matches!(grounds, Grounds::Reclaim(_)),
        };
        let txn = match self.groups.meta(&begin).await? {
            MetaReply::TxnBegun { txn } => txn,
            MetaReply::Rejected { reason, .. } => {
                return Ok(no_plan(&format!("meta refused the preemption: {reason}")))
            }
            other => return Ok(no_plan(&format!("meta answered {other:?}"))),
        };
        tracing::info!(
            group = r.seq,
            %txn,
            victims = ?victims.keys().collect::<Vec<_>>(),
            shards = participants.len(),
            reclaim = matches!(grounds, Grounds::Reclaim(_)),
            "preempting"
        );
        if !breaks.is_empty() {
            tracing::warn!(group = r.seq, %txn, budgets = ?breaks, "preemption breaks PodDisruptionBudgets: no choice that keeps them makes room");
        }
        let decided = self
            .run_preemption(txn, &participants, &assignment, &victims_here)
            .await?;
        let outcome = match decided {
            Decision::Commit => {
                let pods: usize = victims.values().map(|v| v.placements.len()).sum();
                metrics::counter!("gangway_preempted_groups_total").increment(victims.len() as u64);
                metrics::counter!("gangway_preempted_pods_total").increment(pods as u64);
                metrics::histogram!("gangway_preemption_seconds")
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!("gangway_preemption_budget_violations_total")
                    .increment(breaks.len() as u64);
                if let Grounds::Reclaim(_) = grounds {
                    metrics::counter!("gangway_queue_reclaims_total", "queue" => r.group.queue.clone())
                        .increment(1);
                }
                "committed"
            }
            Decision::Abort => "aborted",
        };
        metrics::counter!("gangway_preemptions_total", "outcome" => outcome).increment(1);
        Ok(Preemption::Ran)
    }

    /// Reserves on every participant (members and victims there), decides and tells.
    async fn run_preemption(
        &self,
        txn: TxnId,
        participants: &[u32],
        assignment: &Assignment,
        victims_here: &BTreeMap<u32, Vec<MemberKey>>,
    ) -> Result<Decision, GroupError> {
        let deadline_ms = now_ms() + RESERVE_TTL_MS;
        let asks = participants.iter().map(|shard| {
            let op = LedgerOp::ReserveDisplacing {
                txn_id: txn,
                members: assignment.per_shard.get(shard).cloned().unwrap_or_default(),
                victims: victims_here.get(shard).cloned().unwrap_or_default(),
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
        let votes = join_all(asks).await;
        let no = votes.iter().find_map(|v| match v {
            Vote::No(why) => Some(why.clone()),
            Vote::Yes => None,
        });
        let (decision, reason) = match no {
            None => (Decision::Commit, String::new()),
            Some(why) => (Decision::Abort, format!("preemption: {why}")),
        };
        if decision == Decision::Commit {
            self.failpoints.hit(failpoints::PREEMPTION_AFTER_RESERVE);
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
            self.failpoints.hit(failpoints::PREEMPTION_AFTER_DECIDE);
        }
        super::release::tell(
            &self.groups,
            txn,
            decided,
            participants,
            participants.len() == 1,
        )
        .await;
        Ok(decided)
    }

    /// Every shard's offer for `r`, never evicting `keep` (a shard that cannot answer
    /// offers nothing).
    async fn offers(
        &self,
        r: &GroupRecord,
        priority: i32,
        keep: &BTreeSet<GangId>,
    ) -> BTreeMap<u32, GroupOffer> {
        let query = ShardQuery::PreemptionOffer {
            group: Box::new(r.group.clone()),
            priority,
            profile: Box::new(self.plan_profile()),
            keep: keep.iter().cloned().collect(),
        };
        let asks = self.shards.ids().map(|s| {
            let query = &query;
            async move { (s, self.groups.shard_query(s, query).await) }
        });
        let mut offers = BTreeMap::new();
        for (shard, answer) in join_all(asks).await {
            match answer {
                Ok(ShardAnswer::Offer { offer }) => {
                    offers.insert(shard, offer);
                }
                Ok(other) => tracing::warn!(shard, ?other, "unexpected offer answer"),
                Err(e) => {
                    tracing::warn!(shard, error = %e, "shard could not offer; leaving it out")
                }
            }
        }
        offers
    }

    /// The live groups owning `gangs`, by gang.
    async fn owners_of(
        &self,
        gangs: impl Iterator<Item = &GangId>,
    ) -> Result<BTreeMap<GangId, GroupRecord>, GroupError> {
        let names: Vec<String> = gangs
            .map(|g| format!("{}/{}", g.namespace, g.name))
            .collect();
        let reply = self
            .groups
            .meta_query(&MetaQuery::OwnersOf { gangs: names })
            .await?;
        let MetaReply::Groups { records } = reply else {
            return Ok(BTreeMap::new());
        };
        Ok(records
            .into_iter()
            .flat_map(|r| {
                let ids: Vec<GangId> = r.group.gangs.iter().map(|g| g.id()).collect();
                ids.into_iter().map(move |id| (id, r.clone()))
            })
            .collect())
    }

    /// Every shard's plan for `members` with the pods of `gone` evicted, each without its
    /// `kept` nodes.
    pub(super) async fn plans_without(
        &self,
        members: &[(MemberKey, PodSpec)],
        gone: &[GangId],
        topologies: &[ListedTopology],
        kept: &KeptNodes,
    ) -> BTreeMap<u32, GangPlacement> {
        let profile = Box::new(self.plan_profile());
        let queries = self.shards.ids().map(|s| {
            let query = ShardQuery::PlanWithout {
                members: members.to_vec(),
                profile: profile.clone(),
                gone: gone.to_vec(),
                topologies: topologies.to_vec(),
                kept: kept.get(&s).cloned().unwrap_or_default(),
            };
            (s, query)
        });
        self.ask_each(queries.collect()).await
    }
}

/// Every gang the shards offered as a unit.
fn shard_offers_units(offers: &BTreeMap<u32, GroupOffer>) -> impl Iterator<Item = GangId> + '_ {
    offers.values().flat_map(|o| o.units.keys().cloned())
}

/// The victims' members, by the shard that holds them.
fn victims_per_shard(
    victims: &BTreeMap<GroupSeq, &GroupRecord>,
) -> Result<BTreeMap<u32, Vec<MemberKey>>, GroupError> {
    let mut out: BTreeMap<u32, Vec<MemberKey>> = BTreeMap::new();
    for v in victims.values() {
        for (key, p) in &v.placements {
            let member = MemberKey::try_from(key.clone()).map_err(|e| GroupError::Decode {
                group: gangway_raft::META_GROUP,
                reason: format!("gang group {}: placement key {e}", v.seq),
            })?;
            out.entry(p.shard).or_default().push(member);
        }
    }
    Ok(out)
}

fn no_plan(reason: &str) -> Preemption {
    metrics::counter!("gangway_preemptions_total", "outcome" => "no_plan").increment(1);
    Preemption::NotBegun(reason.to_string())
}
