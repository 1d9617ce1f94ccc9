//! `gangway bench e2e`: a three-process cluster of real `gangway serve`
//! processes (this binary, on 127.0.0.1) for each shard count; nodes with
//! GPUs registered through the Inventory API; gangs of several sizes
//! submitted concurrently through the client; placement observed through the
//! Scheduler API. Reports pods committed per second and submit → placed
//! latency. Processes and data dirs are removed on every exit path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use gangway_proto::v1::NodeSpec;
use serde_json::json;
use tokio::sync::Semaphore;

use super::percentile;

/// Most nodes the benchmark registers.
pub const E2E_NODES_MAX: usize = 100_000;
/// Registrations in flight at once.
pub const REGISTER_CONCURRENCY: usize = 64;
/// Submissions in flight at once.
pub const SUBMIT_CONCURRENCY: usize = 32;
/// How often placement progress is polled.
pub const POLL_MS: u64 = 10;
/// Longest one gang size may take to place.
pub const SIZE_TIMEOUT_S: u64 = 300;

/// Flags of `gangway bench e2e`.
#[derive(Debug, clap::Args)]
pub struct E2eBenchArgs {
    /// Shard counts to measure, comma-separated (a fresh cluster each).
    #[arg(long, default_value = "1,2,4")]
    pub shards: String,
    /// Nodes registered (8 GPUs, 64 cpu, 512Gi each).
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Gang sizes, comma-separated.
    #[arg(long, default_value = "8,64,512")]
    pub gang_sizes: String,
    /// Pods submitted per gang size (rounded up to whole gangs).
    #[arg(long, default_value_t = 4_096)]
    pub pods_per_size: usize,
}

struct Processes {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn parse_list(flag: &str, text: &str) -> anyhow::Result<Vec<usize>> {
    text.split(',')
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .with_context(|| format!("{flag}: {v:?} is not a number"))
        })
        .collect()
}

fn spawn_cluster(shards: usize, dir: &Path) -> anyhow::Result<(Processes, Vec<String>)> {
    let exe = std::env::current_exe().context("cannot find the gangway binary")?;
    let addrs: Vec<String> = (0..3)
        .map(|_| free_port().map(|p| format!("127.0.0.1:{p}")))
        .collect::<Result<_, _>>()?;
    let mut procs = Processes {
        children: Vec::new(),
        dir: dir.to_path_buf(),
    };
    for (i, addr) in addrs.iter().enumerate() {
        let id = i + 1;
        let log = std::fs::File::create(dir.join(format!("node-{id}.log")))?;
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                addr,
                "--http",
                &format!("127.0.0.1:{}", free_port()?),
            ])
            .args(["--shards", &shards.to_string(), "--cluster-id", "bench"])
            .arg("--data")
            .arg(dir.join(format!("node-{id}")));
        for (j, peer) in addrs.iter().enumerate() {
            if j != i {
                cmd.args(["--peer", &format!("{}={peer}", j + 1)]);
            }
        }
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()?;
        procs.children.push(child);
    }
    Ok((procs, addrs))
}

async fn wait_ready(addrs: &[String]) -> anyhow::Result<Client> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(client) = Client::connect(addrs).await {
            if let Ok(status) = client.status(false).await {
                if status.groups.iter().all(|g| g.leader != 0) {
                    return Ok(client);
                }
            }
        }
        if Instant::now() > deadline {
            bail!("the benchmark cluster did not elect its leaders within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn register_nodes(client: &Client, count: usize) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(REGISTER_CONCURRENCY));
    let mut tasks = Vec::new();
    for i in 0..count {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let name = format!("gpu-node-{i:05}");
            let node = NodeSpec {
                name: name.clone(),
                labels: [
                    ("kubernetes.io/hostname".to_string(), name),
                    (
                        "topology.kubernetes.io/zone".to_string(),
                        format!("zone-{}", i % 8),
                    ),
                ]
                .into_iter()
                .collect(),
                allocatable: [
                    ("cpu", "64"),
                    ("memory", "512Gi"),
                    ("pods", "110"),
                    ("nvidia.com/gpu", "8"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
                ..Default::default()
            };
            client.register_node(node).await
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

struct SizeResult {
    shards: usize,
    gang: usize,
    gangs: usize,
    seconds: f64,
    latencies_ms: Vec<u64>,
}

async fn run_size(
    client: &Client,
    shards: usize,
    size: usize,
    pods: usize,
) -> anyhow::Result<SizeResult> {
    let gangs = pods.div_ceil(size);
    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut submits = Vec::new();
    for g in 0..gangs {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        submits.push(tokio::spawn(async move {
            let _permit = permit;
            let name = format!("s{shards}-g{size}-{g}");
            let pod = json!({"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}});
            let req = GangGroupBuilder::new(name.clone())
                .idempotency_key(name)
                .gang(
                    GangBuilder::new("bench", format!("g{g}"), size as u32).members(
                        "w",
                        size as u32,
                        pod,
                    ),
                )
                .build();
            let at = Instant::now();
            client.submit(req).await.map(|s| (s.id, at))
        }));
    }
    let mut submitted: BTreeMap<u64, Instant> = BTreeMap::new();
    for s in submits {
        let (id, at) = s.await??;
        submitted.insert(id, at);
    }
    let mut latencies_ms = Vec::new();
    let deadline = started + Duration::from_secs(SIZE_TIMEOUT_S);
    while !submitted.is_empty() {
        if Instant::now() > deadline {
            bail!(
                "{} gangs of {size} not placed within {SIZE_TIMEOUT_S} s",
                submitted.len()
            );
        }
        for g in client.list_groups(false).await? {
            if g.state == "Placed" {
                if let Some(at) = submitted.remove(&g.id) {
                    latencies_ms.push(at.elapsed().as_millis() as u64);
                }
            } else if submitted.contains_key(&g.id) && g.state != "Queued" && g.state != "Placing" {
                bail!("gang group {} ended {}: {}", g.id, g.state, g.reason);
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    for g in client.list_groups(false).await? {
        client.release(g.id).await?;
    }
    latencies_ms.sort_unstable();
    Ok(SizeResult {
        shards,
        gang: size,
        gangs,
        seconds,
        latencies_ms,
    })
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: E2eBenchArgs) -> anyhow::Result<()> {
    let shard_counts = parse_list("--shards", &args.shards)?;
    let sizes = parse_list("--gang-sizes", &args.gang_sizes)?;
    if args.nodes == 0 || args.nodes > E2E_NODES_MAX {
        bail!("--nodes: {} is not in 1..={E2E_NODES_MAX}", args.nodes);
    }
    if shard_counts.iter().chain(&sizes).any(|v| *v == 0) || args.pods_per_size == 0 {
        bail!("--shards, --gang-sizes and --pods-per-size must be >= 1");
    }
    let mut rows = Vec::new();
    for &shards in &shard_counts {
        let dir =
            std::env::temp_dir().join(format!("gangway-bench-e2e-{}-{shards}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (procs, addrs) = spawn_cluster(shards, &dir)?;
        let client = wait_ready(&addrs).await?;
        let t = Instant::now();
        register_nodes(&client, args.nodes).await?;
        eprintln!(
            "shards={shards}: {} nodes registered in {:.1} s",
            args.nodes,
            t.elapsed().as_secs_f64()
        );
        for &size in &sizes {
            rows.push(run_size(&client, shards, size, args.pods_per_size).await?);
        }
        drop(procs);
    }
    println!("| shards | gang size | gangs | pods placed | seconds | pods/s | p50 submit→placed | p99 submit→placed |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let pods = r.gangs * r.gang;
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.0} | {} ms | {} ms |",
            r.shards,
            r.gang,
            r.gangs,
            pods,
            r.seconds,
            pods as f64 / r.seconds,
            percentile(&r.latencies_ms, 50.0),
            percentile(&r.latencies_ms, 99.0)
        );
    }
    Ok(())
}
