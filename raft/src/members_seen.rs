//! The members this replica has seen take part in the cluster, kept on disk.
//!
//! Owns: the durable set of node ids that acknowledged entries of a group this
//! replica leads, or that led a group whose entries this replica applied, and
//! the question whether a store holds any Raft state at all. Invariant: the set
//! only grows, and an id is in it only after that node stored Raft state.
//!
//! Why: a replica that lost its disk comes back blank. If it took part before,
//! it may have voted or acknowledged entries it no longer has; serving it as a
//! voter again can elect a leader without committed entries. Its peers' sets
//! tell it apart from a member that never started. `gangway serve` asks peers
//! (`StatusReply.members_seen`) before it bootstraps; the host records the set
//! in the background (`RaftHost::start`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::storage::{KvStore, KvTree, StoreError, WriteOp};
use crate::types::{GroupId, NodeId};

/// Period of the check for newly seen members.
pub const MEMBERS_SEEN_PERIOD_MS: u64 = 500;
const TREE: &str = "host/members_seen";

/// The durable set of members seen.
pub(crate) struct MembersSeen {
    tree: Arc<dyn KvTree>,
    store: Arc<dyn KvStore>,
    seen: Mutex<BTreeSet<NodeId>>,
}

impl MembersSeen {
    /// Loads the set from `store`.
    pub(crate) fn open(store: Arc<dyn KvStore>) -> Result<Self, StoreError> {
        let tree = store.tree(TREE)?;
        let mut seen = BTreeSet::new();
        for (key, _) in tree.scan(&[], None, usize::MAX)? {
            let bytes: [u8; 8] = key
                .as_slice()
                .try_into()
                .map_err(|_| StoreError::Corrupt(format!("{TREE}: key of {} bytes", key.len())))?;
            seen.insert(NodeId::from_be_bytes(bytes));
        }
        Ok(Self {
            tree,
            store,
            seen: Mutex::new(seen),
        })
    }

    /// The members seen so far.
    pub(crate) fn get(&self) -> BTreeSet<NodeId> {
        match self.seen.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Records `nodes` durably; returns the ones that were new. Blocks on a flush
    /// when there are new ones (rare: once per member over the cluster's life).
    pub(crate) fn record(&self, nodes: &BTreeSet<NodeId>) -> Result<Vec<NodeId>, StoreError> {
        let known = self.get();
        let new: Vec<NodeId> = nodes.difference(&known).copied().collect();
        if new.is_empty() {
            return Ok(new);
        }
        let batch = new
            .iter()
            .map(|id| WriteOp::Put(id.to_be_bytes().to_vec(), Vec::new()))
            .collect();
        self.tree.apply(batch)?;
        self.store.flush()?;
        match self.seen.lock() {
            Ok(mut s) => s.extend(new.iter().copied()),
            Err(poisoned) => poisoned.into_inner().extend(new.iter().copied()),
        }
        Ok(new)
    }
}

/// What one group's metrics tell about who took part.
pub(crate) struct GroupParticipation {
    /// This replica leads the group.
    pub(crate) leading: bool,
    /// Followers that acknowledged at least one entry (leader only).
    pub(crate) acknowledged: Vec<NodeId>,
    /// The leader this replica follows, when it applied entries.
    pub(crate) applied_from: Option<NodeId>,
}

/// The members `groups` show to have stored Raft state, this replica excluded.
pub(crate) fn participants(me: NodeId, groups: &[GroupParticipation]) -> BTreeSet<NodeId> {
    let mut out = BTreeSet::new();
    for g in groups {
        if g.leading {
            out.extend(g.acknowledged.iter().copied());
        }
        out.extend(g.applied_from);
    }
    out.remove(&me);
    out
}

/// Whether `store` holds Raft state (a vote, log entries or a snapshot) for any of
/// `groups`: false for a replica that never started, or one that lost its disk.
pub fn holds_raft_state(store: &dyn KvStore, groups: &[GroupId]) -> Result<bool, StoreError> {
    for gid in groups {
        let log = store.tree(&format!("g{gid}/log"))?;
        let meta = store.tree(&format!("g{gid}/meta"))?;
        let snapshot = store.tree(&format!("g{gid}/snapshot"))?;
        let snapshot_file = store.snapshot_slot(&format!("g{gid}"))?;
        if log.last()?.is_some()
            || meta.last()?.is_some()
            || snapshot.last()?.is_some()
            || snapshot_file.is_written()?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
#[path = "members_seen_tests.rs"]
mod tests;
