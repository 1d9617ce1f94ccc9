//! The device plugins registered with gangway-agent, and the node's device stream to
//! gangway.
//!
//! Owns one [`PluginLink`] task per resource name, which reads the plugin's
//! `ListAndWatch` and hands every device list, with health, to the node's one
//! [`upstream`] task; that task keeps the latest list of every resource and delivers
//! them on one `ListAndWatchDevices` stream (gangway keeps one agent link per node).
//! A plugin that registers again under the same resource name replaces the old link
//! (its task is stopped), as the kubelet replaces the endpoint. A plugin whose stream
//! ends leaves its devices as last reported for [`PLUGIN_GRACE_MS`] (the kubelet's
//! grace for a plugin to come back: a restart keeps what is placed); if it does not
//! register again by then, its devices are reported unhealthy. When gangway's stream
//! breaks (a replica fails), the upstream task reopens it on the next replica that
//! answers and sends every latest list again, retrying with capped backoff until it
//! succeeds or the agent stops; it also sends them all every [`REPORT_REFRESH_MS`]. Invariants: at most one link per resource; at most one
//! stream per node; every wait is bounded. Called by the agent's `Registration`
//! service; stopped by the agent's shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gangway_proto::deviceplugin::{DevicePluginOptions, Empty, ListAndWatchResponse};
use gangway_proto::v1::{DeviceHealth, DeviceListAck, DeviceListReport, PluginDevice};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use gangway_core::model::node_allocation::device_name;

/// Time gangway has to acknowledge a device report, in ms.
pub const ACK_TIMEOUT_MS: u64 = 10_000;
/// First pause before reopening gangway's stream after a failure, in ms (doubling).
pub const REPORT_BACKOFF_MIN_MS: u64 = 100;
/// Longest pause before reopening gangway's stream, in ms.
pub const REPORT_BACKOFF_MAX_MS: u64 = 5_000;
/// Time a plugin whose stream ended has to register again before its devices are
/// reported unhealthy, in ms (the kubelet's endpoint grace period).
pub const PLUGIN_GRACE_MS: u64 = 300_000;
/// Time a plugin has to answer `ListAndWatch` or `GetDevicePluginOptions`, in ms.
pub const PLUGIN_CALL_TIMEOUT_MS: u64 = 10_000;
/// Period at which the upstream task sends every latest list again, in ms: it keeps
/// gangway's agent link connected even if a stale stream's end marked it otherwise.
pub const REPORT_REFRESH_MS: u64 = 60_000;
/// Device lists queued from the links to the upstream task.
const LISTS_QUEUED_MAX: usize = 16;
/// Reports queued toward gangway's stream.
const REPORTS_QUEUED_MAX: usize = 2;
/// The health a plugin reports for a usable device.
pub const HEALTHY: &str = "Healthy";

/// Where gangway is and which node the agent speaks for.
#[derive(Clone)]
pub struct Upstream {
    /// gangway's replicas and the agent's credentials.
    pub gangway: super::Gangway,
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
    node: String,
    lists: mpsc::Sender<DeviceListReport>,
    links: Arc<Mutex<BTreeMap<String, PluginLink>>>,
    stop: watch::Receiver<bool>,
}

impl Plugins {
    /// No plugin yet; starts the node's upstream task, which reports to gangway until
    /// `stop` fires (its handle is returned for the agent's shutdown).
    pub fn new(upstream: Upstream, stop: watch::Receiver<bool>) -> (Self, JoinHandle<()>) {
        let (lists, rx) = mpsc::channel(LISTS_QUEUED_MAX);
        let node = upstream.node.clone();
        let task = tokio::spawn(run_upstream(upstream, rx, stop.clone()));
        (
            Self {
                node,
                lists,
                links: Arc::default(),
                stop,
            },
            task,
        )
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
            self.node.clone(),
            plugin.clone(),
            ids.clone(),
            self.lists.clone(),
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
            .map(|(r, l)| (r.clone(), l.endpoint.clone()))
            .collect()
    }

    /// The plugin registered for `resource`.
    pub fn handle(&self, resource: &str) -> Option<PluginHandle> {
        self.lock().get(resource).map(|l| PluginHandle {
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
        // No code panics while holding the lock; recover the map if something did.
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

/// One plugin's link: its `ListAndWatch` to the upstream task, until the plugin's
/// stream ends (then the grace period), the link is replaced, or the agent stops.
async fn watch_plugin(
    resource: String,
    node: String,
    mut plugin: DevicePluginClient<Channel>,
    ids: DeviceIds,
    lists: mpsc::Sender<DeviceListReport>,
    mut stop: watch::Receiver<bool>,
) {
    let opened = tokio::time::timeout(
        Duration::from_millis(PLUGIN_CALL_TIMEOUT_MS),
        plugin.list_and_watch(Empty {}),
    )
    .await;
    let mut answers = match opened {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(e)) => {
            tracing::warn!(resource, error = %e, "the plugin's ListAndWatch failed");
            return;
        }
        Err(_) => {
            tracing::warn!(resource, "the plugin's ListAndWatch did not answer in time");
            return;
        }
    };
    let mut last: Option<DeviceListReport> = None;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            answer = answers.message() => match answer {
                Ok(Some(answer)) => {
                    if let Ok(mut known) = ids.lock() {
                        *known = answer
                            .devices
                            .iter()
                            .map(|d| (device_name(&d.id), d.id.clone()))
                            .collect();
                    }
                    let report = report_of(&node, &resource, &answer);
                    last = Some(report.clone());
                    if lists.send(report).await.is_err() {
                        return;
                    }
                }
                Ok(None) | Err(_) => break,
            },
        }
    }
    tracing::info!(
        resource,
        "the plugin's ListAndWatch ended; its devices stay as reported for {PLUGIN_GRACE_MS} ms unless it registers again"
    );
    tokio::select! {
        _ = stop.changed() => {}
        _ = tokio::time::sleep(Duration::from_millis(PLUGIN_GRACE_MS)) => {
            if let Some(mut gone) = last {
                tracing::warn!(resource, "the plugin did not come back: its devices are reported unhealthy");
                for d in &mut gone.devices {
                    d.health = DeviceHealth::Unhealthy as i32;
                }
                let _ = lists.send(gone).await;
            }
        }
    }
}

/// gangway's device stream for this node.
struct Stream {
    reports: mpsc::Sender<DeviceListReport>,
    acks: Streaming<DeviceListAck>,
}

/// Why a report was not acknowledged.
enum Delivery {
    /// gangway refused it (bad input): sending it again would not help.
    Refused(String),
    /// The stream or the replica failed: reopen and send again.
    Lost(String),
}

impl Stream {
    async fn open(gangway: &super::Gangway) -> Result<Self, String> {
        let client = gangway.connect().await.map_err(|e| e.to_string())?;
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
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition
                ) =>
            {
                Err(Delivery::Refused(status.message().into()))
            }
            // NotFound (the node not registered yet) and the rest may pass later.
            Err(status) => Err(Delivery::Lost(status.to_string())),
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

/// The node's upstream task: the latest list of every resource, delivered on one
/// stream, reopened and resent until delivered.
async fn run_upstream(
    upstream: Upstream,
    mut lists: mpsc::Receiver<DeviceListReport>,
    mut stop: watch::Receiver<bool>,
) {
    let mut latest: BTreeMap<String, DeviceListReport> = BTreeMap::new();
    let mut undelivered: BTreeSet<String> = BTreeSet::new();
    let mut stream: Option<Stream> = None;
    let mut pause_ms = 0u64;
    let mut refresh = tokio::time::interval(Duration::from_millis(REPORT_REFRESH_MS));
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let retry = !undelivered.is_empty();
        tokio::select! {
            _ = stop.changed() => return,
            _ = refresh.tick() => undelivered.extend(latest.keys().cloned()),
            list = lists.recv() => match list {
                Some(report) => {
                    undelivered.insert(report.resource_name.clone());
                    latest.insert(report.resource_name.clone(), report);
                }
                None => return,
            },
            why = closed(&mut stream) => {
                tracing::info!(why, "gangway's device stream ended; reopening");
                stream = None;
                undelivered.extend(latest.keys().cloned());
            }
            _ = tokio::time::sleep(Duration::from_millis(pause_ms)), if retry => {}
        }
        if undelivered.is_empty() {
            continue;
        }
        if stream.is_none() {
            match Stream::open(&upstream.gangway).await {
                Ok(s) => {
                    stream = Some(s);
                    // A new stream starts with nothing: every list goes again.
                    undelivered.extend(latest.keys().cloned());
                }
                Err(e) => {
                    tracing::debug!(error = e, "cannot open gangway's device stream");
                    pause_ms = next_pause(pause_ms);
                    continue;
                }
            }
        }
        let pending: Vec<String> = undelivered.iter().cloned().collect();
        for resource in pending {
            let (Some(open), Some(report)) = (stream.as_mut(), latest.get(&resource)) else {
                break;
            };
            match open.send(report).await {
                Ok(ack) => {
                    undelivered.remove(&resource);
                    pause_ms = 0;
                    note_ack(&resource, &ack);
                }
                Err(Delivery::Refused(why)) => {
                    tracing::error!(resource, why, "gangway refused the plugin's device list");
                    // Not sent again until the plugin lists something new.
                    undelivered.remove(&resource);
                    latest.remove(&resource);
                    // gangway ends a stream after a refusal: the others go again.
                    stream = None;
                    undelivered.extend(latest.keys().filter(|r| **r != resource).cloned());
                    break;
                }
                Err(Delivery::Lost(why)) => {
                    tracing::debug!(resource, why, "device report not acknowledged");
                    stream = None;
                    pause_ms = next_pause(pause_ms);
                    break;
                }
            }
        }
    }
}

fn next_pause(ms: u64) -> u64 {
    (ms * 2).clamp(REPORT_BACKOFF_MIN_MS, REPORT_BACKOFF_MAX_MS)
}

fn note_ack(resource: &str, ack: &DeviceListAck) {
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
}
