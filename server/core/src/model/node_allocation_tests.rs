//! Unit tests of `node_allocation.rs`.

use super::*;

#[test]
fn allocations_are_bounded_and_errors_name_the_field() {
    let ok = NodeAllocation {
        resource: "vendor.example/gpu".into(),
        device_ids: vec!["DEV-0".into()],
        envs: [("VISIBLE".to_string(), "DEV-0".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(ok.validate(&FieldPath::new("allocation")), Ok(()));
    let none = NodeAllocation {
        device_ids: Vec::new(),
        ..ok.clone()
    };
    let err = none
        .validate(&FieldPath::new("allocation"))
        .expect_err("no device");
    assert!(
        err.to_string().starts_with("allocation.device_ids"),
        "{err}"
    );
    let long = NodeAllocation {
        envs: [("BIG".to_string(), "x".repeat(ALLOCATION_TEXT_MAX + 1))].into(),
        ..ok
    };
    let err = long
        .validate(&FieldPath::new("allocation"))
        .expect_err("too long");
    assert!(err.to_string().starts_with("allocation.envs.BIG"), "{err}");
    let many = NodeAllocation {
        envs: (0..200)
            .map(|i| (format!("K{i}"), "x".repeat(1_000)))
            .collect(),
        ..long
    };
    let err = many
        .validate(&FieldPath::new("allocation"))
        .expect_err("too much in all");
    assert!(
        err.to_string().contains("bytes of text, at most 65536"),
        "{err}"
    );
    assert_eq!(
        driver_for("vendor.example/GPU").as_deref(),
        Some("gpu.vendor.example")
    );
    assert_eq!(device_name("GPU-0000:3b:00.0"), "gpu-0000-3b-00-0");
}

#[test]
fn host_access_is_held_to_its_prefixes() {
    let prefixes: Vec<String> = HOST_PATH_PREFIXES_DEFAULT
        .iter()
        .map(|p| p.to_string())
        .collect();
    let at = FieldPath::new("allocation");
    let base = NodeAllocation {
        resource: "vendor.example/gpu".into(),
        device_ids: vec!["DEV-0".into()],
        envs: [("VENDOR_VISIBLE_DEVICES".to_string(), "0".to_string())].into(),
        mounts: vec![AllocationMount {
            container_path: "/usr/local/vendor".into(),
            host_path: "/usr/lib/vendor".into(),
            read_only: true,
        }],
        devices: vec![AllocationDevice {
            container_path: "/dev/vendor0".into(),
            host_path: "/dev/vendor0".into(),
            permissions: "rw".into(),
        }],
        ..Default::default()
    };
    assert_eq!(base.validate_host_access(&at, &prefixes), Ok(()));
    let refused = |a: NodeAllocation, field: &str| {
        let e = a
            .validate_host_access(&at, &prefixes)
            .expect_err(field)
            .to_string();
        assert!(e.starts_with(field), "{field}: {e}");
    };
    let mut root = base.clone();
    root.mounts[0].host_path = "/".into();
    refused(root, "allocation.mounts[0].host_path");
    let mut up = base.clone();
    up.mounts[0].host_path = "/usr/../etc".into();
    refused(up, "allocation.mounts[0].host_path");
    for sneaky in ["/dev/mem", "/dev//mem", "/dev/./mem", "/dev/mem/"] {
        let mut mem = base.clone();
        mem.devices[0].host_path = sneaky.into();
        mem.devices[0].permissions = "rwm".into();
        refused(mem, "allocation.devices[0].host_path");
    }
    let mut around = base.clone();
    around.mounts[0].host_path = "/usr//../etc".into();
    refused(around, "allocation.mounts[0].host_path");
    let mut perms = base.clone();
    perms.devices[0].permissions = "rwx".into();
    refused(perms, "allocation.devices[0].permissions");
    let mut relative = base.clone();
    relative.mounts[0].container_path = "etc".into();
    refused(relative, "allocation.mounts[0].container_path");
    let mut env = base;
    env.envs.insert("1BAD=".into(), "x".into());
    refused(env, "allocation.envs");
}
