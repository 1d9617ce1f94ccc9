//! The public API's messages from the model, and back where a client reports model
//! state (a node agent's allocations): nodes with their pods and devices, resource
//! quantities, gang groups' status and queues' status. Shared by the front door, the
//! node agent and the web view, so all three show the same fields the same way. Pure
//! functions.

use std::collections::{BTreeMap, HashMap};

use gangway_proto::admin::{QueueSpec as ApiQueueSpec, QueueStatus as ApiQueueStatus};
use gangway_proto::v1::{
    AllocationDevice as ApiAllocationDevice, AllocationMount as ApiAllocationMount, DeviceInfo,
    GangGroupStatus, MemberPlacement, NodeAllocation as ApiNodeAllocation, NodeInfo, NodePod,
    NodeSpec, PlacedDevice, PreemptionNotice, Taint,
};

use gangway_core::ledger::devices::{AgentLink, DeviceHealth};
use gangway_core::ledger::meta::{GroupSummary, QueueStatus};
use gangway_core::ledger::usage::SlotState;
use gangway_core::ledger::{LeaseState, NodeEntry};
use gangway_core::model::device::DeviceId;
use gangway_core::model::node_allocation::{AllocationDevice, AllocationMount, NodeAllocation};
use gangway_core::model::queue::{Amount, Limits};
use gangway_core::model::{MemberKey, Node, Readiness, Resources, Schedulability};

/// A resource vector as Kubernetes quantities (zero entries left out).
pub fn quantities(r: &Resources) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if r.cpu_milli > 0 {
        let cpu = if r.cpu_milli.is_multiple_of(1000) {
            (r.cpu_milli / 1000).to_string()
        } else {
            format!("{}m", r.cpu_milli)
        };
        out.insert("cpu".to_string(), cpu);
    }
    if r.memory_bytes > 0 {
        out.insert("memory".to_string(), bytes(r.memory_bytes));
    }
    if r.ephemeral_storage_bytes > 0 {
        out.insert(
            "ephemeral-storage".to_string(),
            bytes(r.ephemeral_storage_bytes),
        );
    }
    if r.pods > 0 {
        out.insert("pods".to_string(), r.pods.to_string());
    }
    for (name, n) in &r.extended {
        out.insert(name.clone(), n.to_string());
    }
    out
}

fn bytes(n: u64) -> String {
    for (suffix, unit) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

fn node_spec(node: &Node) -> NodeSpec {
    NodeSpec {
        name: node.name.clone(),
        labels: node
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        taints: node
            .taints
            .iter()
            .map(|t| Taint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.to_string(),
            })
            .collect(),
        allocatable: quantities(&node.allocatable),
        unschedulable: node.schedulability == Schedulability::Cordoned,
        not_ready: node.readiness == Readiness::NotReady,
    }
}

/// The API view of a node entry of shard `shard`.
pub fn node_info(entry: &NodeEntry, shard: u32) -> NodeInfo {
    let lease_until_ms = entry
        .lease
        .filter(|l| l.state == LeaseState::Live)
        .map_or(0, |l| l.until_ms());
    NodeInfo {
        node: Some(node_spec(&entry.node)),
        shard,
        requested: quantities(&entry.usage.requested()),
        pods: entry.usage.pods.len() as u32,
        devices: device_infos(entry),
        agent: match entry.usage.devices.agent {
            AgentLink::Connected if entry.usage.devices.pools.is_empty() => "",
            AgentLink::Connected => "Connected",
            AgentLink::Disconnected { .. } => "Disconnected",
            AgentLink::Lost { .. } => "Lost",
        }
        .to_string(),
        lease_until_ms,
        pod_slots: entry
            .usage
            .pods
            .iter()
            .map(|(member, slot)| NodePod {
                member: member.to_string(),
                state: slot_state_name(&slot.state).to_string(),
                txn: slot
                    .state
                    .txn_id()
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
            })
            .collect(),
    }
}

fn slot_state_name(state: &SlotState) -> &'static str {
    match state {
        SlotState::Reserved { .. } => "Reserved",
        SlotState::Committed { .. } => "Committed",
        SlotState::Bound { .. } => "Bound",
        SlotState::Observed => "Observed",
    }
}

/// Every published device of the node with its health and the members holding it.
fn device_infos(entry: &NodeEntry) -> Vec<DeviceInfo> {
    let mut holders: BTreeMap<&DeviceId, Vec<String>> = BTreeMap::new();
    for (member, slot) in &entry.usage.pods {
        for alloc in &slot.pod.devices {
            holders
                .entry(&alloc.device)
                .or_default()
                .push(member.to_string());
        }
    }
    let devices = &entry.usage.devices;
    let mut out = Vec::new();
    for (key, pool) in &devices.pools {
        for name in pool.devices.keys() {
            let id = DeviceId::new(key.driver.clone(), key.pool.clone(), name.clone());
            out.push(DeviceInfo {
                driver: key.driver.clone(),
                pool: key.pool.clone(),
                name: name.to_string(),
                unhealthy: devices.health(&id, None) == DeviceHealth::Unhealthy,
                held_by: holders.remove(&id).unwrap_or_default(),
                withdrawn: !pool.standing.is_offered(),
            });
        }
    }
    out
}

/// The model's allocation from the API's.
pub fn allocation_from_api(a: &ApiNodeAllocation) -> NodeAllocation {
    NodeAllocation {
        resource: a.resource.clone(),
        device_ids: a.device_ids.clone(),
        envs: a.envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        mounts: a
            .mounts
            .iter()
            .map(|m| AllocationMount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: a
            .devices
            .iter()
            .map(|d| AllocationDevice {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        annotations: a
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cdi_devices: a.cdi_devices.clone(),
    }
}

/// The API's allocation from the model's.
pub fn allocation_to_api(a: &NodeAllocation) -> ApiNodeAllocation {
    ApiNodeAllocation {
        resource: a.resource.clone(),
        device_ids: a.device_ids.clone(),
        envs: a.envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        mounts: a
            .mounts
            .iter()
            .map(|m| ApiAllocationMount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: a
            .devices
            .iter()
            .map(|d| ApiAllocationDevice {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        annotations: a
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cdi_devices: a.cdi_devices.clone(),
    }
}

/// The API view of a group record.
pub fn group_status(r: &GroupSummary) -> GangGroupStatus {
    let placements = r
        .placements
        .iter()
        .filter_map(|(key, p)| {
            let member = MemberKey::try_from(key.clone()).ok()?;
            Some(MemberPlacement {
                namespace: member.namespace,
                gang: member.gang,
                member: member.member,
                node: p.node.clone(),
                shard: p.shard,
                devices: p
                    .devices
                    .iter()
                    .map(|d| PlacedDevice {
                        claim: d.claim.clone(),
                        request: d.request.clone(),
                        driver: d.device.driver.clone(),
                        pool: d.device.pool.clone(),
                        device: d.device.device.clone(),
                    })
                    .collect(),
                allocations: p.allocations.iter().map(allocation_to_api).collect(),
            })
        })
        .collect();
    GangGroupStatus {
        id: r.seq,
        name: r.name.clone(),
        idempotency_key: r.key.clone(),
        state: r.state.name().to_string(),
        reason: r.reason.clone(),
        attempts: r.attempts,
        placements,
        version: r.version,
        submitted_at_ms: r.submitted_at_ms,
        gangs: r.gangs.clone(),
        members: r.members,
        queue: r.queue.clone(),
        owner: r.owner.clone(),
        spread: Vec::new(),
        preempted: r.preempted.as_ref().map(|p| PreemptionNotice {
            by: p.by,
            members: p.members.clone(),
            at_ms: p.at_ms,
        }),
    }
}

/// A queue's limits as Kubernetes quantities.
fn quantities_of_limits(limits: &Limits) -> HashMap<String, String> {
    limits
        .iter()
        .map(|(name, amount)| (name.to_string(), Amount(&name, amount).to_string()))
        .collect()
}

/// A queue's usage (or capacity) as Kubernetes quantities, in the units queues use.
pub fn quantities_of(usage: &Resources) -> HashMap<String, String> {
    usage
        .nonzero()
        .map(|(name, amount)| (name.to_string(), Amount(&name, amount).to_string()))
        .collect()
}

/// The API view of a queue's status.
pub fn queue_status(q: &QueueStatus) -> ApiQueueStatus {
    ApiQueueStatus {
        spec: Some(ApiQueueSpec {
            name: q.spec.name.clone(),
            parent: q.spec.parent.clone(),
            weight: q.spec.weight,
            min: quantities_of_limits(&q.spec.min),
            max: quantities_of_limits(&q.spec.max),
            lend: quantities_of_limits(&q.spec.lend),
            managed_by: q.spec.managed_by.clone(),
            namespaces: q.spec.namespaces.clone(),
        }),
        usage: quantities_of(&q.usage),
        decayed_usage: q
            .decayed_usage
            .as_ref()
            .map(quantities_of)
            .unwrap_or_default(),
        queued: q.queued,
        admitted: q.admitted,
    }
}
