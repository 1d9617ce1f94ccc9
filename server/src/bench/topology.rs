//! `gangway bench topology`: topology-aware placement on a fleet of 4 blocks × 8 racks ×
//! 16 nodes × 8 GPUs, a mixed stream of gangs (a third required-rack, a third
//! preferred-block, a third unconstrained) run to saturation and then under churn, by
//! gangway's engine with the constraints, the same engine with every constraint dropped,
//! and a Kueue-like best-fit baseline. The workload is `engine::topology_bench`; this
//! file times it (one core, no Raft) and prints the table for docs/BENCHMARKS.md.

use std::time::Instant;

use anyhow::bail;

use gangway_core::engine::topology_bench::{run, stream, Placement, TopologyReport};

/// Most gangs one run may stream.
pub const BENCH_GANGS_MAX: usize = 100_000;

/// Flags of `gangway bench topology`.
#[derive(Debug, clap::Args)]
pub struct TopologyBenchArgs {
    /// Gangs in the stream.
    #[arg(long, default_value_t = 20_000)]
    pub gangs: usize,
    /// Rounds after saturation, each releasing the oldest gang and placing more.
    #[arg(long, default_value_t = 12_000)]
    pub churn: usize,
    /// Seed of the stream.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Runs the three placements over one stream and prints the table.
pub fn run_bench(args: TopologyBenchArgs) -> anyhow::Result<()> {
    if args.gangs == 0 || args.gangs > BENCH_GANGS_MAX {
        bail!("--gangs: {} is not in 1..={BENCH_GANGS_MAX}", args.gangs);
    }
    if args.churn > args.gangs {
        bail!(
            "--churn: {} is more than --gangs {}",
            args.churn,
            args.gangs
        );
    }
    let gangs = stream(args.seed, args.gangs);
    let mut rows = Vec::new();
    for (name, placement) in [
        ("gangway, constraints", Placement::Gangway),
        (
            "gangway, constraints dropped",
            Placement::GangwayUnconstrained,
        ),
        ("Kueue-like best fit", Placement::BestFit),
    ] {
        let started = Instant::now();
        let report = run(placement, &gangs, args.churn);
        rows.push((name, report, started.elapsed().as_secs_f64()));
    }
    println!(
        "stream: {} gangs, seed {}, {} churn rounds",
        args.gangs, args.seed, args.churn
    );
    println!("| placement | gangs placed | pods placed | pods/s | preferred in one block / could be | required spanning racks | busy when a gang fails (churn mean) | stranded GPUs when a gang fails (churn mean) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, r, seconds) in &rows {
        row(name, r, *seconds);
    }
    let rate = |i: usize| rows[i].1.pods_placed as f64 / rows[i].2.max(1e-9);
    println!(
        "pods/s with constraints / without: {:.2}",
        rate(0) / rate(1).max(1e-9)
    );
    Ok(())
}

fn row(name: &str, r: &TopologyReport, seconds: f64) {
    let share = |a: u64, b: u64| {
        if b == 0 {
            "-".to_string()
        } else {
            format!("{a} / {b} ({:.0}%)", 100.0 * a as f64 / b as f64)
        }
    };
    let rounds = r.churn_failures.max(1) as f64;
    let free = r.churn_free_gpus as f64 / rounds;
    let busy = 100.0 * (r.fleet_gpus as f64 - free) / r.fleet_gpus as f64;
    println!(
        "| {name} | {} of {} | {} | {:.0} | {} | {} of {} | {busy:.1}% | {:.1} of {free:.1} free |",
        r.gangs_placed,
        r.gangs_tried,
        r.pods_placed,
        r.pods_placed as f64 / seconds.max(1e-9),
        share(r.preferred_in_one_block, r.preferred_one_block_possible),
        r.required_spanning,
        r.required_placed,
        r.churn_stranded_gpus as f64 / rounds,
    );
}
