//! gangway-client: the Rust client for gangway. Connects to any replica of a
//! cluster (trying each endpoint in turn); the replica routes requests to the
//! group leaders. Used by batch frameworks, `gangctl` and the chaos drills.

use std::time::Duration;

pub mod loopback;
pub mod spec;

use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::queues_client::QueuesClient;
use gangway_proto::admin::shards_client::ShardsClient;
use gangway_proto::admin::{
    AddLearnerRequest, BalanceReply, BalanceRequest, ChangeMembershipRequest, CompactRequest,
    StatusReply, StatusRequest, TransferLeaderRequest,
};
use gangway_proto::v1::inventory_client::InventoryClient;
use gangway_proto::v1::scheduler_client::SchedulerClient;
use gangway_proto::v1::{
    DeviceListAck, DeviceListReport, GangGroupRef, GangGroupStatus, GetNodeRequest,
    HeartbeatRequest, ListGangGroupsReply, ListGangGroupsRequest, ListNodesRequest,
    ListShardsRequest, NodeInfo, NodeSpec, RegisterNodeRequest, ReleaseMembersRequest, ShardInfo,
    SubmitGangGroupRequest, WatchGangGroupRequest, WatchGangGroupsRequest,
};
use std::path::Path;

use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use gangway_proto::{admin as admin_api, v1 as api};

/// Time allowed to connect to one endpoint.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Time allowed for one request.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Largest reply the client reads, in bytes: a list of 10,000 gang groups is a few MB,
/// past tonic's 4 MB default.
pub const REPLY_BYTES_MAX: usize = 64 << 20;

/// A client-side failure.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No endpoint accepted a connection.
    #[error("cannot reach gangway at {endpoints}: {reason}")]
    Connect {
        /// The endpoints tried.
        endpoints: String,
        /// The last failure.
        reason: String,
    },
    /// A credential file could not be used.
    #[error("credentials: {0}")]
    Credentials(String),
    /// The server answered with an error (or the transport failed: then the message
    /// carries the cause, e.g. the TLS alert that refused the connection).
    #[error("{}: {}", .0.code(), .0.message())]
    Rpc(tonic::Status),
}

impl From<tonic::Status> for ClientError {
    /// A status with a source was made by this side's transport (the connection broke
    /// mid-call): it is reported UNAVAILABLE, which callers retry, not UNKNOWN.
    fn from(status: tonic::Status) -> Self {
        let code = match (status.code(), std::error::Error::source(&status)) {
            (tonic::Code::Unknown, Some(_)) => tonic::Code::Unavailable,
            (code, _) => code,
        };
        let mut causes = Vec::new();
        let mut source = std::error::Error::source(&status);
        while let Some(e) = source {
            let text = e.to_string();
            if !causes.contains(&text) && text != status.message() {
                causes.push(text);
            }
            source = e.source();
        }
        if causes.is_empty() && code == status.code() {
            return ClientError::Rpc(status);
        }
        let message = match causes.is_empty() {
            true => status.message().to_string(),
            false => format!("{}: {}", status.message(), causes.join(": ")),
        };
        ClientError::Rpc(tonic::Status::new(code, message))
    }
}

/// How a client proves who it is: a TLS identity (for servers started with
/// `--tls-cert/--tls-key/--tls-client-ca`) and a bearer token (`--auth-tokens-file`).
#[derive(Clone, Default)]
pub struct Credentials {
    /// CA to trust and this client's certificate; `None`: plaintext.
    pub tls: Option<ClientTlsConfig>,
    /// Sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Credentials {
    /// Reads PEM files: `ca` to trust, and this client's `cert` and `key` (both or neither).
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        token: Option<String>,
    ) -> Result<Self, ClientError> {
        let read = |flag: &str, p: &Path| {
            std::fs::read(p)
                .map_err(|e| ClientError::Credentials(format!("{flag} {}: {e}", p.display())))
        };
        let tls = match (ca, cert, key) {
            (None, None, None) => None,
            (Some(ca), cert, key) => {
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(read("--tls-ca", ca)?));
                match (cert, key) {
                    (Some(c), Some(k)) => {
                        tls = tls.identity(Identity::from_pem(
                            read("--tls-cert", c)?,
                            read("--tls-key", k)?,
                        ));
                    }
                    (None, None) => {}
                    _ => {
                        return Err(ClientError::Credentials(
                            "--tls-cert and --tls-key go together".into(),
                        ))
                    }
                }
                Some(tls)
            }
            (None, _, _) => return Err(ClientError::Credentials(
                "--tls-cert/--tls-key need --tls-ca (the CA that signed the server's certificate)"
                    .into(),
            )),
        };
        Ok(Self { tls, token })
    }
}

/// Adds the bearer token, if any, to every request.
#[derive(Clone)]
pub struct BearerToken(Option<String>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            let value = format!("Bearer {token}").parse().map_err(|_| {
                tonic::Status::invalid_argument("the token is not a valid header value")
            })?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

/// The transport every generated client runs on: a channel that adds the token.
pub type Transport = InterceptedService<Channel, BearerToken>;

/// A connection to one replica of a gangway cluster.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    addr: String,
    credentials: Credentials,
}

async fn open(addr: &str, credentials: &Credentials) -> Result<Channel, String> {
    let scheme = if credentials.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("{scheme}://{addr}")
    };
    let mut endpoint =
        Endpoint::from_shared(url).map_err(|e| format!("invalid address {addr:?}: {e}"))?;
    if let Some(tls) = &credentials.tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| format!("{addr}: TLS: {e}"))?;
    }
    endpoint
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
        .connect()
        .await
        .map_err(|e| format!("{addr}: {e}"))
}

impl Client {
    /// Connects to the first endpoint (`host:port`) that answers, without credentials.
    pub async fn connect(endpoints: &[String]) -> Result<Self, ClientError> {
        Self::connect_with(endpoints, Credentials::default()).await
    }

    /// Connects to the first endpoint that answers, with `credentials`.
    pub async fn connect_with(
        endpoints: &[String],
        credentials: Credentials,
    ) -> Result<Self, ClientError> {
        let mut last = String::from("no endpoint given");
        for addr in endpoints {
            match open(addr, &credentials).await {
                Ok(channel) => {
                    return Ok(Self {
                        channel,
                        addr: addr.clone(),
                        credentials,
                    })
                }
                Err(e) => last = e,
            }
        }
        Err(ClientError::Connect {
            endpoints: endpoints.join(","),
            reason: last,
        })
    }

    /// The endpoint this client is connected to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Status of the connected replica.
    pub async fn status(&self, include_state_hash: bool) -> Result<StatusReply, ClientError> {
        let req = StatusRequest { include_state_hash };
        Ok(AdminClient::new(self.transport())
            .status(req)
            .await?
            .into_inner())
    }

    /// Status of every member the connected replica knows; unreachable ones are `Err`.
    pub async fn cluster_status(
        &self,
    ) -> Result<Vec<(u64, String, Result<StatusReply, ClientError>)>, ClientError> {
        let local = self.status(false).await?;
        let mut out = Vec::new();
        for m in &local.members {
            let status = if m.node_id == local.node_id {
                Ok(local.clone())
            } else {
                match open(&m.addr, &self.credentials).await {
                    Ok(ch) => AdminClient::new(self.with_token(ch))
                        .status(StatusRequest {
                            include_state_hash: false,
                        })
                        .await
                        .map(|r| r.into_inner())
                        .map_err(ClientError::from),
                    Err(reason) => Err(ClientError::Connect {
                        endpoints: m.addr.clone(),
                        reason,
                    }),
                }
            };
            out.push((m.node_id, m.addr.clone(), status));
        }
        Ok(out)
    }

    /// Spreads group leaderships evenly over the live replicas.
    pub async fn balance(&self) -> Result<BalanceReply, ClientError> {
        Ok(AdminClient::new(self.transport())
            .balance(BalanceRequest {})
            .await?
            .into_inner())
    }

    /// Snapshots and truncates the connected replica's logs.
    pub async fn compact(&self, group_id: Option<u64>) -> Result<(), ClientError> {
        AdminClient::new(self.transport())
            .compact(CompactRequest { group_id })
            .await?;
        Ok(())
    }

    /// Adds replica `node_id` (started with `--join`, reachable at `addr`) to every
    /// group: first as a learner, which catches up from the leader, then as a voter.
    /// Returns the groups' voters afterwards.
    pub async fn add_member(
        &self,
        node_id: u64,
        addr: &str,
    ) -> Result<Vec<(u64, Vec<u64>)>, ClientError> {
        let mut admin = AdminClient::new(self.transport());
        admin
            .add_learner(AddLearnerRequest {
                group_id: None,
                node_id,
                addr: addr.to_string(),
            })
            .await?;
        for g in self.status(false).await?.groups {
            let mut voters = g.voters.clone();
            if !voters.contains(&node_id) {
                voters.push(node_id);
                admin
                    .change_membership(ChangeMembershipRequest {
                        group_id: Some(g.group_id),
                        voters,
                    })
                    .await?;
            }
        }
        self.voters().await
    }

    /// Removes replica `node_id` from every group's voters; where it leads a group,
    /// the leadership is handed to another voter first, so no group waits for an
    /// election. Returns the groups' voters afterwards.
    pub async fn remove_member(&self, node_id: u64) -> Result<Vec<(u64, Vec<u64>)>, ClientError> {
        let mut admin = AdminClient::new(self.transport());
        let groups = self.status(false).await?.groups;
        if !groups.iter().any(|g| g.voters.contains(&node_id)) {
            return Err(ClientError::Rpc(tonic::Status::not_found(format!(
                "node {node_id} is not a voter of any group"
            ))));
        }
        // Leaderships go to a voter that answers now, not merely the first one listed.
        let live: Vec<u64> = self
            .cluster_status()
            .await?
            .into_iter()
            .filter(|(_, _, status)| status.is_ok())
            .map(|(id, _, _)| id)
            .collect();
        for g in &groups {
            let others: Vec<u64> = g.voters.iter().copied().filter(|v| *v != node_id).collect();
            if others.is_empty() {
                return Err(ClientError::Rpc(tonic::Status::failed_precondition(
                    format!("group {}: node {node_id} is its only voter", g.group_id),
                )));
            }
            if g.leader == node_id {
                let Some(to) = others.iter().copied().find(|v| live.contains(v)) else {
                    return Err(ClientError::Rpc(tonic::Status::unavailable(format!(
                        "group {}: no other voter of {others:?} answers; its leadership cannot move",
                        g.group_id
                    ))));
                };
                admin
                    .transfer_leader(TransferLeaderRequest {
                        group_id: g.group_id,
                        to_node: to,
                    })
                    .await?;
            }
            if g.voters.contains(&node_id) {
                admin
                    .change_membership(ChangeMembershipRequest {
                        group_id: Some(g.group_id),
                        voters: others,
                    })
                    .await?;
            }
        }
        self.voters().await
    }

    /// Each group's voters, as the connected replica sees them.
    async fn voters(&self) -> Result<Vec<(u64, Vec<u64>)>, ClientError> {
        Ok(self
            .status(false)
            .await?
            .groups
            .into_iter()
            .map(|g| (g.group_id, g.voters))
            .collect())
    }

    /// Registers a node; the same node again is accepted, one with another spec refused
    /// (ALREADY_EXISTS: use `update_node`).
    pub async fn register_node(&self, node: NodeSpec) -> Result<NodeInfo, ClientError> {
        self.register(node, false).await
    }

    /// Replaces a registered node's spec (labels, taints, allocatable, unschedulable), or
    /// registers it if it is new.
    pub async fn update_node(&self, node: NodeSpec) -> Result<NodeInfo, ClientError> {
        self.register(node, true).await
    }

    async fn register(&self, node: NodeSpec, update: bool) -> Result<NodeInfo, ClientError> {
        let reply = InventoryClient::new(self.transport())
            .register_node(RegisterNodeRequest {
                node: Some(node),
                update,
            })
            .await?
            .into_inner();
        reply
            .node
            .ok_or_else(|| ClientError::Rpc(tonic::Status::internal("empty reply")))
    }

    /// Every registered node (of one shard when given).
    pub async fn list_nodes(&self, shard: Option<u32>) -> Result<Vec<NodeInfo>, ClientError> {
        let reply = InventoryClient::new(self.transport())
            .list_nodes(ListNodesRequest { shard })
            .await?;
        Ok(reply.into_inner().nodes)
    }

    /// One node with its usage and devices.
    pub async fn get_node(&self, name: &str) -> Result<NodeInfo, ClientError> {
        let reply = InventoryClient::new(self.transport())
            .get_node(GetNodeRequest {
                name: name.to_string(),
            })
            .await?;
        Ok(reply.into_inner())
    }

    /// Renews a node's lease (`lease_ms` 0: the server's default) and reports its readiness;
    /// answers when the lease lapses unless renewed, in ms since the Unix epoch.
    pub async fn heartbeat(
        &self,
        node: &str,
        ready: bool,
        lease_ms: u64,
    ) -> Result<u64, ClientError> {
        let reply = InventoryClient::new(self.transport())
            .heartbeat(HeartbeatRequest {
                node: node.to_string(),
                not_ready: !ready,
                lease_ms,
            })
            .await?;
        Ok(reply.into_inner().lease_until_ms)
    }

    /// Opens a node agent's device stream: every report sent on `reports` (the full device
    /// list of one resource, sent on every change) is answered by one ack on the stream
    /// returned. Closing `reports` ends the stream and starts the devices' grace period.
    pub async fn device_stream(
        &self,
        reports: impl tokio_stream::Stream<Item = DeviceListReport> + Send + 'static,
    ) -> Result<tonic::Streaming<DeviceListAck>, ClientError> {
        let reply = InventoryClient::new(self.transport())
            .list_and_watch_devices(reports)
            .await?;
        Ok(reply.into_inner())
    }

    /// Reports what a node's device plugin answered for a member's devices (a node
    /// agent calls it); the member's placement status shows it.
    pub async fn report_allocation(
        &self,
        node: &str,
        member: &str,
        allocation: gangway_proto::v1::NodeAllocation,
    ) -> Result<(), ClientError> {
        InventoryClient::new(self.transport())
            .report_allocation(gangway_proto::v1::ReportAllocationRequest {
                node: node.to_string(),
                member: member.to_string(),
                allocation: Some(allocation),
            })
            .await?;
        Ok(())
    }

    fn transport(&self) -> Transport {
        self.with_token(self.channel.clone())
    }

    fn with_token(&self, channel: Channel) -> Transport {
        InterceptedService::new(channel, BearerToken(self.credentials.token.clone()))
    }

    fn scheduler(&self) -> SchedulerClient<Transport> {
        SchedulerClient::new(self.transport()).max_decoding_message_size(REPLY_BYTES_MAX)
    }

    /// Submits a gang group; the same idempotency key always yields the same group.
    ///
    /// Without a key one is made here, so that retrying a submission whose
    /// answer was lost (the replica failed over) can never create a second group.
    pub async fn submit(
        &self,
        mut request: SubmitGangGroupRequest,
    ) -> Result<GangGroupStatus, ClientError> {
        if request.idempotency_key.is_empty() {
            request.idempotency_key = new_idempotency_key(&request.name);
        }
        let mut attempt = 1;
        loop {
            match self.scheduler().submit_gang_group(request.clone()).await {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(status) if is_transient(&status) && attempt < SUBMIT_ATTEMPTS_MAX => {
                    tokio::time::sleep(Duration::from_millis(SUBMIT_RETRY_BASE_MS << attempt))
                        .await;
                    attempt += 1;
                }
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// Submits a gang group once, without retrying: for callers that fail over across
    /// replicas themselves. The idempotency key must be set, so that their retries are safe.
    pub async fn submit_once(
        &self,
        request: SubmitGangGroupRequest,
    ) -> Result<GangGroupStatus, ClientError> {
        if request.idempotency_key.is_empty() {
            return Err(ClientError::Rpc(tonic::Status::invalid_argument(
                "idempotency_key: submit_once needs one, so that retries are safe",
            )));
        }
        Ok(self
            .scheduler()
            .submit_gang_group(request)
            .await?
            .into_inner())
    }

    /// A gang group's status.
    pub async fn get(&self, id: u64) -> Result<GangGroupStatus, ClientError> {
        Ok(self
            .scheduler()
            .get_gang_group(GangGroupRef { id })
            .await?
            .into_inner())
    }

    /// Follows a gang group until `until` accepts a status or the group ends; returns that status.
    pub async fn watch_until(
        &self,
        id: u64,
        mut until: impl FnMut(&GangGroupStatus) -> bool,
    ) -> Result<GangGroupStatus, ClientError> {
        let mut stream = self
            .scheduler()
            .watch_gang_group(WatchGangGroupRequest {
                id,
                after_version: 0,
            })
            .await?
            .into_inner();
        let mut last = None;
        while let Some(status) = stream.message().await? {
            let stop = until(&status) || TERMINAL_STATES.contains(&status.state.as_str());
            if stop {
                return Ok(status);
            }
            last = Some(status);
        }
        match last {
            Some(s) => Ok(s),
            None => Err(ClientError::Rpc(tonic::Status::unavailable(
                "the watch ended before any status",
            ))),
        }
    }

    /// The statuses of one gang group from after `after_version` (0: its current
    /// status first), then each change until it ends: a caller that reconnects with the
    /// last version it received, to any replica, gets what changed meanwhile and nothing
    /// twice.
    pub async fn watch(
        &self,
        id: u64,
        after_version: u64,
    ) -> Result<tonic::Streaming<GangGroupStatus>, ClientError> {
        Ok(self
            .scheduler()
            .watch_gang_group(WatchGangGroupRequest { id, after_version })
            .await?
            .into_inner())
    }

    /// Every change of the gang groups of `namespace` and `queue` (empty: any) after
    /// `after_version` (0: first every group gangway keeps), as it comes; resumed from the
    /// last status's version as [`Client::watch`] is.
    pub async fn watch_groups(
        &self,
        namespace: &str,
        queue: &str,
        after_version: u64,
    ) -> Result<tonic::Streaming<GangGroupStatus>, ClientError> {
        Ok(self
            .scheduler()
            .watch_gang_groups(WatchGangGroupsRequest {
                namespace: namespace.to_string(),
                queue: queue.to_string(),
                after_version,
            })
            .await?
            .into_inner())
    }

    /// Cancels a gang group; whatever it holds is released.
    pub async fn cancel(&self, id: u64) -> Result<GangGroupStatus, ClientError> {
        Ok(self
            .scheduler()
            .cancel_gang_group(GangGroupRef { id })
            .await?
            .into_inner())
    }

    /// Releases a placed gang group whose work finished.
    pub async fn release(&self, id: u64) -> Result<GangGroupStatus, ClientError> {
        Ok(self
            .scheduler()
            .release_gang_group(GangGroupRef { id })
            .await?
            .into_inner())
    }

    /// Releases some members (`namespace/gang/member`) of a placed group; the rest stay placed.
    pub async fn release_members(
        &self,
        id: u64,
        members: Vec<String>,
    ) -> Result<GangGroupStatus, ClientError> {
        let req = ReleaseMembersRequest { id, members };
        Ok(self.scheduler().release_members(req).await?.into_inner())
    }

    /// Gang groups (only unfinished ones unless `include_finished`).
    pub async fn list_groups(
        &self,
        include_finished: bool,
    ) -> Result<Vec<GangGroupStatus>, ClientError> {
        let req = ListGangGroupsRequest {
            include_finished,
            ..Default::default()
        };
        Ok(self
            .scheduler()
            .list_gang_groups(req)
            .await?
            .into_inner()
            .groups)
    }

    /// The groups changed after `stamp` (0: every group kept), finished ones
    /// included, oldest change first, at most `limit` (0: the server's default);
    /// the reply's `stamp` is where to ask from next, `more` says changes wait, and
    /// `forgotten` counts the finished groups gangway no longer keeps.
    pub async fn list_changes(
        &self,
        stamp: u64,
        limit: u32,
    ) -> Result<ListGangGroupsReply, ClientError> {
        let req = ListGangGroupsRequest {
            include_finished: true,
            changed_after: Some(stamp),
            limit,
        };
        Ok(self.scheduler().list_gang_groups(req).await?.into_inner())
    }

    /// Creates or changes a queue; its status as stored.
    pub async fn put_queue(
        &self,
        queue: gangway_proto::admin::QueueSpec,
    ) -> Result<gangway_proto::admin::QueueStatus, ClientError> {
        let req = gangway_proto::admin::PutQueueRequest { queue: Some(queue) };
        Ok(QueuesClient::new(self.transport())
            .put_queue(req)
            .await?
            .into_inner())
    }

    /// Deletes a queue with no children and no gang group that has not ended.
    pub async fn delete_queue(&self, name: &str) -> Result<(), ClientError> {
        let req = gangway_proto::admin::DeleteQueueRequest {
            name: name.to_string(),
        };
        QueuesClient::new(self.transport())
            .delete_queue(req)
            .await?;
        Ok(())
    }

    /// Every queue with its usage and group counts, in name order.
    pub async fn queues(&self) -> Result<Vec<gangway_proto::admin::QueueStatus>, ClientError> {
        Ok(self.queue_list().await?.queues)
    }

    /// Every queue with its usage, and the cluster capacity top-level queues lend in.
    pub async fn queue_list(&self) -> Result<gangway_proto::admin::ListQueuesReply, ClientError> {
        let req = gangway_proto::admin::ListQueuesRequest {};
        Ok(QueuesClient::new(self.transport())
            .list_queues(req)
            .await?
            .into_inner())
    }

    /// Begins moving a topology domain's nodes (or `nodes`) to shard `to`; with `wait`,
    /// answers once the move ended.
    pub async fn move_nodes(
        &self,
        domain: Option<String>,
        nodes: Vec<String>,
        to: u32,
        wait: bool,
    ) -> Result<gangway_proto::admin::MoveNodesReply, ClientError> {
        let req = gangway_proto::admin::MoveNodesRequest {
            domain: domain.unwrap_or_default(),
            nodes,
            to,
            wait,
        };
        Ok(ShardsClient::new(self.transport())
            .move_nodes(req)
            .await?
            .into_inner())
    }

    /// Plans a rebalance within `bound_percent` of the mean (0: the server's) and,
    /// unless `dry_run`, makes its moves one after the other.
    pub async fn rebalance(
        &self,
        bound_percent: u32,
        dry_run: bool,
    ) -> Result<gangway_proto::admin::RebalanceReply, ClientError> {
        let req = gangway_proto::admin::RebalanceRequest {
            bound_percent,
            dry_run,
        };
        Ok(ShardsClient::new(self.transport())
            .rebalance(req)
            .await?
            .into_inner())
    }

    /// Raises the live cluster's shard count to `shards` (it never falls); the added
    /// shards start empty.
    pub async fn grow_shards(
        &self,
        shards: u32,
    ) -> Result<gangway_proto::admin::GrowShardsReply, ClientError> {
        let req = gangway_proto::admin::GrowShardsRequest { shards };
        Ok(ShardsClient::new(self.transport())
            .grow_shards(req)
            .await?
            .into_inner())
    }

    /// The running shard move, if any, and the last finished ones.
    pub async fn shard_moves(&self) -> Result<Vec<gangway_proto::admin::ShardMove>, ClientError> {
        Ok(ShardsClient::new(self.transport())
            .list_moves(gangway_proto::admin::ListMovesRequest {})
            .await?
            .into_inner()
            .moves)
    }

    /// The reservations for the head of the line holding now.
    pub async fn reservations(
        &self,
    ) -> Result<Vec<gangway_proto::admin::HeadReservation>, ClientError> {
        Ok(ShardsClient::new(self.transport())
            .list_reservations(gangway_proto::admin::ListReservationsRequest {})
            .await?
            .into_inner()
            .reservations)
    }

    /// Every shard with its leader, voters and node count.
    pub async fn shards(&self) -> Result<Vec<ShardInfo>, ClientError> {
        Ok(self
            .scheduler()
            .list_shards(ListShardsRequest {})
            .await?
            .into_inner()
            .shards)
    }
}

/// Attempts of one submission before its error is returned.
pub const SUBMIT_ATTEMPTS_MAX: u32 = 6;
/// First retry delay of a submission; doubles per attempt.
pub const SUBMIT_RETRY_BASE_MS: u64 = 50;

fn is_transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
    )
}

fn new_idempotency_key(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{name}-{nanos}-{}", std::process::id())
}

/// States in which a gang group has ended.
pub const TERMINAL_STATES: [&str; 4] = ["Released", "Cancelled", "TimedOut", "Preempted"];

#[cfg(test)]
mod tests;
