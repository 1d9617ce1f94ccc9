//! Unit tests of `device.rs`.

use super::*;

fn q(s: &str) -> DeviceQuantity {
    DeviceQuantity::parse(s).expect(s)
}

#[test]
fn quantities_round_trip_and_order_exactly() {
    for text in ["40Gi", "1500m", "7n", "5u", "0", "1e3"] {
        let parsed = q(text);
        assert_eq!(q(&parsed.to_string()), parsed, "{text}");
    }
    assert!(q("1Gi") > q("1G"));
    assert_eq!(q("1"), q("1000m"));
    assert!(DeviceQuantity::parse("-1").is_err());
    let json = serde_json::to_string(&q("1.5")).expect("encodes");
    assert_eq!(json, "\"1500m\"");
}

#[test]
fn request_policies_round_up_and_refuse() {
    let range = DeviceCapacity {
        value: q("40Gi"),
        request_policy: Some(Box::new(CapacityRequestPolicy {
            default: Some(q("1Gi")),
            valid: CapacityValidity::Range {
                min: q("1Gi"),
                max: Some(q("20Gi")),
                step: Some(q("1Gi")),
            },
        })),
    };
    assert_eq!(range.consumed_by(None), Some(q("1Gi")));
    assert_eq!(range.consumed_by(Some(q("100Mi"))), Some(q("1Gi")));
    assert_eq!(range.consumed_by(Some(q("1.5Gi"))), Some(q("2Gi")));
    assert_eq!(range.consumed_by(Some(q("21Gi"))), None);
    let values = DeviceCapacity {
        value: q("8"),
        request_policy: Some(Box::new(CapacityRequestPolicy {
            default: None,
            valid: CapacityValidity::Values(vec![q("1"), q("2"), q("4")]),
        })),
    };
    assert_eq!(values.consumed_by(Some(q("3"))), Some(q("4")));
    assert_eq!(values.consumed_by(Some(q("5"))), None);
    assert_eq!(
        values.consumed_by(None),
        Some(q("8")),
        "no default: everything"
    );
    assert_eq!(
        DeviceCapacity::fixed(q("8")).consumed_by(Some(q("3"))),
        Some(q("3"))
    );
}

/// List attributes as the API writes them (`strings`, `ints`, `bools`, `versions`):
/// decoded, kept as sets for constraints, and refused when empty, too long, not
/// semver, or past the per-device value budget, naming the field.
#[test]
fn list_attributes_decode_validate_and_compare_as_sets() {
    let json = r#"{
          "driver": "gpu.example.com",
          "pool": {"name": "node-1", "generation": 1},
          "devices": [{"name": "cpu-0", "attributes": {
            "pcieRoots": {"strings": ["pci0000:00", "pci0000:40"]},
            "numaNodes": {"ints": [0, 1]},
            "smt": {"bools": [true]},
            "firmware": {"versions": ["1.2.3"]},
            "model": {"string": "epyc"}}}]
        }"#;
    let raw: RawResourcePool = serde_json::from_str(json).expect("decodes");
    let pool = raw.validate().expect("valid");
    let attrs = &pool.devices[0].attributes;
    let roots = &attrs["pcieRoots"];
    assert_eq!(
        roots,
        &AttributeValue::Strings(vec!["pci0000:00".into(), "pci0000:40".into()].into())
    );
    assert_eq!(roots.value_count(), 2);
    let scalar = AttributeValue::String("pci0000:40".into());
    assert!(roots.overlaps(&scalar) && scalar.overlaps(roots));
    assert!(!roots.overlaps(&AttributeValue::String("pci0000:80".into())));
    assert!(!attrs["numaNodes"].overlaps(&AttributeValue::Strings(vec!["0".into()].into())));
    assert!(attrs["numaNodes"].holds(AttributeItem::Int(1)));

    let bad = |value: AttributeValue| {
        let mut p = pool.clone();
        p.devices[0].attributes.insert("x".into(), value);
        p.validate(&FieldPath::new("pool"))
            .expect_err("invalid")
            .to_string()
    };
    let empty = bad(AttributeValue::Ints(Vec::new().into()));
    assert!(
        empty.starts_with("pool.devices[0].attributes.x.ints"),
        "{empty}"
    );
    let long = bad(AttributeValue::Strings(
        vec!["a".into(), "b".repeat(65)].into(),
    ));
    assert!(
        long.starts_with("pool.devices[0].attributes.x.strings[1]"),
        "{long}"
    );
    let version = bad(AttributeValue::Versions(vec!["1.2".into()].into()));
    assert!(
        version.starts_with("pool.devices[0].attributes.x.versions[0]"),
        "{version}"
    );
    let many = bad(AttributeValue::Ints((0..44).collect()));
    assert!(
        many.starts_with("pool.devices[0].attributes: at most 48 attribute values"),
        "{many}"
    );
}

#[test]
fn raw_pool_converts_and_bad_pools_name_the_field() {
    let json = r#"{
          "driver": "gpu.example.com",
          "pool": {"name": "node-1", "generation": 2},
          "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}],
          "devices": [
            {"name": "gpu-0-mig-1", "attributes": {"model": {"string": "a100"}, "driverVersion": {"version": "535.1.0"}},
             "capacity": {"memory": {"value": "10Gi"}},
             "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}],
             "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]},
            {"name": "nic-0", "allowMultipleAllocations": true,
             "capacity": {"bandwidth": {"value": "100G", "requestPolicy": {"default": "1G", "validRange": {"min": "1G", "step": "1G"}}}}}
          ]
        }"#;
    let raw: RawResourcePool = serde_json::from_str(json).expect("decodes");
    let pool = raw.validate().expect("valid");
    assert_eq!(pool.devices.len(), 2);
    assert_eq!(pool.devices[1].sharing, AllocationSharing::Shared);
    assert_eq!(pool.generation, 2);

    let bad = |edit: &dyn Fn(&mut ResourcePool)| {
        let mut p = pool.clone();
        edit(&mut p);
        p.validate(&FieldPath::new("pool"))
            .expect_err("invalid")
            .to_string()
    };
    let dup = bad(&|p| p.devices[1].name = "gpu-0-mig-1".into());
    assert!(
        dup.starts_with("pool.devices[1].name: duplicate device name"),
        "{dup}"
    );
    let set = bad(&|p| p.devices[0].consumes_counters[0].counter_set = "nope".into());
    assert!(
        set.starts_with("pool.devices[0].consumesCounters[0].counterSet"),
        "{set}"
    );
    let version = bad(&|p| {
        p.devices[0]
            .attributes
            .insert("v".into(), AttributeValue::Version("1.2".into()));
    });
    assert!(
        version.starts_with("pool.devices[0].attributes.v.version"),
        "{version}"
    );
    let name = bad(&|p| {
        p.devices[0]
            .attributes
            .insert("bad-name".into(), AttributeValue::Int(1));
    });
    assert!(
        name.starts_with("pool.devices[0].attributes.bad-name"),
        "{name}"
    );
    let driver = bad(&|p| p.driver = "Bad_Driver".into());
    assert!(driver.starts_with("pool.driver"), "{driver}");
}

#[test]
fn classes_check_their_selectors() {
    let raw: RawDeviceClass = serde_json::from_str(
            r#"{"name": "gpu.example.com", "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}],
                "config": [{"opaque": {"driver": "gpu.example.com", "parameters": {"b": 1, "a": 2}}}],
                "extendedResourceName": "example.com/gpu"}}"#,
        )
        .expect("decodes");
    let class = raw.validate().expect("valid");
    assert_eq!(class.config[0].parameters, r#"{"a":2,"b":1}"#);
    let mut bad = raw.clone();
    bad.spec.selectors[0].cel.expression = "device.driver".into();
    let err = bad.validate().expect_err("not bool").to_string();
    assert!(
        err.starts_with("spec.selectors[0].cel.expression: must evaluate to bool"),
        "{err}"
    );
    bad.spec.selectors[0].cel.expression = "device.driver ==".into();
    let err = bad.validate().expect_err("does not compile").to_string();
    assert!(
        err.starts_with("spec.selectors[0].cel.expression: compilation failed"),
        "{err}"
    );
}
