//! Unit tests of `allocation.rs`.

use super::*;
use gangway_core::model::device::{DeviceId, DeviceQuantity, DeviceTaintEffect};

fn device(request: &str, name: &str) -> DeviceAllocation {
    DeviceAllocation {
        claim: "gpu".into(),
        request: request.into(),
        device: DeviceId {
            driver: "gpu.example.com".into(),
            pool: "node-0".into(),
            device: name.into(),
        },
        admin_access: AdminAccess::Disabled,
        tolerations: Vec::new(),
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    }
}

fn opaque(driver: &str, mode: &str) -> Value {
    json!({"opaque": {"driver": driver, "parameters": {"mode": mode}}})
}

fn classes() -> BTreeMap<String, Arc<Value>> {
    [
        (
            "gpu",
            json!({"spec": {"config": [opaque("gpu.example.com", "class-gpu")]}}),
        ),
        (
            "small",
            json!({"spec": {"config": [opaque("gpu.example.com", "class-small-a"),
                                                  opaque("gpu.example.com", "class-small-b")]}}),
        ),
        ("plain", json!({"spec": {}})),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), Arc::new(v)))
    .collect()
}

fn with_classes(
    claim: &Value,
    devices: &[DeviceAllocation],
) -> Result<Vec<Value>, AllocationError> {
    let classes = classes();
    let lookup = move |name: &str| classes.get(name).cloned();
    let refs: Vec<&DeviceAllocation> = devices.iter().collect();
    let a = allocation(
        "node-0",
        claim,
        &lookup,
        &|_| None,
        &|_| SliceReach::Node,
        &refs,
    )?;
    Ok(a["devices"]["config"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

fn claim() -> Value {
    json!({"spec": {"devices": {
    "requests": [
        {"name": "a", "exactly": {"deviceClassName": "gpu"}},
        {"name": "b", "exactly": {"deviceClassName": "gpu", "count": 2}},
        {"name": "c", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu"},
            {"name": "small", "deviceClassName": "small"}]},
        {"name": "d", "exactly": {"deviceClassName": "plain"}},
    ],
    "config": [
        {"opaque": {"driver": "gpu.example.com", "parameters": {"all": true}}},
        {"requests": ["b"], "opaque": {"driver": "gpu.example.com", "parameters": {"b": 1}}},
        {"requests": ["c/big"], "opaque": {"driver": "gpu.example.com", "parameters": {"big": 1}}},
        {"requests": ["c/small"], "opaque": {"driver": "gpu.example.com", "parameters": {"small": 1}}},
        {"requests": ["x", "c"], "opaque": {"driver": "gpu.example.com", "parameters": {"c": 1}}},
    ]}}})
}

#[test]
fn class_configs_come_once_per_class_naming_every_request_it_served() {
    let devices = [
        device("a", "gpu-0"),
        device("b", "gpu-1"),
        device("b", "gpu-2"),
        device("c/small", "gpu-3"),
        device("d", "gpu-4"),
    ];
    let configs = with_classes(&claim(), &devices).expect("classes known");
    let from_class: Vec<&Value> = configs
        .iter()
        .filter(|c| c["source"] == FROM_CLASS)
        .collect();
    assert_eq!(
        from_class,
        vec![
            &json!({"source": "FromClass", "requests": ["a", "b"],
                        "opaque": {"driver": "gpu.example.com", "parameters": {"mode": "class-gpu"}}}),
            &json!({"source": "FromClass", "requests": ["c/small"],
                        "opaque": {"driver": "gpu.example.com", "parameters": {"mode": "class-small-a"}}}),
            &json!({"source": "FromClass", "requests": ["c/small"],
                        "opaque": {"driver": "gpu.example.com", "parameters": {"mode": "class-small-b"}}}),
        ]
    );
}

#[test]
fn claim_configs_apply_to_all_to_allocated_requests_and_to_the_chosen_sub_request() {
    let devices = [device("a", "gpu-0"), device("c/small", "gpu-3")];
    let configs = with_classes(&claim(), &devices).expect("classes known");
    let from_claim: Vec<&Value> = configs
        .iter()
        .filter(|c| c["source"] == FROM_CLAIM)
        .map(|c| &c["opaque"]["parameters"])
        .collect();
    // "b" was not allocated, "c/big" not chosen; "x" names nothing but "c" does.
    assert_eq!(
        from_claim,
        vec![
            &json!({"all": true}),
            &json!({"small": 1}),
            &json!({"c": 1})
        ]
    );
    let all = configs
        .iter()
        .find(|c| c["opaque"]["parameters"] == json!({"all": true}))
        .expect("config for all");
    assert!(
        all.get("requests").is_none(),
        "a config for all requests names none: {all}"
    );
    let c = configs
        .iter()
        .find(|c| c["opaque"]["parameters"] == json!({"c": 1}))
        .expect("config naming c");
    assert_eq!(c["requests"], json!(["x", "c"]), "names kept as written");
}

#[test]
fn a_missing_class_is_an_error_naming_request_and_class() {
    let claim = json!({"spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "gone"}}]}}});
    assert_eq!(
        with_classes(&claim, &[device("a", "gpu-0")]),
        Err(AllocationError::ClassMissing {
            request: "a".into(),
            class: "gone".into()
        })
    );
}

#[test]
fn results_carry_admin_access_tolerations_share_and_consumed_capacity() {
    let mut d = device("a", "gpu-0");
    d.admin_access = AdminAccess::Enabled;
    d.tolerations = vec![
        DeviceToleration {
            key: "example.com/ecc".into(),
            operator: TolerationOperator::Equal,
            value: "bad".into(),
            effect: Some(DeviceTaintEffect::NoExecute),
            toleration_seconds: Some(30),
        },
        DeviceToleration {
            key: String::new(),
            operator: TolerationOperator::Exists,
            value: String::new(),
            effect: None,
            toleration_seconds: None,
        },
    ];
    d.share_id = Some("6f1c0a7e".into());
    d.consumed_capacity
        .insert("memory".into(), DeviceQuantity::from_units(4));
    let claim = json!({"spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "plain"}}]}}});
    let classes = classes();
    let lookup = move |name: &str| classes.get(name).cloned();
    let a = allocation(
        "node-7",
        &claim,
        &lookup,
        &|_| None,
        &|_| SliceReach::Node,
        &[&d],
    )
    .expect("allocation");
    assert_eq!(
        a["devices"]["results"][0],
        json!({"request": "a", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0",
                   "adminAccess": true,
                   "tolerations": [
                       {"key": "example.com/ecc", "operator": "Equal", "value": "bad",
                        "effect": "NoExecute", "tolerationSeconds": 30},
                       {"operator": "Exists"}],
                   "shareID": "6f1c0a7e",
                   "consumedCapacity": {"memory": "4"}})
    );
    assert_eq!(
        a["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["node-7"])
    );
    assert_eq!(a["devices"]["config"], json!([]));
}

#[test]
fn binding_waits_for_every_condition_and_fails_on_any_failure_condition() {
    let claim = json!({"spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "plain", "count": 2}}]}}});
    let classes = classes();
    let lookup = move |name: &str| classes.get(name).cloned();
    let published = |id: &DeviceId| {
        (id.device == "gpu-0").then(|| {
            json!({"name": "gpu-0", "bindingConditions": ["attached", "ready"],
                       "bindingFailureConditions": ["failed"]})
        })
    };
    let (d0, d1) = (device("a", "gpu-0"), device("a", "gpu-1"));
    let a = allocation(
        "node-0",
        &claim,
        &lookup,
        &published,
        &|_| SliceReach::Node,
        &[&d0, &d1],
    )
    .expect("ok");
    let results = &a["devices"]["results"];
    assert_eq!(
        results[0]["bindingConditions"],
        json!(["attached", "ready"])
    );
    assert_eq!(results[0]["bindingFailureConditions"], json!(["failed"]));
    assert!(results[1].get("bindingConditions").is_none());
    let with = |conditions: Value| {
        let mut c = claim.clone();
        c["status"]["devices"] = json!([{"driver": "gpu.example.com", "pool": "node-0",
                                             "device": "gpu-0", "conditions": conditions}]);
        binding_state(&a, &c)
    };
    let id = "gpu.example.com/node-0/gpu-0".to_string();
    assert_eq!(
        binding_state(&a, &claim),
        BindingState::Waiting {
            device: id.clone(),
            condition: "attached".into()
        }
    );
    assert_eq!(
        with(json!([{"type": "attached", "status": "True"}, {"type": "ready", "status": "False"}])),
        BindingState::Waiting {
            device: id.clone(),
            condition: "ready".into()
        }
    );
    assert_eq!(
        with(json!([{"type": "attached", "status": "True"}, {"type": "ready", "status": "True"}])),
        BindingState::Ready
    );
    assert_eq!(
        with(
            json!([{"type": "attached", "status": "True"}, {"type": "ready", "status": "True"},
                        {"type": "failed", "status": "True"}])
        ),
        BindingState::Failed {
            device: id,
            condition: "failed".into()
        }
    );
    let plain = allocation(
        "node-0",
        &claim,
        &lookup,
        &|_| None,
        &|_| SliceReach::Node,
        &[&d1],
    )
    .expect("ok");
    assert_eq!(binding_state(&plain, &claim), BindingState::Ready);
}

#[test]
fn equal_inputs_give_equal_json() {
    let devices = [device("a", "gpu-0"), device("b", "gpu-1")];
    assert_eq!(
        with_classes(&claim(), &devices),
        with_classes(&claim(), &devices)
    );
}
