//! Allocation on the node: when gangway places a member here with a device plugin's
//! devices, the agent asks that plugin to allocate exactly those devices and reports
//! its answer back, where the member's placement status shows it.
//!
//! How the agent learns placements: every [`ALLOCATION_POLL_MS`] it reads its own node
//! (`GetNode`: one node, bounded) and groups the devices of each registered resource by
//! the members holding them, taking only members whose slot is committed (a reservation
//! still being decided may abort) and whose every device the plugin lists. A (member,
//! resource) it has not allocated for that placement (its transaction) yet gets
//! `GetPreferredAllocation` where the plugin offers it (logged when its preference
//! differs: gangway's choice stands), then `Allocate` with gangway's device ids; the
//! answer is written to the checkpoint (a JSON file in the device plugin directory,
//! replaced atomically, like the kubelet's `kubelet_internal_checkpoint`) before it is
//! reported (`ReportAllocation`); nothing is reported while the checkpoint cannot be
//! written. `PreStartContainer` follows `Allocate` where the plugin requires it (the
//! agent starts no containers; this is the last moment it knows of). An entry whose
//! member's placement is gone from the node is removed (garbage collection).
//! Because the checkpoint survives restarts of the agent and the plugin, neither
//! allocates a placed member twice. Called by the agent; stops with its shutdown.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gangway_client::Client;
use gangway_proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, PreStartContainerRequest, PreferredAllocationRequest,
};
use gangway_proto::v1::NodeInfo;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::plugins::{PluginHandle, Plugins};
use crate::convert::allocation_to_api;
use gangway_core::model::node_allocation::driver_for;
use gangway_core::model::node_allocation::{AllocationDevice, AllocationMount, NodeAllocation};

/// Period between the agent's reads of its node's placements, in ms.
pub const ALLOCATION_POLL_MS: u64 = 500;
/// Time a plugin has to answer `Allocate` or `GetPreferredAllocation`, in ms.
pub const ALLOCATE_TIMEOUT_MS: u64 = 30_000;
/// The checkpoint's file name in the device plugin directory.
pub const CHECKPOINT_FILE: &str = "gangway_agent_checkpoint";
/// The checkpoint format this agent writes.
const CHECKPOINT_VERSION: u32 = 1;

/// Why the checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// It cannot be read or written.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// It does not parse, or is of another version.
    #[error("checkpoint {path}: {detail}; move it away to start without it (allocations are then made again)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// One allocation the node holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The transaction that placed the member here (a new placement of the same member
    /// is allocated again).
    #[serde(default)]
    pub txn: String,
    /// What the plugin answered.
    pub allocation: NodeAllocation,
    /// Whether gangway has it.
    pub reported: bool,
}

/// The allocations on this node, by member and resource, kept on disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    version: u32,
    /// member → resource → entry.
    pub entries: BTreeMap<String, BTreeMap<String, Entry>>,
}

impl Checkpoint {
    /// Reads the checkpoint at `path`; none there is an empty one.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self {
                    version: CHECKPOINT_VERSION,
                    entries: BTreeMap::new(),
                })
            }
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let cp: Self = serde_json::from_str(&text).map_err(|e| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        if cp.version != CHECKPOINT_VERSION {
            return Err(CheckpointError::Corrupt {
                path: path.to_path_buf(),
                detail: format!(
                    "version {} (this agent reads {CHECKPOINT_VERSION})",
                    cp.version
                ),
            });
        }
        Ok(cp)
    }

    /// Writes it to `path` whole: a temporary file, synced, then renamed over the old.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        use std::io::Write;
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_vec_pretty(self).map_err(|e| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let mut file = std::fs::File::create(&tmp).map_err(io)?;
        file.write_all(&text).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        // The rename itself survives a power loss once the directory is synced.
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
        }
        Ok(())
    }
}

/// (member, resource) → (the transaction that placed it, the plugin's device ids
/// gangway gave it, sorted).
pub type Held = BTreeMap<(String, String), (String, Vec<String>)>;

/// Slot states of a placement gangway has decided (not a reservation that may abort).
const COMMITTED_STATES: [&str; 2] = ["Committed", "Bound"];

/// Committed members on this node → the transaction that placed them.
fn committed(info: &NodeInfo) -> BTreeMap<&str, &str> {
    info.pod_slots
        .iter()
        .filter(|p| COMMITTED_STATES.contains(&p.state.as_str()))
        .map(|p| (p.member.as_str(), p.txn.as_str()))
        .collect()
}

/// What committed members hold of each registered resource on this node, by the
/// plugin's ids. A member holding a device the plugin does not list now is left out
/// until it does (allocating a part would allocate it twice).
pub fn held(info: &NodeInfo, plugins: &Plugins) -> Held {
    let placed = committed(info);
    let mut out = Held::new();
    let mut partial: BTreeSet<(String, String)> = BTreeSet::new();
    for (resource, _) in plugins.registered() {
        let (Some(driver), Some(plugin)) = (driver_for(&resource), plugins.handle(&resource))
        else {
            continue;
        };
        let ids = plugin.ids.lock().map(|m| m.clone()).unwrap_or_default();
        for d in info.devices.iter().filter(|d| d.driver == driver) {
            for member in &d.held_by {
                let Some(txn) = placed.get(member.as_str()) else {
                    continue;
                };
                let key = (member.clone(), resource.clone());
                match ids.get(&d.name) {
                    Some(id) => out
                        .entry(key)
                        .or_insert_with(|| (txn.to_string(), Vec::new()))
                        .1
                        .push(id.clone()),
                    None => {
                        partial.insert(key);
                    }
                }
            }
        }
    }
    for key in partial {
        out.remove(&key);
    }
    for (_, ids) in out.values_mut() {
        ids.sort();
    }
    out
}

/// The model's allocation from a plugin's answer for `ids`.
pub fn allocation_of(
    resource: &str,
    ids: &[String],
    answer: &ContainerAllocateResponse,
) -> NodeAllocation {
    NodeAllocation {
        resource: resource.to_string(),
        device_ids: ids.to_vec(),
        envs: answer
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        mounts: answer
            .mounts
            .iter()
            .map(|m| AllocationMount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: answer
            .devices
            .iter()
            .map(|d| AllocationDevice {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        annotations: answer
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cdi_devices: answer.cdi_devices.iter().map(|c| c.name.clone()).collect(),
    }
}

/// Asks `plugin` to allocate `ids` (its preference first, where offered; then
/// `PreStartContainer` where required).
async fn allocate(
    plugin: &PluginHandle,
    resource: &str,
    member: &str,
    ids: &[String],
) -> Result<NodeAllocation, String> {
    let mut client = plugin.client.clone();
    let limit = Duration::from_millis(ALLOCATE_TIMEOUT_MS);
    if plugin.options.get_preferred_allocation_available {
        let ask = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.to_vec(),
                must_include_device_i_ds: ids.to_vec(),
                allocation_size: i32::try_from(ids.len()).unwrap_or(i32::MAX),
            }],
        };
        match tokio::time::timeout(limit, client.get_preferred_allocation(ask)).await {
            Ok(Ok(r)) => {
                let mut preferred: Vec<String> = r
                    .into_inner()
                    .container_responses
                    .first()
                    .map(|c| c.device_i_ds.clone())
                    .unwrap_or_default();
                preferred.sort();
                if preferred != ids {
                    tracing::info!(resource, member, ?preferred, chosen = ?ids, "the plugin prefers other devices; gangway's choice stands");
                }
            }
            Ok(Err(e)) => tracing::debug!(resource, error = %e, "GetPreferredAllocation failed"),
            Err(_) => tracing::debug!(resource, "GetPreferredAllocation timed out"),
        }
    }
    let ask = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    };
    let answer = tokio::time::timeout(limit, client.allocate(ask))
        .await
        .map_err(|_| format!("Allocate took longer than {ALLOCATE_TIMEOUT_MS} ms"))?
        .map_err(|e| format!("Allocate failed: {}", e.message()))?
        .into_inner();
    let first = answer
        .container_responses
        .first()
        .ok_or("Allocate answered no container response")?;
    let allocation = allocation_of(resource, ids, first);
    if plugin.options.pre_start_required {
        let ask = PreStartContainerRequest {
            devices_ids: ids.to_vec(),
        };
        tokio::time::timeout(limit, client.pre_start_container(ask))
            .await
            .map_err(|_| format!("PreStartContainer took longer than {ALLOCATE_TIMEOUT_MS} ms"))?
            .map_err(|e| format!("PreStartContainer failed: {}", e.message()))?;
    }
    Ok(allocation)
}

/// The allocation loop, until `stop` fires.
pub async fn run(
    gangway: super::Gangway,
    node: String,
    plugins: Plugins,
    path: PathBuf,
    mut checkpoint: Checkpoint,
    mut stop: watch::Receiver<bool>,
) {
    let mut client: Option<Client> = None;
    // An entry in memory that the disk does not have yet: nothing is reported until the
    // checkpoint is written (a restart must find every allocation gangway knows of).
    let mut unsaved = false;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(ALLOCATION_POLL_MS)) => {}
        }
        if client.is_none() {
            client = gangway.connect().await.ok();
        }
        let Some(c) = &client else {
            continue;
        };
        let info = match c.get_node(&node).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the node's placements; reconnecting");
                client = None;
                continue;
            }
        };
        let before = checkpoint.clone();
        collect_garbage(&mut checkpoint, &info);
        for ((member, resource), (txn, ids)) in held(&info, &plugins) {
            let known = checkpoint
                .entries
                .get(&member)
                .and_then(|r| r.get(&resource))
                .filter(|e| e.txn == txn && e.allocation.device_ids == ids);
            if known.is_some() {
                continue;
            }
            let Some(plugin) = plugins.handle(&resource) else {
                continue;
            };
            match allocate(&plugin, &resource, &member, &ids).await {
                Ok(allocation) => {
                    metrics::counter!("gangway_agent_allocations_total", "resource" => resource.clone())
                        .increment(1);
                    tracing::info!(resource, member, ?ids, "allocated");
                    checkpoint.entries.entry(member).or_default().insert(
                        resource,
                        Entry {
                            txn,
                            allocation,
                            reported: false,
                        },
                    );
                    // On disk before gangway hears of it: a restart never allocates twice.
                    unsaved = true;
                    save(&checkpoint, &path, &mut unsaved);
                }
                Err(why) => {
                    metrics::counter!("gangway_agent_allocation_failures_total", "resource" => resource.clone())
                        .increment(1);
                    tracing::warn!(resource, member, why, "allocation failed; trying again");
                }
            }
        }
        if checkpoint != before || unsaved {
            unsaved = true;
            save(&checkpoint, &path, &mut unsaved);
        }
        if !unsaved {
            let reported = checkpoint.clone();
            report_pending(c, &node, &mut checkpoint).await;
            if checkpoint != reported {
                // Only reported flags changed: losing them costs a second report.
                let mut ignored = true;
                save(&checkpoint, &path, &mut ignored);
            }
        }
    }
}

/// Writes the checkpoint; `unsaved` stays set while the write fails.
fn save(checkpoint: &Checkpoint, path: &Path, unsaved: &mut bool) {
    match checkpoint.save(path) {
        Ok(()) => *unsaved = false,
        Err(e) => tracing::error!(
            error = %e,
            "cannot write the checkpoint; nothing is reported until it can be"
        ),
    }
}

/// Drops the entries whose placement is gone from the node: the member is no longer
/// committed here, or under another transaction (allocated again below).
fn collect_garbage(checkpoint: &mut Checkpoint, info: &NodeInfo) {
    let placed = committed(info);
    let mut gone: Vec<(String, String)> = Vec::new();
    for (member, resources) in &checkpoint.entries {
        for (resource, entry) in resources {
            if placed.get(member.as_str()) != Some(&entry.txn.as_str()) {
                gone.push((member.clone(), resource.clone()));
            }
        }
    }
    for (member, resource) in gone {
        tracing::info!(member, resource, "released: allocation removed");
        if let Some(r) = checkpoint.entries.get_mut(&member) {
            r.remove(&resource);
            if r.is_empty() {
                checkpoint.entries.remove(&member);
            }
        }
    }
}

/// Reports every allocation gangway does not have yet. One gangway cannot take (too
/// large) is logged and not sent again; one refused because the member's group ended
/// or moved waits for the garbage collection; others are tried again next poll.
async fn report_pending(client: &Client, node: &str, checkpoint: &mut Checkpoint) {
    use gangway_core::model::FieldPath;
    for (member, resources) in checkpoint.entries.iter_mut() {
        for entry in resources.values_mut().filter(|e| !e.reported) {
            if let Err(e) = entry.allocation.validate(&FieldPath::new("allocation")) {
                tracing::error!(member, error = %e, "the plugin's answer is too large for gangway; not reported");
                entry.reported = true;
                continue;
            }
            let api = allocation_to_api(&entry.allocation);
            match client.report_allocation(node, member, api).await {
                Ok(()) => entry.reported = true,
                Err(e) => tracing::debug!(member, error = %e, "allocation not reported yet"),
            }
        }
    }
}

#[cfg(test)]
#[path = "allocations_tests.rs"]
mod tests;
