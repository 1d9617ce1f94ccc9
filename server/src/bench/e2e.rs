//! `gangway bench e2e`: a three-process cluster of real `gangway serve`
//! processes (this binary, on 127.0.0.1) for each shard count; nodes with
//! GPUs registered through the Inventory API; gangs of several sizes
//! submitted concurrently through the client; placement observed through the
//! Scheduler API by listing the groups changed since the previous poll. Reports pods committed per second and submit → placed
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

use super::{percentile, rss_bytes};
use gangway_core::wire::WireFormat;

/// Most nodes the benchmark registers.
pub const E2E_NODES_MAX: usize = 100_000;
/// Registrations in flight at once.
pub const REGISTER_CONCURRENCY: usize = 64;
/// Most submissions in flight at once (`--submit-concurrency`).
pub const SUBMIT_CONCURRENCY_MAX: usize = 1_024;
/// How often placement progress is polled.
pub const POLL_MS: u64 = 10;
/// Most group changes one poll reads at once.
pub const CHANGES_PAGE: u32 = 10_000;
/// How often a lone gang's progress is polled.
pub const ALONE_POLL_MS: u64 = 2;
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
    /// Gangs per size then placed one at a time (each submitted when the previous one is
    /// placed and released) for the latency of a gang that does not queue behind others.
    #[arg(long, default_value_t = 20)]
    pub latency_samples: usize,
    /// Submissions in flight at once while a size is submitted all at once.
    #[arg(long, default_value_t = 64)]
    pub submit_concurrency: usize,
    /// Queue counts to measure, comma-separated (a fresh cluster each; 0: no queues).
    /// Gangs go round-robin to the queues, each guaranteed its share of the cpu, with
    /// a max of the whole cluster's cpu (checked at every admission, never reached).
    #[arg(long, default_value = "0")]
    pub queues: String,
    /// Formats the replicas write their logs and snapshots in, comma-separated
    /// (`binary`, `json`; a fresh cluster each), to compare them in one run.
    #[arg(long, default_value = "binary")]
    pub wire_formats: String,
    /// The client talks to a replica that does not lead the meta group, so every
    /// submission is forwarded (by default it talks to replica 1, whichever leads).
    #[arg(long)]
    pub client_on_follower: bool,
}

fn parse_formats(text: &str) -> anyhow::Result<Vec<WireFormat>> {
    text.split(',')
        .map(|v| {
            v.trim()
                .parse::<WireFormat>()
                .map_err(|e| anyhow::anyhow!("--wire-formats: {e}"))
        })
        .collect()
}

/// Clock ticks per second of /proc's CPU times (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// CPU seconds (user + system) the processes `pids` have used, from /proc (0 where unreadable).
pub(super) fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            // Fields after the command name (which may hold spaces) start at state (3).
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            // utime and stime are fields 14 and 15, at 11 and 12 after the name.
            (ticks(11) + ticks(12)) / USER_HZ
        })
        .sum()
}

/// Each replica's resident memory, as "a, b, c MiB" (0 where unreadable).
fn rss_of(pids: &[u32]) -> String {
    let each: Vec<String> = pids
        .iter()
        .map(|p| {
            let bytes = rss_bytes(Some(*p)).unwrap_or(0);
            format!("{:.0}", bytes as f64 / (1024.0 * 1024.0))
        })
        .collect();
    format!("{} MiB", each.join(", "))
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(gangway_client::loopback::free_port()?)
}

pub(super) fn parse_list(flag: &str, text: &str) -> anyhow::Result<Vec<usize>> {
    text.split(',')
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .with_context(|| format!("{flag}: {v:?} is not a number"))
        })
        .collect()
}

/// The benchmark's three `gangway serve` processes on 127.0.0.1 (this binary), each
/// of which can be killed and started again under the same flags. Processes and the
/// data dir are removed when it is dropped.
pub(super) struct Processes {
    exe: PathBuf,
    dir: PathBuf,
    shards: usize,
    secret_file: PathBuf,
    /// Bug switches and crash points every replica is started with.
    pub(super) failpoints: Vec<String>,
    /// The format every replica writes.
    pub(super) wire: WireFormat,
    /// More flags every replica is started with.
    pub(super) extra: Vec<String>,
    children: Vec<Option<Child>>,
    /// gRPC addresses, replica i+1 at index i.
    pub(super) grpc: Vec<String>,
    /// HTTP addresses.
    pub(super) http: Vec<String>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Processes {
    /// Process ids of the running replicas.
    pub(super) fn pids(&self) -> Vec<u32> {
        self.children.iter().flatten().map(Child::id).collect()
    }

    /// SIGKILLs replica `i` (0-based) and reaps it.
    pub(super) fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children.get_mut(i).and_then(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts replica `i` (0-based), appending to its log.
    pub(super) fn start(&mut self, i: usize) -> anyhow::Result<()> {
        let id = i + 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{id}.log")))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("serve")
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                &self.grpc[i],
                "--http",
                &self.http[i],
            ])
            .args([
                "--shards",
                &self.shards.to_string(),
                "--cluster-id",
                "bench",
            ])
            .arg("--data")
            .arg(self.dir.join(format!("node-{id}")))
            .arg("--peer-secret-file")
            .arg(&self.secret_file)
            .args(["--initial-cluster-state", "new"])
            .args(["--wire-format", self.wire.name()])
            .args(&self.extra);
        if !self.failpoints.is_empty() {
            cmd.arg("--test-failpoints")
                .env("GANGWAY_TEST_FAILPOINTS", self.failpoints.join(","));
        }
        for (j, peer) in self.grpc.iter().enumerate() {
            if j != i {
                cmd.args(["--peer", &format!("{}={peer}", j + 1)]);
            }
        }
        let child = cmd
            .env(
                "RUST_LOG",
                std::env::var("GANGWAY_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()?;
        self.children[i] = Some(child);
        Ok(())
    }
}

fn loopback_addrs(n: usize) -> anyhow::Result<Vec<String>> {
    (0..n)
        .map(|_| free_port().map(|p| format!("127.0.0.1:{p}")))
        .collect()
}

/// Starts three replicas with `shards` shards, data under `dir`.
pub(super) fn spawn_cluster(shards: usize, dir: &Path) -> anyhow::Result<Processes> {
    spawn_cluster_with(shards, dir, Vec::new())
}

/// Like [`spawn_cluster`], every replica with `failpoints` armed (bug switches).
pub(super) fn spawn_cluster_with(
    shards: usize,
    dir: &Path,
    failpoints: Vec<String>,
) -> anyhow::Result<Processes> {
    spawn_cluster_as(shards, dir, failpoints, WireFormat::default())
}

/// Like [`spawn_cluster_with`], every replica writing `wire`.
pub(super) fn spawn_cluster_as(
    shards: usize,
    dir: &Path,
    failpoints: Vec<String>,
    wire: WireFormat,
) -> anyhow::Result<Processes> {
    spawn_cluster_flags(shards, dir, failpoints, wire, Vec::new())
}

/// Like [`spawn_cluster_as`], every replica started with `extra` flags too.
pub(super) fn spawn_cluster_flags(
    shards: usize,
    dir: &Path,
    failpoints: Vec<String>,
    wire: WireFormat,
    extra: Vec<String>,
) -> anyhow::Result<Processes> {
    let secret_file = dir.join("peer-secret");
    let secret = crate::security::Tokens::generated_peer_secret()?.own();
    std::fs::write(&secret_file, format!("{secret}\n"))
        .with_context(|| format!("cannot write {}", secret_file.display()))?;
    let mut procs = Processes {
        exe: std::env::current_exe().context("cannot find the gangway binary")?,
        dir: dir.to_path_buf(),
        shards,
        secret_file,
        failpoints,
        wire,
        extra,
        children: vec![None, None, None],
        grpc: loopback_addrs(3)?,
        http: loopback_addrs(3)?,
    };
    for i in 0..3 {
        procs.start(i)?;
    }
    Ok(procs)
}

/// Sum and count of `gangway_placement_phase_seconds` per phase, over every process.
type PhaseTotals = BTreeMap<String, (f64, f64)>;

/// Reads the coordinator's phase histograms from every process's /metrics.
async fn phase_totals(http: &[String]) -> PhaseTotals {
    let mut totals = PhaseTotals::new();
    for addr in http {
        let Ok(text) = fetch_metrics(addr).await else {
            continue;
        };
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("gangway_placement_phase_seconds_") else {
                continue;
            };
            let (kind, rest) = match rest.split_once('{') {
                Some(parts) => parts,
                None => continue,
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let Some(phase) = labels
                .split(',')
                .find_map(|l| l.strip_prefix("phase=\""))
                .map(|p| p.trim_end_matches('"'))
            else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let entry = totals.entry(phase.to_string()).or_default();
            match kind {
                "sum" => entry.0 += value,
                "count" => entry.1 += value,
                _ => {}
            }
        }
    }
    totals
}

pub(super) async fn fetch_metrics(addr: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

/// Mean time per phase (ms) and calls, between two readings.
fn phase_breakdown(before: &PhaseTotals, after: &PhaseTotals) -> String {
    const ORDER: [&str; 7] = [
        "round", "pending", "quote", "begin", "reserve", "decide", "commit",
    ];
    ORDER
        .iter()
        .filter_map(|phase| {
            let (sum, count) = after.get(*phase)?;
            let (sum0, count0) = before.get(*phase).copied().unwrap_or_default();
            let calls = count - count0;
            (calls > 0.0)
                .then(|| format!("{phase} {:.1} ms x{calls}", (sum - sum0) * 1000.0 / calls))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) async fn wait_ready(addrs: &[String]) -> anyhow::Result<Client> {
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

pub(super) async fn register_nodes(client: &Client, count: usize) -> anyhow::Result<()> {
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

/// One gang group of one gang named like the group (a gang belongs to one live group),
/// charged to `queue` (empty: none).
fn gang_request(
    name: String,
    size: usize,
    queue: String,
) -> gangway_proto::v1::SubmitGangGroupRequest {
    let pod = json!({"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}});
    GangGroupBuilder::new(name.clone())
        .idempotency_key(name.clone())
        .queue(queue)
        .gang(GangBuilder::new("bench", name, size as u32).members("w", size as u32, pod))
        .build()
}

/// The queue gang `g` of a run with `queues` queues goes to (empty with none).
fn queue_of(g: usize, queues: usize) -> String {
    match queues {
        0 => String::new(),
        n => format!("q{}", g % n),
    }
}

/// Makes `count` queues sharing `nodes` nodes' cpu (64 each): each guaranteed its
/// share, each with the whole cluster's cpu as max.
async fn make_queues(client: &Client, count: usize, nodes: usize) -> anyhow::Result<()> {
    let total = nodes * 64;
    for i in 0..count {
        let spec = gangway_proto::admin::QueueSpec {
            name: format!("q{i}"),
            weight: 1,
            min: [("cpu".to_string(), (total / count).to_string())].into(),
            max: [("cpu".to_string(), total.to_string())].into(),
            ..Default::default()
        };
        client.put_queue(spec).await?;
    }
    Ok(())
}

/// Every group changed after `stamp`, read page by page, and the stamp to ask from next.
pub(super) async fn changes_since(
    client: &Client,
    mut stamp: u64,
) -> anyhow::Result<(Vec<gangway_proto::v1::GangGroupStatus>, u64)> {
    let mut changed = Vec::new();
    loop {
        let page = client.list_changes(stamp, CHANGES_PAGE).await?;
        stamp = page.stamp;
        changed.extend(page.groups);
        if !page.more {
            return Ok((changed, stamp));
        }
    }
}

/// Waits until no gang group is active (releases done), so the next phase starts clean.
pub(super) async fn wait_released(client: &Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(SIZE_TIMEOUT_S);
    while !client.list_groups(false).await?.is_empty() {
        if Instant::now() > deadline {
            bail!("gang groups still releasing after {SIZE_TIMEOUT_S} s");
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    Ok(())
}

/// Places `samples` gangs of `size` one at a time; returns submit → placed latencies and
/// how long the submit calls took, both sorted.
async fn run_alone(
    client: &Client,
    shards: usize,
    size: usize,
    samples: usize,
    run: usize,
    queues: usize,
) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
    let mut latencies_ms = Vec::with_capacity(samples);
    let mut submits_ms = Vec::with_capacity(samples);
    for g in 0..samples {
        let name = format!("alone-s{shards}-g{size}-r{run}-{g}");
        let at = Instant::now();
        let id = client
            .submit(gang_request(name, size, queue_of(g, queues)))
            .await?
            .id;
        submits_ms.push(at.elapsed().as_millis() as u64);
        let deadline = at + Duration::from_secs(SIZE_TIMEOUT_S);
        loop {
            let status = client.get(id).await?;
            match status.state.as_str() {
                "Placed" => break,
                "Queued" | "Placing" => {}
                other => bail!("gang group {id} ended {other}: {}", status.reason),
            }
            if Instant::now() > deadline {
                bail!("gang group {id} not placed within {SIZE_TIMEOUT_S} s");
            }
            tokio::time::sleep(Duration::from_millis(ALONE_POLL_MS)).await;
        }
        latencies_ms.push(at.elapsed().as_millis() as u64);
        client.release(id).await?;
        wait_released(client).await?;
    }
    latencies_ms.sort_unstable();
    submits_ms.sort_unstable();
    Ok((latencies_ms, submits_ms))
}

struct SizeResult {
    shards: usize,
    queues: usize,
    gang: usize,
    gangs: usize,
    seconds: f64,
    latencies_ms: Vec<u64>,
    /// Mean coordinator time per phase while the size ran.
    phases: String,
    /// Submit → placed of gangs placed one at a time.
    alone_ms: Vec<u64>,
    /// How long their submit calls took.
    alone_submit_ms: Vec<u64>,
    /// Mean coordinator time per phase while they ran.
    alone_phases: String,
    /// CPU seconds the three replicas used while the gangs were placed.
    cpu: f64,
}

async fn run_size(
    client: &Client,
    http: &[String],
    shards: usize,
    size: usize,
    args: &E2eBenchArgs,
    run: usize,
    queues: usize,
    pids: &[u32],
) -> anyhow::Result<SizeResult> {
    let (pods, alone, concurrency) = (
        args.pods_per_size,
        args.latency_samples,
        args.submit_concurrency,
    );
    let gangs = pods.div_ceil(size);
    let (_, mut stamp) = changes_since(client, 0).await?;
    let phases_before = phase_totals(http).await;
    let cpu_before = cpu_seconds(pids);
    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut submits = Vec::new();
    for g in 0..gangs {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        submits.push(tokio::spawn(async move {
            let _permit = permit;
            let req = gang_request(
                format!("s{shards}-g{size}-r{run}-{g}"),
                size,
                queue_of(g, queues),
            );
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
        // Only what changed since the last poll, as a controller would list.
        let (changed, next) = changes_since(client, stamp).await?;
        stamp = next;
        for g in changed {
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
    let cpu = cpu_seconds(pids) - cpu_before;
    let phases_after = phase_totals(http).await;
    let phases = phase_breakdown(&phases_before, &phases_after);
    for g in client.list_groups(false).await? {
        client.release(g.id).await?;
    }
    wait_released(client).await?;
    latencies_ms.sort_unstable();
    let (alone_ms, alone_submit_ms) = run_alone(client, shards, size, alone, run, queues).await?;
    let alone_phases = phase_breakdown(&phases_after, &phase_totals(http).await);
    Ok(SizeResult {
        shards,
        queues,
        gang: size,
        gangs,
        seconds,
        latencies_ms,
        phases,
        alone_ms,
        alone_submit_ms,
        alone_phases,
        cpu,
    })
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: E2eBenchArgs) -> anyhow::Result<()> {
    let shard_counts = parse_list("--shards", &args.shards)?;
    let queue_counts = parse_list("--queues", &args.queues)?;
    if queue_counts
        .iter()
        .any(|q| *q > gangway_core::model::queue::QUEUES_MAX)
    {
        bail!(
            "--queues: at most {}",
            gangway_core::model::queue::QUEUES_MAX
        );
    }
    let sizes = parse_list("--gang-sizes", &args.gang_sizes)?;
    if args.nodes == 0 || args.nodes > E2E_NODES_MAX {
        bail!("--nodes: {} is not in 1..={E2E_NODES_MAX}", args.nodes);
    }
    if shard_counts.iter().chain(&sizes).any(|v| *v == 0) || args.pods_per_size == 0 {
        bail!("--shards, --gang-sizes and --pods-per-size must be >= 1");
    }
    if !(1..=SUBMIT_CONCURRENCY_MAX).contains(&args.submit_concurrency) {
        bail!(
            "--submit-concurrency: {} is not in 1..={SUBMIT_CONCURRENCY_MAX}",
            args.submit_concurrency
        );
    }
    let formats = parse_formats(&args.wire_formats)?;
    let mut rows = Vec::new();
    let mut data_dirs = Vec::new();
    let mut memory = Vec::new();
    for ((&shards, &queues), &format) in shard_counts
        .iter()
        .flat_map(|s| queue_counts.iter().map(move |q| (s, q)))
        .flat_map(|sq| formats.iter().map(move |f| (sq, f)))
    {
        let name = format.name();
        let dir = std::env::temp_dir().join(format!(
            "gangway-bench-e2e-{}-{shards}-{queues}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        let procs = spawn_cluster_as(shards, &dir, Vec::new(), format)?;
        let client = wait_ready(&procs.grpc).await?;
        let t = Instant::now();
        register_nodes(&client, args.nodes).await?;
        let registration_s = t.elapsed().as_secs_f64();
        eprintln!(
            "shards={shards} wire-format={name}: {} nodes registered in {registration_s:.1} s",
            args.nodes,
        );
        let registered_rss = rss_of(&procs.pids());
        make_queues(&client, queues, args.nodes).await?;
        // Leaders land where elections put them; a live cluster balances them every
        // 30 s. Balance first, so that runs compare steady states, not elections.
        let balanced = client.balance().await?;
        eprintln!(
            "shards={shards} wire-format={name}: leaders per replica {:?}",
            balanced.leaders_per_node
        );
        let meta_leader = client
            .status(false)
            .await?
            .groups
            .iter()
            .find(|g| g.group_id == 0)
            .map(|g| g.leader)
            .unwrap_or(0);
        // When the client's replica does not lead meta, every submission is
        // forwarded, which costs the replicas more.
        let client_replica = if args.client_on_follower {
            if meta_leader == 1 {
                2
            } else {
                1
            }
        } else {
            1
        };
        let client = match client_replica {
            1 => client,
            n => Client::connect(&[procs.grpc[n - 1].clone()]).await?,
        };
        eprintln!(
            "shards={shards} wire-format={name}: meta led by replica {meta_leader}, the client talks to replica {client_replica}"
        );
        for (run, &size) in sizes.iter().enumerate() {
            let pids = procs.pids();
            let row = run_size(
                &client,
                &procs.http,
                shards,
                size,
                &args,
                run,
                queues,
                &pids,
            )
            .await?;
            rows.push((name, row));
        }
        data_dirs.push((shards, queues, name, dir_bytes(&dir.join("node-1"))));
        memory.push(format!(
            "- shards {shards}, queues {queues}, {name}: {} nodes registered in {registration_s:.1} s; \
             replicas' RSS then {registered_rss}, at the end {}",
            args.nodes,
            rss_of(&procs.pids())
        ));
        drop(procs);
    }
    println!("| shards | queues | wire format | gang size | gangs | pods placed | seconds | pods/s | replicas' CPU s per 1k pods | p50 submit→placed | p99 submit→placed |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (format, r) in &rows {
        let pods = r.gangs * r.gang;
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.0} | {:.3} | {} ms | {} ms |",
            r.shards,
            r.queues,
            format,
            r.gang,
            r.gangs,
            pods,
            r.seconds,
            pods as f64 / r.seconds,
            r.cpu * 1000.0 / pods.max(1) as f64,
            percentile(&r.latencies_ms, 50.0),
            percentile(&r.latencies_ms, 99.0)
        );
    }
    println!();
    println!("One gang at a time (each submitted after the previous one was placed):");
    println!();
    println!("| shards | queues | wire format | gang size | gangs | p50 submit call | p50 submit→placed | p99 submit→placed | max |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for (format, r) in rows.iter().filter(|(_, r)| !r.alone_ms.is_empty()) {
        println!(
            "| {} | {} | {} | {} | {} | {} ms | {} ms | {} ms | {} ms |",
            r.shards,
            r.queues,
            format,
            r.gang,
            r.alone_ms.len(),
            percentile(&r.alone_submit_ms, 50.0),
            percentile(&r.alone_ms, 50.0),
            percentile(&r.alone_ms, 99.0),
            r.alone_ms.last().copied().unwrap_or(0)
        );
    }
    println!();
    println!("Coordinator phases (mean per call):");
    for (format, r) in &rows {
        println!(
            "- shards {}, queues {}, {format}, gangs of {}, all at once: {}",
            r.shards, r.queues, r.gang, r.phases
        );
        println!(
            "- shards {}, queues {}, {format}, gangs of {}, one at a time: {}",
            r.shards, r.queues, r.gang, r.alone_phases
        );
    }
    println!();
    println!("Registration and memory:");
    for line in memory {
        println!("{line}");
    }
    println!();
    println!("Data dir of replica 1 at the end (log, snapshots):");
    for (shards, queues, name, bytes) in data_dirs {
        println!(
            "- shards {shards}, queues {queues}, {name}: {:.1} MiB",
            bytes as f64 / (1024.0 * 1024.0)
        );
    }
    Ok(())
}
