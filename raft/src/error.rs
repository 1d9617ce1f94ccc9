//! Errors of the multi-raft host, and their mapping to and from gRPC status
//! codes (a leader hint travels in metadata so callers can follow it).

use gangway_proto::raft::ForwardedError;
use tonic::metadata::MetadataValue;

use crate::storage::StoreError;
use crate::types::{GroupId, NodeId};

/// Metadata key carrying the leader's node id on a not-leader error.
pub const LEADER_ID_HEADER: &str = "x-gangway-leader-id";
/// Metadata key carrying the leader's address on a not-leader error.
pub const LEADER_ADDR_HEADER: &str = "x-gangway-leader-addr";
/// Metadata key marking an UNAVAILABLE answer from a replica whose group stopped while
/// it had the request (it may or may not have been applied): not retried by routing.
pub const GROUP_STOPPED_HEADER: &str = "x-gangway-group-stopped";

/// What went wrong in the multi-raft host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The request names a group this cluster does not have.
    #[error("unknown raft group {group}; this cluster has groups {known}")]
    UnknownGroup {
        /// The group asked for.
        group: GroupId,
        /// The groups that exist, e.g. "0..=6".
        known: String,
    },
    /// This replica does not lead the group; `leader` says who does, if known.
    #[error("node {node} is not the leader of group {group}{}", leader_hint(.leader))]
    NotLeader {
        /// The group.
        group: GroupId,
        /// This replica.
        node: NodeId,
        /// The leader's id and address, when known.
        leader: Option<(NodeId, String)>,
    },
    /// The group's leadership is being handed over.
    #[error("group {group} is handing its leadership over; retry shortly")]
    Transferring {
        /// The group.
        group: GroupId,
    },
    /// No quorum answered in time; the request may or may not have been applied.
    #[error("group {group} is unavailable: {detail}")]
    Unavailable {
        /// The group.
        group: GroupId,
        /// Why.
        detail: String,
    },
    /// The request itself is wrong.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The cluster refused a membership change.
    #[error("membership change of group {group} refused: {detail}")]
    Membership {
        /// The group.
        group: GroupId,
        /// Why.
        detail: String,
    },
    /// The request belongs to another cluster or node.
    #[error("{0}")]
    WrongCluster(String),
    /// Local storage failed.
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// A Raft group stopped (storage failure or shutdown).
    #[error("raft group {group} stopped: {detail}")]
    Fatal {
        /// The group.
        group: GroupId,
        /// Why.
        detail: String,
    },
    /// A peer answered with an error status.
    #[error("peer {addr}: {message}")]
    Peer {
        /// The peer's address.
        addr: String,
        /// The gRPC code it answered with.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// The connection to a peer broke while it had the request: it may or may not
    /// have been applied, so it is not retried here; the caller sees UNAVAILABLE.
    #[error("the connection to replica {addr} broke mid-call ({detail}); the request may or may not have been applied")]
    ConnectionLost {
        /// The peer's address.
        addr: String,
        /// What the transport said.
        detail: String,
    },
    /// A peer had the request longer than this side waits: it may or may not have
    /// been applied, so it is not retried here; the caller sees DEADLINE_EXCEEDED.
    #[error("replica {addr} did not answer in time ({detail}); the request may or may not have been applied")]
    PeerTimedOut {
        /// The peer's address.
        addr: String,
        /// What the transport said.
        detail: String,
    },
}

fn leader_hint(leader: &Option<(NodeId, String)>) -> String {
    match leader {
        Some((id, addr)) => format!("; the leader is node {id} at {addr}"),
        None => "; no leader is known yet".to_string(),
    }
}

impl HostError {
    /// Whether trying again (possibly elsewhere) can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            HostError::NotLeader { .. }
            | HostError::Transferring { .. }
            | HostError::Unavailable { .. } => true,
            HostError::Peer { code, .. } => {
                matches!(
                    code,
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                )
            }
            _ => false,
        }
    }

    /// The gRPC status for this error, with the leader hint in metadata.
    pub fn to_status(&self) -> tonic::Status {
        let msg = self.to_string();
        match self {
            HostError::UnknownGroup { .. } => tonic::Status::not_found(msg),
            HostError::NotLeader { leader, .. } => {
                let mut status = tonic::Status::unavailable(msg);
                if let Some((id, addr)) = leader {
                    let md = status.metadata_mut();
                    md.insert(LEADER_ID_HEADER, MetadataValue::from(*id));
                    if let Ok(v) = addr.parse() {
                        md.insert(LEADER_ADDR_HEADER, v);
                    }
                }
                status
            }
            HostError::Transferring { .. }
            | HostError::Unavailable { .. }
            | HostError::ConnectionLost { .. } => tonic::Status::unavailable(msg),
            HostError::PeerTimedOut { .. } => tonic::Status::deadline_exceeded(msg),
            HostError::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            HostError::Membership { .. } | HostError::WrongCluster(_) => {
                tonic::Status::failed_precondition(msg)
            }
            HostError::Storage(_) => tonic::Status::internal(msg),
            // The replica's group stopped (its disk failed, say) while it had the
            // request: another replica will lead, and the request may or may not have
            // been applied, as when a connection breaks mid-call.
            HostError::Fatal { group, .. } => {
                let mut status = tonic::Status::unavailable(msg);
                status
                    .metadata_mut()
                    .insert(GROUP_STOPPED_HEADER, MetadataValue::from(*group));
                status
            }
            HostError::Peer { code, .. } => tonic::Status::new(*code, msg),
        }
    }

    /// This error as one outcome of a forwarded batch: the status it would have
    /// answered alone, hints included.
    pub(crate) fn to_forwarded(&self) -> ForwardedError {
        let status = self.to_status();
        let md = status.metadata();
        let text = |key: &str| {
            md.get(key)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        ForwardedError {
            code: status.code() as i32,
            message: status.message().to_string(),
            leader_id: text(LEADER_ID_HEADER)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            leader_addr: text(LEADER_ADDR_HEADER).unwrap_or_default(),
            group_stopped: md.get(GROUP_STOPPED_HEADER).is_some(),
        }
    }

    /// Rebuilds the host error of one outcome of a forwarded batch, as
    /// [`Self::from_peer_status`] does for a request sent alone.
    pub(crate) fn from_forwarded(
        group: GroupId,
        node: NodeId,
        addr: &str,
        e: &ForwardedError,
    ) -> Self {
        let mut status = tonic::Status::new(tonic::Code::from(e.code), e.message.clone());
        let md = status.metadata_mut();
        if e.leader_id != 0 {
            md.insert(LEADER_ID_HEADER, MetadataValue::from(e.leader_id));
            if let Ok(v) = e.leader_addr.parse() {
                md.insert(LEADER_ADDR_HEADER, v);
            }
        }
        if e.group_stopped {
            md.insert(GROUP_STOPPED_HEADER, MetadataValue::from(group));
        }
        Self::from_peer_status(group, node, addr, &status)
    }

    /// Rebuilds a host error from a peer's status, keeping its leader hint.
    pub fn from_peer_status(
        group: GroupId,
        node: NodeId,
        addr: &str,
        status: &tonic::Status,
    ) -> Self {
        let md = status.metadata();
        let id = md
            .get(LEADER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<NodeId>().ok());
        let leader_addr = md
            .get(LEADER_ADDR_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let (Some(id), Some(leader_addr)) = (id, leader_addr) {
            return HostError::NotLeader {
                group,
                node,
                leader: Some((id, leader_addr)),
            };
        }
        if md.get(GROUP_STOPPED_HEADER).is_some() {
            return HostError::Fatal {
                group,
                detail: format!("on replica {node} at {addr}: {}", status.message()),
            };
        }
        // A status with a source was made by this side's transport, not sent by the
        // peer: UNKNOWN when the connection broke, CANCELLED when its timeout expired
        // (which would tell the caller it cancelled the call itself).
        if std::error::Error::source(status).is_some() {
            let (addr, detail) = (addr.to_string(), status.message().to_string());
            match status.code() {
                tonic::Code::Unknown => return HostError::ConnectionLost { addr, detail },
                tonic::Code::Cancelled => return HostError::PeerTimedOut { addr, detail },
                _ => {}
            }
        }
        HostError::Peer {
            addr: addr.to_string(),
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
