//! Assignment: given every shard's placement plan for a gang group's members,
//! decide which shard reserves which members. Fewest shards first: one shard
//! that places every member wins outright; otherwise shards are taken in order
//! of how many members they place. The group is ready only if every gang
//! reaches its minMember. Network-attached devices (held on every shard) go with the
//! members taken: a plan's slot whose network devices another plan's slot already
//! took is not taken, since every shard would refuse the pair. A gang whose topology
//! confines its members to one domain (a required level, slices) takes its members from
//! one plan only: a shard's engine checks domains among its own nodes alone. Pure and
//! deterministic (ties by shard id).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::engine::{Diagnosis, GangPlacement, MemberLabels};
use crate::ledger::command::{HoldKind, NetworkHold};
use crate::ledger::ReserveMember;
use crate::model::device::DeviceId;
use crate::model::{Gang, GangGroup, MemberKey, PodBinding, PodSpec};

/// Which members each participant shard reserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Shard -> its members, in plan order.
    pub per_shard: BTreeMap<u32, Vec<ReserveMember>>,
    /// The members' network-attached devices, which every shard holds.
    pub network: Vec<NetworkHold>,
}

impl Assignment {
    /// The shards that take part: the members' and, when network-attached devices are
    /// held, every shard of `shards`.
    pub fn participants(&self, shards: u32) -> Vec<u32> {
        if self.network.is_empty() {
            self.per_shard.keys().copied().collect()
        } else {
            (1..=shards).collect()
        }
    }

    /// Members assigned, over every shard.
    pub fn members(&self) -> usize {
        self.per_shard.values().map(Vec::len).sum()
    }
}

/// The result of assigning a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignOutcome {
    /// Every gang reaches minMember.
    Ready(Assignment),
    /// Some gang cannot reach minMember now; why, and what does fit.
    Short {
        /// Why, for people.
        reason: String,
        /// The members that fit (a NonStrict group may hold them while it waits).
        partial: Assignment,
    },
}

/// Assigns `group`'s members to shards from their `plans`; members in
/// `placed_before` (earlier NonStrict rounds) count toward minMember.
pub fn assign(
    group: &GangGroup,
    plans: &BTreeMap<u32, GangPlacement>,
    placed_before: &BTreeSet<String>,
) -> AssignOutcome {
    let single = plans
        .iter()
        .find(|(_, p)| p.unplaced.is_empty() && !p.assignments.is_empty());
    let (mut per_shard, network) = match single {
        Some((shard, plan)) => (
            BTreeMap::from([(*shard, plan.assignments.clone())]),
            plan.network.clone(),
        ),
        None => merge(group, plans, placed_before),
    };
    stamp_uids(group, per_shard.values_mut().flatten());
    let placed: BTreeSet<&MemberKey> = per_shard.values().flatten().map(|m| &m.member).collect();
    for gang in &group.gangs {
        let count = gang
            .members
            .iter()
            .map(|m| gang.member_key(m))
            .filter(|k| placed.contains(k) || placed_before.contains(&k.to_string()))
            .count() as u32;
        if count < gang.min_member {
            let why = template_diagnoses(gang, plans, &placed, placed_before);
            let reason = format!(
                "gang {}/{}: {count} of minMember {} members fit{why}",
                gang.namespace, gang.name, gang.min_member
            );
            return AssignOutcome::Short {
                reason,
                partial: Assignment { per_shard, network },
            };
        }
    }
    AssignOutcome::Ready(Assignment { per_shard, network })
}

/// A waiting template: its spec, the spec without labels, the gang it is confined to
/// (a gang whose topology confines its members takes slots planned for it only), and
/// its members not assigned yet.
type WaitingTemplate<'a> = (
    &'a PodSpec,
    PodSpec,
    Option<(String, String)>,
    VecDeque<MemberKey>,
);

/// Members not assigned yet, by spec (a template), each with its spec without labels.
struct Waiting<'a> {
    templates: Vec<WaitingTemplate<'a>>,
}

impl<'a> Waiting<'a> {
    fn push(&mut self, spec: &'a PodSpec, key: MemberKey, confined: Option<(String, String)>) {
        match self
            .templates
            .iter_mut()
            .find(|(s, _, c, _)| *s == spec && *c == confined)
        {
            Some((_, _, _, queue)) => queue.push_back(key),
            None => {
                let unlabelled = PodSpec {
                    labels: BTreeMap::new(),
                    ..spec.clone()
                };
                self.templates
                    .push((spec, unlabelled, confined, VecDeque::from([key])));
            }
        }
    }

    /// The next member for a slot planned for a member of `spec` (of the gang
    /// `confined`, if its topology confines it): one of the same spec, else, where the
    /// plan read no labels, one whose spec differs only in labels.
    fn take(
        &mut self,
        spec: &PodSpec,
        labels: MemberLabels,
        confined: &Option<(String, String)>,
    ) -> Option<(MemberKey, &'a PodSpec)> {
        if let Some((s, _, _, queue)) = self
            .templates
            .iter_mut()
            .find(|(s, _, c, queue)| *s == spec && c == confined && !queue.is_empty())
        {
            return queue.pop_front().map(|k| (k, *s));
        }
        if labels == MemberLabels::Read {
            return None;
        }
        let (s, _, _, queue) = self
            .templates
            .iter_mut()
            .find(|(_, unlabelled, c, queue)| {
                c == confined && !queue.is_empty() && same_but_labels(spec, unlabelled)
            })?;
        queue.pop_front().map(|k| (k, *s))
    }
}

/// For each gang whose topology confines its members to single domains (a required
/// level, slices), the one shard whose plan takes them: a domain is checked by one
/// shard's engine only, so its members never come from two plans. The plan that places
/// most of the gang's members (all, if one does), ties to the lowest shard.
fn confining_shards(
    group: &GangGroup,
    plans: &BTreeMap<u32, GangPlacement>,
) -> BTreeMap<(String, String), u32> {
    let mut out = BTreeMap::new();
    for gang in group.gangs.iter().filter(|g| g.topology.confines()) {
        let best = plans
            .iter()
            .map(|(shard, plan)| {
                let placed = plan
                    .assignments
                    .iter()
                    .filter(|a| a.member.namespace == gang.namespace && a.member.gang == gang.name)
                    .count();
                (placed, std::cmp::Reverse(*shard))
            })
            .max();
        if let Some((_, std::cmp::Reverse(shard))) = best {
            out.insert((gang.namespace.clone(), gang.name.clone()), shard);
        }
    }
    out
}

/// Whether `spec` equals `unlabelled` (a spec with its labels cleared) but for labels.
fn same_but_labels(spec: &PodSpec, unlabelled: &PodSpec) -> bool {
    let PodSpec {
        requests,
        node_selector,
        node_affinity,
        pod_affinity,
        pod_anti_affinity,
        tolerations,
        host_ports,
        priority,
        labels: _,
        claims,
        preemption_policy,
        shares,
    } = spec;
    *requests == unlabelled.requests
        && *node_selector == unlabelled.node_selector
        && *node_affinity == unlabelled.node_affinity
        && *pod_affinity == unlabelled.pod_affinity
        && *pod_anti_affinity == unlabelled.pod_anti_affinity
        && *tolerations == unlabelled.tolerations
        && *host_ports == unlabelled.host_ports
        && *priority == unlabelled.priority
        && *claims == unlabelled.claims
        && *preemption_policy == unlabelled.preemption_policy
        && *shares == unlabelled.shares
}

/// Combines partial plans, shards that place most first. Members with the
/// same spec are interchangeable, and every shard planned the whole group, so
/// each planned slot goes to the next unassigned member of its template; where a
/// shard's plan read no labels, to one whose spec differs only in labels (every
/// shard plans the first members that fit, so without this, pods that differ in a
/// label, as an Indexed Job's do, collide on the same members and a gang spread over
/// shards never reaches minMember), the slot then carrying that member's labels.
fn merge(
    group: &GangGroup,
    plans: &BTreeMap<u32, GangPlacement>,
    placed_before: &BTreeSet<String>,
) -> (BTreeMap<u32, Vec<ReserveMember>>, Vec<NetworkHold>) {
    let mut spec_of: BTreeMap<MemberKey, &PodSpec> = BTreeMap::new();
    let mut waiting = Waiting {
        templates: Vec::new(),
    };
    let confining = confining_shards(group, plans);
    let confined_of = |key: &MemberKey| {
        let gang = (key.namespace.clone(), key.gang.clone());
        confining.contains_key(&gang).then_some(gang)
    };
    for gang in &group.gangs {
        for m in &gang.members {
            let key = gang.member_key(m);
            spec_of.insert(key.clone(), &m.spec);
            if placed_before.contains(&key.to_string()) {
                continue;
            }
            let confined = confined_of(&key);
            waiting.push(&m.spec, key, confined);
        }
    }
    let mut order: Vec<(&u32, &GangPlacement)> = plans.iter().collect();
    order.sort_by_key(|(shard, p)| (std::cmp::Reverse(p.assignments.len()), **shard));
    let mut per_shard = BTreeMap::new();
    let mut network = Vec::new();
    let mut taken_devices: BTreeSet<&DeviceId> = BTreeSet::new();
    for (shard, plan) in order {
        let mut holds: BTreeMap<&MemberKey, Vec<&NetworkHold>> = BTreeMap::new();
        for h in &plan.network {
            holds.entry(&h.member).or_default().push(h);
        }
        let none = Vec::new();
        let holds_of = |member: &MemberKey| holds.get(member).unwrap_or(&none);
        // Shared claims a slot carries: on its node, or under a network hold.
        let carries = |slot: &ReserveMember, claim: &str| {
            slot.pod.carries(claim)
                || holds_of(&slot.member)
                    .iter()
                    .any(|h| h.kind() == HoldKind::Carry(claim))
        };
        // Carriers of shared claims first: a follower slot is taken only where the
        // claim's carrier in this plan was taken too (or the plan has none: the claim
        // is carried on the shard already), or the shard would refuse it. Passes repeat
        // while they take something, for carriers that follow another claim themselves.
        let mut mine: Vec<(usize, ReserveMember)> = Vec::new();
        let mut carried: BTreeSet<&str> = BTreeSet::new();
        let mut pending: Vec<usize> = (0..plan.assignments.len()).collect();
        loop {
            let before = mine.len();
            let mut left = Vec::new();
            for i in pending {
                let slot = &plan.assignments[i];
                let orphan = slot.pod.followed().any(|f| {
                    !carried.contains(f.claim.as_str())
                        && !carries(slot, &f.claim)
                        && plan.assignments.iter().any(|o| carries(o, &f.claim))
                });
                if orphan {
                    left.push(i);
                    continue;
                }
                let hold = holds_of(&slot.member);
                let taken =
                    |h: &&&NetworkHold| h.devices.iter().any(|a| taken_devices.contains(&a.device));
                if hold.iter().any(|h| taken(&h)) {
                    continue;
                }
                let Some(spec) = spec_of.get(&slot.member) else {
                    continue;
                };
                let confined = confined_of(&slot.member);
                if let Some(gang) = &confined {
                    if confining.get(gang) != Some(shard) {
                        continue;
                    }
                }
                if let Some((member, member_spec)) =
                    waiting.take(spec, plan.member_labels, &confined)
                {
                    let mut pod = slot.pod.clone();
                    if member_spec.labels != spec.labels {
                        pod.labels = member_spec.labels.clone();
                    }
                    carried.extend(
                        slot.pod
                            .shares
                            .iter()
                            .filter_map(|s| carries(slot, &s.claim).then_some(s.claim.as_str())),
                    );
                    for h in hold {
                        taken_devices.extend(h.devices.iter().map(|a| &a.device));
                        network.push(NetworkHold {
                            member: member.clone(),
                            devices: h.devices.clone(),
                            claim: h.claim.clone(),
                        });
                    }
                    mine.push((
                        i,
                        ReserveMember {
                            member,
                            node: slot.node.clone(),
                            pod,
                        },
                    ));
                }
            }
            pending = left;
            if pending.is_empty() || mine.len() == before {
                break;
            }
        }
        mine.sort_by_key(|(i, _)| *i);
        if !mine.is_empty() {
            per_shard.insert(*shard, mine.into_iter().map(|(_, m)| m).collect());
        }
    }
    network.sort_by(|a, b| (&a.member, &a.claim).cmp(&(&b.member, &b.claim)));
    (per_shard, network)
}

/// Gives each reserved member its pod's uid, or says that it names its pod (plans are
/// made per spec, without either), so the shard that commits it can bind it through
/// the Kubernetes API.
pub fn stamp_uids<'a>(group: &GangGroup, members: impl IntoIterator<Item = &'a mut ReserveMember>) {
    let pod_of: BTreeMap<MemberKey, (&Option<String>, PodBinding)> = group
        .gangs
        .iter()
        .flat_map(|g| {
            g.members
                .iter()
                .filter(|m| m.uid.is_some() || m.binding == PodBinding::Named)
                .map(|m| (g.member_key(m), (&m.uid, m.binding)))
        })
        .collect();
    for member in members {
        let (uid, binding) = pod_of
            .get(&member.member)
            .map_or((None, PodBinding::Unnamed), |(u, b)| ((*u).clone(), *b));
        member.pod.uid = uid;
        member.pod.binding = binding;
    }
}

/// Why the members of `gang` that found no node found none, per template (members
/// with one spec, named by the first one's name without its `-N` suffix) with members
/// the assignment left without a node, adding up what the nodes of every shard that
/// left one of them unplaced said: one "; TEMPLATE (N members, K without a node):
/// 0/M nodes are available: …" part per such template.
fn template_diagnoses(
    gang: &Gang,
    plans: &BTreeMap<u32, GangPlacement>,
    placed: &BTreeSet<&MemberKey>,
    placed_before: &BTreeSet<String>,
) -> String {
    let mut templates: Vec<(&PodSpec, Vec<MemberKey>)> = Vec::new();
    for m in &gang.members {
        let key = gang.member_key(m);
        match templates.iter_mut().find(|(spec, _)| **spec == m.spec) {
            Some((_, keys)) => keys.push(key),
            None => templates.push((&m.spec, vec![key])),
        }
    }
    let mut out = String::new();
    for (_, keys) in &templates {
        let unplaced = keys
            .iter()
            .filter(|k| !placed.contains(k) && !placed_before.contains(&k.to_string()))
            .count();
        if unplaced == 0 {
            continue;
        }
        let mut merged = Diagnosis::default();
        for plan in plans.values() {
            if let Some(first) = plan.unplaced.iter().find(|u| keys.contains(&u.member)) {
                merged.nodes += first.diagnosis.nodes;
                for (reason, count) in &first.diagnosis.reasons {
                    merged.record_many(reason.clone(), *count);
                }
            }
        }
        let label = template_label(&keys[0].member);
        let members = if keys.len() == 1 { "member" } else { "members" };
        out.push_str(&format!(
            "; {label} ({} {members}, {unplaced} without a node): {merged}",
            keys.len()
        ));
    }
    out
}

/// A template's name: its first member's name without a trailing `-N`.
fn template_label(member: &str) -> &str {
    match member.rsplit_once('-') {
        Some((stem, n)) if !stem.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => stem,
        _ => member,
    }
}

#[cfg(test)]
#[path = "assign_tests.rs"]
mod tests;
