//! The device plugins registered with gangway-agent, and each one's link to gangway.
//!
//! Owns one [`PluginLink`] task per resource name: it reads the plugin's
//! `ListAndWatch` and forwards every device list, with health, to gangway's
//! `ListAndWatchDevices` as the node's report for that resource. A plugin that
//! registers again under the same resource name replaces the old link (its task is
//! stopped), as the kubelet replaces the endpoint. When gangway's stream breaks (a
//! replica fails) the link reconnects, to the next replica that answers, and sends the
//! last list again; when the plugin's stream ends the link ends and closes gangway's
//! stream, so the node's devices enter gangway's grace period (5 minutes) instead of
//! evicting their holders at once: a plugin restart keeps what is placed. Invariants:
//! at most one link per resource; every wait is bounded. Called by the agent's
//! `Registration` service; stopped by the agent's shutdown.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_client::Client;
use gangway_proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gangway_proto::deviceplugin::{DevicePluginOptions, Empty, ListAndWatchResponse};
use gangway_proto::v1::{DeviceHealth, DeviceListAck, DeviceListReport, PluginDevice};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::frontdoor::devices::device_name;

/// Time gangway has to acknowledge a device report, in ms.
pub const ACK_TIMEOUT_MS: u64 = 10_000;
/// Attempts to deliver one device report before the link waits for the next change.
pub const REPORT_ATTEMPTS_MAX: u32 = 8;
/// First pause between delivery attempts, in ms (doubling up to the max).
pub const REPORT_BACKOFF_MIN_MS: u64 = 100;
/// Longest pause between delivery attempts, in ms.
pub const REPORT_BACKOFF_MAX_MS: u64 = 2_000;
/// Reports queued toward gangway's stream.
const REPORTS_QUEUED_MAX: usize = 2;
/// The health a plugin reports for a usable device.
pub const HEALTHY: &str = "Healthy";

/// Where gangway is and which node the agent speaks for.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// gangway replicas' gRPC addresses; the first that answers is used.
    pub servers: Vec<String>,
    /// This node's name.
    pub node: String,
}

/// Device name in gangway → the plugin's device id, as last listed.
pub type DeviceIds = Arc<Mutex<BTreeMap<String, String>>>;

/// One registered plugin's task, and what allocation needs of it.
struct PluginLink {
    endpoint: String,
    task: JoinHandle<()>,
    client: DevicePluginClient<Channel>,
    options: DevicePluginOptions,
    ids: DeviceIds,
}

/// What the allocation loop needs of a registered plugin.
#[derive(Clone)]
pub struct PluginHandle {
    /// A client of its socket.
    pub client: DevicePluginClient<Channel>,
    /// What it offers.
    pub options: DevicePluginOptions,
    /// Its devices' ids by gangway device name.
    pub ids: DeviceIds,
}

/// The registered plugins by resource name.
#[derive(Clone)]
pub struct Plugins {
    upstream: Upstream,
    links: Arc<Mutex<BTreeMap<String, PluginLink>>>,
    stop: watch::Receiver<bool>,
}

impl Plugins {
    /// No plugin yet; links report to `upstream` and end when `stop` fires.
    pub fn new(upstream: Upstream, stop: watch::Receiver<bool>) -> Self {
        Self {
            upstream,
            links: Arc::default(),
            stop,
        }
    }

    /// Starts the link of a plugin that registered, replacing the one its resource had.
    pub fn start(
        &self,
        resource: &str,
        endpoint: &str,
        plugin: DevicePluginClient<Channel>,
        options: DevicePluginOptions,
    ) {
        tracing::info!(
            resource,
            endpoint,
            preferred_allocation = options.get_preferred_allocation_available,
            pre_start = options.pre_start_required,
            "device plugin registered"
        );
        // Registered at zero, so rates exist before the first event.
        for name in [
            "gangway_agent_evictions_total",
            "gangway_agent_allocations_total",
            "gangway_agent_allocation_failures_total",
        ] {
            metrics::counter!(name, "resource" => resource.to_string()).increment(0);
        }
        let ids = DeviceIds::default();
        let task = tokio::spawn(watch_plugin(
            resource.to_string(),
            plugin.clone(),
            ids.clone(),
            self.upstream.clone(),
            self.stop.clone(),
        ));
        let old = self.lock().insert(
            resource.to_string(),
            PluginLink {
                endpoint: endpoint.to_string(),
                task,
                client: plugin,
                options,
                ids,
            },
        );
        if let Some(old) = old {
            tracing::info!(
                resource,
                old = old.endpoint,
                "replaced the plugin's previous registration"
            );
            old.task.abort();
        }
    }

    /// The registered resources with their plugins' endpoints.
    pub fn registered(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .filter(|(_, l)| !l.task.is_finished())
            .map(|(r, l)| (r.clone(), l.endpoint.clone()))
            .collect()
    }

    /// The plugin registered for `resource`, while its link runs.
    pub fn handle(&self, resource: &str) -> Option<PluginHandle> {
        self.lock()
            .get(resource)
            .filter(|l| !l.task.is_finished())
            .map(|l| PluginHandle {
                client: l.client.clone(),
                options: l.options.clone(),
                ids: l.ids.clone(),
            })
    }

    /// Stops every link (the agent's shutdown).
    pub fn stop_all(&self) {
        for (_, link) in std::mem::take(&mut *self.lock()) {
            link.task.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PluginLink>> {
        // A link task never panics while holding the lock; recover the map if one did.
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The report gangway takes for one `ListAndWatch` answer.
pub fn report_of(node: &str, resource: &str, answer: &ListAndWatchResponse) -> DeviceListReport {
    DeviceListReport {
        node: node.to_string(),
        resource_name: resource.to_string(),
        devices: answer
            .devices
            .iter()
            .map(|d| PluginDevice {
                id: d.id.clone(),
                // The kubelet treats anything but "Healthy" as unhealthy.
                health: if d.health == HEALTHY {
                    DeviceHealth::Healthy
                } else {
                    DeviceHealth::Unhealthy
                } as i32,
                numa_nodes: d
                    .topology
                    .iter()
                    .flat_map(|t| t.nodes.iter().map(|n| n.id))
                    .collect(),
            })
            .collect(),
    }
}

/// gangway's device stream for one resource of this node.
struct Stream {
    reports: mpsc::Sender<DeviceListReport>,
    acks: Streaming<DeviceListAck>,
}

impl Stream {
    async fn open(servers: &[String]) -> Result<Self, String> {
        let client = Client::connect(servers).await.map_err(|e| e.to_string())?;
        let (reports, rx) = mpsc::channel(REPORTS_QUEUED_MAX);
        let acks = client
            .device_stream(ReceiverStream::new(rx))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self { reports, acks })
    }

    /// Sends `report` and waits for its ack.
    async fn send(&mut self, report: &DeviceListReport) -> Result<DeviceListAck, Delivery> {
        self.reports
            .send(report.clone())
            .await
            .map_err(|_| Delivery::Lost("gangway's stream closed".into()))?;
        let ack = tokio::time::timeout(Duration::from_millis(ACK_TIMEOUT_MS), self.acks.message())
            .await
            .map_err(|_| Delivery::Lost(format!("no ack within {ACK_TIMEOUT_MS} ms")))?;
        match ack {
            Ok(Some(ack)) => Ok(ack),
            Ok(None) => Err(Delivery::Lost("gangway ended the stream".into())),
            Err(status) if refused(&status) => Err(Delivery::Refused(status.message().into())),
            Err(status) => Err(Delivery::Lost(status.to_string())),
        }
    }
}

/// Why a report was not acknowledged.
enum Delivery {
    /// gangway refused it (bad input): sending it again would not help.
    Refused(String),
    /// The stream or the replica failed: reconnect and send again.
    Lost(String),
}

fn refused(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition | tonic::Code::NotFound
    )
}

/// One plugin's link: its `ListAndWatch` into gangway, until the plugin's stream ends,
/// the link is replaced, or the agent stops.
async fn watch_plugin(
    resource: String,
    mut plugin: DevicePluginClient<Channel>,
    ids: DeviceIds,
    upstream: Upstream,
    mut stop: watch::Receiver<bool>,
) {
    let mut lists = match plugin.list_and_watch(Empty {}).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            tracing::warn!(resource, error = %e, "the plugin's ListAndWatch failed");
            return;
        }
    };
    let mut stream: Option<Stream> = None;
    let mut last: Option<DeviceListReport> = None;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            answer = lists.message() => match answer {
                Ok(Some(answer)) => {
                    if let Ok(mut known) = ids.lock() {
                        *known = answer
                            .devices
                            .iter()
                            .map(|d| (device_name(&d.id), d.id.clone()))
                            .collect();
                    }
                    let report = report_of(&upstream.node, &resource, &answer);
                    deliver(&resource, &report, &upstream, &mut stream).await;
                    last = Some(report);
                }
                Ok(None) | Err(_) => {
                    tracing::info!(resource, "the plugin's ListAndWatch ended; gangway keeps its devices through the grace period");
                    return;
                }
            },
            lost = closed(&mut stream) => {
                tracing::info!(resource, why = lost, "gangway's device stream ended; reconnecting");
                stream = None;
                if let Some(report) = &last {
                    deliver(&resource, report, &upstream, &mut stream).await;
                }
            }
        }
    }
}

/// Resolves when the open stream ends or sends something unasked; never without one.
async fn closed(stream: &mut Option<Stream>) -> String {
    match stream {
        Some(s) => match s.acks.message().await {
            Ok(Some(_)) => "an ack nothing asked for".into(),
            Ok(None) => "closed".into(),
            Err(status) => status.to_string(),
        },
        None => std::future::pending().await,
    }
}

/// Delivers `report` on `stream`, reopening it (on the first replica that answers)
/// after a failure, at most [`REPORT_ATTEMPTS_MAX`] times with backoff.
async fn deliver(
    resource: &str,
    report: &DeviceListReport,
    upstream: &Upstream,
    stream: &mut Option<Stream>,
) {
    let mut pause_ms = REPORT_BACKOFF_MIN_MS;
    for attempt in 1..=REPORT_ATTEMPTS_MAX {
        if stream.is_none() {
            match Stream::open(&upstream.servers).await {
                Ok(s) => *stream = Some(s),
                Err(e) => {
                    tracing::debug!(
                        resource,
                        attempt,
                        error = e,
                        "cannot open gangway's device stream"
                    );
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    pause_ms = (pause_ms * 2).min(REPORT_BACKOFF_MAX_MS);
                    continue;
                }
            }
        }
        let Some(open) = stream.as_mut() else {
            continue;
        };
        match open.send(report).await {
            Ok(ack) => {
                tracing::info!(
                    resource,
                    generation = ack.generation,
                    healthy = ack.healthy,
                    unhealthy = ack.unhealthy,
                    "devices reported"
                );
                for member in &ack.evicted {
                    metrics::counter!("gangway_agent_evictions_total", "resource" => resource.to_string())
                        .increment(1);
                    tracing::warn!(resource, member, "evicted: its device is unhealthy or gone");
                }
                return;
            }
            Err(Delivery::Refused(why)) => {
                tracing::error!(resource, why, "gangway refused the plugin's device list");
                *stream = None;
                return;
            }
            Err(Delivery::Lost(why)) => {
                tracing::debug!(resource, attempt, why, "device report not acknowledged");
                *stream = None;
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                pause_ms = (pause_ms * 2).min(REPORT_BACKOFF_MAX_MS);
            }
        }
    }
    tracing::warn!(resource, "gangway did not take the device list after {REPORT_ATTEMPTS_MAX} attempts; the next change tries again");
}
