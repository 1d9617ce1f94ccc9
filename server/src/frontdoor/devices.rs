//! The node agent's device stream, in the device plugin's ListAndWatch style.
//!
//! Owns the translation of a device-plugin report (one extended resource of one node:
//! the full device list with health) into ledger operations, and the per-stream task
//! that applies them. A resource `vendor.example/gpu` becomes the DRA pool named after
//! the node, of driver `gpu.vendor.example`, served to pods through the device class of
//! that name, which maps the extended resource (upstream's DRA extended resources: the
//! node must not also list the resource as allocatable). Invariants: a stream speaks
//! for one node; the pool is republished (generation + 1) only when the device list
//! changes, health is recorded on every report, and the agent link is marked connected
//! when the stream opens (and again by any report that finds it disconnected: a stream
//! that ended late may have marked it so) and disconnected when it ends (the ledger's
//! grace period then applies). Called by the Inventory service; each stream's task ends with the stream
//! (the agent closing it, or the server's shutdown closing the connection).

use std::collections::BTreeSet;

use gangway_proto::v1::{DeviceHealth as WireHealth, DeviceListAck, DeviceListReport};
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::frontdoor::inventory::{apply_op, shard_of};
use crate::replicated::{now_ms, Groups};
use gangway_core::ledger::devices::{DeviceEviction, DeviceHealth, DeviceHealthReport, PoolKey};
use gangway_core::ledger::{LedgerOp, LedgerReply, NodeEntry};
use gangway_core::model::device::{
    AttributeValue, CelSelector, Device, DeviceClass, DeviceId, ATTRIBUTE_VALUE_LENGTH_MAX,
    DRIVER_NAME_LENGTH_MAX, POOL_DEVICES_MAX,
};
use gangway_core::model::error::FieldPath;
use gangway_core::model::names::validate_dns_subdomain;
use gangway_core::model::resources::ResourceName;
use gangway_core::query::{ShardAnswer, ShardQuery};

/// Acks queued for a slow agent before the stream stops reading its reports.
pub const DEVICE_ACKS_QUEUED_MAX: usize = 8;
/// Longest a device stream may stay open before its first report, in ms.
pub const DEVICE_FIRST_REPORT_MS: u64 = 10_000;
/// Longest device name (a DNS label).
pub const DEVICE_NAME_LENGTH_MAX: usize = 63;
/// Attribute holding the plugin's own device id.
pub const DEVICE_ID_ATTRIBUTE: &str = "deviceID";
/// Attribute holding the device's first NUMA node.
pub const NUMA_NODE_ATTRIBUTE: &str = "numaNode";

/// One validated report: the pool it describes and the health of its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginPool {
    /// Node name.
    pub node: String,
    /// The extended resource served.
    pub resource: String,
    /// Driver name derived from the resource.
    pub driver: String,
    /// Devices, in report order.
    pub devices: Vec<Device>,
    /// Health per device.
    pub health: Vec<DeviceHealthReport>,
}

impl PluginPool {
    /// The pool's name: the node's.
    pub fn pool(&self) -> &str {
        &self.node
    }

    /// The class that serves the resource from these devices.
    pub fn class(&self) -> DeviceClass {
        DeviceClass {
            name: self.driver.clone(),
            selectors: vec![CelSelector::new(format!(
                "device.driver == \"{}\"",
                self.driver
            ))],
            config: Vec::new(),
            extended_resource_name: Some(self.resource.clone()),
        }
    }

    /// Counts of healthy and unhealthy devices.
    pub fn health_counts(&self) -> (u32, u32) {
        let unhealthy = self
            .health
            .iter()
            .filter(|r| r.health == DeviceHealth::Unhealthy)
            .count();
        let total = self.health.len();
        (
            u32::try_from(total - unhealthy).unwrap_or(u32::MAX),
            u32::try_from(unhealthy).unwrap_or(u32::MAX),
        )
    }
}

pub use gangway_core::model::node_allocation::{device_name, driver_for};

/// Checks a report and translates it; every error names the field.
pub fn validate_report(report: &DeviceListReport) -> Result<PluginPool, Status> {
    let invalid =
        |field: &str, message: String| Status::invalid_argument(format!("{field}: {message}"));
    if report.node.is_empty() {
        return Err(invalid("node", "must not be empty".into()));
    }
    let resource = &report.resource_name;
    let extended = matches!(
        ResourceName::parse(&FieldPath::new("resource_name"), resource),
        Ok(ResourceName::Extended(_))
    );
    let driver = driver_for(resource)
        .filter(|_| extended && !resource.starts_with("kubernetes.io/"))
        .ok_or_else(|| {
            invalid(
                "resource_name",
                format!("\"{resource}\" is not an extended resource name (vendor.example/name)"),
            )
        })?;
    validate_dns_subdomain(&FieldPath::new("resource_name"), &driver)
        .ok()
        .filter(|()| driver.len() <= DRIVER_NAME_LENGTH_MAX)
        .ok_or_else(|| {
            invalid(
                "resource_name",
                format!("\"{resource}\" does not give a driver name (name.domain, at most 63 characters)"),
            )
        })?;
    if report.devices.len() > POOL_DEVICES_MAX {
        return Err(invalid(
            "devices",
            format!(
                "{} devices; at most {POOL_DEVICES_MAX} per resource",
                report.devices.len()
            ),
        ));
    }
    let mut names = BTreeSet::new();
    let mut devices = Vec::with_capacity(report.devices.len());
    let mut health = Vec::with_capacity(report.devices.len());
    for (i, d) in report.devices.iter().enumerate() {
        let field = format!("devices[{i}]");
        let name = device_name(&d.id);
        if name.is_empty()
            || name.len() > DEVICE_NAME_LENGTH_MAX
            || d.id.len() > ATTRIBUTE_VALUE_LENGTH_MAX
        {
            return Err(invalid(
                &format!("{field}.id"),
                format!("\"{}\" must have 1 to 63 letters or digits", d.id),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(invalid(
                &format!("{field}.id"),
                format!(
                    "\"{}\" names the same device as an earlier id (as \"{name}\")",
                    d.id
                ),
            ));
        }
        let state = match WireHealth::try_from(d.health) {
            Ok(WireHealth::Healthy) => DeviceHealth::Healthy,
            Ok(WireHealth::Unhealthy) => DeviceHealth::Unhealthy,
            _ => {
                return Err(invalid(
                    &format!("{field}.health"),
                    "must be HEALTHY or UNHEALTHY".into(),
                ))
            }
        };
        let mut device = Device::new(name.clone());
        device.attributes.insert(
            DEVICE_ID_ATTRIBUTE.into(),
            AttributeValue::String(d.id.as_str().into()),
        );
        if let Some(numa) = d.numa_nodes.first() {
            device
                .attributes
                .insert(NUMA_NODE_ATTRIBUTE.into(), AttributeValue::Int(*numa));
        }
        devices.push(device);
        health.push(DeviceHealthReport {
            device: DeviceId::new(driver.clone(), report.node.clone(), name),
            health: state,
        });
    }
    Ok(PluginPool {
        node: report.node.clone(),
        resource: resource.clone(),
        driver,
        devices,
        health,
    })
}

/// What one stream has done so far.
#[derive(Debug, Default)]
struct StreamState {
    /// The node and its shard, once the first report named them.
    node: Option<(String, u32)>,
    /// The device list the ledger holds for each resource this stream reported, with its
    /// generation (so an unchanged list costs no read).
    published: Vec<(String, Vec<Device>, u64)>,
}

/// Who reports on a stream: the authority, the caller, and its stream slot (held
/// while the stream is open).
pub type Reporter = (
    crate::auth::Access,
    crate::auth::Principal,
    crate::auth::limits::StreamSlot,
);

/// Serves one agent's stream until it ends, then marks the agent disconnected. The
/// node a stream's first report names must be one the caller may update.
pub fn spawn_stream(
    groups: Groups,
    mut inbound: Streaming<DeviceListReport>,
    acks: mpsc::Sender<Result<DeviceListAck, Status>>,
    reporter: Reporter,
) {
    tokio::spawn(async move {
        let (access, who, _slot) = reporter;
        let mut state = StreamState::default();
        loop {
            // A stream that names no node holds a slot for nothing: its first report is due
            // within a bound.
            let next = if state.node.is_none() {
                let first = Duration::from_millis(DEVICE_FIRST_REPORT_MS);
                match tokio::time::timeout(first, inbound.message()).await {
                    Ok(next) => next,
                    Err(_) => {
                        access.note_refusal(&who);
                        let late = Status::deadline_exceeded(format!(
                            "no device report within {DEVICE_FIRST_REPORT_MS} ms of opening the stream"
                        ));
                        let _ = acks.send(Err(late)).await;
                        break;
                    }
                }
            } else {
                inbound.message().await
            };
            let report = match next {
                Ok(Some(report)) => report,
                Ok(None) => break,
                Err(status) => {
                    tracing::info!(error = %status, "device stream broke");
                    // A report that does not decode is the agent's error: tell it so
                    // (the stream is still open one way). A broken connection has no one to tell.
                    if status.code() == tonic::Code::InvalidArgument {
                        let _ = acks.send(Err(status)).await;
                    }
                    break;
                }
            };
            if state.node.is_none() {
                let ask =
                    crate::auth::Ask::of(crate::auth::Verb::Update, crate::auth::Resource::Nodes)
                        .named(&report.node);
                if let Err(denied) = access.check(&who, &ask).await {
                    let _ = acks.send(Err(denied)).await;
                    break;
                }
            }
            let ack = apply_report(&groups, &mut state, &report).await;
            let failed = ack.is_err();
            if acks.send(ack).await.is_err() || failed {
                break;
            }
        }
        if let Some((node, shard)) = state.node {
            disconnect(&groups, &node, shard).await;
        }
    });
}

async fn apply_report(
    groups: &Groups,
    state: &mut StreamState,
    report: &DeviceListReport,
) -> Result<DeviceListAck, Status> {
    let pool = validate_report(report)?;
    let shard = match &state.node {
        Some((node, shard)) if *node == pool.node => {
            // A stream that ended late may have marked the node disconnected after this
            // one connected (the link is per node): every report restores it.
            let entry = node_entry(groups, *shard, node).await?;
            if !entry.usage.devices.agent.is_connected() {
                apply_op(
                    groups,
                    *shard,
                    LedgerOp::AgentConnected { node: node.clone() },
                )
                .await?;
            }
            *shard
        }
        Some((node, _)) => {
            return Err(Status::invalid_argument(format!(
                "node: this stream reports for \"{node}\"; \"{}\" needs a stream of its own",
                pool.node
            )))
        }
        None => {
            let shard = shard_of(groups, &pool.node).await?.ok_or_else(|| {
                Status::not_found(format!(
                    "node: \"{}\" is not registered; call RegisterNode first",
                    pool.node
                ))
            })?;
            apply_op(
                groups,
                shard,
                LedgerOp::AgentConnected {
                    node: pool.node.clone(),
                },
            )
            .await?;
            state.node = Some((pool.node.clone(), shard));
            shard
        }
    };
    let mut evicted = Vec::new();
    let changed = !state
        .published
        .iter()
        .any(|(resource, devices, _)| *resource == pool.resource && *devices == pool.devices);
    let generation = if changed {
        let entry = node_entry(groups, shard, &pool.node).await?;
        if entry.node.allocatable.extended.contains_key(&pool.resource) {
            return Err(Status::failed_precondition(format!(
                "resource_name: node \"{}\" lists {} in its allocatable; a streamed resource is \
                 served by its devices, so register the node without it",
                pool.node, pool.resource
            )));
        }
        let (current, same) = published(&entry, &pool);
        let generation = if same {
            current
        } else {
            let generation = current + 1;
            apply_op(
                groups,
                shard,
                LedgerOp::PutDeviceClass {
                    class: pool.class(),
                },
            )
            .await?;
            let reply = apply_op(
                groups,
                shard,
                LedgerOp::PublishPool {
                    node: pool.node.clone(),
                    driver: pool.driver.clone(),
                    pool: pool.pool().to_string(),
                    generation,
                    devices: pool.devices.clone(),
                    counter_sets: Vec::new(),
                },
            )
            .await?;
            if let LedgerReply::PoolPublished { evictions, .. } = reply {
                evicted.extend(evictions);
            }
            generation
        };
        state
            .published
            .retain(|(resource, _, _)| *resource != pool.resource);
        state
            .published
            .push((pool.resource.clone(), pool.devices.clone(), generation));
        generation
    } else {
        state
            .published
            .iter()
            .find(|(resource, _, _)| *resource == pool.resource)
            .map_or(0, |(_, _, generation)| *generation)
    };
    let reply = apply_op(
        groups,
        shard,
        LedgerOp::SetDeviceHealth {
            node: pool.node.clone(),
            devices: pool.health.clone(),
        },
    )
    .await?;
    if let LedgerReply::DeviceHealthRecorded { evictions, .. } = reply {
        evicted.extend(evictions);
    }
    let (healthy, unhealthy) = pool.health_counts();
    Ok(DeviceListAck {
        generation,
        healthy,
        unhealthy,
        evicted: evicted_members(&evicted),
    })
}

fn evicted_members(evictions: &[DeviceEviction]) -> Vec<String> {
    let members: BTreeSet<String> = evictions.iter().map(|e| e.member.to_string()).collect();
    members.into_iter().collect()
}

/// The ledger's generation of the report's pool (0: none) and whether it already offers
/// exactly these devices.
fn published(entry: &NodeEntry, pool: &PluginPool) -> (u64, bool) {
    let key = PoolKey {
        driver: pool.driver.clone(),
        pool: pool.pool().to_string(),
    };
    match entry.usage.devices.pools.get(&key) {
        None => (0, false),
        Some(held) => {
            let same = held.standing.is_offered()
                && held.devices.len() == pool.devices.len()
                && pool
                    .devices
                    .iter()
                    .all(|d| held.devices.get(&d.name) == Some(d));
            (held.generation, same)
        }
    }
}

async fn node_entry(groups: &Groups, shard: u32, node: &str) -> Result<NodeEntry, Status> {
    let query = ShardQuery::GetNode {
        name: node.to_string(),
    };
    match groups
        .shard_query(shard, &query)
        .await
        .map_err(|e| e.to_status())?
    {
        ShardAnswer::Nodes { mut nodes } if !nodes.is_empty() => Ok(nodes.swap_remove(0)),
        ShardAnswer::Nodes { .. } => Err(Status::not_found(format!(
            "node: \"{node}\" is not registered"
        ))),
        other => Err(Status::internal(format!(
            "shard {shard} answered a node query with {other:?}"
        ))),
    }
}

async fn disconnect(groups: &Groups, node: &str, shard: u32) {
    let op = LedgerOp::AgentDisconnected {
        node: node.to_string(),
        since_ms: now_ms(),
        grace_ms: None,
    };
    match apply_op(groups, shard, op).await {
        Ok(_) => tracing::info!(node, "device agent disconnected; grace period started"),
        Err(status) => {
            tracing::warn!(node, error = %status, "could not record the device agent's disconnect")
        }
    }
}

#[cfg(test)]
#[path = "devices_tests.rs"]
mod tests;
