//! Unit tests of `mod.rs` (agent).

use super::*;

fn args() -> AgentArgs {
    AgentArgs {
        servers: vec!["127.0.0.1:1".into()],
        node: Some("n1".into()),
        cpu: Some("8".into()),
        memory: None,
        pods: "110".into(),
        labels: vec!["zone=a".into()],
        taints: vec!["gpu=true:NoSchedule".into(), "spot:PreferNoSchedule".into()],
        device_plugin_dir: PathBuf::from(DEVICE_PLUGIN_DIR),
        lease_ms: 40_000,
        http: None,
        tls_ca: None,
        tls_cert: None,
        tls_key: None,
        token: None,
    }
}

#[test]
fn the_node_comes_from_flags_and_the_host() {
    let spec = node_spec(&args()).expect("spec");
    assert_eq!(spec.allocatable.get("cpu").map(String::as_str), Some("8"));
    let memory: u64 = spec.allocatable["memory"].parse().expect("bytes");
    assert!(memory > 0, "MemTotal read from the host");
    assert_eq!(spec.labels.get("zone").map(String::as_str), Some("a"));
    assert_eq!(
        (
            spec.taints[1].key.as_str(),
            spec.taints[1].value.as_str(),
            spec.taints[1].effect.as_str()
        ),
        ("spot", "", "PreferNoSchedule")
    );
    let bad = AgentArgs {
        labels: vec!["novalue".into()],
        ..args()
    };
    let err = node_spec(&bad).expect_err("bad label");
    assert!(err.to_string().contains("--label \"novalue\""), "{err}");
}
