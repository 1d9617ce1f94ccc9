//! Engine tests across modules: gang placement, quotes, preemption, nominations.
//!
//! Fixtures are real ledgers built through commands, so the engine is exercised exactly
//! on what a shard leader would give it.

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::cluster::{Cluster, Nomination};
use crate::engine::filter::{filter_node, Candidate, FilterReason};
use crate::engine::interpod::{Counted, InterPodState};
use crate::engine::placement::{
    place_gang, place_group, place_members, quote, quote_many, MemberRef, Placer,
};
use crate::engine::preemption::{preempt, PreemptionOutcome, Victim};
use crate::engine::profile::{PluginWeight, Profile, ScorePlugin};
use crate::engine::score::{score_nodes, ScoreInput};
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReserveMember, TxnId};
use crate::ledger::shard::ShardLedger;
use crate::model::gang::{Gang, GangGroup, GangMode, Member, MemberKey};
use crate::model::node::{Node, Taint, TaintEffect, LABEL_HOSTNAME, LABEL_ZONE};
use crate::model::pod::{
    footprint_of, HostPort, LabelSelector, NodeSelectorOperator, NodeSelectorRequirement,
    NodeSelectorTerm, PodAffinityTerm, PodSpec, PodSummary, PreferredSchedulingTerm, Protocol,
};
use crate::model::resources::{ResourceName, Resources};

fn node(name: &str, zone: &str, cpu_milli: u64) -> Node {
    let mut n = crate::fixtures::node_with(name, cpu_milli, 64 << 30, 110);
    n.labels.insert(LABEL_HOSTNAME.into(), name.into());
    n.labels.insert(LABEL_ZONE.into(), zone.into());
    n
}

struct Fixture {
    ledger: ShardLedger,
    txn: u64,
}

impl Fixture {
    fn new(nodes: &[Node]) -> Self {
        let mut f = Self {
            ledger: ShardLedger::new(),
            txn: 0,
        };
        for n in nodes {
            f.apply(LedgerOp::RegisterNode { node: n.clone() });
        }
        f
    }

    fn apply(&mut self, op: LedgerOp) -> LedgerReply {
        self.ledger.apply(&LedgerCommand::new(1, op))
    }

    /// Commits pods of one gang on the given nodes.
    fn place(&mut self, gang: &str, pods: &[(&str, &str, PodSummary)]) {
        self.txn += 1;
        let members = pods
            .iter()
            .map(|(member, node, pod)| ReserveMember {
                member: MemberKey::new("ns", gang, *member),
                node: node.to_string(),
                pod: pod.clone(),
            })
            .collect();
        let reply = self.apply(LedgerOp::ReserveAndCommit {
            txn_id: TxnId(self.txn),
            members,
            network: Vec::new(),
        });
        assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
    }

    /// Reserves (without committing) one pod.
    fn reserve(&mut self, gang: &str, node: &str, pod: PodSummary) {
        self.txn += 1;
        let reply = self.apply(LedgerOp::Reserve {
            txn_id: TxnId(self.txn),
            members: vec![ReserveMember {
                member: MemberKey::new("ns", gang, "0"),
                node: node.into(),
                pod,
            }],
            deadline_ms: 1000,
            network: Vec::new(),
        });
        assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    }
}

fn cpu_spec(cpu_milli: u64) -> PodSpec {
    PodSpec {
        requests: Resources {
            cpu_milli,
            ..Resources::zero()
        },
        ..PodSpec::default()
    }
}

fn summary(cpu_milli: u64, priority: i32) -> PodSummary {
    PodSummary {
        requests: Resources {
            cpu_milli,
            ..Resources::zero()
        },
        priority,
        ..PodSummary::default()
    }
}

fn gang(name: &str, specs: &[PodSpec]) -> Gang {
    let n = specs.len() as u32;
    Gang {
        name: name.into(),
        namespace: "ns".into(),
        min_member: n,
        total_number: n,
        mode: GangMode::Strict,
        wait_time_ms: 1000,
        priority: 0,
        creation_order: 0,
        members: specs
            .iter()
            .enumerate()
            .map(|(i, spec)| Member {
                name: format!("m-{i}"),
                spec: spec.clone(),
                uid: None,
                binding: Default::default(),
                pod_selector: Default::default(),
            })
            .collect(),
        topology: Default::default(),
    }
}

fn nodes_of(placement: &crate::engine::placement::GangPlacement) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for a in &placement.assignments {
        *out.entry(a.node.clone()).or_insert(0) += 1;
    }
    out
}

fn no_packing() -> Profile {
    Profile {
        gang_topology_key: None,
        ..Profile::default()
    }
}

#[test]
fn gang_is_packed_into_one_zone() {
    // Zone a: two 4-cpu nodes; zone b: one 16-cpu node. 6 × 1 cpu fits in either zone;
    // the default LeastAllocated profile prefers the big, empty node.
    let f = Fixture::new(&[
        node("a1", "a", 4000),
        node("a2", "a", 4000),
        node("b1", "b", 16000),
    ]);
    let g = gang("g", &vec![cpu_spec(1000); 6]);
    let placement = place_gang(&f.ledger, &g, &Profile::default(), &[]);
    assert!(placement.is_complete());
    assert_eq!(
        placement.domain.as_ref().map(|d| d.value.as_str()),
        Some("b")
    );
    assert_eq!(
        nodes_of(&placement),
        BTreeMap::from([("b1".to_string(), 6)])
    );
    // Ten members fit zone b (16 cpu) but not zone a (8 cpu).
    let g = gang("g", &vec![cpu_spec(1000); 10]);
    let placement = place_gang(&f.ledger, &g, &Profile::default(), &[]);
    assert_eq!(
        placement.domain.as_ref().map(|d| d.value.as_str()),
        Some("b")
    );
    // Twenty members fit no single zone: spread, no domain.
    let g = gang("g", &vec![cpu_spec(1000); 20]);
    let placement = place_gang(&f.ledger, &g, &Profile::default(), &[]);
    assert!(placement.is_complete());
    assert_eq!(placement.domain, None);
    assert_eq!(placement.assignments.len(), 20);
}

#[test]
fn gang_members_fill_best_nodes_by_fit_count() {
    let f = Fixture::new(&[
        node("a", "z", 4000),
        node("b", "z", 4000),
        node("c", "z", 4000),
    ]);
    let mut binpack = no_packing();
    binpack.score_plugins = vec![PluginWeight {
        plugin: ScorePlugin::MostAllocated,
        weight: 1,
    }];
    let g = gang("g", &vec![cpu_spec(1000); 6]);
    let placement = place_gang(&f.ledger, &g, &binpack, &[]);
    assert!(placement.is_complete());
    assert_eq!(
        nodes_of(&placement),
        BTreeMap::from([("a".to_string(), 4), ("b".to_string(), 2)]),
        "each node takes as many as fit, best score then name first"
    );
    let keys: Vec<String> = placement
        .assignments
        .iter()
        .map(|a| a.member.member.clone())
        .collect();
    assert_eq!(
        keys,
        vec!["m-0", "m-1", "m-2", "m-3", "m-4", "m-5"],
        "input order"
    );
}

#[test]
fn templates_are_grouped_and_larger_ones_go_first() {
    // One 3-cpu member and three 1-cpu members on two 3-cpu nodes: the big one must go
    // first or it finds no room.
    let f = Fixture::new(&[node("a", "z", 3000), node("b", "z", 3000)]);
    let g = gang(
        "g",
        &[
            cpu_spec(1000),
            cpu_spec(1000),
            cpu_spec(3000),
            cpu_spec(1000),
        ],
    );
    let placement = place_gang(&f.ledger, &g, &no_packing(), &[]);
    assert!(placement.is_complete(), "{:?}", placement.unplaced);
    let big = placement
        .assignments
        .iter()
        .find(|a| a.member.member == "m-2");
    let big_node = big.map(|a| a.node.clone()).unwrap_or_default();
    let same = placement
        .assignments
        .iter()
        .filter(|a| a.node == big_node)
        .count();
    assert_eq!(same, 1);
}

#[test]
fn unplaced_members_carry_a_diagnosis() {
    let mut tainted = node("t", "z", 8000);
    tainted.taints.push(Taint {
        key: "dedicated".into(),
        value: "infra".into(),
        effect: TaintEffect::NoSchedule,
    });
    let f = Fixture::new(&[node("a", "z", 2000), tainted]);
    let g = gang("g", &vec![cpu_spec(1000); 3]);
    let placement = place_gang(&f.ledger, &g, &no_packing(), &[]);
    assert_eq!(placement.assignments.len(), 2);
    assert_eq!(placement.unplaced.len(), 1);
    let text = placement.unplaced[0].diagnosis.to_string();
    assert_eq!(
        text,
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: NoSchedule}, 1 node(s) were filled by other members of the gang."
    );
}

#[test]
fn anti_affine_members_spread_one_per_node() {
    let f = Fixture::new(&[
        node("a", "z", 8000),
        node("b", "z", 8000),
        node("c", "z", 8000),
    ]);
    let mut spec = cpu_spec(100);
    spec.labels.insert("app".into(), "ps".into());
    let mut selector = LabelSelector::default();
    selector.match_labels.insert("app".into(), "ps".into());
    spec.pod_anti_affinity.required.push(PodAffinityTerm {
        label_selector: Some(selector),
        topology_key: LABEL_HOSTNAME.into(),
    });
    let placement = place_gang(
        &f.ledger,
        &gang("g", &vec![spec.clone(); 3]),
        &Profile::default(),
        &[],
    );
    assert!(placement.is_complete());
    assert_eq!(nodes_of(&placement).len(), 3);
    let placement = place_gang(
        &f.ledger,
        &gang("g", &vec![spec; 4]),
        &Profile::default(),
        &[],
    );
    assert_eq!(placement.assignments.len(), 3);
    assert_eq!(
        placement.unplaced[0]
            .diagnosis
            .reasons
            .get(&FilterReason::PodAntiAffinityConflict),
        Some(&3)
    );
}

#[test]
fn self_affine_gang_lands_in_one_zone() {
    let f = Fixture::new(&[
        node("a1", "a", 8000),
        node("a2", "a", 8000),
        node("b1", "b", 8000),
    ]);
    let mut spec = cpu_spec(3000);
    spec.labels.insert("job".into(), "j".into());
    let mut selector = LabelSelector::default();
    selector.match_labels.insert("job".into(), "j".into());
    spec.pod_affinity.required.push(PodAffinityTerm {
        label_selector: Some(selector),
        topology_key: LABEL_ZONE.into(),
    });
    let placement = place_gang(&f.ledger, &gang("g", &vec![spec; 4]), &no_packing(), &[]);
    assert!(placement.is_complete(), "{:?}", placement.unplaced);
    let zones: Vec<&str> = placement
        .assignments
        .iter()
        .map(|a| if a.node.starts_with('a') { "a" } else { "b" })
        .collect();
    assert!(zones.iter().all(|z| *z == zones[0]), "{zones:?}");
}

#[test]
fn host_ports_allow_one_member_per_node() {
    let f = Fixture::new(&[node("a", "z", 8000), node("b", "z", 8000)]);
    let mut spec = cpu_spec(100);
    spec.host_ports.push(HostPort {
        port: 9000,
        protocol: Protocol::Tcp,
    });
    let placement = place_gang(&f.ledger, &gang("g", &vec![spec; 3]), &no_packing(), &[]);
    assert_eq!(nodes_of(&placement).len(), 2);
    assert_eq!(placement.unplaced.len(), 1);
}

#[test]
fn groups_place_all_their_gangs_together() {
    let f = Fixture::new(&[node("a", "z", 4000), node("b", "z", 4000)]);
    let group = GangGroup {
        queue: String::new(),
        id: "grp".into(),
        gangs: vec![
            gang("x", &vec![cpu_spec(1000); 3]),
            gang("y", &vec![cpu_spec(1000); 5]),
        ],
        ..Default::default()
    };
    let placement = place_group(&f.ledger, &group, &no_packing(), &[]);
    assert!(placement.is_complete());
    assert_eq!(placement.assignments.len(), 8);
    let group = GangGroup {
        queue: String::new(),
        id: "grp".into(),
        gangs: vec![
            gang("x", &vec![cpu_spec(1000); 3]),
            gang("y", &vec![cpu_spec(1000); 6]),
        ],
        ..Default::default()
    };
    assert_eq!(
        place_group(&f.ledger, &group, &no_packing(), &[])
            .unplaced
            .len(),
        1
    );
}

#[test]
fn placement_reserves_cleanly_in_the_ledger() {
    let mut f = Fixture::new(&[node("a", "z", 4000), node("b", "z", 4000)]);
    let g = gang("g", &vec![cpu_spec(1000); 8]);
    let placement = place_gang(&f.ledger, &g, &Profile::default(), &[]);
    assert!(placement.is_complete());
    let reply = f.apply(LedgerOp::Reserve {
        txn_id: TxnId(100),
        members: placement.assignments,
        deadline_ms: 10,
        network: Vec::new(),
    });
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    assert_eq!(
        quote(&f.ledger, &cpu_spec(1), &Profile::default(), &[]).fit_count,
        0
    );
}

#[test]
fn quotes_count_copies_and_best_score() {
    let mut f = Fixture::new(&[
        node("a", "z", 4000),
        node("b", "z", 2000),
        node("c", "z", 500),
    ]);
    f.place("busy", &[("0", "a", summary(1000, 0))]);
    let q = quote(&f.ledger, &cpu_spec(1000), &Profile::default(), &[]);
    assert_eq!(q.fit_count, 3 + 2);
    assert!(q.best_score.is_some());
    assert_eq!(
        q.diagnosis
            .reasons
            .get(&FilterReason::LargerThanNode(ResourceName::Cpu)),
        Some(&1),
        "c's whole allocatable is less than the request"
    );
    let many = quote_many(
        &f.ledger,
        &[&cpu_spec(1000), &cpu_spec(9000)],
        &Profile::default(),
        &[],
    );
    assert_eq!(many[0], q);
    assert_eq!(many[1].fit_count, 0);
    assert_eq!(many[1].best_score, None);
}

#[test]
fn preferred_node_affinity_steers_single_pods() {
    let mut fast = node("fast", "z", 4000);
    fast.labels.insert("disk".into(), "ssd".into());
    let f = Fixture::new(&[node("slow", "z", 4000), fast]);
    let mut spec = cpu_spec(100);
    spec.node_affinity.preferred.push(PreferredSchedulingTerm {
        weight: 50,
        preference: NodeSelectorTerm {
            match_expressions: vec![NodeSelectorRequirement {
                key: "disk".into(),
                operator: NodeSelectorOperator::In,
                values: vec!["ssd".into()],
            }],
        },
    });
    let key = MemberKey::new("ns", "p", "0");
    let placement = place_members(
        &f.ledger,
        &[MemberRef {
            key: &key,
            spec: &spec,
        }],
        &Profile::default(),
        &[],
    );
    assert_eq!(placement.assignments[0].node, "fast");
}

#[test]
fn prefer_no_schedule_taints_only_lower_the_score() {
    let mut soft = node("a-soft", "z", 4000);
    soft.taints.push(Taint {
        key: "spot".into(),
        value: String::new(),
        effect: TaintEffect::PreferNoSchedule,
    });
    let f = Fixture::new(&[soft, node("b-plain", "z", 4000)]);
    let key = MemberKey::new("ns", "p", "0");
    let spec = cpu_spec(100);
    let placement = place_members(
        &f.ledger,
        &[MemberRef {
            key: &key,
            spec: &spec,
        }],
        &Profile::default(),
        &[],
    );
    assert_eq!(placement.assignments[0].node, "b-plain");
    assert_eq!(
        quote(&f.ledger, &spec, &Profile::default(), &[]).fit_count,
        80
    );
}

#[test]
fn a_node_smaller_than_the_request_is_told_apart_from_a_full_one() {
    let mut f = Fixture::new(&[
        node("full", "z", 2000),
        node("small", "z", 500),
        node("nominated", "z", 500),
    ]);
    f.place("busy", &[("0", "full", summary(2000, 0))]);
    // A nomination sends the node through the general fit path, not the fixed one.
    let nominations = [nomination("other", "nominated", 100, 10)];
    let key = MemberKey::new("ns", "big", "0");
    let spec = cpu_spec(1000);
    let placement = place_members(
        &f.ledger,
        &[MemberRef {
            key: &key,
            spec: &spec,
        }],
        &no_packing(),
        &nominations,
    );
    assert!(!placement.is_complete());
    let reasons = &placement.unplaced[0].diagnosis.reasons;
    assert_eq!(
        reasons.get(&FilterReason::Insufficient(ResourceName::Cpu)),
        Some(&1),
        "{reasons:?}"
    );
    assert_eq!(
        reasons.get(&FilterReason::LargerThanNode(ResourceName::Cpu)),
        Some(&2),
        "{reasons:?}"
    );
    assert!(!FilterReason::LargerThanNode(ResourceName::Cpu).resolvable_by_preemption());
    assert_eq!(
        FilterReason::LargerThanNode(ResourceName::Cpu).to_string(),
        "node(s) had less allocatable cpu than the pod requests"
    );
}

// ---- nominations ---------------------------------------------------------------------------

fn nomination(member: &str, node: &str, cpu_milli: u64, priority: i32) -> Nomination {
    Nomination {
        member: MemberKey::new("ns", member, "0"),
        node: node.into(),
        pod: summary(cpu_milli, priority),
    }
}

#[test]
fn nominated_room_is_kept_from_lower_or_equal_priority_pods() {
    let f = Fixture::new(&[node("a", "z", 2000)]);
    let nominations = [nomination("hero", "a", 2000, 10)];
    let place = |member: &str, priority: i32| {
        let key = MemberKey::new("ns", member, "0");
        let mut spec = cpu_spec(1000);
        spec.priority = priority;
        place_members(
            &f.ledger,
            &[MemberRef {
                key: &key,
                spec: &spec,
            }],
            &no_packing(),
            &nominations,
        )
    };
    assert!(!place("low", 5).is_complete());
    assert!(
        !place("equal", 10).is_complete(),
        "equal priority waits too"
    );
    assert!(place("higher", 11).is_complete());
    assert!(
        place("hero", 10).is_complete(),
        "the nominee's own nomination does not block it"
    );
}

// ---- preemption ----------------------------------------------------------------------------

fn preemptor(cpu_milli: u64, priority: i32) -> (MemberKey, PodSpec) {
    let mut spec = cpu_spec(cpu_milli);
    spec.priority = priority;
    (MemberKey::new("ns", "preemptor", "0"), spec)
}

fn victims(outcome: &PreemptionOutcome) -> Vec<(String, String)> {
    match outcome {
        PreemptionOutcome::Preempt(plan) => plan
            .victims
            .iter()
            .map(|Victim { member, node, .. }| (member.gang.clone(), node.clone()))
            .collect(),
        _ => Vec::new(),
    }
}

fn nominated(outcome: &PreemptionOutcome) -> Option<&str> {
    match outcome {
        PreemptionOutcome::Preempt(plan) => Some(plan.nominated_node.as_str()),
        _ => None,
    }
}

#[test]
fn preemption_is_not_needed_when_the_pod_fits() {
    let f = Fixture::new(&[node("a", "z", 2000)]);
    let (key, spec) = preemptor(1000, 10);
    assert_eq!(
        preempt(&f.ledger, &key, &spec, &Profile::default(), &[]),
        PreemptionOutcome::Fits { node: "a".into() }
    );
}

#[test]
fn preemption_prefers_lowest_priorities_then_fewest_victims() {
    let mut f = Fixture::new(&[
        node("a", "z", 2000),
        node("b", "z", 2000),
        node("c", "z", 2000),
    ]);
    f.place("a1", &[("0", "a", summary(1000, 1))]);
    f.place("a2", &[("0", "a", summary(1000, 1))]);
    f.place("b1", &[("0", "b", summary(2000, 5))]);
    f.place("c1", &[("0", "c", summary(2000, 1))]);
    let (key, spec) = preemptor(2000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert_eq!(
        nominated(&outcome),
        Some("c"),
        "one priority-1 victim beats two (a) or one priority-5 (b)"
    );
    assert_eq!(victims(&outcome), vec![("c1".to_string(), "c".to_string())]);
}

#[test]
fn lower_priority_wins_over_fewer_victims() {
    let mut f = Fixture::new(&[node("a", "z", 2000), node("b", "z", 2000)]);
    f.place("a1", &[("0", "a", summary(1000, 1))]);
    f.place("a2", &[("0", "a", summary(1000, 1))]);
    f.place("b1", &[("0", "b", summary(2000, 5))]);
    let (key, spec) = preemptor(2000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert_eq!(nominated(&outcome), Some("a"));
    assert_eq!(victims(&outcome).len(), 2);
}

#[test]
fn reprieve_keeps_the_highest_priority_pods() {
    let mut f = Fixture::new(&[node("a", "z", 4000)]);
    f.place("p1", &[("0", "a", summary(1000, 1))]);
    f.place("p2", &[("0", "a", summary(1000, 2))]);
    f.place("p3", &[("0", "a", summary(1000, 3))]);
    let (key, spec) = preemptor(2000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert_eq!(victims(&outcome), vec![("p1".to_string(), "a".to_string())]);
}

#[test]
fn equal_or_higher_priority_is_never_preempted() {
    let mut f = Fixture::new(&[node("a", "z", 2000)]);
    f.place("peer", &[("0", "a", summary(2000, 10))]);
    let (key, spec) = preemptor(1000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert!(
        matches!(outcome, PreemptionOutcome::Unresolvable { .. }),
        "{outcome:?}"
    );
}

#[test]
fn reserved_pods_are_never_victims() {
    let mut f = Fixture::new(&[node("a", "z", 2000)]);
    f.reserve("inflight", "a", summary(2000, 0));
    let (key, spec) = preemptor(1000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert!(
        matches!(outcome, PreemptionOutcome::Unresolvable { .. }),
        "{outcome:?}"
    );
}

#[test]
fn a_gang_is_preempted_whole_or_not_at_all() {
    let mut f = Fixture::new(&[node("a", "z", 2000), node("b", "z", 2000)]);
    f.place(
        "train",
        &[("w0", "a", summary(2000, 1)), ("w1", "b", summary(1000, 1))],
    );
    let (key, spec) = preemptor(2000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert_eq!(nominated(&outcome), Some("a"));
    assert_eq!(
        victims(&outcome),
        vec![
            ("train".to_string(), "a".to_string()),
            ("train".to_string(), "b".to_string())
        ],
        "the member on b goes too"
    );

    let mut f = Fixture::new(&[node("a", "z", 2000), node("b", "z", 2000)]);
    f.place(
        "mixed",
        &[
            ("w0", "a", summary(2000, 1)),
            ("w1", "b", summary(2000, 50)),
        ],
    );
    let (key, spec) = preemptor(2000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    assert!(
        matches!(outcome, PreemptionOutcome::Unresolvable { .. }),
        "one member outranks the preemptor, so none may go: {outcome:?}"
    );
}

#[test]
fn unresolvable_failures_are_not_preempted_for() {
    let mut f = Fixture::new(&[node("a", "z", 2000)]);
    f.place("low", &[("0", "a", summary(2000, 0))]);
    let (key, mut spec) = preemptor(1000, 10);
    spec.node_selector.insert("gpu".into(), "yes".into());
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &[]);
    let PreemptionOutcome::Unresolvable { diagnosis } = outcome else {
        panic!("selector mismatch cannot be cured");
    };
    assert_eq!(
        diagnosis.reasons.get(&FilterReason::NodeAffinityMismatch),
        Some(&1)
    );
}

#[test]
fn preemption_respects_other_nominations() {
    let mut f = Fixture::new(&[node("a", "z", 2000), node("b", "z", 2000)]);
    f.place("la", &[("0", "a", summary(2000, 1))]);
    f.place("lb", &[("0", "b", summary(2000, 2))]);
    // A priority-20 pod already holds a nomination for a's room.
    let nominations = [nomination("first", "a", 2000, 20)];
    let (key, spec) = preemptor(2000, 10);
    let outcome = preempt(&f.ledger, &key, &spec, &Profile::default(), &nominations);
    assert_eq!(nominated(&outcome), Some("b"));
}

// ---- node search: percentageOfNodesToScore and round-robin ----------------------------------

/// `count` nodes n000… in one zone with `cpu_milli` each, except `big` with four times as much.
fn fleet_with_big(count: usize, cpu_milli: u64, big: usize) -> Vec<Node> {
    (0..count)
        .map(|i| {
            let cpu = if i == big { 4 * cpu_milli } else { cpu_milli };
            node(&format!("n{i:03}"), "z", cpu)
        })
        .collect()
}

fn sampling(percentage: u32) -> Profile {
    Profile {
        percentage_of_nodes_to_score: percentage,
        topologies: Vec::new(),
        ..no_packing()
    }
}

/// Where `placer` puts one pod of `spec`.
fn place_one(
    f: &Fixture,
    placer: &mut Placer,
    spec: &PodSpec,
    profile: &Profile,
) -> Option<String> {
    let key = MemberKey::new("ns", "single", "0");
    let placement = placer.place_members(&f.ledger, &[MemberRef { key: &key, spec }], profile, &[]);
    placement.assignments.first().map(|a| a.node.clone())
}

/// The best node over every node, computed the plain way: filter every node, score all
/// feasible ones together, take the highest score, then the first name.
fn exhaustive_best(f: &Fixture, spec: &PodSpec, profile: &Profile) -> Option<String> {
    let cluster = Cluster::build(&f.ledger, &[]);
    let own = BTreeSet::new();
    let footprint = footprint_of(&spec.requests);
    let candidate = Candidate {
        spec,
        footprint: &footprint,
        own: &own,
    };
    let interpod = InterPodState::build(&cluster, spec, |_, _| Counted::Yes);
    let feasible: Vec<usize> = (0..cluster.len())
        .filter(|&i| {
            cluster
                .state(i)
                .is_some_and(|state| filter_node(&state, &candidate, &interpod).is_ok())
        })
        .collect();
    let input = ScoreInput {
        spec,
        footprint: &footprint,
        interpod: &interpod,
        profile,
    };
    let scores = score_nodes(&cluster, &feasible, &input);
    let best = feasible
        .iter()
        .zip(&scores)
        .max_by(|(a, sa), (b, sb)| sa.cmp(sb).then(b.cmp(a)))
        .map(|(i, _)| *i)?;
    cluster.name(best).map(str::to_string)
}

#[test]
fn a_search_stops_at_its_share_of_feasible_nodes_and_the_next_starts_there() {
    // 200 nodes: 50% is 100 nodes. n150 is the roomiest, so LeastAllocated wants it.
    let f = Fixture::new(&fleet_with_big(200, 4000, 150));
    let spec = cpu_spec(1000);
    let half = sampling(50);
    let mut placer = Placer::new();
    assert_eq!(
        place_one(&f, &mut placer, &spec, &half).as_deref(),
        Some("n000"),
        "the first search sees n000..n099 only, all alike: the first name wins"
    );
    assert_eq!(placer.next_start(), 100);
    assert_eq!(
        place_one(&f, &mut placer, &spec, &half).as_deref(),
        Some("n150"),
        "the second search starts where the first stopped and sees n100..n199"
    );
    assert_eq!(placer.next_start(), 0, "and wraps around");
    // Score-all and the free functions (a fresh search from the first node).
    let all = sampling(100);
    assert_eq!(
        place_one(&f, &mut Placer::new(), &spec, &all).as_deref(),
        Some("n150")
    );
    let key = MemberKey::new("ns", "single", "0");
    let free = place_members(
        &f.ledger,
        &[MemberRef {
            key: &key,
            spec: &spec,
        }],
        &half,
        &[],
    );
    assert_eq!(free.assignments[0].node, "n000");
}

#[test]
fn the_adaptive_default_follows_kube_scheduler() {
    // 0 = adaptive: 50% - 200/125 = 49% of 200 = 98, raised to the minimum of 100.
    let f = Fixture::new(&fleet_with_big(200, 4000, 150));
    let mut placer = Placer::new();
    assert_eq!(Profile::default().percentage_of_nodes_to_score, 0);
    place_one(&f, &mut placer, &cpu_spec(1000), &sampling(0));
    assert_eq!(placer.next_start(), 100);
    // Below 100 nodes every node is searched, as before.
    let small = Fixture::new(&fleet_with_big(60, 4000, 40));
    let mut placer = Placer::starting_at(10);
    assert_eq!(
        place_one(&small, &mut placer, &cpu_spec(1000), &sampling(0)).as_deref(),
        Some("n040")
    );
    assert_eq!(placer.next_start(), 10, "a full lap ends where it began");
}

#[test]
fn refused_nodes_do_not_count_towards_the_share() {
    let mut nodes = fleet_with_big(200, 4000, 199);
    for n in nodes.iter_mut().take(50) {
        n.schedulability = crate::model::node::Schedulability::Cordoned;
    }
    let f = Fixture::new(&nodes);
    let mut placer = Placer::new();
    let chosen = place_one(&f, &mut placer, &cpu_spec(1000), &sampling(50));
    assert_eq!(chosen.as_deref(), Some("n050"));
    assert_eq!(
        placer.next_start(),
        150,
        "50 refused + 100 feasible visited"
    );
    // Round-robin from the middle: n180..n199 then n000..n079 (n000..n049 refused).
    let mut placer = Placer::starting_at(180);
    let chosen = place_one(&f, &mut placer, &cpu_spec(1000), &sampling(50));
    assert_eq!(
        chosen.as_deref(),
        Some("n199"),
        "the roomy node is in this window"
    );
    assert_eq!(placer.next_start(), 130);
}

#[test]
fn scoring_every_node_picks_the_exhaustive_best_from_any_start() {
    // A mixed fleet: sizes, zones, soft taints, a busy node, a selector-relevant label.
    let mut nodes = Vec::new();
    for i in 0..150u64 {
        let mut n = node(
            &format!("n{i:03}"),
            ["a", "b", "c"][(i % 3) as usize],
            2000 + (i * 7919) % 9000,
        );
        if i % 11 == 0 {
            n.taints.push(Taint {
                key: "spot".into(),
                value: String::new(),
                effect: TaintEffect::PreferNoSchedule,
            });
        }
        if i % 5 == 0 {
            n.labels.insert("disk".into(), "ssd".into());
        }
        nodes.push(n);
    }
    let mut f = Fixture::new(&nodes);
    f.place(
        "busy",
        &[
            ("0", "n042", summary(1500, 0)),
            ("1", "n099", summary(900, 0)),
        ],
    );
    let mut preferring = cpu_spec(700);
    preferring
        .node_affinity
        .preferred
        .push(PreferredSchedulingTerm {
            weight: 20,
            preference: NodeSelectorTerm {
                match_expressions: vec![NodeSelectorRequirement {
                    key: "disk".into(),
                    operator: NodeSelectorOperator::In,
                    values: vec!["ssd".into()],
                }],
            },
        });
    let mut binpack = sampling(100);
    binpack.score_plugins = vec![PluginWeight {
        plugin: ScorePlugin::MostAllocated,
        weight: 1,
    }];
    for spec in [cpu_spec(700), cpu_spec(5000), preferring] {
        for profile in [sampling(100), binpack.clone()] {
            let best = exhaustive_best(&f, &spec, &profile);
            assert!(best.is_some());
            for start in [0, 37, 149, 1000] {
                let mut placer = Placer::starting_at(start);
                assert_eq!(
                    place_one(&f, &mut placer, &spec, &profile),
                    best,
                    "start {start}"
                );
                assert_eq!(placer.next_start(), start % 150, "a full lap");
            }
        }
    }
}

#[test]
fn a_gang_searches_on_until_its_members_have_room() {
    // 200 one-cpu nodes; 5% would stop at 100 nodes, but 150 members need 150 of them.
    let nodes: Vec<Node> = (0..200)
        .map(|i| node(&format!("n{i:03}"), "z", 1000))
        .collect();
    let f = Fixture::new(&nodes);
    let mut placer = Placer::new();
    let placement = placer.place_gang(
        &f.ledger,
        &gang("g", &vec![cpu_spec(1000); 150]),
        &sampling(5),
        &[],
    );
    assert!(placement.is_complete(), "{:?}", placement.unplaced.first());
    assert_eq!(nodes_of(&placement).len(), 150);
    assert_eq!(placer.next_start(), 150);
    // More members than the whole fleet holds: every node is searched and reported.
    let placement = placer.place_gang(
        &f.ledger,
        &gang("g", &vec![cpu_spec(1000); 250]),
        &sampling(5),
        &[],
    );
    assert_eq!(placement.assignments.len(), 200);
    assert_eq!(placement.unplaced.len(), 50);
    assert_eq!(placement.unplaced[0].diagnosis.nodes, 200);
    assert_eq!(
        placement.unplaced[0]
            .diagnosis
            .reasons
            .get(&FilterReason::CapacityTakenByGang),
        Some(&200)
    );
}

#[test]
fn kept_results_never_change_a_placement() {
    // A fleet with every kind of node, placements committed between calls, more
    // templates than the cache keeps, and a clone of the ledger that diverges.
    let mut nodes = Vec::new();
    for i in 0..130u64 {
        let mut n = node(
            &format!("n{i:03}"),
            ["a", "b"][(i % 2) as usize],
            3000 + (i % 4) * 1000,
        );
        match i % 13 {
            0 => n.taints.push(Taint {
                key: "spot".into(),
                value: String::new(),
                effect: TaintEffect::PreferNoSchedule,
            }),
            1 => n.schedulability = crate::model::node::Schedulability::Cordoned,
            2 => n
                .labels
                .insert("disk".into(), "ssd".into())
                .map_or((), |_| ()),
            3 => n
                .allocatable
                .set(&ResourceName::Extended("nvidia.com/gpu".into()), 2),
            _ => {}
        }
        nodes.push(n);
    }
    let mut specs: Vec<PodSpec> = (1..=10).map(|k| cpu_spec(250 * k)).collect();
    specs[3].node_selector.insert("disk".into(), "ssd".into());
    specs[4].host_ports.push(HostPort {
        port: 8080,
        protocol: Protocol::Tcp,
    });
    specs[5]
        .requests
        .set(&ResourceName::Extended("nvidia.com/gpu".into()), 1);
    let mut a = Fixture::new(&nodes);
    let mut b = Fixture::new(&[]);
    let mut cached = Placer::new();
    let mut plain = Placer::uncached(0);
    let profiles = [Profile::default(), sampling(30)];
    for step in 0..120usize {
        if step == 60 {
            b = Fixture {
                ledger: a.ledger.clone(),
                txn: a.txn,
            };
        }
        let f = if step >= 60 && step % 2 == 1 {
            &mut b
        } else {
            &mut a
        };
        let spec = &specs[(step * 7) % specs.len()];
        let profile = &profiles[step % 2];
        let members = 1 + step % 3;
        let g = gang(&format!("g{step}"), &vec![spec.clone(); members]);
        let with_cache = cached.place_gang(&f.ledger, &g, profile, &[]);
        let without = plain.place_gang(&f.ledger, &g, profile, &[]);
        assert_eq!(with_cache, without, "step {step}");
        assert_eq!(cached.next_start(), plain.next_start(), "step {step}");
        if with_cache.is_complete() {
            f.txn += 1;
            let reply = f.apply(LedgerOp::ReserveAndCommit {
                txn_id: TxnId(f.txn),
                members: with_cache.assignments,
                network: Vec::new(),
            });
            assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
        }
        if step % 17 == 16 {
            let reply = f.apply(LedgerOp::Release {
                target: crate::ledger::command::ReleaseTarget::Txn(TxnId(f.txn / 2)),
            });
            assert!(matches!(reply, LedgerReply::Released { .. }), "{reply:?}");
        }
    }
}

// ---- the filter fast path agrees with the full pipeline ---------------------------------------

/// A small deterministic generator for scenario property tests.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn app_selector(app: &str) -> LabelSelector {
    let mut selector = LabelSelector::default();
    selector.match_labels.insert("app".into(), app.into());
    selector
}

fn random_node(g: &mut Gen, i: u64) -> Node {
    let mut n = node(
        &format!("n{i:02}"),
        ["a", "b"][g.below(2) as usize],
        1000 * (1 + g.below(6)),
    );
    n.allocatable.pods = 1 + g.below(6);
    if g.chance(20) {
        n.allocatable.set(
            &ResourceName::Extended("nvidia.com/gpu".into()),
            1 + g.below(2),
        );
    }
    if g.chance(30) {
        n.labels.insert("disk".into(), "ssd".into());
    }
    let effects = [
        TaintEffect::PreferNoSchedule,
        TaintEffect::NoSchedule,
        TaintEffect::NoExecute,
    ];
    if g.chance(20) {
        n.taints.push(Taint {
            key: "t".into(),
            value: String::new(),
            effect: effects[g.below(3) as usize],
        });
    }
    if g.chance(10) {
        n.schedulability = crate::model::node::Schedulability::Cordoned;
    }
    if g.chance(10) {
        n.readiness = crate::model::node::Readiness::NotReady;
    }
    n
}

fn random_summary(g: &mut Gen) -> PodSummary {
    let mut pod = summary(250 * g.below(5), g.below(10) as i32);
    pod.labels
        .insert("app".into(), ["x", "y"][g.below(2) as usize].into());
    if g.chance(20) {
        pod.host_ports.push(HostPort {
            port: 80 + g.below(2) as u16,
            protocol: Protocol::Tcp,
        });
    }
    if g.chance(15) {
        pod.anti_affinity.push(PodAffinityTerm {
            label_selector: Some(app_selector("x")),
            topology_key: [LABEL_HOSTNAME, LABEL_ZONE][g.below(2) as usize].into(),
        });
    }
    pod
}

fn random_spec(g: &mut Gen) -> PodSpec {
    let mut spec = cpu_spec(250 * (1 + g.below(8)));
    spec.priority = g.below(10) as i32;
    spec.labels
        .insert("app".into(), ["x", "y"][g.below(2) as usize].into());
    if g.chance(15) {
        spec.requests
            .set(&ResourceName::Extended("nvidia.com/gpu".into()), 1);
    }
    if g.chance(15) {
        spec.node_selector.insert("disk".into(), "ssd".into());
    }
    if g.chance(15) {
        spec.tolerations.push(crate::model::pod::Toleration {
            key: "t".into(),
            operator: crate::model::pod::TolerationOperator::Exists,
            value: String::new(),
            effect: None,
            toleration_seconds: None,
        });
    }
    if g.chance(20) {
        spec.host_ports.push(HostPort {
            port: 80 + g.below(2) as u16,
            protocol: Protocol::Tcp,
        });
    }
    if g.chance(15) {
        spec.pod_anti_affinity.required.push(PodAffinityTerm {
            label_selector: Some(app_selector("x")),
            topology_key: LABEL_HOSTNAME.into(),
        });
    }
    if g.chance(15) {
        spec.pod_affinity.required.push(PodAffinityTerm {
            label_selector: Some(app_selector("y")),
            topology_key: LABEL_ZONE.into(),
        });
    }
    spec
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn the_filter_fast_path_agrees_with_the_full_pipeline(seed in 1u64..u64::MAX) {
        let mut g = Gen(seed);
        let count = 1 + g.below(12);
        let nodes: Vec<Node> = (0..count).map(|i| random_node(&mut g, i)).collect();
        let mut f = Fixture::new(&nodes);
        for p in 0..g.below(10) {
            f.txn += 1;
            f.apply(LedgerOp::ReserveAndCommit {
                txn_id: TxnId(f.txn),
                members: vec![ReserveMember {
                    member: MemberKey::new("ns", format!("p{p}"), "0"),
                    node: format!("n{:02}", g.below(count)),
                    pod: random_summary(&mut g),
                }],
 network: Vec::new(),
            });
        }
        let nominations: Vec<Nomination> = (0..g.below(3))
            .map(|k| Nomination {
                member: MemberKey::new("ns", format!("nom{k}"), "0"),
                node: format!("n{:02}", g.below(count)),
                pod: random_summary(&mut g),
            })
            .collect();
        let mut cluster = Cluster::build(&f.ledger, &nominations);
        for k in 0..g.below(4) {
            cluster.plan(
                g.below(count) as usize,
                MemberKey::new("ns", "planned", format!("{k}")),
                random_summary(&mut g),
            );
        }
        for _ in 0..4 {
            let spec = random_spec(&mut g);
            let own = if g.chance(50) {
                BTreeSet::from([MemberKey::new("ns", "nom0", "0")])
            } else {
                BTreeSet::new()
            };
            let footprint = footprint_of(&spec.requests);
            let candidate = Candidate { spec: &spec, footprint: &footprint, own: &own };
            let interpod = InterPodState::build(&cluster, &spec, |_, _| Counted::Yes);
            let probe = crate::engine::filter::Probe::new(candidate, &interpod);
            for i in 0..cluster.len() {
                let state = cluster.state(i);
                proptest::prop_assert!(state.is_some());
                let full = state.map(|s| filter_node(&s, &candidate, &interpod));
                for cap in [1, 2, u64::MAX] {
                    let expected = full.clone().map(|r| r.map(|copies| copies.min(cap)));
                    proptest::prop_assert_eq!(Some(probe.check(&cluster, i, cap)), expected);
                }
            }
        }
    }
}

/// A plan says whether a filter could have read its members' labels: not for plain
/// members on a shard without anti-affinity; yes once a pod there holds a required
/// anti-affinity term, or a member has affinity terms (`plan::assign` swaps members
/// that differ only in labels only in the first case).
#[test]
fn a_plan_says_whether_its_members_labels_were_read() {
    let mut f = Fixture::new(&[node("a", "z", 8000), node("b", "z", 8000)]);
    let plain = cpu_spec(100);
    let labels_of = |f: &Fixture, spec: &PodSpec| {
        place_gang(
            &f.ledger,
            &gang("g", &[spec.clone()]),
            &Profile::default(),
            &[],
        )
        .member_labels
    };
    assert_eq!(labels_of(&f, &plain), crate::engine::MemberLabels::Unread);
    let mut affine = plain.clone();
    affine.pod_affinity.required.push(PodAffinityTerm {
        label_selector: Some(app_selector("x")),
        topology_key: LABEL_HOSTNAME.into(),
    });
    assert_eq!(labels_of(&f, &affine), crate::engine::MemberLabels::Read);
    let mut guard = summary(100, 0);
    guard.anti_affinity.push(PodAffinityTerm {
        label_selector: Some(app_selector("x")),
        topology_key: LABEL_HOSTNAME.into(),
    });
    f.place("other", &[("o", "a", guard)]);
    assert_eq!(labels_of(&f, &plain), crate::engine::MemberLabels::Read);
}
