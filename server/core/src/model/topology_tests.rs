use super::*;

fn hierarchy(levels: &[&str]) -> TopologyHierarchy {
    TopologyHierarchy {
        name: "net".into(),
        levels: levels.iter().map(|l| l.to_string()).collect(),
    }
}

#[test]
fn hierarchy_levels_are_checked_by_name() {
    let root = FieldPath::root().child("topologies").index(0);
    assert!(hierarchy(&["block", "rack"]).validate(&root).is_ok());
    let twice = hierarchy(&["block", "block"]).validate(&root).unwrap_err();
    assert!(
        twice.to_string().contains("topologies[0].levels[1]"),
        "{twice}"
    );
    let empty = hierarchy(&[]).validate(&root).unwrap_err();
    assert!(empty.to_string().contains("at least one level"), "{empty}");
    let bad = hierarchy(&["-rack"]).validate(&root).unwrap_err();
    assert!(bad.to_string().contains("levels[0]"), "{bad}");
}

#[test]
fn hierarchy_walks_up_and_down() {
    let h = hierarchy(&["block", "rack", "host"]);
    assert_eq!(h.wider_than("host"), vec!["rack", "block"]);
    assert!(h.wider_than("block").is_empty());
    assert!(h.wider_than("zone").is_empty());
    assert_eq!(h.below("block"), Some("rack"));
    assert_eq!(h.below("host"), None);
    let all = [hierarchy(&["zone"]), h];
    assert_eq!(hierarchy_of(&all, "rack").map(|h| h.levels.len()), Some(3));
    assert!(hierarchy_of(&all, "pod").is_none());
}

#[test]
fn constraint_errors_name_the_field() {
    let root = FieldPath::root().child("topology");
    let slice = TopologyConstraint {
        slice: Some(TopologySlice {
            key: "rack".into(),
            size: 0,
        }),
        ..TopologyConstraint::default()
    };
    let err = slice.validate(&root).unwrap_err();
    assert!(err.to_string().contains("topology.slice.size"), "{err}");
    let required = TopologyConstraint {
        required: Some("bad key!".into()),
        ..TopologyConstraint::default()
    };
    let err = required.validate(&root).unwrap_err();
    assert!(err.to_string().contains("topology.required"), "{err}");
    assert!(TopologyConstraint::default().is_none());
    assert!(!TopologyConstraint::default().confines());
}

#[test]
fn constraint_reads_the_json_names() {
    let c: TopologyConstraint = serde_json::from_str(
        r#"{"required":"block","preferred":"rack","slice":{"key":"host","size":4}}"#,
    )
    .expect("decodes");
    assert!(c.confines());
    assert_eq!(
        c.describe(),
        "required block, preferred rack, slices of 4 in host"
    );
    assert!(serde_json::from_str::<TopologyConstraint>(r#"{"requird":"x"}"#).is_err());
}

#[test]
fn learned_hierarchies_follow_the_configured_ones_without_repeating_them() {
    let learned = LearnedHierarchies::default();
    let configured = [hierarchy(&["block", "rack"])];
    assert_eq!(learned.merged(&configured), configured.to_vec());
    assert!(learned.replace(vec![hierarchy(&["block", "rack"]), hierarchy(&["nvlink"])]));
    assert!(!learned.replace(vec![hierarchy(&["block", "rack"]), hierarchy(&["nvlink"])]));
    let merged = learned.merged(&configured);
    let levels: Vec<&[String]> = merged.iter().map(|h| h.levels.as_slice()).collect();
    assert_eq!(
        levels,
        [
            &["block".to_string(), "rack".to_string()][..],
            &["nvlink".to_string()][..]
        ]
    );
}
