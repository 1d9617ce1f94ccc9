//! Unit tests of `reach.rs`.

use super::*;
use crate::model::resources::Resources;

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let mut n = Node::new(name, Resources::default());
    n.labels = crate::fixtures::labels(labels).into();
    n
}

use crate::fixtures::requirement as req;

#[test]
fn all_nodes_admits_every_node() {
    assert!(PoolReach::AllNodes.admits(&node("a", &[])));
}

#[test]
fn a_term_ands_labels_and_names() {
    let reach = PoolReach::Selected(ReachTerm {
        match_expressions: vec![req("rack", NodeSelectorOperator::In, &["r1"])],
        match_fields: vec![req(NODE_NAME_FIELD, NodeSelectorOperator::NotIn, &["b"])],
    });
    assert!(reach.admits(&node("a", &[("rack", "r1")])));
    assert!(!reach.admits(&node("b", &[("rack", "r1")])));
    assert!(!reach.admits(&node("c", &[("rack", "r2")])));
    assert!(!reach.admits(&node("c", &[])));
}

#[test]
fn validation_names_the_field() {
    let spec = FieldPath::new("spec");
    let empty = PoolReach::Selected(ReachTerm::default());
    assert_eq!(
        empty.validate(&spec).unwrap_err().to_string(),
        "spec.nodeSelector.nodeSelectorTerms[0]: must have at least one requirement"
    );
    let bad_field = PoolReach::Selected(ReachTerm {
        match_expressions: Vec::new(),
        match_fields: vec![req("spec.x", NodeSelectorOperator::In, &["a"])],
    });
    assert!(bad_field
        .validate(&spec)
        .unwrap_err()
        .to_string()
        .starts_with("spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].key:"));
    let exists_with_values = PoolReach::Selected(ReachTerm {
        match_expressions: vec![req("rack", NodeSelectorOperator::Exists, &["x"])],
        match_fields: Vec::new(),
    });
    assert_eq!(
            exists_with_values.validate(&spec).unwrap_err().to_string(),
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values: must be empty for Exists and DoesNotExist"
        );
}
