//! Admitting gang groups: submissions with their idempotency keys and owners, the
//! per-owner live-group bound, gangs kept by a live group, queue quotas and reclaim,
//! and the notes a waiting group carries. Part of [`MetaState`]'s `impl`.

use super::*;

impl MetaState {
    pub(super) fn submit(
        &mut self,
        key: &str,
        group: &GangGroup,
        at_ms: u64,
        live_max: Option<u32>,
    ) -> MetaReply {
        if key.is_empty() {
            return rejected("idempotency_key: must not be empty");
        }
        let scoped = owned_key(&group.owner, key);
        if let Some(seq) = self.keys.get(&scoped) {
            if let Some(existing) = self.groups.get(seq) {
                if !same_body(&existing.group, group) {
                    return conflict(format!(
                        "idempotency_key: {} was used for gang group {seq} with another body; use a new key for a new group",
                        short(key)
                    ));
                }
            }
            return MetaReply::Submitted {
                seq: *seq,
                created: false,
                summary: self.groups.get(seq).map(|r| Box::new(GroupSummary::of(r))),
            };
        }
        if let Err(e) = group.validate(&crate::model::FieldPath::root()) {
            return rejected(e.to_string());
        }
        if !group.queue.is_empty() && self.queues.spec(&group.queue).is_none() {
            return MetaReply::Rejected {
                reason: format!(
                    "queue: no queue {}; create it first (gangctl queues put)",
                    short(&group.queue)
                ),
                kind: RejectionKind::NotFound,
            };
        }
        if let Some(max) = live_max {
            let live = self.live_count(&group.owner);
            if live >= max as usize {
                return MetaReply::Rejected {
                    reason: format!(
                        "owner: {} has {live} gang groups that have not ended, its most; release or cancel some first",
                        short(&group.owner)
                    ),
                    kind: RejectionKind::Exhausted,
                };
            }
        }
        for (i, gang) in group.gangs.iter().enumerate() {
            let name = gang_name(gang);
            if let Some(owner) = self.live_owner(&name) {
                return conflict(format!(
                    "gangs[{i}]: gang {} is already declared by gang group {owner}, which has not ended; release or cancel it first",
                    short(&name)
                ));
            }
        }
        if let Some((member, pod, owner)) = group
            .named_pods()
            .find_map(|(m, pod)| Some((m, pod.clone(), self.live_namer(&pod)?)))
        {
            return conflict(format!(
                "member {member}: pod {} is already named by gang group {owner}, which has not ended; release or cancel it first",
                short(&pod)
            ));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut group = group.clone();
        for gang in &mut group.gangs {
            gang.creation_order = seq;
            self.gang_owners.insert(gang_name(gang), seq);
        }
        for (_, pod) in group.named_pods() {
            self.named_pods.insert(pod, seq);
        }
        let deadline_ms = group
            .gangs
            .iter()
            .filter(|g| g.wait_time_ms > 0)
            .map(|g| at_ms.saturating_add(g.wait_time_ms))
            .min();
        let priority = group.gangs.iter().map(|g| g.priority).max().unwrap_or(0);
        let mut record = GroupRecord {
            seq,
            key: key.to_string(),
            group,
            state: GroupState::Queued,
            submitted_at_ms: at_ms,
            deadline_ms,
            attempts: 0,
            not_before_ms: at_ms,
            reason: String::new(),
            placements: MemberPlacements::default(),
            version: 0,
            priority,
            txn: None,
            releasing: MemberPlacements::default(),
            charge: Resources::zero(),
            parked_at_ms: None,
            placed_at_ms: None,
            preempted: None,
            chosen_pods: Default::default(),
        };
        record.bump(&mut self.last_version);
        if !record.group.owner.is_empty() {
            let owner = record.group.owner.clone();
            self.owned_groups().entry(owner).or_default().insert(seq);
        }
        self.groups.insert(seq, record);
        self.keys.insert(scoped, seq);
        self.forget_old_groups();
        MetaReply::Submitted {
            seq,
            created: true,
            summary: self.groups.get(&seq).map(|r| Box::new(GroupSummary::of(r))),
        }
    }

    pub(super) fn owned_groups(&mut self) -> &mut BTreeMap<String, BTreeSet<GroupSeq>> {
        let groups = &self.groups;
        self.owned.0.get_or_insert_with(|| {
            let mut owned: BTreeMap<String, BTreeSet<GroupSeq>> = BTreeMap::new();
            for g in groups.values() {
                if !g.group.owner.is_empty() && !g.state.is_terminal() {
                    owned
                        .entry(g.group.owner.clone())
                        .or_default()
                        .insert(g.seq);
                }
            }
            owned
        })
    }

    /// How many of `owner`'s groups have not ended (pruning those that have).
    pub(super) fn live_count(&mut self, owner: &str) -> usize {
        self.owned_groups();
        let groups = &self.groups;
        match self.owned.0.as_mut().and_then(|o| o.get_mut(owner)) {
            Some(seqs) => {
                seqs.retain(|s| groups.get(s).is_some_and(|g| !g.state.is_terminal()));
                seqs.len()
            }
            None => 0,
        }
    }

    /// The live group that declared gang `name`, if any.
    pub(super) fn live_owner(&self, name: &str) -> Option<GroupSeq> {
        let seq = self.gang_owners.get(name)?;
        self.groups
            .get(seq)
            .filter(|g| !g.state.is_terminal())
            .filter(|g| !(self.twins_of_placed_admitted && g.state == GroupState::Placed))
            .map(|g| g.seq)
    }

    /// The live group whose member named Kubernetes pod `pod` (`namespace/name`), if any.
    pub(super) fn live_namer(&self, pod: &str) -> Option<GroupSeq> {
        let seq = self.named_pods.get(pod)?;
        self.groups
            .get(seq)
            .filter(|g| !g.state.is_terminal())
            .map(|g| g.seq)
    }

    /// Records the pods chosen for members of `seq` that select theirs by labels.
    pub(super) fn choose_pods(&mut self, seq: GroupSeq, choices: &[(String, String)]) -> MetaReply {
        if choices.is_empty() || choices.len() > CHOICES_PER_COMMAND_MAX {
            return rejected(format!(
                "choices: between 1 and {CHOICES_PER_COMMAND_MAX}, not {}",
                choices.len()
            ));
        }
        let Some(g) = self.groups.get(&seq) else {
            return missing(seq);
        };
        if g.state.is_terminal() {
            return rejected(format!("gang group {seq} has ended ({})", g.state.name()));
        }
        let mut taken = BTreeSet::new();
        let mut chosen = Vec::with_capacity(choices.len());
        for (i, (member, pod)) in choices.iter().enumerate() {
            let at = crate::model::FieldPath::new("choices").index(i);
            let Ok(key) = MemberKey::try_from(member.clone()) else {
                return rejected(format!(
                    "{at}: {} is not namespace/gang/member",
                    short(member)
                ));
            };
            let selects = g
                .group
                .gangs
                .iter()
                .filter(|gang| gang.namespace == key.namespace && gang.name == key.gang)
                .flat_map(|gang| gang.members.iter())
                .any(|m| m.name == key.member && !m.pod_selector.is_empty());
            if !selects {
                return rejected(format!("{at}: {member} selects no pod by labels"));
            }
            if g.chosen_pods.contains_key(member) {
                return conflict(format!("{at}: {member} already stands for a pod"));
            }
            if let Err(e) = crate::model::names::validate_dns_subdomain(&at, pod) {
                return rejected(e.to_string());
            }
            let full = format!("{}/{pod}", key.namespace);
            // The index holds this group's own named pods too (it is live).
            if self.live_namer(&full).is_some() || !taken.insert(full.clone()) {
                return conflict(format!("{at}: pod {} is already taken", short(&full)));
            }
            chosen.push((member.clone(), full));
        }
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        for (member, pod) in chosen {
            self.named_pods.insert(pod.clone(), seq);
            g.chosen_pods.insert(member, pod);
        }
        g.bump(&mut self.last_version);
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    /// Records (or clears) why placed group `seq`'s named pods are not bound yet (cut
    /// to `MESSAGE_CHARS_MAX`).
    pub(super) fn note_binding(&mut self, seq: GroupSeq, reason: &str) -> MetaReply {
        let reason = crate::model::clip_to(reason, crate::model::MESSAGE_CHARS_MAX);
        self.note_reason(seq, GroupState::Placed, &reason)
    }

    /// Sets group `seq`'s reason, if it is in `state` (a change bumps its version).
    fn note_reason(&mut self, seq: GroupSeq, state: GroupState, reason: &str) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if g.state != state {
            return rejected(format!(
                "gang group {seq} is {}, not {}",
                g.state.name(),
                state.name()
            ));
        }
        if g.reason != reason {
            g.reason = reason.to_string();
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    /// Whether queue `name` exists and is kept by someone other than `by`.
    pub(super) fn kept_by_another(&self, name: &str, by: &str) -> bool {
        self.queues.spec(name).is_some_and(|q| q.managed_by != by)
    }

    pub(super) fn keeper_refusal(&self, name: &str) -> String {
        match self.queues.spec(name).map(|q| q.managed_by.as_str()) {
            Some("") | None => format!(
                "queue.name: queue {name} was made through the admin API; delete it there before an ElasticQuota can keep it"
            ),
            Some(by) => format!(
                "queue.name: queue {name} is kept by {by}; change or delete that object instead"
            ),
        }
    }

    /// How many groups of queue `name` have not ended.
    pub(super) fn live_groups_of(&self, name: &str) -> u64 {
        self.groups
            .values()
            .filter(|g| g.group.queue == name && !g.state.is_terminal())
            .count() as u64
    }

    /// Why group `seq`'s queue cannot take the charge of placing it now, if it cannot.
    pub(super) fn quota_refusal(&self, seq: GroupSeq) -> Option<String> {
        if self.quota_unchecked {
            return None;
        }
        let g = self.groups.get(&seq)?;
        if g.group.queue.is_empty() {
            return None;
        }
        self.queues.refusal(&g.group.queue, &g.charge_to_place())
    }

    /// What queued group `seq` may reclaim: placed groups of other queues, youngest
    /// first, each taken only while its queue keeps at least its `min` of every resource
    /// the min names (what the queue borrowed, and nothing of its guarantee). Refused
    /// unless `seq` is a queued group of a queue whose `min` covers it: its queue's usage
    /// plus its charge stays within `min` on every resource `min` names (a queue without
    /// a `min` reclaims nothing).
    pub fn reclaimable(&self, seq: GroupSeq) -> Result<Vec<GroupSeq>, String> {
        let g = self
            .groups
            .get(&seq)
            .ok_or_else(|| format!("seq: no gang group {seq}"))?;
        if g.state != GroupState::Queued || !g.holds_nothing() {
            return Err(format!(
                "seq: gang group {seq} is {} and holds {} members; only a queued group that holds nothing reclaims",
                g.state.name(),
                g.placements.len() + g.releasing.len()
            ));
        }
        let queue = self
            .queues
            .spec(&g.group.queue)
            .ok_or_else(|| format!("seq: gang group {seq} has no queue to reclaim for"))?;
        if queue.min.is_empty() {
            return Ok(Vec::new());
        }
        let after = self
            .queues
            .usage(&queue.name)
            .saturating_add(&g.charge_to_place());
        if let Some((resource, used, min)) = queue.min.first_exceeded(&after) {
            return Err(format!(
                "queue {}: {resource} would be {} of min {}; reclaim takes back only what min guarantees",
                queue.name,
                crate::model::queue::Amount(&resource, used),
                crate::model::queue::Amount(&resource, min)
            ));
        }
        let mut taken: BTreeMap<&str, Resources> = BTreeMap::new();
        let mut out = Vec::new();
        for v in self.groups.values().rev() {
            let other = !v.group.queue.is_empty() && v.group.queue != queue.name;
            if !other || v.state != GroupState::Placed || !v.releasing.is_empty() {
                continue;
            }
            let Some(vq) = self.queues.spec(&v.group.queue) else {
                continue;
            };
            let gone = taken
                .get(vq.name.as_str())
                .cloned()
                .unwrap_or_default()
                .saturating_add(&v.charge);
            let left = self.queues.usage(&vq.name).saturating_sub(&gone);
            // A guarantee is kept when the queue stays at its min, or loses none of it.
            let keeps_min = vq
                .min
                .iter()
                .all(|(r, min)| gone.get(&r) == 0 || left.get(&r) >= min);
            if keeps_min {
                taken.insert(vq.name.as_str(), gone);
                out.push(v.seq);
            }
        }
        Ok(out)
    }

    pub(super) fn note_waiting(&mut self, seq: GroupSeq, reason: &str) -> MetaReply {
        self.note_reason(seq, GroupState::Queued, reason)
    }

    pub(super) fn note_node_allocation(
        &mut self,
        member: &str,
        node: &str,
        allocation: &crate::model::node_allocation::NodeAllocation,
    ) -> MetaReply {
        use crate::model::node_allocation::ALLOCATIONS_PER_MEMBER_MAX;
        if let Err(e) = allocation.validate(&crate::model::FieldPath::new("allocation")) {
            return rejected(e.to_string());
        }
        let not_found = |why: String| MetaReply::Rejected {
            reason: why,
            kind: RejectionKind::NotFound,
        };
        let Some((gang, _)) = member.rsplit_once('/') else {
            return rejected(format!("member: {member:?} is not namespace/gang/member"));
        };
        let Some(seq) = self.gang_owners.get(gang).copied() else {
            return not_found(format!("member: no gang group holds gang {gang}"));
        };
        let Some(g) = self.groups.get_mut(&seq) else {
            return not_found(format!("member: no gang group holds gang {gang}"));
        };
        if let GroupState::Done { how } = g.state {
            return conflict(format!(
                "member: gang group {seq} of {member} has ended ({})",
                GroupState::Done { how }.name()
            ));
        }
        let Some(p) = g.placements.get_mut(member) else {
            return not_found(format!("member: {member} is not placed"));
        };
        if p.node != node {
            return conflict(format!(
                "node: member {member} is placed on node {}, not {node}",
                p.node
            ));
        }
        // The devices must be those gangway gave the member (a placement recovered
        // after a failover lists none here: the shard keeps them).
        if !p.devices.is_empty() {
            use crate::model::node_allocation::{device_name, driver_for};
            let driver = driver_for(&allocation.resource).unwrap_or_default();
            if let Some(stranger) = allocation.device_ids.iter().find(|id| {
                let name = device_name(id);
                !p.devices
                    .iter()
                    .any(|d| d.device.driver == driver && d.device.device == name)
            }) {
                return conflict(format!(
                    "allocation.device_ids: {stranger} is not among the {} devices gangway placed {member} on",
                    allocation.resource
                ));
            }
        }
        let kept = p.allocations.len();
        let changed = match p
            .allocations
            .iter_mut()
            .find(|a| a.resource == allocation.resource)
        {
            Some(same) if same == allocation => false,
            Some(other) => {
                *other = allocation.clone();
                true
            }
            None if kept >= ALLOCATIONS_PER_MEMBER_MAX => {
                return rejected(format!(
                    "allocation.resource: member {member} has allocations for {ALLOCATIONS_PER_MEMBER_MAX} resources, the most kept"
                ))
            }
            None => {
                p.allocations.push(allocation.clone());
                p.allocations.sort_by(|a, b| a.resource.cmp(&b.resource));
                true
            }
        };
        if changed {
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }
}
