//! Inter-pod affinity and anti-affinity, computed once per pod template.
//!
//! Owns [`InterPodState`], the pre-filter state of Kubernetes' InterPodAffinity plugin:
//! counts per topology pair (node label key, value) of
//! - existing pods matching *all* the incoming pod's required affinity terms,
//! - existing pods matching each of its required anti-affinity terms,
//! - existing pods whose own required anti-affinity terms match the incoming pod,
//! - and the weighted sum of its preferred (anti-)affinity terms over existing pods.
//!
//! Rules (as Kubernetes): a node lacking a required affinity term's topology label
//! fails; the first pod of a self-affine series passes when no pod anywhere matches and
//! it matches its own terms; anti-affinity only applies on nodes carrying the topology
//! label. Terms select pods of every namespace. Invariant: no zero count is stored, so an
//! empty map means "no match anywhere". Counts change by ±1 as pods are planned or
//! removed (preemption), without a rebuild. Called by filters, scores and preemption.

use std::collections::BTreeMap;

use crate::engine::cluster::{Cluster, PodInfo};
use crate::engine::filter::FilterReason;
use crate::ledger::view::NodeFit;
use crate::model::node::Node;
use crate::model::pod::{PodAffinityTerm, PodSpec, PodSummary};
use crate::model::selectors::pod_term_matches;

/// A topology domain: node label key and value.
type TopologyPair = (String, String);

/// Inter-pod counts for one incoming pod template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterPodState {
    affinity: BTreeMap<TopologyPair, i64>,
    anti_affinity: BTreeMap<TopologyPair, i64>,
    existing_anti_affinity: BTreeMap<TopologyPair, i64>,
    preferred: BTreeMap<TopologyPair, i64>,
}

/// Whether a pod is counted or skipped while building the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Counted.
    Yes,
    /// Skipped (e.g. a preemption victim).
    No,
}

impl InterPodState {
    /// Counts every pod of `cluster` for which `counted` says yes, for template `spec`.
    ///
    /// A template without terms of its own only meets pods with anti-affinity terms, so
    /// only nodes holding such pods are visited then.
    pub fn build(
        cluster: &Cluster<'_>,
        spec: &PodSpec,
        counted: impl Fn(usize, &PodInfo<'_>) -> Counted,
    ) -> Self {
        let mut state = Self::default();
        let own_terms = spec.has_pod_affinity_terms();
        if !own_terms && !cluster.has_anti_affinity {
            return state;
        }
        for idx in 0..cluster.len() {
            let relevant = own_terms
                || cluster
                    .fit(idx)
                    .is_some_and(|fit| fit.has(NodeFit::ANTI_AFFINITY));
            let Some(node) = cluster.node(idx).filter(|_| relevant) else {
                continue;
            };
            for pod in cluster.pods(idx) {
                if counted(idx, &pod) == Counted::Yes {
                    state.update(node, &pod.pod, spec, 1);
                }
            }
        }
        state
    }

    /// Whether [`InterPodState::check`] passes every node for `spec`.
    pub fn filters_nothing(&self, spec: &PodSpec) -> bool {
        spec.pod_affinity.required.is_empty()
            && spec.pod_anti_affinity.required.is_empty()
            && self.existing_anti_affinity.is_empty()
    }

    /// Whether [`InterPodState::preferred_score`] is zero on every node.
    pub fn prefers_nothing(&self) -> bool {
        self.preferred.is_empty()
    }

    /// Adds (`delta` = 1) or removes (`delta` = -1) one pod on `node`.
    pub fn update(&mut self, node: &Node, pod: &PodSummary, spec: &PodSpec, delta: i64) {
        let required = &spec.pod_affinity.required;
        if !required.is_empty() && required.iter().all(|t| pod_term_matches(t, &pod.labels)) {
            for term in required {
                bump(&mut self.affinity, node, &term.topology_key, delta);
            }
        }
        for term in &spec.pod_anti_affinity.required {
            if pod_term_matches(term, &pod.labels) {
                bump(&mut self.anti_affinity, node, &term.topology_key, delta);
            }
        }
        for term in &pod.anti_affinity {
            if pod_term_matches(term, &spec.labels) {
                bump(
                    &mut self.existing_anti_affinity,
                    node,
                    &term.topology_key,
                    delta,
                );
            }
        }
        for weighted in &spec.pod_affinity.preferred {
            if pod_term_matches(&weighted.term, &pod.labels) {
                bump(
                    &mut self.preferred,
                    node,
                    &weighted.term.topology_key,
                    delta * i64::from(weighted.weight),
                );
            }
        }
        for weighted in &spec.pod_anti_affinity.preferred {
            if pod_term_matches(&weighted.term, &pod.labels) {
                bump(
                    &mut self.preferred,
                    node,
                    &weighted.term.topology_key,
                    -delta * i64::from(weighted.weight),
                );
            }
        }
    }

    /// The InterPodAffinity filter for `node`, checks in Kubernetes' order.
    pub fn check(&self, node: &Node, spec: &PodSpec) -> Result<(), FilterReason> {
        if !self.affinity_satisfied(node, spec) {
            return Err(FilterReason::PodAffinityUnsatisfied);
        }
        let anti_hit = spec.pod_anti_affinity.required.iter().any(|term| {
            node.label(&term.topology_key)
                .is_some_and(|value| count_at(&self.anti_affinity, &term.topology_key, value) > 0)
        });
        if anti_hit {
            return Err(FilterReason::PodAntiAffinityConflict);
        }
        let existing_hit = self
            .existing_anti_affinity
            .iter()
            .any(|((key, value), count)| *count > 0 && node.label(key) == Some(value.as_str()));
        if existing_hit {
            return Err(FilterReason::ExistingPodAntiAffinity);
        }
        Ok(())
    }

    fn affinity_satisfied(&self, node: &Node, spec: &PodSpec) -> bool {
        let terms = &spec.pod_affinity.required;
        let mut pods_exist = true;
        for term in terms {
            match node.label(&term.topology_key) {
                None => return false,
                Some(value) => {
                    pods_exist &= count_at(&self.affinity, &term.topology_key, value) > 0
                }
            }
        }
        pods_exist || (self.affinity.is_empty() && matches_all(terms, spec))
    }

    /// Raw preferred (anti-)affinity score of `node` (may be negative).
    pub fn preferred_score(&self, node: &Node) -> i64 {
        self.preferred
            .iter()
            .filter(|((key, value), _)| node.label(key) == Some(value.as_str()))
            .map(|(_, score)| *score)
            .sum()
    }
}

fn matches_all(terms: &[PodAffinityTerm], spec: &PodSpec) -> bool {
    terms.iter().all(|t| pod_term_matches(t, &spec.labels))
}

fn count_at(map: &BTreeMap<TopologyPair, i64>, key: &str, value: &str) -> i64 {
    map.get(&(key.to_string(), value.to_string()))
        .copied()
        .unwrap_or(0)
}

fn bump(map: &mut BTreeMap<TopologyPair, i64>, node: &Node, key: &str, delta: i64) {
    let Some(value) = node.label(key) else {
        return;
    };
    let pair = (key.to_string(), value.to_string());
    let entry = map.entry(pair.clone()).or_insert(0);
    *entry += delta;
    if *entry == 0 {
        map.remove(&pair);
    }
}
