//! Assignment: given every shard's placement plan for a gang group's members,
//! decide which shard reserves which members. Fewest shards first: one shard
//! that places every member wins outright; otherwise shards are taken in order
//! of how many members they place. The group is ready only if every gang
//! reaches its minMember. Network-attached devices (held on every shard) go with the
//! members taken: a plan's slot whose network devices another plan's slot already
//! took is not taken, since every shard would refuse the pair. Pure and deterministic
//! (ties by shard id).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::engine::{Diagnosis, GangPlacement};
use crate::ledger::command::{HoldKind, NetworkHold};
use crate::ledger::ReserveMember;
use crate::model::device::DeviceId;
use crate::model::{Gang, GangGroup, MemberKey, PodSpec};

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

/// Combines partial plans, shards that place most first. Members with the
/// same spec are interchangeable, and every shard planned the whole group, so
/// each planned slot goes to the next unassigned member of its template.
fn merge(
    group: &GangGroup,
    plans: &BTreeMap<u32, GangPlacement>,
    placed_before: &BTreeSet<String>,
) -> (BTreeMap<u32, Vec<ReserveMember>>, Vec<NetworkHold>) {
    let mut spec_of: BTreeMap<MemberKey, &PodSpec> = BTreeMap::new();
    let mut waiting: Vec<(&PodSpec, VecDeque<MemberKey>)> = Vec::new();
    for gang in &group.gangs {
        for m in &gang.members {
            let key = gang.member_key(m);
            spec_of.insert(key.clone(), &m.spec);
            if placed_before.contains(&key.to_string()) {
                continue;
            }
            match waiting.iter_mut().find(|(spec, _)| **spec == m.spec) {
                Some((_, queue)) => queue.push_back(key),
                None => waiting.push((&m.spec, VecDeque::from([key]))),
            }
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
                let Some((_, queue)) = waiting.iter_mut().find(|(s, _)| *s == *spec) else {
                    continue;
                };
                if let Some(member) = queue.pop_front() {
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
                            pod: slot.pod.clone(),
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

/// Gives each reserved member its pod's uid (plans are made per spec, without it),
/// so the shard that commits it can bind it through the Kubernetes API.
pub fn stamp_uids<'a>(group: &GangGroup, members: impl IntoIterator<Item = &'a mut ReserveMember>) {
    let uid_of: BTreeMap<MemberKey, &String> = group
        .gangs
        .iter()
        .flat_map(|g| {
            g.members
                .iter()
                .filter_map(|m| Some((g.member_key(m), m.uid.as_ref()?)))
        })
        .collect();
    for member in members {
        member.pod.uid = uid_of.get(&member.member).map(|u| (*u).clone());
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
mod tests {
    use super::*;
    use crate::engine::Unplaced;
    use crate::model::{Gang, GangMode, PodSummary};

    fn group(members: u32, min: u32) -> GangGroup {
        let gang = Gang {
            creation_order: 1,
            ..Gang::with_members("ns", "g", members, min, GangMode::Strict)
        };
        GangGroup {
            queue: String::new(),
            id: "x".into(),
            gangs: vec![gang],
            ..Default::default()
        }
    }

    fn key(i: u32) -> MemberKey {
        MemberKey::new("ns", "g", format!("m{i}"))
    }

    fn plan(placed: &[u32], unplaced: &[u32]) -> GangPlacement {
        GangPlacement {
            assignments: placed
                .iter()
                .map(|i| ReserveMember {
                    member: key(*i),
                    node: format!("n{i}"),
                    pod: PodSummary::default(),
                })
                .collect(),
            unplaced: unplaced
                .iter()
                .map(|i| Unplaced {
                    member: key(*i),
                    diagnosis: Diagnosis::default(),
                })
                .collect(),
            domain: None,
            network: Vec::new(),
        }
    }

    #[test]
    fn followers_of_a_shared_claim_are_taken_only_beside_the_carrier_taken() {
        use crate::model::claim::{AdminAccess, ClaimShare, DeviceAllocation, PodClaim};
        use crate::model::DeviceId;
        let share = ClaimShare {
            pod_claim: "gpu".into(),
            claim: "ns/channel".into(),
        };
        let mut g = group(3, 3);
        let follower_spec = PodSpec {
            shares: vec![share.clone()],
            ..PodSpec::default()
        };
        g.gangs[0].members[0].spec = PodSpec {
            claims: vec![PodClaim {
                name: "gpu".into(),
                requests: vec![],
                constraints: vec![],
                config: vec![],
            }],
            ..follower_spec.clone()
        };
        g.gangs[0].members[1].spec = follower_spec.clone();
        g.gangs[0].members[2].spec = follower_spec;
        // Each shard's one node takes the carrier and one follower.
        let shard_plan = |node: &str| {
            let follower = PodSummary {
                shares: vec![share.clone()],
                ..PodSummary::default()
            };
            let carrier = PodSummary {
                devices: vec![DeviceAllocation {
                    claim: "gpu".into(),
                    request: "gpu".into(),
                    device: DeviceId::new("gpu.example.com", node, "gpu-0"),
                    admin_access: AdminAccess::Disabled,
                    tolerations: vec![],
                    share_id: None,
                    consumed_capacity: BTreeMap::new(),
                }],
                ..follower.clone()
            };
            let slot = |i: u32, pod: PodSummary| ReserveMember {
                member: key(i),
                node: node.to_string(),
                pod,
            };
            GangPlacement {
                assignments: vec![slot(0, carrier), slot(1, follower)],
                unplaced: vec![Unplaced {
                    member: key(2),
                    diagnosis: Diagnosis::default(),
                }],
                domain: None,
                network: Vec::new(),
            }
        };
        let plans = BTreeMap::from([(1, shard_plan("a")), (2, shard_plan("b"))]);
        // Shard 2's follower slot follows shard 2's carrier, which is not taken: the
        // group is short, not ready with a follower its shard would refuse.
        let AssignOutcome::Short { partial, .. } = assign(&g, &plans, &BTreeSet::new()) else {
            panic!("short")
        };
        let taken: Vec<(u32, String)> = partial
            .per_shard
            .iter()
            .flat_map(|(s, ms)| ms.iter().map(move |m| (*s, m.member.member.clone())))
            .collect();
        assert_eq!(taken, vec![(1, "m0".to_string()), (1, "m1".to_string())]);
    }

    #[test]
    fn a_chain_of_shared_claims_is_taken_whole_from_one_plan() {
        use crate::model::claim::{AdminAccess, ClaimShare, DeviceAllocation, PodClaim};
        use crate::model::DeviceId;
        let share = |pod_claim: &str, claim: &str| ClaimShare {
            pod_claim: pod_claim.into(),
            claim: claim.into(),
        };
        let pod_claim = |name: &str| PodClaim {
            name: name.into(),
            requests: vec![],
            constraints: vec![],
            config: vec![],
        };
        let device = |pod_claim: &str, d: &str| DeviceAllocation {
            claim: pod_claim.into(),
            request: "gpu".into(),
            device: DeviceId::new("gpu.example.com", "a", d),
            admin_access: AdminAccess::Disabled,
            tolerations: vec![],
            share_id: None,
            consumed_capacity: BTreeMap::new(),
        };
        // m0 carries x; m1 follows x and carries y; m2 follows y; m3 shares nothing.
        let shares: [Vec<ClaimShare>; 4] = [
            vec![share("x", "ns/x")],
            vec![share("x", "ns/x"), share("y", "ns/y")],
            vec![share("y", "ns/y")],
            vec![],
        ];
        let claims = [vec![pod_claim("x")], vec![pod_claim("y")], vec![], vec![]];
        let devices = [
            vec![device("x", "gpu-0")],
            vec![device("y", "gpu-1")],
            vec![],
            vec![],
        ];
        let mut g = group(4, 4);
        for (i, m) in g.gangs[0].members.iter_mut().enumerate() {
            m.spec = PodSpec {
                claims: claims[i].clone(),
                shares: shares[i].clone(),
                ..PodSpec::default()
            };
        }
        let slot = |i: usize, node: &str| ReserveMember {
            member: key(i as u32),
            node: node.to_string(),
            pod: PodSummary {
                shares: shares[i].clone(),
                devices: devices[i].clone(),
                ..PodSummary::default()
            },
        };
        let unplaced = |i: u32| Unplaced {
            member: key(i),
            diagnosis: Diagnosis::default(),
        };
        // Shard 1 places the chain, followers listed first; shard 2 the plain member.
        let plans = BTreeMap::from([
            (
                1,
                GangPlacement {
                    assignments: vec![slot(2, "a"), slot(1, "a"), slot(0, "a")],
                    unplaced: vec![unplaced(3)],
                    domain: None,
                    network: Vec::new(),
                },
            ),
            (
                2,
                GangPlacement {
                    assignments: vec![slot(3, "b")],
                    unplaced: vec![unplaced(0), unplaced(1), unplaced(2)],
                    domain: None,
                    network: Vec::new(),
                },
            ),
        ]);
        let AssignOutcome::Ready(a) = assign(&g, &plans, &BTreeSet::new()) else {
            panic!("ready")
        };
        let on_one: Vec<String> = a.per_shard[&1]
            .iter()
            .map(|m| m.member.member.clone())
            .collect();
        assert_eq!(on_one, vec!["m2", "m1", "m0"], "plan order kept");
    }

    /// Plans of shards 1 and 2, each placing member `m0` with network device `d{n}`.
    fn network_plans(d1: u32, d2: u32) -> BTreeMap<u32, GangPlacement> {
        use crate::model::claim::{AdminAccess, DeviceAllocation};
        let with_device = |d: u32| {
            let mut p = plan(&[0], &[1]);
            p.network = vec![NetworkHold {
                claim: None,
                member: key(0),
                devices: vec![DeviceAllocation {
                    claim: "c".into(),
                    request: "r".into(),
                    device: DeviceId::new("fabric.example.com", "fabric", format!("d{d}")),
                    admin_access: AdminAccess::Disabled,
                    tolerations: vec![],
                    share_id: None,
                    consumed_capacity: BTreeMap::new(),
                }],
            }];
            p
        };
        BTreeMap::from([(1, with_device(d1)), (2, with_device(d2))])
    }

    #[test]
    fn network_devices_go_with_the_members_taken_and_are_never_taken_twice() {
        let g = group(2, 2);
        let AssignOutcome::Ready(a) = assign(&g, &network_plans(0, 1), &BTreeSet::new()) else {
            panic!("ready")
        };
        // Shard 2's slot went to the next member waiting, m1: so did its hold.
        let holds: Vec<(String, String)> = a
            .network
            .iter()
            .map(|h| (h.member.member.clone(), h.devices[0].device.device.clone()))
            .collect();
        assert_eq!(
            holds,
            [("m0".into(), "d0".into()), ("m1".into(), "d1".into())]
        );
        assert_eq!(
            a.participants(4),
            vec![1, 2, 3, 4],
            "every shard holds them"
        );
        // Both plans chose d0: only one slot can have it, so the group is short.
        let AssignOutcome::Short { partial, .. } =
            assign(&g, &network_plans(0, 0), &BTreeSet::new())
        else {
            panic!("short")
        };
        assert_eq!(partial.members(), 1);
        assert_eq!(partial.network.len(), 1);
    }

    #[test]
    fn one_shard_that_fits_everything_wins() {
        let plans = BTreeMap::from([(1, plan(&[0, 1], &[2, 3])), (2, plan(&[0, 1, 2, 3], &[]))]);
        let AssignOutcome::Ready(a) = assign(&group(4, 4), &plans, &BTreeSet::new()) else {
            panic!("ready")
        };
        assert_eq!(a.per_shard.keys().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn members_spread_over_the_fewest_shards_without_duplicates() {
        // Every shard planned the first members of the template; the merge hands
        // each planned slot to the next member still waiting.
        let plans = BTreeMap::from([
            (1, plan(&[0, 1], &[2, 3, 4, 5])),
            (2, plan(&[0, 1, 2, 3], &[4, 5])),
            (3, plan(&[0], &[1, 2, 3, 4, 5])),
        ]);
        let AssignOutcome::Ready(a) = assign(&group(6, 6), &plans, &BTreeSet::new()) else {
            panic!("ready")
        };
        assert_eq!(a.per_shard.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(
            a.per_shard[&2].len(),
            4,
            "the shard placing most goes first"
        );
        let all: Vec<_> = a
            .per_shard
            .values()
            .flatten()
            .map(|m| m.member.clone())
            .collect();
        let unique: BTreeSet<_> = all.iter().cloned().collect();
        assert_eq!(all.len(), unique.len());
    }

    #[test]
    fn short_of_min_member_is_not_ready() {
        let plans = BTreeMap::from([(1, plan(&[0], &[1, 2])), (2, plan(&[0], &[1, 2]))]);
        assert!(
            matches!(
                assign(&group(3, 2), &plans, &BTreeSet::new()),
                AssignOutcome::Ready(_)
            ),
            "two shards hold one member each"
        );
        assert!(
            matches!(assign(&group(3, 3), &plans, &BTreeSet::new()), AssignOutcome::Short { reason, .. } if reason.contains("2 of minMember 3"))
        );
    }

    #[test]
    fn a_short_gang_says_why_per_template_over_every_shard() {
        use crate::engine::FilterReason;
        use crate::model::resources::ResourceName;
        let mut g = group(3, 3);
        let gang = &mut g.gangs[0];
        gang.members[0].name = "worker-0".into();
        gang.members[1].name = "worker-1".into();
        gang.members[2].name = "ps".into();
        gang.members[2]
            .spec
            .node_selector
            .insert("zone".into(), "a".into());
        let keys: Vec<MemberKey> = gang.members.iter().map(|m| gang.member_key(m)).collect();
        let diagnosis = |nodes: u64, reason: FilterReason| {
            let mut d = Diagnosis {
                nodes,
                ..Diagnosis::default()
            };
            d.record_many(reason, nodes);
            d
        };
        let gpu = || FilterReason::Insufficient(ResourceName::from_name("nvidia.com/gpu"));
        let shard_plan = |nodes: u64, ps_placed: bool| GangPlacement {
            assignments: if ps_placed {
                vec![ReserveMember {
                    member: keys[2].clone(),
                    node: "n1".into(),
                    pod: PodSummary::default(),
                }]
            } else {
                Vec::new()
            },
            unplaced: keys[..2]
                .iter()
                .map(|k| Unplaced {
                    member: k.clone(),
                    diagnosis: diagnosis(nodes, gpu()),
                })
                .chain((!ps_placed).then(|| Unplaced {
                    member: keys[2].clone(),
                    diagnosis: diagnosis(nodes, FilterReason::NodeAffinityMismatch),
                }))
                .collect(),
            domain: None,
            network: Vec::new(),
        };
        let plans = BTreeMap::from([(1, shard_plan(100, true)), (2, shard_plan(60, false))]);
        let AssignOutcome::Short { reason, .. } = assign(&g, &plans, &BTreeSet::new()) else {
            panic!("the gang cannot reach minMember");
        };
        let parts: Vec<&str> = reason.split("; ").collect();
        assert_eq!(
            parts[0], "gang ns/g: 1 of minMember 3 members fit",
            "{reason}"
        );
        assert!(
            parts[1].starts_with(
                "worker (2 members, 2 without a node): 0/160 nodes are available: 160 Insufficient"
            ),
            "{reason}"
        );
        assert_eq!(
            parts.len(),
            2,
            "ps was placed (on shard 1): no part for it: {reason}"
        );
        assert_eq!(template_label("worker-12"), "worker");
        assert_eq!(template_label("ps"), "ps");
        assert_eq!(template_label("a-b"), "a-b");
    }
}
