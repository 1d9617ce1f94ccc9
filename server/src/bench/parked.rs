//! `gangway bench parked`: what groups that fit nowhere cost the rest. For each mode a
//! fresh three-process cluster (this binary on 127.0.0.1) with nodes of 64 cpu and 8
//! GPUs: `without` (no such groups), `parked` (`--hopeless` groups that fit nowhere,
//! half asking a node label no node has, half more cpu than any node has), and
//! `blind` (the same, under the switch `coordinator-never-parks`: every one planned
//! again at each backoff expiry, as before event-driven requeueing). Measured: the
//! replicas' CPU while nothing else happens, then bursts of placeable gangs, each placed
//! and released (median pods/s, submit → placed latency, CPU per placed pod). Processes and data dirs are removed on
//! every exit path.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use serde_json::json;
use tokio::sync::Semaphore;

use super::e2e::{
    changes_since, cpu_seconds, register_nodes, spawn_cluster_with, wait_ready, SIZE_TIMEOUT_S,
};
use super::percentile;

/// Most groups that fit nowhere the benchmark submits.
pub const HOPELESS_MAX: usize = 10_000;
/// Longest wait before the idle window, in seconds.
pub const SETTLE_SECONDS_MAX: u64 = 3_600;
/// Submissions in flight at once.
const SUBMIT_CONCURRENCY: usize = 64;
/// Longest the hopeless groups may take to be tried once each, in seconds.
const SETTLE_TIMEOUT_S: u64 = 120;
/// How often progress is polled, in ms.
const POLL_MS: u64 = 20;

/// Flags of `gangway bench parked`.
#[derive(Debug, clap::Args)]
pub struct ParkedBenchArgs {
    /// Shards.
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Nodes registered (64 cpu, 512Gi, 8 GPUs each).
    #[arg(long, default_value_t = 200)]
    pub nodes: usize,
    /// Groups that fit nowhere, in the modes that have them (at most 10,000).
    #[arg(long, default_value_t = 1_000)]
    pub hopeless: usize,
    /// Placeable gangs submitted at once after the idle window.
    #[arg(long, default_value_t = 150)]
    pub gangs: usize,
    /// Members per placeable gang (1 cpu, 1 GPU each).
    #[arg(long, default_value_t = 8)]
    pub gang_size: usize,
    /// Bursts of placeable gangs, each placed then released (the median rate is
    /// reported; releases free room, which wakes groups that lacked it).
    #[arg(long, default_value_t = 5)]
    pub bursts: usize,
    /// Seconds of the idle window whose CPU is measured (a window past 25 s sees the
    /// parked groups' first safety net).
    #[arg(long, default_value_t = 20)]
    pub idle_seconds: u64,
    /// Seconds waited after every group that fits nowhere was tried once, before the
    /// idle window (past the storage's work after the submissions; from 61 s on, the
    /// window starts after every first safety net, 30–60 s after parking).
    #[arg(long, default_value_t = 5)]
    pub settle_seconds: u64,
    /// Modes to run, comma-separated: without, parked, blind (the first is the base of
    /// the ratios).
    #[arg(long, default_value = "without,parked,blind")]
    pub modes: String,
}

/// One mode of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Without,
    Parked,
    Blind,
}

impl Mode {
    fn parse(text: &str) -> anyhow::Result<Self> {
        match text.trim() {
            "without" => Ok(Mode::Without),
            "parked" => Ok(Mode::Parked),
            "blind" => Ok(Mode::Blind),
            other => bail!("--modes: {other:?} is not without, parked or blind"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Without => "without",
            Mode::Parked => "parked",
            Mode::Blind => "blind",
        }
    }
}

/// What one mode measured.
struct Outcome {
    mode: Mode,
    hopeless: usize,
    /// Attempts the hopeless groups made during the idle window, in all.
    idle_attempts: u64,
    /// Cores the three replicas used during the idle window.
    idle_cores: f64,
    pods_per_s: f64,
    latencies_ms: Vec<u64>,
    cpu_ms_per_pod: f64,
}

/// A group of one member that no node can take: a label no node has, or more cpu
/// than any node has.
fn hopeless(i: usize) -> gangway_proto::v1::SubmitGangGroupRequest {
    let name = format!("nowhere-{i:05}");
    let pod = if i % 2 == 0 {
        json!({"requests": {"cpu": "1"}, "nodeSelector": {"example.com/gpu-model": "none"}})
    } else {
        json!({"requests": {"cpu": "128"}})
    };
    GangGroupBuilder::new(name.clone())
        .idempotency_key(name.clone())
        .gang(GangBuilder::new("bench", name, 1).members("w", 1, pod))
        .build()
}

fn placeable(g: usize, size: usize) -> gangway_proto::v1::SubmitGangGroupRequest {
    let name = format!("fits-{g:05}");
    let pod = json!({"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}});
    GangGroupBuilder::new(name.clone())
        .idempotency_key(name.clone())
        .gang(GangBuilder::new("bench", name, size as u32).members("w", size as u32, pod))
        .build()
}

/// Submits every request, `SUBMIT_CONCURRENCY` at a time; their ids with when each was sent.
async fn submit_all(
    client: &Client,
    requests: Vec<gangway_proto::v1::SubmitGangGroupRequest>,
) -> anyhow::Result<BTreeMap<u64, Instant>> {
    let permits = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut tasks = Vec::new();
    for req in requests {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let at = Instant::now();
            client.submit(req).await.map(|s| (s.id, at))
        }));
    }
    let mut out = BTreeMap::new();
    for t in tasks {
        let (id, at) = t.await??;
        out.insert(id, at);
    }
    Ok(out)
}

/// The attempts of every active group, summed.
async fn attempts(client: &Client) -> anyhow::Result<u64> {
    Ok(client
        .list_groups(false)
        .await?
        .iter()
        .map(|g| u64::from(g.attempts))
        .sum())
}

/// Waits until every one of `ids` was tried at least once.
async fn settle(client: &Client, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(SETTLE_TIMEOUT_S);
    loop {
        let tried = client
            .list_groups(false)
            .await?
            .iter()
            .filter(|g| g.attempts > 0)
            .count();
        if tried >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {tried} of {count} groups that fit nowhere were tried within {SETTLE_TIMEOUT_S} s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run_mode(args: &ParkedBenchArgs, mode: Mode) -> anyhow::Result<Outcome> {
    let dir = std::env::temp_dir().join(format!(
        "gangway-bench-parked-{}-{}",
        std::process::id(),
        mode.name()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let failpoints = match mode {
        Mode::Blind => vec![crate::failpoints::PARKING_OFF.to_string()],
        Mode::Without | Mode::Parked => Vec::new(),
    };
    let procs = spawn_cluster_with(args.shards, &dir, failpoints)?;
    let client = wait_ready(&procs.grpc).await?;
    register_nodes(&client, args.nodes).await?;
    let hopeless_count = match mode {
        Mode::Without => 0,
        Mode::Parked | Mode::Blind => args.hopeless,
    };
    submit_all(&client, (0..hopeless_count).map(hopeless).collect()).await?;
    settle(&client, hopeless_count).await?;
    // Past the first backoffs and the storage's work after the submissions, so the
    // window sees the steady state.
    tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;

    let pids = procs.pids();
    let attempts_before = attempts(&client).await?;
    let cpu_before = cpu_seconds(&pids);
    let idle = Duration::from_secs(args.idle_seconds);
    tokio::time::sleep(idle).await;
    let idle_cores = (cpu_seconds(&pids) - cpu_before) / idle.as_secs_f64();
    let idle_attempts = attempts(&client).await?.saturating_sub(attempts_before);

    let mut rates = Vec::with_capacity(args.bursts);
    let mut latencies_ms = Vec::new();
    let mut cpu = 0.0;
    for burst in 0..args.bursts {
        let cpu_before = cpu_seconds(&pids);
        let (seconds, mut latencies) = place_burst(&client, args, burst).await?;
        cpu += cpu_seconds(&pids) - cpu_before;
        rates.push((args.gangs * args.gang_size) as f64 / seconds);
        latencies_ms.append(&mut latencies);
    }
    rates.sort_by(f64::total_cmp);
    latencies_ms.sort_unstable();
    drop(procs);
    Ok(Outcome {
        mode,
        hopeless: hopeless_count,
        idle_attempts,
        idle_cores,
        pods_per_s: rates[rates.len() / 2],
        latencies_ms,
        cpu_ms_per_pod: cpu * 1_000.0 / (args.bursts * args.gangs * args.gang_size) as f64,
    })
}

/// Submits `--gangs` placeable gangs at once, waits until every one is placed, then
/// releases them and waits until they are gone; seconds to place them and each one's
/// submit → placed latency.
async fn place_burst(
    client: &Client,
    args: &ParkedBenchArgs,
    burst: usize,
) -> anyhow::Result<(f64, Vec<u64>)> {
    let (_, mut stamp) = changes_since(client, 0).await?;
    let started = Instant::now();
    let requests = (0..args.gangs)
        .map(|g| placeable(burst * args.gangs + g, args.gang_size))
        .collect();
    let mut waiting = submit_all(client, requests).await?;
    let ids: Vec<u64> = waiting.keys().copied().collect();
    let mut latencies_ms = Vec::with_capacity(args.gangs);
    let deadline = started + Duration::from_secs(SIZE_TIMEOUT_S);
    while !waiting.is_empty() {
        if Instant::now() > deadline {
            bail!(
                "{} placeable gangs not placed within {SIZE_TIMEOUT_S} s",
                waiting.len()
            );
        }
        let (changed, next) = changes_since(client, stamp).await?;
        stamp = next;
        for g in changed.iter().filter(|g| g.state == "Placed") {
            if let Some(at) = waiting.remove(&g.id) {
                latencies_ms.push(at.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    for id in &ids {
        client.release(*id).await?;
    }
    for id in &ids {
        while client.get(*id).await?.state != "Released" {
            if Instant::now() > deadline {
                bail!("placeable gang {id} not released within {SIZE_TIMEOUT_S} s");
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }
    Ok((seconds, latencies_ms))
}

/// Runs the benchmark and prints a markdown table, with the ratios of `parked` and
/// `blind` to `without` measured in this run.
pub async fn run(args: ParkedBenchArgs) -> anyhow::Result<()> {
    if args.hopeless > HOPELESS_MAX {
        bail!("--hopeless: {} is more than {HOPELESS_MAX}", args.hopeless);
    }
    if args.settle_seconds > SETTLE_SECONDS_MAX {
        bail!(
            "--settle-seconds: {} is more than {SETTLE_SECONDS_MAX}",
            args.settle_seconds
        );
    }
    if args.shards == 0
        || args.nodes == 0
        || args.gangs == 0
        || args.gang_size == 0
        || args.bursts == 0
    {
        bail!("--shards, --nodes, --gangs, --gang-size and --bursts must be at least 1");
    }
    if args.gangs * args.gang_size > args.nodes * 8 {
        bail!(
            "--gangs × --gang-size ({}) is more GPUs than --nodes hold ({})",
            args.gangs * args.gang_size,
            args.nodes * 8
        );
    }
    let modes = args
        .modes
        .split(',')
        .map(Mode::parse)
        .collect::<anyhow::Result<Vec<Mode>>>()?;
    let mut outcomes = Vec::new();
    for mode in modes {
        outcomes.push(run_mode(&args, mode).await?);
    }
    println!(
        "| mode | groups that fit nowhere | their attempts in {} s idle | idle CPU (cores, 3 replicas) | placeable pods/s (median of bursts) | p50 / p99 ms | CPU ms per placed pod |",
        args.idle_seconds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {:.3} | {:.0} | {} / {} | {:.2} |",
            o.mode.name(),
            o.hopeless,
            o.idle_attempts,
            o.idle_cores,
            o.pods_per_s,
            percentile(&o.latencies_ms, 50.0),
            percentile(&o.latencies_ms, 99.0),
            o.cpu_ms_per_pod
        );
    }
    let Some((base, rest)) = outcomes.split_first() else {
        return Ok(());
    };
    for o in rest {
        println!(
            "{} against {}: pods/s ×{:.2}, idle CPU ×{:.2} ({:+.3} cores)",
            o.mode.name(),
            base.mode.name(),
            o.pods_per_s / base.pods_per_s,
            o.idle_cores / base.idle_cores.max(1e-9),
            o.idle_cores - base.idle_cores
        );
    }
    Ok(())
}
