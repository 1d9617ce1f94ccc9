//! Unit tests of `pod.rs`.

use super::*;

fn parse(json: &str) -> Result<PodSpec, String> {
    let raw: RawPodSpec = serde_json::from_str(json).map_err(|e| e.to_string())?;
    raw.validate(&FieldPath::new("spec"))
        .map_err(|e| e.to_string())
}

#[test]
fn a_misspelt_field_is_refused_by_name() {
    let err = parse(r#"{"requestz": {"cpu": "1"}}"#).expect_err("unknown field");
    assert!(err.contains("unknown field `requestz`"), "{err}");
    let err = parse(r#"{"affinity": {"nodeAfinity": {}}}"#).expect_err("nested");
    assert!(err.contains("unknown field `nodeAfinity`"), "{err}");
}

#[test]
fn full_spec_converts() {
    let spec = parse(
            r#"{
              "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1},
              "nodeSelector": {"pool": "gpu"},
              "affinity": {
                "nodeAffinity": {
                  "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]}
                  ]},
                  "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}}
                  ]
                },
                "podAntiAffinity": {
                  "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
                  ]
                }
              },
              "tolerations": [{"operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 60}],
              "hostPorts": [{"port": 8080}, {"port": 8080, "protocol": "UDP"}],
              "priority": 1000,
              "labels": {"app": "db"}
            }"#,
        )
        .expect("valid");
    assert_eq!(spec.requests.cpu_milli, 500);
    assert_eq!(spec.tolerations[0].operator, TolerationOperator::Exists);
    assert_eq!(spec.tolerations[1].effect, Some(TaintEffect::NoExecute));
    assert_eq!(spec.host_ports[1].protocol, Protocol::Udp);
    assert_eq!(spec.pod_anti_affinity.required.len(), 1);
    let summary = PodSummary::from_spec(&spec);
    assert_eq!(summary.footprint().pods, 1);
    assert_eq!(summary.anti_affinity.len(), 1);
}

#[test]
fn bad_specs_name_the_field() {
    let cases = [
            (
                r#"{"requests": {"cpu": "-1"}}"#,
                "spec.requests.cpu: invalid quantity \"-1\"",
            ),
            (
                r#"{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Near", "values": ["1"]}]}]}}}}"#,
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: unknown operator \"Near\"",
            ),
            (
                r#"{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["x"]}]}]}}}}"#,
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]: invalid value \"x\"",
            ),
            (
                r#"{"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]}}}}"#,
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values: In and NotIn need",
            ),
            (
                r#"{"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}}}"#,
                "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: weight 0 out of range",
            ),
            (
                r#"{"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "topologyKey": "zone"}]}}}"#,
                "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator: unknown operator \"Gt\"",
            ),
            (
                r#"{"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}}}"#,
                "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: must not be empty",
            ),
            (
                r#"{"tolerations": [{"value": "x"}]}"#,
                "spec.tolerations[0].operator: an empty key needs operator Exists",
            ),
            (
                r#"{"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}"#,
                "spec.tolerations[0].value: must be empty",
            ),
            (
                r#"{"tolerations": [{"key": "a", "operator": "Like"}]}"#,
                "spec.tolerations[0].operator: unknown operator \"Like\"",
            ),
            (
                r#"{"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]}"#,
                "spec.tolerations[0].tolerationSeconds: only allowed with effect NoExecute",
            ),
            (r#"{"hostPorts": [{"port": 70000}]}"#, "spec.hostPorts[0].port: port 70000 out of range"),
            (
                r#"{"hostPorts": [{"port": 80}, {"port": 80, "protocol": "TCP"}]}"#,
                "spec.hostPorts[1]: duplicate host port 80/TCP",
            ),
            (r#"{"hostPorts": [{"port": 80, "protocol": "QUIC"}]}"#, "spec.hostPorts[0].protocol: unknown protocol"),
            (r#"{"requests": {"pods": 1}}"#, "spec.requests.pods: pods cannot be requested"),
        ];
    for (json, expected) in cases {
        let err = parse(json).expect_err(json);
        assert!(err.starts_with(expected), "got {err}\nwant {expected}");
    }
}

#[test]
fn lists_are_bounded_before_anything_is_done_with_them() {
    let spec = |json: serde_json::Value| {
        let at = FieldPath::new("spec");
        let parsed = serde_json::from_value::<RawPodSpec>(json)
            .expect("parses")
            .validate(&at)
            .expect("valid: the bounds are checked apart");
        parsed.within_bounds(&at)
    };
    let ports: Vec<_> = (1..=HOST_PORTS_MAX as u16 + 1)
        .map(|p| serde_json::json!({"port": p}))
        .collect();
    let e = spec(serde_json::json!({"hostPorts": ports})).expect_err("too many ports");
    assert!(
        e.to_string()
            .starts_with("spec.hostPorts: 129 entries, at most 128"),
        "{e}"
    );
    let labels: serde_json::Map<_, _> = (0..=POD_LABELS_MAX)
        .map(|i| (format!("l{i}"), serde_json::json!("v")))
        .collect();
    let e = spec(serde_json::json!({"labels": labels})).expect_err("too many labels");
    assert!(e.to_string().starts_with("spec.labels: 257 entries"), "{e}");
    let tolerations: Vec<_> = (0..=TOLERATIONS_MAX)
        .map(|i| serde_json::json!({"key": format!("k{i}"), "operator": "Exists"}))
        .collect();
    let e = spec(serde_json::json!({"tolerations": tolerations})).expect_err("tolerations");
    assert!(
        e.to_string().starts_with("spec.tolerations: 129 entries"),
        "{e}"
    );
    let many: Vec<String> = (0..=MATCH_VALUES_MAX).map(|i| format!("v{i}")).collect();
    let affinity = serde_json::json!({"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": many}]}]}}});
    let e = spec(serde_json::json!({"affinity": affinity})).expect_err("values");
    assert!(
        e.to_string()
            .contains("matchExpressions[0].values: 257 entries"),
        "{e}"
    );
}
