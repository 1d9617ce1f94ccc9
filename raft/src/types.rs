//! The openraft type configuration gangway uses, and the ids that name
//! replicas and groups. All of openraft's types stay inside this crate.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

/// A replica's id; never reused after a replica loses its disk.
pub type NodeId = u64;
/// A Raft group's id: 0 is the meta group, 1..=S the shards.
pub type GroupId = u64;
/// The meta group.
pub const META_GROUP: GroupId = 0;

/// The payload of one Raft entry: a batch of state-machine commands, opaque
/// to the Raft layer, applied in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// The commands, in proposal order.
    pub commands: Vec<serde_bytes::ByteBuf>,
}

/// The state machine's answers to one entry's commands, in the same order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// One reply per command.
    pub replies: Vec<serde_bytes::ByteBuf>,
}

openraft::declare_raft_types!(
    /// gangway's openraft type configuration.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub(crate) type Raft = openraft::Raft<TypeConfig>;
pub(crate) type LogId = openraft::LogId<NodeId>;
pub(crate) type Entry = openraft::Entry<TypeConfig>;
pub(crate) type StorageError = openraft::StorageError<NodeId>;
pub(crate) type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub(crate) type Snapshot = openraft::Snapshot<TypeConfig>;
pub(crate) type Vote = openraft::Vote<NodeId>;
