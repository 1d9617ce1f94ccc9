//! Read-only view of a ledger, as the placement engine sees it.
//!
//! Owns the [`LedgerView`] trait and [`NodeView`] (a node, its usage, its free resources
//! and the pods held on it with their labels). Invariant: a view never mutates the
//! ledger and lists nodes in name order, so engine results are deterministic. Called by
//! the engine; implemented by [`crate::ledger::ShardLedger`] and by anything else that
//! can present nodes with usage (a merged multi-shard view, a test fixture).

use crate::ledger::usage::{NodeUsage, PodSlot};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::resources::Resources;

/// One node and what is held on it.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// The node.
    pub node: &'a Node,
    /// Its usage.
    pub usage: &'a NodeUsage,
}

impl<'a> NodeView<'a> {
    /// Reserved plus committed.
    pub fn requested(&self) -> Resources {
        self.usage.requested()
    }

    /// Allocatable minus requested.
    pub fn free(&self) -> Resources {
        self.usage.free(&self.node.allocatable)
    }

    /// Pods held on the node (reserved, committed or bound), by member key.
    pub fn pods(&self) -> impl Iterator<Item = (&'a MemberKey, &'a PodSlot)> + 'a {
        self.usage.pods.iter()
    }
}

/// Anything that can list nodes with their usage.
pub trait LedgerView {
    /// Every node with its usage, in name order.
    fn node_views(&self) -> Vec<NodeView<'_>>;

    /// One node by name.
    fn node_view(&self, name: &str) -> Option<NodeView<'_>>;
}
