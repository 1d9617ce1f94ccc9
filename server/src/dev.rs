//! `gangway dev`: the whole system in one process for a newcomer: three
//! replicas of the meta group and of every shard (each with its own sled store
//! under the data dir, talking gRPC over loopback), the HTTP endpoints, and a
//! simulated fleet of nodes registered through the public Inventory API.
//!
//! With `--data DIR` the cluster persists and its ports are recorded in
//! `DIR/dev.json` so a restart finds its peers again; without it, a fresh
//! temporary cluster is created and removed on exit.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gangway_proto::v1::inventory_client::InventoryClient;
use gangway_proto::v1::{NodeSpec, RegisterNodeRequest};
use gangway_raft::storage::SledStore;
use gangway_raft::{NodeId, RaftTiming};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::datadir::{self, Identity};
use crate::failpoints::Failpoints;
use crate::observe::http::{self, HttpState};
use crate::replica::{host_config, Replica, ReplicaOptions};
use crate::security::{ServerSecurity, Tokens};
use crate::serve::shutdown_signal;
use crate::webview::read::Source;
use crate::webview::UiDeps;
use gangway_core::engine::Profile;
use gangway_core::model::node::LABEL_HOSTNAME;
use gangway_core::model::TopologyHierarchy;
use gangway_core::wire::WireFormat;

/// Replicas `gangway dev` runs.
pub const DEV_REPLICAS: u64 = 3;
/// Most simulated nodes `gangway dev` registers.
pub const DEV_NODES_MAX: u32 = 100_000;
/// Time the dev cluster may take to elect every leader.
pub const DEV_READY_TIMEOUT_MS: u64 = 20_000;
const DEV_CLUSTER_ID: &str = "dev";
/// The label the simulated nodes' zones go under (their shard and fleet-grid domain).
const DEV_TOPOLOGY_LABEL: &str = "topology.kubernetes.io/zone";
/// The simulated nodes' rack label: racks of [`DEV_RACK_NODES`] nodes inside each zone.
const DEV_RACK_LABEL: &str = "gangway.io/rack";
/// Simulated nodes per rack.
const DEV_RACK_NODES: u32 = 4;

/// Flags of `gangway dev`.
#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// Keep the cluster in DIR across runs (default: a temporary dir removed on exit).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Number of shard groups.
    #[arg(long, default_value_t = 4)]
    pub shards: u32,
    /// Simulated nodes to register (64 cpu, 256Gi, 8 GPUs each, spread over 3 zones).
    #[arg(long, default_value_t = 32)]
    pub nodes: u32,
    /// HTTP address [default: the recorded one, else 127.0.0.1 on a free port].
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Format the replicas write commands, replies and snapshots in (they read both).
    #[arg(long, value_parser = crate::config::wire_format_parser(), default_value = "binary")]
    pub wire_format: WireFormat,
    /// kube-scheduler configuration file (`KubeSchedulerConfiguration`): the score
    /// plugins and NodeResourcesFit strategy of its profile for schedulerName `gangway`,
    /// as `gangway serve --scheduler-config` takes it.
    #[arg(long)]
    pub scheduler_config: Option<PathBuf>,
    /// Fair sharing over time: the half-life of each queue's past usage in ms, 0 for off,
    /// as `gangway serve --fair-share-half-life-ms` [default: 0].
    #[arg(long, default_value_t = 0)]
    pub fair_share_half_life_ms: u64,
    /// Reservations for the head of the line: off, reserve or backfill, as `gangway serve
    /// --head-reservations` [default: off].
    #[arg(long, default_value = "off")]
    pub head_reservations: gangway_core::plan::backfill::ReservationMode,
}

/// Ports of a persistent dev cluster.
#[derive(Debug, Serialize, Deserialize)]
struct DevPorts {
    grpc: Vec<SocketAddr>,
    http: SocketAddr,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// Runs the dev cluster until Ctrl-C.
pub async fn run(args: DevArgs, prometheus: Option<PrometheusHandle>) -> anyhow::Result<()> {
    if args.shards == 0 || args.shards > crate::config::SHARDS_MAX {
        bail!(
            "--shards: {} is not in 1..={}",
            args.shards,
            crate::config::SHARDS_MAX
        );
    }
    if args.nodes > DEV_NODES_MAX {
        bail!("--nodes: {} is more than {DEV_NODES_MAX}", args.nodes);
    }
    let fair_share_half_life_ms =
        crate::config::fair_share_half_life(Some(args.fair_share_half_life_ms))?;
    let profile = match &args.scheduler_config {
        Some(path) => crate::config::read_scheduler_config(
            path,
            &crate::kube::KubeOptions::default().scheduler_name,
        )
        .context("--scheduler-config")?,
        None => Profile::default(),
    };
    let profile = Profile {
        topologies: vec![TopologyHierarchy {
            name: "dev".into(),
            levels: [DEV_TOPOLOGY_LABEL, DEV_RACK_LABEL, LABEL_HOSTNAME]
                .map(str::to_string)
                .to_vec(),
        }],
        ..profile
    };
    let (data, _temp) = match &args.data {
        Some(d) => (d.clone(), None),
        None => {
            let d = std::env::temp_dir().join(format!("gangway-dev-{}", std::process::id()));
            (d.clone(), Some(TempDir(d)))
        }
    };
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create {} (--data)", data.display()))?;
    let recorded = read_ports(&data)?;
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut grpc = Vec::new();
    for i in 0..DEV_REPLICAS as usize {
        let addr = recorded.as_ref().map(|p| p.grpc[i]).unwrap_or(loopback);
        grpc.push(bind(addr, "recorded gRPC port of the dev cluster").await?);
    }
    let http_addr = args
        .http
        .or(recorded.as_ref().map(|p| p.http))
        .unwrap_or(loopback);
    let http_listener = bind(http_addr, "--http").await?;
    let grpc_addrs: Vec<SocketAddr> = grpc
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let http_addr = http_listener.local_addr()?;
    write_ports(
        &data,
        &DevPorts {
            grpc: grpc_addrs.clone(),
            http: http_addr,
        },
    )?;

    println!("gangway dev: HTTP http://{http_addr} (/ui /healthz /readyz /metrics)");
    let list: Vec<String> = grpc_addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{a} (replica {})", i + 1))
        .collect();
    println!("gangway dev: gRPC {}", list.join(", "));
    println!(
        "gangway dev: {DEV_REPLICAS} replicas of 1 meta group + {} shards, data in {}; Ctrl-C stops",
        args.shards,
        data.display()
    );

    let members: BTreeMap<NodeId, String> = grpc_addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as NodeId + 1, a.to_string()))
        .collect();
    // The replicas share this process, so they share a secret no other process knows.
    let peer_secret = Tokens::generated_peer_secret()?;
    let groups: Vec<u64> = (0..=u64::from(args.shards)).collect();
    let mut stores = Vec::new();
    let mut blank = Vec::new();
    for i in 0..grpc.len() {
        let id = i as NodeId + 1;
        let dir = data.join(format!("node-{id}"));
        let identity = Identity {
            cluster_id: DEV_CLUSTER_ID.into(),
            node_id: id,
            shards: args.shards,
        };
        datadir::open(&dir, &identity)?;
        let store = SledStore::open(&datadir::store_path(&dir), 32 * 1024 * 1024)
            .with_context(|| format!("cannot open the store in {}", dir.display()))?;
        if !gangway_raft::holds_raft_state(&store, &groups)? {
            blank.push(id);
        }
        stores.push(store);
    }
    // A cluster is created once, by all of its replicas; one blank among the others
    // lost its data, and must not vote again under its id.
    let create = blank.len() == grpc.len();
    if !create && !blank.is_empty() {
        bail!(
            "replicas {blank:?} under {} hold no Raft state but the others do: their data was lost, \
             and a dev cluster is never re-created in place; remove {} to start a new one",
            data.display(),
            data.display()
        );
    }
    let mut replicas = Vec::new();
    for (i, (listener, store)) in grpc.into_iter().zip(stores).enumerate() {
        let id = i as NodeId + 1;
        let timing = RaftTiming {
            balance_interval_ms: 10_000,
            ..RaftTiming::default()
        };
        let mut opts = ReplicaOptions {
            host: host_config(DEV_CLUSTER_ID, id, &members[&id], args.shards, timing),
            shards: args.shards,
            topology_label: Some(DEV_TOPOLOGY_LABEL.into()),
            host_path_prefixes: crate::frontdoor::inventory::InventoryOptions::default()
                .host_path_prefixes,
            profile: profile.clone(),
            wire: args.wire_format,
            rebalance: gangway_core::plan::rebalance::RebalancePolicy::default(),
            fair_share_half_life_ms,
            head_reservations: args.head_reservations,
            failpoints: Failpoints::disabled(),
            security: ServerSecurity::open(peer_secret.clone()),
            budgets: Arc::default(),
            learned_topologies: Arc::default(),
        };
        opts.host.peer_security.peer_secret = Some(peer_secret.own_shared());
        replicas.push(Replica::start(opts, Arc::new(store), listener).await?);
    }
    if create {
        for r in &replicas {
            r.host.bootstrap(&members).await?;
        }
    }
    for r in &replicas {
        for g in r.host.group_ids() {
            r.host
                .wait_for_leader(g, Duration::from_millis(DEV_READY_TIMEOUT_MS))
                .await?;
        }
    }
    println!("gangway dev: every group has a leader");

    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let hosts: Vec<_> = replicas.iter().map(|r| r.host.clone()).collect();
    let http_state = HttpState {
        hosts: hosts.clone(),
        prometheus,
    };
    let ui = crate::webview::mounted(UiDeps {
        source: Source {
            groups: replicas[0].groups(),
            hosts: hosts.clone(),
            shards: replicas[0].shard_count(),
            topology_label: Some(DEV_TOPOLOGY_LABEL.into()),
            topology_levels: crate::webview::read::grid_levels(&profile.topologies),
        },
        access: crate::webview::access::UiAccess::new(
            Arc::new(ServerSecurity::open(peer_secret.clone()).credentials(DEV_CLUSTER_ID, 1)),
            crate::auth::Access::policy_only(),
        ),
    });
    let http_task = tokio::spawn(http::serve(http_listener, http_state, Some(ui), async {
        let _ = http_stopped.await;
    }));

    let per_shard = register_fleet(grpc_addrs[0], args.nodes).await?;
    println!(
        "gangway dev: {} simulated nodes registered; nodes per shard {per_shard:?}",
        args.nodes
    );

    let any_stopped = async {
        let watches = hosts
            .iter()
            .map(|h| Box::pin(crate::replica::group_stopped(h)));
        let ((group, reason), i, _) = futures::future::select_all(watches).await;
        (i + 1, group, reason)
    };
    let stopped = tokio::select! {
        _ = shutdown_signal() => None,
        stopped = any_stopped => Some(stopped),
    };
    println!("gangway dev: stopping");
    let teardown = async {
        let _ = stop_http.send(());
        for r in replicas {
            r.stop().await;
        }
        http_task.await?
    };
    crate::serve::bounded_shutdown(teardown).await?;
    match stopped {
        None => Ok(()),
        Some((replica, group, reason)) => {
            bail!("replica {replica} stopped raft group {group}: {reason}; gangway dev exits (run it again to resume from --data)")
        }
    }
}

fn ports_file(data: &Path) -> PathBuf {
    data.join("dev.json")
}

fn read_ports(data: &Path) -> anyhow::Result<Option<DevPorts>> {
    match std::fs::read(ports_file(data)) {
        Ok(bytes) => {
            let ports: DevPorts = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is unreadable", ports_file(data).display()))?;
            if ports.grpc.len() != DEV_REPLICAS as usize {
                bail!(
                    "{} lists {} replicas, expected {DEV_REPLICAS}",
                    ports_file(data).display(),
                    ports.grpc.len()
                );
            }
            Ok(Some(ports))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", ports_file(data).display())),
    }
}

fn write_ports(data: &Path, ports: &DevPorts) -> anyhow::Result<()> {
    std::fs::write(ports_file(data), serde_json::to_vec_pretty(ports)?)
        .with_context(|| format!("cannot write {}", ports_file(data).display()))
}

/// Registers `count` simulated nodes through replica 1's Inventory API.
async fn register_fleet(addr: SocketAddr, count: u32) -> anyhow::Result<BTreeMap<u32, u32>> {
    let mut client = InventoryClient::connect(format!("http://{addr}")).await?;
    let mut per_shard = BTreeMap::new();
    for i in 0..count {
        let zone = ["zone-a", "zone-b", "zone-c"][i as usize % 3];
        let name = format!("sim-node-{i:04}");
        let rack = format!("{zone}-rack-{}", i / 3 / DEV_RACK_NODES);
        let node = NodeSpec {
            name: name.clone(),
            labels: [
                (DEV_TOPOLOGY_LABEL.to_string(), zone.to_string()),
                (DEV_RACK_LABEL.to_string(), rack),
                (LABEL_HOSTNAME.to_string(), name),
                ("gangway.io/simulated".to_string(), "true".to_string()),
            ]
            .into_iter()
            .collect(),
            taints: Vec::new(),
            allocatable: [
                ("cpu", "64"),
                ("memory", "256Gi"),
                ("pods", "110"),
                ("nvidia.com/gpu", "8"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            unschedulable: false,
            not_ready: false,
        };
        let reply = client
            .register_node(RegisterNodeRequest {
                node: Some(node),
                // The simulated fleet is this build's: a data dir from an earlier one
                // (other labels) takes the new spec instead of refusing it.
                update: true,
            })
            .await?
            .into_inner();
        if let Some(info) = reply.node {
            *per_shard.entry(info.shard).or_insert(0) += 1;
        }
    }
    Ok(per_shard)
}
