//! Unit tests of `taints.rs`.

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
