//! Unit tests of `score.rs`.

use super::*;

const FOO: &str = "intel.com/foo";
const MIB: u64 = 1 << 20;

fn res(cpu_milli: u64, memory_bytes: u64) -> Resources {
    Resources {
        cpu_milli,
        memory_bytes,
        ..Resources::zero()
    }
}

fn cpu_mem() -> Vec<(ResourceName, u64)> {
    vec![(ResourceName::Cpu, 1), (ResourceName::Memory, 1)]
}

fn shape(points: &[(u32, u32)]) -> Vec<ShapePoint> {
    points
        .iter()
        .map(|&(utilization, score)| ShapePoint { utilization, score })
        .collect()
}

#[test]
fn least_and_most_allocated() {
    // Kubernetes' documented example: 3000m of 4000m cpu, 5000 of 10000 memory.
    let requested = res(3000, 5000);
    let capacity = res(4000, 10000);
    assert_eq!(least_allocated(&requested, &capacity, &cpu_mem()), 37);
    assert_eq!(most_allocated(&requested, &capacity, &cpu_mem()), 62);
    assert_eq!(
        least_allocated(&res(5000, 5000), &capacity, &cpu_mem()),
        25,
        "over capacity scores 0"
    );
    assert_eq!(
        most_allocated(&res(5000, 10000), &capacity, &cpu_mem()),
        100,
        "capped at capacity"
    );
    let gpu = vec![
        (ResourceName::Extended(FOO.into()), 1),
        (ResourceName::Cpu, 1),
    ];
    assert_eq!(
        least_allocated(&res(2000, 0), &capacity, &gpu),
        50,
        "resources the node lacks are skipped"
    );
    assert_eq!(
        least_allocated(&res(1, 1), &Resources::zero(), &cpu_mem()),
        0
    );
}

#[test]
fn broken_linear_interpolates() {
    let down = shape(&[(0, 10), (100, 0)]);
    assert_eq!(broken_linear(&down, 0), 100);
    assert_eq!(broken_linear(&down, 30), 70);
    assert_eq!(broken_linear(&down, 100), 0);
    let peak = shape(&[(0, 0), (50, 10), (100, 0)]);
    assert_eq!(broken_linear(&peak, 25), 50);
    assert_eq!(broken_linear(&peak, 50), 100);
    assert_eq!(broken_linear(&peak, 75), 50);
    let inner = shape(&[(20, 5), (80, 10)]);
    assert_eq!(
        broken_linear(&inner, 10),
        50,
        "below the first point: its score"
    );
    assert_eq!(broken_linear(&inner, 50), 75);
    assert_eq!(
        broken_linear(&inner, 90),
        100,
        "above the last point: its score"
    );
    assert_eq!(broken_linear(&inner, 33), 60, "integer division truncates");
}

#[test]
fn requested_to_capacity_ratio_matches_the_binpacking_example() {
    // Kubernetes' "resource bin packing" example, scores on the 0..=100 scale.
    let weights = vec![
        (ResourceName::Extended(FOO.into()), 5),
        (ResourceName::Memory, 1),
        (ResourceName::Cpu, 3),
    ];
    let binpack = shape(&[(0, 0), (100, 10)]);
    let mut capacity1 = res(8000, 1024 * MIB);
    capacity1.set(&ResourceName::Extended(FOO.into()), 4);
    let mut requested1 = res(3000, 512 * MIB);
    requested1.set(&ResourceName::Extended(FOO.into()), 3);
    // foo 75, memory 50, cpu 37 → (375 + 50 + 111) / 9 = 59.6 → 60
    assert_eq!(
        requested_to_capacity_ratio(&requested1, &capacity1, &weights, &binpack),
        60
    );
    let mut capacity2 = res(8000, 1024 * MIB);
    capacity2.set(&ResourceName::Extended(FOO.into()), 8);
    let mut requested2 = res(8000, 768 * MIB);
    requested2.set(&ResourceName::Extended(FOO.into()), 4);
    // foo 50, memory 75, cpu 100 → (250 + 75 + 300) / 9 = 69.4 → 69
    assert_eq!(
        requested_to_capacity_ratio(&requested2, &capacity2, &weights, &binpack),
        69
    );
    let over = res(9000, 2048 * MIB);
    assert_eq!(
        requested_to_capacity_ratio(&over, &res(8000, 1024 * MIB), &cpu_mem(), &binpack),
        100,
        "over capacity counts as full utilization"
    );
    assert_eq!(
        requested_to_capacity_ratio(&res(0, 0), &res(8000, 1024 * MIB), &cpu_mem(), &binpack),
        0,
        "zero scores carry no weight"
    );
}

#[test]
fn balanced_allocation_scores() {
    let names = [ResourceName::Cpu, ResourceName::Memory];
    assert_eq!(
        balanced_allocation(&res(3000, 5000), &res(4000, 10000), &names),
        87
    );
    assert_eq!(
        balanced_allocation(&res(2000, 5000), &res(4000, 10000), &names),
        100
    );
    assert_eq!(
        balanced_allocation(&res(8000, 0), &res(4000, 10000), &names),
        50,
        "fractions cap at 1"
    );
    let mut three = res(4000, 0);
    three.set(&ResourceName::Extended(FOO.into()), 2);
    let mut cap3 = res(4000, 10000);
    cap3.set(&ResourceName::Extended(FOO.into()), 4);
    let names3 = [
        ResourceName::Cpu,
        ResourceName::Memory,
        ResourceName::Extended(FOO.into()),
    ];
    // fractions 1, 0, 0.5: mean 0.5, std sqrt(1/6) = 0.408 → 59
    assert_eq!(balanced_allocation(&three, &cap3, &names3), 59);
}

/// The weighted sum computed plugin by plugin over whole vectors, as specified.
fn reference(cluster: &Cluster<'_>, feasible: &[usize], input: &ScoreInput<'_>) -> Vec<u64> {
    let weights = input.profile.resource_weights();
    let names: Vec<ResourceName> = weights.iter().map(|(n, _)| n.clone()).collect();
    let nodes: Vec<(Resources, &crate::model::node::Node)> = feasible
        .iter()
        .filter_map(|&i| {
            let requested = cluster.requested(i).saturating_add(input.footprint);
            Some((requested, cluster.node(i)?))
        })
        .collect();
    let mut totals = vec![0u64; nodes.len()];
    for enabled in &input.profile.score_plugins {
        let scores: Vec<u64> = match enabled.plugin {
            ScorePlugin::LeastAllocated => nodes
                .iter()
                .map(|(r, n)| least_allocated(r, &n.allocatable, &weights))
                .collect(),
            ScorePlugin::MostAllocated => nodes
                .iter()
                .map(|(r, n)| most_allocated(r, &n.allocatable, &weights))
                .collect(),
            ScorePlugin::RequestedToCapacityRatio => nodes
                .iter()
                .map(|(r, n)| {
                    requested_to_capacity_ratio(r, &n.allocatable, &weights, &input.profile.shape)
                })
                .collect(),
            ScorePlugin::BalancedAllocation => nodes
                .iter()
                .map(|(r, n)| balanced_allocation(r, &n.allocatable, &names))
                .collect(),
            ScorePlugin::NodeAffinity => {
                let raw: Vec<u64> = nodes
                    .iter()
                    .map(|(_, n)| preferred_affinity_weight(&input.spec.node_affinity, &n.labels))
                    .collect();
                normalize_by_max(&raw, Direction::Ascending)
            }
            ScorePlugin::TaintToleration => {
                let raw: Vec<u64> = nodes
                    .iter()
                    .map(|(_, n)| {
                        intolerable_prefer_no_schedule(&n.taints, &input.spec.tolerations)
                    })
                    .collect();
                normalize_by_max(&raw, Direction::Descending)
            }
            ScorePlugin::InterPodAffinity => {
                let raw: Vec<i64> = nodes
                    .iter()
                    .map(|(_, n)| input.interpod.preferred_score(n))
                    .collect();
                normalize_min_max(&raw)
            }
            // These templates have no claims: every node scores zero.
            ScorePlugin::DynamicResources => vec![0; nodes.len()],
        };
        for (total, score) in totals.iter_mut().zip(scores) {
            *total = total.saturating_add(score.saturating_mul(u64::from(enabled.weight)));
        }
    }
    totals
}

#[test]
fn prepared_scoring_equals_the_plugin_by_plugin_sum() {
    use crate::engine::interpod::{Counted, InterPodState};
    use crate::engine::profile::{PluginWeight, ResourceWeight};
    use crate::ledger::command::{LedgerCommand, LedgerOp, ReserveMember, TxnId};
    use crate::ledger::shard::ShardLedger;
    use crate::model::gang::MemberKey;
    use crate::model::node::{Node, Taint, TaintEffect};
    use crate::model::pod::{
        footprint_of, LabelSelector, NodeSelectorOperator, NodeSelectorRequirement,
        NodeSelectorTerm, PodAffinityTerm, PodSummary, PreferredSchedulingTerm,
        WeightedPodAffinityTerm,
    };

    let mut ledger = ShardLedger::new();
    for i in 0..12u64 {
        let mut alloc = res(2000 + 1000 * (i % 5), (4 + i) << 30);
        alloc.pods = 20;
        if i % 3 == 0 {
            alloc.set(&ResourceName::Extended(FOO.into()), 4);
        }
        let mut node = Node::new(format!("n{i:02}"), alloc);
        node.labels
            .insert("zone".into(), format!("z{}", i % 3).into());
        if i % 4 == 0 {
            node.labels.insert("disk".into(), "ssd".into());
        }
        if i % 5 == 1 {
            node.taints.push(Taint {
                key: "spot".into(),
                value: String::new(),
                effect: TaintEffect::PreferNoSchedule,
            });
        }
        ledger.apply(&LedgerCommand::new(0, LedgerOp::RegisterNode { node }));
    }
    for i in 0..6u64 {
        let mut pod = PodSummary {
            requests: res(300 * (i + 1), 1 << 30),
            ..PodSummary::default()
        };
        pod.labels
            .insert("app".into(), ["web", "db"][(i % 2) as usize].into());
        ledger.apply(&LedgerCommand::new(
            1,
            LedgerOp::ReserveAndCommit {
                txn_id: TxnId(i),
                members: vec![ReserveMember {
                    member: MemberKey::new("ns", format!("p{i}"), "0"),
                    node: format!("n{:02}", (i * 5) % 12),
                    pod,
                }],
                network: Vec::new(),
            },
        ));
    }
    let cluster = Cluster::build(&ledger, &[]);
    let feasible: Vec<usize> = (0..cluster.len()).collect();

    let plain = PodSpec {
        requests: res(500, 1 << 30),
        ..PodSpec::default()
    };
    let mut rich = plain.clone();
    rich.node_affinity.preferred.push(PreferredSchedulingTerm {
        weight: 30,
        preference: NodeSelectorTerm {
            match_expressions: vec![NodeSelectorRequirement {
                key: "disk".into(),
                operator: NodeSelectorOperator::Exists,
                values: vec![],
            }],
        },
    });
    let mut web = LabelSelector::default();
    web.match_labels.insert("app".into(), "web".into());
    rich.pod_affinity.preferred.push(WeightedPodAffinityTerm {
        weight: 50,
        term: PodAffinityTerm {
            label_selector: Some(web),
            topology_key: "zone".into(),
        },
    });
    rich.requests.set(&ResourceName::Extended(FOO.into()), 1);

    let mut profiles = vec![Profile::default()];
    profiles.push(Profile {
        score_plugins: vec![PluginWeight {
            plugin: ScorePlugin::MostAllocated,
            weight: 4,
        }],
        ..Profile::default()
    });
    let mut p = Profile::default();
    p.score_plugins[0].plugin = ScorePlugin::RequestedToCapacityRatio;
    p.shape = shape(&[(0, 10), (50, 3), (100, 0)]);
    profiles.push(p.clone());
    p.fit_resources.push(ResourceWeight {
        name: FOO.into(),
        weight: 3,
    });
    profiles.push(p);

    for spec in [&plain, &rich] {
        let footprint = footprint_of(&spec.requests);
        let interpod = InterPodState::build(&cluster, spec, |_, _| Counted::Yes);
        for profile in &profiles {
            let input = ScoreInput {
                spec,
                footprint: &footprint,
                interpod: &interpod,
                profile,
            };
            let expected = reference(&cluster, &feasible, &input);
            assert_eq!(score_nodes(&cluster, &feasible, &input), expected);
            assert_eq!(
                score_nodes(&cluster, &feasible[3..7], &input),
                reference(&cluster, &feasible[3..7], &input),
                "normalized over the scored set only"
            );
        }
    }
}

#[test]
fn normalization() {
    assert_eq!(
        normalize_by_max(&[0, 5, 10], Direction::Ascending),
        vec![0, 50, 100]
    );
    assert_eq!(
        normalize_by_max(&[0, 1, 2], Direction::Descending),
        vec![100, 50, 0]
    );
    assert_eq!(
        normalize_by_max(&[0, 0], Direction::Descending),
        vec![100, 100]
    );
    assert_eq!(normalize_by_max(&[0, 0], Direction::Ascending), vec![0, 0]);
    assert_eq!(normalize_min_max(&[-5, 0, 5]), vec![0, 50, 100]);
    assert_eq!(normalize_min_max(&[3, 3]), vec![0, 0]);
}
