//! Engine tests across modules: gang placement, quotes, preemption, nominations.
//!
//! Fixtures are real ledgers built through commands, so the engine is exercised exactly
//! on what a shard leader would give it.

use std::collections::BTreeMap;

use crate::engine::cluster::Nomination;
use crate::engine::filter::FilterReason;
use crate::engine::placement::{
    place_gang, place_group, place_members, quote, quote_many, MemberRef,
};
use crate::engine::preemption::{preempt, PreemptionOutcome, Victim};
use crate::engine::profile::{PluginWeight, Profile, ScorePlugin};
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReserveMember, TxnId};
use crate::ledger::shard::ShardLedger;
use crate::model::gang::{Gang, GangGroup, GangMode, Member, MemberKey};
use crate::model::node::{Node, Taint, TaintEffect, LABEL_HOSTNAME, LABEL_ZONE};
use crate::model::pod::{
    HostPort, LabelSelector, NodeSelectorOperator, NodeSelectorRequirement, NodeSelectorTerm,
    PodAffinityTerm, PodSpec, PodSummary, PreferredSchedulingTerm, Protocol,
};
use crate::model::resources::{ResourceName, Resources};

fn node(name: &str, zone: &str, cpu_milli: u64) -> Node {
    let mut n = Node::new(
        name,
        Resources {
            cpu_milli,
            memory_bytes: 64 << 30,
            pods: 110,
            ..Resources::zero()
        },
    );
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
            })
            .collect(),
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
        id: "grp".into(),
        gangs: vec![
            gang("x", &vec![cpu_spec(1000); 3]),
            gang("y", &vec![cpu_spec(1000); 5]),
        ],
    };
    let placement = place_group(&f.ledger, &group, &no_packing(), &[]);
    assert!(placement.is_complete());
    assert_eq!(placement.assignments.len(), 8);
    let group = GangGroup {
        id: "grp".into(),
        gangs: vec![
            gang("x", &vec![cpu_spec(1000); 3]),
            gang("y", &vec![cpu_spec(1000); 6]),
        ],
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
            .get(&FilterReason::Insufficient(ResourceName::Cpu)),
        Some(&1)
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
