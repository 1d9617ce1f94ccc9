//! `gangway agent`: a node agent for fleets without kubelets, which existing
//! Kubernetes device plugins plug into unchanged.
//!
//! It registers its node through the Inventory API (labels, taints, and allocatable
//! from flags or, for cpu and memory, from the host), renews the node lease with
//! heartbeats, and serves the device plugin API's `Registration` service on a Unix
//! socket (the kubelet's path by default). A plugin that registers is checked as the
//! kubelet checks it (`registration`), its `GetDevicePluginOptions` is called before
//! `Register` returns, and its `ListAndWatch` is forwarded to gangway as the node's
//! device stream for that resource (`plugins`). Devices gangway gives a member here
//! are allocated through the plugin, checkpointed on disk and reported back to the
//! member's placement status (`allocations`). Dependencies arrive through
//! [`run`]; every task stops with its shutdown. Called by the `gangway` binary.

pub mod allocations;
pub mod plugins;
pub mod registration;
pub mod unix;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use gangway_client::{Client, Credentials};
use gangway_proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gangway_proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use gangway_proto::deviceplugin::{Empty, RegisterRequest};
use gangway_proto::v1::{NodeSpec, Taint};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use plugins::{Plugins, Upstream};

/// The kubelet's device plugin directory, where plugins look for `kubelet.sock`.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The registration socket's file name in that directory.
pub const REGISTRATION_SOCKET: &str = "kubelet.sock";
/// Heartbeats per lease: a lease of 40 s is renewed every 10 s.
pub const HEARTBEATS_PER_LEASE: u64 = 4;
/// Shortest pause between heartbeats, in ms.
pub const HEARTBEAT_MIN_MS: u64 = 250;
/// Time the agent waits for gangway at start before it gives up, in ms.
pub const START_TIMEOUT_MS: u64 = 60_000;
/// Pause between attempts to reach gangway at start or after a failure, in ms.
pub const RECONNECT_PAUSE_MS: u64 = 500;

/// `gangway agent` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// gangway replicas' gRPC addresses, comma-separated (any of them; the agent moves
    /// to the next that answers when one fails).
    #[arg(long = "server", required = true, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// This node's name (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Allocatable cpu (a Kubernetes quantity; default: this host's CPU count).
    #[arg(long)]
    pub cpu: Option<String>,
    /// Allocatable memory (a Kubernetes quantity; default: this host's MemTotal).
    #[arg(long)]
    pub memory: Option<String>,
    /// Allocatable pods.
    #[arg(long, default_value = "110")]
    pub pods: String,
    /// A node label, `key=value` (repeatable).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// A node taint, `key=value:Effect` or `key:Effect` (repeatable).
    #[arg(long = "taint")]
    pub taints: Vec<String>,
    /// The device plugin directory: the agent serves `kubelet.sock` there and finds
    /// each plugin's socket there.
    #[arg(long, default_value = DEVICE_PLUGIN_DIR)]
    pub device_plugin_dir: PathBuf,
    /// How long the node lease lasts without a heartbeat, in ms (1,000 to 600,000).
    #[arg(long, default_value_t = 40_000)]
    pub lease_ms: u64,
    /// Serve Prometheus metrics on `GET /metrics` (and `GET /healthz`) at this address;
    /// none when left out.
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    /// PEM CA that signed the replicas' certificates (replicas run with --tls-*).
    #[arg(long, env = "GANGWAY_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate (mutual TLS), with --tls-key.
    #[arg(long, env = "GANGWAY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long, env = "GANGWAY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Bearer token (replicas run with --auth-tokens-file); prefer the environment variable.
    #[arg(long, env = "GANGWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Where gangway is, and how the agent proves who it is.
#[derive(Clone)]
pub struct Gangway {
    /// Replicas' gRPC addresses; the first that answers is used.
    pub servers: Vec<String>,
    /// TLS identity and token, as `gangctl` sends them.
    pub credentials: Credentials,
}

impl Gangway {
    /// A client of the first replica that answers.
    pub async fn connect(&self) -> Result<Client, gangway_client::ClientError> {
        Client::connect_with(&self.servers, self.credentials.clone()).await
    }
}

/// Runs the agent until `shutdown` resolves; `prometheus` renders `/metrics` when
/// `--http` is given.
pub async fn run(
    args: AgentArgs,
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let node = node_spec(&args)?;
    let http = match args.http {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--http)"))?,
        ),
        None => None,
    };
    let name = node.name.clone();
    let socket = args.device_plugin_dir.join(REGISTRATION_SOCKET);
    let listener = unix::listen(&socket).with_context(|| {
        format!(
            "cannot listen on {} (--device-plugin-dir)",
            socket.display()
        )
    })?;
    let checkpoint_path = args.device_plugin_dir.join(allocations::CHECKPOINT_FILE);
    let checkpoint = allocations::Checkpoint::load(&checkpoint_path)?;
    let credentials = Credentials::from_files(
        args.tls_ca.as_deref(),
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
        args.token.clone(),
    )?;
    let gangway = Gangway {
        servers: args.servers.clone(),
        credentials,
    };
    // Plugins may register as soon as the socket exists: serve it first.
    let (stop_tx, stop_rx) = watch::channel(false);
    let upstream = Upstream {
        gangway: gangway.clone(),
        node: name.clone(),
    };
    let (plugins, upstream_task) = Plugins::new(upstream, stop_rx.clone());
    let service = RegistrationService {
        dir: args.device_plugin_dir.clone(),
        plugins: plugins.clone(),
    };
    let mut server_stop = stop_rx.clone();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = server_stop.changed().await;
            }),
    );
    let mut shutdown = std::pin::pin!(shutdown);
    let started = tokio::select! {
        started = register_at_start(&gangway, &node) => started,
        _ = &mut shutdown => Err(anyhow::anyhow!(
            "stopped before gangway took node {name}"
        )),
    };
    let client = match started {
        Ok(client) => client,
        Err(e) => {
            let _ = stop_tx.send(true);
            plugins.stop_all();
            let _ = server.await;
            let _ = upstream_task.await;
            let _ = std::fs::remove_file(&socket);
            return Err(e);
        }
    };
    println!(
        "gangway agent: node {name} registered with gangway at {}",
        client.addr()
    );
    println!("  device plugins register at {}", socket.display());
    if let Some(l) = &http {
        println!("  metrics at http://{}/metrics", l.local_addr()?);
    }
    let allocator = tokio::spawn(allocations::run(
        gangway.clone(),
        name.clone(),
        plugins.clone(),
        checkpoint_path,
        checkpoint,
        stop_rx.clone(),
    ));
    let metrics_server = http.map(|listener| {
        let state = crate::observe::http::HttpState {
            hosts: Vec::new(),
            prometheus: prometheus.clone(),
        };
        let mut stop = stop_rx.clone();
        tokio::spawn(crate::observe::http::serve(
            listener,
            state,
            None,
            async move {
                let _ = stop.changed().await;
            },
        ))
    });
    let heartbeats = tokio::spawn(heartbeat(
        gangway.clone(),
        node,
        args.lease_ms,
        stop_rx.clone(),
    ));
    shutdown.await;
    println!("gangway agent: shutting down");
    let _ = stop_tx.send(true);
    plugins.stop_all();
    let _ = heartbeats.await;
    let _ = allocator.await;
    let _ = upstream_task.await;
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    if let Ok(Err(e)) = server.await {
        tracing::warn!(error = %e, "the registration service ended with an error");
    }
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// Registers the node with the first replica that answers, trying for
/// [`START_TIMEOUT_MS`] while gangway is unreachable or has no leader; a refusal (a bad
/// token, a bad node spec) ends the agent at once, with gangway's reason.
async fn register_at_start(gangway: &Gangway, node: &NodeSpec) -> anyhow::Result<Client> {
    use gangway_client::ClientError;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
    loop {
        let error = match gangway.connect().await {
            Ok(client) => match client.update_node(node.clone()).await {
                Ok(_) => return Ok(client),
                Err(ClientError::Rpc(status)) if !transient(status.code()) => {
                    return Err(anyhow::anyhow!(
                        "gangway refused node {}: {}: {}",
                        node.name,
                        status.code(),
                        status.message()
                    ))
                }
                Err(e) => e,
            },
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(error).with_context(|| {
                format!(
                    "no gangway replica took node {} within {START_TIMEOUT_MS} ms (--server)",
                    node.name
                )
            });
        }
        tracing::debug!(error = %error, "gangway not reachable yet");
        tokio::time::sleep(Duration::from_millis(RECONNECT_PAUSE_MS)).await;
    }
}

/// Whether a call failing with `code` may succeed if tried again (no leader yet, a
/// replica going away).
fn transient(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted
    )
}

/// Renews the node lease every lease / [`HEARTBEATS_PER_LEASE`]; after a failure it
/// reconnects (to the next replica that answers) and registers the node again, so a
/// cluster that lost it (a new data dir) learns it back.
async fn heartbeat(
    gangway: Gangway,
    node: NodeSpec,
    lease_ms: u64,
    mut stop: watch::Receiver<bool>,
) {
    let period = Duration::from_millis((lease_ms / HEARTBEATS_PER_LEASE).max(HEARTBEAT_MIN_MS));
    let mut client: Option<Client> = None;
    loop {
        if client.is_none() {
            client = gangway.connect().await.ok();
        }
        if let Some(c) = &client {
            match c.heartbeat(&node.name, true, lease_ms).await {
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat failed; reconnecting");
                    if c.update_node(node.clone()).await.is_err() {
                        client = None;
                    }
                }
            }
        }
        let pause = if client.is_some() {
            period
        } else {
            Duration::from_millis(RECONNECT_PAUSE_MS)
        };
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// The node as flags and the host describe it. Device plugin resources are not listed:
/// their devices serve them.
fn node_spec(args: &AgentArgs) -> anyhow::Result<NodeSpec> {
    let name = match &args.node {
        Some(n) => n.clone(),
        None => host_name().context("no --node given and the host name is unknown")?,
    };
    let cpu = match &args.cpu {
        Some(c) => c.clone(),
        None => std::thread::available_parallelism()
            .map(|n| n.get().to_string())
            .context("no --cpu given and the host's CPU count is unknown")?,
    };
    let memory = match &args.memory {
        Some(m) => m.clone(),
        None => host_memory().context("no --memory given and /proc/meminfo has no MemTotal")?,
    };
    let mut labels = BTreeMap::new();
    for pair in &args.labels {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--label {pair:?}: expected key=value"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let taints = args
        .taints
        .iter()
        .map(|t| parse_taint(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(NodeSpec {
        name,
        labels: labels.into_iter().collect(),
        taints,
        allocatable: [
            ("cpu".to_string(), cpu),
            ("memory".to_string(), memory),
            ("pods".to_string(), args.pods.clone()),
        ]
        .into_iter()
        .collect(),
        unschedulable: false,
        not_ready: false,
    })
}

/// `key=value:Effect` or `key:Effect`.
fn parse_taint(text: &str) -> anyhow::Result<Taint> {
    let (kv, effect) = text
        .rsplit_once(':')
        .with_context(|| format!("--taint {text:?}: expected key=value:Effect"))?;
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    Ok(Taint {
        key: key.to_string(),
        value: value.to_string(),
        effect: effect.to_string(),
    })
}

fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_lowercase();
    (!name.is_empty()).then_some(name)
}

/// MemTotal from /proc/meminfo, as a quantity in bytes.
fn host_memory() -> Option<String> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((kib * 1024).to_string())
}

/// The device plugin API's `Registration`, as the kubelet serves it.
struct RegistrationService {
    dir: PathBuf,
    plugins: Plugins,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        registration::check(&r.version, &r.resource_name, &r.endpoint)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let path = self.dir.join(&r.endpoint);
        let channel = unix::connect(&path).await.map_err(|e| {
            Status::unavailable(format!(
                "cannot reach the plugin at {}: {e}; serve before registering",
                path.display()
            ))
        })?;
        let mut plugin = DevicePluginClient::new(channel);
        let options = tokio::time::timeout(
            Duration::from_millis(plugins::PLUGIN_CALL_TIMEOUT_MS),
            plugin.get_device_plugin_options(Empty {}),
        )
        .await
        .map_err(|_| {
            Status::unavailable(format!(
                "GetDevicePluginOptions did not answer within {} ms",
                plugins::PLUGIN_CALL_TIMEOUT_MS
            ))
        })?
        .map_err(|e| {
            Status::unavailable(format!("GetDevicePluginOptions failed: {}", e.message()))
        })?
        .into_inner();
        self.plugins
            .start(&r.resource_name, &r.endpoint, plugin, options);
        Ok(Response::new(Empty {}))
    }
}

#[cfg(test)]
mod tests;
