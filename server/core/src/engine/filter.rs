//! Filters: may this pod template go to this node, and how many copies of it fit?
//!
//! Owns [`FilterReason`], [`Diagnosis`] (the "0/N nodes are available: …" summary) and
//! the filter pipeline, in Kubernetes' order: node readiness, NodeUnschedulable (only the
//! `node.kubernetes.io/unschedulable:NoSchedule` toleration admits a cordoned node),
//! nodeSelector and required node affinity, TaintToleration (NoSchedule and NoExecute),
//! NodePorts, NodeResourcesFit (counting nominations of higher or equal priority),
//! InterPodAffinity, and, for templates with device needs, DynamicResources (the
//! node's devices must serve every claim; see [`crate::engine::devices`]), which also
//! caps the copies. The first failing filter names the reason. Pure functions over a
//! [`NodeState`], and [`Probe`], the same pipeline prepared once per pod template and run
//! on a node of a [`Cluster`] in place: it reads the node's [`NodeFit`] summary and only
//! looks at labels, taints, pods or extended resources when a summary flag or the
//! template says they can matter, so it gives exactly `filter_node`'s answer. Called by
//! placement, quoting and preemption.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::engine::cluster::{Cluster, NodeState};
use crate::engine::devices::DeviceDemand;
use crate::engine::interpod::InterPodState;
use crate::engine::taints::{first_untolerated, tolerates_unschedulable};
use crate::ledger::view::{fixed_dims, NodeFit, FIXED_DIMS};
use crate::model::gang::MemberKey;
use crate::model::node::{Node, Readiness, Schedulability, TaintEffect};
use crate::model::pod::PodSpec;
use crate::model::resources::{ResourceName, Resources};
use crate::model::selectors::{node_selector_matches, required_affinity_matches};

/// Why a node cannot take a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FilterReason {
    /// The node is not ready.
    NodeNotReady,
    /// The node is cordoned and the pod does not tolerate it.
    NodeUnschedulable,
    /// A shard move fences the node.
    NodeMoving,
    /// nodeSelector or required node affinity does not match.
    NodeAffinityMismatch,
    /// A NoSchedule or NoExecute taint is not tolerated.
    UntoleratedTaint {
        /// Taint key.
        key: String,
        /// Taint effect.
        effect: TaintEffect,
    },
    /// A requested host port is taken.
    HostPortConflict,
    /// Not enough of a resource free.
    Insufficient(ResourceName),
    /// The pod asks more of a resource than the node's allocatable: no release or
    /// preemption can make room, only a change to the node.
    LargerThanNode(ResourceName),
    /// Required pod affinity is not satisfied.
    PodAffinityUnsatisfied,
    /// The pod's required anti-affinity matches pods in the node's domain.
    PodAntiAffinityConflict,
    /// A pod in the node's domain has required anti-affinity against this pod.
    ExistingPodAntiAffinity,
    /// The node fitted, but earlier members of the same round took its room.
    CapacityTakenByGang,
    /// The node's devices cannot satisfy every claim (Kubernetes: "cannot allocate all claims").
    CannotAllocateDevices,
    /// A claim names a device class the ledger does not have.
    DeviceClassNotFound(String),
    /// A device selector failed at run time (a missing attribute, a non-bool result).
    DeviceSelectorError(String),
    /// The device search gave up after [`crate::engine::devices::SEARCH_STEPS_MAX`] steps.
    DeviceSearchLimit,
    /// A costly device selector is still being evaluated over the shard's devices; the
    /// gang sits out plans until it is (see `shard::warmer`).
    SelectorsWarming,
    /// The pod shares a ResourceClaim (`namespace/name`) whose devices are not
    /// allocated on the node (they are elsewhere, or not yet anywhere).
    SharedClaimNotHere(String),
    /// The gang (or one of its slices) must lie in one domain of the node label `key`,
    /// and no domain holds its `need` members; the best one, if any, holds `holds`.
    TopologyDomainTooSmall {
        /// The level (node label key).
        key: String,
        /// Members that must share a domain.
        need: u64,
        /// The domain (label value) that holds most of them.
        best: Option<String>,
        /// How many of them it holds.
        holds: u64,
    },
}

impl FilterReason {
    /// Whether removing pods from the node could make this reason go away.
    pub fn resolvable_by_preemption(&self) -> bool {
        matches!(
            self,
            Self::HostPortConflict
                | Self::Insufficient(_)
                | Self::PodAntiAffinityConflict
                | Self::ExistingPodAntiAffinity
                | Self::TopologyDomainTooSmall { .. }
        )
    }
}

impl fmt::Display for FilterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeNotReady => f.write_str("node(s) were not ready"),
            Self::NodeUnschedulable => f.write_str("node(s) were unschedulable"),
            Self::NodeMoving => f.write_str("node(s) were moving to another shard"),
            Self::NodeAffinityMismatch => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Self::UntoleratedTaint { key, effect } => {
                write!(f, "node(s) had untolerated taint {{{key}: {effect}}}")
            }
            Self::HostPortConflict => {
                f.write_str("node(s) didn't have free ports for the requested pod ports")
            }
            Self::Insufficient(resource) => write!(f, "Insufficient {resource}"),
            Self::LargerThanNode(resource) => {
                write!(
                    f,
                    "node(s) had less allocatable {resource} than the pod requests"
                )
            }
            Self::PodAffinityUnsatisfied => f.write_str("node(s) didn't match pod affinity rules"),
            Self::PodAntiAffinityConflict => {
                f.write_str("node(s) didn't match pod anti-affinity rules")
            }
            Self::ExistingPodAntiAffinity => {
                f.write_str("node(s) didn't satisfy existing pods anti-affinity rules")
            }
            Self::CapacityTakenByGang => {
                f.write_str("node(s) were filled by other members of the gang")
            }
            Self::CannotAllocateDevices => f.write_str("cannot allocate all claims"),
            Self::DeviceClassNotFound(name) => write!(f, "device class {name} does not exist"),
            Self::DeviceSelectorError(message) => write!(f, "device selector failed: {message}"),
            Self::DeviceSearchLimit => {
                f.write_str("device allocation search exceeded its step limit")
            }
            Self::SelectorsWarming => f.write_str(
                "a costly device selector is still being evaluated over this shard's devices",
            ),
            Self::SharedClaimNotHere(claim) => {
                write!(f, "node(s) didn't hold the devices of shared claim {claim}")
            }
            Self::TopologyDomainTooSmall {
                key,
                need,
                best,
                holds,
            } => {
                write!(f, "node(s) in no {key} that holds {need} members")?;
                match best {
                    Some(best) => write!(f, " (the best, {best}, holds {holds})"),
                    None => write!(f, " (no node has the label)"),
                }
            }
        }
    }
}

/// How many nodes were examined and why each one failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// Nodes examined.
    pub nodes: u64,
    /// Failing nodes per reason.
    #[serde(with = "reason_counts")]
    pub reasons: BTreeMap<FilterReason, u64>,
}

/// Encodes the reason counts as a list of pairs: reasons are structured
/// values, and JSON object keys must be strings.
mod reason_counts {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::FilterReason;

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<FilterReason, u64>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(&FilterReason, &u64)> = map.iter().collect();
        pairs.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<FilterReason, u64>, D::Error> {
        let pairs: Vec<(FilterReason, u64)> = Vec::deserialize(d)?;
        Ok(pairs.into_iter().collect())
    }
}

impl Diagnosis {
    /// Counts one failing node.
    pub fn record(&mut self, reason: FilterReason) {
        *self.reasons.entry(reason).or_insert(0) += 1;
    }

    /// Adds `count` nodes failing for `reason`.
    pub fn record_many(&mut self, reason: FilterReason, count: u64) {
        if count > 0 {
            *self.reasons.entry(reason).or_insert(0) += count;
        }
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available", self.nodes)?;
        let mut sep = ": ";
        for (reason, count) in &self.reasons {
            write!(f, "{sep}{count} {reason}")?;
            sep = ", ";
        }
        f.write_str(".")
    }
}

/// A pod template being filtered, with what it needs.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'s> {
    /// The spec.
    pub spec: &'s PodSpec,
    /// Requests plus one pod slot.
    pub footprint: &'s Resources,
    /// Members placed in this round (their own nominations do not bind them).
    pub own: &'s BTreeSet<MemberKey>,
}

/// Filters that depend on the node alone (not on what is placed on it).
pub fn node_filter(node: &Node, spec: &PodSpec) -> Result<(), FilterReason> {
    if node.readiness == Readiness::NotReady {
        return Err(FilterReason::NodeNotReady);
    }
    if node.schedulability == Schedulability::Cordoned
        && !tolerates_unschedulable(&spec.tolerations)
    {
        return Err(FilterReason::NodeUnschedulable);
    }
    if !node_selector_matches(&spec.node_selector, &node.labels)
        || !required_affinity_matches(&spec.node_affinity, &node.labels)
    {
        return Err(FilterReason::NodeAffinityMismatch);
    }
    match first_untolerated(&node.taints, &spec.tolerations) {
        Some(taint) => Err(FilterReason::UntoleratedTaint {
            key: taint.key.clone(),
            effect: taint.effect,
        }),
        None => Ok(()),
    }
}

/// NodePorts: every requested host port must be free (nominations of >= priority hold theirs).
pub fn ports_filter(state: &NodeState<'_>, candidate: &Candidate<'_>) -> Result<(), FilterReason> {
    let priority = candidate.spec.priority;
    if candidate
        .spec
        .host_ports
        .iter()
        .any(|port| state.port_taken(port, priority, candidate.own))
    {
        Err(FilterReason::HostPortConflict)
    } else {
        Ok(())
    }
}

/// NodeResourcesFit: how many copies fit beside what is held and nominated (>= priority).
pub fn resources_filter(
    state: &NodeState<'_>,
    candidate: &Candidate<'_>,
) -> Result<u64, FilterReason> {
    let nominated = state.nominated_load(candidate.spec.priority, candidate.own);
    let available = state.free().saturating_sub(&nominated);
    copies_within(
        candidate.footprint,
        &available,
        Some(&state.node.allocatable),
    )
}

/// How many copies of `footprint` fit within `available`, if at least one does; when
/// none does, a node whose `allocatable` is short of it too is refused as too small.
fn copies_within(
    footprint: &Resources,
    available: &Resources,
    allocatable: Option<&Resources>,
) -> Result<u64, FilterReason> {
    match footprint.shortfall(available) {
        Some(resource) => Err(match allocatable.and_then(|a| footprint.shortfall(a)) {
            Some(larger) => FilterReason::LargerThanNode(larger),
            None => FilterReason::Insufficient(resource),
        }),
        None => Ok(footprint.copies_within(available)),
    }
}

/// The built-in dimension at `NodeFit` position `d`.
fn fixed_name(d: usize) -> ResourceName {
    match d {
        0 => ResourceName::Cpu,
        1 => ResourceName::Memory,
        2 => ResourceName::Pods,
        _ => ResourceName::EphemeralStorage,
    }
}

/// The whole pipeline: `Ok(copies)` if the node can take at least one copy.
///
/// Copies are capped at one when the pod uses host ports or has inter-pod terms, since
/// a second copy would meet the first.
pub fn filter_node(
    state: &NodeState<'_>,
    candidate: &Candidate<'_>,
    interpod: &InterPodState,
) -> Result<u64, FilterReason> {
    node_filter(state.node, candidate.spec)?;
    ports_filter(state, candidate)?;
    let copies = resources_filter(state, candidate)?;
    interpod.check(state.node, candidate.spec)?;
    let single = !candidate.spec.host_ports.is_empty() || candidate.spec.has_pod_affinity_terms();
    Ok(if single { copies.min(1) } else { copies })
}

/// A pod template prepared for filtering many nodes of one cluster.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'s> {
    candidate: Candidate<'s>,
    interpod: &'s InterPodState,
    /// The footprint's built-in dimensions, if it has no extended resource.
    fixed: Option<[u64; FIXED_DIMS]>,
    /// Whether node labels cannot refuse it (no nodeSelector, no required node affinity).
    any_labels: bool,
    /// Whether inter-pod affinity cannot refuse it.
    any_neighbours: bool,
    /// Whether copies are capped at one (host ports or inter-pod terms).
    single: bool,
    /// The template's device needs, if it has claims or device-served extended resources.
    devices: Option<&'s DeviceDemand>,
}

impl<'s> Probe<'s> {
    /// Prepares `candidate`, whose inter-pod state over the cluster is `interpod`.
    pub fn new(candidate: Candidate<'s>, interpod: &'s InterPodState) -> Self {
        let spec = candidate.spec;
        Self {
            candidate,
            interpod,
            fixed: candidate
                .footprint
                .extended
                .is_empty()
                .then(|| fixed_dims(candidate.footprint)),
            any_labels: spec.node_selector.is_empty() && spec.node_affinity.required.is_none(),
            any_neighbours: interpod.filters_nothing(spec),
            single: !spec.host_ports.is_empty() || spec.has_pod_affinity_terms(),
            devices: None,
        }
    }

    /// The same probe, also allocating `devices` (the template's device needs) on each node.
    pub fn with_devices(mut self, devices: Option<&'s DeviceDemand>) -> Self {
        self.devices = devices;
        self
    }

    /// [`filter_node`] on node `idx` of `cluster`, with the copies capped at `cap`.
    ///
    /// Callers that need no more than `cap` copies pass it, which spares the division
    /// when `cap` is one.
    pub fn check(&self, cluster: &Cluster<'_>, idx: usize, cap: u64) -> Result<u64, FilterReason> {
        match cluster.fit(idx) {
            Some(fit) => self.check_fit(cluster, idx, &fit, cap),
            None => Err(FilterReason::NodeNotReady),
        }
    }

    /// [`Probe::check`] given node `idx`'s summary `fit` (`cluster.fit(idx)`).
    pub fn check_fit(
        &self,
        cluster: &Cluster<'_>,
        idx: usize,
        fit: &NodeFit,
        cap: u64,
    ) -> Result<u64, FilterReason> {
        self.check_fit_scored(cluster, idx, fit, cap)
            .map(|(copies, _)| copies)
    }

    /// [`Probe::check_fit`], with the node's device score (the firstAvailable
    /// preference of the devices it would allocate; 0 without claims).
    pub fn check_fit_scored(
        &self,
        cluster: &Cluster<'_>,
        idx: usize,
        fit: &NodeFit,
        cap: u64,
    ) -> Result<(u64, u32), FilterReason> {
        let node = cluster.node(idx);
        let spec = self.candidate.spec;
        if fit.has(NodeFit::MOVING) {
            return Err(FilterReason::NodeMoving);
        }
        if fit.has(NodeFit::NODE_FILTERED) || !self.any_labels {
            if let Some(node) = node {
                node_filter(node, spec)?;
            }
        }
        if !spec.host_ports.is_empty()
            && (fit.has(NodeFit::HOST_PORTS) || cluster.has_nominations())
            && spec
                .host_ports
                .iter()
                .any(|port| cluster.port_taken(idx, port, spec.priority, self.candidate.own))
        {
            return Err(FilterReason::HostPortConflict);
        }
        let copies = match self.fixed {
            Some(footprint) if cluster.nominations(idx).next().is_none() => {
                fixed_copies(&footprint, fit, cap)?
            }
            _ => {
                let nominated = cluster.nominated_load(idx, spec.priority, self.candidate.own);
                let free = node
                    .map(|n| n.allocatable.saturating_sub(&cluster.requested(idx)))
                    .unwrap_or_default();
                let available = free.saturating_sub(&nominated);
                match (self.devices, node) {
                    (Some(demand), Some(node)) if demand.serves_extended() => copies_within(
                        &demand.footprint_on(node, self.candidate.footprint),
                        &available,
                        Some(&node.allocatable),
                    )?,
                    _ => copies_within(
                        self.candidate.footprint,
                        &available,
                        node.map(|n| &n.allocatable),
                    )?,
                }
            }
        };
        if !self.any_neighbours {
            if let Some(node) = node {
                self.interpod.check(node, spec)?;
            }
        }
        if let Some(share) = self
            .candidate
            .spec
            .followed_shares()
            .find(|share| !cluster.carries(idx, &share.claim))
        {
            return Err(FilterReason::SharedClaimNotHere(share.claim.clone()));
        }
        let copies = if self.single { copies.min(1) } else { copies };
        let copies = copies.min(cap);
        match self.devices {
            None => Ok((copies, 0)),
            Some(demand) => {
                let fit = demand.fit(cluster, idx, copies)?;
                Ok((fit.copies, fit.score))
            }
        }
    }

    /// Whether, without nominations, the outcome on a node whose summary has none of
    /// the [`NodeFit::NODE_FILTERED`] flags depends on that summary alone.
    pub fn reads_fit_only(&self) -> bool {
        self.candidate.spec.shares.is_empty()
            && self.any_labels
            && self.fixed.is_some()
            && self.any_neighbours
            && self.candidate.spec.host_ports.is_empty()
            && self.devices.is_none()
    }

    /// Whether, without nominations, the outcome on a node without the
    /// [`NodeFit::NODE_FILTERED`] flags depends on that node's own state alone (its
    /// summary, and for templates with device needs its devices), so that a result kept
    /// for the node's stamp (and the template's device classes) can be reused.
    pub fn reads_node_only(&self) -> bool {
        self.reads_fit_only()
            || (self.devices.is_some()
                && self.candidate.spec.shares.is_empty()
                && self.any_labels
                && self.any_neighbours
                && self.candidate.spec.host_ports.is_empty())
    }
}

/// NodeResourcesFit on the built-in dimensions: copies of `footprint` that fit, up to `cap`.
fn fixed_copies(
    footprint: &[u64; FIXED_DIMS],
    fit: &NodeFit,
    cap: u64,
) -> Result<u64, FilterReason> {
    let mut available = [0u64; FIXED_DIMS];
    for d in 0..FIXED_DIMS {
        available[d] = fit.allocatable[d].saturating_sub(fit.requested[d]);
        if footprint[d] > available[d] {
            let larger = (0..FIXED_DIMS).find(|&e| footprint[e] > fit.allocatable[e]);
            return Err(match larger {
                Some(e) => FilterReason::LargerThanNode(fixed_name(e)),
                None => FilterReason::Insufficient(fixed_name(d)),
            });
        }
    }
    if cap <= 1 {
        // Fitting at all means one copy fits.
        return Ok(cap);
    }
    Ok((0..FIXED_DIMS)
        .filter(|&d| footprint[d] > 0)
        .map(|d| available[d] / footprint[d])
        .min()
        .unwrap_or(u64::MAX))
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
