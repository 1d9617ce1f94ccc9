//! The gRPC Raft transport server: checks each request's envelope (cluster,
//! target node, group) and hands it to the group's openraft replica; also
//! serves writes and reads forwarded by replicas that are not the leader, and
//! leadership-transfer notices.

use std::io::Cursor;

use gangway_proto::raft::raft_transport_server::{RaftTransport, RaftTransportServer};
use gangway_proto::raft::{
    Envelope, PingReply, PingRequest, PrepareElectionReply, PrepareElectionRequest,
    ProposeManyReply, ProposeManyRequest, ProposeOutcome, ProposeReply, ProposeRequest, RaftReply,
    RaftRequest, ReadReply, ReadRequest, SnapshotChunk,
};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::error::HostError;
use crate::forwarder::FORWARD_BATCH_MAX;
use crate::host::{Group, RaftHost, Routed};
use crate::types::{NodeId, Snapshot, SnapshotMeta, TypeConfig, Vote};

/// Largest snapshot a replica accepts.
pub const SNAPSHOT_BYTES_MAX: usize = 4 * 1024 * 1024 * 1024 - 1;
/// Largest gRPC message on the transport.
pub const TRANSPORT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The Raft transport service of a host.
pub struct TransportService {
    host: RaftHost,
}

impl RaftHost {
    /// The tonic service peers use to reach this host's groups.
    pub fn transport_service(&self) -> RaftTransportServer<TransportService> {
        RaftTransportServer::new(TransportService { host: self.clone() })
            .max_decoding_message_size(TRANSPORT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(TRANSPORT_MESSAGE_BYTES_MAX)
    }

    /// Refuses a request meant for another cluster, node or an unknown group.
    pub(crate) fn check_envelope(
        &self,
        env: Option<&Envelope>,
    ) -> Result<std::sync::Arc<Group>, Status> {
        let env = env.ok_or_else(|| Status::invalid_argument("envelope: missing"))?;
        if env.cluster_id != self.cluster_id() {
            return Err(HostError::WrongCluster(format!(
                "cluster id mismatch: this replica belongs to cluster {:?}, the request to {:?}",
                self.cluster_id(),
                env.cluster_id
            ))
            .to_status());
        }
        if env.to_node != self.node_id() {
            return Err(HostError::WrongCluster(format!(
                "request for node {} reached node {} at {}",
                env.to_node,
                self.node_id(),
                self.advertise_addr()
            ))
            .to_status());
        }
        self.group(env.group_id).map_err(|e| e.to_status())
    }
}

fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, Status> {
    codec::decode(what, bytes).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn reply<T: Serialize>(what: &'static str, value: &T) -> Result<Response<RaftReply>, Status> {
    let payload = codec::encode(what, value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply { payload }))
}

#[tonic::async_trait]
impl RaftTransport for TransportService {
    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let req = request.into_inner();
        self.host.check_transport_open()?;
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        let rpc: VoteRequest<NodeId> = decode("vote request", &req.payload)?;
        reply("vote reply", &g.raft.vote(rpc).await)
    }

    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = request.into_inner();
        self.host.check_transport_open()?;
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode("append-entries request", &req.payload)?;
        reply("append-entries reply", &g.raft.append_entries(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = request.into_inner();
        self.host.check_transport_open()?;
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        let rpc: InstallSnapshotRequest<TypeConfig> =
            decode("install-snapshot request", &req.payload)?;
        reply(
            "install-snapshot reply",
            &g.raft.install_snapshot(rpc).await,
        )
    }

    async fn install_full_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        self.host.check_transport_open()?;
        let mut stream = request.into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("snapshot stream: empty"))??;
        let g = self.host.check_envelope(first.envelope.as_ref())?.clone();
        let (vote, meta): (Vote, SnapshotMeta) = decode("snapshot header", &first.header)?;
        let mut data = first.data;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if data.len() + chunk.data.len() > SNAPSHOT_BYTES_MAX {
                return Err(Status::resource_exhausted(format!(
                    "snapshot larger than {SNAPSHOT_BYTES_MAX} bytes"
                )));
            }
            data.extend_from_slice(&chunk.data);
        }
        // A stream the sender gave up on may end without an error here: install only
        // a snapshot that arrived whole.
        if first.total_bytes > 0 && data.len() as u64 != first.total_bytes {
            return Err(Status::data_loss(format!(
                "snapshot stream ended after {} of {} bytes; not installed",
                data.len(),
                first.total_bytes
            )));
        }
        let snapshot = Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        };
        reply(
            "snapshot reply",
            &g.raft.install_full_snapshot(vote, snapshot).await,
        )
    }

    async fn propose(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let req = request.into_inner();
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        self.host.check_transport_open()?;
        let out = self
            .host
            .run_local(g.id, &Routed::Write(req.command))
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(ProposeReply {
            reply: out.reply,
            log_index: out.index,
        }))
    }

    async fn propose_many(
        &self,
        request: Request<ProposeManyRequest>,
    ) -> Result<Response<ProposeManyReply>, Status> {
        let req = request.into_inner();
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        self.host.check_transport_open()?;
        if req.commands.len() > FORWARD_BATCH_MAX {
            return Err(Status::invalid_argument(format!(
                "commands: {} in one call, at most {FORWARD_BATCH_MAX}",
                req.commands.len()
            )));
        }
        let group = g.id;
        // Each is proposed as if it had come alone; polled in order, they reach the
        // group's proposer in the order they were sent.
        let outcomes =
            futures::future::join_all(req.commands.into_iter().map(|command| async move {
                self.host.run_local(group, &Routed::Write(command)).await
            }))
            .await
            .into_iter()
            .map(|r| match r {
                Ok(out) => ProposeOutcome {
                    reply: out.reply,
                    log_index: out.index,
                    error: None,
                },
                Err(e) => ProposeOutcome {
                    reply: Vec::new(),
                    log_index: 0,
                    error: Some(e.to_forwarded()),
                },
            })
            .collect();
        Ok(Response::new(ProposeManyReply { outcomes }))
    }

    async fn ping(&self, request: Request<PingRequest>) -> Result<Response<PingReply>, Status> {
        self.host
            .check_envelope(request.into_inner().envelope.as_ref())?;
        Ok(Response::new(PingReply {
            groups: self.host.group_views(),
        }))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadReply>, Status> {
        let req = request.into_inner();
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        self.host.check_transport_open()?;
        let out = self
            .host
            .run_local(g.id, &Routed::Read(req.query))
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(ReadReply {
            reply: out.reply,
            applied_index: out.index,
        }))
    }

    async fn prepare_election(
        &self,
        request: Request<PrepareElectionRequest>,
    ) -> Result<Response<PrepareElectionReply>, Status> {
        let req = request.into_inner();
        let g = self.host.check_envelope(req.envelope.as_ref())?;
        self.host.check_transport_open()?;
        self.host
            .prepare_election(g.id, req.candidate, req.hold_ms)
            .map_err(|e| e.to_status())?;
        Ok(Response::new(PrepareElectionReply {}))
    }
}
