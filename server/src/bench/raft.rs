//! `gangway bench raft`: three in-process replicas of one Raft group talking
//! gRPC over loopback, with sled (group commit, durable appends) and with the
//! in-memory store; W concurrent writers commit small commands for a fixed
//! time. Reports commits/s and p50/p99 commit latency.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_raft::storage::{KvStore, MemoryStore, SledStore};
use gangway_raft::{GroupId, HostConfig, NodeId, RaftHost, RaftTiming, RestoreError, StateMachine};
use tokio::net::TcpListener;

use super::percentile;
use crate::replica::Replica;

/// Longest a single measurement may run.
pub const BENCH_SECONDS_MAX: u64 = 60;
/// Most concurrent writers.
pub const BENCH_WRITERS_MAX: usize = 4_096;
const BENCH_GROUP: GroupId = 0;

/// Flags of `gangway bench raft`.
#[derive(Debug, clap::Args)]
pub struct RaftBenchArgs {
    /// Concurrent writers per measurement, comma-separated.
    #[arg(long, default_value = "1,16,256")]
    pub writers: String,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Stores to measure: sled, memory, or both comma-separated.
    #[arg(long, default_value = "sled,memory")]
    pub stores: String,
    /// Bytes per command.
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
}

/// Counts commands; the benchmark measures replication, not a domain.
#[derive(Default)]
struct CountingMachine {
    applied: u64,
}

impl StateMachine for CountingMachine {
    fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
        self.applied += 1;
        Vec::new()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.applied.to_be_bytes().to_vec()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        let bytes: [u8; 8] = snapshot
            .try_into()
            .map_err(|_| RestoreError("expected 8 bytes".into()))?;
        self.applied = u64::from_be_bytes(bytes);
        Ok(())
    }
    fn query(&self, _query: &[u8]) -> Vec<u8> {
        self.applied.to_be_bytes().to_vec()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct Row {
    store: String,
    writers: usize,
    commits: u64,
    seconds: f64,
    p50_us: u64,
    p99_us: u64,
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: RaftBenchArgs) -> anyhow::Result<()> {
    if args.seconds == 0 || args.seconds > BENCH_SECONDS_MAX {
        bail!(
            "--seconds: {} is not in 1..={BENCH_SECONDS_MAX}",
            args.seconds
        );
    }
    let writers: Vec<usize> = args
        .writers
        .split(',')
        .map(|w| {
            w.trim()
                .parse::<usize>()
                .with_context(|| format!("--writers: {w:?} is not a number"))
        })
        .collect::<Result<_, _>>()?;
    if writers.iter().any(|w| *w == 0 || *w > BENCH_WRITERS_MAX) {
        bail!("--writers: each count must be in 1..={BENCH_WRITERS_MAX}");
    }
    let mut rows = Vec::new();
    for store in args.stores.split(',').map(str::trim) {
        if store != "sled" && store != "memory" {
            bail!("--stores: {store:?} is not sled or memory");
        }
        let dir =
            std::env::temp_dir().join(format!("gangway-bench-raft-{}-{store}", std::process::id()));
        let cluster = start_cluster(store, &dir).await?;
        let leader = leader_host(&cluster).await?;
        for &w in &writers {
            rows.push(
                measure(
                    store,
                    &leader,
                    w,
                    args.payload_bytes,
                    Duration::from_secs(args.seconds),
                )
                .await,
            );
        }
        for r in cluster {
            r.stop().await;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("| store | writers | commits | commits/s | p50 latency | p99 latency |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.2} ms | {:.2} ms |",
            r.store,
            r.writers,
            r.commits,
            r.commits as f64 / r.seconds,
            r.p50_us as f64 / 1000.0,
            r.p99_us as f64 / 1000.0
        );
    }
    Ok(())
}

async fn start_cluster(store: &str, dir: &std::path::Path) -> anyhow::Result<Vec<Replica>> {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let members: BTreeMap<NodeId, String> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| Ok((i as NodeId + 1, l.local_addr()?.to_string())))
        .collect::<std::io::Result<_>>()?;
    let mut replicas = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let id = i as NodeId + 1;
        let kv: Arc<dyn KvStore> = match store {
            "sled" => Arc::new(SledStore::open(
                &dir.join(format!("node-{id}")),
                64 * 1024 * 1024,
            )?),
            _ => Arc::new(MemoryStore::new()),
        };
        let cfg = HostConfig {
            cluster_id: "bench".into(),
            node_id: id,
            advertise_addr: members[&id].clone(),
            groups: vec![BENCH_GROUP],
            timing: RaftTiming {
                balance_interval_ms: 0,
                snapshot_every_entries: 1_000_000,
                ..RaftTiming::default()
            },
            peer_security: Default::default(),
            peer_routes: Default::default(),
            transport: Default::default(),
        };
        replicas.push(
            Replica::start_with(
                cfg,
                kv,
                listener,
                Arc::new(|_| Box::new(CountingMachine::default())),
            )
            .await?,
        );
    }
    for r in &replicas {
        r.host.bootstrap(&members).await?;
    }
    Ok(replicas)
}

async fn leader_host(cluster: &[Replica]) -> anyhow::Result<RaftHost> {
    let leader = cluster[0]
        .host
        .wait_for_leader(BENCH_GROUP, Duration::from_secs(10))
        .await?;
    cluster
        .iter()
        .find(|r| r.host.node_id() == leader)
        .map(|r| r.host.clone())
        .context("the leader is not one of the benchmark replicas")
}

async fn measure(
    store: &str,
    leader: &RaftHost,
    writers: usize,
    payload: usize,
    span: Duration,
) -> Row {
    let start = Instant::now();
    let deadline = start + span;
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let host = leader.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    if host.write(BENCH_GROUP, vec![7u8; payload]).await.is_ok() {
                        lat.push(t.elapsed().as_micros() as u64);
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(lat) = t.await {
            all.extend(lat);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Row {
        store: store.to_string(),
        writers,
        commits: all.len() as u64,
        seconds,
        p50_us: percentile(&all, 50.0),
        p99_us: percentile(&all, 99.0),
    }
}
