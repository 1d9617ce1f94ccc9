//! Label matching: node selectors, node affinity terms, label selectors.
//!
//! Owns the Kubernetes matching rules: nodeSelector (every pair equal), node selector
//! requirements (In, NotIn, Exists, DoesNotExist, Gt, Lt — NotIn and DoesNotExist hold
//! for an absent label; Gt/Lt compare as 64-bit integers and fail on an absent or
//! non-integer label), terms (requirements ANDed; an empty term matches nothing),
//! required node affinity (terms ORed), label selectors (matchLabels and
//! matchExpressions ANDed; an empty selector matches everything, an absent one nothing).
//! Pure functions; called by filters, scores and inter-pod affinity.

use std::collections::BTreeMap;

use crate::model::pod::{
    LabelSelector, LabelSelectorOperator, NodeAffinity, NodeSelectorOperator,
    NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm,
};

/// Labels of a node or a pod.
pub type Labels = BTreeMap<String, String>;

/// Whether every `key: value` of a nodeSelector is on the node.
pub fn node_selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether one node selector requirement holds for `labels`.
pub fn requirement_matches(req: &NodeSelectorRequirement, labels: &Labels) -> bool {
    let value = labels.get(&req.key);
    match req.operator {
        NodeSelectorOperator::In => value.is_some_and(|v| req.values.contains(v)),
        NodeSelectorOperator::NotIn => absent_or_not_in(value, &req.values),
        NodeSelectorOperator::Exists => value.is_some(),
        NodeSelectorOperator::DoesNotExist => value.is_none(),
        NodeSelectorOperator::Gt => compare_int(value, &req.values).is_some_and(|(l, r)| l > r),
        NodeSelectorOperator::Lt => compare_int(value, &req.values).is_some_and(|(l, r)| l < r),
    }
}

/// The label and the single requirement value as integers, if both parse.
fn compare_int(value: Option<&String>, values: &[String]) -> Option<(i64, i64)> {
    let label: i64 = value?.parse().ok()?;
    match values {
        [only] => Some((label, only.parse().ok()?)),
        _ => None,
    }
}

/// NotIn semantics: an absent label, or a value outside `values`.
fn absent_or_not_in(value: Option<&String>, values: &[String]) -> bool {
    match value {
        None => true,
        Some(v) => !values.contains(v),
    }
}

/// Whether every requirement of a term holds; an empty term matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, labels: &Labels) -> bool {
    !term.match_expressions.is_empty()
        && term
            .match_expressions
            .iter()
            .all(|r| requirement_matches(r, labels))
}

/// Whether the required node affinity (terms ORed) admits the node; none admits all.
pub fn required_affinity_matches(affinity: &NodeAffinity, labels: &Labels) -> bool {
    match &affinity.required {
        None => true,
        Some(terms) => terms.iter().any(|t| term_matches(t, labels)),
    }
}

/// Sum of the weights of the preferred node affinity terms the node matches.
pub fn preferred_affinity_weight(affinity: &NodeAffinity, labels: &Labels) -> u64 {
    affinity
        .preferred
        .iter()
        .filter(|p| term_matches(&p.preference, labels))
        .map(|p| u64::try_from(p.weight).unwrap_or(0))
        .sum()
}

/// Whether a label selector matches `labels`.
pub fn label_selector_matches(selector: &LabelSelector, labels: &Labels) -> bool {
    node_selector_matches(&selector.match_labels, labels)
        && selector.match_expressions.iter().all(|req| {
            let value = labels.get(&req.key);
            match req.operator {
                LabelSelectorOperator::In => value.is_some_and(|v| req.values.contains(v)),
                LabelSelectorOperator::NotIn => absent_or_not_in(value, &req.values),
                LabelSelectorOperator::Exists => value.is_some(),
                LabelSelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

/// Whether a pod affinity term selects a pod with `labels`; a term without selector selects none.
pub fn pod_term_matches(term: &PodAffinityTerm, labels: &Labels) -> bool {
    term.label_selector
        .as_ref()
        .is_some_and(|selector| label_selector_matches(selector, labels))
}

#[cfg(test)]
#[path = "selectors_tests.rs"]
mod tests;
