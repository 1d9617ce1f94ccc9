//! `gangway-kube-bench`: binds per second through the Kubernetes path. Starts the
//! API server double with N Nodes, three `gangway serve` processes scheduling it
//! (binding QPS budget unlimited), waits until every node is in gangway's ledger,
//! then creates M pending pods at once and measures until the double has recorded
//! M bindings. Prints a markdown table row. Every process it starts is killed when
//! it exits.
//!
//! Usage: gangway-kube-bench [--gangway PATH] [--nodes N] [--pods M] [--gang-size K] [--shards S]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_kube_double::store::{NODES, PODS, POD_GROUPS_X};
use gangway_kube_double::{ApiServerDouble, Options};
use serde_json::json;

/// Longest wait for node registration or for the bindings, in s.
const PHASE_TIMEOUT_S: u64 = 600;

struct Args {
    gangway: PathBuf,
    nodes: usize,
    pods: usize,
    gang_size: usize,
    shards: u32,
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
            "--bench" => {} // passed by `cargo bench`
            other => bail!("unknown flag {other}; see the header of src/bin/kube_bench.rs"),
        }
    }
    if args.gang_size == 0 || args.pods % args.gang_size != 0 {
        bail!("--gang-size: must divide --pods");
    }
    if !args.gangway.exists() {
        bail!("--gangway: {} does not exist (build it first: cargo build --release -p gangway-server)", args.gangway.display());
    }
    Ok(args)
}

/// The gangway processes; killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(gangway_client::loopback::free_port()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let api = ApiServerDouble::start(Options {
        history_events: 4 * (args.pods + args.nodes) + 1_000,
        ..Options::default()
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    for i in 0..args.nodes {
        let name = format!("node-{i:05}");
        api.create(
            &NODES,
            json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True"}]}
            }),
        )
        .map_err(|e| anyhow::anyhow!("node: {e}"))?;
    }
    let grpc: Vec<String> = (0..3)
        .map(|_| Ok(format!("127.0.0.1:{}", free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let mut procs = Procs(Vec::new());
    // The bench runs on one machine: a per-run secret is enough.
    let secret_file = dir.path().join("peer-secret");
    std::fs::write(
        &secret_file,
        format!(
            "bench-peer-secret-{}-{}\n",
            std::process::id(),
            free_port()?
        ),
    )
    .with_context(|| format!("cannot write {}", secret_file.display()))?;
    for (i, addr) in grpc.iter().enumerate() {
        let id = i + 1;
        let mut cmd = Command::new(&args.gangway);
        cmd.arg("serve")
            .args(["--id", &id.to_string(), "--listen", addr])
            .args(["--http", &format!("127.0.0.1:{}", free_port()?)])
            .args(["--shards", &args.shards.to_string(), "--bind-qps", "0"])
            .arg("--data")
            .arg(dir.path().join(format!("node-{id}")))
            .arg("--peer-secret-file")
            .arg(&secret_file)
            .args(["--initial-cluster-state", "new"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("GANGWAY_BENCH_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdout(Stdio::null());
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
    let start = Instant::now();
    let client = loop {
        if let Ok(c) = gangway_client::Client::connect(&grpc).await {
            break c;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("gangway did not start within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    loop {
        let n = client.list_nodes(None).await.map(|l| l.len()).unwrap_or(0);
        if n >= args.nodes {
            break;
        }
        if start.elapsed() > Duration::from_secs(PHASE_TIMEOUT_S) {
            bail!(
                "only {n} of {} nodes registered after {PHASE_TIMEOUT_S} s",
                args.nodes
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ingest = start.elapsed();

    let created = Instant::now();
    let gangs = args.pods / args.gang_size;
    for g in 0..gangs {
        let labels = if args.gang_size > 1 {
            let name = format!("gang-{g:05}");
            api.create(&POD_GROUPS_X, json!({"metadata": {"name": name, "namespace": "bench"}, "spec": {"minMember": args.gang_size}}))
                .map_err(|e| anyhow::anyhow!("pod group: {e}"))?;
            json!({"scheduling.x-k8s.io/pod-group": name})
        } else {
            json!({})
        };
        for m in 0..args.gang_size {
            api.create(&PODS, json!({
                "metadata": {"name": format!("pod-{g:05}-{m:03}"), "namespace": "bench", "labels": labels},
                "spec": {"schedulerName": "gangway",
                         "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
            }))
            .map_err(|e| anyhow::anyhow!("pod: {e}"))?;
        }
    }
    let mut first = None;
    loop {
        let bound = api.bindings().len();
        if bound > 0 && first.is_none() {
            first = Some(created.elapsed());
        }
        if bound >= args.pods {
            break;
        }
        if created.elapsed() > Duration::from_secs(PHASE_TIMEOUT_S) {
            bail!(
                "only {bound} of {} pods bound after {PHASE_TIMEOUT_S} s",
                args.pods
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = created.elapsed();
    let bindings = api.bindings();
    let mut per_pod = std::collections::BTreeMap::new();
    for b in &bindings {
        *per_pod
            .entry((b.namespace.clone(), b.pod.clone()))
            .or_insert(0u32) += 1;
    }
    let twice = per_pod.values().filter(|n| **n > 1).count();
    println!("| nodes | pods | gang size | shards | node ingest s | first binding s | all bound s | binds/s | pods bound twice |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {:.1} | {:.3} | {:.2} | {:.0} | {} |",
        args.nodes,
        args.pods,
        args.gang_size,
        args.shards,
        ingest.as_secs_f64(),
        first.unwrap_or_default().as_secs_f64(),
        all.as_secs_f64(),
        args.pods as f64 / all.as_secs_f64(),
        twice
    );
    if twice > 0 {
        bail!("{twice} pods were bound more than once");
    }
    drop(procs);
    api.stop().await;
    Ok(())
}
