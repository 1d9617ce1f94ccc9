//! The engine's working copy of a ledger view.
//!
//! Owns [`Cluster`]: every node of a [`LedgerView`] with what is requested on it, the
//! pods held on it (borrowed from the view) and the nominations that target it, plus the
//! pods the engine plans during one placement round (owned, removable again). Also owns
//! [`Nomination`], the engine-input form of Kubernetes' nominatedNodeName. Invariants:
//! nodes stay in the view's name order; `requested` always equals the view's reserved +
//! committed plus the footprints of planned pods; the view itself is never mutated.
//! Called by placement, quoting and preemption.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ledger::usage::SlotState;
use crate::ledger::view::LedgerView;
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::{HostPort, PodSummary};
use crate::model::resources::Resources;

/// A pod nominated to a node by an earlier preemption, waiting for its victims to go.
///
/// While it waits, pods of lower or equal priority must not take what it was promised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nomination {
    /// The nominated pod.
    pub member: MemberKey,
    /// The node it was nominated to.
    pub node: String,
    /// What it needs (requests, priority, ports, labels).
    pub pod: PodSummary,
}

/// How a pod on a node came to be there, which decides whether preemption may remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    /// Held by an open transaction: never a victim.
    Reserved,
    /// Committed or bound: may be preempted (whole gang).
    Placed,
    /// Planned by the engine in this round (not in the ledger yet).
    Planned,
}

/// A pod on a node.
#[derive(Debug, Clone)]
pub struct PodInfo<'a> {
    /// Its key.
    pub key: Cow<'a, MemberKey>,
    /// What the ledger keeps of it.
    pub pod: Cow<'a, PodSummary>,
    /// How it got there.
    pub phase: PodPhase,
}

/// A node and what is held or planned on it.
#[derive(Debug, Clone)]
pub struct NodeState<'a> {
    /// The node.
    pub node: &'a Node,
    /// Reserved + committed + planned footprints.
    pub requested: Resources,
    /// Pods held or planned.
    pub pods: Vec<PodInfo<'a>>,
    /// Nominations to this node.
    pub nominated: Vec<&'a Nomination>,
}

impl<'a> NodeState<'a> {
    /// Allocatable minus requested.
    pub fn free(&self) -> Resources {
        self.node.allocatable.saturating_sub(&self.requested)
    }

    /// Footprints of nominations with priority >= `priority`, not belonging to `own`.
    pub fn nominated_load(&self, priority: i32, own: &BTreeSet<MemberKey>) -> Resources {
        self.binding_nominations(priority, own)
            .fold(Resources::zero(), |acc, n| {
                acc.saturating_add(&n.pod.footprint())
            })
    }

    /// Nominations that bind a pod of `priority` (higher or equal priority, not its own).
    pub fn binding_nominations<'s>(
        &'s self,
        priority: i32,
        own: &'s BTreeSet<MemberKey>,
    ) -> impl Iterator<Item = &'a Nomination> + 's {
        self.nominated
            .iter()
            .copied()
            .filter(move |n| n.pod.priority >= priority && !own.contains(&n.member))
    }

    /// Whether `port` is used by a pod here or by a binding nomination.
    pub fn port_taken(&self, port: &HostPort, priority: i32, own: &BTreeSet<MemberKey>) -> bool {
        self.pods.iter().any(|p| p.pod.host_ports.contains(port))
            || self
                .binding_nominations(priority, own)
                .any(|n| n.pod.host_ports.contains(port))
    }
}

/// Every node of a view, with planned pods on top.
#[derive(Debug, Clone)]
pub struct Cluster<'a> {
    /// Nodes in name order.
    pub nodes: Vec<NodeState<'a>>,
    /// Whether any pod holds a required anti-affinity term (enables the symmetric check).
    pub has_anti_affinity: bool,
}

impl<'a> Cluster<'a> {
    /// Builds the working copy; nominations to unknown nodes or of held members are ignored.
    pub fn build<V: LedgerView + ?Sized>(view: &'a V, nominations: &'a [Nomination]) -> Self {
        let mut has_anti_affinity = false;
        let nodes: Vec<NodeState<'a>> = view
            .node_views()
            .into_iter()
            .map(|nv| {
                let pods: Vec<PodInfo<'a>> = nv
                    .pods()
                    .map(|(key, slot)| {
                        has_anti_affinity |= !slot.pod.anti_affinity.is_empty();
                        PodInfo {
                            key: Cow::Borrowed(key),
                            pod: Cow::Borrowed(&slot.pod),
                            phase: match slot.state {
                                SlotState::Reserved { .. } => PodPhase::Reserved,
                                SlotState::Committed { .. } | SlotState::Bound { .. } => {
                                    PodPhase::Placed
                                }
                            },
                        }
                    })
                    .collect();
                NodeState {
                    node: nv.node,
                    requested: nv.requested(),
                    pods,
                    nominated: Vec::new(),
                }
            })
            .collect();
        let mut cluster = Self {
            nodes,
            has_anti_affinity,
        };
        cluster.attach(nominations);
        cluster
    }

    /// Attaches nominations to their nodes, skipping members already held somewhere.
    fn attach(&mut self, nominations: &'a [Nomination]) {
        if nominations.is_empty() {
            return;
        }
        let held: BTreeSet<&MemberKey> = self
            .nodes
            .iter()
            .flat_map(|n| n.pods.iter().map(|p| p.key.as_ref()))
            .collect();
        let pending: Vec<(usize, &'a Nomination)> = nominations
            .iter()
            .filter(|n| !held.contains(&n.member))
            .filter_map(|n| Some((self.index_of(&n.node)?, n)))
            .collect();
        for (idx, nomination) in pending {
            self.nodes[idx].nominated.push(nomination);
        }
    }

    /// Plans `pod` on node `idx` (it now counts as requested there).
    pub fn plan(&mut self, idx: usize, key: MemberKey, pod: PodSummary) {
        let Some(state) = self.nodes.get_mut(idx) else {
            return;
        };
        self.has_anti_affinity |= !pod.anti_affinity.is_empty();
        state.requested = state.requested.saturating_add(&pod.footprint());
        state.pods.push(PodInfo {
            key: Cow::Owned(key),
            pod: Cow::Owned(pod),
            phase: PodPhase::Planned,
        });
    }

    /// Removes the pod planned last on node `idx`.
    pub fn unplan_last(&mut self, idx: usize) {
        let Some(state) = self.nodes.get_mut(idx) else {
            return;
        };
        if state.pods.last().map(|p| p.phase) != Some(PodPhase::Planned) {
            return;
        }
        if let Some(info) = state.pods.pop() {
            state.requested = state.requested.saturating_sub(&info.pod.footprint());
        }
    }

    /// Node indexes grouped by the value of label `key` (nodes without it are left out).
    pub fn domains(&self, key: &str) -> BTreeMap<String, Vec<usize>> {
        let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, state) in self.nodes.iter().enumerate() {
            if let Some(value) = state.node.label(key) {
                out.entry(value.to_string()).or_default().push(i);
            }
        }
        out
    }

    /// Index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes
            .binary_search_by(|n| n.node.name.as_str().cmp(name))
            .ok()
    }
}
