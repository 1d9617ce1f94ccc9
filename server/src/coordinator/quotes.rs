//! Asking shards for placement plans: the members to plan, each shard's plan, and plans
//! beside the carriers of shared claims. Part of [`Coordinator`]'s `impl`.

use super::*;

impl Coordinator {
    /// The members of `r` a placement attempt plans: those the group does not hold
    /// already (a NonStrict group planned again keeps what it has; planning those
    /// again placed them twice). The bug switch [`failpoints::REPLAN_HELD_MEMBERS`]
    /// plans them all, as gangway once did.
    pub(super) fn members_to_plan(&self, r: &GroupRecord) -> Vec<(MemberKey, PodSpec)> {
        let mut members = Self::members(r);
        if !self.failpoints.armed(failpoints::REPLAN_HELD_MEMBERS) {
            members.retain(|(key, _)| !r.holds(&key.to_string()));
        }
        members
    }

    pub(super) fn members(r: &GroupRecord) -> Vec<(MemberKey, PodSpec)> {
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

    pub(super) async fn plan(
        &self,
        shard: u32,
        members: &[(MemberKey, PodSpec)],
        topologies: &[ListedTopology],
        kept: Vec<String>,
    ) -> Option<GangPlacement> {
        let query = self.plan_query(members, &[], topologies, kept);
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

    /// The plan query for `members` with `carried` held, carrying `topologies` (none
    /// under the bug switch [`failpoints::PLANS_IGNORE_TOPOLOGY`]), without the `kept`
    /// nodes (reserved for a group ahead).
    fn plan_query(
        &self,
        members: &[(MemberKey, PodSpec)],
        carried: &[NetworkHold],
        topologies: &[ListedTopology],
        kept: Vec<String>,
    ) -> ShardQuery {
        let topologies = if self.failpoints.armed(failpoints::PLANS_IGNORE_TOPOLOGY) {
            Vec::new()
        } else {
            topologies.to_vec()
        };
        ShardQuery::Plan {
            members: members.to_vec(),
            profile: Box::new(self.plan_profile()),
            carried: carried.to_vec(),
            topologies,
            kept,
        }
    }

    /// Every shard's plan for `members`, each without its `kept` nodes.
    pub(super) async fn plans(
        &self,
        members: &[(MemberKey, PodSpec)],
        topologies: &[ListedTopology],
        kept: &KeptNodes,
    ) -> BTreeMap<u32, GangPlacement> {
        let every: Vec<u32> = self.shards.ids().collect();
        self.plans_on(&every, members, &[], topologies, kept).await
    }

    /// The plans of `shards` for `members`, with `carried` (shared claims other
    /// members carry with network devices) planned as held, each without its `kept`
    /// nodes.
    pub(super) async fn plans_on(
        &self,
        shards: &[u32],
        members: &[(MemberKey, PodSpec)],
        carried: &[NetworkHold],
        topologies: &[ListedTopology],
        kept: &KeptNodes,
    ) -> BTreeMap<u32, GangPlacement> {
        let queries = shards.iter().map(|s| {
            let kept = kept.get(s).cloned().unwrap_or_default();
            (*s, self.plan_query(members, carried, topologies, kept))
        });
        self.ask_each(queries.collect()).await
    }

    /// Asks each shard its plan query at once; a shard that cannot answer is left out.
    pub(super) async fn ask_each(
        &self,
        queries: Vec<(u32, ShardQuery)>,
    ) -> BTreeMap<u32, GangPlacement> {
        let asks = queries
            .iter()
            .map(|(s, query)| async move { (*s, self.groups.shard_query(*s, query).await) });
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
    pub(super) async fn beside_carriers(
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
        let topologies = listed_topologies(&r.group.gangs);
        let kept = self.head_of_line.kept_for(r);
        let plans = self
            .plans_on(&others, &rest, &carried, &topologies, &kept)
            .await;
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
}
