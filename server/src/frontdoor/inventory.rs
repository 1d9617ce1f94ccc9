//! The Inventory service: node agents register nodes here. A node's shard is
//! fixed in the meta group first (so all front doors agree), then the node is
//! recorded in that shard. Both writes are idempotent, so a retried
//! registration converges.

use std::collections::HashMap;

use gangway_proto::v1::inventory_server::{Inventory, InventoryServer};
use gangway_proto::v1::{
    GetNodeRequest, ListNodesReply, ListNodesRequest, NodeInfo, NodeSpec, RegisterNodeReply,
    RegisterNodeRequest, Taint,
};
use tonic::{Request, Response, Status};

use crate::ledger::meta::{shard_for, MetaCommand, MetaQuery, MetaReply};
use crate::ledger::query::{ShardAnswer, ShardQuery};
use crate::ledger::{LedgerError, LedgerOp, LedgerReply, NodeEntry};
use crate::model::node::RawTaint;
use crate::model::resources::RawQuantity;
use crate::model::{Node, RawNode, Readiness, Resources, Schedulability};
use crate::replicated::{now_ms, Groups, ShardOutcome};

/// The Inventory gRPC service over one replica's groups.
pub struct InventoryService {
    groups: Groups,
    shards: u32,
    topology_label: Option<String>,
}

impl InventoryService {
    /// A service routing to `groups`; nodes are partitioned by `topology_label` when set.
    pub fn new(
        groups: Groups,
        shards: u32,
        topology_label: Option<String>,
    ) -> InventoryServer<Self> {
        InventoryServer::new(Self {
            groups,
            shards,
            topology_label,
        })
    }

    async fn shard_of(&self, node: &str) -> Result<Option<u32>, Status> {
        let q = MetaQuery::ShardOf {
            node: node.to_string(),
        };
        match self
            .groups
            .meta_query(&q)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Shard { shard } => Ok(Some(shard)),
            _ => Ok(None),
        }
    }

    async fn shard_nodes(&self, shard: u32, query: &ShardQuery) -> Result<Vec<NodeEntry>, Status> {
        match self
            .groups
            .shard_query(shard, query)
            .await
            .map_err(|e| e.to_status())?
        {
            ShardAnswer::Nodes { nodes } => Ok(nodes),
            other => Err(Status::internal(format!(
                "shard {shard} answered a node query with {other:?}"
            ))),
        }
    }
}

/// Checks a node spec and converts it to the model; every error names the field under `node.`.
pub fn validate_node(spec: &NodeSpec) -> Result<Node, Status> {
    let raw = RawNode {
        name: spec.name.clone(),
        labels: spec.labels.clone().into_iter().collect(),
        taints: spec
            .taints
            .iter()
            .map(|t| RawTaint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
            })
            .collect(),
        allocatable: spec
            .allocatable
            .iter()
            .map(|(k, v)| (k.clone(), RawQuantity::Text(v.clone())))
            .collect(),
        unschedulable: spec.unschedulable,
        ready: !spec.not_ready,
    };
    raw.validate()
        .map_err(|e| Status::invalid_argument(format!("node.{e}")))
}

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
        labels: node.labels.clone().into_iter().collect(),
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

fn node_info(entry: &NodeEntry, shard: u32) -> NodeInfo {
    NodeInfo {
        node: Some(node_spec(&entry.node)),
        shard,
        requested: quantities(&entry.usage.requested()),
        pods: entry.usage.pods.len() as u32,
    }
}

fn refused(error: LedgerError) -> Status {
    match error {
        LedgerError::InvalidNode { .. } => Status::invalid_argument(format!("node: {error}")),
        other => Status::failed_precondition(other.to_string()),
    }
}

#[tonic::async_trait]
impl Inventory for InventoryService {
    async fn register_node(
        &self,
        request: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeReply>, Status> {
        let spec = request
            .into_inner()
            .node
            .ok_or_else(|| Status::invalid_argument("node: missing"))?;
        let node = validate_node(&spec)?;
        let at_ms = now_ms();
        let proposed = shard_for(
            &node.name,
            &node.labels,
            self.topology_label.as_deref(),
            self.shards,
        );
        let assign = MetaCommand::AssignNode {
            node: node.name.clone(),
            shard: proposed,
            at_ms,
        };
        let shard = match self.groups.meta(&assign).await.map_err(|e| e.to_status())? {
            MetaReply::Shard { shard } => shard,
            MetaReply::Rejected { reason } => return Err(Status::invalid_argument(reason)),
            other => return Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        };
        let register = LedgerOp::RegisterNode { node: node.clone() };
        match self
            .groups
            .shard(shard, register)
            .await
            .map_err(|e| e.to_status())?
        {
            ShardOutcome::Applied(LedgerReply::NodeRegistered { .. }) => {
                let entry = self
                    .shard_nodes(
                        shard,
                        &ShardQuery::GetNode {
                            name: node.name.clone(),
                        },
                    )
                    .await?;
                let info = entry.first().map(|e| node_info(e, shard));
                Ok(Response::new(RegisterNodeReply { node: info }))
            }
            ShardOutcome::Applied(LedgerReply::Rejected { error }) => Err(refused(error)),
            other => Err(Status::internal(format!(
                "unexpected shard reply {other:?}"
            ))),
        }
    }

    async fn get_node(
        &self,
        request: Request<GetNodeRequest>,
    ) -> Result<Response<NodeInfo>, Status> {
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(Status::invalid_argument("name: must not be empty"));
        }
        let not_found = || Status::not_found(format!("node {name:?} is not registered"));
        let shard = self.shard_of(&name).await?.ok_or_else(not_found)?;
        let nodes = self
            .shard_nodes(shard, &ShardQuery::GetNode { name: name.clone() })
            .await?;
        nodes
            .first()
            .map(|e| Response::new(node_info(e, shard)))
            .ok_or_else(not_found)
    }

    async fn list_nodes(
        &self,
        request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesReply>, Status> {
        let shards: Vec<u32> = match request.into_inner().shard {
            Some(s) if s == 0 || s > self.shards => {
                return Err(Status::invalid_argument(format!(
                    "shard: {s} is not in 1..={}",
                    self.shards
                )))
            }
            Some(s) => vec![s],
            None => (1..=self.shards).collect(),
        };
        let mut nodes = Vec::new();
        for shard in shards {
            let entries = self.shard_nodes(shard, &ShardQuery::ListNodes).await?;
            nodes.extend(entries.iter().map(|e| node_info(e, shard)));
        }
        Ok(Response::new(ListNodesReply { nodes }))
    }
}
