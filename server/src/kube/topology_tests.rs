use serde_json::json;

use super::*;
use crate::kube::gangs::{identify, Identity, PodGroupIndex, PodGroups};

fn pod(annotations: Value, labels: Value) -> Value {
    json!({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
                        "annotations": annotations, "labels": labels},
           "spec": {"containers": []}})
}

fn hierarchy(levels: &[&str]) -> Vec<TopologyHierarchy> {
    vec![TopologyHierarchy {
        name: "net".into(),
        levels: levels.iter().map(|l| l.to_string()).collect(),
    }]
}

fn invalid(result: Result<impl std::fmt::Debug, PodProblem>) -> String {
    match result {
        Err(PodProblem::Invalid(why)) => why,
        other => panic!("invalid expected, got {other:?}"),
    }
}

#[test]
fn kueue_annotations_give_required_preferred_and_slices() {
    let p = pod(
        json!({KUEUE_REQUIRED: "example.com/block", KUEUE_PREFERRED: "example.com/rack",
               KUEUE_SLICE_REQUIRED: "example.com/nvlink", KUEUE_SLICE_SIZE: "4"}),
        json!({}),
    );
    let c = kueue_topology(&p).expect("valid").expect("some");
    assert_eq!(c.required.as_deref(), Some("example.com/block"));
    assert_eq!(c.preferred.as_deref(), Some("example.com/rack"));
    assert_eq!(
        c.slice,
        Some(TopologySlice {
            key: "example.com/nvlink".into(),
            size: 4
        })
    );
    assert_eq!(kueue_topology(&pod(json!({}), json!({}))), Ok(None));
}

#[test]
fn bad_kueue_annotations_are_refused_naming_the_annotation() {
    for (annotations, named) in [
        (json!({KUEUE_REQUIRED: "not a key!"}), KUEUE_REQUIRED),
        (
            json!({KUEUE_SLICE_REQUIRED: "example.com/rack"}),
            KUEUE_SLICE_SIZE,
        ),
        (json!({KUEUE_SLICE_SIZE: "4"}), KUEUE_SLICE_REQUIRED),
        (
            json!({KUEUE_SLICE_REQUIRED: "example.com/rack", KUEUE_SLICE_SIZE: "0"}),
            KUEUE_SLICE_SIZE,
        ),
    ] {
        let why = invalid(kueue_topology(&pod(annotations, json!({}))));
        assert!(why.contains(named), "{why}");
    }
}

#[test]
fn a_kueue_pod_group_is_a_gang_of_its_total_count_with_its_topology() {
    let p = pod(
        json!({"kueue.x-k8s.io/pod-group-total-count": "8", KUEUE_REQUIRED: "example.com/rack"}),
        json!({"kueue.x-k8s.io/pod-group-name": "train"}),
    );
    let Ok(Identity::Gang(params)) = identify(&p, &PodGroups::default()) else {
        panic!("gang")
    };
    assert_eq!((params.id.name.as_str(), params.min_member), ("train", 8));
    assert_eq!(
        params.topology.required.as_deref(),
        Some("example.com/rack")
    );
    let missing = pod(json!({}), json!({"kueue.x-k8s.io/pod-group-name": "train"}));
    let why = invalid(identify(&missing, &PodGroups::default()));
    assert!(
        why.contains("kueue.x-k8s.io/pod-group-total-count"),
        "{why}"
    );
}

#[test]
fn volcano_tiers_count_from_the_narrowest_level_without_hosts() {
    let tiers = volcano_tiers(&hierarchy(&[
        "example.com/block",
        "example.com/rack",
        LABEL_HOSTNAME,
    ]));
    assert_eq!(tiers, vec!["example.com/rack", "example.com/block"]);
    let what = "PodGroup ns/job (scheduling.volcano.sh)";
    let hard = json!({"networkTopology": {"mode": "hard", "highestTierAllowed": 2}});
    let c = volcano_topology(what, &hard, &tiers).expect("valid");
    assert_eq!(c.required.as_deref(), Some("example.com/block"));
    let soft = json!({"networkTopology": {"mode": "soft"}});
    let c = volcano_topology(what, &soft, &tiers).expect("valid");
    assert_eq!(c.preferred.as_deref(), Some("example.com/rack"));
    assert!(c.required.is_none());
    let none = volcano_topology(what, &json!({}), &tiers).expect("valid");
    assert!(none.is_none());
    let far = json!({"networkTopology": {"mode": "hard", "highestTierAllowed": 3}});
    let why = invalid(volcano_topology(what, &far, &tiers));
    assert!(why.contains("tier 3") && why.contains("2 tiers"), "{why}");
    let odd = json!({"networkTopology": {"mode": "sometimes"}});
    assert!(invalid(volcano_topology(what, &odd, &tiers)).contains("spec.networkTopology.mode"));
}

#[test]
fn a_volcano_pod_group_carries_its_network_topology() {
    let groups = PodGroups {
        volcano: PodGroupIndex::from([(
            ("ns".into(), "job".into()),
            std::sync::Arc::new(json!({"metadata": {"name": "job"},
                "spec": {"minMember": 2, "networkTopology": {"mode": "hard"}}})),
        )]),
        volcano_tiers: vec!["example.com/rack".into()],
        ..PodGroups::default()
    };
    let p = pod(json!({"scheduling.k8s.io/group-name": "job"}), json!({}));
    let Ok(Identity::Gang(params)) = identify(&p, &groups) else {
        panic!("gang")
    };
    assert_eq!(
        params.topology.required.as_deref(),
        Some("example.com/rack")
    );
}

#[test]
fn a_kueue_topology_is_a_hierarchy_and_a_bad_one_names_the_field() {
    let t = json!({"metadata": {"name": "default"}, "spec": {"levels": [
        {"nodeLabel": "example.com/block"}, {"nodeLabel": "example.com/rack"},
        {"nodeLabel": "kubernetes.io/hostname"}]}});
    let h = kueue_hierarchy(&t).expect("valid");
    assert_eq!(h.name, "kueue:default");
    assert_eq!(
        h.levels,
        vec!["example.com/block", "example.com/rack", LABEL_HOSTNAME]
    );
    let missing = json!({"metadata": {"name": "x"}, "spec": {"levels": [{"label": "a"}]}});
    let why = kueue_hierarchy(&missing).expect_err("no nodeLabel");
    assert!(why.contains("spec.levels[0].nodeLabel"), "{why}");
    let twice = json!({"metadata": {"name": "x"}, "spec": {"levels": [
        {"nodeLabel": "a"}, {"nodeLabel": "a"}]}});
    assert!(kueue_hierarchy(&twice)
        .expect_err("twice")
        .contains("levels[1]"));
}
