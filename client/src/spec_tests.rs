//! Unit tests of `spec.rs`.

use super::*;

#[test]
fn group_file_round_trip() {
    let yaml = "name: g\nidempotencyKey: k1\ngangs:\n  - name: workers\n    namespace: team-a\n    minMember: 2\n    waitTime: 30s\n    members:\n      - name: w\n        count: 2\n        pod:\n          requests: {cpu: \"1\", memory: 1Gi}\n";
    let req = from_yaml(yaml).expect("valid");
    assert_eq!(req.idempotency_key, "k1");
    assert_eq!(req.gangs[0].wait_time_ms, 30_000);
    assert_eq!(req.gangs[0].members[0].count, 2);
    assert!(req.gangs[0].members[0].pod_json.contains("\"cpu\":\"1\""));
}

#[test]
fn malformed_yaml_names_the_line() {
    let err = from_yaml("name: g\ngangs:\n  - name: [unclosed\n").expect_err("malformed");
    assert!(err.to_string().contains("line 3"), "{err}");
    let err = from_yaml(
        "name: g\ngangs:\n  - name: a\n    minMember: 1\n    colour: red\n    members: []\n",
    )
    .expect_err("unknown field");
    assert!(err.to_string().contains("colour"), "{err}");
    let err = from_yaml(
        "name: g\ngangs:\n  - name: a\n    minMember: 1\n    waitTime: soon\n    members: []\n",
    )
    .expect_err("bad duration");
    assert!(err.to_string().starts_with("gangs[0].waitTime"), "{err}");
}

#[test]
fn builder_builds_the_request() {
    let req = GangGroupBuilder::new("g")
        .idempotency_key("k")
        .gang(GangBuilder::new("ns", "a", 4).members(
            "w",
            4,
            serde_json::json!({"requests": {"cpu": "1"}}),
        ))
        .build();
    assert_eq!(req.gangs[0].min_member, 4);
    assert_eq!(req.gangs[0].mode, "Strict");
}

#[test]
fn a_gang_topology_comes_from_the_file_and_the_builder() {
    let yaml = "name: g\ngangs:\n  - name: w\n    minMember: 8\n    topology:\n      required: example.com/block\n      preferred: example.com/rack\n      slice: {key: example.com/nvlink, size: 4}\n    members:\n      - name: w\n        count: 8\n";
    let req = from_yaml(yaml).expect("valid");
    let want = TopologySpec {
        required: "example.com/block".into(),
        preferred: "example.com/rack".into(),
        slice_key: "example.com/nvlink".into(),
        slice_size: 4,
    };
    assert_eq!(req.gangs[0].topology, Some(want.clone()));
    let built = GangBuilder::new("ns", "w", 8)
        .required_topology("example.com/block")
        .preferred_topology("example.com/rack")
        .topology_slices("example.com/nvlink", 4);
    let req = GangGroupBuilder::new("g").gang(built).build();
    assert_eq!(req.gangs[0].topology, Some(want));
    let err = from_yaml("name: g\ngangs:\n  - name: w\n    minMember: 1\n    topology: {requird: x}\n    members: []\n")
        .expect_err("unknown field");
    assert!(err.to_string().contains("requird"), "{err}");
}

#[test]
fn a_run_limit_is_read_in_whole_seconds_and_a_bad_one_names_the_field() {
    let file = |limit: &str| {
        format!("name: g\nrunLimit: {limit}\ngangs:\n  - name: a\n    minMember: 1\n    members:\n      - name: w\n")
    };
    assert_eq!(
        from_yaml(&file("90s")).expect("valid").run_limit_seconds,
        90
    );
    assert_eq!(
        from_yaml(&file("2h")).expect("valid").run_limit_seconds,
        7_200
    );
    for bad in ["1500ms", "0s", "soon"] {
        let err = from_yaml(&file(bad)).expect_err(bad);
        assert!(err.to_string().starts_with("runLimit"), "{bad}: {err}");
    }
    let built = GangGroupBuilder::new("g")
        .run_limit(std::time::Duration::from_secs(30))
        .build();
    assert_eq!(built.run_limit_seconds, 30);
}

#[test]
fn members_may_stand_for_kubernetes_pods() {
    let yaml = "name: job\ngangs:\n  - name: workers\n    namespace: train\n    minMember: 3\n    members:\n      - name: w\n        count: 2\n        kubernetesPods: {}\n      - kubernetesPods: {names: [chief]}\n        pod: {requests: {cpu: \"2\"}}\n";
    let req = from_yaml(yaml).expect("valid");
    let members = &req.gangs[0].members;
    assert_eq!(members[0].pods.as_ref().map(|p| p.names.len()), Some(0));
    assert_eq!(
        members[1].pods.as_ref().map(|p| p.names.clone()),
        Some(vec!["chief".to_string()])
    );
    let built = GangBuilder::new("train", "workers", 3)
        .kubernetes_pods("w", 2, serde_json::json!({}))
        .kubernetes_pods_named(&["chief"], serde_json::json!({}));
    let req = GangGroupBuilder::new("job").gang(built).build();
    assert!(req.gangs[0].members.iter().all(|m| m.pods.is_some()));
}
