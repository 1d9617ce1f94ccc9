//! The Inventory service: node agents register nodes here. A node's shard is
//! fixed in the meta group first (so all front doors agree), then the node is
//! recorded in that shard. Both writes are idempotent, so a retried
//! registration converges. Every call names its node, and a node agent may speak
//! only for the nodes it is granted (`auth::access`, resource `nodes`); what an
//! allocation gives a container is held to the replica's host path prefixes.

use gangway_proto::v1::inventory_server::{Inventory, InventoryServer};
use gangway_proto::v1::{
    DeviceListAck, DeviceListReport, GetNodeRequest, HeartbeatReply, HeartbeatRequest,
    ListNodesReply, ListNodesRequest, NodeInfo, NodeSpec, RegisterNodeReply, RegisterNodeRequest,
    ReportAllocationReply, ReportAllocationRequest,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::access::{self, Access, Ask, Principal, Resource, Verb};
use crate::auth::limits::StreamLimits;
use crate::frontdoor::devices::{spawn_stream, DEVICE_ACKS_QUEUED_MAX};

use crate::replicated::growth::ShardCount;
use crate::replicated::{now_ms, ApplyError, Groups};
use gangway_core::ledger::meta::{domain_of, shard_command, MetaCommand, MetaReply, RejectionKind};
use gangway_core::ledger::{LedgerError, LedgerOp, LedgerReply, NodeEntry};
use gangway_core::model::node::RawTaint;
use gangway_core::model::resources::RawQuantity;
use gangway_core::model::{Node, RawNode};
use gangway_core::query::{ShardAnswer, ShardQuery};

/// A node lease's length when a heartbeat leaves it out, in ms (kubelet's node monitor
/// grace period).
pub const NODE_LEASE_MS_DEFAULT: u64 = 40_000;

/// What the Inventory service is configured with.
#[derive(Debug, Clone)]
pub struct InventoryOptions {
    /// The node label that partitions nodes into shards.
    pub topology_label: Option<String>,
    /// Host path prefixes an allocation's mounts and device nodes may name.
    pub host_path_prefixes: Vec<String>,
}

impl Default for InventoryOptions {
    fn default() -> Self {
        Self {
            topology_label: None,
            host_path_prefixes: gangway_core::model::node_allocation::HOST_PATH_PREFIXES_DEFAULT
                .iter()
                .map(|p| p.to_string())
                .collect(),
        }
    }
}

/// The Inventory gRPC service over one replica's groups.
pub struct InventoryService {
    groups: Groups,
    shards: ShardCount,
    options: InventoryOptions,
    access: Access,
    streams: StreamLimits,
}

impl InventoryService {
    /// A service routing to `groups`, authorizing with `access`, bounding device streams
    /// with `streams`.
    pub fn new(
        groups: Groups,
        shards: ShardCount,
        options: InventoryOptions,
        access: Access,
        streams: StreamLimits,
    ) -> InventoryServer<Self> {
        InventoryServer::new(Self {
            groups,
            shards,
            options,
            access,
            streams,
        })
    }

    /// Whether `who` may `verb` node `name` (PERMISSION_DENIED naming it otherwise).
    async fn check_node(&self, who: &Principal, verb: Verb, name: &str) -> Result<(), Status> {
        self.access
            .check(who, &Ask::of(verb, Resource::Nodes).named(name))
            .await
    }

    async fn shard_of(&self, node: &str) -> Result<Option<u32>, Status> {
        shard_of(&self.groups, node).await
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

/// The shard a node was assigned to, or `None` when it is not registered.
pub async fn shard_of(groups: &Groups, node: &str) -> Result<Option<u32>, Status> {
    groups.shard_of_node(node).await.map_err(|e| e.to_status())
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

/// The status for a ledger refusal, naming the field it concerns.
fn refused(error: LedgerError) -> Status {
    match error {
        LedgerError::UnknownNode { .. } => Status::not_found(format!("node: {error}")),
        LedgerError::NodeDiffers { .. } => Status::already_exists(format!("node: {error}")),
        // A shard move is handing the node over: the same call succeeds once it is done.
        LedgerError::NodeMoved { .. } | LedgerError::MemberMoved { .. } => {
            Status::unavailable(format!("node: {error}; retry"))
        }
        LedgerError::InvalidNode { .. } => Status::invalid_argument(format!("node: {error}")),
        LedgerError::InvalidLease { .. } | LedgerError::InvalidObservedPod { .. } => {
            Status::invalid_argument(error.to_string())
        }
        LedgerError::InvalidPool { .. } | LedgerError::InvalidDeviceClass { .. } => {
            Status::invalid_argument(format!("devices: {error}"))
        }
        other => Status::failed_precondition(other.to_string()),
    }
}

/// How a registration treats a node that is already registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Accept only the same spec again.
    Add,
    /// Replace the spec.
    Update,
}

/// Assigns `node` a shard (kept if it has one) and adds or updates it in that
/// shard's ledger; the shard it lives in.
pub async fn register(
    groups: &Groups,
    shards: u32,
    topology_label: Option<&str>,
    node: &Node,
    registration: Registration,
) -> Result<u32, Status> {
    let assign = shard_command(
        &node.name,
        domain_of(&node.labels, topology_label),
        groups.legacy_writer(),
        shards,
        now_ms(),
    );
    let shard = match groups.meta(&assign).await.map_err(|e| e.to_status())? {
        MetaReply::Shard { shard } => shard,
        MetaReply::Rejected { reason, .. } => return Err(Status::invalid_argument(reason)),
        other => return Err(Status::internal(format!("unexpected meta reply {other:?}"))),
    };
    let op = match registration {
        Registration::Add => LedgerOp::AddNode { node: node.clone() },
        Registration::Update => LedgerOp::RegisterNode { node: node.clone() },
    };
    match apply_op(groups, shard, op).await? {
        LedgerReply::NodeRegistered { .. } => Ok(shard),
        other => Err(Status::internal(format!(
            "unexpected shard reply {other:?}"
        ))),
    }
}

/// Applies one ledger operation on `shard`; a refusal becomes the status naming its cause.
pub async fn apply_op(groups: &Groups, shard: u32, op: LedgerOp) -> Result<LedgerReply, Status> {
    groups
        .apply_ledger_op(shard, op)
        .await
        .map_err(|e| match e {
            ApplyError::Group(e) => e.to_status(),
            ApplyError::Refused(error) => refused(error),
            ApplyError::Malformed(reason) => Status::internal(reason),
        })
}

#[tonic::async_trait]
impl Inventory for InventoryService {
    type ListAndWatchDevicesStream = ReceiverStream<Result<DeviceListAck, Status>>;

    async fn report_allocation(
        &self,
        request: Request<ReportAllocationRequest>,
    ) -> Result<Response<ReportAllocationReply>, Status> {
        let admitted = self
            .access
            .begin(&request, access::REPORT_ALLOCATION)
            .await?;
        let r = request.into_inner();
        if r.node.is_empty() {
            return Err(Status::invalid_argument("node: must not be empty"));
        }
        self.check_node(&admitted.principal, Verb::Update, &r.node)
            .await?;
        if r.member.is_empty() {
            return Err(Status::invalid_argument("member: must not be empty"));
        }
        let allocation = r
            .allocation
            .as_ref()
            .map(crate::convert::allocation_from_api)
            .ok_or_else(|| Status::invalid_argument("allocation: missing"))?;
        let at = gangway_core::model::FieldPath::new("allocation");
        allocation
            .validate(&at)
            .and_then(|()| allocation.validate_host_access(&at, &self.options.host_path_prefixes))
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let cmd = MetaCommand::NoteNodeAllocation {
            member: r.member,
            node: r.node,
            allocation,
        };
        match self.groups.meta(&cmd).await.map_err(|e| e.to_status())? {
            MetaReply::Group { .. } => Ok(Response::new(ReportAllocationReply {})),
            MetaReply::Rejected { reason, kind } => Err(match kind {
                RejectionKind::NotFound => Status::not_found(reason),
                RejectionKind::Conflict => Status::failed_precondition(reason),
                RejectionKind::Refused | RejectionKind::NoRoom => Status::invalid_argument(reason),
                RejectionKind::Busy => Status::unavailable(reason),
                RejectionKind::Exhausted => Status::resource_exhausted(reason),
            }),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let admitted = self.access.begin(&request, access::HEARTBEAT).await?;
        let beat = request.into_inner();
        if beat.node.is_empty() {
            return Err(Status::invalid_argument("node: must not be empty"));
        }
        self.check_node(&admitted.principal, Verb::Update, &beat.node)
            .await?;
        let lease_ms = match beat.lease_ms {
            0 => NODE_LEASE_MS_DEFAULT,
            ms => ms,
        };
        let shard = self.shard_of(&beat.node).await?.ok_or_else(|| {
            Status::not_found(format!(
                "node: \"{}\" is not registered; call RegisterNode first",
                beat.node
            ))
        })?;
        let op = LedgerOp::NodeHeartbeat {
            node: beat.node.clone(),
            ready: !beat.not_ready,
            lease_ms,
        };
        match apply_op(&self.groups, shard, op).await? {
            LedgerReply::HeartbeatRecorded { lease_until_ms, .. } => {
                Ok(Response::new(HeartbeatReply { lease_until_ms }))
            }
            other => Err(Status::internal(format!(
                "unexpected shard reply {other:?}"
            ))),
        }
    }

    async fn list_and_watch_devices(
        &self,
        request: Request<Streaming<DeviceListReport>>,
    ) -> Result<Response<Self::ListAndWatchDevicesStream>, Status> {
        let admitted = self.access.begin(&request, access::DEVICES).await?;
        let slot = self.streams.open(admitted.principal.name())?;
        let (acks, rx) = tokio::sync::mpsc::channel(DEVICE_ACKS_QUEUED_MAX);
        spawn_stream(
            self.groups.clone(),
            request.into_inner(),
            acks,
            (self.access.clone(), admitted.principal, slot),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn register_node(
        &self,
        request: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeReply>, Status> {
        let admitted = self.access.begin(&request, access::REGISTER_NODE).await?;
        let request = request.into_inner();
        let spec = request
            .node
            .ok_or_else(|| Status::invalid_argument("node: missing"))?;
        let node = validate_node(&spec)?;
        self.check_node(&admitted.principal, Verb::Update, &node.name)
            .await?;
        let registration = if request.update {
            Registration::Update
        } else {
            Registration::Add
        };
        let shard = register(
            &self.groups,
            self.shards.get(),
            self.options.topology_label.as_deref(),
            &node,
            registration,
        )
        .await?;
        let entry = self
            .shard_nodes(
                shard,
                &ShardQuery::GetNode {
                    name: node.name.clone(),
                },
            )
            .await?;
        let info = entry.first().map(|e| crate::convert::node_info(e, shard));
        Ok(Response::new(RegisterNodeReply { node: info }))
    }

    async fn get_node(
        &self,
        request: Request<GetNodeRequest>,
    ) -> Result<Response<NodeInfo>, Status> {
        let admitted = self.access.begin(&request, access::GET_NODE).await?;
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(Status::invalid_argument("name: must not be empty"));
        }
        self.check_node(&admitted.principal, Verb::Get, &name)
            .await?;
        let not_found = || Status::not_found(format!("node {name:?} is not registered"));
        let shard = self.shard_of(&name).await?.ok_or_else(not_found)?;
        let nodes = self
            .shard_nodes(shard, &ShardQuery::GetNode { name: name.clone() })
            .await?;
        nodes
            .first()
            .map(|e| Response::new(crate::convert::node_info(e, shard)))
            .ok_or_else(not_found)
    }

    async fn list_nodes(
        &self,
        request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesReply>, Status> {
        self.access.begin(&request, access::LIST_NODES).await?;
        let shards: Vec<u32> = match request.into_inner().shard {
            Some(s) if s == 0 || s > self.shards.get() => {
                return Err(Status::invalid_argument(format!(
                    "shard: {s} is not in 1..={}",
                    self.shards.get()
                )))
            }
            Some(s) => vec![s],
            None => self.shards.ids().collect(),
        };
        let mut nodes = Vec::new();
        for shard in shards {
            let entries = self.shard_nodes(shard, &ShardQuery::ListNodes).await?;
            nodes.extend(entries.iter().map(|e| crate::convert::node_info(e, shard)));
        }
        Ok(Response::new(ListNodesReply { nodes }))
    }
}
