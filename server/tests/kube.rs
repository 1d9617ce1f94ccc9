//! The Kubernetes adapter end to end: three `gangway serve` processes scheduling
//! the pods of an API server double (gangway-kube-double: a kube-apiserver cannot
//! run here) through kube-rs: DRA gangs bound with their claims allocated first,
//! a binding shard leader SIGKILLed mid-way, Koordinator and scheduler-plugins
//! gangs, bad objects reported, deleted pods freeing their devices, pods bound by
//! another scheduler counted, pods on NoExecute-tainted devices evicted, and a
//! Strict gang that loses a pod before binding released whole.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gangway_kube_double::store::{
    DEVICE_CLASSES, EVENTS, NODES, PODS, POD_GROUPS_SIGS, POD_GROUPS_X, RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES,
};
use gangway_kube_double::{ApiServerDouble, Options};
use serde_json::{json, Value};
use support::Cluster;

const DRIVER: &str = "gpu.example.com";
const NS: &str = "train";

fn node(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    })
}

fn slice(node: &str, gpus: usize) -> Value {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"model": {"string": "a100"}}}))
        .collect();
    json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    })
}

fn gpu_pod(name: &str, labels: Value, annotations: Value, template: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {
            "schedulerName": "gangway",
            "containers": [{"name": "main", "image": "trainer", "resources": {"requests": {"cpu": "1"}}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]
        }
    })
}

fn cpu_pod(name: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {
            "schedulerName": "gangway",
            "containers": [{"name": "main", "image": "worker", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]
        }
    })
}

fn template(name: &str, class: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}}
    })
}

/// An API server double with `nodes` nodes of `gpus` GPUs each, and three gangway
/// processes scheduling it.
async fn start(
    nodes: usize,
    gpus: usize,
    bind_qps: u32,
) -> (ApiServerDouble, Cluster, tempfile::TempDir) {
    let api = ApiServerDouble::start(Options::default())
        .await
        .expect("double starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    api.create(&DEVICE_CLASSES, json!({
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}
    }))
    .expect("class");
    for i in 0..nodes {
        let name = format!("node-{i:03}");
        api.create(&NODES, node(&name)).expect("node");
        api.create(&RESOURCE_SLICES, slice(&name, gpus))
            .expect("slice");
    }
    api.create(&RESOURCE_CLAIM_TEMPLATES, template("one-gpu", DRIVER))
        .expect("template");
    let args = vec![
        "--kubeconfig".to_string(),
        kubeconfig.display().to_string(),
        "--bind-qps".to_string(),
        bind_qps.to_string(),
    ];
    let cluster = Cluster::start_with(3, 2, args, Vec::new());
    cluster
        .wait_ready(&[1, 2, 3], Duration::from_secs(30))
        .await;
    (api, cluster, dir)
}

async fn wait_for(
    what: &str,
    timeout: Duration,
    cluster: &Cluster,
    mut done: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > timeout {
            let live = cluster.live();
            let groups = match live.first() {
                Some(id) => format!(
                    "{:#?}",
                    support::client(cluster, *id).await.list_groups(true).await
                ),
                None => "no live process".into(),
            };
            eprintln!("gang groups at the timeout: {groups}");
            panic!(
                "timed out after {timeout:?} waiting for {what}\n--- node 1 log ---\n{}\n--- node 2 log ---\n{}\n--- node 3 log ---\n{}",
                tail(&cluster.log(1)),
                tail(&cluster.log(2)),
                tail(&cluster.log(3))
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn node_of(api: &ApiServerDouble, pod: &str) -> Option<String> {
    api.get(&PODS, Some(NS), pod)
        .ok()
        .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from))
}

fn events_for(api: &ApiServerDouble, pod: &str, reason: &str) -> Vec<String> {
    api.list(&EVENTS, Some(NS))
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == pod && e["reason"] == reason)
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

/// Checks every pod's claim: allocated one device of its node's pool, reserved for the
/// pod, written before the binding; returns the devices.
fn check_claims(api: &ApiServerDouble, pods: &[String]) -> BTreeSet<(String, String)> {
    let mut devices = BTreeSet::new();
    for name in pods {
        let pod = api.get(&PODS, Some(NS), name).expect("pod");
        let node = pod["spec"]["nodeName"].as_str().expect("bound").to_string();
        let claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()
            .expect("claim made from the template");
        let claim = api
            .get(&RESOURCE_CLAIMS, Some(NS), claim_name)
            .expect("claim");
        let results = claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap_or_else(|| panic!("claim {claim_name} of {name} has no allocation: {claim}"));
        assert_eq!(results.len(), 1, "{claim}");
        assert_eq!(results[0]["pool"], node, "device of {name} is on its node");
        assert_eq!(results[0]["driver"], DRIVER);
        assert_eq!(
            claim["status"]["reservedFor"][0]["uid"],
            pod["metadata"]["uid"]
        );
        let claim_rv: u64 = claim["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("rv");
        let binding_rv = api
            .bindings()
            .iter()
            .find(|b| b.pod == *name)
            .map(|b| b.revision)
            .expect("binding recorded");
        assert!(
            claim_rv < binding_rv,
            "claim status of {name} (rv {claim_rv}) written before its binding (rv {binding_rv})"
        );
        let device = (
            node,
            results[0]["device"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        assert!(
            devices.insert(device.clone()),
            "device {device:?} allocated twice"
        );
    }
    devices
}

/// Every pod bound exactly once, to the node gangway's ledger committed.
async fn check_bound_once_where_committed(
    api: &ApiServerDouble,
    cluster: &Cluster,
    live: u64,
    pods: &[String],
) {
    let client = support::client(cluster, live).await;
    let groups = client.list_groups(true).await.expect("groups");
    let committed: BTreeMap<String, String> = groups
        .iter()
        .flat_map(|g| g.placements.iter())
        .map(|p| (p.member.clone(), p.node.clone()))
        .collect();
    let bindings = api.bindings();
    for pod in pods {
        let times: Vec<_> = bindings.iter().filter(|b| b.pod == *pod).collect();
        assert_eq!(
            times.len(),
            1,
            "pod {pod} bound {} times: {times:?}",
            times.len()
        );
        assert_eq!(
            Some(&times[0].node),
            committed.get(pod),
            "pod {pod} bound where the ledger committed it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_gangs_bind_once_with_claims_first_even_when_the_binding_leader_dies() {
    let (api, mut cluster, _dir) = start(50, 8, 10).await;

    // A PodGroup with minMember 16; its pods each claim one GPU through a template.
    api.create(
        &POD_GROUPS_X,
        json!({"metadata": {"name": "trainer", "namespace": NS}, "spec": {"minMember": 16}}),
    )
    .expect("pod group");
    let first: Vec<String> = (0..16).map(|i| format!("trainer-{i}")).collect();
    for name in &first {
        api.create(
            &PODS,
            gpu_pod(
                name,
                json!({"scheduling.x-k8s.io/pod-group": "trainer"}),
                json!({}),
                "one-gpu",
            ),
        )
        .expect("pod");
    }
    wait_for("16 pods bound", Duration::from_secs(60), &cluster, || {
        first.iter().all(|p| node_of(&api, p).is_some())
    })
    .await;
    let devices = check_claims(&api, &first);
    assert_eq!(devices.len(), 16);
    wait_for(
        "PodGroup status Scheduled 16",
        Duration::from_secs(30),
        &cluster,
        || {
            api.get(&POD_GROUPS_X, Some(NS), "trainer").is_ok_and(|g| {
                g["status"]["phase"] == "Scheduled" && g["status"]["scheduled"] == 16
            })
        },
    )
    .await;
    check_bound_once_where_committed(&api, &cluster, 1, &first).await;

    // A second gang; SIGKILL the leader of a shard while it binds (10 writes/s, so
    // binding 16 pods with their claims takes seconds).
    api.create(
        &POD_GROUPS_X,
        json!({"metadata": {"name": "second", "namespace": NS}, "spec": {"minMember": 16}}),
    )
    .expect("pod group");
    let second: Vec<String> = (0..16).map(|i| format!("second-{i}")).collect();
    for name in &second {
        api.create(
            &PODS,
            gpu_pod(
                name,
                json!({"scheduling.x-k8s.io/pod-group": "second"}),
                json!({}),
                "one-gpu",
            ),
        )
        .expect("pod");
    }
    wait_for(
        "a first binding of the second gang",
        Duration::from_secs(60),
        &cluster,
        || second.iter().any(|p| node_of(&api, p).is_some()),
    )
    .await;
    let bound_before = second.iter().filter(|p| node_of(&api, p).is_some()).count();
    let victim = cluster
        .agreed_leader(1, &[1, 2, 3])
        .await
        .expect("shard 1 has a leader");
    cluster.kill(victim);
    eprintln!("killed node {victim} (leader of shard 1) with {bound_before} of 16 bound");
    assert!(
        bound_before < 16,
        "the kill came after every binding; raise the test's gang or lower --bind-qps"
    );
    let live: Vec<u64> = cluster.live();
    wait_for(
        "the second gang bound after the kill",
        Duration::from_secs(60),
        &cluster,
        || second.iter().all(|p| node_of(&api, p).is_some()),
    )
    .await;
    let all: Vec<String> = first.iter().chain(second.iter()).cloned().collect();
    let devices = check_claims(&api, &all);
    assert_eq!(devices.len(), 32, "32 distinct devices");
    check_bound_once_where_committed(&api, &cluster, live[0], &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_kinds_schedule_bad_objects_are_reported_and_deleted_pods_free_devices() {
    let (api, cluster, _dir) = start(2, 2, 0).await;

    // A Koordinator gang (annotations only) and a scheduler-plugins PodGroup gang.
    let koord = json!({"gang.scheduling.koordinator.sh/name": "koord", "gang.scheduling.koordinator.sh/min-available": "2"});
    for name in ["koord-0", "koord-1"] {
        api.create(&PODS, cpu_pod(name, json!({}), koord.clone()))
            .expect("pod");
    }
    api.create(
        &POD_GROUPS_SIGS,
        json!({"metadata": {"name": "plugins", "namespace": NS}, "spec": {"minMember": 2}}),
    )
    .expect("pod group");
    for name in ["plugins-0", "plugins-1"] {
        api.create(
            &PODS,
            cpu_pod(
                name,
                json!({"pod-group.scheduling.sigs.k8s.io": "plugins"}),
                json!({}),
            ),
        )
        .expect("pod");
    }
    // Bad objects: an unparsable annotation, and a claim naming a missing DeviceClass.
    let bad = json!({"gang.scheduling.koordinator.sh/name": "bad", "gang.scheduling.koordinator.sh/min-available": "many"});
    api.create(&PODS, cpu_pod("bad-annotation", json!({}), bad))
        .expect("pod");
    api.create(
        &RESOURCE_CLAIM_TEMPLATES,
        template("no-class", "tpu.example.com"),
    )
    .expect("template");
    api.create(
        &PODS,
        gpu_pod("missing-class", json!({}), json!({}), "no-class"),
    )
    .expect("pod");

    // A gang no node can hold (100 CPUs a pod) with a 2 s waiting time: timed out.
    let too_big = json!({"gang.scheduling.koordinator.sh/name": "too-big",
                         "gang.scheduling.koordinator.sh/min-available": "2",
                         "gang.scheduling.koordinator.sh/waiting-time": "2s"});
    for name in ["too-big-0", "too-big-1"] {
        api.create(&PODS, pod_with_cpu(name, "100", too_big.clone()))
            .expect("pod");
    }

    let good = ["koord-0", "koord-1", "plugins-0", "plugins-1"];
    wait_for(
        "both gangs bound",
        Duration::from_secs(60),
        &cluster,
        || good.iter().all(|p| node_of(&api, p).is_some()),
    )
    .await;
    wait_for(
        "FailedScheduling for the bad annotation",
        Duration::from_secs(30),
        &cluster,
        || {
            events_for(&api, "bad-annotation", "FailedScheduling")
                .iter()
                .any(|m| m.contains("min-available"))
        },
    )
    .await;
    wait_for(
        "FailedScheduling for the missing class",
        Duration::from_secs(30),
        &cluster,
        || {
            events_for(&api, "missing-class", "FailedScheduling")
                .iter()
                .any(|m| m.contains("tpu.example.com"))
        },
    )
    .await;
    // The annotation is written first, then the event.
    wait_for(
        "the too-big gang marked timed out, and its pods told so",
        Duration::from_secs(30),
        &cluster,
        || {
            ["too-big-0", "too-big-1"].iter().all(|p| {
                let marked = api.get(&PODS, Some(NS), p).is_ok_and(|pod| {
                    pod["metadata"]["annotations"]["gang.scheduling.koordinator.sh/timeout"]
                        == "true"
                });
                let told = events_for(&api, p, "FailedScheduling")
                    .iter()
                    .any(|m| m.contains("timed out"));
                marked && told
            })
        },
    )
    .await;
    for p in ["too-big-0", "too-big-1"] {
        assert_eq!(node_of(&api, p), None);
    }
    assert_eq!(node_of(&api, "bad-annotation"), None);
    assert_eq!(node_of(&api, "missing-class"), None);
    // The Scheduled event follows the binding.
    wait_for(
        "Scheduled events",
        Duration::from_secs(10),
        &cluster,
        || {
            good.iter()
                .all(|p| !events_for(&api, p, "Scheduled").is_empty())
        },
    )
    .await;
    for p in good {
        assert_eq!(
            events_for(&api, p, "Scheduled").len(),
            1,
            "one Scheduled event for {p}"
        );
        assert!(
            events_for(&api, p, "FailedScheduling").is_empty(),
            "{p} was not disturbed"
        );
    }

    // Four GPUs, four single pods take them; a fifth waits until one is deleted.
    let singles: Vec<String> = (0..4).map(|i| format!("single-{i}")).collect();
    for name in &singles {
        api.create(&PODS, gpu_pod(name, json!({}), json!({}), "one-gpu"))
            .expect("pod");
    }
    wait_for(
        "four GPU pods bound",
        Duration::from_secs(60),
        &cluster,
        || singles.iter().all(|p| node_of(&api, p).is_some()),
    )
    .await;
    api.create(&PODS, gpu_pod("waiter", json!({}), json!({}), "one-gpu"))
        .expect("pod");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        node_of(&api, "waiter"),
        None,
        "no free GPU for the fifth pod"
    );
    let freed_claim = api.get(&PODS, Some(NS), "single-2").expect("pod")["status"]
        ["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .map(String::from)
        .expect("claim");
    let freed = api
        .get(&RESOURCE_CLAIMS, Some(NS), &freed_claim)
        .expect("claim")["status"]["allocation"]["devices"]["results"][0]
        .clone();
    api.delete(&PODS, Some(NS), "single-2").expect("delete");
    wait_for(
        "the waiter bound after the deletion",
        Duration::from_secs(30),
        &cluster,
        || node_of(&api, "waiter").is_some(),
    )
    .await;
    let mut all: Vec<String> = singles
        .iter()
        .filter(|p| *p != "single-2")
        .cloned()
        .collect();
    all.push("waiter".into());
    check_claims(&api, &all);
    let waiter_claim = api.get(&PODS, Some(NS), "waiter").expect("pod")["status"]
        ["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .map(String::from)
        .expect("claim");
    let taken = api
        .get(&RESOURCE_CLAIMS, Some(NS), &waiter_claim)
        .expect("claim")["status"]["allocation"]["devices"]["results"][0]
        .clone();
    assert_eq!(
        (&taken["pool"], &taken["device"]),
        (&freed["pool"], &freed["device"]),
        "the waiter took the freed GPU"
    );
}

fn pod_with_cpu(name: &str, cpu: &str, annotations: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {
            "schedulerName": "gangway",
            "containers": [{"name": "main", "image": "worker", "resources": {"requests": {"cpu": cpu}}}]
        }
    })
}

/// The device (node pool, device name) the pod's first claim was allocated.
fn device_of(api: &ApiServerDouble, pod: &str) -> Option<(String, String)> {
    let claim = api.get(&PODS, Some(NS), pod).ok()?["status"]["resourceClaimStatuses"][0]
        ["resourceClaimName"]
        .as_str()
        .map(String::from)?;
    let result = api.get(&RESOURCE_CLAIMS, Some(NS), &claim).ok()?["status"]["allocation"]
        ["devices"]["results"][0]
        .clone();
    Some((
        result["pool"].as_str()?.to_string(),
        result["device"].as_str()?.to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_pods_count_bad_devices_evict_and_broken_strict_gangs_wait_again() {
    let (api, cluster, _dir) = start(2, 2, 0).await;

    // A pod another scheduler bound to node-000: 62 of its 64 CPUs and, through a claim
    // it allocated, node-000/gpu-0.
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": "foreign-gpu", "namespace": "infra"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node-000", "device": "gpu-0"}
        ]}}}
    }))
    .expect("claim");
    api.create(&PODS, json!({
        "metadata": {"name": "foreign", "namespace": "infra"},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeName": "node-000",
            "containers": [{"name": "agent", "image": "agent", "resources": {"requests": {"cpu": "62"}}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "foreign-gpu"}]
        },
        "status": {"phase": "Running"}
    }))
    .expect("foreign pod");

    // Three GPU pods take the three GPUs the foreign pod leaves.
    let gpu_pods: Vec<String> = (0..3).map(|i| format!("g-{i}")).collect();
    for name in &gpu_pods {
        api.create(&PODS, gpu_pod(name, json!({}), json!({}), "one-gpu"))
            .expect("pod");
    }
    wait_for(
        "three GPU pods bound",
        Duration::from_secs(60),
        &cluster,
        || gpu_pods.iter().all(|p| node_of(&api, p).is_some()),
    )
    .await;
    let taken: BTreeSet<(String, String)> =
        gpu_pods.iter().filter_map(|p| device_of(&api, p)).collect();
    assert_eq!(taken.len(), 3, "three distinct devices: {taken:?}");
    assert!(
        !taken.contains(&("node-000".into(), "gpu-0".into())),
        "the foreign pod's GPU was not given away: {taken:?}"
    );

    // 40 CPUs fit node-001 once; node-000 has 1 CPU left beside the foreign pod.
    for name in ["big-0", "big-1"] {
        api.create(&PODS, pod_with_cpu(name, "40", json!({})))
            .expect("pod");
    }
    wait_for(
        "one big pod bound",
        Duration::from_secs(30),
        &cluster,
        || node_of(&api, "big-0").is_some() || node_of(&api, "big-1").is_some(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bound: Vec<String> = ["big-0", "big-1"]
        .iter()
        .filter_map(|p| node_of(&api, p))
        .collect();
    assert_eq!(
        bound,
        vec!["node-001".to_string()],
        "the foreign pod's CPUs count"
    );
    api.delete(&PODS, Some("infra"), "foreign").expect("delete");
    wait_for(
        "the second big pod bound once the foreign pod is gone",
        Duration::from_secs(30),
        &cluster,
        || node_of(&api, "big-0").is_some() && node_of(&api, "big-1").is_some(),
    )
    .await;

    // A NoExecute taint on the device of one GPU pod (a new slice generation): evicted.
    let victim = gpu_pods
        .iter()
        .find(|p| device_of(&api, p).is_some_and(|(pool, _)| pool == "node-001"))
        .cloned()
        .expect("a GPU pod on node-001");
    let (_, device) = device_of(&api, &victim).expect("device");
    api.update(&RESOURCE_SLICES, None, "node-001-gpus", |slice| {
        slice["spec"]["pool"]["generation"] = json!(2);
        if let Some(devices) = slice["spec"]["devices"].as_array_mut() {
            for d in devices.iter_mut().filter(|d| d["name"] == device.as_str()) {
                d["taints"] = json!([{"key": "example.com/ecc", "value": "uncorrectable", "effect": "NoExecute"}]);
            }
        }
        Ok(())
    })
    .expect("taint");
    wait_for(
        "the pod on the tainted device deleted",
        Duration::from_secs(30),
        &cluster,
        || api.get(&PODS, Some(NS), &victim).is_err(),
    )
    .await;
    let deleted = api
        .deleted()
        .into_iter()
        .find(|p| p["metadata"]["name"] == victim.as_str())
        .expect("deleted over the API");
    let condition = deleted["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget").cloned())
        .expect("DisruptionTarget condition");
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "DeletionByDeviceTaintManager");
    // The event is written after the delete.
    wait_for(
        "a Warning event naming the taint",
        Duration::from_secs(10),
        &cluster,
        || {
            events_for(&api, &victim, "DeviceEviction")
                .iter()
                .any(|m| m.contains("example.com/ecc"))
        },
    )
    .await;
    for other in gpu_pods.iter().filter(|p| **p != victim) {
        assert!(node_of(&api, other).is_some(), "{other} was not evicted");
    }

    // A Strict gang placed while bindings fail loses a pod before any binding: its
    // placement is released whole, and it binds once a third pod arrives.
    api.set_bindings_unavailable(true);
    let strict = json!({
        "gang.scheduling.koordinator.sh/name": "strict",
        "gang.scheduling.koordinator.sh/min-available": "3",
        "gang.scheduling.koordinator.sh/mode": "Strict",
    });
    for name in ["strict-0", "strict-1", "strict-2"] {
        api.create(&PODS, pod_with_cpu(name, "1", strict.clone()))
            .expect("pod");
    }
    let client = support::client(&cluster, cluster.live()[0]).await;
    let start_wait = Instant::now();
    loop {
        let groups = client.list_groups(false).await.unwrap_or_default();
        let placed = groups
            .iter()
            .any(|g| g.gangs.iter().any(|n| n == &format!("{NS}/strict")) && g.state == "Placed");
        if placed {
            break;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(30),
            "the Strict gang was never placed: {groups:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ["strict-0", "strict-1", "strict-2"]
            .iter()
            .all(|p| node_of(&api, p).is_none()),
        "bindings are failing, so none is bound"
    );
    api.delete(&PODS, Some(NS), "strict-2").expect("delete");
    wait_for(
        "the broken Strict gang reported",
        Duration::from_secs(30),
        &cluster,
        || {
            ["strict-0", "strict-1"].iter().all(|p| {
                events_for(&api, p, "FailedScheduling")
                    .iter()
                    .any(|m| m.contains("lost a pod before binding"))
            })
        },
    )
    .await;
    api.set_bindings_unavailable(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for p in ["strict-0", "strict-1"] {
        assert_eq!(
            node_of(&api, p),
            None,
            "two of three do not bind ({p}); bindings: {:?}\n{}",
            api.bindings(),
            (1..=3)
                .map(|id| tail(&cluster.log(id)))
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
    }
    api.create(&PODS, pod_with_cpu("strict-3", "1", strict.clone()))
        .expect("pod");
    wait_for(
        "the Strict gang bound with its new pod",
        Duration::from_secs(30),
        &cluster,
        || {
            ["strict-0", "strict-1", "strict-3"]
                .iter()
                .all(|p| node_of(&api, p).is_some())
        },
    )
    .await;
}

/// The metric names docs/METRICS.md lists (first column of its table).
fn catalogue() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/METRICS.md");
    let text = std::fs::read_to_string(path).expect("docs/METRICS.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("gangway_"))
        .map(String::from)
        .collect()
}

/// Metric families (from `# TYPE` lines) and the whole text of every live process's /metrics.
async fn scrape(cluster: &Cluster) -> (BTreeSet<String>, String) {
    let mut names = BTreeSet::new();
    let mut all = String::new();
    for id in cluster.live() {
        let (code, body) = support::http_get(&cluster.procs[&id].http, "/metrics").await;
        assert_eq!(code, 200, "/metrics of process {id}");
        names.extend(
            body.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .filter_map(|l| l.split_whitespace().next())
                .map(String::from),
        );
        all.push_str(&body);
    }
    (names, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_catalogue_is_served_after_a_short_workload() {
    let (api, cluster, _dir) = start(4, 2, 0).await;
    // Four pods of 60 CPUs: one per node, so the gang spans both shards (2PC with a decide).
    let wide = json!({"gang.scheduling.koordinator.sh/name": "wide",
                      "gang.scheduling.koordinator.sh/min-available": "4"});
    let mut pods: Vec<String> = (0..4).map(|i| format!("wide-{i}")).collect();
    for name in &pods {
        api.create(&PODS, pod_with_cpu(name, "60", wide.clone()))
            .expect("pod");
    }
    api.create(&PODS, gpu_pod("gpu-user", json!({}), json!({}), "one-gpu"))
        .expect("pod");
    pods.push("gpu-user".into());
    wait_for(
        "the workload bound",
        Duration::from_secs(60),
        &cluster,
        || pods.iter().all(|p| node_of(&api, p).is_some()),
    )
    .await;

    let documented = catalogue();
    assert!(documented.len() >= 10, "catalogue parsed: {documented:?}");
    let phases = [
        "pending", "quote", "begin", "reserve", "decide", "commit", "round", "bind",
    ];
    let start_wait = Instant::now();
    loop {
        // The sampler sets its gauges once a second.
        let (served, text) = scrape(&cluster).await;
        let missing: Vec<&String> = documented.difference(&served).collect();
        let undocumented: Vec<&String> = served
            .iter()
            .filter(|n| n.starts_with("gangway_") && !documented.contains(*n))
            .collect();
        let unseen: Vec<&&str> = phases
            .iter()
            .filter(|p| !text.contains(&format!("phase=\"{p}\"")))
            .collect();
        let allocated = text.lines().any(|l| {
            l.starts_with("gangway_devices{")
                && l.contains("state=\"allocated\"")
                && l.ends_with(" 1")
        });
        if missing.is_empty() && undocumented.is_empty() && unseen.is_empty() && allocated {
            break;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(20),
            "served but not in docs/METRICS.md: {undocumented:?}; documented but not served: \
             {missing:?}; phases not seen: {unseen:?}; an allocated GPU reported: {allocated}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
