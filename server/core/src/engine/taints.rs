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
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: TaintEffect) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect,
        }
    }

    fn tol(
        key: &str,
        operator: TolerationOperator,
        value: &str,
        effect: Option<TaintEffect>,
    ) -> Toleration {
        Toleration {
            key: key.into(),
            operator,
            value: value.into(),
            effect,
            toleration_seconds: None,
        }
    }

    #[test]
    fn toleration_rules_follow_kubernetes() {
        use TaintEffect::*;
        use TolerationOperator::*;
        let t = taint("gpu", "true", NoSchedule);
        let cases = [
            (tol("", Exists, "", None), true),
            (tol("", Exists, "", Some(NoSchedule)), true),
            (tol("", Exists, "", Some(NoExecute)), false),
            (tol("gpu", Exists, "", None), true),
            (tol("gpu", Equal, "true", None), true),
            (tol("gpu", Equal, "false", None), false),
            (tol("gpu", Equal, "", None), false),
            (tol("gpu", Equal, "true", Some(NoSchedule)), true),
            (tol("gpu", Equal, "true", Some(PreferNoSchedule)), false),
            (tol("other", Exists, "", None), false),
        ];
        for (toleration, expected) in cases {
            assert_eq!(tolerates(&toleration, &t), expected, "{toleration:?}");
        }
        assert!(tolerates(
            &tol("k", Equal, "", None),
            &taint("k", "", NoExecute)
        ));
    }

    #[test]
    fn filtering_ignores_prefer_no_schedule() {
        use TaintEffect::*;
        let taints = vec![
            taint("soft", "", PreferNoSchedule),
            taint("hard", "x", NoExecute),
        ];
        assert_eq!(
            first_untolerated(&taints, &[]).map(|t| t.key.as_str()),
            Some("hard")
        );
        let tolerations = vec![tol("hard", TolerationOperator::Exists, "", None)];
        assert_eq!(first_untolerated(&taints, &tolerations), None);
    }

    #[test]
    fn prefer_no_schedule_counting() {
        use TaintEffect::*;
        use TolerationOperator::*;
        let taints = vec![
            taint("a", "", PreferNoSchedule),
            taint("b", "", PreferNoSchedule),
            taint("c", "", NoSchedule),
        ];
        assert_eq!(intolerable_prefer_no_schedule(&taints, &[]), 2);
        assert_eq!(
            intolerable_prefer_no_schedule(&taints, &[tol("a", Exists, "", None)]),
            1
        );
        assert_eq!(
            intolerable_prefer_no_schedule(&taints, &[tol("a", Exists, "", Some(NoSchedule))]),
            2,
            "a toleration with another effect does not count"
        );
        assert_eq!(
            intolerable_prefer_no_schedule(&taints, &[tol("", Exists, "", None)]),
            0
        );
    }

    #[test]
    fn unschedulable_toleration() {
        use TolerationOperator::*;
        assert!(!tolerates_unschedulable(&[]));
        assert!(tolerates_unschedulable(&[tol(
            TAINT_UNSCHEDULABLE,
            Exists,
            "",
            Some(TaintEffect::NoSchedule)
        )]));
        assert!(tolerates_unschedulable(&[tol("", Exists, "", None)]));
        assert!(!tolerates_unschedulable(&[tol(
            TAINT_UNSCHEDULABLE,
            Exists,
            "",
            Some(TaintEffect::NoExecute)
        )]));
    }
}
