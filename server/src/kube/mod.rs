//! The Kubernetes adapter: gangway as the scheduler of the pods whose
//! `schedulerName` names it. Informers (`informer`) copy Pods, Nodes, PodGroups,
//! PodDisruptionBudgets and the DRA objects; the ingest loop (`ingest`, meta leader only) feeds nodes,
//! devices and gangs into the same ledger and queue as the gRPC path; binders
//! (`binder`, each shard leader) write claim allocations and pod bindings back;
//! evictors (`evictor`, each shard leader) delete placed pods whose devices went bad
//! and the victims of committed preemptions.
//! `objects` and `gangs` are the pure conversions both use (`topology` the constraints
//! gangs carry), `queues` the queues
//! ElasticQuotas keep and the queue of a pod, `allocation` the claim
//! allocations the binder writes; `api` the REST writes.
//! Started by `gangway serve --kubeconfig` (or `--in-cluster`); every task it
//! starts stops with the shutdown signal it is given.

pub mod allocation;
pub mod api;
pub mod binder;
pub mod evictor;
pub mod gangs;
pub mod informer;
pub mod ingest;
pub mod named_pods;
pub mod objects;
pub mod pod_index;
pub mod queues;
pub mod topology;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::replicated::growth::ShardCount;
use crate::replicated::Groups;
use gangway_core::plan::budgets::DisruptionBudgets;

/// Default scheduler name (the `schedulerName` of the pods gangway schedules).
pub const SCHEDULER_NAME_DEFAULT: &str = "gangway";
/// Default budget of binding writes per second per replica (claims and bindings).
pub const BIND_QPS_DEFAULT: u32 = 5_000;
/// Default bindings in flight per replica.
pub const BIND_CONCURRENCY_DEFAULT: usize = 64;

/// How the adapter behaves.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// The scheduler name pods must carry.
    pub scheduler_name: String,
    /// Binding writes per second (0: unlimited).
    pub bind_qps: u32,
    /// Bindings in flight.
    pub bind_concurrency: usize,
    /// Test crash points (none in production).
    pub failpoints: crate::failpoints::Failpoints,
    /// The cluster's topology hierarchies (Volcano's network tiers are read from them).
    pub topologies: Vec<gangway_core::model::TopologyHierarchy>,
    /// The hierarchies Kueue's Topology objects define, which the ingest keeps for the
    /// coordinator of its replica.
    pub learned_topologies: Arc<gangway_core::model::LearnedHierarchies>,
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            scheduler_name: SCHEDULER_NAME_DEFAULT.to_string(),
            bind_qps: BIND_QPS_DEFAULT,
            bind_concurrency: BIND_CONCURRENCY_DEFAULT,
            failpoints: crate::failpoints::Failpoints::disabled(),
            topologies: Vec::new(),
            learned_topologies: Arc::default(),
        }
    }
}

/// Where the API server is.
#[derive(Debug, Clone)]
pub enum ApiServer {
    /// A kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// The pod's service account (in-cluster config).
    InCluster,
}

/// A client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The kubeconfig file is unreadable or invalid.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// In-cluster config is not available.
    #[error("in-cluster config: {0}")]
    InCluster(String),
    /// The client could not be built from the config.
    #[error("kube client: {0}")]
    Client(String),
}

/// Makes a client for `server`. The client's own retry of 429/503/504 answers is
/// off: its default backs off for minutes, during which a binding could land for a
/// member the ledger has released since. Every gangway loop retries on its own
/// schedule and re-reads the ledger first.
pub async fn connect(server: &ApiServer) -> Result<kube::Client, ConnectError> {
    let mut config = match server {
        ApiServer::Kubeconfig(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                ConnectError::Kubeconfig {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                }
            })?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| ConnectError::Kubeconfig {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?
        }
        ApiServer::InCluster => {
            kube::Config::incluster().map_err(|e| ConnectError::InCluster(e.to_string()))?
        }
    };
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| ConnectError::Client(e.to_string()))
}

/// Runs the informers, the ingest loop, the binder and the evictor until `stop` fires.
pub async fn run(
    client: kube::Client,
    groups: Groups,
    shards: ShardCount,
    topology_label: Option<String>,
    budgets: Arc<DisruptionBudgets>,
    opts: KubeOptions,
    stop: watch::Receiver<bool>,
) {
    let cache = Arc::new(informer::Cache::default());
    let mut tasks = JoinSet::new();
    for slot in informer::SLOTS {
        tasks.spawn(informer::run(
            client.clone(),
            slot,
            cache.clone(),
            stop.clone(),
        ));
    }
    let ingest = ingest::Ingest::new(
        groups.clone(),
        shards.clone(),
        topology_label,
        client.clone(),
        cache.clone(),
        budgets,
        opts.clone(),
    );
    tasks.spawn(ingest.run(stop.clone()));
    tasks.spawn(evictor::run(
        groups.clone(),
        shards.clone(),
        client.clone(),
        cache.clone(),
        opts.clone(),
        stop.clone(),
    ));
    tasks.spawn(binder::run(groups, shards, client, cache, opts, stop));
    while tasks.join_next().await.is_some() {}
}
