//! openraft's network over gRPC: one cached tonic channel per peer address,
//! shared by every group of the process; each request carries the cluster id,
//! the group id and both node ids.
//!
//! Invariant: a remote Raft error comes back as `RemoteError`, a transport
//! failure as `Unreachable` (openraft backs off) or `NetworkError`. Used by
//! openraft's replication and election tasks through `NetworkFactory`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Cursor;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::raft::raft_transport_client::RaftTransportClient;
use gangway_proto::raft::{Envelope, RaftRequest, SnapshotChunk};
use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

use crate::codec;
use crate::host::{PeerSecurity, SharedToken};
use crate::peer_proof::{peer_proof, LEGACY_PEER_SECRET_HEADER, PEER_PROOF_HEADER};
use crate::types::{GroupId, NodeId, Snapshot, TypeConfig, Vote};

/// Bytes of snapshot data per streamed chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Time allowed to open a TCP connection to a peer.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Wait between attempts to reach an unreachable peer.
pub const PEER_BACKOFF_MS: u64 = 200;

/// One lazily connected channel per peer address, shared by all groups; over
/// mutual TLS when the host is configured with it.
#[derive(Default)]
pub(crate) struct PeerPool {
    channels: Mutex<HashMap<String, Channel>>,
    security: PeerSecurity,
    /// Advertised address -> address dialled (fault tests' link proxies).
    routes: BTreeMap<String, String>,
    /// The cluster the proofs name.
    cluster_id: Arc<str>,
}

/// An admin client on `channel` to node `to` that sends the host's credentials.
pub(crate) fn admin_client(
    pool: &PeerPool,
    channel: Channel,
    to: NodeId,
) -> AdminClient<InterceptedService<Channel, PeerCredentials>> {
    AdminClient::with_interceptor(channel, pool.credentials(to))
}

/// A Raft transport client on `channel` to node `to` that sends the host's credentials.
pub(crate) fn transport_client(
    pool: &PeerPool,
    channel: Channel,
    to: NodeId,
) -> RaftTransportClient<InterceptedService<Channel, PeerCredentials>> {
    // Forwarded reads answer with whole lists (every gang group, every node): the
    // tonic default of 4 MiB refused them once a cluster grew.
    RaftTransportClient::with_interceptor(channel, pool.credentials(to))
        .max_decoding_message_size(crate::service::TRANSPORT_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(crate::service::TRANSPORT_MESSAGE_BYTES_MAX)
}

/// Adds the proof that this replica holds the peer secret, made for the one peer the
/// client calls ([`crate::peer_proof`]), to every request; the secret is read on every
/// call, so a rotated one proves from then on.
#[derive(Clone)]
pub(crate) struct PeerCredentials {
    peer_secret: Option<SharedToken>,
    cluster_id: Arc<str>,
    to: NodeId,
    send_legacy_secret: bool,
}

impl Interceptor for PeerCredentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(secret) = &self.peer_secret {
            let secret = secret
                .read()
                .map(|s| s.clone())
                .map_err(|_| tonic::Status::internal("the peer secret lock is poisoned"))?;
            let proof = peer_proof(&secret, &self.cluster_id, self.to);
            let value = proof
                .parse()
                .map_err(|_| tonic::Status::internal("the peer proof is not a valid header"))?;
            req.metadata_mut().insert(PEER_PROOF_HEADER, value);
            if self.send_legacy_secret {
                let value = secret.parse().map_err(|_| {
                    tonic::Status::internal("the peer secret is not a valid header")
                })?;
                req.metadata_mut().insert(LEGACY_PEER_SECRET_HEADER, value);
            }
        }
        Ok(req)
    }
}

impl PeerPool {
    /// A pool whose channels use `security`, for a replica of `cluster_id`.
    pub(crate) fn new(
        security: PeerSecurity,
        routes: BTreeMap<String, String>,
        cluster_id: &str,
    ) -> Self {
        Self {
            channels: Mutex::default(),
            security,
            routes,
            cluster_id: Arc::from(cluster_id),
        }
    }

    /// The credentials of a call to node `to`.
    pub(crate) fn credentials(&self, to: NodeId) -> PeerCredentials {
        PeerCredentials {
            peer_secret: self.security.peer_secret.clone(),
            cluster_id: self.cluster_id.clone(),
            to,
            send_legacy_secret: self.security.send_legacy_secret,
        }
    }

    /// The channel to `addr` (`host:port`), created on first use.
    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self
            .channels
            .lock()
            .map_err(|_| "peer pool lock poisoned".to_string())?;
        if let Some(ch) = channels.get(addr) {
            return Ok(ch.clone());
        }
        let scheme = if self.security.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let dial = self.routes.get(addr).map_or(addr, String::as_str);
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{dial}"))
            .map_err(|e| format!("invalid peer address {dial:?}: {e}"))?;
        if let Some(tls) = &self.security.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| format!("TLS for peer {addr}: {e}"))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let ch = endpoint.connect_lazy();
        channels.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }
}

/// Identity stamped on every outgoing request of one group.
#[derive(Clone)]
pub(crate) struct Origin {
    pub(crate) cluster_id: Arc<str>,
    pub(crate) group: GroupId,
    pub(crate) node: NodeId,
}

impl Origin {
    pub(crate) fn envelope(&self, to: NodeId) -> Envelope {
        Envelope {
            cluster_id: self.cluster_id.to_string(),
            group_id: self.group,
            from_node: self.node,
            to_node: to,
        }
    }
}

/// Builds a `PeerLink` per target for one group.
pub(crate) struct NetworkFactory {
    pub(crate) origin: Origin,
    pub(crate) pool: Arc<PeerPool>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerLink {
        PeerLink {
            target,
            envelope: self.origin.envelope(target),
            channel: self.pool.channel(&node.addr),
            credentials: self.pool.credentials(target),
        }
    }
}

/// The link from one group's replica to one peer replica.
pub(crate) struct PeerLink {
    target: NodeId,
    envelope: Envelope,
    channel: Result<Channel, String>,
    credentials: PeerCredentials,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct LinkError(String);

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

impl PeerLink {
    fn client(
        &self,
    ) -> Result<RaftTransportClient<InterceptedService<Channel, PeerCredentials>>, Unreachable>
    {
        match &self.channel {
            Ok(ch) => Ok(RaftTransportClient::with_interceptor(
                ch.clone(),
                self.credentials.clone(),
            )
            .max_decoding_message_size(crate::service::TRANSPORT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(crate::service::TRANSPORT_MESSAGE_BYTES_MAX)),
            Err(e) => Err(Unreachable::new(&LinkError(e.clone()))),
        }
    }

    fn request<T: Serialize>(
        &self,
        what: &'static str,
        body: &T,
        option: &RPCOption,
    ) -> Result<tonic::Request<RaftRequest>, NetworkError> {
        let payload = codec::encode(what, body).map_err(|e| NetworkError::new(&e))?;
        let mut req = tonic::Request::new(RaftRequest {
            envelope: Some(self.envelope.clone()),
            payload,
        });
        req.set_timeout(option.hard_ttl());
        Ok(req)
    }

    fn decode<R, E>(&self, what: &'static str, bytes: &[u8]) -> Result<R, RpcErr<E>>
    where
        R: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result: Result<R, RaftError<NodeId, E>> =
            codec::decode(what, bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn status_to_rpc<E: std::error::Error>(status: tonic::Status) -> RpcErr<E> {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            RPCError::Unreachable(Unreachable::new(&status))
        }
        _ => RPCError::Network(NetworkError::new(&status)),
    }
}

/// A Raft call to a peer, as `gangway_raft_rpc_seconds` labels it.
#[derive(Debug, Clone, Copy)]
enum RpcKind {
    /// AppendEntries without entries.
    Heartbeat,
    /// AppendEntries carrying entries.
    Append,
    /// RequestVote.
    Vote,
}

impl RpcKind {
    fn label(self) -> &'static str {
        match self {
            RpcKind::Heartbeat => "heartbeat",
            RpcKind::Append => "append",
            RpcKind::Vote => "vote",
        }
    }

    /// Records the round trip of a call started at `started`, answered or not: a
    /// heartbeat that waits past the election timeout is what starts elections.
    fn observe(self, started: Instant) {
        metrics::histogram!("gangway_raft_rpc_seconds", "rpc" => self.label())
            .record(started.elapsed().as_secs_f64());
    }
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let mut client = self.client().map_err(RPCError::Unreachable)?;
        let kind = if rpc.entries.is_empty() {
            RpcKind::Heartbeat
        } else {
            RpcKind::Append
        };
        let req = self
            .request("append-entries request", &rpc, &option)
            .map_err(RPCError::Network)?;
        let started = Instant::now();
        let reply = client.append_entries(req).await;
        kind.observe(started);
        let reply = reply.map_err(status_to_rpc)?;
        self.decode("append-entries reply", &reply.into_inner().payload)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        let mut client = self.client().map_err(RPCError::Unreachable)?;
        let req = self
            .request("install-snapshot request", &rpc, &option)
            .map_err(RPCError::Network)?;
        let reply = client.install_snapshot(req).await.map_err(status_to_rpc)?;
        self.decode("install-snapshot reply", &reply.into_inner().payload)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        let mut client = self.client().map_err(RPCError::Unreachable)?;
        let req = self
            .request("vote request", &rpc, &option)
            .map_err(RPCError::Network)?;
        let started = Instant::now();
        let reply = client.vote(req).await;
        RpcKind::Vote.observe(started);
        let reply = reply.map_err(status_to_rpc)?;
        self.decode("vote reply", &reply.into_inner().payload)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let mut client = self.client().map_err(StreamingError::Unreachable)?;
        let header = codec::encode("snapshot header", &(vote, snapshot.meta.clone()))
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let data = Cursor::into_inner(*snapshot.snapshot);
        let chunks = snapshot_chunks(self.envelope.clone(), header, data);
        let mut req = tonic::Request::new(tokio_stream::iter(chunks));
        req.set_timeout(option.hard_ttl());
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = client.install_full_snapshot(req) => reply,
        };
        let reply = reply.map_err(|status| match status.code() {
            tonic::Code::Unavailable => StreamingError::Unreachable(Unreachable::new(&status)),
            _ => StreamingError::Network(NetworkError::new(&status)),
        })?;
        let result: Result<SnapshotResponse<NodeId>, Fatal<NodeId>> =
            codec::decode("snapshot reply", &reply.into_inner().payload)
                .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| StreamingError::RemoteError(RemoteError::new(self.target, e)))
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(PEER_BACKOFF_MS)))
    }
}

/// Splits a snapshot into chunks; the first carries the envelope and header.
fn snapshot_chunks(envelope: Envelope, header: Vec<u8>, data: Vec<u8>) -> Vec<SnapshotChunk> {
    let total_bytes = data.len() as u64;
    let mut chunks: Vec<SnapshotChunk> = data
        .chunks(SNAPSHOT_CHUNK_BYTES)
        .map(|c| SnapshotChunk {
            envelope: None,
            header: Vec::new(),
            data: c.to_vec(),
            total_bytes: 0,
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(SnapshotChunk::default());
    }
    chunks[0].envelope = Some(envelope);
    chunks[0].header = header;
    chunks[0].total_bytes = total_bytes;
    chunks
}
