//! The engine's working copy of a ledger view.
//!
//! Owns [`Cluster`]: the nodes of a [`LedgerView`] read in place (by position, in name
//! order, with their [`NodeFit`] summaries), the nominations that target them, and on
//! top the pods the engine plans during one placement round (owned, removable again).
//! Nothing is copied per node when a cluster is built from a view that keeps an
//! [`crate::ledger::view::IndexedView`]; other views are listed once. [`NodeState`] is
//! the materialized form of one node (its pods, planned ones included), built on demand
//! for the filters that need every pod; the devices of planned pods are read by the
//! device allocator so that a round never hands out a device twice. Also owns [`Nomination`], the engine-input form
//! of Kubernetes' nominatedNodeName. Invariants: positions follow the view's name
//! order; a node's requested resources are always the view's reserved + committed plus
//! the footprints of the pods planned on it; the view itself is never mutated. Called
//! by placement, quoting and preemption.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ledger::network::NetworkPools;
use crate::ledger::usage::SlotState;
use crate::ledger::view::{fixed_dims, IndexedView, LedgerView, NodeFit, NodeView};
use crate::model::claim::DeviceAllocation;
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

/// Footprints of the nominations among `nominated` that bind a pod of `priority`.
fn binding_load<'n>(
    nominated: impl Iterator<Item = &'n Nomination>,
    priority: i32,
    own: &BTreeSet<MemberKey>,
) -> Resources {
    nominated
        .filter(|n| binds(n, priority, own))
        .fold(Resources::zero(), |acc, n| {
            acc.saturating_add(&n.pod.footprint())
        })
}

/// Whether a nomination binds a pod of `priority`: higher or equal priority, not its own.
fn binds(nomination: &Nomination, priority: i32, own: &BTreeSet<MemberKey>) -> bool {
    nomination.pod.priority >= priority && !own.contains(&nomination.member)
}

/// A node and what is held or planned on it, materialized.
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
        binding_load(self.nominated.iter().copied(), priority, own)
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
            .filter(move |n| binds(n, priority, own))
    }

    /// Whether `port` is used by a pod here or by a binding nomination.
    pub fn port_taken(&self, port: &HostPort, priority: i32, own: &BTreeSet<MemberKey>) -> bool {
        self.pods.iter().any(|p| p.pod.host_ports.contains(port))
            || self
                .binding_nominations(priority, own)
                .any(|n| n.pod.host_ports.contains(port))
    }
}

/// The view's nodes, read in place or listed once.
#[derive(Debug, Clone)]
enum Base<'a> {
    Indexed(IndexedView<'a>),
    Listed {
        views: Vec<NodeView<'a>>,
        fits: Vec<NodeFit>,
    },
}

/// A pod planned in this round.
#[derive(Debug, Clone)]
struct Planned {
    key: MemberKey,
    pod: PodSummary,
}

/// What is planned on one node.
#[derive(Debug, Clone, Default)]
struct Overlay {
    /// Summed footprints of the pods planned here.
    requested: Resources,
    /// The same, built-in dimensions only.
    fixed: [u64; 4],
    /// `NodeFit::HOST_PORTS` / `ANTI_AFFINITY` of the pods planned here.
    flags: u8,
    /// Their indexes in `Cluster::planned`, in plan order.
    pods: Vec<usize>,
}

impl Overlay {
    fn recompute(&mut self, planned: &[Planned]) {
        let mut requested = Resources::zero();
        let mut flags = 0;
        for pod in self.pods.iter().filter_map(|&p| planned.get(p)) {
            requested = requested.saturating_add(&pod.pod.footprint());
            flags |= pod_flags(&pod.pod);
        }
        self.fixed = fixed_dims(&requested);
        self.requested = requested;
        self.flags = flags;
    }
}

fn pod_flags(pod: &PodSummary) -> u8 {
    let mut flags = 0;
    if !pod.host_ports.is_empty() {
        flags |= NodeFit::HOST_PORTS;
    }
    if !pod.anti_affinity.is_empty() {
        flags |= NodeFit::ANTI_AFFINITY;
    }
    flags
}

/// Every node of a view, with nominations and planned pods on top.
#[derive(Debug, Clone)]
pub struct Cluster<'a> {
    base: Base<'a>,
    /// Planned pods, in plan order.
    planned: Vec<Planned>,
    /// Nodes with planned pods, sorted by position.
    overlay: Vec<(usize, Overlay)>,
    /// Nominations by node position (sorted, input order within a node).
    nominated: Vec<(usize, &'a Nomination)>,
    /// Whether any pod holds a required anti-affinity term (enables the symmetric check).
    pub has_anti_affinity: bool,
    /// The network-attached pools the nodes may reach (shared by every node).
    network: Option<&'a NetworkPools>,
}

impl<'a> Cluster<'a> {
    /// Builds the working copy; nominations to unknown nodes or of held members are ignored.
    pub fn build<V: LedgerView + ?Sized>(view: &'a V, nominations: &'a [Nomination]) -> Self {
        let (base, has_anti_affinity) = match view.indexed() {
            Some(indexed) => (Base::Indexed(indexed), indexed.has_anti_affinity()),
            None => {
                let views = view.node_views();
                let fits: Vec<NodeFit> = views
                    .iter()
                    .map(|nv| NodeFit::of(nv.node, nv.usage))
                    .collect();
                let anti = fits.iter().any(|f| f.has(NodeFit::ANTI_AFFINITY));
                (Base::Listed { views, fits }, anti)
            }
        };
        let mut cluster = Self {
            base,
            planned: Vec::new(),
            overlay: Vec::new(),
            nominated: Vec::new(),
            has_anti_affinity,
            network: view.network(),
        };
        cluster.attach(nominations);
        cluster
    }

    /// Attaches nominations to their nodes, skipping members already held somewhere.
    fn attach(&mut self, nominations: &'a [Nomination]) {
        if nominations.is_empty() {
            return;
        }
        let held: BTreeSet<&MemberKey> = (0..self.len())
            .filter_map(|i| self.view(i))
            .flat_map(|nv| nv.usage.pods.keys())
            .collect();
        let mut pending: Vec<(usize, &'a Nomination)> = nominations
            .iter()
            .filter(|n| !held.contains(&n.member))
            .filter_map(|n| Some((self.index_of(&n.node)?, n)))
            .collect();
        pending.sort_by_key(|(idx, _)| *idx);
        self.nominated = pending;
    }

    /// Number of nodes.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.base {
            Base::Indexed(indexed) => indexed.len(),
            Base::Listed { views, .. } => views.len(),
        }
    }

    /// Whether there is no node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node `idx` and its usage in the view (planned pods not included).
    pub fn view(&self, idx: usize) -> Option<NodeView<'a>> {
        match &self.base {
            Base::Indexed(indexed) => indexed.node(idx),
            Base::Listed { views, .. } => views.get(idx).copied(),
        }
    }

    /// Node `idx`.
    pub fn node(&self, idx: usize) -> Option<&'a Node> {
        self.view(idx).map(|nv| nv.node)
    }

    /// Node `idx`'s summary as the view has it (planned pods not included).
    #[inline]
    pub fn base_fit(&self, idx: usize) -> Option<&NodeFit> {
        match &self.base {
            Base::Indexed(indexed) => indexed.fits().get(idx),
            Base::Listed { fits, .. } => fits.get(idx),
        }
    }

    #[inline]
    fn overlay_of(&self, idx: usize) -> Option<&Overlay> {
        if self.overlay.is_empty() {
            return None;
        }
        self.overlay
            .binary_search_by_key(&idx, |(i, _)| *i)
            .ok()
            .and_then(|at| self.overlay.get(at))
            .map(|(_, overlay)| overlay)
    }

    /// Node `idx`'s stamp in the view (see [`IndexedView`]), when the view keeps stamps
    /// and nothing is planned on the node, so that the stamp names its whole state.
    #[inline]
    pub fn stamp(&self, idx: usize) -> Option<u64> {
        match &self.base {
            Base::Indexed(indexed) if !self.has_planned(idx) => indexed.stamp(idx),
            _ => None,
        }
    }

    /// Whether pods are planned on node `idx`.
    #[inline]
    pub fn has_planned(&self, idx: usize) -> bool {
        self.overlay_of(idx).is_some()
    }

    /// Node `idx`'s summary with the pods planned on it included.
    pub fn fit(&self, idx: usize) -> Option<NodeFit> {
        let mut fit = *self.base_fit(idx)?;
        if let Some(overlay) = self.overlay_of(idx) {
            for (requested, planned) in fit.requested.iter_mut().zip(overlay.fixed) {
                *requested = requested.saturating_add(planned);
            }
            fit.flags |= overlay.flags;
        }
        Some(fit)
    }

    /// Reserved + committed + planned on node `idx`, every dimension.
    pub fn requested(&self, idx: usize) -> Resources {
        let held = self.view(idx).map(|nv| nv.requested()).unwrap_or_default();
        match self.overlay_of(idx) {
            Some(overlay) => held.saturating_add(&overlay.requested),
            None => held,
        }
    }

    /// Whether any nomination targets a node.
    pub fn has_nominations(&self) -> bool {
        !self.nominated.is_empty()
    }

    /// Nominations to node `idx`.
    pub fn nominations(&self, idx: usize) -> impl Iterator<Item = &'a Nomination> + '_ {
        let start = self.nominated.partition_point(|(i, _)| *i < idx);
        self.nominated[start..]
            .iter()
            .take_while(move |(i, _)| *i == idx)
            .map(|(_, n)| *n)
    }

    /// Footprints of the nominations to node `idx` that bind a pod of `priority`.
    pub fn nominated_load(
        &self,
        idx: usize,
        priority: i32,
        own: &BTreeSet<MemberKey>,
    ) -> Resources {
        binding_load(self.nominations(idx), priority, own)
    }

    /// Whether `port` is used on node `idx` by a pod (held or planned) or a binding nomination.
    pub fn port_taken(
        &self,
        idx: usize,
        port: &HostPort,
        priority: i32,
        own: &BTreeSet<MemberKey>,
    ) -> bool {
        self.pods(idx).any(|p| p.pod.host_ports.contains(port))
            || self
                .nominations(idx)
                .any(|n| binds(n, priority, own) && n.pod.host_ports.contains(port))
    }

    /// Pods on node `idx`: held ones in key order, then planned ones in plan order.
    pub fn pods(&self, idx: usize) -> impl Iterator<Item = PodInfo<'_>> + '_ {
        let held = self.view(idx).into_iter().flat_map(|nv| {
            nv.usage.pods.iter().map(|(key, slot)| PodInfo {
                key: Cow::Borrowed(key),
                pod: Cow::Borrowed(&slot.pod),
                phase: match slot.state {
                    SlotState::Reserved { .. } => PodPhase::Reserved,
                    SlotState::Committed { .. } | SlotState::Bound { .. } | SlotState::Observed => {
                        PodPhase::Placed
                    }
                },
            })
        });
        let planned = self
            .overlay_of(idx)
            .into_iter()
            .flat_map(|overlay| overlay.pods.iter())
            .filter_map(|&p| self.planned.get(p))
            .map(|p| PodInfo {
                key: Cow::Borrowed(&p.key),
                pod: Cow::Borrowed(&p.pod),
                phase: PodPhase::Planned,
            });
        held.chain(planned)
    }

    /// Whether a pod held or planned on node `idx` carries shared claim `claim`, or
    /// the claim is carried (held, or planned this round) with network-attached devices
    /// that all reach the node.
    pub fn carries(&self, idx: usize, claim: &str) -> bool {
        self.pods(idx).any(|p| p.pod.carries(claim)) || self.carries_network(idx, claim)
    }

    fn carries_network(&self, idx: usize, claim: &str) -> bool {
        let (Some(network), Some(node)) = (self.network, self.node(idx)) else {
            return false;
        };
        let reach_all = |devices: &mut dyn Iterator<Item = &DeviceAllocation>| {
            let mut any = false;
            for a in devices {
                any = true;
                if !network.reaches(&a.device, node) {
                    return false;
                }
            }
            any
        };
        if let Some(slot) = network.claim_hold(claim) {
            return reach_all(&mut slot.pod.devices.iter());
        }
        let planned = self
            .overlay
            .iter()
            .flat_map(|(_, overlay)| overlay.pods.iter())
            .filter_map(|&p| self.planned.get(p));
        for p in planned {
            for share in p.pod.carried().filter(|s| s.claim == claim) {
                let mut devices = p.pod.devices.iter().filter(|d| d.claim == share.pod_claim);
                if reach_all(&mut devices) {
                    return true;
                }
            }
        }
        false
    }

    /// The network-attached pools, if the view has any.
    pub fn network(&self) -> Option<&'a NetworkPools> {
        self.network
    }

    /// Network-attached devices allocated to the pods planned in this round on nodes
    /// other than `idx` (a network device is one for every node, so a round that
    /// planned it anywhere never hands it out again).
    pub fn planned_network_devices_elsewhere(
        &self,
        idx: usize,
    ) -> impl Iterator<Item = &DeviceAllocation> + '_ {
        // Without network pools this is empty at once (the engine's hot loop asks it).
        self.network.into_iter().flat_map(move |network| {
            self.overlay
                .iter()
                .filter(move |(i, _)| *i != idx)
                .flat_map(|(_, overlay)| overlay.pods.iter())
                .filter_map(|&p| self.planned.get(p))
                .flat_map(|p| p.pod.devices.iter())
                .filter(move |a| network.has_pool_of(&a.device))
        })
    }

    /// Devices allocated to the pods planned on node `idx` in this round.
    pub fn planned_devices(&self, idx: usize) -> impl Iterator<Item = &DeviceAllocation> + '_ {
        self.overlay_of(idx)
            .into_iter()
            .flat_map(|overlay| overlay.pods.iter())
            .filter_map(|&p| self.planned.get(p))
            .flat_map(|p| p.pod.devices.iter())
    }

    /// Node `idx` materialized: its pods, requested resources and nominations.
    pub fn state(&self, idx: usize) -> Option<NodeState<'_>> {
        Some(NodeState {
            node: self.node(idx)?,
            requested: self.requested(idx),
            pods: self.pods(idx).collect(),
            nominated: self.nominations(idx).collect(),
        })
    }

    /// Plans `pod` on node `idx` (it now counts as requested there).
    pub fn plan(&mut self, idx: usize, key: MemberKey, pod: PodSummary) {
        if idx >= self.len() {
            return;
        }
        self.has_anti_affinity |= !pod.anti_affinity.is_empty();
        let footprint = pod.footprint();
        let flags = pod_flags(&pod);
        let p = self.planned.len();
        self.planned.push(Planned { key, pod });
        let at = match self.overlay.binary_search_by_key(&idx, |(i, _)| *i) {
            Ok(at) => at,
            Err(at) => {
                self.overlay.insert(at, (idx, Overlay::default()));
                at
            }
        };
        if let Some((_, overlay)) = self.overlay.get_mut(at) {
            overlay.requested = overlay.requested.saturating_add(&footprint);
            overlay.fixed = fixed_dims(&overlay.requested);
            overlay.flags |= flags;
            overlay.pods.push(p);
        }
    }

    /// Removes the pod planned last on node `idx`.
    pub fn unplan_last(&mut self, idx: usize) {
        let Ok(at) = self.overlay.binary_search_by_key(&idx, |(i, _)| *i) else {
            return;
        };
        let Some((_, overlay)) = self.overlay.get_mut(at) else {
            return;
        };
        let Some(p) = overlay.pods.pop() else {
            return;
        };
        if overlay.pods.is_empty() {
            self.overlay.remove(at);
        } else {
            overlay.recompute(&self.planned);
        }
        // Rollbacks go last first, so this is normally the newest planned pod; an older
        // one stays in `planned`, unreferenced, until the round ends.
        if p + 1 == self.planned.len() {
            self.planned.pop();
        }
    }

    /// Node positions grouped by the value of label `key` (nodes without it are left out).
    pub fn domains(&self, key: &str) -> BTreeMap<String, Vec<usize>> {
        let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for i in 0..self.len() {
            let Some(value) = self.node(i).and_then(|node| node.label(key)) else {
                continue;
            };
            match out.get_mut(value) {
                Some(nodes) => nodes.push(i),
                None => {
                    out.insert(value.to_string(), vec![i]);
                }
            }
        }
        out
    }

    /// Name of node `idx`.
    pub fn name(&self, idx: usize) -> Option<&'a str> {
        self.node(idx).map(|node| node.name.as_str())
    }

    /// Position of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.name(mid)?.cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }
}
