//! The topology benchmark's workload: a GPU fleet of blocks of racks, a mixed stream of
//! gangs (a third required-rack, a third preferred-block, a third unconstrained), placed
//! to saturation and then under churn, by gangway's engine (through a shard ledger, as a
//! shard leader places) or by a Kueue-like best-fit baseline written here for comparison.
//!
//! Owns [`run`] and its [`TopologyReport`]: how many preferred gangs landed in one block
//! against how many could have (a reference check of every block's room at that moment),
//! required gangs spanning racks (never, for either), and the GPUs stranded at saturation
//! in racks that can no longer host the stream's most common gang. Deterministic (a seeded
//! xorshift stream, no clock): the caller times runs and compares them. Called by
//! `gangway bench topology` and its tests.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::engine::placement::{GangPlacement, Placer};
use crate::engine::profile::Profile;
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReleaseTarget, TxnId};
use crate::ledger::shard::ShardLedger;
use crate::model::gang::{Gang, GangMode, Member};
use crate::model::node::{Node, LABEL_HOSTNAME};
use crate::model::pod::PodSpec;
use crate::model::resources::Resources;
use crate::model::topology::{TopologyConstraint, TopologyHierarchy};

/// Blocks in the fleet.
pub const BLOCKS: usize = 4;
/// Racks per block.
pub const RACKS_PER_BLOCK: usize = 8;
/// Nodes per rack.
pub const NODES_PER_RACK: usize = 16;
/// GPUs per node.
pub const GPUS_PER_NODE: u64 = 8;
/// The block label.
pub const BLOCK_LABEL: &str = "bench.gangway.io/block";
/// The rack label.
pub const RACK_LABEL: &str = "bench.gangway.io/rack";
/// The GPU resource.
const GPU: &str = "nvidia.com/gpu";
/// Gangs in a row that fail before the fleet counts as saturated.
const SATURATED_AFTER_FAILURES: usize = 16;
/// The most common gang of the stream: GPUs and GPUs per pod (stranding is judged by it).
const COMMON_GANG: (u64, u64) = (16, 4);

/// What a gang asks of the topology in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Every pod in one rack.
    RequiredRack,
    /// As few blocks as possible.
    PreferredBlock,
    /// Anywhere.
    Free,
}

/// One gang of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamGang {
    /// GPUs in all.
    pub gpus: u64,
    /// GPUs per pod.
    pub pod_gpus: u64,
    /// Its constraint.
    pub kind: Kind,
}

impl StreamGang {
    /// Pods in the gang.
    pub fn pods(&self) -> u64 {
        self.gpus / self.pod_gpus
    }
}

/// Who places the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// gangway's engine, with the constraints.
    Gangway,
    /// gangway's engine, every constraint dropped (the unconstrained rate).
    GangwayUnconstrained,
    /// The Kueue-like best fit of this module.
    BestFit,
}

/// What one run found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyReport {
    /// Gangs tried.
    pub gangs_tried: u64,
    /// Gangs placed.
    pub gangs_placed: u64,
    /// Pods placed.
    pub pods_placed: u64,
    /// Preferred-block gangs placed.
    pub preferred_placed: u64,
    /// Of those, placed inside one block.
    pub preferred_in_one_block: u64,
    /// Of those, ones a single block could have held when they were placed (reference).
    pub preferred_one_block_possible: u64,
    /// Required-rack gangs placed.
    pub required_placed: u64,
    /// Of those, spanning more than one rack (a violation).
    pub required_spanning: u64,
    /// GPUs free at saturation.
    pub free_gpus_at_saturation: u64,
    /// Of those, in racks that cannot host the most common gang.
    pub stranded_gpus_at_saturation: u64,
    /// Churn rounds that ended in a failed gang (where the next two are measured).
    pub churn_failures: u64,
    /// GPUs free when a churn round's gang failed, added over those rounds.
    pub churn_free_gpus: u64,
    /// Of those, in racks that could not host the most common gang, added up.
    pub churn_stranded_gpus: u64,
    /// GPUs in the fleet.
    pub fleet_gpus: u64,
}

/// The fleet: `BLOCKS` × `RACKS_PER_BLOCK` × `NODES_PER_RACK` nodes of `GPUS_PER_NODE`.
pub fn fleet() -> Vec<Node> {
    let mut nodes = Vec::new();
    for b in 0..BLOCKS {
        for r in 0..RACKS_PER_BLOCK {
            for n in 0..NODES_PER_RACK {
                let name = format!("b{b}-r{r:02}-n{n:02}");
                let mut node = Node::new(
                    name.clone(),
                    Resources {
                        cpu_milli: 128_000,
                        memory_bytes: 1 << 40,
                        pods: 110,
                        ephemeral_storage_bytes: 1 << 40,
                        extended: [(GPU.to_string(), GPUS_PER_NODE)].into(),
                    },
                );
                node.labels.insert(LABEL_HOSTNAME.into(), name.into());
                node.labels
                    .insert(BLOCK_LABEL.into(), format!("b{b}").into());
                node.labels
                    .insert(RACK_LABEL.into(), format!("b{b}-r{r:02}").into());
                nodes.push(node);
            }
        }
    }
    nodes
}

/// A seeded stream of `count` gangs: 8–256 GPUs (16 most often), pods of 4 GPUs below 64
/// and of 8 from 64 up, kinds in turn (a gang larger than a rack is never required-rack).
pub fn stream(seed: u64, count: usize) -> Vec<StreamGang> {
    let mut state = seed.max(1);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    const SIZES: [(u64, u64); 6] = [(8, 20), (16, 30), (32, 20), (64, 15), (128, 10), (256, 5)];
    let total: u64 = SIZES.iter().map(|(_, w)| w).sum();
    (0..count)
        .map(|i| {
            let mut pick = next() % total;
            let gpus = SIZES
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map_or(16, |(g, _)| *g);
            let pod_gpus = if gpus >= 64 { 8 } else { 4 };
            let rack_gpus = NODES_PER_RACK as u64 * GPUS_PER_NODE;
            let kind = match i % 3 {
                0 if gpus <= rack_gpus => Kind::RequiredRack,
                0 | 1 => Kind::PreferredBlock,
                _ => Kind::Free,
            };
            StreamGang {
                gpus,
                pod_gpus,
                kind,
            }
        })
        .collect()
}

/// The profile gangway places with: default scores, the block → rack → host hierarchy.
pub fn profile() -> Profile {
    Profile {
        gang_topology_key: None,
        topologies: vec![TopologyHierarchy {
            name: "bench".into(),
            levels: vec![BLOCK_LABEL.into(), RACK_LABEL.into(), LABEL_HOSTNAME.into()],
        }],
        ..Profile::default()
    }
}

/// Free GPUs per node, in fleet order, with each node's block and rack.
struct Room {
    free: Vec<u64>,
    block: Vec<String>,
    rack: Vec<String>,
    index: BTreeMap<String, usize>,
}

impl Room {
    fn new(nodes: &[Node]) -> Self {
        let label = |n: &Node, k: &str| n.label(k).unwrap_or("").to_string();
        Self {
            free: nodes.iter().map(|_| GPUS_PER_NODE).collect(),
            block: nodes.iter().map(|n| label(n, BLOCK_LABEL)).collect(),
            rack: nodes.iter().map(|n| label(n, RACK_LABEL)).collect(),
            index: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), i))
                .collect(),
        }
    }

    /// Pods of `pod_gpus` each domain (by `of`) could take.
    fn capacity<'r>(&self, of: &'r [String], pod_gpus: u64) -> BTreeMap<&'r str, u64> {
        let mut out: BTreeMap<&str, u64> = BTreeMap::new();
        for (i, free) in self.free.iter().enumerate() {
            *out.entry(of[i].as_str()).or_default() += free / pod_gpus;
        }
        out
    }

    fn total_free(&self) -> u64 {
        self.free.iter().sum()
    }

    /// Free GPUs in racks that cannot take the most common gang.
    fn stranded(&self) -> u64 {
        let (gpus, pod_gpus) = COMMON_GANG;
        let pods = gpus / pod_gpus;
        let capacity = self.capacity(&self.rack, pod_gpus);
        let mut free_in: BTreeMap<&str, u64> = BTreeMap::new();
        for (i, free) in self.free.iter().enumerate() {
            *free_in.entry(self.rack[i].as_str()).or_default() += free;
        }
        free_in
            .into_iter()
            .filter(|(rack, _)| capacity.get(rack).copied().unwrap_or(0) < pods)
            .map(|(_, free)| free)
            .sum()
    }
}

/// One run's state: the ledger (gangway) or only the room (best fit), and the counters.
struct Run {
    placement: Placement,
    ledger: ShardLedger,
    placer: Placer,
    profile: Profile,
    room: Room,
    clock_ms: u64,
    next_txn: u64,
    report: TopologyReport,
    /// Placed gangs, oldest first: their transaction and (node, GPUs) pairs.
    placed: VecDeque<(TxnId, Vec<(usize, u64)>)>,
}

impl Run {
    fn new(placement: Placement) -> Self {
        let nodes = fleet();
        let mut run = Self {
            placement,
            ledger: ShardLedger::new(),
            placer: Placer::new(),
            profile: profile(),
            room: Room::new(&nodes),
            clock_ms: 0,
            next_txn: 1,
            report: TopologyReport {
                fleet_gpus: nodes.len() as u64 * GPUS_PER_NODE,
                ..TopologyReport::default()
            },
            placed: VecDeque::new(),
        };
        if placement != Placement::BestFit {
            for node in nodes {
                run.apply(LedgerOp::RegisterNode { node });
            }
        }
        run
    }

    fn apply(&mut self, op: LedgerOp) -> LedgerReply {
        self.clock_ms += 1;
        self.ledger.apply(&LedgerCommand::new(self.clock_ms, op))
    }

    /// Tries one gang; whether it was placed.
    fn place(&mut self, index: usize, g: &StreamGang) -> bool {
        self.report.gangs_tried += 1;
        let possible = g.kind == Kind::PreferredBlock
            && self
                .room
                .capacity(&self.room.block, g.pod_gpus)
                .values()
                .any(|c| *c >= g.pods());
        let nodes = match self.placement {
            Placement::BestFit => best_fit(&self.room, g),
            _ => self.place_with_engine(index, g),
        };
        let Some(nodes) = nodes else {
            return false;
        };
        let txn = TxnId(self.next_txn);
        self.next_txn += 1;
        for (n, gpus) in &nodes {
            self.room.free[*n] -= gpus;
        }
        let blocks: BTreeSet<&str> = nodes
            .iter()
            .map(|(n, _)| self.room.block[*n].as_str())
            .collect();
        let racks: BTreeSet<&str> = nodes
            .iter()
            .map(|(n, _)| self.room.rack[*n].as_str())
            .collect();
        let r = &mut self.report;
        r.gangs_placed += 1;
        r.pods_placed += g.pods();
        match g.kind {
            Kind::PreferredBlock => {
                r.preferred_placed += 1;
                r.preferred_in_one_block += u64::from(blocks.len() == 1);
                r.preferred_one_block_possible += u64::from(possible);
            }
            Kind::RequiredRack => {
                r.required_placed += 1;
                r.required_spanning += u64::from(racks.len() > 1);
            }
            Kind::Free => {}
        }
        self.placed.push_back((txn, nodes));
        true
    }

    fn place_with_engine(&mut self, index: usize, g: &StreamGang) -> Option<Vec<(usize, u64)>> {
        let topology = match (self.placement, g.kind) {
            (Placement::Gangway, Kind::RequiredRack) => TopologyConstraint {
                required: Some(RACK_LABEL.into()),
                ..TopologyConstraint::default()
            },
            (Placement::Gangway, Kind::PreferredBlock) => TopologyConstraint {
                preferred: Some(BLOCK_LABEL.into()),
                ..TopologyConstraint::default()
            },
            _ => TopologyConstraint::default(),
        };
        let gang = gang(index, g, topology);
        let plan: GangPlacement = self
            .placer
            .place_gang(&self.ledger, &gang, &self.profile, &[]);
        if !plan.is_complete() {
            return None;
        }
        let nodes: Vec<(usize, u64)> = plan
            .assignments
            .iter()
            .filter_map(|a| self.room.index.get(&a.node).map(|n| (*n, g.pod_gpus)))
            .collect();
        let txn_id = TxnId(self.next_txn);
        let reply = self.apply(LedgerOp::ReserveAndCommit {
            txn_id,
            members: plan.assignments,
            network: Vec::new(),
        });
        matches!(reply, LedgerReply::Committed { .. }).then_some(nodes)
    }

    /// Releases the oldest placed gang.
    fn release_oldest(&mut self) {
        let Some((txn, nodes)) = self.placed.pop_front() else {
            return;
        };
        for (n, gpus) in nodes {
            self.room.free[n] += gpus;
        }
        if self.placement != Placement::BestFit {
            self.apply(LedgerOp::Release {
                target: ReleaseTarget::Txn(txn),
            });
        }
    }
}

fn gang(index: usize, g: &StreamGang, topology: TopologyConstraint) -> Gang {
    let pods = u32::try_from(g.pods()).unwrap_or(u32::MAX);
    let spec = PodSpec {
        requests: Resources {
            cpu_milli: 1_000,
            memory_bytes: 1 << 30,
            extended: [(GPU.to_string(), g.pod_gpus)].into(),
            ..Resources::zero()
        },
        ..PodSpec::default()
    };
    Gang {
        name: format!("gang-{index}"),
        namespace: "bench".into(),
        min_member: pods,
        total_number: pods,
        mode: GangMode::Strict,
        wait_time_ms: 0,
        priority: 0,
        creation_order: index as u64,
        members: (0..pods)
            .map(|m| Member {
                name: format!("worker-{m}"),
                spec: spec.clone(),
                uid: None,
                binding: Default::default(),
                pod_selector: Default::default(),
            })
            .collect(),
        topology,
    }
}

/// The Kueue-like baseline: best fit by free GPUs at each level. A required rack: the
/// rack with least room that holds the gang; a preferred block: the block with least room
/// that holds it, inside it the fewest racks (largest first), else the fewest blocks;
/// unconstrained: emptiest nodes first (kube-scheduler's LeastAllocated). Within the
/// chosen domains, fullest nodes first.
fn best_fit(room: &Room, g: &StreamGang) -> Option<Vec<(usize, u64)>> {
    let pods = g.pods();
    let nodes_in = |domains: &BTreeSet<&str>, of: &[String]| -> Vec<usize> {
        (0..room.free.len())
            .filter(|n| domains.contains(of[*n].as_str()))
            .collect()
    };
    let chosen: Vec<usize> = match g.kind {
        Kind::RequiredRack => {
            let capacity = room.capacity(&room.rack, g.pod_gpus);
            let rack = tightest(&capacity, pods)?;
            nodes_in(&BTreeSet::from([rack]), &room.rack)
        }
        Kind::PreferredBlock => {
            let capacity = room.capacity(&room.block, g.pod_gpus);
            match tightest(&capacity, pods) {
                Some(block) => {
                    let inside = nodes_in(&BTreeSet::from([block]), &room.block);
                    let mut racks: BTreeMap<&str, u64> = BTreeMap::new();
                    for &n in &inside {
                        *racks.entry(room.rack[n].as_str()).or_default() +=
                            room.free[n] / g.pod_gpus;
                    }
                    let picked = largest_first(&racks, pods)?;
                    nodes_in(&picked, &room.rack)
                }
                None => {
                    let picked = largest_first(&capacity, pods)?;
                    nodes_in(&picked, &room.block)
                }
            }
        }
        Kind::Free => (0..room.free.len()).collect(),
    };
    let mut order = chosen;
    match g.kind {
        Kind::Free => order.sort_by_key(|n| (std::cmp::Reverse(room.free[*n]), *n)),
        _ => order.sort_by_key(|n| (room.free[*n], *n)),
    }
    let mut out = Vec::new();
    let mut left = pods;
    for n in order {
        let mut free = room.free[n];
        while left > 0 && free >= g.pod_gpus {
            out.push((n, g.pod_gpus));
            free -= g.pod_gpus;
            left -= 1;
        }
    }
    (left == 0).then_some(out)
}

/// The domain with least capacity that still holds `pods`.
fn tightest<'a>(capacity: &BTreeMap<&'a str, u64>, pods: u64) -> Option<&'a str> {
    capacity
        .iter()
        .filter(|(_, c)| **c >= pods)
        .min_by_key(|(d, c)| (**c, **d))
        .map(|(d, _)| *d)
}

/// The fewest domains holding `pods`: largest first, then the tightest that completes.
fn largest_first<'a>(capacity: &BTreeMap<&'a str, u64>, pods: u64) -> Option<BTreeSet<&'a str>> {
    let mut order: Vec<(&str, u64)> = capacity.iter().map(|(d, c)| (*d, *c)).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut picked = BTreeSet::new();
    let mut left = pods;
    while left > 0 {
        let rest: BTreeMap<&str, u64> = order
            .iter()
            .filter(|(d, _)| !picked.contains(d))
            .map(|(d, c)| (*d, *c))
            .collect();
        if let Some(last) = tightest(&rest, left) {
            picked.insert(last);
            return Some(picked);
        }
        let (d, c) = order.iter().find(|(d, c)| !picked.contains(d) && *c > 0)?;
        picked.insert(*d);
        left = left.saturating_sub(*c);
    }
    Some(picked)
}

/// Places `stream` with `placement`: in order until [`SATURATED_AFTER_FAILURES`] gangs
/// in a row fail (saturation), then `churn` rounds of releasing the oldest gang and
/// trying the stream's next ones until one fails; free and stranded GPUs are measured at
/// saturation and at each churn round's failure.
pub fn run(placement: Placement, stream: &[StreamGang], churn: usize) -> TopologyReport {
    let mut run = Run::new(placement);
    let mut next = 0;
    let mut failures = 0;
    while next < stream.len() && failures < SATURATED_AFTER_FAILURES {
        if run.place(next, &stream[next]) {
            failures = 0;
        } else {
            failures += 1;
        }
        next += 1;
    }
    run.report.free_gpus_at_saturation = run.room.total_free();
    run.report.stranded_gpus_at_saturation = run.room.stranded();
    for _ in 0..churn {
        run.release_oldest();
        while next < stream.len() {
            let placed = run.place(next, &stream[next]);
            next += 1;
            if !placed {
                run.report.churn_failures += 1;
                run.report.churn_free_gpus += run.room.total_free();
                run.report.churn_stranded_gpus += run.room.stranded();
                break;
            }
        }
    }
    run.report
}

#[cfg(test)]
#[path = "topology_bench_tests.rs"]
mod tests;
