//! `gangway serve` configuration: command-line flags, optionally on top of a
//! TOML config file with the same keys (flags win). Every error names the flag
//! or key at fault. Read once by `main`; the result is passed down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use gangway_raft::{NodeId, RaftTiming};
use serde::Deserialize;

use gangway_core::wire::WireFormat;

/// `--wire-format`'s parser: the formats' names, each with its summary in `--help`.
pub fn wire_format_parser() -> impl clap::builder::TypedValueParser<Value = WireFormat> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        WireFormat::ALL.map(|f| PossibleValue::new(f.name()).help(f.summary())),
    )
    .try_map(|name| name.parse::<WireFormat>())
}

/// Most shards a cluster may have (the shard map's bound).
pub use gangway_core::ledger::meta::shard_map::SHARDS_MAX;
/// Default number of shards.
pub const SHARDS_DEFAULT: u32 = 4;
/// Default sled page cache, in MiB.
pub const SLED_CACHE_MB_DEFAULT: u64 = 64;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag or key has a bad value.
    #[error("{field}: {reason}")]
    Invalid {
        /// The flag or config key.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The config file cannot be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The rebalancing policy from its flags or keys, refusing a bound out of range.
fn rebalance_policy(
    auto: Option<bool>,
    bound_percent: Option<u64>,
    check_ms: Option<u64>,
) -> Result<gangway_core::plan::rebalance::RebalancePolicy, ConfigError> {
    let defaults = gangway_core::plan::rebalance::RebalancePolicy::default();
    let bound_percent = bound_percent.unwrap_or(defaults.bound_percent);
    if !(101..=1_000).contains(&bound_percent) {
        return Err(invalid(
            "rebalance-bound-percent",
            format!("{bound_percent} is not in 101..=1000"),
        ));
    }
    let check_ms = check_ms.unwrap_or(defaults.check_ms);
    if !(100..=3_600_000).contains(&check_ms) {
        return Err(invalid(
            "rebalance-check-ms",
            format!("{check_ms} is not in 100..=3600000"),
        ));
    }
    Ok(gangway_core::plan::rebalance::RebalancePolicy {
        auto: auto.unwrap_or(defaults.auto),
        bound_percent,
        check_ms,
    })
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// `--fair-share-half-life-ms`, checked: 0 (off) or within the range meta accepts.
pub fn fair_share_half_life(half_life_ms: Option<u64>) -> Result<u64, ConfigError> {
    use gangway_core::ledger::meta::{FAIR_SHARE_HALF_LIFE_MS_MAX, FAIR_SHARE_HALF_LIFE_MS_MIN};
    let half_life_ms = half_life_ms.unwrap_or(0);
    let range = FAIR_SHARE_HALF_LIFE_MS_MIN..=FAIR_SHARE_HALF_LIFE_MS_MAX;
    if half_life_ms != 0 && !range.contains(&half_life_ms) {
        return Err(invalid(
            "--fair-share-half-life-ms",
            format!(
                "{half_life_ms} is not 0 (off) or in {FAIR_SHARE_HALF_LIFE_MS_MIN}..={FAIR_SHARE_HALF_LIFE_MS_MAX}"
            ),
        ));
    }
    Ok(half_life_ms)
}

/// Flags of `gangway serve`.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML file with the same keys as these flags (flags override it); or a
    /// kube-scheduler `KubeSchedulerConfiguration` file, taken as --scheduler-config.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// kube-scheduler configuration file (`KubeSchedulerConfiguration`,
    /// kubescheduler.config.k8s.io/v1): the score plugins, their weights,
    /// NodeResourcesFit's scoring strategy and percentageOfNodesToScore of the profile
    /// whose schedulerName is gangway's; what gangway does not implement is refused by
    /// name [default: kube-scheduler's default profile].
    #[arg(long)]
    pub scheduler_config: Option<PathBuf>,
    /// This replica's node id (>= 1; never reuse one after a replica loses its disk).
    #[arg(long)]
    pub id: Option<NodeId>,
    /// gRPC listen address [default: 127.0.0.1:7070].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address peers use to reach this replica [default: the listen address].
    #[arg(long)]
    pub advertise: Option<String>,
    /// HTTP address for /healthz, /readyz and /metrics [default: 127.0.0.1:9090].
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// Another replica of the initial cluster, as ID=HOST:PORT (repeat per peer).
    #[arg(long = "peer", value_name = "ID=ADDR")]
    pub peers: Vec<String>,
    /// Data directory [default: ./gangway-data].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Number of shard groups the cluster is created with [default: 4]; keep it so on every
    /// restart (`gangctl shards grow` adds shards to a running cluster).
    #[arg(long)]
    pub shards: Option<u32>,
    /// Cluster id; replicas and data dirs of another cluster are refused [default: gangway].
    #[arg(long)]
    pub cluster_id: Option<String>,
    /// Join an existing cluster as a new member (never bootstrap); an operator then adds it.
    #[arg(long)]
    pub join: bool,
    /// What a replica whose data dir holds no Raft state does: `new` may create the
    /// cluster with its --peer replicas (only once every peer answers and none holds
    /// Raft state or has seen this replica before); `existing` refuses to start
    /// [default: existing]. Ignored once the data dir holds Raft state.
    #[arg(long, value_enum)]
    pub initial_cluster_state: Option<InitialClusterState>,
    /// Node label that partitions nodes into shards (e.g. topology.kubernetes.io/zone):
    /// a domain of it stays on one shard, so give the widest level a gang may require.
    #[arg(long)]
    pub topology_label: Option<String>,
    /// A topology hierarchy: node label keys from the widest level to the narrowest,
    /// comma-separated (e.g. example.com/block,example.com/rack,kubernetes.io/hostname).
    /// Repeat for several (the first also gives Volcano's network tiers, narrowest
    /// first). A gang's preferred level falls back through the levels above it.
    #[arg(long = "topology-levels", value_name = "KEYS")]
    pub topology_levels: Vec<String>,
    /// sled page cache bound in MiB [default: 64].
    #[arg(long)]
    pub sled_cache_mb: Option<u64>,
    /// Format this replica writes commands, replies and snapshots in; it reads both.
    /// `json` only while upgrading a cluster from a release that reads nothing else
    /// (docs/ARCHITECTURE.md §3, "Encoding") [default: binary].
    #[arg(long, value_parser = wire_format_parser())]
    pub wire_format: Option<WireFormat>,
    /// Whether the coordinator moves nodes between shards on its own when one shard
    /// holds more than `--rebalance-bound-percent` of the mean capacity
    /// (docs/ARCHITECTURE.md §3a) [default: true].
    #[arg(long)]
    pub auto_rebalance: Option<bool>,
    /// A shard holding more than this percentage of the mean capacity (allocatable
    /// cpu) is rebalanced, in 101..=1000 [default: 125].
    #[arg(long)]
    pub rebalance_bound_percent: Option<u64>,
    /// Period of the coordinator's balance checks in ms, in 100..=3600000 [default: 30000].
    #[arg(long)]
    pub rebalance_check_ms: Option<u64>,
    /// Fair sharing over time: the half-life, in ms, with which each queue's past usage
    /// is forgotten; the fair order then measures a queue by its usage now plus its
    /// decayed usage (docs/ARCHITECTURE.md §5a). 0 turns it off; else in
    /// 1000..=31536000000 (one year) [default: 0].
    #[arg(long)]
    pub fair_share_half_life_ms: Option<u64>,
    /// Reservations for the head of the line (docs/ARCHITECTURE.md §4, "Reservations"):
    /// `off`, `reserve` (the first groups in the order that lack room get nodes held
    /// for them) or `backfill` (as `reserve`, and groups that cannot delay them may use
    /// those nodes) [default: off].
    #[arg(long)]
    pub head_reservations: Option<gangway_core::plan::backfill::ReservationMode>,
    /// Raft heartbeat period in ms [default: 100].
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Raft election timeout lower bound in ms [default: 300].
    #[arg(long)]
    pub election_min_ms: Option<u64>,
    /// Raft election timeout upper bound (and leader lease) in ms [default: 600].
    #[arg(long)]
    pub election_max_ms: Option<u64>,
    /// Fewest entries between automatic snapshots [default: 10000]; a large state also
    /// waits for a quarter of its last snapshot's size in commands.
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// Period of automatic leader balancing in ms, 0 to disable [default: 30000].
    #[arg(long)]
    pub balance_interval_ms: Option<u64>,
    /// Schedule a Kubernetes cluster's pods: the kubeconfig to reach its API server.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Schedule the Kubernetes cluster this replica runs in (service-account config).
    #[arg(long)]
    pub in_cluster: bool,
    /// The schedulerName of the pods to schedule [default: gangway].
    #[arg(long)]
    pub scheduler_name: Option<String>,
    /// Binding writes (claim status, bindings) per second per replica, 0 for no limit [default: 5000].
    #[arg(long)]
    pub bind_qps: Option<u32>,
    /// Bindings in flight per replica [default: 64].
    #[arg(long)]
    pub bind_concurrency: Option<usize>,
    /// PEM certificate chain of this replica: with --tls-key and --tls-client-ca, the gRPC
    /// port speaks mutual TLS only (peers and clients), and peers are reached over TLS.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that signs every peer's and client's certificate.
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// With TLS: `required` (every caller presents a client certificate) or `optional`
    /// (a caller that sends a bearer token may come without one; peers still present
    /// their peer certificate) [default: required].
    #[arg(long, value_enum)]
    pub tls_client_certs: Option<ClientCerts>,
    /// File of administrator bearer tokens (one per line, `#` comments): a client sending
    /// one (`authorization: Bearer <token>`) may do everything. Give tenants, node agents
    /// and viewers narrower rights with --policy-file or --kube-auth.
    #[arg(long)]
    pub auth_tokens_file: Option<PathBuf>,
    /// Access policy (YAML): identities (by token or client certificate CN) with roles
    /// admin, tenant, node or viewer and their grants; re-read when it changes. See
    /// README "Security model".
    #[arg(long)]
    pub policy_file: Option<PathBuf>,
    /// Authenticate bearer tokens not in the policy with the Kubernetes API
    /// (TokenReview) and authorize their users with SubjectAccessReview against RBAC
    /// rules in API group gangway.dev (needs --in-cluster or --kubeconfig).
    #[arg(long)]
    pub kube_auth: bool,
    /// File holding the peer secret (the same on every replica; one per line, the first
    /// keys this replica's proofs, every line is accepted; at least 16 characters): the
    /// Raft transport serves only callers that prove they hold it (the secret itself is
    /// never sent). Required when the replica has peers or joins; without peers a random
    /// one is made in memory.
    #[arg(long)]
    pub peer_secret_file: Option<PathBuf>,
    /// Serve the Raft transport (and the Admin service, for peers) on this address alone,
    /// so the network can open it to replicas only; --advertise and every --peer then
    /// name peer ports [default: the Raft transport shares --listen].
    #[arg(long)]
    pub peer_listen: Option<SocketAddr>,
    /// A host path prefix a node agent's allocations may name in mounts and device nodes
    /// (repeatable) [default: /dev/ /opt/ /run/ /usr/ /var/lib/; /dev/mem, /dev/kmem and
    /// /dev/port never].
    #[arg(long = "allocation-host-path-prefix", value_name = "PREFIX")]
    pub allocation_host_path_prefixes: Vec<String>,
    /// Take tokens on the plaintext HTTP port (the web view's sign-in) although the gRPC
    /// port speaks TLS: for a trusted network only; otherwise the web view takes them only
    /// through a TLS-terminating proxy (`X-Forwarded-Proto: https`).
    #[arg(long)]
    pub ui_plaintext_tokens: bool,
    /// Honour the crash points named by GANGWAY_TEST_FAILPOINTS (fault tests only).
    #[arg(long, hide = true)]
    pub test_failpoints: bool,
    /// Fault tests only (needs --test-failpoints): dial the peer advertised at ADDR
    /// through VIA instead, a proxy that can cut or delay that one link. Repeatable.
    #[arg(long = "test-peer-route", value_name = "ADDR=VIA", hide = true)]
    pub test_peer_routes: Vec<String>,
}

/// The config file's keys (kebab-case, as the flags).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    id: Option<NodeId>,
    listen: Option<SocketAddr>,
    advertise: Option<String>,
    http: Option<SocketAddr>,
    peers: Option<BTreeMap<String, String>>,
    data: Option<PathBuf>,
    shards: Option<u32>,
    cluster_id: Option<String>,
    join: Option<bool>,
    initial_cluster_state: Option<InitialClusterState>,
    topology_label: Option<String>,
    topology_levels: Option<Vec<String>>,
    sled_cache_mb: Option<u64>,
    wire_format: Option<WireFormat>,
    auto_rebalance: Option<bool>,
    rebalance_bound_percent: Option<u64>,
    rebalance_check_ms: Option<u64>,
    fair_share_half_life_ms: Option<u64>,
    head_reservations: Option<gangway_core::plan::backfill::ReservationMode>,
    heartbeat_ms: Option<u64>,
    election_min_ms: Option<u64>,
    election_max_ms: Option<u64>,
    snapshot_every: Option<u64>,
    balance_interval_ms: Option<u64>,
    kubeconfig: Option<PathBuf>,
    in_cluster: Option<bool>,
    scheduler_name: Option<String>,
    scheduler_config: Option<PathBuf>,
    bind_qps: Option<u32>,
    bind_concurrency: Option<usize>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    tls_client_certs: Option<ClientCerts>,
    auth_tokens_file: Option<PathBuf>,
    policy_file: Option<PathBuf>,
    kube_auth: Option<bool>,
    peer_secret_file: Option<PathBuf>,
    peer_listen: Option<SocketAddr>,
    allocation_host_path_prefixes: Option<Vec<String>>,
    ui_plaintext_tokens: Option<bool>,
}

/// Whether TLS clients must present a certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ClientCerts {
    /// Every caller presents one.
    #[default]
    Required,
    /// A caller with a bearer token may come without one.
    Optional,
}

/// What a replica with no Raft state may do (as etcd's `--initial-cluster-state`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum InitialClusterState {
    /// Create the cluster with the --peer replicas, if none of them has formed it yet.
    New,
    /// The cluster exists: a blank replica refuses to start (it lost its disk, or
    /// must use --join).
    #[default]
    Existing,
}

/// A validated `gangway serve` configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// This replica's id.
    pub id: NodeId,
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Address peers reach us at.
    pub advertise: String,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// The other replicas of the initial cluster.
    pub peers: BTreeMap<NodeId, String>,
    /// Data directory.
    pub data: PathBuf,
    /// Number of shard groups.
    pub shards: u32,
    /// Cluster id.
    pub cluster_id: String,
    /// Join instead of bootstrapping.
    pub join: bool,
    /// Whether a blank replica may create the cluster.
    pub initial_cluster_state: InitialClusterState,
    /// Shard partitioning label.
    pub topology_label: Option<String>,
    /// sled cache bound in bytes.
    pub sled_cache_bytes: u64,
    /// The format this replica writes.
    pub wire: WireFormat,
    /// Automatic rebalancing of the shards.
    pub rebalance: gangway_core::plan::rebalance::RebalancePolicy,
    /// The half-life of fair sharing over time, in ms; 0: off.
    pub fair_share_half_life_ms: u64,
    /// Reservations for the head of the line.
    pub head_reservations: gangway_core::plan::backfill::ReservationMode,
    /// Raft timing.
    pub timing: RaftTiming,
    /// The Kubernetes cluster to schedule, if any.
    pub kube: Option<(crate::kube::ApiServer, crate::kube::KubeOptions)>,
    /// Mutual TLS files, if the gRPC port is secured.
    pub tls: Option<crate::security::TlsFiles>,
    /// Whether TLS clients with a token may come without a certificate.
    pub tls_client_certs: ClientCerts,
    /// The administrator token file.
    pub auth_tokens_file: Option<PathBuf>,
    /// The access policy file.
    pub policy_file: Option<PathBuf>,
    /// Whether the Kubernetes API reviews other bearer tokens.
    pub kube_auth: bool,
    /// The Raft transport's own listen address, if it has one.
    pub peer_listen: Option<SocketAddr>,
    /// Host path prefixes allocations may name.
    pub allocation_host_path_prefixes: Vec<String>,
    /// Whether the web view takes tokens over plaintext although the gRPC port speaks TLS.
    pub ui_plaintext_tokens: bool,
    /// The peer secret file; `None` only for a replica without peers.
    pub peer_secret_file: Option<PathBuf>,
    /// Whether test crash points are honoured.
    pub test_failpoints: bool,
    /// Fault tests only: advertised peer address -> address dialled.
    pub peer_routes: BTreeMap<String, String>,
    /// How nodes are scored (from --scheduler-config).
    pub profile: gangway_core::engine::Profile,
}

/// The hierarchies `--topology-levels` gives (each comma-separated, widest first).
pub fn parse_topologies(
    flags: &[String],
) -> Result<Vec<gangway_core::model::TopologyHierarchy>, ConfigError> {
    let hierarchies: Vec<gangway_core::model::TopologyHierarchy> = flags
        .iter()
        .enumerate()
        .map(|(i, text)| gangway_core::model::TopologyHierarchy {
            name: format!("topology-{i}"),
            levels: text
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
        })
        .collect();
    let profile = gangway_core::engine::Profile {
        topologies: hierarchies,
        ..gangway_core::engine::Profile::default()
    };
    profile
        .validate()
        .map_err(|e| invalid("--topology-levels", e.to_string()))?;
    Ok(profile.topologies)
}

/// What `--config` names: gangway's own TOML, or a kube-scheduler configuration.
enum ConfigFile {
    Gangway(Box<FileConfig>),
    Scheduler(PathBuf),
}

fn read_file(path: &Path) -> Result<ConfigFile, ConfigError> {
    let file_err = |reason: String| ConfigError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    if crate::scheduler_config::is_scheduler_config(&text) {
        return Ok(ConfigFile::Scheduler(path.to_path_buf()));
    }
    toml::from_str(&text)
        .map(|f| ConfigFile::Gangway(Box::new(f)))
        .map_err(|e| file_err(e.to_string()))
}

/// The scoring profile the kube-scheduler configuration at `path` gives pods named
/// `scheduler_name`; errors name the file and the field in it.
pub fn read_scheduler_config(
    path: &Path,
    scheduler_name: &str,
) -> Result<gangway_core::engine::Profile, ConfigError> {
    let file_err = |reason: String| ConfigError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    crate::scheduler_config::parse(&text, scheduler_name).map_err(|e| file_err(e.to_string()))
}

/// Parses `ID=HOST:PORT`.
pub fn parse_peer(field: &str, text: &str) -> Result<(NodeId, String), ConfigError> {
    let (id, addr) = text
        .split_once('=')
        .ok_or_else(|| invalid(field, format!("{text:?} is not ID=HOST:PORT")))?;
    let id: NodeId = id
        .trim()
        .parse()
        .map_err(|_| invalid(field, format!("{text:?}: node id {id:?} is not a number")))?;
    let addr = addr.trim();
    let port_ok = addr
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !port_ok {
        return Err(invalid(
            field,
            format!("{text:?}: address {addr:?} is not HOST:PORT"),
        ));
    }
    Ok((id, addr.to_string()))
}

/// Parses `--test-peer-route ADDR=VIA` flags, which only fault tests may set.
fn parse_peer_routes(
    flags: &[String],
    test_failpoints: bool,
) -> Result<BTreeMap<String, String>, ConfigError> {
    const FIELD: &str = "--test-peer-route";
    if !flags.is_empty() && !test_failpoints {
        return Err(invalid(
            FIELD,
            "is for fault tests only and needs --test-failpoints",
        ));
    }
    let mut routes = BTreeMap::new();
    for flag in flags {
        let Some((addr, via)) = flag.split_once('=') else {
            return Err(invalid(FIELD, format!("{flag:?} is not ADDR=VIA")));
        };
        if addr.is_empty() || via.is_empty() {
            return Err(invalid(FIELD, format!("{flag:?} is not ADDR=VIA")));
        }
        if routes.insert(addr.to_string(), via.to_string()).is_some() {
            return Err(invalid(FIELD, format!("{addr} is routed twice")));
        }
    }
    Ok(routes)
}

/// The TLS files: all three or none.
fn resolve_tls(
    args: &ServeArgs,
    file: &FileConfig,
) -> Result<Option<crate::security::TlsFiles>, ConfigError> {
    let cert = args.tls_cert.clone().or(file.tls_cert.clone());
    let key = args.tls_key.clone().or(file.tls_key.clone());
    let client_ca = args.tls_client_ca.clone().or(file.tls_client_ca.clone());
    match (cert, key, client_ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(client_ca)) => Ok(Some(crate::security::TlsFiles {
            cert,
            key,
            client_ca,
        })),
        (cert, key, ca) => {
            let missing: Vec<&str> = [
                ("--tls-cert", cert.is_none()),
                ("--tls-key", key.is_none()),
                ("--tls-client-ca", ca.is_none()),
            ]
            .into_iter()
            .filter_map(|(flag, gone)| gone.then_some(flag))
            .collect();
            Err(invalid(
                "--tls-cert/--tls-key/--tls-client-ca",
                format!("mutual TLS needs all three; missing {}", missing.join(", ")),
            ))
        }
    }
}

/// The Kubernetes part of the configuration: which API server, and how to schedule its pods.
fn resolve_kube(
    args: &ServeArgs,
    file: &FileConfig,
) -> Result<Option<(crate::kube::ApiServer, crate::kube::KubeOptions)>, ConfigError> {
    use crate::kube::{ApiServer, KubeOptions};
    let kubeconfig = args.kubeconfig.clone().or(file.kubeconfig.clone());
    let in_cluster = args.in_cluster || file.in_cluster.unwrap_or(false);
    let server = match (kubeconfig, in_cluster) {
        (Some(_), true) => {
            return Err(invalid(
                "--kubeconfig/--in-cluster",
                "name one way to reach the API server, not both",
            ))
        }
        (Some(path), false) => ApiServer::Kubeconfig(path),
        (None, true) => ApiServer::InCluster,
        (None, false) => return Ok(None),
    };
    let defaults = KubeOptions::default();
    let scheduler_name = args
        .scheduler_name
        .clone()
        .or(file.scheduler_name.clone())
        .unwrap_or(defaults.scheduler_name);
    if scheduler_name.is_empty() || scheduler_name.len() > 253 {
        return Err(invalid("--scheduler-name", "must be 1..=253 characters"));
    }
    let bind_concurrency = args
        .bind_concurrency
        .or(file.bind_concurrency)
        .unwrap_or(defaults.bind_concurrency);
    if bind_concurrency == 0 || bind_concurrency > 4_096 {
        return Err(invalid(
            "--bind-concurrency",
            format!("{bind_concurrency} is not in 1..=4096"),
        ));
    }
    let opts = KubeOptions {
        scheduler_name,
        bind_qps: args.bind_qps.or(file.bind_qps).unwrap_or(defaults.bind_qps),
        bind_concurrency,
        failpoints: crate::failpoints::Failpoints::disabled(),
        topologies: Vec::new(),
        learned_topologies: std::sync::Arc::default(),
    };
    Ok(Some((server, opts)))
}

impl ServeConfig {
    /// Merges flags over the config file and checks the result.
    pub fn resolve(args: ServeArgs) -> Result<Self, ConfigError> {
        let (file, scheduler_file) = match &args.config {
            Some(p) => match read_file(p)? {
                ConfigFile::Gangway(f) => (*f, None),
                ConfigFile::Scheduler(path) => (FileConfig::default(), Some(path)),
            },
            None => (FileConfig::default(), None),
        };
        let scheduler_config = match (
            args.scheduler_config.clone(),
            scheduler_file,
            file.scheduler_config.clone(),
        ) {
            (Some(_), Some(_), _) => {
                return Err(invalid(
                    "--config/--scheduler-config",
                    "both name a kube-scheduler configuration; give one",
                ))
            }
            (Some(p), None, _) | (None, Some(p), _) | (None, None, Some(p)) => Some(p),
            (None, None, None) => None,
        };
        let kube = resolve_kube(&args, &file)?;
        let scheduler_name = match &kube {
            Some((_, opts)) => opts.scheduler_name.clone(),
            None => crate::kube::KubeOptions::default().scheduler_name,
        };
        let mut profile = match &scheduler_config {
            Some(path) => read_scheduler_config(path, &scheduler_name)?,
            None => gangway_core::engine::Profile::default(),
        };
        let levels = match (args.topology_levels.is_empty(), &file.topology_levels) {
            (true, Some(levels)) => levels.clone(),
            _ => args.topology_levels.clone(),
        };
        profile.topologies = parse_topologies(&levels)?;
        let mut kube = kube;
        if let Some((_, opts)) = kube.as_mut() {
            opts.topologies = profile.topologies.clone();
        }
        let tls = resolve_tls(&args, &file)?;
        let auth_tokens_file = args
            .auth_tokens_file
            .clone()
            .or(file.auth_tokens_file.clone());
        let id = args
            .id
            .or(file.id)
            .ok_or_else(|| invalid("--id", "required (this replica's node id, >= 1)"))?;
        if id == 0 {
            return Err(invalid("--id", "node ids start at 1"));
        }
        let listen = args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070)));
        let advertise = args
            .advertise
            .or(file.advertise)
            .unwrap_or_else(|| listen.to_string());
        let http = args
            .http
            .or(file.http)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 9090)));
        let mut peers = BTreeMap::new();
        let flag_peers = args.peers.iter().map(|p| parse_peer("--peer", p));
        let file_peers = file
            .peers
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| parse_peer("peers", &format!("{k}={v}")));
        let (source, list): (&str, Vec<_>) = if args.peers.is_empty() {
            ("peers", file_peers.collect())
        } else {
            ("--peer", flag_peers.collect())
        };
        for peer in list {
            let (pid, addr) = peer?;
            if pid == id {
                return Err(invalid(source, format!("{pid}={addr} names this process itself (--id {id}); list only the other replicas")));
            }
            if pid == 0 {
                return Err(invalid(source, "node ids start at 1"));
            }
            if peers.insert(pid, addr.clone()).is_some() {
                return Err(invalid(source, format!("node {pid} is listed twice")));
            }
            if addr == advertise {
                return Err(invalid(
                    source,
                    format!("{pid}={addr} is this process's own address"),
                ));
            }
        }
        let peer_secret_file = args
            .peer_secret_file
            .clone()
            .or(file.peer_secret_file.clone());
        let join = args.join || file.join.unwrap_or(false);
        let initial_cluster_state = args
            .initial_cluster_state
            .or(file.initial_cluster_state)
            .unwrap_or_default();
        if join && initial_cluster_state == InitialClusterState::New {
            return Err(invalid(
                "--initial-cluster-state",
                "`new` creates a cluster and --join joins one; give one of them",
            ));
        }
        if peer_secret_file.is_none() && (!peers.is_empty() || join) {
            return Err(invalid(
                "--peer-secret-file",
                "required for a replica with peers: give every replica the same file \
                 (for example `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > peer-secret`); \
                 the Raft transport serves only callers that send it",
            ));
        }
        let tls_client_certs = args
            .tls_client_certs
            .or(file.tls_client_certs)
            .unwrap_or_default();
        if tls_client_certs == ClientCerts::Optional && tls.is_none() {
            return Err(invalid(
                "--tls-client-certs",
                "applies to TLS only: give --tls-cert, --tls-key and --tls-client-ca",
            ));
        }
        let policy_file = args.policy_file.clone().or(file.policy_file.clone());
        let kube_auth = args.kube_auth || file.kube_auth.unwrap_or(false);
        if kube_auth && kube.is_none() {
            return Err(invalid(
                "--kube-auth",
                "needs the Kubernetes API: give --in-cluster or --kubeconfig",
            ));
        }
        let peer_listen = args.peer_listen.or(file.peer_listen);
        if peer_listen.is_some_and(|p| p == listen) {
            return Err(invalid(
                "--peer-listen",
                "is the --listen address; give the Raft transport a port of its own, or leave it out",
            ));
        }
        let allocation_host_path_prefixes = match (
            args.allocation_host_path_prefixes.is_empty(),
            &file.allocation_host_path_prefixes,
        ) {
            (false, _) => args.allocation_host_path_prefixes.clone(),
            (true, Some(list)) => list.clone(),
            (true, None) => gangway_core::model::node_allocation::HOST_PATH_PREFIXES_DEFAULT
                .iter()
                .map(|p| p.to_string())
                .collect(),
        };
        if let Some(bad) = allocation_host_path_prefixes
            .iter()
            .find(|p| !p.starts_with('/') || !p.ends_with('/') || p.split('/').any(|c| c == ".."))
        {
            return Err(invalid(
                "--allocation-host-path-prefix",
                format!("{bad:?}: an absolute directory ending in '/', without \"..\""),
            ));
        }
        let shards = args.shards.or(file.shards).unwrap_or(SHARDS_DEFAULT);
        if shards == 0 || shards > SHARDS_MAX {
            return Err(invalid(
                "--shards",
                format!("{shards} is not in 1..={SHARDS_MAX}"),
            ));
        }
        let cluster_id = args
            .cluster_id
            .or(file.cluster_id)
            .unwrap_or_else(|| "gangway".into());
        if cluster_id.is_empty()
            || !cluster_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                "--cluster-id",
                format!("{cluster_id:?}: use letters, digits, '-' and '_'"),
            ));
        }
        let peer_routes = parse_peer_routes(&args.test_peer_routes, args.test_failpoints)?;
        let wire = args.wire_format.or(file.wire_format).unwrap_or_default();
        let rebalance = rebalance_policy(
            args.auto_rebalance.or(file.auto_rebalance),
            args.rebalance_bound_percent
                .or(file.rebalance_bound_percent),
            args.rebalance_check_ms.or(file.rebalance_check_ms),
        )?;
        let fair_share_half_life_ms = fair_share_half_life(
            args.fair_share_half_life_ms
                .or(file.fair_share_half_life_ms),
        )?;
        let head_reservations = args
            .head_reservations
            .or(file.head_reservations)
            .unwrap_or_default();
        let defaults = RaftTiming::default();
        let timing = RaftTiming {
            heartbeat_ms: args
                .heartbeat_ms
                .or(file.heartbeat_ms)
                .unwrap_or(defaults.heartbeat_ms),
            election_min_ms: args
                .election_min_ms
                .or(file.election_min_ms)
                .unwrap_or(defaults.election_min_ms),
            election_max_ms: args
                .election_max_ms
                .or(file.election_max_ms)
                .unwrap_or(defaults.election_max_ms),
            snapshot_every_entries: args
                .snapshot_every
                .or(file.snapshot_every)
                .unwrap_or(defaults.snapshot_every_entries),
            keep_after_snapshot_entries: defaults.keep_after_snapshot_entries,
            balance_interval_ms: args
                .balance_interval_ms
                .or(file.balance_interval_ms)
                .unwrap_or(defaults.balance_interval_ms),
        };
        if timing.heartbeat_ms == 0
            || timing.election_min_ms <= timing.heartbeat_ms
            || timing.election_max_ms <= timing.election_min_ms
        {
            return Err(invalid(
                "--heartbeat-ms/--election-min-ms/--election-max-ms",
                "need 0 < heartbeat < election min < election max",
            ));
        }
        if timing.snapshot_every_entries == 0 {
            return Err(invalid("--snapshot-every", "must be >= 1"));
        }
        Ok(ServeConfig {
            id,
            listen,
            advertise,
            http,
            peers,
            data: args
                .data
                .or(file.data)
                .unwrap_or_else(|| PathBuf::from("gangway-data")),
            shards,
            cluster_id,
            join,
            initial_cluster_state,
            topology_label: args.topology_label.or(file.topology_label),
            sled_cache_bytes: args
                .sled_cache_mb
                .or(file.sled_cache_mb)
                .unwrap_or(SLED_CACHE_MB_DEFAULT)
                * 1024
                * 1024,
            timing,
            kube,
            tls,
            tls_client_certs,
            auth_tokens_file,
            policy_file,
            kube_auth,
            peer_listen,
            allocation_host_path_prefixes,
            ui_plaintext_tokens: args.ui_plaintext_tokens
                || file.ui_plaintext_tokens.unwrap_or(false),
            peer_secret_file,
            profile,
            test_failpoints: args.test_failpoints,
            peer_routes,
            wire,
            rebalance,
            fair_share_half_life_ms,
            head_reservations,
        })
    }

    /// Every member of the initial cluster, this replica included.
    pub fn initial_members(&self) -> BTreeMap<NodeId, String> {
        let mut m = self.peers.clone();
        m.insert(self.id, self.advertise.clone());
        m
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
