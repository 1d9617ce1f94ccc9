//! Unit tests of `selectors.rs`.

use super::*;
use crate::model::pod::LabelSelectorRequirement;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

use crate::fixtures::requirement as req;

#[test]
fn node_requirement_operators() {
    use NodeSelectorOperator::*;
    let node = labels(&[("zone", "a"), ("cores", "16"), ("odd", "x")]);
    let cases = [
        (req("zone", In, &["a", "b"]), true),
        (req("zone", In, &["b"]), false),
        (req("missing", In, &["a"]), false),
        (req("zone", NotIn, &["b"]), true),
        (req("zone", NotIn, &["a"]), false),
        (req("missing", NotIn, &["a"]), true),
        (req("zone", Exists, &[]), true),
        (req("missing", Exists, &[]), false),
        (req("zone", DoesNotExist, &[]), false),
        (req("missing", DoesNotExist, &[]), true),
        (req("cores", Gt, &["8"]), true),
        (req("cores", Gt, &["16"]), false),
        (req("cores", Lt, &["32"]), true),
        (req("cores", Lt, &["16"]), false),
        (req("cores", Gt, &["-1"]), true),
        (req("missing", Gt, &["1"]), false),
        (req("missing", Lt, &["1"]), false),
        (req("odd", Gt, &["1"]), false),
        (req("odd", Lt, &["1"]), false),
    ];
    for (r, expected) in cases {
        assert_eq!(requirement_matches(&r, &node), expected, "{r:?}");
    }
}

#[test]
fn terms_and_required_affinity() {
    use NodeSelectorOperator::*;
    let node = labels(&[("zone", "a"), ("disk", "ssd")]);
    let both = NodeSelectorTerm {
        match_expressions: vec![req("zone", In, &["a"]), req("disk", In, &["ssd"])],
    };
    let one_wrong = NodeSelectorTerm {
        match_expressions: vec![req("zone", In, &["a"]), req("disk", In, &["hdd"])],
    };
    assert!(term_matches(&both, &node));
    assert!(!term_matches(&one_wrong, &node), "requirements are ANDed");
    assert!(
        !term_matches(&NodeSelectorTerm::default(), &node),
        "empty term matches nothing"
    );
    let ored = NodeAffinity {
        required: Some(vec![one_wrong.clone(), both.clone()]),
        preferred: vec![],
    };
    assert!(required_affinity_matches(&ored, &node), "terms are ORed");
    let none = NodeAffinity {
        required: Some(vec![one_wrong]),
        preferred: vec![],
    };
    assert!(!required_affinity_matches(&none, &node));
    assert!(required_affinity_matches(&NodeAffinity::default(), &node));
    assert!(node_selector_matches(&labels(&[("zone", "a")]), &node));
    assert!(!node_selector_matches(&labels(&[("zone", "b")]), &node));
    assert!(node_selector_matches(&Labels::new(), &node));
}

#[test]
fn label_selectors() {
    let pod = labels(&[("app", "web"), ("tier", "front")]);
    let mut sel = LabelSelector::default();
    assert!(
        label_selector_matches(&sel, &pod),
        "empty selector matches all"
    );
    sel.match_labels.insert("app".into(), "web".into());
    assert!(label_selector_matches(&sel, &pod));
    sel.match_expressions.push(LabelSelectorRequirement {
        key: "tier".into(),
        operator: LabelSelectorOperator::NotIn,
        values: vec!["front".into()],
    });
    assert!(!label_selector_matches(&sel, &pod));
    let term = PodAffinityTerm {
        label_selector: None,
        topology_key: "zone".into(),
    };
    assert!(
        !pod_term_matches(&term, &pod),
        "absent selector matches none"
    );
}
