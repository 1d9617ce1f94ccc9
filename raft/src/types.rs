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

/// A state-machine command, opaque to the Raft layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// A state machine's answer to one command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(#[serde(with = "serde_bytes")] pub Vec<u8>);

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
