//! The Inventory service: node agents register nodes here. A node's shard is
//! fixed in the meta group first (so all front doors agree), then the node is
//! recorded in that shard. Both writes are idempotent, so a retried
//! registration converges.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use gangway_proto::v1::inventory_server::{Inventory, InventoryServer};
use gangway_proto::v1::{
    GetNodeRequest, ListNodesReply, ListNodesRequest, NodeInfo, NodeSpec, RegisterNodeReply,
    RegisterNodeRequest, Taint,
};
use gangway_raft::{HostError, RaftHost, META_GROUP};
use tonic::{Request, Response, Status};

use crate::ledger::inventory::{
    NodeRecord, NodeRecordSpec, ShardCommand, ShardQuery, ShardReply, TaintRecord,
};
use crate::ledger::meta::{shard_for, MetaCommand, MetaQuery, MetaReply};
use crate::replicated::{decode, encode};

/// Longest node name (a DNS-1123 subdomain).
pub const NODE_NAME_BYTES_MAX: usize = 253;
const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// The Inventory gRPC service over one replica's host.
pub struct InventoryService {
    host: RaftHost,
    shards: u32,
    topology_label: Option<String>,
}

impl InventoryService {
    /// A service routing to `host`'s groups; nodes are partitioned by `topology_label` when set.
    pub fn new(
        host: RaftHost,
        shards: u32,
        topology_label: Option<String>,
    ) -> InventoryServer<Self> {
        InventoryServer::new(Self {
            host,
            shards,
            topology_label,
        })
    }

    async fn shard_of(&self, node: &str) -> Result<Option<u32>, Status> {
        let out = self
            .host
            .read(
                META_GROUP,
                encode(&MetaQuery::ShardOf {
                    node: node.to_string(),
                }),
            )
            .await
            .map_err(status)?;
        match decode::<MetaReply>(&out.reply).map_err(internal)? {
            MetaReply::Shard { shard } => Ok(Some(shard)),
            _ => Ok(None),
        }
    }
}

fn status(e: HostError) -> Status {
    e.to_status()
}

fn internal(e: serde_json::Error) -> Status {
    Status::internal(format!("undecodable reply from a state machine: {e}"))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Checks a node spec; every error names the field.
pub fn validate_node(spec: &NodeSpec) -> Result<NodeRecordSpec, Status> {
    let name = &spec.name;
    if name.is_empty() {
        return Err(Status::invalid_argument("node.name: must not be empty"));
    }
    if name.len() > NODE_NAME_BYTES_MAX {
        return Err(Status::invalid_argument(format!(
            "node.name: longer than {NODE_NAME_BYTES_MAX} characters"
        )));
    }
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !name.chars().all(valid_char) || !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err(Status::invalid_argument(format!(
            "node.name: {name:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')"
        )));
    }
    let mut taints = Vec::new();
    for (i, t) in spec.taints.iter().enumerate() {
        if t.key.is_empty() {
            return Err(Status::invalid_argument(format!(
                "node.taints[{i}].key: must not be empty"
            )));
        }
        if !TAINT_EFFECTS.contains(&t.effect.as_str()) {
            return Err(Status::invalid_argument(format!(
                "node.taints[{i}].effect: {:?} is not one of NoSchedule, PreferNoSchedule, NoExecute",
                t.effect
            )));
        }
        taints.push(TaintRecord {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        });
    }
    for (k, v) in &spec.allocatable {
        if k.is_empty() {
            return Err(Status::invalid_argument(
                "node.allocatable: empty resource name",
            ));
        }
        if v.is_empty() || v.starts_with('-') {
            return Err(Status::invalid_argument(format!(
                "node.allocatable[{k}]: {v:?} is not a non-negative quantity"
            )));
        }
    }
    Ok(NodeRecordSpec {
        name: name.clone(),
        labels: spec.labels.clone().into_iter().collect(),
        taints,
        allocatable: spec.allocatable.clone().into_iter().collect(),
        unschedulable: spec.unschedulable,
    })
}

fn node_info(record: NodeRecord, shard: u32) -> NodeInfo {
    let s = record.spec;
    NodeInfo {
        node: Some(NodeSpec {
            name: s.name,
            labels: s.labels.into_iter().collect(),
            taints: s
                .taints
                .into_iter()
                .map(|t| Taint {
                    key: t.key,
                    value: t.value,
                    effect: t.effect,
                })
                .collect(),
            allocatable: s.allocatable.into_iter().collect(),
            unschedulable: s.unschedulable,
        }),
        shard,
        registered_at_ms: record.registered_at_ms,
        updated_at_ms: record.updated_at_ms,
    }
}

fn rejected(reason: String) -> Status {
    Status::invalid_argument(reason)
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
        let spec = validate_node(&spec)?;
        let at_ms = now_ms();
        let labels: BTreeMap<String, String> = spec.labels.clone();
        let proposed = shard_for(
            &spec.name,
            &labels,
            self.topology_label.as_deref(),
            self.shards,
        );
        let assign = MetaCommand::AssignNode {
            node: spec.name.clone(),
            shard: proposed,
            at_ms,
        };
        let out = self
            .host
            .write(META_GROUP, encode(&assign))
            .await
            .map_err(status)?;
        let shard = match decode::<MetaReply>(&out.reply).map_err(internal)? {
            MetaReply::Shard { shard } => shard,
            MetaReply::Rejected { reason } => return Err(rejected(reason)),
            other => return Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        };
        let register = ShardCommand::RegisterNode { spec, at_ms };
        let out = self
            .host
            .write(u64::from(shard), encode(&register))
            .await
            .map_err(status)?;
        match decode::<ShardReply>(&out.reply).map_err(internal)? {
            ShardReply::Node { node } => Ok(Response::new(RegisterNodeReply {
                node: Some(node_info(node, shard)),
            })),
            ShardReply::Rejected { reason } => Err(rejected(reason)),
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
        let q = encode(&ShardQuery::GetNode { name: name.clone() });
        let out = self.host.read(u64::from(shard), q).await.map_err(status)?;
        match decode::<ShardReply>(&out.reply).map_err(internal)? {
            ShardReply::Node { node } => Ok(Response::new(node_info(node, shard))),
            _ => Err(not_found()),
        }
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
            let out = self
                .host
                .read(u64::from(shard), encode(&ShardQuery::ListNodes))
                .await
                .map_err(status)?;
            if let ShardReply::Nodes { nodes: list } =
                decode::<ShardReply>(&out.reply).map_err(internal)?
            {
                nodes.extend(list.into_iter().map(|n| node_info(n, shard)));
            }
        }
        Ok(Response::new(ListNodesReply { nodes }))
    }
}
