//! `gangway bench engine`: the placement engine and shard ledger on one core,
//! no Raft: single basic pods placed one at a time (engine, then reserve and
//! commit in the ledger), whole gangs placed as batches, and the memory a
//! registered node costs. The workloads are `engine::bench`; this file times
//! them and measures memory. Memory is measured in a child process of the same
//! binary (`--memory-probe`): the 100,000 nodes it registers and frees would
//! otherwise leave the placement runs a fragmented heap, which made them about
//! half as fast as in a process that had not measured memory.

use std::time::Instant;

use anyhow::{bail, Context};

use super::rss_bytes;

use gangway_core::engine::bench::{
    bench_gpus, run, run_device_gangs, run_devices, run_gangs, BenchReport, BENCH_DRIVER,
    BENCH_GPUS_PER_NODE,
};
use gangway_core::ledger::{LedgerCommand, LedgerOp, LedgerReply, ShardLedger};
use gangway_core::model::{Node, Resources};

/// Most nodes any part of the benchmark builds.
pub const BENCH_NODES_MAX: usize = 1_000_000;

/// Flags of `gangway bench engine`.
#[derive(Debug, clap::Args)]
pub struct EngineBenchArgs {
    /// Nodes for the single-pod run.
    #[arg(long, default_value_t = 5_000)]
    pub nodes: usize,
    /// Basic cpu + memory pods placed one at a time.
    #[arg(long, default_value_t = 20_000)]
    pub pods: usize,
    /// Nodes for the gang run.
    #[arg(long, default_value_t = 10_000)]
    pub gang_nodes: usize,
    /// Gangs in the gang run.
    #[arg(long, default_value_t = 64)]
    pub gangs: usize,
    /// Members per gang.
    #[arg(long, default_value_t = 128)]
    pub members: usize,
    /// Nodes registered to measure memory per node.
    #[arg(long, default_value_t = 50_000)]
    pub memory_nodes: usize,
    /// Only measure memory per node and print it as two numbers (bytes per node, bytes
    /// per node with GPUs); what the benchmark runs in its child process.
    #[arg(long, hide = true)]
    pub memory_probe: bool,
    /// Run the device workloads instead: GPUs chosen by CEL selectors, and MIG-like slices for gangs.
    #[arg(long)]
    pub devices: bool,
    /// Nodes (8 GPUs each) for the single-pod device run.
    #[arg(long, default_value_t = 500)]
    pub device_nodes: usize,
    /// Pods (one claim for one GPU each) for the single-pod device run.
    #[arg(long, default_value_t = 4_000)]
    pub device_pods: usize,
    /// Nodes (8 GPUs cut into slices) for the device gang run.
    #[arg(long, default_value_t = 2_000)]
    pub slice_nodes: usize,
    /// Gangs of 64 pods with 2 slices each for the device gang run.
    #[arg(long, default_value_t = 200)]
    pub slice_gangs: usize,
}

/// Runs the benchmark and prints a markdown table.
pub fn run_bench(args: EngineBenchArgs) -> anyhow::Result<()> {
    for (flag, n) in [
        ("--nodes", args.nodes),
        ("--gang-nodes", args.gang_nodes),
        ("--memory-nodes", args.memory_nodes),
    ] {
        if n == 0 || n > BENCH_NODES_MAX {
            bail!("{flag}: {n} is not in 1..={BENCH_NODES_MAX}");
        }
    }
    if args.pods == 0 || args.gangs == 0 || args.members == 0 {
        bail!("--pods, --gangs and --members must be >= 1");
    }
    if args.devices {
        return run_device_bench(&args);
    }
    if args.memory_probe {
        return print_memory_probe(args.memory_nodes);
    }
    let memory = memory_in_child(args.memory_nodes)?;
    let started = Instant::now();
    let single = run(args.nodes, args.pods);
    let single_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let gangs = run_gangs(args.gang_nodes, args.gangs, args.members);
    let gangs_s = started.elapsed().as_secs_f64();

    println!("| workload | nodes | placed | seconds | rate |");
    println!("|---|---:|---:|---:|---:|");
    row(
        "single pods (cpu+memory), one at a time",
        &single,
        single_s,
        single.pods_placed as f64 / single_s,
        "pods/s",
    );
    row(
        &format!("gangs of {} members", args.members),
        &gangs,
        gangs_s,
        gangs.gangs_placed as f64 / gangs_s,
        &format!("gangs/s ({:.0} pods/s)", gangs.pods_placed as f64 / gangs_s),
    );
    match memory {
        Some((bytes, gpu_bytes)) => println!(
            "\nmemory per registered node: {bytes:.0} bytes; with {BENCH_GPUS_PER_NODE} GPUs \
             published: {gpu_bytes:.0} bytes (RSS growth over {} nodes)",
            args.memory_nodes
        ),
        _ => {
            println!("\nmemory per registered node: not measurable here (no /proc/self/status)")
        }
    }
    Ok(())
}

/// Members per gang in the device gang run.
pub const SLICE_GANG_MEMBERS: usize = 64;

fn run_device_bench(args: &EngineBenchArgs) -> anyhow::Result<()> {
    for (flag, n) in [
        ("--device-nodes", args.device_nodes),
        ("--slice-nodes", args.slice_nodes),
    ] {
        if n == 0 || n > BENCH_NODES_MAX {
            bail!("{flag}: {n} is not in 1..={BENCH_NODES_MAX}");
        }
    }
    if args.device_pods == 0 || args.slice_gangs == 0 {
        bail!("--device-pods and --slice-gangs must be >= 1");
    }
    let started = Instant::now();
    let single = run_devices(args.device_nodes, args.device_pods);
    let single_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let gangs = run_device_gangs(args.slice_nodes, args.slice_gangs, SLICE_GANG_MEMBERS);
    let gangs_s = started.elapsed().as_secs_f64();
    println!("| workload | nodes | placed | devices | seconds | rate |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| pods with one claim for 1 GPU by CEL (model, memory), one at a time | {} | {} of {} pods | {} | {single_s:.3} | {:.0} pods/s |",
        single.nodes, single.pods_placed, single.pods_requested, single.devices_allocated, single.pods_placed as f64 / single_s
    );
    println!(
        "| gangs of {SLICE_GANG_MEMBERS} pods, 2 MIG-like slices each (setup included) | {} | {} of {} pods | {} | {gangs_s:.3} | {:.0} gangs/s ({:.0} pods/s) |",
        gangs.nodes,
        gangs.pods_placed,
        gangs.pods_requested,
        gangs.devices_allocated,
        gangs.gangs_placed as f64 / gangs_s,
        gangs.pods_placed as f64 / gangs_s
    );
    Ok(())
}

fn row(what: &str, r: &BenchReport, seconds: f64, rate: f64, unit: &str) {
    println!(
        "| {what} | {} | {} of {} pods | {seconds:.3} | {rate:.0} {unit} |",
        r.nodes, r.pods_placed, r.pods_requested
    );
}

/// Measures memory per node and prints it for [`memory_in_child`]; prints nothing where
/// resident memory cannot be read.
fn print_memory_probe(nodes: usize) -> anyhow::Result<()> {
    // Both ledgers stay alive until both are measured, so neither reuses the other's memory.
    let mut kept = Vec::new();
    let per_node = memory_per_node(nodes, false, &mut kept)?;
    let per_gpu_node = memory_per_node(nodes, true, &mut kept)?;
    if let (Some(bytes), Some(gpu_bytes)) = (per_node, per_gpu_node) {
        println!("{bytes:.0} {gpu_bytes:.0}");
    }
    Ok(())
}

/// Bytes per registered node without and with GPUs, measured by this binary in a
/// fresh process (`bench engine --memory-probe`); `None` where it cannot be read.
fn memory_in_child(nodes: usize) -> anyhow::Result<Option<(f64, f64)>> {
    let exe = std::env::current_exe().context("cannot find the gangway binary")?;
    let out = std::process::Command::new(exe)
        .args(["bench", "engine", "--memory-probe", "--memory-nodes"])
        .arg(nodes.to_string())
        .output()
        .context("cannot start the memory probe")?;
    if !out.status.success() {
        bail!(
            "the memory probe failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<f64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("the memory probe printed {text:?}"))?;
    Ok(match figures[..] {
        [bytes, gpu_bytes] => Some((bytes, gpu_bytes)),
        _ => None,
    })
}

/// Bytes of resident memory one registered node adds to a shard ledger.
/// Each node (five labels, cpu/memory/pods/ephemeral storage, and with `gpus` a
/// published pool of the engine bench's 8 GPUs with their attributes) is built
/// inside the measured span, so what the ledger keeps is counted. The ledger goes to
/// `kept`, so the caller decides when its memory is freed.
fn memory_per_node(
    count: usize,
    gpus: bool,
    kept: &mut Vec<ShardLedger>,
) -> anyhow::Result<Option<f64>> {
    let Some(before) = rss_bytes(None) else {
        return Ok(None);
    };
    let mut ledger = ShardLedger::new();
    for i in 0..count {
        let name = format!("node-{i:06}");
        let mut node = Node::new(
            name.clone(),
            Resources {
                cpu_milli: 32_000,
                memory_bytes: 128 << 30,
                pods: 110,
                ephemeral_storage_bytes: 100 << 30,
                ..Resources::zero()
            },
        );
        let labels = [
            ("kubernetes.io/hostname", name),
            ("topology.kubernetes.io/zone", format!("zone-{}", i % 10)),
            ("topology.kubernetes.io/region", "region-1".to_string()),
            ("node.kubernetes.io/instance-type", "gpu-8x".to_string()),
            ("rack", format!("rack-{}", i % 100)),
        ];
        node.labels
            .extend(labels.into_iter().map(|(k, v)| (k.to_string(), v)));
        ledger.apply(&LedgerCommand {
            at_ms: i as u64,
            op: LedgerOp::RegisterNode { node },
        });
        if gpus {
            let reply = ledger.apply(&LedgerCommand {
                at_ms: i as u64,
                op: LedgerOp::PublishPool {
                    node: format!("node-{i:06}"),
                    driver: BENCH_DRIVER.to_string(),
                    pool: format!("node-{i:06}"),
                    generation: 1,
                    devices: bench_gpus(i),
                    counter_sets: Vec::new(),
                },
            });
            if let LedgerReply::Rejected { error } = reply {
                bail!("node-{i:06}: its GPUs were refused: {error}");
            }
        }
    }
    let Some(after) = rss_bytes(None) else {
        return Ok(None);
    };
    let per_node = after.saturating_sub(before) as f64 / count as f64;
    kept.push(ledger);
    Ok(Some(per_node))
}
