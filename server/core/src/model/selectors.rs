//! Label matching: node selectors, node affinity terms, label selectors.
//!
//! Owns the Kubernetes matching rules: nodeSelector (every pair equal), node selector
//! requirements (In, NotIn, Exists, DoesNotExist, Gt, Lt — NotIn and DoesNotExist hold
//! for an absent label; Gt/Lt compare as 64-bit integers and fail on an absent or
//! non-integer label), terms (requirements ANDed; an empty term matches nothing),
//! required node affinity (terms ORed), label selectors (matchLabels and
//! matchExpressions ANDed; an empty selector matches everything, an absent one nothing).
//! Pure functions over anything that looks labels up ([`LabelSource`]: a pod's
//! `BTreeMap`, a node's interned [`crate::model::node::Labels`]); called by filters,
//! scores and inter-pod affinity.

use std::collections::BTreeMap;

use crate::model::compact::{SmallMap, Symbol};
use crate::model::pod::{
    LabelSelector, LabelSelectorOperator, NodeAffinity, NodeSelectorOperator,
    NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm,
};

/// Labels of a pod (and of a selector's `matchLabels`).
pub type Labels = BTreeMap<String, String>;

/// Labels that can be looked up by key.
pub trait LabelSource {
    /// The value of `key`, if set.
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelSource for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl LabelSource for SmallMap<Symbol, Symbol> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(Symbol::as_str)
    }
}

/// Whether every `key: value` of a nodeSelector is on the node.
pub fn node_selector_matches(selector: &Labels, labels: &impl LabelSource) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.label(k) == Some(v.as_str()))
}

/// Whether one node selector requirement holds for `labels`.
pub fn requirement_matches(req: &NodeSelectorRequirement, labels: &impl LabelSource) -> bool {
    let value = labels.label(&req.key);
    match req.operator {
        NodeSelectorOperator::In => value.is_some_and(|v| req.values.iter().any(|x| x == v)),
        NodeSelectorOperator::NotIn => absent_or_not_in(value, &req.values),
        NodeSelectorOperator::Exists => value.is_some(),
        NodeSelectorOperator::DoesNotExist => value.is_none(),
        NodeSelectorOperator::Gt => compare_int(value, &req.values).is_some_and(|(l, r)| l > r),
        NodeSelectorOperator::Lt => compare_int(value, &req.values).is_some_and(|(l, r)| l < r),
    }
}

/// The label and the single requirement value as integers, if both parse.
fn compare_int(value: Option<&str>, values: &[String]) -> Option<(i64, i64)> {
    let label: i64 = value?.parse().ok()?;
    match values {
        [only] => Some((label, only.parse().ok()?)),
        _ => None,
    }
}

/// NotIn semantics: an absent label, or a value outside `values`.
fn absent_or_not_in(value: Option<&str>, values: &[String]) -> bool {
    match value {
        None => true,
        Some(v) => !values.iter().any(|x| x == v),
    }
}

/// Whether every requirement of a term holds; an empty term matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, labels: &impl LabelSource) -> bool {
    !term.match_expressions.is_empty()
        && term
            .match_expressions
            .iter()
            .all(|r| requirement_matches(r, labels))
}

/// Whether the required node affinity (terms ORed) admits the node; none admits all.
pub fn required_affinity_matches(affinity: &NodeAffinity, labels: &impl LabelSource) -> bool {
    match &affinity.required {
        None => true,
        Some(terms) => terms.iter().any(|t| term_matches(t, labels)),
    }
}

/// Sum of the weights of the preferred node affinity terms the node matches.
pub fn preferred_affinity_weight(affinity: &NodeAffinity, labels: &impl LabelSource) -> u64 {
    affinity
        .preferred
        .iter()
        .filter(|p| term_matches(&p.preference, labels))
        .map(|p| u64::try_from(p.weight).unwrap_or(0))
        .sum()
}

/// Whether a label selector matches `labels`.
pub fn label_selector_matches(selector: &LabelSelector, labels: &impl LabelSource) -> bool {
    node_selector_matches(&selector.match_labels, labels)
        && selector.match_expressions.iter().all(|req| {
            let value = labels.label(&req.key);
            match req.operator {
                LabelSelectorOperator::In => {
                    value.is_some_and(|v| req.values.iter().any(|x| x == v))
                }
                LabelSelectorOperator::NotIn => absent_or_not_in(value, &req.values),
                LabelSelectorOperator::Exists => value.is_some(),
                LabelSelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

/// Whether a pod affinity term selects a pod with `labels`; a term without selector selects none.
pub fn pod_term_matches(term: &PodAffinityTerm, labels: &impl LabelSource) -> bool {
    term.label_selector
        .as_ref()
        .is_some_and(|selector| label_selector_matches(selector, labels))
}

#[cfg(test)]
#[path = "selectors_tests.rs"]
mod tests;
