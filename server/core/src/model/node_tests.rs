//! Unit tests of `node.rs`.

use super::*;

fn parse(json: &str) -> Result<Node, String> {
    let raw: RawNode = serde_json::from_str(json).map_err(|e| e.to_string())?;
    raw.validate().map_err(|e| e.to_string())
}

#[test]
fn valid_node() {
    let node = parse(
            r#"{"name":"n1","labels":{"topology.kubernetes.io/zone":"a"},
                "taints":[{"key":"gpu","value":"true","effect":"NoSchedule"}],
                "allocatable":{"cpu":"8","memory":"32Gi","pods":110,"nvidia.com/gpu":"4","ephemeral-storage":"100Gi"}}"#,
        )
        .expect("valid");
    assert_eq!(node.allocatable.cpu_milli, 8000);
    assert_eq!(node.allocatable.pods, 110);
    assert_eq!(node.allocatable.extended.get("nvidia.com/gpu"), Some(&4));
    assert_eq!(node.readiness, Readiness::Ready);
    assert_eq!(node.taints[0].effect, TaintEffect::NoSchedule);
}

#[test]
fn invalid_nodes_name_the_field() {
    let err =
        parse(r#"{"name":"n1","taints":[{"key":"a","effect":"NoWay"}]}"#).expect_err("effect");
    assert!(
        err.starts_with("taints[0].effect: unknown taint effect \"NoWay\""),
        "{err}"
    );
    let err = parse(r#"{"name":"n1","allocatable":{"cpu":"-2"}}"#).expect_err("neg");
    assert!(
        err.starts_with("allocatable.cpu: invalid quantity \"-2\""),
        "{err}"
    );
    let err = parse(r#"{"name":"N_1"}"#).expect_err("name");
    assert!(err.starts_with("name: invalid name"), "{err}");
    let err = parse(r#"{"name":"n1","labels":{"bad key":"x"}}"#).expect_err("label");
    assert!(err.starts_with("labels.bad key: invalid key"), "{err}");
    let err = parse(
            r#"{"name":"n1","taints":[{"key":"a","effect":"NoSchedule"},{"key":"a","value":"b","effect":"NoSchedule"}]}"#,
        )
        .expect_err("dup");
    assert!(err.starts_with("taints[1]: duplicate taint"), "{err}");
    let err = parse(r#"{"name":"n1","colour":"red"}"#).expect_err("unknown field");
    assert!(err.contains("colour"), "{err}");
}
