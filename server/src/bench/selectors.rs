//! `gangway bench selectors`: whether one slow CEL selector delays other gangs. The
//! e2e bench's cluster (three real `gangway serve` processes on 127.0.0.1, one shard);
//! nodes registered through the Inventory API and their GPUs streamed by device agents
//! (the device-plugin path: class `gpu.nvidia.com`). Plain one-pod gangs are placed one
//! after another, alone, then while a gang whose selector is slow (within the cost budget,
//! two nested loops per device) waits to be placed. The figures are the plain gangs'
//! placement latency (submit → `Placed`) in both phases and the slow gang's. With
//! `--mode both` the same run repeats with bug switch `selectors-evaluated-inline`
//! (plans evaluate every selector under the shard's lock, as gangway once did), so the
//! ratio is measured on one machine in one run. Processes and data dirs are removed on
//! every exit path.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use gangway_proto::v1::{
    DeviceHealth, DeviceListAck, DeviceListReport, NodeSpec, PluginDevice, SubmitGangGroupRequest,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::e2e::{spawn_cluster_with, wait_ready};
use super::percentile;
use crate::failpoints::SELECTORS_INLINE;
use gangway_core::model::cel::compile_selector;

/// Most nodes the benchmark registers.
pub const SELECTOR_BENCH_NODES_MAX: usize = 1_000;
/// Most GPUs per node.
pub const SELECTOR_BENCH_GPUS_MAX: usize = 64;
/// Longest one plain gang may take to be placed.
pub const PLAIN_TIMEOUT_S: u64 = 300;
/// Longest the slow gang may take to be placed.
pub const SLOW_TIMEOUT_S: u64 = 900;
/// Longest a device agent's report may take to be acknowledged.
pub const ACK_TIMEOUT_S: u64 = 30;

/// Flags of `gangway bench selectors`.
#[derive(Debug, clap::Args)]
pub struct SelectorBenchArgs {
    /// Nodes registered (64 cpu, 256Gi each).
    #[arg(long, default_value_t = 50)]
    pub nodes: usize,
    /// GPUs each node's agent streams.
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    /// Length of the lists the slow selector loops over, twice nested.
    #[arg(long = "loop", default_value_t = 150)]
    pub loop_len: usize,
    /// Plain gangs placed in each phase.
    #[arg(long, default_value_t = 20)]
    pub samples: usize,
    /// `warmer` (gangway as built), `inline` (the bug switch) or `both`.
    #[arg(long, default_value = "both")]
    pub mode: String,
}

/// The slow selector: true on every GPU, after `n`×`n` iterations per device.
fn slow_selector(n: usize) -> String {
    let items: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let list = format!("[{}]", items.join(","));
    format!(
        "{list}.exists(a, {list}.exists(b, a * b == -1)) || device.driver == \"gpu.nvidia.com\""
    )
}

fn plain_group(name: &str) -> SubmitGangGroupRequest {
    let pod = json!({"requests": {"cpu": "100m", "memory": "64Mi"}});
    GangGroupBuilder::new(name)
        .gang(GangBuilder::new("bench", name, 1).members("w", 1, pod))
        .build()
}

fn slow_group(selector: &str) -> SubmitGangGroupRequest {
    let pod = json!({"requests": {"cpu": "100m"}, "claims": [{"name": "gpu", "requests": [{
        "name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": selector}}]}}]}]});
    GangGroupBuilder::new("slow")
        .gang(GangBuilder::new("bench", "slow", 1).members("w", 1, pod))
        .build()
}

/// Keeps the device agents' streams open for the run.
struct Agents {
    _senders: Vec<mpsc::Sender<DeviceListReport>>,
    _acks: Vec<tonic::Streaming<DeviceListAck>>,
}

async fn fleet(client: &Client, nodes: usize, gpus: usize) -> anyhow::Result<Agents> {
    let mut senders = Vec::new();
    let mut acks = Vec::new();
    for i in 0..nodes {
        let name = format!("node-{i:04}");
        client
            .register_node(NodeSpec {
                name: name.clone(),
                labels: [("kubernetes.io/hostname".to_string(), name.clone())].into(),
                allocatable: [("cpu", "64"), ("memory", "256Gi"), ("pods", "110")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            })
            .await?;
        let (tx, rx) = mpsc::channel(2);
        let mut stream = client.device_stream(ReceiverStream::new(rx)).await?;
        let devices = (0..gpus)
            .map(|g| PluginDevice {
                id: format!("GPU-{i:04}-{g:02}"),
                health: DeviceHealth::Healthy as i32,
                numa_nodes: vec![(g % 2) as i64],
            })
            .collect();
        tx.send(DeviceListReport {
            node: name.clone(),
            resource_name: "nvidia.com/gpu".into(),
            devices,
        })
        .await
        .context("device stream closed")?;
        match tokio::time::timeout(Duration::from_secs(ACK_TIMEOUT_S), stream.message()).await {
            Ok(Ok(Some(_))) => {}
            other => bail!("node {name}: the device report was not acknowledged: {other:?}"),
        }
        senders.push(tx);
        acks.push(stream);
    }
    Ok(Agents {
        _senders: senders,
        _acks: acks,
    })
}

/// Submits a group and waits for `Placed`; the time taken.
async fn place(
    client: &Client,
    request: SubmitGangGroupRequest,
    timeout_s: u64,
) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    let status = client.submit(request).await?;
    let id = status.id;
    let placed = tokio::time::timeout(
        Duration::from_secs(timeout_s),
        client.watch_until(id, |s| s.state != "Queued" && s.state != "Placing"),
    )
    .await
    .with_context(|| format!("group {id} not placed within {timeout_s} s"))??;
    if placed.state != "Placed" {
        bail!("group {id} ended {} ({})", placed.state, placed.reason);
    }
    Ok((id, start.elapsed()))
}

/// Plain gangs one after another until `samples` are placed or `until` says stop;
/// their latencies in ms.
async fn plain_samples(
    client: &Client,
    tag: &str,
    samples: usize,
    mut until: impl FnMut() -> bool,
) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    for i in 0..samples {
        if until() {
            break;
        }
        let (id, took) = place(client, plain_group(&format!("{tag}-{i}")), PLAIN_TIMEOUT_S).await?;
        out.push(took.as_millis() as u64);
        client.release(id).await?;
    }
    out.sort_unstable();
    Ok(out)
}

/// One mode's figures.
struct ModeFigures {
    mode: &'static str,
    alone: Vec<u64>,
    during: Vec<u64>,
    slow_ms: u64,
}

async fn run_mode(args: &SelectorBenchArgs, inline: bool) -> anyhow::Result<ModeFigures> {
    let dir = std::env::temp_dir().join(format!(
        "gangway-bench-selectors-{}-{}",
        std::process::id(),
        if inline { "inline" } else { "warmer" }
    ));
    std::fs::create_dir_all(&dir)?;
    let failpoints = if inline {
        vec![SELECTORS_INLINE.to_string()]
    } else {
        Vec::new()
    };
    let procs = spawn_cluster_with(1, &dir, failpoints)?;
    let client = wait_ready(&procs.grpc).await?;
    let _agents = fleet(&client, args.nodes, args.gpus).await?;
    let alone = plain_samples(&client, "alone", args.samples, || false).await?;

    let selector = slow_selector(args.loop_len);
    let slow_client = client.clone();
    let slow_request = slow_group(&selector);
    let slow = tokio::spawn(async move { place(&slow_client, slow_request, SLOW_TIMEOUT_S).await });
    // Let the slow gang reach its first plan before the plain gangs are timed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let during = plain_samples(&client, "during", args.samples, || slow.is_finished()).await?;
    let (_, slow_took) = slow.await.context("slow gang task")??;
    drop(procs);
    Ok(ModeFigures {
        mode: if inline {
            "inline (bug switch)"
        } else {
            "warmer"
        },
        alone,
        during,
        slow_ms: slow_took.as_millis() as u64,
    })
}

/// Runs the benchmark and prints its table.
pub async fn run(args: SelectorBenchArgs) -> anyhow::Result<()> {
    if args.nodes == 0 || args.nodes > SELECTOR_BENCH_NODES_MAX {
        bail!(
            "--nodes: {} is not in 1..={SELECTOR_BENCH_NODES_MAX}",
            args.nodes
        );
    }
    if args.gpus == 0 || args.gpus > SELECTOR_BENCH_GPUS_MAX {
        bail!(
            "--gpus: {} is not in 1..={SELECTOR_BENCH_GPUS_MAX}",
            args.gpus
        );
    }
    if args.samples == 0 {
        bail!("--samples: must be >= 1");
    }
    let modes: Vec<bool> = match args.mode.as_str() {
        "warmer" => vec![false],
        "inline" => vec![true],
        "both" => vec![false, true],
        other => bail!("--mode: {other:?} is not warmer, inline or both"),
    };
    let selector = slow_selector(args.loop_len);
    let cost = compile_selector(&selector)
        .map_err(|e| anyhow::anyhow!("--loop {}: the selector is refused: {e}", args.loop_len))?
        .estimated_cost();
    println!(
        "selectors: {} nodes x {} GPUs, one shard; slow selector: {n}x{n} loop per device, estimated cost {cost} (budget {})",
        args.nodes,
        args.gpus,
        gangway_core::model::cel_cost::SELECTOR_COST_MAX,
        n = args.loop_len
    );
    println!(
        "{:<20} {:>14} {:>14} {:>16} {:>16} {:>10} {:>12}",
        "mode",
        "alone p50 ms",
        "alone p99 ms",
        "during p50 ms",
        "during p99 ms",
        "during n",
        "slow gang ms"
    );
    for inline in modes {
        let f = run_mode(&args, inline).await?;
        println!(
            "{:<20} {:>14} {:>14} {:>16} {:>16} {:>10} {:>12}",
            f.mode,
            percentile(&f.alone, 50.0),
            percentile(&f.alone, 99.0),
            percentile(&f.during, 50.0),
            percentile(&f.during, 99.0),
            f.during.len(),
            f.slow_ms
        );
    }
    Ok(())
}
