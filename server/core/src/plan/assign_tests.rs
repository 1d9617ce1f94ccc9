//! Unit tests of `assign.rs`.

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
        member_labels: MemberLabels::Read,
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
            member_labels: MemberLabels::Read,
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
                member_labels: MemberLabels::Read,
            },
        ),
        (
            2,
            GangPlacement {
                assignments: vec![slot(3, "b")],
                unplaced: vec![unplaced(0), unplaced(1), unplaced(2)],
                domain: None,
                network: Vec::new(),
                member_labels: MemberLabels::Read,
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
    let AssignOutcome::Short { partial, .. } = assign(&g, &network_plans(0, 0), &BTreeSet::new())
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
        member_labels: MemberLabels::Read,
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

/// A gang of `n` members whose pods differ only in one label (an Indexed Job's
/// completion index).
fn indexed_group(n: u32) -> GangGroup {
    let mut g = group(n, n);
    for (i, m) in g.gangs[0].members.iter_mut().enumerate() {
        m.spec.labels.insert(
            "batch.kubernetes.io/job-completion-index".into(),
            i.to_string(),
        );
    }
    g
}

#[test]
fn pods_differing_only_in_labels_fill_every_shards_slots_where_no_filter_read_labels() {
    let group = indexed_group(4);
    let labelled = |p: GangPlacement, labels: MemberLabels| GangPlacement {
        member_labels: labels,
        assignments: p
            .assignments
            .into_iter()
            .map(|mut m| {
                let i: usize = m
                    .member
                    .member
                    .trim_start_matches('m')
                    .parse()
                    .expect("index");
                m.pod.labels = group.gangs[0].members[i].spec.labels.clone();
                m
            })
            .collect(),
        ..p
    };
    // Two shards of two nodes: each planned the first two members.
    let plans = |labels| {
        BTreeMap::from([
            (1, labelled(plan(&[0, 1], &[2, 3]), labels)),
            (2, labelled(plan(&[0, 1], &[2, 3]), labels)),
        ])
    };
    let AssignOutcome::Ready(a) = assign(&group, &plans(MemberLabels::Unread), &BTreeSet::new())
    else {
        panic!("four slots over two shards hold four interchangeable members")
    };
    let mut seen = BTreeSet::new();
    for m in a.per_shard.values().flatten() {
        let i: usize = m
            .member
            .member
            .trim_start_matches('m')
            .parse()
            .expect("index");
        assert_eq!(
            m.pod.labels, group.gangs[0].members[i].spec.labels,
            "a slot given to another member carries that member's labels"
        );
        assert!(seen.insert(m.member.clone()), "{} twice", m.member);
    }
    assert_eq!(seen.len(), 4);
    // Where a filter may have read them, a slot stays with its own member.
    assert!(matches!(
        assign(&group, &plans(MemberLabels::Read), &BTreeSet::new()),
        AssignOutcome::Short { .. }
    ));
}

#[test]
fn members_differing_in_more_than_labels_never_swap() {
    let mut group = indexed_group(4);
    for m in &mut group.gangs[0].members[2..] {
        m.spec.priority = 5;
    }
    let unread = |p: GangPlacement| GangPlacement {
        member_labels: MemberLabels::Unread,
        ..p
    };
    let plans = BTreeMap::from([
        (1, unread(plan(&[0, 1], &[2, 3]))),
        (2, unread(plan(&[0, 1], &[2, 3]))),
    ]);
    assert!(matches!(
        assign(&group, &plans, &BTreeSet::new()),
        AssignOutcome::Short { .. }
    ));
}
