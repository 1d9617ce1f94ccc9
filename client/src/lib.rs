//! gangway-client: the Rust client for gangway. Connects to any replica of a
//! cluster (trying each endpoint in turn); the replica routes requests to the
//! group leaders. Used by batch frameworks, `gangctl` and the chaos drills.

use std::time::Duration;

pub mod loopback;
pub mod spec;

use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::{
    BalanceReply, BalanceRequest, CompactRequest, StatusReply, StatusRequest,
};
use gangway_proto::v1::inventory_client::InventoryClient;
use gangway_proto::v1::scheduler_client::SchedulerClient;
use gangway_proto::v1::{
    DeviceListAck, DeviceListReport, GangGroupRef, GangGroupStatus, GetNodeRequest,
    HeartbeatRequest, ListGangGroupsRequest, ListNodesRequest, ListShardsRequest, NodeInfo,
    NodeSpec, RegisterNodeRequest, ReleaseMembersRequest, ShardInfo, SubmitGangGroupRequest,
};
use tonic::transport::{Channel, Endpoint};

pub use gangway_proto::{admin as admin_api, v1 as api};

/// Time allowed to connect to one endpoint.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Time allowed for one request.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;

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
    /// The server answered with an error.
    #[error("{}: {}", .0.code(), .0.message())]
    Rpc(#[from] tonic::Status),
}

/// A connection to one replica of a gangway cluster.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    addr: String,
}

async fn open(addr: &str) -> Result<Channel, String> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    Endpoint::from_shared(url)
        .map_err(|e| format!("invalid address {addr:?}: {e}"))?
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
        .connect()
        .await
        .map_err(|e| format!("{addr}: {e}"))
}

impl Client {
    /// Connects to the first endpoint (`host:port`) that answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, ClientError> {
        let mut last = String::from("no endpoint given");
        for addr in endpoints {
            match open(addr).await {
                Ok(channel) => {
                    return Ok(Self {
                        channel,
                        addr: addr.clone(),
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
        Ok(AdminClient::new(self.channel.clone())
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
                match open(&m.addr).await {
                    Ok(ch) => AdminClient::new(ch)
                        .status(StatusRequest {
                            include_state_hash: false,
                        })
                        .await
                        .map(|r| r.into_inner())
                        .map_err(ClientError::Rpc),
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
        Ok(AdminClient::new(self.channel.clone())
            .balance(BalanceRequest {})
            .await?
            .into_inner())
    }

    /// Snapshots and truncates the connected replica's logs.
    pub async fn compact(&self, group_id: Option<u64>) -> Result<(), ClientError> {
        AdminClient::new(self.channel.clone())
            .compact(CompactRequest { group_id })
            .await?;
        Ok(())
    }

    /// Registers (or updates) a node.
    pub async fn register_node(&self, node: NodeSpec) -> Result<NodeInfo, ClientError> {
        let reply = InventoryClient::new(self.channel.clone())
            .register_node(RegisterNodeRequest { node: Some(node) })
            .await?
            .into_inner();
        reply
            .node
            .ok_or_else(|| ClientError::Rpc(tonic::Status::internal("empty reply")))
    }

    /// Every registered node (of one shard when given).
    pub async fn list_nodes(&self, shard: Option<u32>) -> Result<Vec<NodeInfo>, ClientError> {
        let reply = InventoryClient::new(self.channel.clone())
            .list_nodes(ListNodesRequest { shard })
            .await?;
        Ok(reply.into_inner().nodes)
    }

    /// One node with its usage and devices.
    pub async fn get_node(&self, name: &str) -> Result<NodeInfo, ClientError> {
        let reply = InventoryClient::new(self.channel.clone())
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
        let reply = InventoryClient::new(self.channel.clone())
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
        let reply = InventoryClient::new(self.channel.clone())
            .list_and_watch_devices(reports)
            .await?;
        Ok(reply.into_inner())
    }

    fn scheduler(&self) -> SchedulerClient<Channel> {
        SchedulerClient::new(self.channel.clone())
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
            .watch_gang_group(GangGroupRef { id })
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
        let req = ListGangGroupsRequest { include_finished };
        Ok(self
            .scheduler()
            .list_gang_groups(req)
            .await?
            .into_inner()
            .groups)
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
pub const TERMINAL_STATES: [&str; 3] = ["Released", "Cancelled", "TimedOut"];
