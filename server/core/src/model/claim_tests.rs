//! Unit tests of `claim.rs`.

use super::*;

fn claim(json: &str) -> Result<PodClaim, String> {
    let raw: RawPodClaim = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let path = FieldPath::new("claims").index(0);
    let claim = raw.convert(&path).map_err(|e| e.to_string())?;
    claim.validate(&path).map_err(|e| e.to_string())?;
    Ok(claim)
}

#[test]
fn claims_convert() {
    let c = claim(
            r#"{"name": "gpus", "requests": [
                 {"name": "big", "exactly": {"deviceClassName": "gpu.example.com", "count": 2,
                    "selectors": [{"cel": {"expression": "device.capacity['gpu.example.com'].memory.isGreaterThan(quantity('16Gi'))"}}],
                    "tolerations": [{"key": "example.com/maint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]}},
                 {"name": "any", "firstAvailable": [
                    {"name": "a100", "deviceClassName": "gpu.example.com"},
                    {"name": "t4", "deviceClassName": "gpu.example.com", "allocationMode": "All"}]},
                 {"name": "nic", "exactly": {"deviceClassName": "nic.example.com", "capacity": {"requests": {"bandwidth": "10G"}}}}],
               "constraints": [{"requests": ["big", "any"], "matchAttribute": "gpu.example.com/numa"}],
               "config": [{"requests": ["big"], "opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}}}]}"#,
        )
        .expect("valid");
    assert_eq!(c.requests.len(), 3);
    let RequestSpec::FirstAvailable(subs) = &c.requests[1].spec else {
        panic!("firstAvailable");
    };
    assert_eq!(subs[1].exact.allocation_mode, AllocationMode::All);
    let RequestSpec::Exactly(exact) = &c.requests[0].spec else {
        panic!("exactly");
    };
    assert_eq!(exact.allocation_mode, AllocationMode::ExactCount(2));
}

#[test]
fn bad_claims_name_the_field() {
    let cases = [
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g", "count": 0}}]}"#,
            "claims[0].requests[0].exactly.count: count 0 out of range 1..=32",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g", "count": 33}}]}"#,
            "claims[0].requests[0].exactly.count: count 33 out of range",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g", "count": 20}}, {"name": "s", "exactly": {"deviceClassName": "g", "count": 20}}]}"#,
            "claims[0].requests: the requests ask for 40 devices",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g", "selectors": [{"cel": {"expression": "device.driver"}}]}}]}"#,
            "claims[0].requests[0].exactly.selectors[0].cel.expression: must evaluate to bool",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g", "selectors": [{"cel": {"expression": "device.driver =="}}]}}]}"#,
            "claims[0].requests[0].exactly.selectors[0].cel.expression: compilation failed",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g"}}], "constraints": [{"requests": ["x"], "matchAttribute": "a.b/c"}]}"#,
            "claims[0].constraints[0].requests[0]: request \"x\" is not in the claim",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g"}}, {"name": "r", "exactly": {"deviceClassName": "g"}}]}"#,
            "claims[0].requests[1].name: duplicate request name",
        ),
        (
            r#"{"name": "c", "requests": [{"name": "r", "exactly": {"deviceClassName": "g", "allocationMode": "Some"}}]}"#,
            "claims[0].requests[0].exactly.allocationMode: unknown allocation mode",
        ),
    ];
    for (json, want) in cases {
        let err = claim(json).expect_err(json);
        assert!(err.starts_with(want), "got {err}\nwant {want}");
    }
}

#[test]
fn unknown_classes_name_the_field() {
    let c = claim(
            r#"{"name": "c", "requests": [{"name": "r", "firstAvailable": [{"name": "a", "deviceClassName": "known"}, {"name": "b", "deviceClassName": "unknown"}]}]}"#,
        )
        .expect("valid");
    let mut classes = BTreeMap::new();
    classes.insert(
        "known".to_string(),
        DeviceClass {
            name: "known".into(),
            selectors: vec![],
            config: vec![],
            extended_resource_name: None,
        },
    );
    let err = c
        .check_classes(&FieldPath::new("claims").index(0), &classes)
        .expect_err("unknown");
    assert_eq!(
            err.to_string(),
            "claims[0].requests[0].firstAvailable[1].deviceClassName: device class \"unknown\" not found"
        );
}
