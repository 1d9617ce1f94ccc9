//! `gangway-kube-bench`: gangway against kube-scheduler through the same real API
//! server. For each scheduler asked for, on a fresh control plane (etcd and
//! kube-apiserver from `GANGWAY_K8S_ASSETS`): creates N Nodes and a backlog of M
//! pending pods (cpu 100m; gangs as scheduler-plugins PodGroups for gangway), then
//! starts the scheduler — kube-scheduler v1.36 (client QPS and burst 1000, no leader
//! election) or three `gangway serve` replicas — and watches the pods until every
//! one is bound. It reports, counted from the scheduler's start: time to the first
//! binding, time to the last, pods/s, the longest gap between two bindings, CPU
//! seconds per 1,000 pods of the scheduler (all replicas), the API server and etcd,
//! pods bound twice (from the audit log), for gangway the meta group's leader
//! changes and the round trips of its Raft calls to peers (heartbeats, appends, votes),
//! and the cores the scheduler uses in the 10 s after the drain (idle). `--load` adds
//! one busy process per core for the whole run. Every
//! process it starts is killed when it exits.
//!
//! Usage: gangway-kube-bench [--gangway PATH] [--nodes N] [--pods M] [--gang-size K]
//!        [--shards S] [--schedulers gangway,kube-scheduler] [--load] [--timeout-s T]
//!        [--workload-api]
//!
//! `--workload-api` turns on Kubernetes' own gang API (the v1.36 alpha gates, served on the
//! API server and, for kube-scheduler, its GangScheduling plugin) and declares each gang
//! as a `scheduling.k8s.io/v1alpha2` PodGroup of `minCount` K that its pods name in
//! `spec.schedulingGroup`, for both schedulers alike.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use gangway_kube_double::store::{NODES, PODS, POD_GROUPS_K8S, POD_GROUPS_X};
use gangway_kube_env::{ControlPlane, Options, ADMIN_USER};
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::{json, Value};

/// How long the scheduler's idle CPU is measured after the backlog is drained, in ms.
const IDLE_MEASURE_MS: u64 = 10_000;
/// Objects created at once while filling the cluster.
const CREATE_CONCURRENCY: usize = 32;
/// The namespace of the benchmark's pods.
const NS: &str = "bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheduler {
    Gangway,
    KubeScheduler,
}

impl Scheduler {
    fn name(self) -> &'static str {
        match self {
            Scheduler::Gangway => "gangway",
            Scheduler::KubeScheduler => "kube-scheduler",
        }
    }

    /// The `schedulerName` its pods carry.
    fn pod_scheduler_name(self) -> &'static str {
        match self {
            Scheduler::Gangway => "gangway",
            Scheduler::KubeScheduler => "default-scheduler",
        }
    }
}

struct Args {
    gangway: PathBuf,
    nodes: usize,
    pods: usize,
    gang_size: usize,
    shards: u32,
    schedulers: Vec<Scheduler>,
    load: bool,
    timeout: Duration,
    /// Gangs declared through Kubernetes' own Workload/PodGroup API (gates on), for both
    /// schedulers; otherwise as scheduler-plugins PodGroups, for gangway only.
    workload_api: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        gangway: std::env::current_exe()?
            .parent()
            .map(|d| d.join("gangway"))
            .unwrap_or_else(|| PathBuf::from("gangway")),
        nodes: 5_000,
        pods: 10_000,
        gang_size: 1,
        shards: 4,
        schedulers: vec![Scheduler::KubeScheduler, Scheduler::Gangway],
        load: false,
        timeout: Duration::from_secs(600),
        workload_api: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag}: missing value"));
        match flag.as_str() {
            "--gangway" => args.gangway = PathBuf::from(value()?),
            "--nodes" => args.nodes = value()?.parse().context("--nodes: not a number")?,
            "--pods" => args.pods = value()?.parse().context("--pods: not a number")?,
            "--gang-size" => {
                args.gang_size = value()?.parse().context("--gang-size: not a number")?
            }
            "--shards" => args.shards = value()?.parse().context("--shards: not a number")?,
            "--schedulers" => {
                args.schedulers = value()?
                    .split(',')
                    .map(|s| match s {
                        "gangway" => Ok(Scheduler::Gangway),
                        "kube-scheduler" => Ok(Scheduler::KubeScheduler),
                        other => {
                            bail!("--schedulers: {other:?} is neither gangway nor kube-scheduler")
                        }
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            "--load" => args.load = true,
            "--workload-api" => args.workload_api = true,
            "--timeout-s" => {
                args.timeout =
                    Duration::from_secs(value()?.parse().context("--timeout-s: not a number")?)
            }
            "--bench" => {} // passed by `cargo bench`
            other => bail!("unknown flag {other}; see the header of src/bin/kube_bench.rs"),
        }
    }
    if args.gang_size == 0 || !args.pods.is_multiple_of(args.gang_size) {
        bail!("--gang-size: must divide --pods");
    }
    if args.schedulers.contains(&Scheduler::Gangway) && !args.gangway.exists() {
        bail!("--gangway: {} does not exist (build it first: cargo build --release -p gangway-server)", args.gangway.display());
    }
    Ok(args)
}

/// Child processes; killed on drop.
#[derive(Default)]
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at state (field 3).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15: indexes 11 and 12 after the state.
    (ticks(11) + ticks(12)) / clock_ticks_per_second()
}

fn clock_ticks_per_second() -> f64 {
    // Linux reports /proc times in USER_HZ, 100 on every architecture it runs here.
    100.0
}

/// One busy process per core, for the `--load` runs.
fn start_load(procs: &mut Procs) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    for _ in 0..cores {
        procs.0.push(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()
                .context("starting a busy process")?,
        );
    }
    Ok(())
}

async fn create_all(
    api: &ControlPlane,
    kind: &gangway_kube_double::Kind,
    objects: Vec<Value>,
) -> anyhow::Result<()> {
    futures::stream::iter(
        objects
            .into_iter()
            .map(|o| async move { api.create(kind, o).await.map(|_| ()) }),
    )
    .buffer_unordered(CREATE_CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await
    .map_err(|e| anyhow::anyhow!("{}: {e}", kind.plural))?;
    Ok(())
}

fn node(i: usize) -> Value {
    let name = format!("node-{i:05}");
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "4", "memory": "32Gi", "pods": "110"},
                   "capacity": {"cpu": "4", "memory": "32Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// How a pod names its gang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GangDeclaration {
    /// scheduler-plugins' PodGroup label.
    PluginsLabel,
    /// Kubernetes' `spec.schedulingGroup.podGroupName`.
    SchedulingGroup,
}

fn pod(scheduler: Scheduler, name: String, group: Option<(&str, GangDeclaration)>) -> Value {
    let labels = match group {
        Some((g, GangDeclaration::PluginsLabel)) => json!({"scheduling.x-k8s.io/pod-group": g}),
        _ => json!({}),
    };
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"schedulerName": scheduler.pod_scheduler_name(),
                 "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
    });
    if let Some((g, GangDeclaration::SchedulingGroup)) = group {
        pod["spec"]["schedulingGroup"] = json!({"podGroupName": g});
    }
    pod
}

/// What one run measured.
struct Run {
    scheduler: Scheduler,
    first_s: f64,
    all_s: f64,
    longest_gap_s: f64,
    scheduler_cpu_s: f64,
    apiserver_cpu_s: f64,
    etcd_cpu_s: f64,
    bound_twice: usize,
    meta_leader_changes: Option<u64>,
    /// Cores the scheduler used while idle after the drain.
    idle_cores: f64,
    /// gangway's Raft calls to peers over the run, by kind.
    raft_rpcs: Vec<(String, RpcLatency)>,
}

/// Round trips of one kind of Raft call, from the replicas' histograms summed.
#[derive(Debug, Default)]
struct RpcLatency {
    calls: u64,
    /// Upper bounds (s) of the buckets holding the median and the 99th percentile.
    p50_s: f64,
    p99_s: f64,
    /// Calls slower than 0.25 s (near the default election timeout of 0.3 s).
    over_250ms: u64,
}

/// gangway's Raft call latencies by kind (`gangway_raft_rpc_seconds`), summed over replicas.
async fn raft_rpc_latency(http: &[String]) -> Vec<(String, RpcLatency)> {
    // rpc → le → cumulative count.
    let mut buckets: BTreeMap<String, BTreeMap<OrderedLe, u64>> = BTreeMap::new();
    for addr in http {
        let Ok(body) = http_get(addr, "/metrics").await else {
            continue;
        };
        for line in body
            .lines()
            .filter(|l| l.starts_with("gangway_raft_rpc_seconds_bucket{"))
        {
            let label = |name: &str| {
                let start = line.find(&format!("{name}=\""))? + name.len() + 2;
                let end = line[start..].find('"')? + start;
                Some(line[start..end].to_string())
            };
            let (Some(rpc), Some(le)) = (label("rpc"), label("le")) else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            let count = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            *buckets
                .entry(rpc)
                .or_default()
                .entry(OrderedLe(le))
                .or_insert(0) += count as u64;
        }
    }
    buckets
        .into_iter()
        .map(|(rpc, cumulative)| {
            let calls = cumulative.values().copied().max().unwrap_or(0);
            let quantile = |q: f64| {
                cumulative
                    .iter()
                    .find(|(_, n)| **n as f64 >= q * calls as f64)
                    .map_or(f64::INFINITY, |(le, _)| le.0)
            };
            let within_250ms = cumulative
                .iter()
                .filter(|(le, _)| le.0 <= 0.25)
                .map(|(_, n)| *n)
                .max()
                .unwrap_or(0);
            let latency = RpcLatency {
                calls,
                p50_s: quantile(0.5),
                p99_s: quantile(0.99),
                over_250ms: calls.saturating_sub(within_250ms),
            };
            (rpc, latency)
        })
        .collect()
}

/// A bucket bound that orders (they are never NaN).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
struct OrderedLe(f64);

impl Eq for OrderedLe {}

impl Ord for OrderedLe {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Watches the benchmark's pods; answers the instants at which each became bound.
async fn watch_bindings(
    client: kube::Client,
    pods: usize,
    start: Instant,
    timeout: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods");
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &resource);
    let stream = watcher::watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    let mut bound: HashSet<String> = HashSet::new();
    let mut times = Vec::with_capacity(pods);
    let deadline = tokio::time::Instant::now() + timeout;
    while bound.len() < pods {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "only {} of {pods} pods bound after {timeout:?}",
                    bound.len()
                )
            })?;
        let objects = match next {
            Some(Ok(Event::Apply(o) | Event::InitApply(o))) => vec![o],
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                eprintln!("pod watch: {e}; it resumes");
                continue;
            }
            None => bail!("the pod watch ended"),
        };
        for o in objects {
            let value = serde_json::to_value(&o)?;
            if value["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
            {
                if let Some(name) = o.metadata.name.clone() {
                    if bound.insert(name) {
                        times.push(start.elapsed());
                    }
                }
            }
        }
    }
    Ok(times)
}

/// Starts three `gangway serve` replicas scheduling the control plane.
fn start_gangway(
    args: &Args,
    dir: &Path,
    kubeconfig: &Path,
    procs: &mut Procs,
) -> anyhow::Result<Vec<String>> {
    let port = || -> anyhow::Result<u16> { Ok(gangway_client::loopback::free_port()?) };
    let grpc: Vec<String> = (0..3)
        .map(|_| Ok(format!("127.0.0.1:{}", port()?)))
        .collect::<anyhow::Result<_>>()?;
    let http: Vec<String> = (0..3)
        .map(|_| Ok(format!("127.0.0.1:{}", port()?)))
        .collect::<anyhow::Result<_>>()?;
    let secret_file = dir.join("peer-secret");
    std::fs::write(
        &secret_file,
        format!("bench-peer-secret-{}-{}\n", std::process::id(), port()?),
    )
    .with_context(|| format!("cannot write {}", secret_file.display()))?;
    for (i, addr) in grpc.iter().enumerate() {
        let id = i + 1;
        let log = std::fs::File::create(dir.join(format!("gangway-{id}.log")))?;
        let mut cmd = Command::new(&args.gangway);
        cmd.arg("serve")
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                addr,
                "--http",
                &http[i],
            ])
            .args(["--shards", &args.shards.to_string(), "--bind-qps", "0"])
            .arg("--data")
            .arg(dir.join(format!("node-{id}")))
            .arg("--peer-secret-file")
            .arg(&secret_file)
            .args(["--initial-cluster-state", "new"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("GANGWAY_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(log.try_clone()?)
            .stderr(log);
        for (j, peer) in grpc.iter().enumerate() {
            if j != i {
                cmd.args(["--peer", &format!("{}={peer}", j + 1)]);
            }
        }
        procs.0.push(
            cmd.spawn()
                .with_context(|| format!("cannot start {}", args.gangway.display()))?,
        );
    }
    Ok(http)
}

/// The meta group's leader changes, as the replica that saw most of them counts.
async fn meta_leader_changes(http: &[String]) -> Option<u64> {
    let mut most = None;
    for addr in http {
        let Ok(body) = http_get(addr, "/metrics").await else {
            continue;
        };
        let seen: u64 = body
            .lines()
            .filter(|l| {
                l.starts_with("gangway_raft_leader_changes_total{") && l.contains("group=\"0\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum();
        most = Some(most.map_or(seen, |m: u64| m.max(seen)));
    }
    most
}

async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

fn kube_scheduler_config(dir: &Path, kubeconfig: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("kube-scheduler.yaml");
    std::fs::write(&path, gangway_kube_env::kube_scheduler_config(kubeconfig))?;
    Ok(path)
}

async fn run_one(args: &Args, scheduler: Scheduler) -> anyhow::Result<Run> {
    let mut procs = Procs::default();
    if args.load {
        start_load(&mut procs)?;
    }
    let options = Options {
        controllers: Vec::new(),
        ..Options::default()
    };
    let api = ControlPlane::start(match args.workload_api {
        true => options.with_workload_api(),
        false => options,
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, ADMIN_USER)?;
    api.ensure_namespace(NS).await?;
    api.install_pod_group_crds().await?;
    let filled = Instant::now();
    create_all(&api, &NODES, (0..args.nodes).map(node).collect()).await?;
    let gangs = args.pods / args.gang_size;
    let declaration = match (args.gang_size > 1, args.workload_api, scheduler) {
        (false, _, _) => None,
        (true, true, _) => Some(GangDeclaration::SchedulingGroup),
        (true, false, Scheduler::Gangway) => Some(GangDeclaration::PluginsLabel),
        (true, false, Scheduler::KubeScheduler) => None,
    };
    match declaration {
        Some(GangDeclaration::PluginsLabel) => {
            let groups = (0..gangs)
                .map(|g| json!({"metadata": {"name": format!("gang-{g:05}"), "namespace": NS}, "spec": {"minMember": args.gang_size}}))
                .collect();
            create_all(&api, &POD_GROUPS_X, groups).await?;
        }
        Some(GangDeclaration::SchedulingGroup) => {
            let groups = (0..gangs)
                .map(|g| json!({"metadata": {"name": format!("gang-{g:05}"), "namespace": NS},
                                "spec": {"schedulingPolicy": {"gang": {"minCount": args.gang_size}}}}))
                .collect();
            create_all(&api, &POD_GROUPS_K8S, groups).await?;
        }
        None => {}
    }
    let pods: Vec<Value> = (0..gangs)
        .flat_map(|g| {
            let group = declaration.map(|d| (format!("gang-{g:05}"), d));
            (0..args.gang_size).map(move |m| {
                let group = group.as_ref().map(|(name, d)| (name.as_str(), *d));
                pod(scheduler, format!("pod-{g:05}-{m:03}"), group)
            })
        })
        .collect();
    create_all(&api, &PODS, pods).await?;
    eprintln!(
        "{}: {} nodes and {} pending pods created in {:.1} s; starting the scheduler",
        scheduler.name(),
        args.nodes,
        args.pods,
        filled.elapsed().as_secs_f64()
    );

    let apiserver_pid = api.pid("kube-apiserver").context("no API server pid")?;
    let etcd_pid = api.pid("etcd").context("no etcd pid")?;
    let (apiserver_cpu0, etcd_cpu0) = (cpu_seconds(apiserver_pid), cpu_seconds(etcd_pid));
    let start = Instant::now();
    let watching = tokio::spawn(watch_bindings(api.client(), args.pods, start, args.timeout));
    let first_scheduler_proc = procs.0.len();
    let http = match scheduler {
        Scheduler::Gangway => start_gangway(args, dir.path(), &kubeconfig, &mut procs)?,
        Scheduler::KubeScheduler => {
            let config = kube_scheduler_config(dir.path(), &kubeconfig)?;
            let log = std::fs::File::create(dir.path().join("kube-scheduler.log"))?;
            procs.0.push(
                Command::new(api.program("kube-scheduler"))
                    .arg(format!("--config={}", config.display()))
                    .args(gangway_kube_env::KUBE_SCHEDULER_FLAGS)
                    .args(args.workload_api.then(|| {
                        format!("--feature-gates={}", gangway_kube_env::WORKLOAD_API_GATES)
                    }))
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()
                    .context("starting kube-scheduler")?,
            );
            Vec::new()
        }
    };
    let scheduler_pids: Vec<u32> = procs.0[first_scheduler_proc..]
        .iter()
        .map(|c| c.id())
        .collect();
    let times = watching.await??;
    let scheduler_cpu_s: f64 = scheduler_pids.iter().map(|p| cpu_seconds(*p)).sum();
    let apiserver_cpu_s = cpu_seconds(apiserver_pid) - apiserver_cpu0;
    let etcd_cpu_s = cpu_seconds(etcd_pid) - etcd_cpu0;
    let mut longest_gap = Duration::ZERO;
    for pair in times.windows(2) {
        longest_gap = longest_gap.max(pair[1] - pair[0]);
    }
    let idle_from = scheduler_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    tokio::time::sleep(Duration::from_millis(IDLE_MEASURE_MS)).await;
    let idle_cores = (scheduler_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - idle_from)
        / (IDLE_MEASURE_MS as f64 / 1_000.0);
    let meta_leader_changes = match scheduler {
        Scheduler::Gangway => meta_leader_changes(&http).await,
        Scheduler::KubeScheduler => None,
    };
    let raft_rpcs = match scheduler {
        Scheduler::Gangway => raft_rpc_latency(&http).await,
        Scheduler::KubeScheduler => Vec::new(),
    };
    let mut per_pod: BTreeMap<String, u32> = BTreeMap::new();
    for b in api.bindings() {
        *per_pod.entry(b.pod).or_insert(0) += 1;
    }
    let bound_twice = per_pod.values().filter(|n| **n > 1).count();
    Ok(Run {
        scheduler,
        first_s: times.first().copied().unwrap_or_default().as_secs_f64(),
        all_s: times.last().copied().unwrap_or_default().as_secs_f64(),
        longest_gap_s: longest_gap.as_secs_f64(),
        scheduler_cpu_s,
        apiserver_cpu_s,
        etcd_cpu_s,
        bound_twice,
        meta_leader_changes,
        idle_cores,
        raft_rpcs,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut runs = Vec::new();
    for scheduler in args.schedulers.clone() {
        runs.push(
            run_one(&args, scheduler)
                .await
                .with_context(|| scheduler.name())?,
        );
    }
    println!(
        "| scheduler | nodes | pods | gang size | load | first binding s | all bound s | pods/s | longest gap s | scheduler CPU s / 1k pods | API server CPU s / 1k | etcd CPU s / 1k | bound twice | meta leader changes | idle cores after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let per_k = |s: f64| s * 1_000.0 / args.pods as f64;
    for r in &runs {
        println!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {} | {:.3} |",
            r.scheduler.name(),
            args.nodes,
            args.pods,
            match (args.gang_size > 1, args.workload_api) {
                (true, true) => format!("{} (Workload API)", args.gang_size),
                _ => args.gang_size.to_string(),
            },
            if args.load { "1 busy process per core" } else { "none" },
            r.first_s,
            r.all_s,
            args.pods as f64 / r.all_s.max(1e-9),
            r.longest_gap_s,
            per_k(r.scheduler_cpu_s),
            per_k(r.apiserver_cpu_s),
            per_k(r.etcd_cpu_s),
            r.bound_twice,
            r.meta_leader_changes.map_or("-".to_string(), |n| n.to_string()),
            r.idle_cores,
        );
    }
    for r in runs.iter().filter(|r| !r.raft_rpcs.is_empty()) {
        println!(
            "\n{} Raft calls to peers over the run (all replicas; bucket bounds):",
            r.scheduler.name()
        );
        println!("| call | calls | p50 ≤ s | p99 ≤ s | over 0.25 s |");
        println!("|---|---|---|---|---|");
        for (rpc, l) in &r.raft_rpcs {
            println!(
                "| {rpc} | {} | {} | {} | {} |",
                l.calls, l.p50_s, l.p99_s, l.over_250ms
            );
        }
    }
    if let [a, b] = runs.as_slice() {
        let rate = |r: &Run| args.pods as f64 / r.all_s.max(1e-9);
        let cpu = |r: &Run| r.scheduler_cpu_s.max(1e-9);
        println!(
            "\n{} / {}: pods/s ×{:.2}, scheduler CPU per pod ×{:.2}",
            b.scheduler.name(),
            a.scheduler.name(),
            rate(b) / rate(a),
            cpu(b) / cpu(a)
        );
    }
    if let Some(r) = runs.iter().find(|r| r.bound_twice > 0) {
        bail!(
            "{}: {} pods were bound more than once",
            r.scheduler.name(),
            r.bound_twice
        );
    }
    Ok(())
}
