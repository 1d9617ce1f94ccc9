//! Taints and tolerations, by Kubernetes' rules.
//!
//! Owns toleration matching (`ToleratesTaint`): an effect, if set, must equal the
//! taint's; a key, if set, must equal the taint's (an empty key with `Exists` tolerates
//! every taint); `Exists` ignores the value, `Equal` compares it. Filtering considers
//! NoSchedule and NoExecute taints; PreferNoSchedule only counts for scoring, and only
//! tolerations with that effect or no effect are consulted there. A cordoned node is
//! treated as tainted `node.kubernetes.io/unschedulable:NoSchedule`. Pure functions;
//! called by filters and scores.

use crate::model::node::{Taint, TaintEffect, TAINT_UNSCHEDULABLE};
use crate::model::pod::{Toleration, TolerationOperator};

/// Whether one toleration tolerates one taint.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if toleration
        .effect
        .is_some_and(|effect| effect != taint.effect)
    {
        return false;
    }
    if !toleration.key.is_empty() && toleration.key != taint.key {
        return false;
    }
    match toleration.operator {
        TolerationOperator::Exists => true,
        TolerationOperator::Equal => toleration.value == taint.value,
    }
}

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// The first NoSchedule or NoExecute taint no toleration tolerates.
pub fn first_untolerated<'t>(taints: &'t [Taint], tolerations: &[Toleration]) -> Option<&'t Taint> {
    taints
        .iter()
        .filter(|taint| taint.effect != TaintEffect::PreferNoSchedule)
        .find(|taint| !tolerated(tolerations, taint))
}

/// How many PreferNoSchedule taints the pod does not tolerate (TaintToleration scoring).
pub fn intolerable_prefer_no_schedule(taints: &[Taint], tolerations: &[Toleration]) -> u64 {
    let relevant: Vec<Toleration> = tolerations
        .iter()
        .filter(|t| t.effect.is_none_or(|e| e == TaintEffect::PreferNoSchedule))
        .cloned()
        .collect();
    taints
        .iter()
        .filter(|taint| taint.effect == TaintEffect::PreferNoSchedule)
        .filter(|taint| !tolerated(&relevant, taint))
        .count() as u64
}

/// Whether the pod may go to a cordoned node.
pub fn tolerates_unschedulable(tolerations: &[Toleration]) -> bool {
    let taint = Taint {
        key: TAINT_UNSCHEDULABLE.to_string(),
        value: String::new(),
        effect: TaintEffect::NoSchedule,
    };
    tolerated(tolerations, &taint)
}

#[cfg(test)]
#[path = "taints_tests.rs"]
mod tests;
