//! Unit tests of `objects.rs`.

use super::*;

#[test]
fn a_pool_spanning_slices_is_merged_once_all_are_there() {
    let slice = |name: &str, generation: u64, count: u64, device: &str| {
        (
            name.to_string(),
            std::sync::Arc::new(
                json!({"spec": {"nodeName": "n1", "driver": "d", "devices": [{"name": device}],
                                "pool": {"name": "p", "generation": generation, "resourceSliceCount": count}}}),
            ),
        )
    };
    let unknown = |_: &(String, String, String), _: u64| false;
    let partial = node_pools(
        vec![slice("a", 2, 2, "gpu-0"), slice("old", 1, 1, "gpu-9")],
        unknown,
    );
    assert_eq!(
        partial,
        vec![PoolSlices::Incomplete {
            names: vec!["a".into()],
            want: 2
        }]
    );
    let slices = vec![
        slice("b", 2, 2, "gpu-1"),
        slice("a", 2, 2, "gpu-0"),
        slice("old", 1, 1, "gpu-9"),
    ];
    let known_at_2 = |_: &(String, String, String), generation: u64| generation == 2;
    assert_eq!(
        node_pools(slices.clone(), known_at_2),
        vec![],
        "known: nothing to merge"
    );
    let whole = node_pools(slices, unknown);
    let [PoolSlices::Complete { names, merged }] = whole.as_slice() else {
        panic!("{whole:?}")
    };
    assert_eq!(names, &["a".to_string(), "b".to_string()]);
    let (node, pool) = slice_of(merged);
    assert_eq!((node.as_str(), pool.generation), ("n1", 2));
    let devices: Vec<&str> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(devices, vec!["gpu-0", "gpu-1"]);
}

fn slice_of(object: &Value) -> (String, ResourcePool) {
    match slice(object) {
        Ok(Some((SliceScope::Node(node), pool))) => (node, pool),
        other => panic!("{other:?}"),
    }
}

#[test]
fn node_reads_allocatable_taints_and_readiness() {
    let n = node(&json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("node");
    assert_eq!(n.name, "n1");
    assert_eq!(n.readiness, gangway_core::model::Readiness::Ready);
    assert_eq!(n.taints.len(), 1);
    assert_eq!(
        n.allocatable.get(&gangway_core::model::ResourceName::Cpu),
        8000
    );
}

#[test]
fn node_without_ready_condition_is_not_ready() {
    let n = node(&json!({"metadata": {"name": "n1"}, "status": {"allocatable": {"pods": "10"}}}))
        .expect("node");
    assert_eq!(n.readiness, gangway_core::model::Readiness::NotReady);
}

#[test]
fn slice_becomes_the_pool_of_its_node() {
    let (scope, pool) = slice(&json!({
        "metadata": {"name": "n1-gpu"},
        "spec": {"driver": "gpu.example.com", "nodeName": "n1",
                 "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "a100"}}}]}
    }))
    .expect("valid")
    .expect("node-local");
    assert_eq!(
        (scope, pool.generation, pool.devices.len()),
        (SliceScope::Node("n1".into()), 3, 1)
    );
    let (scope, _) = slice(
        &json!({"spec": {"driver": "d", "allNodes": true, "pool": {"name": "p", "generation": 1}}}),
    )
    .expect("valid")
    .expect("network-attached");
    assert_eq!(scope, SliceScope::Network(PoolReach::AllNodes));
    assert!(
        slice(&json!({"spec": {"driver": "d", "pool": {"name": "p", "generation": 1}}}))
            .expect("valid")
            .is_none(),
        "a slice that says nothing of its nodes"
    );
}

#[test]
fn a_slice_choosing_nodes_per_device_gives_each_device_its_reach() {
    let per_device = |devices: Value| {
        slice(
            &json!({"spec": {"driver": "d", "perDeviceNodeSelection": true,
                                   "pool": {"name": "p", "generation": 1}, "devices": devices}}),
        )
    };
    let (scope, pool) = per_device(json!([
        {"name": "on-n1", "nodeName": "n1"},
        {"name": "rack-1", "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "rack", "operator": "In", "values": ["r1"]}]}]}},
        {"name": "anywhere", "allNodes": true}
    ]))
    .expect("valid")
    .expect("network-attached");
    assert_eq!(scope, SliceScope::Network(PoolReach::PerDevice));
    assert_eq!(
        pool_key(
            &json!({"spec": {"driver": "d", "perDeviceNodeSelection": true,
            "pool": {"name": "p"}}})
        ),
        Some((String::new(), "d".into(), "p".into()))
    );
    let mut n1 = gangway_core::model::Node::new("n1", gangway_core::model::Resources::zero());
    n1.labels.insert("rack".into(), "r2".into());
    let mut n2 = gangway_core::model::Node::new("n2", gangway_core::model::Resources::zero());
    n2.labels.insert("rack".into(), "r1".into());
    let reached = |node: &gangway_core::model::Node| -> Vec<&str> {
        (pool.devices.iter())
            .filter(|d| PoolReach::PerDevice.admits_device(d, node))
            .map(|d| d.name.as_str())
            .collect()
    };
    assert_eq!(reached(&n1), vec!["on-n1", "anywhere"]);
    assert_eq!(reached(&n2), vec!["rack-1", "anywhere"]);
    for (devices, field) in [
        (json!([{"name": "none"}]), "spec.devices[0]"),
        (
            json!([{"name": "ok", "allNodes": true}, {"name": "two", "nodeName": "n1", "allNodes": true}]),
            "spec.devices[1]",
        ),
        (
            json!([{"name": "bad", "nodeSelector": {"nodeSelectorTerms": []}}]),
            "spec.devices[0].nodeSelector.nodeSelectorTerms",
        ),
    ] {
        let e = per_device(devices).expect_err("invalid").to_string();
        assert!(e.starts_with(&format!("{field}:")), "{e}");
    }
}

#[test]
fn a_network_slice_reaches_the_nodes_of_its_one_selector_term() {
    let selected = |selector: Value| {
        slice(&json!({"spec": {"driver": "d", "nodeSelector": selector,
                                   "pool": {"name": "p", "generation": 1}}}))
    };
    let (scope, _) = selected(json!({"nodeSelectorTerms": [{
        "matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}],
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]
    }]}))
    .expect("valid")
    .expect("network-attached");
    let SliceScope::Network(reach) = scope else {
        panic!("{scope:?}")
    };
    let mut n1 = gangway_core::model::Node::new("n1", gangway_core::model::Resources::zero());
    n1.labels.insert("rack".into(), "r1".into());
    assert!(reach.admits(&n1));
    let mut n9 = n1.clone();
    n9.name = "n9".into();
    assert!(!reach.admits(&n9));
    assert_eq!(
        selected(json!({"nodeSelectorTerms": [{}, {}]}))
            .expect_err("two terms")
            .to_string(),
        "spec.nodeSelector.nodeSelectorTerms: must have exactly one term, not 2"
    );
    assert!(selected(json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "rack", "operator": "Near", "values": ["r1"]}]}]}))
    .expect_err("bad operator")
    .to_string()
    .starts_with("spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"));
}

#[test]
fn pod_requests_sum_containers_and_cover_init_containers() {
    let pod = json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "containers": [{"resources": {"requests": {"cpu": "500m"}}}, {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]
        }
    });
    let (spec, _) = pod_spec(&pod, &ClaimIndex::new()).expect("spec");
    assert_eq!(
        spec.requests.get(&gangway_core::model::ResourceName::Cpu),
        2000
    );
}

#[test]
fn claims_wait_for_their_objects_then_convert() {
    let pod = json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}
    });
    let waiting = pod_spec(&pod, &ClaimIndex::new()).expect_err("no status yet");
    assert!(matches!(waiting, PodProblem::Waiting(_)), "{waiting}");
    let mut pod = pod;
    pod["status"]["resourceClaimStatuses"] =
        json!([{"name": "gpu", "resourceClaimName": "p-gpu-x"}]);
    let missing = pod_spec(&pod, &ClaimIndex::new()).expect_err("no claim yet");
    assert!(matches!(missing, PodProblem::Waiting(_)), "{missing}");
    let claims = ClaimIndex::from([(
        ("ns".to_string(), "p-gpu-x".to_string()),
        std::sync::Arc::new(
            json!({"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}),
        ),
    )]);
    let (spec, names) = pod_spec(&pod, &claims).expect("spec");
    assert_eq!(spec.claims.len(), 1);
    assert_eq!(names.get("gpu").map(String::as_str), Some("p-gpu-x"));
}

fn sharing_pod(name: &str, uid: &str, claim: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"containers": [], "nodeName": "n1",
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}
    })
}

fn allocated_claim(consumers: &[(&str, &str)]) -> Value {
    let reserved: Vec<Value> = consumers
        .iter()
        .map(|(name, uid)| json!({"resource": "pods", "name": name, "uid": uid}))
        .collect();
    json!({"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "c"}}]}},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "g", "driver": "d", "pool": "n1", "device": "gpu-0"}]}},
                          "reservedFor": reserved}})
}

fn sharer(name: &str, uid: &str, gang: Option<&str>, placed: bool) -> Sharer {
    Sharer {
        name: name.into(),
        uid: uid.into(),
        ours: true,
        gang: gang.map(str::to_string),
        placed,
        going: false,
    }
}

#[test]
fn pods_of_one_gang_share_a_claim_and_the_first_carries_it() {
    let pod = sharing_pod("a", "ua", "shared");
    let role = |gang, object: Option<&Value>, others: &[Sharer]| {
        share_role(&pod, gang, "gpu", "shared", object, others)
    };
    let g = Some("g");
    let unallocated = json!({"spec": {}, "status": {}});
    assert_eq!(role(g, Some(&unallocated), &[]), Ok(ShareRole::Alone));
    let own = allocated_claim(&[("a", "ua")]);
    assert_eq!(role(g, Some(&own), &[]), Ok(ShareRole::Alone));
    // The lowest uid carries a claim nobody allocated or placed yet.
    let b = sharer("b", "ub", g, false);
    assert_eq!(
        role(g, Some(&unallocated), &[b.clone()]),
        Ok(ShareRole::Carrier)
    );
    let first = sharer("0", "u0", g, false);
    assert_eq!(
        role(g, Some(&unallocated), &[first]),
        Ok(ShareRole::Follower)
    );
    // A placed sharer carries it already, or the claim is allocated: follow.
    let placed = sharer("b", "ub", g, true);
    assert_eq!(
        role(g, Some(&unallocated), &[placed.clone()]),
        Ok(ShareRole::Follower)
    );
    let by_b = allocated_claim(&[("b", "ub")]);
    assert_eq!(role(g, Some(&by_b), &[placed]), Ok(ShareRole::Follower));
    assert_eq!(role(g, Some(&by_b), &[b.clone()]), Ok(ShareRole::Follower));
    // An allocation left from an earlier placement, reserved for none of them or
    // for this pod only: the first carries it again.
    let stale = allocated_claim(&[]);
    assert_eq!(role(g, Some(&stale), &[b.clone()]), Ok(ShareRole::Carrier));
    let own = allocated_claim(&[("a", "ua")]);
    assert_eq!(role(g, Some(&own), &[b.clone()]), Ok(ShareRole::Carrier));
    // A placed pod of the gang being deleted (still reserved, still sharing) is no
    // stranger, and no pod follows it: alone beside it, this pod carries the claim.
    let mut going = sharer("0", "u0", g, true);
    going.going = true;
    let by_going = allocated_claim(&[("0", "u0")]);
    assert_eq!(
        role(g, Some(&by_going), &[going.clone()]),
        Ok(ShareRole::Alone)
    );
    assert_eq!(
        role(g, Some(&by_going), &[going, b]),
        Ok(ShareRole::Carrier)
    );
}

#[test]
fn a_claim_shared_beyond_the_gang_is_refused_naming_the_others() {
    let pod = sharing_pod("a", "ua", "shared");
    let role = |gang, object: Option<&Value>, others: &[Sharer]| {
        share_role(&pod, gang, "gpu", "shared", object, others)
    };
    let g = Some("g");
    // Reserved for a pod gangway does not know of.
    let by_status = allocated_claim(&[("a", "ua"), ("b", "ub")]);
    let Err(PodProblem::Invalid(why)) = role(g, Some(&by_status), &[]) else {
        panic!("reserved for b too: refused");
    };
    assert!(
        why.starts_with("spec.resourceClaims[gpu]: ResourceClaim ns/shared is also used by pod b;"),
        "{why}"
    );
    // Named by a pod of another gang, another scheduler's pod, or without a gang.
    let other_gang = sharer("c", "uc", Some("h"), false);
    let mut foreign = sharer("b", "ub", g, false);
    foreign.ours = false;
    let Err(PodProblem::Invalid(why)) = role(g, Some(&by_status), &[other_gang.clone(), foreign])
    else {
        panic!("named by c too: refused");
    };
    assert!(why.contains("used by pod b, c;"), "each once: {why}");
    assert!(why.contains("(here ns/g)"), "{why}");
    let Err(PodProblem::Invalid(why)) = role(None, None, &[sharer("b", "ub", None, false)]) else {
        panic!("no gang: refused");
    };
    assert!(why.contains("this pod is in none"), "{why}");
    // More pods than reservedFor holds.
    let many: Vec<Sharer> = (0..CLAIM_CONSUMERS_MAX)
        .map(|i| sharer(&format!("p{i}"), &format!("v{i}"), g, false))
        .collect();
    let Err(PodProblem::Invalid(why)) = role(g, None, &many) else {
        panic!("257 pods: refused");
    };
    assert!(why.contains("named by 257 pods; at most 256"), "{why}");
}

#[test]
fn pods_sharing_a_claim_hold_its_devices_once() {
    let claims = ClaimIndex::from([(
        ("ns".to_string(), "shared".to_string()),
        std::sync::Arc::new(allocated_claim(&[("a", "ua"), ("b", "ub")])),
    )]);
    let mut counted = BTreeSet::new();
    let a = observed_pod(&sharing_pod("a", "ua", "shared"), &claims, &mut counted).expect("a read");
    let b = observed_pod(&sharing_pod("b", "ub", "shared"), &claims, &mut counted).expect("b read");
    assert_eq!(a.pod.devices.len(), 1, "the first pod carries the claim");
    assert!(b.pod.devices.is_empty(), "the second holds nothing more");
    // Once a is gone, b carries them (its node's list is written again).
    let mut counted = BTreeSet::new();
    let b = observed_pod(&sharing_pod("b", "ub", "shared"), &claims, &mut counted).expect("b read");
    assert_eq!(b.pod.devices.len(), 1);
}

#[test]
fn device_taints_without_effect_are_left_out_not_refused() {
    let object = json!({"spec": {"nodeName": "n1", "driver": "d",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "taints": [
                {"key": "example.com/info", "value": "x", "effect": "None"},
                {"key": "example.com/future", "effect": "PreferNoSchedule"},
                {"key": "example.com/ecc", "effect": "NoExecute", "timeAdded": "2026-11-26T08:00:00Z"}]}]}});
    let (node, pool) = slice_of(&object);
    assert_eq!(node, "n1");
    let taints: Vec<&str> = pool.devices[0]
        .taints
        .iter()
        .map(|t| t.key.as_str())
        .collect();
    assert_eq!(taints, vec!["example.com/ecc"]);
    // tolerationSeconds count from it: without it every look would start them again.
    assert_eq!(
        pool.devices[0].taints[0].time_added_ms,
        Some(1_795_680_000_000)
    );
}

#[test]
fn taint_rules_pick_by_driver_pool_and_device_and_ignore_effects_without_effect() {
    let rule = |selector: Value, effect: &str| {
        let mut object = json!({"metadata": {"name": "r"}, "spec": {"taint": {
                "key": "example.com/maintenance", "value": "planned", "effect": effect,
                "timeAdded": "2026-11-18T11:06:40Z"}}});
        if !selector.is_null() {
            object["spec"]["deviceSelector"] = selector;
        }
        taint_rule(&object).expect("valid")
    };
    let gpu = |driver: &str, pool: &str, device: &str| DeviceId {
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
    };
    let a = gpu("gpu.example.com", "n1", "gpu-0");
    let b = gpu("gpu.example.com", "n2", "gpu-0");
    let all = rule(json!({}), "NoExecute");
    let taint = all
        .taint_for(&a)
        .expect("the empty selector picks every device");
    assert_eq!(taint.time_added_ms, Some(1_795_000_000_000));
    assert_eq!(taint.effect, DeviceTaintEffect::NoExecute);
    assert!(all.taint_for(&b).is_some());
    assert!(
        rule(Value::Null, "NoExecute").taint_for(&a).is_none(),
        "no selector: none"
    );
    let one = rule(
        json!({"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}),
        "NoSchedule",
    );
    assert!(one.taint_for(&a).is_some());
    assert!(one.taint_for(&b).is_none());
    assert!(rule(json!({"pool": "n2"}), "NoSchedule")
        .taint_for(&b)
        .is_some());
    assert!(
        rule(json!({}), "None").taint_for(&a).is_none(),
        "informational"
    );
    let bad = json!({"metadata": {"name": "r"}, "spec": {"taint": {"key": "bad key!", "effect": "NoSchedule"}}});
    let e = taint_rule(&bad).expect_err("invalid key");
    assert!(e.to_string().contains("spec.taint.key"), "{e}");
}

#[test]
fn invalid_quantities_name_the_field() {
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}});
    let PodProblem::Invalid(why) = pod_spec(&pod, &ClaimIndex::new()).expect_err("bad") else {
        panic!("invalid expected")
    };
    assert!(
        why.contains("spec.containers[0].resources.requests"),
        "{why}"
    );
}
