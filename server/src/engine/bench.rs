//! Benchmark workloads: place many pods or gangs through the engine and a ledger.
//!
//! Owns [`run`] (single pods placed one by one: quote-free placement, Reserve, Commit)
//! and [`run_gangs`] (whole gangs placed as batches, Reserve, Commit), over a synthetic
//! fleet from [`fleet`], both through one [`Placer`] with the default profile, as a
//! shard leader places. They do no timing and read no clock: the caller times them and
//! reads the counts in [`BenchReport`]. Deterministic: the same sizes give the same
//! report. Called by benchmark harnesses and tests.

use serde::{Deserialize, Serialize};

use crate::engine::placement::{MemberRef, Placer};
use crate::engine::profile::Profile;
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReserveMember, TxnId};
use crate::ledger::shard::ShardLedger;
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
}

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
            node.labels.insert(LABEL_HOSTNAME.to_string(), name);
            node.labels
                .insert(LABEL_ZONE.to_string(), format!("zone-{}", i % BENCH_ZONES));
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
}

impl Bench {
    fn new(nodes: usize) -> Self {
        let mut bench = Self {
            ledger: ShardLedger::new(),
            report: BenchReport {
                nodes: nodes as u64,
                ..BenchReport::default()
            },
            clock_ms: 0,
            next_txn: 0,
        };
        for node in fleet(nodes) {
            bench.apply(LedgerOp::RegisterNode { node });
        }
        bench
    }

    fn apply(&mut self, op: LedgerOp) -> LedgerReply {
        self.clock_ms += 1;
        self.report.ledger_commands += 1;
        self.ledger.apply(&LedgerCommand::new(self.clock_ms, op))
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
            })
            .collect(),
    }
}

/// Places `gangs` gangs of `members` workers each on a fleet of `nodes`, each gang as one batch.
pub fn run_gangs(nodes: usize, gangs: usize, members: usize) -> BenchReport {
    let mut bench = Bench::new(nodes);
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
    bench.report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_pods_fill_the_fleet_until_it_is_full() {
        let report = run(20, 300);
        assert_eq!(report.pods_requested, 300);
        assert_eq!(report.pods_placed, 300);
        assert_eq!(report.reserve_refusals, 0);
        assert_eq!(report.ledger_commands, 20 + 2 * 300);
        // 2 nodes × 32 cpu hold 64 cpu: average pod 937.5m → about 68 pods, then nothing fits.
        let full = run(2, 100);
        assert_eq!(full.pods_placed + full.pods_unplaced, 100);
        assert!(full.pods_placed >= 60 && full.pods_placed < 100, "{full:?}");
        assert_eq!(run(20, 300), report, "deterministic");
    }

    #[test]
    fn gangs_are_packed_per_zone() {
        // 8 workers per node, 16 workers per gang: 2 nodes per gang.
        let report = run_gangs(40, 6, 16);
        assert_eq!(report.gangs_placed, 6);
        assert_eq!(report.pods_placed, 96);
        let too_many = run_gangs(4, 3, 16);
        assert_eq!(too_many.gangs_placed, 2);
        assert_eq!(too_many.pods_unplaced, 16);
    }
}
