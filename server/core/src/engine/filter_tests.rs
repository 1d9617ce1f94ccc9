//! Unit tests of `filter.rs`.

use super::*;
use crate::engine::cluster::Cluster;
use crate::engine::interpod::Counted;
use crate::ledger::command::{LedgerCommand, LedgerOp, ReserveMember, TxnId};
use crate::ledger::shard::ShardLedger;
use crate::model::node::Taint;
use crate::model::pod::{
    footprint_of, NodeAffinity, NodeSelectorOperator, NodeSelectorRequirement, NodeSelectorTerm,
};
use crate::model::pod::{
    HostPort, LabelSelector, PodAffinityTerm, PodSummary, Protocol, Toleration, TolerationOperator,
    WeightedPodAffinityTerm,
};

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let mut n = crate::fixtures::node_with(name, 4000, 8 << 30, 10);
    n.labels = crate::fixtures::labels(labels).into();
    n
}

fn ledger(nodes: &[Node], placed: &[(&str, &str, PodSummary)]) -> ShardLedger {
    let mut l = ShardLedger::new();
    for n in nodes {
        l.apply(&LedgerCommand::new(
            0,
            LedgerOp::RegisterNode { node: n.clone() },
        ));
    }
    for (i, (member, node, pod)) in placed.iter().enumerate() {
        l.apply(&LedgerCommand::new(
            1,
            LedgerOp::ReserveAndCommit {
                txn_id: TxnId(i as u64),
                members: vec![ReserveMember {
                    member: MemberKey::new("ns", *member, "0"),
                    node: node.to_string(),
                    pod: pod.clone(),
                }],
                network: Vec::new(),
            },
        ));
    }
    l
}

/// Filter outcome of `spec` on every node, in name order.
fn outcomes(l: &ShardLedger, spec: &PodSpec) -> Vec<Result<u64, FilterReason>> {
    let cluster = Cluster::build(l, &[]);
    let own = BTreeSet::new();
    let footprint = footprint_of(&spec.requests);
    let candidate = Candidate {
        spec,
        footprint: &footprint,
        own: &own,
    };
    let interpod = InterPodState::build(&cluster, spec, |_, _| Counted::Yes);
    let probe = Probe::new(candidate, &interpod);
    (0..cluster.len())
        .map(|i| {
            let state = cluster.state(i).expect("node in range");
            let full = filter_node(&state, &candidate, &interpod);
            assert_eq!(probe.check(&cluster, i, u64::MAX), full, "probe agrees");
            let one = full
                .as_ref()
                .map(|copies| (*copies).min(1))
                .map_err(Clone::clone);
            assert_eq!(probe.check(&cluster, i, 1), one, "capped probe agrees");
            full
        })
        .collect()
}

fn labelled(pairs: &[(&str, &str)]) -> PodSummary {
    PodSummary {
        labels: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..PodSummary::default()
    }
}

fn term(app: &str, topology_key: &str) -> PodAffinityTerm {
    let mut selector = LabelSelector::default();
    selector.match_labels.insert("app".into(), app.into());
    PodAffinityTerm {
        label_selector: Some(selector),
        topology_key: topology_key.into(),
    }
}

#[test]
fn node_conditions_and_cordon() {
    let mut cordoned = node("a", &[]);
    cordoned.schedulability = Schedulability::Cordoned;
    let mut sick = node("b", &[]);
    sick.readiness = Readiness::NotReady;
    let l = ledger(&[cordoned, sick], &[]);
    let plain = PodSpec::default();
    assert_eq!(
        outcomes(&l, &plain),
        vec![
            Err(FilterReason::NodeUnschedulable),
            Err(FilterReason::NodeNotReady)
        ]
    );
    let mut tolerant = PodSpec::default();
    tolerant.tolerations.push(Toleration {
        key: "node.kubernetes.io/unschedulable".into(),
        operator: TolerationOperator::Exists,
        value: String::new(),
        effect: Some(TaintEffect::NoSchedule),
        toleration_seconds: None,
    });
    assert!(outcomes(&l, &tolerant)[0].is_ok());
}

#[test]
fn taints_filter_no_schedule_and_no_execute_only() {
    let mut a = node("a", &[]);
    a.taints.push(Taint {
        key: "soft".into(),
        value: String::new(),
        effect: TaintEffect::PreferNoSchedule,
    });
    let mut b = node("b", &[]);
    b.taints.push(Taint {
        key: "evict".into(),
        value: "yes".into(),
        effect: TaintEffect::NoExecute,
    });
    let l = ledger(&[a, b], &[]);
    let result = outcomes(&l, &PodSpec::default());
    assert!(result[0].is_ok());
    assert_eq!(
        result[1],
        Err(FilterReason::UntoleratedTaint {
            key: "evict".into(),
            effect: TaintEffect::NoExecute
        })
    );
    let mut everything = PodSpec::default();
    everything.tolerations.push(Toleration {
        key: String::new(),
        operator: TolerationOperator::Exists,
        value: String::new(),
        effect: None,
        toleration_seconds: None,
    });
    assert!(outcomes(&l, &everything)[1].is_ok());
}

#[test]
fn selector_affinity_resources_and_copies() {
    let l = ledger(
        &[
            node("a", &[("zone", "z1"), ("cores", "4")]),
            node("b", &[("zone", "z2")]),
        ],
        &[],
    );
    let mut spec = PodSpec::default();
    spec.requests.cpu_milli = 1500;
    spec.node_selector.insert("zone".into(), "z1".into());
    assert_eq!(
        outcomes(&l, &spec),
        vec![Ok(2), Err(FilterReason::NodeAffinityMismatch)]
    );
    spec.node_selector.clear();
    spec.node_affinity = NodeAffinity {
        required: Some(vec![NodeSelectorTerm {
            match_expressions: vec![NodeSelectorRequirement {
                key: "cores".into(),
                operator: NodeSelectorOperator::Lt,
                values: vec!["8".into()],
            }],
        }]),
        preferred: vec![],
    };
    assert_eq!(
        outcomes(&l, &spec),
        vec![Ok(2), Err(FilterReason::NodeAffinityMismatch)]
    );
    spec.node_affinity = NodeAffinity::default();
    spec.requests.cpu_milli = 5000;
    assert_eq!(
        outcomes(&l, &spec)[0],
        Err(FilterReason::LargerThanNode(ResourceName::Cpu)),
        "more than the node's allocatable"
    );
    spec.requests.cpu_milli = 0;
    assert_eq!(
        outcomes(&l, &spec)[0],
        Ok(10),
        "pods allocatable bounds zero-request pods"
    );
}

#[test]
fn host_ports() {
    let used = PodSummary {
        host_ports: vec![HostPort {
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        ..PodSummary::default()
    };
    let l = ledger(&[node("a", &[]), node("b", &[])], &[("x", "a", used)]);
    let mut spec = PodSpec::default();
    spec.host_ports.push(HostPort {
        port: 8080,
        protocol: Protocol::Tcp,
    });
    assert_eq!(
        outcomes(&l, &spec),
        vec![Err(FilterReason::HostPortConflict), Ok(1)]
    );
}

#[test]
fn required_pod_affinity_by_topology() {
    let host = "kubernetes.io/hostname";
    let l = ledger(
        &[
            node("a", &[("zone", "z1"), (host, "a")]),
            node("b", &[("zone", "z1"), (host, "b")]),
            node("c", &[("zone", "z2"), (host, "c")]),
            node("d", &[(host, "d")]),
        ],
        &[("db", "a", labelled(&[("app", "db")]))],
    );
    let mut spec = PodSpec::default();
    spec.pod_affinity.required.push(term("db", "zone"));
    assert_eq!(
        outcomes(&l, &spec),
        vec![
            Ok(1),
            Ok(1),
            Err(FilterReason::PodAffinityUnsatisfied),
            Err(FilterReason::PodAffinityUnsatisfied)
        ]
    );

    let mut anti = PodSpec::default();
    anti.pod_anti_affinity.required.push(term("db", "zone"));
    assert_eq!(
        outcomes(&l, &anti),
        vec![
            Err(FilterReason::PodAntiAffinityConflict),
            Err(FilterReason::PodAntiAffinityConflict),
            Ok(1),
            Ok(1)
        ],
        "a node without the topology label is not constrained by anti-affinity"
    );
}

#[test]
fn first_pod_of_a_self_affine_series_may_start() {
    let l = ledger(&[node("a", &[("zone", "z1")]), node("b", &[])], &[]);
    let mut spec = PodSpec::default();
    spec.labels.insert("app".into(), "web".into());
    spec.pod_affinity.required.push(term("web", "zone"));
    assert_eq!(
        outcomes(&l, &spec),
        vec![Ok(1), Err(FilterReason::PodAffinityUnsatisfied)],
        "no pod matches anywhere and the pod matches itself; the topology label is still required"
    );
    spec.labels.insert("app".into(), "other".into());
    assert_eq!(
        outcomes(&l, &spec)[0],
        Err(FilterReason::PodAffinityUnsatisfied)
    );
}

#[test]
fn existing_pods_anti_affinity_is_symmetric() {
    let host = "kubernetes.io/hostname";
    let mut guard = labelled(&[("app", "guard")]);
    guard.anti_affinity.push(term("web", host));
    let l = ledger(
        &[node("a", &[(host, "a")]), node("b", &[(host, "b")])],
        &[("g", "a", guard)],
    );
    let mut web = PodSpec::default();
    web.labels.insert("app".into(), "web".into());
    assert_eq!(
        outcomes(&l, &web),
        vec![Err(FilterReason::ExistingPodAntiAffinity), Ok(10)]
    );
}

#[test]
fn preferred_terms_cap_copies_but_never_filter() {
    let l = ledger(&[node("a", &[("zone", "z")])], &[]);
    let mut spec = PodSpec::default();
    spec.pod_affinity.preferred.push(WeightedPodAffinityTerm {
        weight: 5,
        term: term("x", "zone"),
    });
    assert_eq!(outcomes(&l, &spec), vec![Ok(1)]);
}

#[test]
fn diagnosis_reads_like_kubernetes() {
    let mut d = Diagnosis {
        nodes: 5,
        ..Diagnosis::default()
    };
    d.record_many(FilterReason::Insufficient(ResourceName::Cpu), 3);
    d.record(FilterReason::NodeUnschedulable);
    d.record(FilterReason::NodeUnschedulable);
    assert_eq!(
        d.to_string(),
        "0/5 nodes are available: 2 node(s) were unschedulable, 3 Insufficient cpu."
    );
    assert!(FilterReason::Insufficient(ResourceName::Memory).resolvable_by_preemption());
    assert!(!FilterReason::NodeAffinityMismatch.resolvable_by_preemption());
}
