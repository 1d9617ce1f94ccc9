//! Unit tests of `devices.rs`.

use gangway_proto::v1::PluginDevice;

use super::*;

fn report(node: &str, resource: &str, ids: &[(&str, WireHealth)]) -> DeviceListReport {
    DeviceListReport {
        node: node.to_string(),
        resource_name: resource.to_string(),
        devices: ids
            .iter()
            .map(|(id, health)| PluginDevice {
                id: (*id).to_string(),
                health: *health as i32,
                numa_nodes: vec![1],
            })
            .collect(),
    }
}

#[test]
fn a_report_becomes_a_pool_a_class_and_health() {
    let r = report(
        "n1",
        "nvidia.com/gpu",
        &[
            ("GPU-0a1B", WireHealth::Healthy),
            ("GPU_7", WireHealth::Unhealthy),
        ],
    );
    let pool = validate_report(&r).expect("valid");
    assert_eq!(pool.driver, "gpu.nvidia.com");
    assert_eq!(pool.pool(), "n1");
    let names: Vec<&str> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0a1b", "gpu-7"]);
    assert_eq!(
        pool.devices[0].attributes.get(DEVICE_ID_ATTRIBUTE),
        Some(&AttributeValue::String("GPU-0a1B".into()))
    );
    assert_eq!(
        pool.devices[0].attributes.get(NUMA_NODE_ATTRIBUTE),
        Some(&AttributeValue::Int(1))
    );
    assert_eq!(pool.health_counts(), (1, 1));
    assert_eq!(
        pool.health[1].device,
        DeviceId::new("gpu.nvidia.com", "n1", "gpu-7")
    );
    let class = pool.class();
    assert_eq!(
        class.extended_resource_name.as_deref(),
        Some("nvidia.com/gpu")
    );
    class
        .validate(&FieldPath::root())
        .expect("the class is valid");
    gangway_core::model::device::validate_pool(
        &FieldPath::root(),
        &pool.driver,
        pool.pool(),
        &pool.devices,
        &[],
    )
    .expect("the pool is valid");
}

#[test]
fn bad_reports_name_the_field() {
    let cases = [
        (report("", "nvidia.com/gpu", &[]), "node: must not be empty"),
        (
            report("n1", "gpu", &[]),
            "resource_name: \"gpu\" is not an extended resource name",
        ),
        (report("n1", "kubernetes.io/gpu", &[]), "resource_name:"),
        (
            report("n1", "nvidia.com/gpu", &[("--", WireHealth::Healthy)]),
            "devices[0].id: \"--\" must have 1 to 63",
        ),
        (
            report(
                "n1",
                "nvidia.com/gpu",
                &[("a_1", WireHealth::Healthy), ("A-1", WireHealth::Healthy)],
            ),
            "devices[1].id: \"A-1\" names the same device",
        ),
        (
            report("n1", "nvidia.com/gpu", &[("a", WireHealth::Unspecified)]),
            "devices[0].health: must be HEALTHY or UNHEALTHY",
        ),
    ];
    for (r, expected) in cases {
        let err = validate_report(&r).expect_err(expected);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{expected}");
        assert!(
            err.message().starts_with(expected),
            "{} vs {expected}",
            err.message()
        );
    }
}
