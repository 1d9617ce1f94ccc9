//! Topology-aware placement against a brute-force reference on small worlds, and the
//! cases the reference does not judge (reasons, batches, locality).

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::filter::FilterReason;
use crate::engine::placement::{place_gang, GangPlacement, GangTopologies, MemberRef, Placer};
use crate::engine::profile::Profile;
use crate::ledger::command::{LedgerCommand, LedgerOp};
use crate::ledger::shard::ShardLedger;
use crate::model::gang::{Gang, GangMode, Member};
use crate::model::node::{Node, LABEL_HOSTNAME};
use crate::model::pod::PodSpec;
use crate::model::resources::Resources;
use crate::model::topology::{TopologyConstraint, TopologyHierarchy, TopologySlice};

const BLOCK: &str = "example.com/block";
const RACK: &str = "example.com/rack";

/// A node of `cpu_milli` in `block`/`rack` (rack values are unique over blocks).
fn node(name: &str, block: &str, rack: &str, cpu_milli: u64) -> Node {
    let mut n = crate::fixtures::node_with(name, cpu_milli, 64 << 30, 110);
    n.labels.insert(LABEL_HOSTNAME.into(), name.into());
    n.labels.insert(BLOCK.into(), block.into());
    n.labels.insert(RACK.into(), rack.into());
    n
}

fn ledger(nodes: &[Node]) -> ShardLedger {
    let mut ledger = ShardLedger::new();
    for n in nodes {
        ledger.apply(&LedgerCommand::new(
            1,
            LedgerOp::RegisterNode { node: n.clone() },
        ));
    }
    ledger
}

fn profile() -> Profile {
    Profile {
        topologies: vec![TopologyHierarchy {
            name: "net".into(),
            levels: vec![BLOCK.into(), RACK.into(), LABEL_HOSTNAME.into()],
        }],
        gang_topology_key: None,
        ..Profile::default()
    }
}

fn cpu(cpu_milli: u64) -> PodSpec {
    PodSpec {
        requests: Resources {
            cpu_milli,
            ..Resources::zero()
        },
        ..PodSpec::default()
    }
}

fn gang(name: &str, members: usize, cpu_milli: u64, topology: TopologyConstraint) -> Gang {
    let n = members as u32;
    Gang {
        name: name.into(),
        namespace: "ns".into(),
        min_member: n,
        total_number: n,
        mode: GangMode::Strict,
        wait_time_ms: 1000,
        priority: 0,
        creation_order: 0,
        members: (0..members)
            .map(|i| Member {
                name: format!("m-{i}"),
                spec: cpu(cpu_milli),
                uid: None,
                binding: Default::default(),
                pod_selector: Default::default(),
            })
            .collect(),
        topology,
    }
}

fn required(key: &str) -> TopologyConstraint {
    TopologyConstraint {
        required: Some(key.into()),
        ..TopologyConstraint::default()
    }
}

fn preferred(key: &str) -> TopologyConstraint {
    TopologyConstraint {
        preferred: Some(key.into()),
        ..TopologyConstraint::default()
    }
}

fn sliced(key: &str, size: u32) -> TopologyConstraint {
    TopologyConstraint {
        slice: Some(TopologySlice {
            key: key.into(),
            size,
        }),
        ..TopologyConstraint::default()
    }
}

/// The label value of `key` on each placed member's node, in member order.
fn domains_used(nodes: &[Node], placement: &GangPlacement, key: &str) -> Vec<String> {
    let by_name: BTreeMap<&str, &Node> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    placement
        .assignments
        .iter()
        .map(|a| {
            by_name
                .get(a.node.as_str())
                .and_then(|n| n.label(key))
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn distinct(values: &[String]) -> usize {
    values.iter().collect::<BTreeSet<_>>().len()
}

#[test]
fn a_required_rack_takes_the_smallest_rack_that_holds_the_gang() {
    let nodes = [
        node("a1", "b0", "r0", 8000),
        node("a2", "b0", "r0", 8000),
        node("b1", "b0", "r1", 4000),
        node("b2", "b0", "r1", 4000),
        node("c1", "b1", "r2", 2000),
    ];
    let l = ledger(&nodes);
    let g = gang("g", 6, 1000, required(RACK));
    let p = place_gang(&l, &g, &profile(), &[]);
    assert!(p.is_complete(), "{p:?}");
    assert_eq!(distinct(&domains_used(&nodes, &p, RACK)), 1);
    assert_eq!(
        domains_used(&nodes, &p, RACK)[0],
        "r1",
        "best fit: r1 holds 8, r0 16"
    );
    assert_eq!(p.domain.as_ref().map(|d| d.value.as_str()), Some("r1"));
}

#[test]
fn a_required_gang_no_domain_holds_is_refused_naming_the_best_domain() {
    let nodes = [
        node("a1", "b0", "r0", 4000),
        node("b1", "b0", "r1", 12000),
        node("c1", "b1", "r2", 8000),
    ];
    let l = ledger(&nodes);
    let g = gang("g", 16, 1000, required(RACK));
    let p = place_gang(&l, &g, &profile(), &[]);
    assert!(p.assignments.is_empty(), "nothing half-placed: {p:?}");
    assert_eq!(p.unplaced.len(), 16);
    let reason = FilterReason::TopologyDomainTooSmall {
        key: RACK.into(),
        need: 16,
        best: Some("r1".into()),
        holds: 12,
    };
    let diagnosis = &p.unplaced[0].diagnosis;
    assert_eq!(diagnosis.reasons.get(&reason), Some(&3), "{diagnosis}");
    assert!(
        diagnosis
            .to_string()
            .contains("in no example.com/rack that holds 16 members (the best, r1, holds 12)"),
        "{diagnosis}"
    );
    // Without the constraint the same gang spreads over the racks.
    let free = gang("g", 16, 1000, TopologyConstraint::default());
    assert!(place_gang(&l, &free, &profile(), &[]).is_complete());
}

#[test]
fn a_preferred_rack_spreads_over_the_fewest_racks_of_one_block() {
    // b0: racks of 4+4 copies; b1: racks of 6+2+2. A gang of 8 fits no rack; both
    // blocks hold it in two racks; b1's pair (6+2) leaves less to spare than... both
    // need two racks, so the block whose pair is tightest wins.
    let nodes = [
        node("a1", "b0", "r0", 4000),
        node("a2", "b0", "r1", 4000),
        node("b1", "b1", "r2", 6000),
        node("b2", "b1", "r3", 2000),
        node("b3", "b1", "r4", 2000),
    ];
    let l = ledger(&nodes);
    let g = gang("g", 8, 1000, preferred(RACK));
    let p = place_gang(&l, &g, &profile(), &[]);
    assert!(p.is_complete(), "{p:?}");
    assert_eq!(distinct(&domains_used(&nodes, &p, RACK)), 2);
    assert_eq!(distinct(&domains_used(&nodes, &p, BLOCK)), 1, "{p:?}");
}

#[test]
fn slices_each_stay_in_one_rack() {
    let nodes = [
        node("a1", "b0", "r0", 3000),
        node("a2", "b0", "r0", 3000),
        node("b1", "b0", "r1", 4000),
        node("c1", "b0", "r2", 2000),
    ];
    let l = ledger(&nodes);
    let g = gang("g", 8, 1000, sliced(RACK, 4));
    let p = place_gang(&l, &g, &profile(), &[]);
    assert!(p.is_complete(), "{p:?}");
    let racks = domains_used(&nodes, &p, RACK);
    for slice in racks.chunks(4) {
        assert_eq!(distinct(slice), 1, "{racks:?}");
    }
    // A third slice finds no rack with 4 left (r2 holds 2): nothing is placed.
    let g = gang("g", 12, 1000, sliced(RACK, 4));
    let p = place_gang(&l, &g, &profile(), &[]);
    assert!(p.assignments.is_empty(), "{p:?}");
}

#[test]
fn constrained_and_free_gangs_share_one_batch_in_order() {
    let nodes = [node("a1", "b0", "r0", 4000), node("b1", "b0", "r1", 4000)];
    let l = ledger(&nodes);
    let free = gang("free", 2, 1000, TopologyConstraint::default());
    let racked = gang("racked", 4, 1000, required(RACK));
    let keys: Vec<_> = free
        .members
        .iter()
        .map(|m| free.member_key(m))
        .chain(racked.members.iter().map(|m| racked.member_key(m)))
        .collect();
    let specs: Vec<&PodSpec> = free
        .members
        .iter()
        .chain(&racked.members)
        .map(|m| &m.spec)
        .collect();
    let refs: Vec<MemberRef<'_>> = keys
        .iter()
        .zip(specs)
        .map(|(key, spec)| MemberRef { key, spec })
        .collect();
    let topologies: GangTopologies =
        [(("ns".to_string(), "racked".to_string()), required(RACK))].into();
    let p = Placer::new().place_members_with(&l, &refs, &profile(), &[], &topologies);
    assert!(p.is_complete(), "{p:?}");
    let order: Vec<_> = p.assignments.iter().map(|a| a.member.clone()).collect();
    assert_eq!(order, keys, "input order");
    let racked_racks: Vec<String> = domains_used(&nodes, &p, RACK)[2..].to_vec();
    assert_eq!(distinct(&racked_racks), 1, "{p:?}");
}

/// A random world: up to 12 nodes in up to 3 blocks of up to 3 racks.
struct World {
    nodes: Vec<Node>,
    cpu_milli: u64,
}

/// xorshift, so a failing case prints its seed.
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn world(g: &mut Gen) -> World {
    let count = 2 + g.below(11);
    let nodes = (0..count)
        .map(|i| {
            let block = g.below(3);
            let rack = g.below(3);
            node(
                &format!("n{i:02}"),
                &format!("b{block}"),
                &format!("b{block}-r{rack}"),
                500 * (1 + g.below(12)),
            )
        })
        .collect();
    World {
        nodes,
        cpu_milli: 500 * (1 + g.below(4)),
    }
}

/// Copies of the gang's pod each domain of `key` holds (brute force over nodes).
fn capacities(w: &World, key: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for n in &w.nodes {
        let copies = n.allocatable.cpu_milli / w.cpu_milli;
        *out.entry(n.label(key).unwrap_or("").to_string())
            .or_insert(0) += copies;
    }
    out
}

/// The fewest domains whose capacities add up to `need`, over every subset.
fn fewest_by_subsets(capacity: &[u64], need: u64) -> Option<usize> {
    (0u32..1 << capacity.len())
        .filter(|set| {
            let sum: u64 = (0..capacity.len())
                .filter(|i| set & (1 << i) != 0)
                .map(|i| capacity[i])
                .sum();
            sum >= need
        })
        .map(|set| set.count_ones() as usize)
        .min()
}

/// Whether `slices` slices of `size` fit domains of `capacity`, over every assignment.
fn slices_fit(capacity: &[u64], slices: usize, size: u64) -> bool {
    fn go(left: &mut [u64], slices: usize, size: u64) -> bool {
        if slices == 0 {
            return true;
        }
        for d in 0..left.len() {
            if left[d] >= size {
                left[d] -= size;
                let ok = go(left, slices - 1, size);
                left[d] += size;
                if ok {
                    return true;
                }
            }
        }
        false
    }
    go(&mut capacity.to_vec(), slices, size)
}

fn check_required(seed: u64, w: &World, members: usize, key: &str) {
    let l = ledger(&w.nodes);
    let p = place_gang(
        &l,
        &gang("g", members, w.cpu_milli, required(key)),
        &profile(),
        &[],
    );
    let possible = capacities(w, key).values().any(|c| *c >= members as u64);
    assert_eq!(p.is_complete(), possible, "seed {seed}: {p:?}");
    if p.is_complete() {
        assert_eq!(
            distinct(&domains_used(&w.nodes, &p, key)),
            1,
            "seed {seed}: {p:?}"
        );
    } else {
        assert!(p.assignments.is_empty(), "seed {seed}: half-placed {p:?}");
        let named = p.unplaced.iter().all(|u| {
            u.diagnosis.reasons.keys().any(
                |r| matches!(r, FilterReason::TopologyDomainTooSmall { key: k, .. } if k == key),
            )
        });
        assert!(named, "seed {seed}: reason not given {p:?}");
    }
}

fn check_preferred(seed: u64, w: &World, members: usize, key: &str) {
    let l = ledger(&w.nodes);
    let p = place_gang(
        &l,
        &gang("g", members, w.cpu_milli, preferred(key)),
        &profile(),
        &[],
    );
    let capacity: Vec<u64> = capacities(w, key).into_values().collect();
    let least = fewest_by_subsets(&capacity, members as u64);
    assert_eq!(p.is_complete(), least.is_some(), "seed {seed}: {p:?}");
    if let Some(least) = least {
        let used = distinct(&domains_used(&w.nodes, &p, key));
        assert_eq!(
            used, least,
            "seed {seed}: {key} domains used {used}, fewest {least}: {p:?}"
        );
    }
}

fn check_slices(seed: u64, w: &World, slices: usize, size: u32, key: &str) {
    let l = ledger(&w.nodes);
    let members = slices * size as usize;
    let p = place_gang(
        &l,
        &gang("g", members, w.cpu_milli, sliced(key, size)),
        &profile(),
        &[],
    );
    let capacity: Vec<u64> = capacities(w, key).into_values().collect();
    let possible = slices_fit(&capacity, slices, u64::from(size));
    assert_eq!(p.is_complete(), possible, "seed {seed}: {p:?}");
    if p.is_complete() {
        let used = domains_used(&w.nodes, &p, key);
        for slice in used.chunks(size as usize) {
            assert_eq!(distinct(slice), 1, "seed {seed}: a slice spans {slice:?}");
        }
    } else {
        assert!(p.assignments.is_empty(), "seed {seed}: half-placed {p:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn required_gangs_stay_in_one_domain_whenever_one_holds_them(seed in 1u64..u64::MAX) {
        let mut g = Gen(seed);
        let w = world(&mut g);
        let members = 1 + g.below(12) as usize;
        let key = [BLOCK, RACK][g.below(2) as usize];
        check_required(seed, &w, members, key);
    }

    #[test]
    fn preferred_gangs_use_the_fewest_domains_possible(seed in 1u64..u64::MAX) {
        let mut g = Gen(seed);
        let w = world(&mut g);
        let members = 1 + g.below(16) as usize;
        let key = [BLOCK, RACK][g.below(2) as usize];
        check_preferred(seed, &w, members, key);
    }

    #[test]
    fn slices_each_lie_in_one_domain_whenever_they_can(seed in 1u64..u64::MAX) {
        let mut g = Gen(seed);
        let w = world(&mut g);
        let size = 1 + g.below(4) as u32;
        let slices = 1 + g.below(4) as usize;
        let key = [RACK, LABEL_HOSTNAME][g.below(2) as usize];
        check_slices(seed, &w, slices, size, key);
    }
}
