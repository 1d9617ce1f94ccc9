//! Benchmark workloads: place many pods or gangs through the engine and a ledger.
//!
//! Owns [`run`] (single pods placed one by one: quote-free placement, Reserve, Commit)
//! and [`run_gangs`] (whole gangs placed as batches, Reserve, Commit), over a synthetic
//! fleet from [`fleet`], and the device workloads: [`run_devices`] (nodes with
//! [`BENCH_GPUS_PER_NODE`] GPUs published as a pool, every pod claiming one GPU through
//! a CEL selector on model and memory, placed one at a time) and [`run_device_gangs`]
//! (GPUs partitioned into MIG-like slices that consume shared counters, gangs whose pods
//! claim two slices each). All go through one [`Placer`] with the default profile and
//! the ledger, as a shard leader places. They do no timing and read no clock: the
//! caller times them and reads the counts in [`BenchReport`]. Deterministic: the same
//! sizes give the same report. Called by benchmark harnesses and tests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::placement::{MemberRef, Placer};
use crate::engine::profile::Profile;
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReserveMember, TxnId};
use crate::ledger::shard::ShardLedger;
use crate::model::claim::{
    AdminAccess, AllocationMode, DeviceRequest, ExactRequest, PodClaim, RequestSpec,
};
use crate::model::device::{
    AttributeValue, CelSelector, CounterConsumption, CounterSet, Device, DeviceCapacity,
    DeviceClass, DeviceQuantity,
};
use crate::model::gang::{Gang, GangMode, Member, MemberKey};
use crate::model::node::{Node, LABEL_HOSTNAME, LABEL_ZONE};
use crate::model::pod::PodSpec;
use crate::model::resources::Resources;

/// Zones the synthetic fleet is spread over.
pub const BENCH_ZONES: usize = 10;
/// How long a benchmark reservation holds, in (synthetic) milliseconds.
const RESERVE_HOLD_MS: u64 = 30_000;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Counts from one benchmark run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Nodes in the fleet.
    pub nodes: u64,
    /// Gangs submitted (single-pod runs count each pod as a gang of one).
    pub gangs_requested: u64,
    /// Gangs fully placed and committed.
    pub gangs_placed: u64,
    /// Pods submitted.
    pub pods_requested: u64,
    /// Pods committed.
    pub pods_placed: u64,
    /// Pods that found no node.
    pub pods_unplaced: u64,
    /// Ledger commands applied.
    pub ledger_commands: u64,
    /// Reservations the ledger refused.
    pub reserve_refusals: u64,
    /// Devices allocated to committed pods.
    #[serde(default)]
    pub devices_allocated: u64,
}

/// GPUs per node in the device workloads.
pub const BENCH_GPUS_PER_NODE: usize = 8;
/// The driver of the device workloads.
pub const BENCH_DRIVER: &str = "gpu.example.com";
/// The device class of the device workloads.
const BENCH_CLASS: &str = "gpu.example.com";

/// A fleet of `count` identical nodes (32 cpu, 128 GiB, 110 pods) over [`BENCH_ZONES`] zones.
pub fn fleet(count: usize) -> Vec<Node> {
    (0..count)
        .map(|i| {
            let name = format!("node-{i:05}");
            let mut node = Node::new(
                name.clone(),
                Resources {
                    cpu_milli: 32_000,
                    memory_bytes: 128 * GIB,
                    pods: 110,
                    ephemeral_storage_bytes: 100 * GIB,
                    ..Resources::zero()
                },
            );
            node.labels.insert(LABEL_HOSTNAME.into(), name.into());
            node.labels.insert(
                LABEL_ZONE.into(),
                format!("zone-{}", i % BENCH_ZONES).into(),
            );
            node
        })
        .collect()
}

/// A basic cpu + memory pod spec; sizes cycle through four shapes.
fn basic_pod(i: usize) -> PodSpec {
    let (cpu_milli, memory_bytes) = match i % 4 {
        0 => (500, GIB),
        1 => (1000, 2 * GIB),
        2 => (2000, 4 * GIB),
        _ => (250, 512 * MIB),
    };
    PodSpec {
        requests: Resources {
            cpu_milli,
            memory_bytes,
            ..Resources::zero()
        },
        ..PodSpec::default()
    }
}

/// A ledger and the counters of one run.
struct Bench {
    ledger: ShardLedger,
    report: BenchReport,
    clock_ms: u64,
    next_txn: u64,
    /// Every command applied, when asked for (`gang_workload`).
    recorded: Option<Vec<LedgerCommand>>,
}

impl Bench {
    fn new(nodes: usize) -> Self {
        Self::build(nodes, None)
    }

    /// A fleet of `nodes` registered, every command recorded from the first when
    /// `recorded` is given.
    fn build(nodes: usize, recorded: Option<Vec<LedgerCommand>>) -> Self {
        let mut bench = Self {
            ledger: ShardLedger::new(),
            report: BenchReport {
                nodes: nodes as u64,
                ..BenchReport::default()
            },
            clock_ms: 0,
            next_txn: 0,
            recorded,
        };
        for node in fleet(nodes) {
            bench.apply(LedgerOp::RegisterNode { node });
        }
        bench
    }

    fn apply(&mut self, op: LedgerOp) -> LedgerReply {
        self.clock_ms += 1;
        self.report.ledger_commands += 1;
        let cmd = LedgerCommand::new(self.clock_ms, op);
        let reply = self.ledger.apply(&cmd);
        if let Some(recorded) = &mut self.recorded {
            recorded.push(cmd);
        }
        reply
    }

    /// Adds the device class and publishes one pool per node from `devices_of(node index)`.
    fn with_devices(
        mut self,
        devices_of: impl Fn(usize) -> (Vec<Device>, Vec<CounterSet>),
    ) -> Self {
        self.apply(LedgerOp::PutDeviceClass {
            class: DeviceClass {
                name: BENCH_CLASS.to_string(),
                selectors: vec![CelSelector::new(format!(
                    "device.driver == \"{BENCH_DRIVER}\""
                ))],
                config: Vec::new(),
                extended_resource_name: None,
            },
        });
        for i in 0..self.report.nodes as usize {
            let (devices, counter_sets) = devices_of(i);
            self.apply(LedgerOp::PublishPool {
                node: format!("node-{i:05}"),
                driver: BENCH_DRIVER.to_string(),
                pool: format!("node-{i:05}"),
                generation: 1,
                devices,
                counter_sets,
            });
        }
        self
    }

    /// Reserves and commits a placement; returns whether it landed.
    fn reserve_and_commit(&mut self, members: Vec<ReserveMember>) -> bool {
        let txn_id = TxnId(self.next_txn);
        self.next_txn += 1;
        let deadline_ms = self.clock_ms + RESERVE_HOLD_MS;
        match self.apply(LedgerOp::Reserve {
            txn_id,
            members,
            deadline_ms,
            network: Vec::new(),
        }) {
            LedgerReply::Reserved { .. } => {
                matches!(
                    self.apply(LedgerOp::Commit { txn_id }),
                    LedgerReply::Committed { .. }
                )
            }
            _ => {
                self.report.reserve_refusals += 1;
                false
            }
        }
    }
}

/// Places `pods` basic pods one by one on a fleet of `nodes`, each through Reserve + Commit.
pub fn run(nodes: usize, pods: usize) -> BenchReport {
    let mut bench = Bench::new(nodes);
    let profile = Profile::default();
    let mut placer = Placer::new();
    for i in 0..pods {
        bench.report.gangs_requested += 1;
        bench.report.pods_requested += 1;
        let key = MemberKey::new("bench", format!("pod-{i}"), "0");
        let spec = basic_pod(i);
        let placement = placer.place_members(
            &bench.ledger,
            &[MemberRef {
                key: &key,
                spec: &spec,
            }],
            &profile,
            &[],
        );
        if placement.is_complete() && bench.reserve_and_commit(placement.assignments) {
            bench.report.gangs_placed += 1;
            bench.report.pods_placed += 1;
        } else {
            bench.report.pods_unplaced += 1;
        }
    }
    bench.report
}

/// A gang of `members` identical 4-cpu, 16 GiB workers.
fn bench_gang(index: usize, members: usize) -> Gang {
    let spec = PodSpec {
        requests: Resources {
            cpu_milli: 4000,
            memory_bytes: 16 * GIB,
            ..Resources::zero()
        },
        ..PodSpec::default()
    };
    let count = u32::try_from(members).unwrap_or(u32::MAX);
    Gang {
        name: format!("gang-{index}"),
        namespace: "bench".to_string(),
        min_member: count,
        total_number: count,
        mode: GangMode::Strict,
        wait_time_ms: RESERVE_HOLD_MS,
        priority: 0,
        creation_order: index as u64,
        members: (0..members)
            .map(|m| Member {
                name: format!("worker-{m}"),
                spec: spec.clone(),
                uid: None,
                binding: Default::default(),
                pod_selector: Default::default(),
            })
            .collect(),
        topology: Default::default(),
    }
}

/// Places `gangs` gangs of `members` workers each on a fleet of `nodes`, each gang as one batch.
pub fn run_gangs(nodes: usize, gangs: usize, members: usize) -> BenchReport {
    place_gangs(Bench::new(nodes), gangs, members).report
}

/// The gang run's ledger at its end, and every command that built it (node
/// registrations, then each gang's Reserve and Commit), for the encoding benchmark.
pub fn gang_workload(
    nodes: usize,
    gangs: usize,
    members: usize,
) -> (ShardLedger, Vec<LedgerCommand>) {
    let bench = place_gangs(Bench::build(nodes, Some(Vec::new())), gangs, members);
    (bench.ledger, bench.recorded.unwrap_or_default())
}

fn place_gangs(mut bench: Bench, gangs: usize, members: usize) -> Bench {
    let profile = Profile::default();
    let mut placer = Placer::new();
    for g in 0..gangs {
        let gang = bench_gang(g, members);
        bench.report.gangs_requested += 1;
        bench.report.pods_requested += members as u64;
        let placement = placer.place_gang(&bench.ledger, &gang, &profile, &[]);
        let placed = placement.assignments.len() as u64;
        if placement.is_complete() && bench.reserve_and_commit(placement.assignments) {
            bench.report.gangs_placed += 1;
            bench.report.pods_placed += placed;
        } else {
            bench.report.pods_unplaced += members as u64;
        }
    }
    bench
}

/// The 8 GPUs of node `node`: model `a100`, 40 or 80 GiB of memory alternating.
pub fn bench_gpus(node: usize) -> Vec<Device> {
    (0..BENCH_GPUS_PER_NODE)
        .map(|g| {
            let mut d = Device::new(format!("gpu-{g}"));
            d.attributes
                .insert("model".into(), AttributeValue::String("a100".into()));
            d.attributes.insert(
                "index".into(),
                AttributeValue::Int(i64::try_from(node * BENCH_GPUS_PER_NODE + g).unwrap_or(0)),
            );
            let memory = if g % 2 == 0 { 40 } else { 80 };
            d.capacity.insert(
                "memory".into(),
                DeviceCapacity::fixed(DeviceQuantity::from_units(memory * GIB)),
            );
            d
        })
        .collect()
}

/// A pod claim of `count` devices of the bench class matching `selector`.
fn claim_of(count: u32, selector: &str) -> PodClaim {
    PodClaim {
        name: "gpus".into(),
        requests: vec![DeviceRequest {
            name: "gpu".into(),
            spec: RequestSpec::Exactly(ExactRequest {
                device_class_name: BENCH_CLASS.into(),
                selectors: vec![CelSelector::new(selector)],
                allocation_mode: AllocationMode::ExactCount(count),
                admin_access: AdminAccess::Disabled,
                tolerations: Vec::new(),
                capacity: BTreeMap::new(),
            }),
        }],
        constraints: Vec::new(),
        config: Vec::new(),
    }
}

/// A 1-cpu, 4 GiB pod claiming one A100 with at least 40 GiB.
fn gpu_pod() -> PodSpec {
    PodSpec {
        requests: Resources {
            cpu_milli: 1000,
            memory_bytes: 4 * GIB,
            ..Resources::zero()
        },
        claims: vec![claim_of(
            1,
            r#"device.attributes["gpu.example.com"].model == "a100" && device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
        )],
        ..PodSpec::default()
    }
}

/// Places `pods` GPU pods one by one on `nodes` nodes of [`BENCH_GPUS_PER_NODE`] GPUs,
/// each through Reserve + Commit; every pod claims one GPU by a CEL selector.
pub fn run_devices(nodes: usize, pods: usize) -> BenchReport {
    let mut bench = Bench::new(nodes).with_devices(|i| (bench_gpus(i), Vec::new()));
    let profile = Profile::default();
    let mut placer = Placer::new();
    let spec = gpu_pod();
    for i in 0..pods {
        bench.report.gangs_requested += 1;
        bench.report.pods_requested += 1;
        let key = MemberKey::new("bench", format!("pod-{i}"), "0");
        let placement = placer.place_members(
            &bench.ledger,
            &[MemberRef {
                key: &key,
                spec: &spec,
            }],
            &profile,
            &[],
        );
        let devices: u64 = placement
            .assignments
            .iter()
            .map(|a| a.pod.devices.len() as u64)
            .sum();
        if placement.is_complete() && bench.reserve_and_commit(placement.assignments) {
            bench.report.gangs_placed += 1;
            bench.report.pods_placed += 1;
            bench.report.devices_allocated += devices;
        } else {
            bench.report.pods_unplaced += 1;
        }
    }
    bench.report
}

/// MIG-like profiles of one GPU: (name, compute slices, memory GiB, how many).
const MIG_PROFILES: [(&str, u64, u64, usize); 4] = [
    ("1g.5gb", 1, 5, 7),
    ("2g.10gb", 2, 10, 3),
    ("3g.20gb", 3, 20, 2),
    ("7g.40gb", 7, 40, 1),
];

/// The 8 GPUs of a node partitioned into MIG-like slices: per GPU a counter set (40 GiB
/// of memory, 7 compute slices) and 13 partition devices consuming from it.
pub fn bench_mig_pool() -> (Vec<Device>, Vec<CounterSet>) {
    let mut devices = Vec::new();
    let mut sets = Vec::new();
    for g in 0..BENCH_GPUS_PER_NODE {
        let set = format!("gpu-{g}");
        sets.push(CounterSet {
            name: set.clone(),
            counters: BTreeMap::from([
                ("memory".to_string(), DeviceQuantity::from_units(40 * GIB)),
                ("slices".to_string(), DeviceQuantity::from_units(7)),
            ]),
        });
        for (profile, slices, memory, count) in MIG_PROFILES {
            for k in 0..count {
                let mut d = Device::new(format!("gpu-{g}-{}-{k}", profile.replace('.', "-")));
                d.attributes
                    .insert("profile".into(), AttributeValue::String(profile.into()));
                d.attributes
                    .insert("parent".into(), AttributeValue::String(set.clone().into()));
                d.push_counter_use(CounterConsumption {
                    counter_set: set.clone(),
                    counters: BTreeMap::from([
                        (
                            "memory".to_string(),
                            DeviceQuantity::from_units(memory * GIB),
                        ),
                        ("slices".to_string(), DeviceQuantity::from_units(slices)),
                    ]),
                });
                devices.push(d);
            }
        }
    }
    (devices, sets)
}

/// A gang of `members` workers, each claiming two 1g.5gb slices.
fn mig_gang(index: usize, members: usize) -> Gang {
    let spec = PodSpec {
        requests: Resources {
            cpu_milli: 500,
            memory_bytes: 2 * GIB,
            ..Resources::zero()
        },
        claims: vec![claim_of(
            2,
            r#"device.attributes["gpu.example.com"].profile == "1g.5gb""#,
        )],
        ..PodSpec::default()
    };
    let mut gang = bench_gang(index, members);
    for member in &mut gang.members {
        member.spec = spec.clone();
    }
    gang
}

/// Places `gangs` gangs of `members` pods (two MIG slices each) on `nodes` nodes of
/// partitioned GPUs, each gang as one batch through Reserve + Commit.
pub fn run_device_gangs(nodes: usize, gangs: usize, members: usize) -> BenchReport {
    let mut bench = Bench::new(nodes).with_devices(|_| bench_mig_pool());
    let profile = Profile::default();
    let mut placer = Placer::new();
    for g in 0..gangs {
        let gang = mig_gang(g, members);
        bench.report.gangs_requested += 1;
        bench.report.pods_requested += members as u64;
        let placement = placer.place_gang(&bench.ledger, &gang, &profile, &[]);
        let placed = placement.assignments.len() as u64;
        let devices: u64 = placement
            .assignments
            .iter()
            .map(|a| a.pod.devices.len() as u64)
            .sum();
        if placement.is_complete() && bench.reserve_and_commit(placement.assignments) {
            bench.report.gangs_placed += 1;
            bench.report.pods_placed += placed;
            bench.report.devices_allocated += devices;
        } else {
            bench.report.pods_unplaced += members as u64;
        }
    }
    bench.report
}

#[cfg(test)]
#[path = "bench_tests.rs"]
mod tests;
