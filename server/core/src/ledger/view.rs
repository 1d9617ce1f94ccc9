//! Read-only view of a ledger, as the placement engine sees it.
//!
//! Owns the [`LedgerView`] trait (nodes with usage and devices, and the device classes
//! claims resolve against), [`NodeView`] (a node, its usage, its free resources and the
//! pods held on it with their labels), [`NodeFit`] (the few numbers and flags
//! the engine's hot loop reads of a node) and [`IndexedView`] (every node by position,
//! with its `NodeFit`, without building anything per call). Invariant: a view never
//! mutates the ledger and lists nodes in name order, so engine results are
//! deterministic; an `IndexedView`'s summaries always equal [`NodeFit::of`] of its
//! nodes. Called by the engine; implemented by [`crate::ledger::ShardLedger`] (which
//! keeps the summaries up to date as commands apply) and by anything else that can
//! present nodes with usage (a merged multi-shard view, a test fixture), which need
//! not provide the indexed form.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ledger::network::NetworkPools;
use crate::ledger::shard::NodeEntry;
use crate::ledger::usage::{NodeUsage, PodSlot};
use crate::model::device::DeviceClass;
use crate::model::gang::MemberKey;
use crate::model::node::{Node, Readiness, Schedulability, TaintEffect};
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

/// Number of resource dimensions a [`NodeFit`] keeps inline.
pub const FIXED_DIMS: usize = 4;

/// The built-in dimensions of `r` in [`NodeFit`] order: cpu, memory, pods, ephemeral storage.
pub fn fixed_dims(r: &Resources) -> [u64; FIXED_DIMS] {
    [
        r.cpu_milli,
        r.memory_bytes,
        r.pods,
        r.ephemeral_storage_bytes,
    ]
}

/// What the engine's hot loop reads of one node: built-in resources and a few flags.
///
/// Extended resources, labels, taints and pods are read from the node itself, and only
/// when a flag or the pod template says they matter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeFit {
    /// Allocatable cpu, memory, pods, ephemeral storage.
    pub allocatable: [u64; FIXED_DIMS],
    /// Reserved + committed (saturating), same dimensions.
    pub requested: [u64; FIXED_DIMS],
    /// `NodeFit::NOT_READY | …`.
    pub flags: u8,
}

impl NodeFit {
    /// The node is not ready.
    pub const NOT_READY: u8 = 1;
    /// The node is cordoned.
    pub const CORDONED: u8 = 1 << 1;
    /// The node has a NoSchedule or NoExecute taint.
    pub const HARD_TAINTS: u8 = 1 << 2;
    /// The node has a PreferNoSchedule taint.
    pub const SOFT_TAINTS: u8 = 1 << 3;
    /// A pod on the node holds a host port.
    pub const HOST_PORTS: u8 = 1 << 4;
    /// A pod on the node has required anti-affinity terms.
    pub const ANTI_AFFINITY: u8 = 1 << 5;
    /// A shard move fences the node: it takes no new pod.
    pub const MOVING: u8 = 1 << 6;
    /// Flags under which the node-only filters may refuse a pod.
    pub const NODE_FILTERED: u8 =
        Self::NOT_READY | Self::CORDONED | Self::HARD_TAINTS | Self::MOVING;

    /// The summary of a node and its usage.
    pub fn of(node: &Node, usage: &NodeUsage) -> Self {
        let mut flags = 0;
        if node.readiness == Readiness::NotReady {
            flags |= Self::NOT_READY;
        }
        if node.schedulability == Schedulability::Cordoned {
            flags |= Self::CORDONED;
        }
        for taint in &node.taints {
            flags |= match taint.effect {
                TaintEffect::PreferNoSchedule => Self::SOFT_TAINTS,
                TaintEffect::NoSchedule | TaintEffect::NoExecute => Self::HARD_TAINTS,
            };
        }
        let marks = usage.marks();
        if marks.any_host_ports() {
            flags |= Self::HOST_PORTS;
        }
        if marks.any_anti_affinity() {
            flags |= Self::ANTI_AFFINITY;
        }
        Self {
            allocatable: fixed_dims(&node.allocatable),
            requested: fixed_dims(&usage.requested()),
            flags,
        }
    }

    /// Whether any of `flags` is set.
    #[inline]
    pub fn has(&self, flags: u8) -> bool {
        self.flags & flags != 0
    }

    /// Equality without a call to `memcmp` (the engine compares summaries per node).
    #[inline]
    pub fn same(&self, other: &Self) -> bool {
        let mut diff = u64::from(self.flags ^ other.flags);
        for d in 0..FIXED_DIMS {
            diff |= (self.allocatable[d] ^ other.allocatable[d])
                | (self.requested[d] ^ other.requested[d]);
        }
        diff == 0
    }
}

/// Every node of a view by position (name order), with its [`NodeFit`] and stamp.
///
/// A stamp names one state of one node: whoever keeps the view draws a new one from
/// [`next_stamp`] whenever a node may have changed, so equal stamps mean the node is
/// exactly as it was (the engine reuses per-node results on that basis).
#[derive(Debug, Clone, Copy)]
pub struct IndexedView<'a> {
    entries: &'a [Box<NodeEntry>],
    fits: &'a [NodeFit],
    stamps: &'a [u64],
    anti_affinity_nodes: usize,
}

impl<'a> IndexedView<'a> {
    /// A view over `entries` (name order), their summaries and stamps (same order and length).
    pub(crate) fn new(
        entries: &'a [Box<NodeEntry>],
        fits: &'a [NodeFit],
        stamps: &'a [u64],
        anti_affinity_nodes: usize,
    ) -> Self {
        Self {
            entries,
            fits,
            stamps,
            anti_affinity_nodes,
        }
    }

    /// The stamp of the node at position `i`.
    #[inline]
    pub fn stamp(&self, i: usize) -> Option<u64> {
        self.stamps.get(i).copied()
    }

    /// Number of nodes.
    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no node.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The node at position `i`.
    pub fn node(&self, i: usize) -> Option<NodeView<'a>> {
        self.entries.get(i).map(|entry| NodeView {
            node: &entry.node,
            usage: &entry.usage,
        })
    }

    /// Every node's summary, by position.
    #[inline]
    pub fn fits(&self) -> &'a [NodeFit] {
        self.fits
    }

    /// Whether any pod holds required anti-affinity terms.
    pub fn has_anti_affinity(&self) -> bool {
        self.anti_affinity_nodes > 0
    }
}

/// Stamps handed out so far; a stamp is never handed out twice in a process.
static STAMPS: AtomicU64 = AtomicU64::new(1);

/// A stamp no node state has had: unique, never zero. Not replicated state (it is in
/// no snapshot and no comparison), only a name for "this node as it is now".
pub fn next_stamp() -> u64 {
    STAMPS.fetch_add(1, Ordering::Relaxed)
}

/// Anything that can list nodes with their usage.
pub trait LedgerView {
    /// Every node with its usage, in name order.
    fn node_views(&self) -> Vec<NodeView<'_>>;

    /// One node by name.
    fn node_view(&self, name: &str) -> Option<NodeView<'_>>;

    /// The same nodes by position with their summaries, if the view keeps them; the
    /// engine then reads nodes in place instead of listing them on every call.
    fn indexed(&self) -> Option<IndexedView<'_>> {
        None
    }

    /// The device classes claims may name (none unless the view keeps them).
    fn device_classes(&self) -> &BTreeMap<String, DeviceClass> {
        &NO_DEVICE_CLASSES
    }

    /// The network-attached pools the nodes may reach, if the view has any.
    fn network(&self) -> Option<&NetworkPools> {
        None
    }
}

/// The device classes of a view that keeps none.
static NO_DEVICE_CLASSES: BTreeMap<String, DeviceClass> = BTreeMap::new();
