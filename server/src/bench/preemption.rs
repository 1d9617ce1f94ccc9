//! `gangway bench preemption`: how long a high-priority gang waits from submission to
//! `Placed` when it must preempt, with its victims on 1, 2, … shards. The e2e bench's
//! cluster (three real `gangway serve` processes on 127.0.0.1, sled data dirs) with
//! `--nodes-per-shard` nodes of 16 CPUs on each shard, every node labelled with its
//! shard. Per sample, every node is filled with one 16-CPU pod: on the first k shards by
//! one low-priority gang per shard (the victims, pinned there by a node selector), on
//! the others by high-priority walls no one may preempt. Then an urgent gang of one
//! 16-CPU member per node of k shards is submitted: it fits only by preempting the k
//! low gangs. The baseline is the same urgent gang on the same cluster with those
//! shards empty (no preemption). Everything is released between samples; processes
//! and data dirs are removed on every exit path.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use gangway_proto::v1::{NodeSpec, SubmitGangGroupRequest};
use serde_json::json;

use super::e2e::{parse_list, spawn_cluster, wait_ready};
use super::percentile;

/// Most samples per victim-shard count.
pub const PREEMPTION_SAMPLES_MAX: usize = 1_000;
/// Most nodes per shard.
pub const NODES_PER_SHARD_MAX: usize = 256;
/// CPUs of every node (one pod of the benchmark fills it).
pub const NODE_CPUS: u32 = 16;
/// Longest one group may take to reach the state waited for.
pub const STATE_TIMEOUT_S: u64 = 60;
/// How often a group's state is read.
pub const POLL_MS: u64 = 2;
/// The label naming a node's shard, which pins victims and walls.
const SHARD_LABEL: &str = "bench.gangway.dev/shard";
/// Priorities: victims, the urgent gang, walls.
const LOW: i32 = 0;
const URGENT: i32 = 100;
const WALL: i32 = 1_000;

/// Flags of `gangway bench preemption`.
#[derive(Debug, clap::Args)]
pub struct PreemptionBenchArgs {
    /// Shards holding victims, comma-separated (each at most --shards).
    #[arg(long, default_value = "1,2,4")]
    pub victim_shards: String,
    /// Shards of the cluster.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Nodes on each shard.
    #[arg(long, default_value_t = 4)]
    pub nodes_per_shard: usize,
    /// Samples per victim-shard count (each with a baseline).
    #[arg(long, default_value_t = 10)]
    pub samples: usize,
}

fn pod(shard: Option<u32>) -> serde_json::Value {
    let mut pod = json!({"requests": {"cpu": NODE_CPUS.to_string()}});
    if let Some(s) = shard {
        let mut selector = serde_json::Map::new();
        selector.insert(SHARD_LABEL.to_string(), s.to_string().into());
        pod["nodeSelector"] = selector.into();
    }
    pod
}

/// A Strict gang group of `members` 16-CPU pods at `priority`, pinned to `shard`.
fn group(name: &str, members: usize, priority: i32, shard: Option<u32>) -> SubmitGangGroupRequest {
    GangGroupBuilder::new(name)
        .idempotency_key(name)
        .gang(
            GangBuilder::new("bench", name, members as u32)
                .priority(priority)
                .members("w", members as u32, pod(shard)),
        )
        .build()
}

/// Registers nodes until every shard has `per_shard`, labelled with their shard; extra
/// nodes (a shard already full) are cordoned.
async fn fleet(client: &Client, shards: usize, per_shard: usize) -> anyhow::Result<()> {
    let mut counts = vec![0usize; shards + 1];
    let mut i = 0;
    while counts[1..].iter().any(|c| *c < per_shard) {
        if i > shards * per_shard * 8 {
            bail!("could not give every shard {per_shard} nodes");
        }
        let name = format!("node-{i:04}");
        i += 1;
        let mut node = NodeSpec {
            name: name.clone(),
            allocatable: [
                ("cpu", NODE_CPUS.to_string()),
                ("memory", "64Gi".into()),
                ("pods", "110".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            ..Default::default()
        };
        let info = client.register_node(node.clone()).await?;
        let shard = info.shard as usize;
        let full = counts.get(shard).is_none_or(|c| *c >= per_shard);
        if !full {
            counts[shard] += 1;
        }
        node.labels
            .insert(SHARD_LABEL.to_string(), info.shard.to_string());
        node.unschedulable = full;
        client.update_node(node).await?;
    }
    for shard in 1..=shards as u32 {
        let labelled = client
            .list_nodes(Some(shard))
            .await?
            .into_iter()
            .filter_map(|n| n.node)
            .filter(|n| !n.unschedulable && n.labels.get(SHARD_LABEL) == Some(&shard.to_string()))
            .count();
        if labelled != per_shard {
            bail!("shard {shard} has {labelled} labelled schedulable nodes, not {per_shard}");
        }
    }
    Ok(())
}

/// Polls group `id` until it is `state`; returns the time from `since`.
async fn until(client: &Client, id: u64, state: &str, since: Instant) -> anyhow::Result<u64> {
    let deadline = since + Duration::from_secs(STATE_TIMEOUT_S);
    loop {
        let s = client.get(id).await?;
        if s.state == state {
            return Ok(since.elapsed().as_micros() as u64);
        }
        if Instant::now() > deadline {
            bail!(
                "group {id} not {state} within {STATE_TIMEOUT_S} s: {} ({})",
                s.state,
                s.reason
            );
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Submits `req` and waits until it is placed.
async fn place(client: &Client, req: SubmitGangGroupRequest) -> anyhow::Result<u64> {
    let id = client.submit(req).await?.id;
    until(client, id, "Placed", Instant::now()).await?;
    Ok(id)
}

/// One sample with victims on `k` shards: (baseline µs, with preemption µs).
async fn sample(
    client: &Client,
    args: &PreemptionBenchArgs,
    k: usize,
    n: usize,
) -> anyhow::Result<(u64, u64)> {
    let per = args.nodes_per_shard;
    let mut walls = Vec::new();
    for s in k + 1..=args.shards {
        walls.push(
            place(
                client,
                group(&format!("wall-{k}-{n}-{s}"), per, WALL, Some(s as u32)),
            )
            .await?,
        );
    }
    // Baseline: the urgent gang on the k empty shards.
    let start = Instant::now();
    let free = client
        .submit(group(&format!("free-{k}-{n}"), k * per, URGENT, None))
        .await?
        .id;
    let baseline = until(client, free, "Placed", start).await?;
    client.release(free).await?;
    until(client, free, "Released", Instant::now()).await?;
    let mut victims = Vec::new();
    for s in 1..=k {
        victims.push(
            place(
                client,
                group(&format!("low-{k}-{n}-{s}"), per, LOW, Some(s as u32)),
            )
            .await?,
        );
    }
    let start = Instant::now();
    let urgent = client
        .submit(group(&format!("urgent-{k}-{n}"), k * per, URGENT, None))
        .await?
        .id;
    let preempting = until(client, urgent, "Placed", start).await?;
    for v in &victims {
        let s = client.get(*v).await?;
        if s.state != "Preempted" {
            bail!("victim group {v} is {}, not Preempted", s.state);
        }
    }
    for id in walls.iter().chain([&urgent]) {
        client.release(*id).await?;
        until(client, *id, "Released", Instant::now()).await?;
    }
    Ok((baseline, preempting))
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: PreemptionBenchArgs) -> anyhow::Result<()> {
    let ks = parse_list("--victim-shards", &args.victim_shards)?;
    if let Some(k) = ks.iter().find(|k| **k == 0 || **k > args.shards) {
        bail!("--victim-shards: {k} is not in 1..={}", args.shards);
    }
    if !(1..=PREEMPTION_SAMPLES_MAX).contains(&args.samples) {
        bail!(
            "--samples: {} is not in 1..={PREEMPTION_SAMPLES_MAX}",
            args.samples
        );
    }
    if !(1..=NODES_PER_SHARD_MAX).contains(&args.nodes_per_shard) {
        bail!(
            "--nodes-per-shard: {} is not in 1..={NODES_PER_SHARD_MAX}",
            args.nodes_per_shard
        );
    }
    let dir = std::env::temp_dir().join(format!("gangway-bench-preemption-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let procs = spawn_cluster(args.shards, &dir)?;
    let client = wait_ready(&procs.grpc).await?;
    fleet(&client, args.shards, args.nodes_per_shard)
        .await
        .context("registering the fleet")?;
    let mut rows = Vec::new();
    for &k in &ks {
        let mut base = Vec::new();
        let mut pre = Vec::new();
        for n in 0..args.samples {
            let (b, p) = sample(&client, &args, k, n).await?;
            eprintln!(
                "  victims on {k} shards, sample {}: {b} µs without, {p} µs with preemption",
                n + 1
            );
            base.push(b);
            pre.push(p);
        }
        base.sort_unstable();
        pre.sort_unstable();
        rows.push((k, base, pre));
    }
    drop(procs);
    println!(
        "| victim shards | preemptor members | samples | p50 placed, no victims | p50 placed by preempting | p99 | ratio of p50s |\n|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (k, base, pre) in rows {
        let (b, p) = (percentile(&base, 50.0), percentile(&pre, 50.0));
        println!(
            "| {k} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} |",
            k * args.nodes_per_shard,
            pre.len(),
            b as f64 / 1e3,
            p as f64 / 1e3,
            percentile(&pre, 99.0) as f64 / 1e3,
            p as f64 / b.max(1) as f64
        );
    }
    Ok(())
}
