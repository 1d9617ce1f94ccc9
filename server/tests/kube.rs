//! The Kubernetes adapter end to end, against a real control plane (etcd,
//! kube-apiserver and kube-controller-manager's resourceclaim controller from
//! `GANGWAY_K8S_ASSETS`, see gangway-kube-env): three `gangway serve` processes
//! scheduling through kube-rs: DRA gangs bound with their claims allocated first,
//! a binding shard leader SIGKILLed mid-way, Koordinator and scheduler-plugins
//! gangs, bad objects reported, deleted pods freeing their devices, pods bound by
//! another scheduler counted, pods on NoExecute-tainted devices evicted, claim
//! allocations carrying the class and claim configs a driver reads, a claim shared by
//! foreign pods holding its device until the last goes, shared claims of gangway's own
//! pods refused, DeviceTaintRules keeping pods off and evicting holders, bindings
//! waiting for the driver's binding conditions. Bindings
//! are counted from the API server's audit log. (A binding answered 503 is in
//! `kube_faults.rs`, on the double: the real server cannot be made to answer so.)

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gangway_kube_double::store::{
    DEVICE_CLASSES, EVENTS, NODES, PODS, POD_GROUPS_SIGS, POD_GROUPS_X, RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES,
};
use gangway_kube_env::{AuditEntry, ControlPlane, Options};
use serde_json::{json, Value};
use support::objects::node;
use support::Cluster;

/// One control plane at a time: each is a few hundred MB and a core while it starts.
static KUBE_SERIAL: Mutex<()> = Mutex::new(());
/// How often waits look at the API server.
const POLL_MS: u64 = 200;

const DRIVER: &str = "gpu.example.com";
const NS: &str = "train";

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

/// A real control plane with `nodes` nodes of `gpus` GPUs each (and both PodGroup
/// CRDs), and three gangway processes scheduling it.
struct Env {
    api: ControlPlane,
    cluster: Cluster,
    _dir: tempfile::TempDir,
    _serial: MutexGuard<'static, ()>,
}

async fn start(nodes: usize, gpus: usize, bind_qps: u32) -> Env {
    start_with(nodes, gpus, bind_qps, Setup::Admin).await
}

/// Who gangway runs as, and which PodGroup CRDs exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// An admin identity; both PodGroup CRDs (the harness's).
    Admin,
    /// An admin identity; no PodGroup CRD.
    AdminWithoutCrds,
    /// The chart's ServiceAccount with the chart's ClusterRole and binding, and the
    /// chart's PodGroup CRD (scheduling.x-k8s.io only).
    Chart,
    /// `Chart`, with `resource.k8s.io/v1beta2` (DeviceTaintRules) served.
    ChartWithTaintRules,
    /// `Admin`, with list-typed device attributes (`DRAListTypeAttributes`, alpha) on.
    AdminWithListAttributes,
}

/// The chart's ServiceAccount (namespace, name) in these tests.
const CHART_SA: (&str, &str) = ("gangway", "gangway");

/// Applies the chart's PodGroup and ElasticQuota CRDs, ClusterRole and ClusterRoleBinding.
async fn apply_chart(api: &ControlPlane) {
    api.install_crd(support::chart::chart_object("podgroup-crd.yaml"))
        .await
        .expect("the chart's CRD is accepted");
    api.install_crd(support::chart::chart_object("elasticquota-crd.yaml"))
        .await
        .expect("the chart's ElasticQuota CRD is accepted");
    support::chart::apply_gangway_rbac(api, "gangway", CHART_SA.0, CHART_SA.1).await;
}

async fn start_with(nodes: usize, gpus: usize, bind_qps: u32, setup: Setup) -> Env {
    start_armed(nodes, gpus, bind_qps, setup, &[]).await
}

/// `start_with`, every gangway process with these test bug switches armed.
async fn start_armed(
    nodes: usize,
    gpus: usize,
    bind_qps: u32,
    setup: Setup,
    failpoints: &[&str],
) -> Env {
    let serial = KUBE_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sa = gangway_kube_env::Identity::service_account(CHART_SA.0, CHART_SA.1);
    let apiserver_args = match setup {
        Setup::ChartWithTaintRules => vec!["--runtime-config=resource.k8s.io/v1beta2=true".into()],
        Setup::AdminWithListAttributes => {
            vec!["--feature-gates=DRAListTypeAttributes=true".into()]
        }
        _ => Vec::new(),
    };
    let api = ControlPlane::start(Options {
        identities: vec![sa.clone()],
        apiserver_args,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let user = match setup {
        Setup::Chart | Setup::ChartWithTaintRules => sa.user.as_str(),
        Setup::Admin | Setup::AdminWithoutCrds | Setup::AdminWithListAttributes => {
            gangway_kube_env::ADMIN_USER
        }
    };
    api.write_kubeconfig(&kubeconfig, user).expect("kubeconfig");
    for ns in [NS, "infra", CHART_SA.0] {
        api.ensure_namespace(ns).await.expect("namespace");
    }
    match setup {
        Setup::Admin | Setup::AdminWithListAttributes => {
            api.install_pod_group_crds().await.expect("PodGroup CRDs")
        }
        Setup::AdminWithoutCrds => {}
        Setup::Chart | Setup::ChartWithTaintRules => apply_chart(&api).await,
    }
    api.create(&DEVICE_CLASSES, json!({
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}
    }))
    .await
    .expect("class");
    for i in 0..nodes {
        let name = format!("node-{i:03}");
        api.create(&NODES, node(&name)).await.expect("node");
        api.create(&RESOURCE_SLICES, slice(&name, gpus))
            .await
            .expect("slice");
    }
    api.create(&RESOURCE_CLAIM_TEMPLATES, template("one-gpu", DRIVER))
        .await
        .expect("template");
    let mut args = vec![
        "--kubeconfig".to_string(),
        kubeconfig.display().to_string(),
        "--bind-qps".to_string(),
        bind_qps.to_string(),
    ];
    let vars = support::arm_failpoints(&mut args, failpoints);
    let cluster = Cluster::start_with(3, 2, args, vars);
    cluster
        .wait_ready(&[1, 2, 3], Duration::from_secs(30))
        .await;
    Env {
        api,
        cluster,
        _dir: dir,
        _serial: serial,
    }
}

/// The test namespace as the API server has it now.
struct View {
    pods: BTreeMap<String, Value>,
    events: Vec<Value>,
    claims: BTreeMap<String, Value>,
    pod_groups: BTreeMap<String, Value>,
}

fn by_name(items: Vec<Value>) -> BTreeMap<String, Value> {
    items
        .into_iter()
        .filter_map(|o| Some((o["metadata"]["name"].as_str()?.to_string(), o)))
        .collect()
}

async fn view(api: &ControlPlane) -> View {
    View {
        pods: by_name(api.list(&PODS, Some(NS)).await.unwrap_or_default()),
        events: api.list(&EVENTS, Some(NS)).await.unwrap_or_default(),
        claims: by_name(
            api.list(&RESOURCE_CLAIMS, Some(NS))
                .await
                .unwrap_or_default(),
        ),
        pod_groups: by_name(api.list(&POD_GROUPS_X, Some(NS)).await.unwrap_or_default()),
    }
}

impl View {
    fn node_of(&self, pod: &str) -> Option<String> {
        self.pods
            .get(pod)
            .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from))
    }

    fn bound(&self, pods: &[impl AsRef<str>]) -> bool {
        pods.iter().all(|p| self.node_of(p.as_ref()).is_some())
    }

    fn events_for(&self, pod: &str, reason: &str) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e["involvedObject"]["name"] == pod && e["reason"] == reason)
            .filter_map(|e| e["message"].as_str().map(String::from))
            .collect()
    }

    fn claim_of(&self, pod: &str) -> Option<&Value> {
        let name = self.pods.get(pod)?["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()?;
        self.claims.get(name)
    }

    /// The device (node pool, device name) the pod's first claim was allocated.
    fn device_of(&self, pod: &str) -> Option<(String, String)> {
        let result = &self.claim_of(pod)?["status"]["allocation"]["devices"]["results"][0];
        Some((
            result["pool"].as_str()?.to_string(),
            result["device"].as_str()?.to_string(),
        ))
    }

    /// Gone, or being deleted (no kubelet runs here to finish a graceful deletion).
    fn going(&self, pod: &str) -> bool {
        self.pods
            .get(pod)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
    }
}

/// Waits until `done` holds for the API server's view; answers that view.
async fn wait_for(
    what: &str,
    timeout: Duration,
    env: &Env,
    mut done: impl FnMut(&View) -> bool,
) -> View {
    let start = Instant::now();
    loop {
        let now = view(&env.api).await;
        if done(&now) {
            return now;
        }
        if start.elapsed() > timeout {
            let cluster = &env.cluster;
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
                "timed out after {timeout:?} waiting for {what}\n--- node 1 log ---\n{}\n--- node 2 log ---\n{}\n--- node 3 log ---\n{}\n--- kube-apiserver ---\n{}",
                tail(&cluster.log(1)),
                tail(&cluster.log(2)),
                tail(&cluster.log(3)),
                env.api.log_tail("kube-apiserver"),
            );
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Checks every pod's claim: allocated one device of its node's pool, reserved for the
/// pod, its status written before the pod's binding (as the audit log saw them);
/// returns the devices.
fn check_claims(view: &View, audit: &[AuditEntry], pods: &[String]) -> BTreeSet<(String, String)> {
    let bindings = gangway_kube_env::audit::bindings(audit);
    let mut devices = BTreeSet::new();
    for name in pods {
        let pod = &view.pods[name];
        let node = pod["spec"]["nodeName"].as_str().expect("bound").to_string();
        let claim = view
            .claim_of(name)
            .unwrap_or_else(|| panic!("claim made from the template for {name}: {pod}"));
        let claim_name = claim["metadata"]["name"].as_str().unwrap_or_default();
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
        let first_claim_write = audit
            .iter()
            .filter(|e| e.resource == "resourceclaims" && e.subresource == "status")
            .filter(|e| e.name == claim_name && (200..300).contains(&e.code))
            .map(|e| e.completed.clone())
            .min()
            .unwrap_or_else(|| panic!("no claim status write of {claim_name} audited"));
        let binding = bindings
            .iter()
            .find(|b| b.pod == *name)
            .unwrap_or_else(|| panic!("no binding of {name} audited"));
        assert!(
            first_claim_write <= binding.received,
            "claim status of {name} (written {first_claim_write}) written before its binding (received {})",
            binding.received
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
async fn check_bound_once_where_committed(env: &Env, live: u64, pods: &[String]) {
    let client = support::client(&env.cluster, live).await;
    let groups = client.list_groups(true).await.expect("groups");
    let committed: BTreeMap<String, String> = groups
        .iter()
        .flat_map(|g| g.placements.iter())
        .map(|p| (p.member.clone(), p.node.clone()))
        .collect();
    let bindings = env.api.bindings();
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

/// A scheduler-plugins PodGroup of `size` GPU pods (one GPU each, from the template).
async fn create_gpu_gang(api: &ControlPlane, group: &str, size: usize) -> Vec<String> {
    api.create(
        &POD_GROUPS_X,
        json!({"metadata": {"name": group, "namespace": NS}, "spec": {"minMember": size}}),
    )
    .await
    .expect("pod group");
    let pods: Vec<String> = (0..size).map(|i| format!("{group}-{i}")).collect();
    for name in &pods {
        let labels = json!({"scheduling.x-k8s.io/pod-group": group});
        api.create(&PODS, gpu_pod(name, labels, json!({}), "one-gpu"))
            .await
            .expect("pod");
    }
    pods
}

/// A Koordinator gang no node can hold (100 CPUs a pod), waiting 2 s: it times out.
async fn create_too_big_gang(api: &ControlPlane) {
    let too_big = json!({"gang.scheduling.koordinator.sh/name": "too-big",
                         "gang.scheduling.koordinator.sh/min-available": "2",
                         "gang.scheduling.koordinator.sh/waiting-time": "2s"});
    for name in ["too-big-0", "too-big-1"] {
        api.create(&PODS, pod_with_cpu(name, "100", too_big.clone()))
            .await
            .expect("pod");
    }
}

/// Puts a NoExecute taint on one device of `node`'s pool (a new slice generation).
async fn taint_device(api: &ControlPlane, node: &str, device: &str) {
    api.update(&RESOURCE_SLICES, None, &format!("{node}-gpus"), |slice| {
        slice["spec"]["pool"]["generation"] = json!(2);
        if let Some(devices) = slice["spec"]["devices"].as_array_mut() {
            for d in devices.iter_mut().filter(|d| d["name"] == device) {
                d["taints"] = json!([{"key": "example.com/ecc", "value": "uncorrectable", "effect": "NoExecute"}]);
            }
        }
    })
    .await
    .expect("taint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_gangs_bind_once_with_claims_first_even_when_the_binding_leader_dies() {
    let mut env = start(50, 8, 10).await;

    // A PodGroup with minMember 16; its pods each claim one GPU through a template.
    let first = create_gpu_gang(&env.api, "trainer", 16).await;
    let now = wait_for("16 pods bound", Duration::from_secs(60), &env, |v| {
        v.bound(&first)
    })
    .await;
    let devices = check_claims(&now, &env.api.audit(), &first);
    assert_eq!(devices.len(), 16);
    wait_for(
        "PodGroup status Scheduled 16",
        Duration::from_secs(30),
        &env,
        |v| {
            v.pod_groups.get("trainer").is_some_and(|g| {
                g["status"]["phase"] == "Scheduled" && g["status"]["scheduled"] == 16
            })
        },
    )
    .await;
    check_bound_once_where_committed(&env, 1, &first).await;

    // A second gang; SIGKILL the leader of a shard while it binds (10 writes/s, so
    // binding 16 pods with their claims takes seconds).
    let second = create_gpu_gang(&env.api, "second", 16).await;
    let now = wait_for(
        "a first binding of the second gang",
        Duration::from_secs(60),
        &env,
        |v| second.iter().any(|p| v.node_of(p).is_some()),
    )
    .await;
    let bound_before = second.iter().filter(|p| now.node_of(p).is_some()).count();
    let victim = env
        .cluster
        .agreed_leader(1, &[1, 2, 3])
        .await
        .expect("shard 1 has a leader");
    env.cluster.kill(victim);
    eprintln!("killed node {victim} (leader of shard 1) with {bound_before} of 16 bound");
    assert!(
        bound_before < 16,
        "the kill came after every binding; raise the test's gang or lower --bind-qps"
    );
    let live: Vec<u64> = env.cluster.live();
    let now = wait_for(
        "the second gang bound after the kill",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&second),
    )
    .await;
    let all: Vec<String> = first.iter().chain(second.iter()).cloned().collect();
    let devices = check_claims(&now, &env.api.audit(), &all);
    assert_eq!(devices.len(), 32, "32 distinct devices");
    check_bound_once_where_committed(&env, live[0], &all).await;
    // One Scheduled event per pod of the first gang; none twice, the new leader's
    // retries included (a pod bound just before the kill may have none: events are
    // best effort, as kube-scheduler's are).
    let now = wait_for("Scheduled events", Duration::from_secs(10), &env, |v| {
        first
            .iter()
            .all(|p| !v.events_for(p, "Scheduled").is_empty())
    })
    .await;
    for p in &all {
        assert!(
            now.events_for(p, "Scheduled").len() <= 1,
            "Scheduled events of {p}: {:?}",
            now.events_for(p, "Scheduled")
        );
    }
}

/// A DeviceClass with a driver config, and a template whose one request is a
/// firstAvailable choice (an "h100" no slice has, else any GPU tolerating a taint)
/// with claim configs for each choice: what a GPU-sharing driver reads.
async fn create_configured_claims(api: &ControlPlane) {
    api.create(&DEVICE_CLASSES, json!({
        "metadata": {"name": "shared-gpu"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}],
                 "config": [{"opaque": {"driver": DRIVER, "parameters": {"sharing": "time-slicing"}}}]}
    }))
    .await
    .expect("class");
    let h100 = format!("device.attributes[\"{DRIVER}\"].model == \"h100\"");
    api.create(&RESOURCE_CLAIM_TEMPLATES, json!({
        "metadata": {"name": "configured", "namespace": NS},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "firstAvailable": [
                {"name": "big", "deviceClassName": "shared-gpu", "selectors": [{"cel": {"expression": h100}}]},
                {"name": "any", "deviceClassName": "shared-gpu",
                 "tolerations": [{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}]}
            ]}],
            "config": [
                {"requests": ["gpu/any"], "opaque": {"driver": DRIVER, "parameters": {"mps": true}}},
                {"requests": ["gpu/big"], "opaque": {"driver": DRIVER, "parameters": {"never": true}}},
                {"opaque": {"driver": DRIVER, "parameters": {"everyRequest": true}}}
            ]}}}
    }))
    .await
    .expect("template");
}

/// What is wrong with the allocations of `pods`' claims (made from the "configured"
/// template), as a driver would read them: the chosen sub-request, its class config
/// (`FromClass`), the claim configs for it and for all (`FromClaim`), in that order.
fn config_problems(view: &View, pods: &[String]) -> Vec<String> {
    let want = json!([
        {"source": "FromClass", "requests": ["gpu/any"],
         "opaque": {"driver": DRIVER, "parameters": {"sharing": "time-slicing"}}},
        {"source": "FromClaim", "requests": ["gpu/any"],
         "opaque": {"driver": DRIVER, "parameters": {"mps": true}}},
        {"source": "FromClaim",
         "opaque": {"driver": DRIVER, "parameters": {"everyRequest": true}}}
    ]);
    let mut problems = Vec::new();
    for pod in pods {
        let Some(claim) = view.claim_of(pod) else {
            problems.push(format!("{pod}: no claim"));
            continue;
        };
        let devices = &claim["status"]["allocation"]["devices"];
        if devices["results"][0]["request"] != "gpu/any" {
            problems.push(format!("{pod}: result {}", devices["results"]));
        }
        if devices["config"] != want {
            problems.push(format!("{pod}: configs {}", devices["config"]));
        }
    }
    problems
}

/// A gang of two pods claiming GPUs through the "configured" template.
async fn create_configured_gang(api: &ControlPlane) -> Vec<String> {
    create_configured_claims(api).await;
    api.create(
        &POD_GROUPS_X,
        json!({"metadata": {"name": "configured", "namespace": NS}, "spec": {"minMember": 2}}),
    )
    .await
    .expect("pod group");
    let pods: Vec<String> = (0..2).map(|i| format!("configured-{i}")).collect();
    for name in &pods {
        let labels = json!({"scheduling.x-k8s.io/pod-group": "configured"});
        api.create(&PODS, gpu_pod(name, labels, json!({}), "configured"))
            .await
            .expect("pod");
    }
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_allocations_carry_class_and_claim_configs_and_the_request_tolerations() {
    let env = start(2, 4, 0).await;
    let pods = create_configured_gang(&env.api).await;
    let now = wait_for(
        "the configured gang bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&pods),
    )
    .await;
    assert_eq!(config_problems(&now, &pods), Vec::<String>::new());
    for pod in &pods {
        let result =
            &now.claim_of(pod).expect("claim")["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(
            result["tolerations"],
            json!([{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}]),
            "{pod}: the device taint eviction controller reads tolerations from the result"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_binder_that_drops_allocation_configs() {
    let env = start_armed(
        2,
        4,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::BINDER_DROPS_CONFIGS],
    )
    .await;
    let pods = create_configured_gang(&env.api).await;
    let now = wait_for(
        "the configured gang bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&pods),
    )
    .await;
    assert_eq!(
        config_problems(&now, &pods).len(),
        2,
        "the bug switch drops every config"
    );
}

/// One node with one GPU, which two pods another scheduler bound share through one
/// claim; a gangway pod wants a GPU. Once the sharer gangway counted the claim for
/// (the lower uid) is deleted, answers the gangway pod's name and the other sharer's.
async fn a_shared_foreign_claim_loses_one_pod(env: &Env) -> (String, String) {
    let api = &env.api;
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": "foreign-shared", "namespace": "infra"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }))
    .await
    .expect("claim");
    let mut sharers = Vec::new();
    for name in ["sharer-a", "sharer-b"] {
        let pod = api.create(&PODS, json!({
            "metadata": {"name": name, "namespace": "infra"},
            "spec": {
                "schedulerName": "default-scheduler",
                "nodeName": "node-000",
                "containers": [{"name": "main", "image": "inference", "resources": {"requests": {"cpu": "1"}}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "foreign-shared"}]
            },
            "status": {"phase": "Running"}
        }))
        .await
        .expect("sharer");
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        sharers.push((uid, name.to_string()));
    }
    sharers.sort();
    // The claim is allocated once gangway has seen both pods (its ingest looks at least
    // every 2 s), so it counts their devices in one pass, by uid; were the pods seen in
    // two passes, the one seen first would carry them and the bug switch would show
    // nothing when the lower uid goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.update(&RESOURCE_CLAIMS, Some("infra"), "foreign-shared", |claim| {
        claim["status"]["allocation"] = json!({"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node-000", "device": "gpu-0"}
        ]}});
    })
    .await
    .expect("allocation");
    api.create(&PODS, gpu_pod("wants-gpu", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    wait_for(
        "FailedScheduling for the GPU pod (the shared GPU is counted)",
        Duration::from_secs(30),
        env,
        |v| !v.events_for("wants-gpu", "FailedScheduling").is_empty(),
    )
    .await;
    api.delete(&PODS, Some("infra"), &sharers[0].1)
        .await
        .expect("delete");
    ("wants-gpu".to_string(), sharers[1].1.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_shared_by_foreign_pods_holds_its_device_until_the_last_goes_and_ours_are_refused()
{
    let env = start(1, 1, 0).await;
    let (ours, other_sharer) = a_shared_foreign_claim_loses_one_pod(&env).await;
    // Long enough for gangway to see the deletion and place the pod if it thought the
    // GPU free (ingest passes run at least every 2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = view(&env.api).await;
    assert_eq!(
        now.node_of(&ours),
        None,
        "the GPU is still used by {other_sharer}, which shares the claim"
    );

    // Two gangway pods in no gang naming one claim: both refused, with the reason,
    // nothing allocated. The pods come first and wait for their claim, so that one
    // ingest pass sees both (created the other way round, a pass between the two pods
    // would submit the first alone).
    let sharing: Vec<String> = vec!["share-0".into(), "share-1".into()];
    for name in &sharing {
        let mut pod = gpu_pod(name, json!({}), json!({}), "unused");
        pod["spec"]["resourceClaims"] =
            json!([{"name": "gpu", "resourceClaimName": "ours-shared"}]);
        env.api.create(&PODS, pod).await.expect("pod");
    }
    env.api
        .create(&RESOURCE_CLAIMS, json!({
            "metadata": {"name": "ours-shared", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
        }))
        .await
        .expect("claim");
    let now = wait_for(
        "both sharing pods refused",
        Duration::from_secs(30),
        &env,
        |v| {
            sharing.iter().all(|p| {
                v.events_for(p, "FailedScheduling")
                    .iter()
                    .any(|m| m.contains("gangway shares a claim only among the pods of one gang"))
            })
        },
    )
    .await;
    assert!(
        now.claims["ours-shared"]["status"]["allocation"].is_null(),
        "a refused shared claim is not allocated: {}",
        now.claims["ours-shared"]
    );
    assert!(!now.bound(&sharing[..1]) && !now.bound(&sharing[1..]));
    // Once one of them is gone, the other is placed (the claim is its own).
    env.api
        .delete(&PODS, Some(NS), &sharing[1])
        .await
        .expect("delete");

    // The last foreign sharer goes: the GPU is free for the pods waiting for it; the
    // gangway pod and the remaining sharer of ours-shared want one GPU each, and only one
    // is there.
    env.api
        .delete(&PODS, Some("infra"), &other_sharer)
        .await
        .expect("delete");
    wait_for(
        "one GPU pod bound once the shared claim's last pod is gone",
        Duration::from_secs(30),
        &env,
        |v| v.node_of(&ours).is_some() || v.node_of(&sharing[0]).is_some(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = view(&env.api).await;
    assert!(
        now.node_of(&ours).is_none() || now.node_of(&sharing[0]).is_none(),
        "one GPU, so one of the two bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_foreign_sharers_each_counting_the_claim() {
    let env = start_armed(
        1,
        1,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::OBSERVED_CLAIMS_PER_POD],
    )
    .await;
    let (ours, _) = a_shared_foreign_claim_loses_one_pod(&env).await;
    wait_for(
        "the GPU pod bound on the device the remaining sharer uses (the bug switch)",
        Duration::from_secs(30),
        &env,
        |v| v.node_of(&ours).is_some(),
    )
    .await;
}

/// Creates claim `claim` (one device of the test class) and PodGroup `group` of 4 pods
/// naming it, each asking `cpu` CPUs; waits until the 4 are bound, and checks that the
/// claim was allocated once and is reserved for every pod. Returns the pods in uid
/// order (the first allocated the claim) and the view then.
async fn four_pods_share_a_claim(
    env: &Env,
    claim: &str,
    group: &str,
    cpu: &str,
) -> (Vec<String>, View) {
    let api = &env.api;
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": claim, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }))
    .await
    .expect("claim");
    api.create(
        &POD_GROUPS_X,
        json!({"metadata": {"name": group, "namespace": NS}, "spec": {"minMember": 4}}),
    )
    .await
    .expect("pod group");
    let mut uids = Vec::new();
    for i in 0..4 {
        let name = format!("{group}-{i}");
        let labels = json!({"scheduling.x-k8s.io/pod-group": group});
        let mut pod = gpu_pod(&name, labels, json!({}), "unused");
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!(cpu);
        pod["spec"]["resourceClaims"] = json!([{"name": "channel", "resourceClaimName": claim}]);
        let created = api.create(&PODS, pod).await.expect("pod");
        let uid = created["metadata"]["uid"].as_str().unwrap_or_default();
        uids.push((uid.to_string(), name));
    }
    uids.sort();
    let sharing: Vec<String> = uids.iter().map(|(_, n)| n.clone()).collect();
    let now = wait_for(
        "the 4 pods sharing a claim bound",
        Duration::from_secs(60),
        env,
        |v| v.bound(&sharing),
    )
    .await;
    let object = &now.claims[claim];
    let results = object["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "allocated once: {object}");
    let reserved: BTreeSet<String> = object["status"]["reservedFor"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["uid"].as_str().map(str::to_string))
        .collect();
    let all: BTreeSet<String> = uids.into_iter().map(|(u, _)| u).collect();
    assert_eq!(
        reserved, all,
        "reserved for every pod of the gang: {object}"
    );
    (sharing, now)
}

/// A PodGroup of 4 pods naming one ResourceClaim (one GPU) on 3 nodes of 2 GPUs: the
/// pods bind to one node, the claim is allocated once and reserved for all 4, and its
/// GPU is counted once (5 one-GPU pods bind beside it, a 6th waits). Then every pod of
/// the claim but the last (by uid, so the pod that allocated it goes) is deleted.
/// Answers the 4 pods, the 6th one-GPU pod and the pod still holding the claim.
async fn a_gang_shares_a_claim_and_loses_its_carrier(env: &Env) -> (Vec<String>, String, String) {
    let api = &env.api;
    let (sharing, now) = four_pods_share_a_claim(env, "gang-channel", "sharing", "1").await;
    let nodes: BTreeSet<String> = sharing.iter().filter_map(|p| now.node_of(p)).collect();
    assert_eq!(nodes.len(), 1, "one node for the claim's pods: {nodes:?}");
    let node = nodes.into_iter().next().unwrap_or_default();
    let claim = &now.claims["gang-channel"];
    let results = &claim["status"]["allocation"]["devices"]["results"];
    assert_eq!(results[0]["pool"], json!(node), "{claim}");

    // 6 GPUs, one held by the claim: 5 one-GPU pods bind, a 6th waits.
    let singles: Vec<String> = (0..6).map(|i| format!("single-{i}")).collect();
    for name in &singles[..5] {
        api.create(&PODS, gpu_pod(name, json!({}), json!({}), "one-gpu"))
            .await
            .expect("pod");
    }
    wait_for(
        "5 one-GPU pods bound beside the claim",
        Duration::from_secs(60),
        env,
        |v| v.bound(&singles[..5]),
    )
    .await;
    let last = singles[5].clone();
    api.create(&PODS, gpu_pod(&last, json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    wait_for(
        "the 6th one-GPU pod waits",
        Duration::from_secs(30),
        env,
        |v| !v.events_for(&last, "FailedScheduling").is_empty(),
    )
    .await;
    // The first pod by uid allocated the claim; it and two more go.
    finish_deletions(api, &sharing[..3]).await;
    (sharing.clone(), last, sharing[3].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_shared_by_four_pods_of_a_gang_is_allocated_once_and_held_until_the_last_goes() {
    let env = start(3, 2, 0).await;
    let (_, waiting, holder) = a_gang_shares_a_claim_and_loses_its_carrier(&env).await;
    // Long enough for gangway to see the deletions and place the pod if it thought the
    // GPU free (ingest passes run at least every 2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = view(&env.api).await;
    assert_eq!(
        now.node_of(&waiting),
        None,
        "the claim's GPU is still used by {holder}"
    );
    finish_deletions(&env.api, &[holder]).await;
    wait_for(
        "the 6th pod bound once the claim's last pod is gone",
        Duration::from_secs(30),
        &env,
        |v| v.node_of(&waiting).is_some(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_ledger_that_frees_a_shared_claim_with_its_carrier() {
    let env = start_armed(
        3,
        2,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::SHARED_CLAIMS_FREED_WITH_CARRIER],
    )
    .await;
    let (_, waiting, _) = a_gang_shares_a_claim_and_loses_its_carrier(&env).await;
    wait_for(
        "the 6th pod bound on the GPU the claim's last pod uses (the bug switch)",
        Duration::from_secs(30),
        &env,
        |v| v.node_of(&waiting).is_some(),
    )
    .await;
}

/// Which nodes the test's network-attached pool reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FabricReach {
    /// Two nodes of different shards, by hostname.
    TwoShards,
    /// Every node (`allNodes`).
    AllNodes,
}

/// Creates ResourceSlice `fabric`, a network-attached pool of `devices` devices
/// (`fabric-0`, …) reaching `reach`; answers its node selector term (`Null` for all
/// nodes).
async fn create_fabric(env: &Env, devices: usize, reach: FabricReach) -> Value {
    let api = &env.api;
    let mut spec = json!({"driver": DRIVER,
        "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
        "devices": (0..devices).map(|i| json!({"name": format!("fabric-{i}")})).collect::<Vec<_>>()});
    let term = if reach == FabricReach::AllNodes {
        spec["allNodes"] = json!(true);
        Value::Null
    } else {
        let (a, b) = nodes_on_two_shards(env, 4).await;
        let term = json!({"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [a, b]}
        ]});
        spec["nodeSelector"] = json!({"nodeSelectorTerms": [term]});
        term
    };
    api.create(
        &RESOURCE_SLICES,
        json!({"metadata": {"name": "fabric"}, "spec": spec}),
    )
    .await
    .expect("network slice");
    term
}

/// Two of `start`'s `nodes` nodes that the cluster put on different shards (read from
/// the front door once every node is registered).
async fn nodes_on_two_shards(env: &Env, nodes: usize) -> (String, String) {
    let client = support::client(&env.cluster, 1).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = client.list_nodes(None).await.unwrap_or_default();
        let shard_of: BTreeMap<String, u32> = listed
            .iter()
            .filter_map(|n| Some((n.node.as_ref()?.name.clone(), n.shard)))
            .collect();
        if shard_of.len() >= nodes {
            let pair = shard_of.iter().find_map(|(a, sa)| {
                shard_of
                    .iter()
                    .find(|(_, sb)| *sb != sa)
                    .map(|(b, _)| (a.clone(), b.clone()))
            });
            return pair.expect("the nodes spread over both shards");
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {nodes} nodes registered",
            shard_of.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A network-attached pool (one ResourceSlice with a node selector naming two nodes of
/// different shards, two devices) serves three one-device pods: two bind, on those
/// nodes, with distinct devices whose allocation carries the slice's node selector; the
/// third waits until one of the two is gone, then takes its device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_attached_pool_serves_two_nodes_of_two_shards_and_books_each_device_once() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    let term = create_fabric(&env, 2, FabricReach::TwoShards).await;
    let (a, b) = nodes_on_two_shards(&env, 4).await;
    let pods: Vec<String> = (0..3).map(|i| format!("fabric-{i}")).collect();
    for name in &pods {
        api.create(&PODS, gpu_pod(name, json!({}), json!({}), "one-gpu"))
            .await
            .expect("pod");
    }
    let now = wait_for(
        "two of the three pods bound, the third refused",
        Duration::from_secs(60),
        &env,
        |v| {
            let bound = pods.iter().filter(|p| v.node_of(p).is_some()).count();
            bound == 2
                && pods.iter().any(|p| {
                    v.node_of(p).is_none() && !v.events_for(p, "FailedScheduling").is_empty()
                })
        },
    )
    .await;
    let bound: Vec<&String> = pods.iter().filter(|p| now.node_of(p).is_some()).collect();
    let mut devices = BTreeSet::new();
    for pod in &bound {
        let node = now.node_of(pod).unwrap_or_default();
        assert!(
            node == a || node == b,
            "{pod} bound to {node}, which the pool does not serve"
        );
        let claim = now
            .claim_of(pod)
            .unwrap_or_else(|| panic!("{pod} has a claim"));
        let allocation = &claim["status"]["allocation"];
        assert_eq!(
            allocation["nodeSelector"],
            json!({"nodeSelectorTerms": [term]}),
            "the slice's node selector: {claim}"
        );
        let result = &allocation["devices"]["results"][0];
        assert_eq!(result["pool"], json!("fabric"), "{claim}");
        devices.insert(result["device"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(devices.len(), 2, "each device booked once: {devices:?}");
    let waiting = pods
        .iter()
        .find(|p| now.node_of(p).is_none())
        .cloned()
        .unwrap_or_default();
    // Long enough for gangway to place the third pod if it thought a device free.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(view(api).await.node_of(&waiting), None, "no third device");
    finish_deletions(api, &[bound[0].clone()]).await;
    let now = wait_for(
        "the third pod bound once a device is free",
        Duration::from_secs(60),
        &env,
        |v| v.node_of(&waiting).is_some(),
    )
    .await;
    let freed = now.device_of(bound[1]).map(|(_, d)| d);
    let taken = now.device_of(&waiting).map(|(_, d)| d);
    assert!(
        taken.is_some() && taken != freed,
        "{waiting} took the freed device, not {freed:?}"
    );
}

/// A shard added to the live cluster (`gangctl shards grow`) gets the cluster-wide state
/// the ingest had written to every shard before (network-attached pools among it): every
/// shard takes part in a reservation of a network device, so one that never heard of
/// the pool would refuse every such pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_pool_reaches_a_shard_added_to_the_live_cluster() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    create_fabric(&env, 2, FabricReach::TwoShards).await;
    api.create(
        &PODS,
        gpu_pod("before-grow", json!({}), json!({}), "one-gpu"),
    )
    .await
    .expect("pod");
    wait_for(
        "a pod bound with a network device",
        Duration::from_secs(60),
        &env,
        |v| v.node_of("before-grow").is_some(),
    )
    .await;
    let client = support::client(&env.cluster, 1).await;
    let grown = client.grow_shards(3).await.expect("grow");
    assert_eq!((grown.shards_before, grown.shards), (2, 3), "{grown:?}");
    api.create(
        &PODS,
        gpu_pod("after-grow", json!({}), json!({}), "one-gpu"),
    )
    .await
    .expect("pod");
    let now = wait_for(
        "a pod bound with a network device after the grow",
        Duration::from_secs(60),
        &env,
        |v| v.node_of("after-grow").is_some(),
    )
    .await;
    let before = now.device_of("before-grow").map(|(_, d)| d);
    let after = now.device_of("after-grow").map(|(_, d)| d);
    assert!(
        after.is_some() && after != before,
        "{before:?} and {after:?}"
    );
}

/// A PodGroup of 4 pods, each half a node, naming one ResourceClaim that only the
/// network-attached pool (one device, reaching two nodes of two shards) can serve: the
/// pods bind to both nodes, the claim is allocated once with the network device and the
/// slice's node selector and reserved for all 4, and a one-device pod waits until the
/// last of the 4 is gone (the pod that allocated it goes first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_shared_by_four_pods_on_two_shards_is_carried_by_a_network_pool() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    let term = create_fabric(&env, 1, FabricReach::TwoShards).await;
    let (a, b) = nodes_on_two_shards(&env, 4).await;
    let (sharing, now) = four_pods_share_a_claim(&env, "fabric-channel", "spanning", "32").await;
    let nodes: BTreeSet<String> = sharing.iter().filter_map(|p| now.node_of(p)).collect();
    assert_eq!(nodes, BTreeSet::from([a, b]), "both nodes the pool reaches");
    let claim = &now.claims["fabric-channel"];
    let allocation = &claim["status"]["allocation"];
    assert_eq!(
        allocation["nodeSelector"],
        json!({"nodeSelectorTerms": [term]}),
        "the slice's node selector: {claim}"
    );
    assert_eq!(
        allocation["devices"]["results"][0]["pool"],
        json!("fabric"),
        "{claim}"
    );
    let after = "after-the-channel".to_string();
    api.create(&PODS, gpu_pod(&after, json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    wait_for(
        "the one-device pod waits",
        Duration::from_secs(30),
        &env,
        |v| !v.events_for(&after, "FailedScheduling").is_empty(),
    )
    .await;
    finish_deletions(api, &sharing[..3]).await;
    // Long enough for gangway to place the pod if it thought the device free.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        view(api).await.node_of(&after),
        None,
        "the device is still {}'s",
        sharing[3]
    );
    finish_deletions(api, &sharing[3..]).await;
    // gangway put upstream's finalizer on the claim, so the resourceclaim controller
    // deallocates it once no pod is reserved (else it would stay allocated, as another
    // scheduler's claim would, and keep the device).
    let now = wait_for(
        "the one-device pod bound once the claim's last pod is gone",
        Duration::from_secs(60),
        &env,
        |v| v.node_of(&after).is_some(),
    )
    .await;
    let claim = &now.claims["fabric-channel"];
    assert!(
        claim["status"]["allocation"].is_null() && claim["metadata"]["finalizers"].is_null(),
        "deallocated by the controller, finalizer removed: {claim}"
    );
}

/// A ResourceSlice that chooses nodes per device (`perDeviceNodeSelection`): a device
/// named for one node is allocated only to a pod placed there (the allocation's node
/// selector names that node), a device for every node goes anywhere (no selector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_device_of_a_per_device_slice_is_allocated_only_where_it_reaches() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    let (_, pinned_node) = nodes_on_two_shards(&env, 4).await;
    let created = api
        .create(
            &RESOURCE_SLICES,
            json!({
                "metadata": {"name": "per-device"},
                "spec": {"driver": DRIVER, "perDeviceNodeSelection": true,
                         "pool": {"name": "per-device", "generation": 1, "resourceSliceCount": 1},
                         "devices": [
                             {"name": "pinned", "nodeName": pinned_node,
                              "attributes": {"kind": {"string": "pinned"}}},
                             {"name": "anywhere", "allNodes": true,
                              "attributes": {"kind": {"string": "anywhere"}}}
                         ]}
            }),
        )
        .await
        .expect("per-device slice");
    assert_eq!(
        created["spec"]["perDeviceNodeSelection"],
        json!(true),
        "the API server keeps perDeviceNodeSelection: {created}"
    );
    for kind in ["pinned", "anywhere"] {
        api.create(
            &DEVICE_CLASSES,
            json!({
                "metadata": {"name": kind},
                "spec": {"selectors": [{"cel": {"expression":
                    format!("device.attributes[\"{DRIVER}\"].kind == \"{kind}\"")}}]}
            }),
        )
        .await
        .expect("class");
        api.create(&RESOURCE_CLAIM_TEMPLATES, template(kind, kind))
            .await
            .expect("template");
        api.create(&PODS, gpu_pod(kind, json!({}), json!({}), kind))
            .await
            .expect("pod");
    }
    let now = wait_for("both pods bound", Duration::from_secs(60), &env, |v| {
        v.bound(&["pinned", "anywhere"])
    })
    .await;
    assert_eq!(now.node_of("pinned"), Some(pinned_node.clone()));
    assert_eq!(
        now.device_of("pinned"),
        Some(("per-device".to_string(), "pinned".to_string()))
    );
    let pinned = &now.claim_of("pinned").expect("claim")["status"]["allocation"];
    assert_eq!(
        pinned["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!([pinned_node]),
        "{pinned}"
    );
    assert_eq!(
        now.device_of("anywhere"),
        Some(("per-device".to_string(), "anywhere".to_string()))
    );
    let anywhere = &now.claim_of("anywhere").expect("claim")["status"]["allocation"];
    assert!(anywhere["nodeSelector"].is_null(), "{anywhere}");
}

/// List-typed device attributes (`DRAListTypeAttributes` on in the API server): a CPU
/// near two PCIe roots matches the NIC on one of them (matchAttribute is a non-empty
/// intersection), `includes` reads a list and a scalar alike, and the allocation
/// written is the one that matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_attributes_match_by_intersection_and_are_read_with_includes() {
    let env = start_with(1, 0, 0, Setup::AdminWithListAttributes).await;
    let api = &env.api;
    let updated = api
        .update(&RESOURCE_SLICES, None, "node-000-gpus", |slice| {
            slice["spec"]["pool"]["generation"] = json!(2);
            slice["spec"]["devices"] = json!([
                {"name": "cpu-0", "attributes": {"kind": {"strings": ["cpu", "smt"]}, "pcieRoots": {"strings": ["r0", "r1"]}}},
                {"name": "cpu-1", "attributes": {"kind": {"strings": ["cpu"]}, "pcieRoots": {"strings": ["r2", "r3"]}}},
                {"name": "nic-0", "attributes": {"kind": {"string": "nic"}, "pcieRoots": {"strings": ["r3"]}}}
            ]);
        })
        .await
        .expect("slice with list attributes");
    assert_eq!(
        updated["spec"]["devices"][0]["attributes"]["pcieRoots"],
        json!({"strings": ["r0", "r1"]}),
        "the API server keeps list attributes with the gate on: {updated}"
    );
    let kind = |k: &str| format!(r#"device.attributes["{DRIVER}"].kind.includes("{k}")"#);
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": "near", "namespace": NS},
        "spec": {"devices": {
            "requests": [
                {"name": "cpu", "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": kind("cpu")}}]}},
                {"name": "nic", "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": kind("nic")}}]}}
            ],
            "constraints": [{"matchAttribute": format!("{DRIVER}/pcieRoots")}]
        }}
    }))
    .await
    .expect("claim");
    let mut pod = gpu_pod("near", json!({}), json!({}), "unused");
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "near"}]);
    api.create(&PODS, pod).await.expect("pod");
    let now = wait_for(
        "the pod with list-attribute constraints bound",
        Duration::from_secs(60),
        &env,
        |v| v.node_of("near").is_some(),
    )
    .await;
    let claim = &now.claims["near"];
    let devices: Vec<(String, String)> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["request"].as_str().unwrap_or_default().to_string(),
                r["device"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        devices,
        [
            ("cpu".to_string(), "cpu-1".to_string()),
            ("nic".to_string(), "nic-0".to_string())
        ],
        "{claim}"
    );
}

/// A network pool with one device, which a claim of another scheduler's holds
/// (allocated as kube-scheduler writes it), and a gangway pod wanting one device;
/// answers the pod's name once gangway has seen the pod and the claim and refused or
/// placed it (see the two tests below).
async fn a_foreign_claim_holds_the_only_network_device(env: &Env) -> String {
    let api = &env.api;
    let term = create_fabric(env, 1, FabricReach::TwoShards).await;
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": "foreign", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }))
    .await
    .expect("claim");
    api.update(&RESOURCE_CLAIMS, Some(NS), "foreign", |claim| {
        claim["status"]["allocation"] = json!({
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "fabric", "device": "fabric-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [term]}
        });
    })
    .await
    .expect("another scheduler's allocation");
    // Long enough for gangway to see the claim (ingest passes run at least every 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = "fabric-waits".to_string();
    api.create(&PODS, gpu_pod(&pod, json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    wait_for(
        "gangway refused or placed the pod",
        Duration::from_secs(60),
        env,
        |v| v.node_of(&pod).is_some() || !v.events_for(&pod, "FailedScheduling").is_empty(),
    )
    .await;
    pod
}

/// A network device another scheduler's claim holds is not given out; once that claim
/// is deallocated, the waiting pod binds to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_device_another_scheduler_allocated_is_not_given_out_until_freed() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    let pod = a_foreign_claim_holds_the_only_network_device(&env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(view(api).await.node_of(&pod), None, "the device is taken");
    api.update(&RESOURCE_CLAIMS, Some(NS), "foreign", |claim| {
        claim["status"] = json!({});
    })
    .await
    .expect("deallocated");
    let now = wait_for(
        "the pod bound once the device is free",
        Duration::from_secs(60),
        &env,
        |v| v.node_of(&pod).is_some(),
    )
    .await;
    assert_eq!(
        now.device_of(&pod),
        Some(("fabric".to_string(), "fabric-0".to_string()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_an_ingest_that_ignores_other_schedulers_network_claims() {
    let env = start_armed(
        4,
        0,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::OTHER_SCHEDULERS_NETWORK_CLAIMS_IGNORED],
    )
    .await;
    let pod = a_foreign_claim_holds_the_only_network_device(&env).await;
    wait_for(
        "the pod bound to the device another claim holds (the bug switch)",
        Duration::from_secs(30),
        &env,
        |v| v.device_of(&pod) == Some(("fabric".to_string(), "fabric-0".to_string())),
    )
    .await;
}

/// On one node of three GPUs, `holder` binds to one; then the node's ResourceSlice is
/// deleted (as the kubelet does when its driver unregisters) and `waiter` is created.
/// Returns once gangway placed or refused the waiter.
async fn a_slice_is_deleted_under_a_holder(env: &Env) {
    let api = &env.api;
    api.create(&PODS, gpu_pod("holder", json!({}), json!({}), "one-gpu"))
        .await
        .expect("holder");
    wait_for("the holder bound", Duration::from_secs(60), env, |v| {
        v.node_of("holder").is_some()
    })
    .await;
    api.delete(&RESOURCE_SLICES, None, "node-000-gpus")
        .await
        .expect("slice deleted");
    // Long enough for gangway to see it (ingest passes run at least every 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.create(&PODS, gpu_pod("waiter", json!({}), json!({}), "one-gpu"))
        .await
        .expect("waiter");
    wait_for(
        "gangway refused or placed the waiter",
        Duration::from_secs(60),
        env,
        |v| v.node_of("waiter").is_some() || !v.events_for("waiter", "FailedScheduling").is_empty(),
    )
    .await;
}

/// How many of node-000's devices the Inventory API shows withdrawn.
async fn withdrawn_devices(env: &Env) -> usize {
    let node = env
        .cluster
        .inventory(1)
        .await
        .get_node(gangway_proto::v1::GetNodeRequest {
            name: "node-000".into(),
        })
        .await
        .expect("node-000")
        .into_inner();
    node.devices.iter().filter(|d| d.withdrawn).count()
}

/// The holder keeps its device and its claim, and is not asked to leave.
fn assert_holder_stays(v: &View) {
    let holder = &v.pods["holder"];
    assert!(
        holder["metadata"]["deletionTimestamp"].is_null(),
        "the holder is not evicted: {holder}"
    );
    assert!(
        v.device_of("holder").is_some(),
        "the holder keeps its claim"
    );
}

/// A pool whose slices are deleted is withdrawn: its holder stays, nothing new is
/// given its devices; published again (the driver back, at generation 1), its free
/// devices are given out, the held one is not; and a pool whose slice went while
/// every gangway process was down is withdrawn by the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_slices_are_deleted_offers_nothing_new_and_evicts_nobody() {
    let mut env = start(1, 3, 0).await;
    a_slice_is_deleted_under_a_holder(&env).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let v = view(&env.api).await;
    assert_eq!(v.node_of("waiter"), None, "no device is offered");
    assert_holder_stays(&v);
    assert_eq!(
        withdrawn_devices(&env).await,
        3,
        "the Inventory API shows it"
    );
    env.api
        .create(&RESOURCE_SLICES, slice("node-000", 3))
        .await
        .expect("slice back");
    let v = wait_for("the waiter bound", Duration::from_secs(60), &env, |v| {
        v.node_of("waiter").is_some()
    })
    .await;
    assert_ne!(v.device_of("waiter"), v.device_of("holder"));
    assert_holder_stays(&v);
    assert_eq!(withdrawn_devices(&env).await, 0);
    // The slice goes while no gangway process runs; the new leader withdraws the pool.
    for id in [1, 2, 3] {
        env.cluster.kill(id);
    }
    env.api
        .delete(&RESOURCE_SLICES, None, "node-000-gpus")
        .await
        .expect("slice deleted again");
    for id in [1, 2, 3] {
        env.cluster.spawn(id);
    }
    env.cluster
        .wait_ready(&[1, 2, 3], Duration::from_secs(30))
        .await;
    env.api
        .create(&PODS, gpu_pod("late", json!({}), json!({}), "one-gpu"))
        .await
        .expect("late pod");
    wait_for(
        "gangway refused the late pod",
        Duration::from_secs(60),
        &env,
        |v| v.node_of("late").is_some() || !v.events_for("late", "FailedScheduling").is_empty(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let v = view(&env.api).await;
    assert_eq!(v.node_of("late"), None, "the third GPU is not offered");
    assert_holder_stays(&v);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_an_ingest_that_offers_pools_without_slices() {
    let env = start_armed(
        1,
        3,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::SLICELESS_POOLS_OFFERED],
    )
    .await;
    a_slice_is_deleted_under_a_holder(&env).await;
    wait_for(
        "the waiter bound to a device whose slice is gone (the bug switch)",
        Duration::from_secs(30),
        &env,
        |v| v.node_of("waiter").is_some(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_is_classified_as_the_real_server_answers_it() {
    use gangway_server::kube::api::{bind, BindOutcome};
    use gangway_server::kube::objects::PodRef;
    let _serial = KUBE_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let api = ControlPlane::start(Options {
        controllers: Vec::new(),
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    api.ensure_namespace(NS).await.expect("namespace");
    for name in ["node-000", "node-001"] {
        api.create(&NODES, node(name)).await.expect("node");
    }
    let created = api
        .create(&PODS, cpu_pod("p", json!({}), json!({})))
        .await
        .expect("pod");
    let uid = created["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let pod = PodRef {
        namespace: NS.into(),
        name: "p".into(),
        uid: uid.clone(),
    };
    let client = api.client();
    assert_eq!(
        bind(&client, &pod, "node-000").await.expect("bind"),
        BindOutcome::Bound
    );
    assert_eq!(
        bind(&client, &pod, "node-000").await.expect("bind again"),
        BindOutcome::AlreadyBound,
        "a 409 for the same node is an earlier success"
    );
    assert_eq!(
        bind(&client, &pod, "node-001")
            .await
            .expect("bind elsewhere"),
        BindOutcome::BoundElsewhere("node-000".into())
    );
    let stale = PodRef {
        uid: "00000000-0000-0000-0000-000000000000".into(),
        ..pod.clone()
    };
    assert_eq!(
        bind(&client, &stale, "node-000")
            .await
            .expect("bind a replaced pod"),
        BindOutcome::PodGone,
        "another pod under the same name"
    );
    let missing = PodRef {
        name: "never-made".into(),
        ..pod
    };
    assert_eq!(
        bind(&client, &missing, "node-000")
            .await
            .expect("bind a missing pod"),
        BindOutcome::PodGone
    );
    assert_eq!(
        api.bindings().len(),
        1,
        "one binding reached the server: {:?}",
        api.bindings()
    );

    // A claim written from a stale copy (as the informer may hold one): the copy's
    // resourceVersion makes the first write a 409, the claim is read again, and written.
    use gangway_server::kube::api::{write_claim, ClaimOutcome};
    api.create(&DEVICE_CLASSES, json!({
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]}
    }))
    .await
    .expect("class");
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": "c", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }))
    .await
    .expect("claim");
    let stale = api
        .get(&RESOURCE_CLAIMS, Some(NS), "c")
        .await
        .expect("claim");
    api.update(&RESOURCE_CLAIMS, Some(NS), "c", |c| {
        c["metadata"]["labels"] = json!({"touched": "yes"});
    })
    .await
    .expect("newer claim");
    let allocation = json!({"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "node-000", "device": "gpu-0"}
    ], "config": []}});
    let owner = PodRef {
        namespace: NS.into(),
        name: "p".into(),
        uid,
    };
    let outcome = write_claim(&client, NS, "c", &allocation, &owner, Some(&stale))
        .await
        .expect("claim written");
    assert_eq!(outcome, ClaimOutcome::Written);
    let claim = api
        .get(&RESOURCE_CLAIMS, Some(NS), "c")
        .await
        .expect("claim");
    assert_eq!(
        claim["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0",
        "{claim}"
    );
    assert_eq!(
        claim["metadata"]["labels"]["touched"], "yes",
        "the newer claim kept"
    );
    assert_eq!(claim["status"]["reservedFor"][0]["uid"], owner.uid.as_str());
    assert_eq!(
        claim["metadata"]["finalizers"],
        json!(["resource.kubernetes.io/delete-protection"]),
        "upstream's finalizer, put before the allocation"
    );
    let writes = |subresource: &str| -> Vec<(String, u16)> {
        api.audit()
            .iter()
            .filter(|e| e.resource == "resourceclaims" && e.name == "c")
            .filter(|e| e.subresource == subresource && e.verb != "create")
            .map(|e| (e.verb.clone(), e.code))
            .collect()
    };
    // The finalizer's patch goes first, with the copy's resourceVersion as precondition:
    // the stale copy's is refused, one from a fresh read is taken, then the status.
    assert_eq!(
        writes(""),
        [
            ("update".to_string(), 200),
            ("patch".to_string(), 409),
            ("patch".to_string(), 200)
        ],
        "the test's own update, the stale copy's patch refused, then one from a fresh read"
    );
    assert_eq!(writes("status"), [("update".to_string(), 200)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pod_group_crd_is_reported_once_and_scheduling_goes_on() {
    let env = start_with(2, 2, 0, Setup::AdminWithoutCrds).await;
    let koord = json!({"gang.scheduling.koordinator.sh/name": "k", "gang.scheduling.koordinator.sh/min-available": "2"});
    let pods = ["k-0", "k-1"];
    for name in pods {
        env.api
            .create(&PODS, cpu_pod(name, json!({}), koord.clone()))
            .await
            .expect("pod");
    }
    wait_for(
        "a Koordinator gang bound without PodGroup CRDs",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&pods),
    )
    .await;
    // Watch retries back off; each replica says so once per kind, not once per retry.
    tokio::time::sleep(Duration::from_secs(8)).await;
    for id in 1..=3 {
        let log = env.cluster.log(id);
        let warnings: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("podgroups"))
            .collect();
        assert!(
            warnings.len() <= 2,
            "replica {id} logged {} warnings about the missing PodGroup kinds:\n{}",
            warnings.len(),
            warnings.join("\n")
        );
        // DeviceTaintRules are off by default in 1.36: said once, and not as a warning.
        let rules: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("devicetaintrules"))
            .collect();
        assert!(
            rules.len() == 1 && rules[0].contains("INFO") && rules[0].contains("not served"),
            "replica {id} on the unserved DeviceTaintRules: {rules:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_kinds_schedule_bad_objects_are_reported_and_deleted_pods_free_devices() {
    let env = start(2, 2, 0).await;
    let api = &env.api;

    // A Koordinator gang (annotations only) and a scheduler-plugins PodGroup gang.
    let koord = json!({"gang.scheduling.koordinator.sh/name": "koord", "gang.scheduling.koordinator.sh/min-available": "2"});
    for name in ["koord-0", "koord-1"] {
        api.create(&PODS, cpu_pod(name, json!({}), koord.clone()))
            .await
            .expect("pod");
    }
    api.create(
        &POD_GROUPS_SIGS,
        json!({"metadata": {"name": "plugins", "namespace": NS}, "spec": {"minMember": 2}}),
    )
    .await
    .expect("pod group");
    for name in ["plugins-0", "plugins-1"] {
        let labels = json!({"pod-group.scheduling.sigs.k8s.io": "plugins"});
        api.create(&PODS, cpu_pod(name, labels, json!({})))
            .await
            .expect("pod");
    }
    // Bad objects: an unparsable annotation, and a claim naming a missing DeviceClass.
    let bad = json!({"gang.scheduling.koordinator.sh/name": "bad", "gang.scheduling.koordinator.sh/min-available": "many"});
    api.create(&PODS, cpu_pod("bad-annotation", json!({}), bad))
        .await
        .expect("pod");
    api.create(
        &RESOURCE_CLAIM_TEMPLATES,
        template("no-class", "tpu.example.com"),
    )
    .await
    .expect("template");
    api.create(
        &PODS,
        gpu_pod("missing-class", json!({}), json!({}), "no-class"),
    )
    .await
    .expect("pod");

    // A gang no node can hold (100 CPUs a pod) with a 2 s waiting time: timed out.
    create_too_big_gang(api).await;

    let good = ["koord-0", "koord-1", "plugins-0", "plugins-1"];
    wait_for("both gangs bound", Duration::from_secs(60), &env, |v| {
        v.bound(&good)
    })
    .await;
    wait_for(
        "FailedScheduling for the bad annotation",
        Duration::from_secs(30),
        &env,
        |v| {
            v.events_for("bad-annotation", "FailedScheduling")
                .iter()
                .any(|m| m.contains("min-available"))
        },
    )
    .await;
    wait_for(
        "FailedScheduling for the missing class",
        Duration::from_secs(30),
        &env,
        |v| {
            v.events_for("missing-class", "FailedScheduling")
                .iter()
                .any(|m| m.contains("tpu.example.com"))
        },
    )
    .await;
    // The annotation is written first, then the event.
    let now = wait_for(
        "the too-big gang marked timed out, and its pods told so",
        Duration::from_secs(30),
        &env,
        |v| {
            ["too-big-0", "too-big-1"].iter().all(|p| {
                let marked = v.pods.get(*p).is_some_and(|pod| {
                    pod["metadata"]["annotations"]["gang.scheduling.koordinator.sh/timeout"]
                        == "true"
                });
                let told = v
                    .events_for(p, "FailedScheduling")
                    .iter()
                    .any(|m| m.contains("timed out"));
                marked && told
            })
        },
    )
    .await;
    for p in ["too-big-0", "too-big-1", "bad-annotation", "missing-class"] {
        assert_eq!(now.node_of(p), None, "{p} is not bound");
    }
    // The Scheduled event follows the binding.
    let now = wait_for("Scheduled events", Duration::from_secs(10), &env, |v| {
        good.iter()
            .all(|p| !v.events_for(p, "Scheduled").is_empty())
    })
    .await;
    for p in good {
        assert_eq!(
            now.events_for(p, "Scheduled").len(),
            1,
            "one Scheduled event for {p}"
        );
        assert!(
            now.events_for(p, "FailedScheduling").is_empty(),
            "{p} was not disturbed"
        );
    }

    // Four GPUs, four single pods take them; a fifth waits until one is deleted.
    let singles: Vec<String> = (0..4).map(|i| format!("single-{i}")).collect();
    for name in &singles {
        api.create(&PODS, gpu_pod(name, json!({}), json!({}), "one-gpu"))
            .await
            .expect("pod");
    }
    wait_for("four GPU pods bound", Duration::from_secs(60), &env, |v| {
        v.bound(&singles)
    })
    .await;
    api.create(&PODS, gpu_pod("waiter", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = view(api).await;
    assert_eq!(now.node_of("waiter"), None, "no free GPU for the fifth pod");
    let freed = now.device_of("single-2").expect("single-2 has a device");
    api.delete(&PODS, Some(NS), "single-2")
        .await
        .expect("delete");
    let now = wait_for(
        "the waiter bound after the deletion",
        Duration::from_secs(30),
        &env,
        |v| v.node_of("waiter").is_some(),
    )
    .await;
    let mut all: Vec<String> = singles
        .iter()
        .filter(|p| *p != "single-2")
        .cloned()
        .collect();
    all.push("waiter".into());
    check_claims(&now, &api.audit(), &all);
    assert_eq!(
        now.device_of("waiter"),
        Some(freed),
        "the waiter took the freed GPU"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_crd_and_rbac_are_accepted_and_are_all_gangway_needs() {
    let env = start_with(2, 4, 0, Setup::Chart).await;
    let api = &env.api;
    // A PodGroup DRA gang (claims, binding, PodGroup status, events), a gang that
    // times out (pod annotation), and an eviction from a tainted device (pod status,
    // delete): every write the adapter makes, as the chart's ServiceAccount.
    let gang = create_gpu_gang(api, "trainer", 4).await;
    create_too_big_gang(api).await;
    let now = wait_for(
        "the gang bound, its PodGroup Scheduled, the big gang timed out",
        Duration::from_secs(60),
        &env,
        |v| {
            let timed_out = ["too-big-0", "too-big-1"].iter().all(|p| {
                v.pods.get(*p).is_some_and(|pod| {
                    pod["metadata"]["annotations"]["gang.scheduling.koordinator.sh/timeout"]
                        == "true"
                })
            });
            v.bound(&gang)
                && timed_out
                && gang
                    .iter()
                    .all(|p| !v.events_for(p, "Scheduled").is_empty())
                && v.pod_groups
                    .get("trainer")
                    .is_some_and(|g| g["status"]["phase"] == "Scheduled")
        },
    )
    .await;
    check_claims(&now, &api.audit(), &gang);
    let victim = gang[0].clone();
    let (pool, device) = now.device_of(&victim).expect("device");
    taint_device(api, &pool, &device).await;
    wait_for(
        "the pod on the tainted device evicted",
        Duration::from_secs(30),
        &env,
        |v| {
            v.going(&victim)
                && v.pods.get(&victim).is_none_or(|p| {
                    p["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget"))
                })
        },
    )
    .await;
    // Nothing the adapter asked for was refused.
    let refused: Vec<AuditEntry> = api
        .audit()
        .into_iter()
        .filter(|e| e.user.starts_with("system:serviceaccount:") && e.code == 403)
        .collect();
    assert!(
        refused.is_empty(),
        "writes refused to the chart's identity: {refused:#?}"
    );
    for id in 1..=3 {
        let log = env.cluster.log(id);
        let forbidden: Vec<&str> = log
            .lines()
            // An API error reads "METHOD PATH: 403 Forbidden: ..." (a bare "403" also
            // turns up in timestamps and ports).
            .filter(|l| l.contains(": 403 ") || l.to_lowercase().contains("forbidden"))
            .collect();
        assert!(
            forbidden.is_empty(),
            "replica {id} was refused something:\n{}",
            forbidden.join("\n")
        );
    }
}

fn pod_with_cpu(name: &str, cpu: &str, annotations: Value) -> Value {
    support::objects::pod_with_cpu(NS, name, cpu, annotations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_pods_count_and_pods_on_bad_devices_are_evicted() {
    let env = start(2, 2, 0).await;
    let api = &env.api;

    // A pod another scheduler bound to node-000: 62 of its 64 CPUs and, through a claim
    // it allocated, node-000/gpu-0.
    api.create(&RESOURCE_CLAIMS, json!({
        "metadata": {"name": "foreign-gpu", "namespace": "infra"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node-000", "device": "gpu-0"}
        ]}}}
    }))
    .await
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
    .await
    .expect("foreign pod");

    // Three GPU pods take the three GPUs the foreign pod leaves.
    let gpu_pods: Vec<String> = (0..3).map(|i| format!("g-{i}")).collect();
    for name in &gpu_pods {
        api.create(&PODS, gpu_pod(name, json!({}), json!({}), "one-gpu"))
            .await
            .expect("pod");
    }
    let now = wait_for("three GPU pods bound", Duration::from_secs(60), &env, |v| {
        v.bound(&gpu_pods) && gpu_pods.iter().all(|p| v.device_of(p).is_some())
    })
    .await;
    let taken: BTreeSet<(String, String)> =
        gpu_pods.iter().filter_map(|p| now.device_of(p)).collect();
    assert_eq!(taken.len(), 3, "three distinct devices: {taken:?}");
    assert!(
        !taken.contains(&("node-000".into(), "gpu-0".into())),
        "the foreign pod's GPU was not given away: {taken:?}"
    );

    // 40 CPUs fit node-001 once; node-000 has 1 CPU left beside the foreign pod.
    for name in ["big-0", "big-1"] {
        api.create(&PODS, pod_with_cpu(name, "40", json!({})))
            .await
            .expect("pod");
    }
    wait_for("one big pod bound", Duration::from_secs(30), &env, |v| {
        v.node_of("big-0").is_some() || v.node_of("big-1").is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = view(api).await;
    let bound: Vec<String> = ["big-0", "big-1"]
        .iter()
        .filter_map(|p| now.node_of(p))
        .collect();
    assert_eq!(
        bound,
        vec!["node-001".to_string()],
        "the foreign pod's CPUs count"
    );
    api.delete(&PODS, Some("infra"), "foreign")
        .await
        .expect("delete");
    wait_for(
        "the second big pod bound once the foreign pod is gone",
        Duration::from_secs(30),
        &env,
        |v| v.bound(&["big-0", "big-1"]),
    )
    .await;

    // A NoExecute taint on the device of one GPU pod (a new slice generation): evicted.
    let victim = gpu_pods
        .iter()
        .find(|p| now.device_of(p).is_some_and(|(pool, _)| pool == "node-001"))
        .cloned()
        .expect("a GPU pod on node-001");
    let (_, device) = now.device_of(&victim).expect("device");
    taint_device(api, "node-001", &device).await;
    // The condition is written first, then the delete (graceful: the pod stays,
    // terminating, until a kubelet would finish it), then the event.
    let now = wait_for(
        "the pod on the tainted device deleted, and a Warning event naming the taint",
        Duration::from_secs(30),
        &env,
        |v| {
            v.going(&victim)
                && v.events_for(&victim, "DeviceEviction")
                    .iter()
                    .any(|m| m.contains("example.com/ecc"))
        },
    )
    .await;
    let deleted = api.audit().iter().any(|e| {
        e.resource == "pods" && e.subresource.is_empty() && e.verb == "delete" && e.name == victim
    });
    assert!(deleted, "{victim} deleted over the API");
    if let Some(pod) = now.pods.get(&victim) {
        let condition = pod["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget").cloned())
            .expect("DisruptionTarget condition");
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "DeletionByDeviceTaintManager");
    }
    for other in gpu_pods.iter().filter(|p| **p != victim) {
        assert!(
            now.node_of(other).is_some() && !now.going(other),
            "{other} was not evicted"
        );
    }
}

/// Makes node-000's gpu-0 a device the driver must attach before a pod may be bound
/// (binding conditions, a new slice generation).
async fn require_attachment(api: &ControlPlane) {
    api.update(&RESOURCE_SLICES, None, "node-000-gpus", |slice| {
        slice["spec"]["pool"]["generation"] = json!(2);
        if let Some(devices) = slice["spec"]["devices"].as_array_mut() {
            for d in devices.iter_mut().filter(|d| d["name"] == "gpu-0") {
                d["bindingConditions"] = json!(["example.com/attached"]);
                d["bindingFailureConditions"] = json!(["example.com/attach-failed"]);
            }
        }
    })
    .await
    .expect("binding conditions");
}

/// Acts as the driver: sets `condition` True on the device in claim `name`'s status.
async fn report_condition(api: &ControlPlane, name: &str, condition: &str) {
    api.update(&RESOURCE_CLAIMS, Some(NS), name, |claim| {
        claim["status"]["devices"] = json!([{
            "driver": DRIVER, "pool": "node-000", "device": "gpu-0",
            "conditions": [{"type": condition, "status": "True", "reason": "Driver",
                            "message": "", "lastTransitionTime": "2026-11-26T08:00:00Z"}]
        }]);
    })
    .await
    .expect("device status");
}

/// A pod claiming the one GPU of node-000, which needs attaching; answers its claim's
/// name once the claim is allocated with the device's binding conditions.
async fn pod_waiting_for_attachment(env: &Env) -> String {
    require_attachment(&env.api).await;
    env.api
        .create(&PODS, gpu_pod("attach", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    let now = wait_for(
        "the claim allocated with the device's binding conditions",
        Duration::from_secs(60),
        env,
        |v| {
            v.claim_of("attach").is_some_and(|c| {
                c["status"]["allocation"]["devices"]["results"][0]["bindingConditions"]
                    == json!(["example.com/attached"])
            })
        },
    )
    .await;
    let claim = now.claim_of("attach").expect("claim");
    claim["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_waits_for_the_drivers_conditions_and_a_failure_deallocates_the_claim() {
    let env = start(1, 1, 0).await;
    let claim = pod_waiting_for_attachment(&env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        view(&env.api).await.node_of("attach"),
        None,
        "not bound before attached"
    );

    // The driver fails to attach: the claim is deallocated, the pod told why.
    report_condition(&env.api, &claim, "example.com/attach-failed").await;
    wait_for(
        "FailedBinding naming the failure condition, and the claim deallocated",
        Duration::from_secs(30),
        &env,
        |v| {
            v.events_for("attach", "FailedBinding")
                .iter()
                .any(|m| m.contains("example.com/attach-failed"))
                && v.claims[&claim]["status"]["allocation"].is_null()
        },
    )
    .await;
    assert_eq!(view(&env.api).await.node_of("attach"), None);

    // Allocated again after the back-off; attached this time: bound.
    wait_for(
        "the claim allocated again",
        Duration::from_secs(30),
        &env,
        |v| !v.claims[&claim]["status"]["allocation"].is_null(),
    )
    .await;
    report_condition(&env.api, &claim, "example.com/attached").await;
    wait_for(
        "the pod bound once attached",
        Duration::from_secs(30),
        &env,
        |v| v.node_of("attach").is_some(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_binder_that_ignores_binding_conditions() {
    let env = start_armed(
        1,
        1,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::BINDER_IGNORES_BINDING_CONDITIONS],
    )
    .await;
    pod_waiting_for_attachment(&env).await;
    wait_for(
        "the pod bound before its device is attached (the bug switch)",
        Duration::from_secs(30),
        &env,
        |v| v.node_of("attach").is_some(),
    )
    .await;
}

/// Creates DeviceTaintRule `name` putting `effect` on `device` of node-000's GPUs.
async fn create_taint_rule(api: &ControlPlane, name: &str, device: &str, effect: &str) {
    let rule = json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": "node-000", "device": device},
                 "taint": {"key": format!("example.com/{name}"), "value": "true", "effect": effect}}
    });
    api.call(
        http::Method::POST,
        "/apis/resource.k8s.io/v1beta2/devicetaintrules",
        "application/json",
        Some(&rule),
    )
    .await
    .expect("DeviceTaintRule");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_taint_rules_keep_pods_off_evict_holders_and_lift_when_deleted() {
    // Under the chart's ClusterRole: it must let gangway read the rules.
    let env = start_with(1, 2, 0, Setup::ChartWithTaintRules).await;
    let api = &env.api;
    api.create(&PODS, gpu_pod("held", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    let now = wait_for(
        "the first GPU pod bound",
        Duration::from_secs(60),
        &env,
        |v| v.device_of("held").is_some() && v.node_of("held").is_some(),
    )
    .await;
    let (_, held) = now.device_of("held").expect("device");
    let free = if held == "gpu-0" { "gpu-1" } else { "gpu-0" };

    // NoSchedule on the free GPU: a second pod has nowhere to go.
    create_taint_rule(api, "maintenance", free, "NoSchedule").await;
    // The rule must be in the ledger before the pod is looked at: give the ingest a pass.
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.create(&PODS, gpu_pod("next", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    wait_for(
        "FailedScheduling for the pod with only a tainted GPU left",
        Duration::from_secs(30),
        &env,
        |v| !v.events_for("next", "FailedScheduling").is_empty(),
    )
    .await;
    assert_eq!(view(api).await.node_of("next"), None);

    // NoExecute on the held GPU: its pod is evicted, as a slice taint would evict it.
    create_taint_rule(api, "ecc", &held, "NoExecute").await;
    wait_for(
        "the pod on the GPU a rule taints NoExecute evicted, the event naming the taint",
        Duration::from_secs(30),
        &env,
        |v| {
            v.going("held")
                && v.events_for("held", "DeviceEviction")
                    .iter()
                    .any(|m| m.contains("example.com/ecc"))
        },
    )
    .await;
    finish_deletions(api, &["held".to_string()]).await;
    assert_eq!(view(api).await.node_of("next"), None, "both GPUs tainted");

    // The NoSchedule rule goes: the pod waiting gets that GPU.
    api.call(
        http::Method::DELETE,
        "/apis/resource.k8s.io/v1beta2/devicetaintrules/maintenance",
        "application/json",
        None,
    )
    .await
    .expect("delete rule");
    let now = wait_for(
        "the waiting pod bound once the rule is deleted",
        Duration::from_secs(30),
        &env,
        |v| v.node_of("next").is_some() && v.device_of("next").is_some(),
    )
    .await;
    assert_eq!(
        now.device_of("next").map(|(_, d)| d),
        Some(free.to_string())
    );
}

/// A DeviceTaintRule with effect NoExecute on a device of a network-attached pool
/// evicts the pod holding it (from whichever shard placed it), as on a node's device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_taint_rule_on_a_network_device_evicts_its_holder() {
    let env = start_with(4, 0, 0, Setup::ChartWithTaintRules).await;
    let api = &env.api;
    create_fabric(&env, 1, FabricReach::AllNodes).await;
    api.create(&PODS, gpu_pod("held", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    let now = wait_for(
        "the pod bound to the network device",
        Duration::from_secs(60),
        &env,
        |v| v.node_of("held").is_some() && v.device_of("held").is_some(),
    )
    .await;
    assert_eq!(
        now.device_of("held"),
        Some(("fabric".to_string(), "fabric-0".to_string()))
    );
    let claim = now.claim_of("held").expect("claim");
    assert!(
        claim["status"]["allocation"]["nodeSelector"].is_null(),
        "an allNodes device leaves the pod free to run anywhere: {claim}"
    );
    let rule = json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": "fabric-ecc"},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": "fabric", "device": "fabric-0"},
                 "taint": {"key": "example.com/fabric-ecc", "value": "true", "effect": "NoExecute"}}
    });
    api.call(
        http::Method::POST,
        "/apis/resource.k8s.io/v1beta2/devicetaintrules",
        "application/json",
        Some(&rule),
    )
    .await
    .expect("DeviceTaintRule");
    wait_for(
        "the holder of the tainted network device evicted, the event naming the taint",
        Duration::from_secs(30),
        &env,
        |v| {
            v.going("held")
                && v.events_for("held", "DeviceEviction")
                    .iter()
                    .any(|m| m.contains("example.com/fabric-ecc"))
        },
    )
    .await;
}

// ---- preemption ---------------------------------------------------------------------------

/// Makes PriorityClasses `low` (10), `high` (1000) and `highest` (2000).
async fn create_priority_classes(api: &ControlPlane) {
    support::kube::create_priority_classes(api, &[("low", 10), ("high", 1000), ("highest", 2000)])
        .await;
}

/// Creates a Koordinator gang `gang` of `size` pods of `cpu` CPUs each, of PriorityClass
/// `class`, all of them needed (min-available = size); answers the pod names.
async fn create_priority_gang(
    api: &ControlPlane,
    gang: &str,
    size: usize,
    cpu: &str,
    class: &str,
) -> Vec<String> {
    let annotations = json!({"gang.scheduling.koordinator.sh/name": gang,
                             "gang.scheduling.koordinator.sh/min-available": size.to_string()});
    let mut names = Vec::new();
    for i in 0..size {
        let name = format!("{gang}-{i}");
        let mut pod = pod_with_cpu(&name, cpu, annotations.clone());
        pod["metadata"]["labels"] = json!({"app": gang});
        pod["spec"]["priorityClassName"] = json!(class);
        api.create(&PODS, pod).await.expect("pod");
        names.push(name);
    }
    names
}

/// The `DisruptionTarget` condition's reason on `pod`, if it has one.
fn disruption_reason(view: &View, pod: &str) -> Option<String> {
    view.pods.get(pod)?["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")?["reason"]
        .as_str()
        .map(String::from)
}

/// Acts as the kubelets would: finishes the graceful deletion of `pods` (no kubelet
/// runs here, so a deleted bound pod stays terminating until this).
async fn finish_deletions(api: &ControlPlane, pods: &[String]) {
    for name in pods {
        match api.delete(&PODS, Some(NS), name).await {
            Ok(_) => {}
            Err(e) if e.code() == Some(404) => {}
            Err(e) => panic!("finishing the deletion of {name}: {e}"),
        }
    }
}

/// A low-priority Strict gang of 8 fills every node (4 nodes of 64 CPUs over two
/// shards, two 32-CPU pods each); then a high-priority gang of 8 arrives. Answers the
/// two gangs' pods once every low pod is evicted (DisruptionTarget, then deleted;
/// without kubelets they stay terminating).
async fn preemption_begins(env: &Env) -> (Vec<String>, Vec<String>) {
    let api = &env.api;
    create_priority_classes(api).await;
    let low = create_priority_gang(api, "low", 8, "32", "low").await;
    wait_for("the low gang bound", Duration::from_secs(60), env, |v| {
        v.bound(&low)
    })
    .await;
    let high = create_priority_gang(api, "high", 8, "32", "high").await;
    let now = wait_for(
        "every low pod evicted for the high gang",
        Duration::from_secs(60),
        env,
        |v| low.iter().all(|p| v.going(p)),
    )
    .await;
    for p in &low {
        if now.pods.contains_key(p) {
            assert_eq!(
                disruption_reason(&now, p).as_deref(),
                Some("PreemptionByScheduler"),
                "{p}"
            );
        }
    }
    (low, high)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_gang_preempts_a_low_gang_whole_and_binds_once_the_victims_are_gone() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    let (low, high) = preemption_begins(&env).await;

    // Until the victims' pods are gone, the high pods wait (their room is still used),
    // nominated to their nodes.
    wait_for(
        "the high pods nominated",
        Duration::from_secs(30),
        &env,
        |v| {
            high.iter().all(|p| {
                v.pods
                    .get(p)
                    .is_some_and(|o| o["status"]["nominatedNodeName"].is_string())
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = view(api).await;
    assert!(
        high.iter().all(|p| now.node_of(p).is_none()),
        "no high pod is bound while the victims still run: {:?}",
        high.iter()
            .filter_map(|p| now.node_of(p))
            .collect::<Vec<_>>()
    );
    for p in &low {
        let events = now.events_for(p, "Preempted");
        assert!(
            events
                .iter()
                .any(|m| m.contains("Preempted by gang train/high")),
            "{p}: {events:?}"
        );
    }
    let nominated: BTreeMap<String, String> = high
        .iter()
        .filter_map(|p| {
            let node = now.pods[p]["status"]["nominatedNodeName"].as_str()?;
            Some((p.clone(), node.to_string()))
        })
        .collect();
    let nodes: BTreeSet<&String> = nominated.values().collect();
    assert_eq!(nodes.len(), 4, "nominated over every node: {nominated:?}");

    // The kubelets finish the deletions: the high gang binds where it was nominated.
    finish_deletions(api, &low).await;
    let now = wait_for(
        "the high gang bound once the victims are gone",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&high),
    )
    .await;
    // (The API server clears nominatedNodeName at the binding.)
    for p in &high {
        assert_eq!(
            now.node_of(p).as_ref(),
            nominated.get(p),
            "{p} bound where it was nominated"
        );
    }
    check_bound_once_where_committed(&env, 3, &high).await;
    let (names, text) = scrape(&env.cluster).await;
    assert!(
        names.contains("gangway_preemption_victims_gone_seconds"),
        "{names:?}"
    );
    let evicted: f64 = text
        .lines()
        .filter(|l| l.starts_with("gangway_evictions_total{cause=\"preemption\"}"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(evicted, 8.0, "every victim evicted once");

    // A gang that evicting every lower-priority pod would not make room for (9 x 32 CPUs
    // on 4 x 64) evicts nothing.
    let huge = create_priority_gang(api, "huge", 9, "32", "highest").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let now = view(api).await;
    for p in &high {
        assert!(
            now.node_of(p).is_some() && !now.going(p),
            "{p} was not evicted for a gang that cannot fit"
        );
    }
    assert!(huge.iter().all(|p| now.node_of(p).is_none()));
}

/// policy/v1 PodDisruptionBudgets (written with their status here: no disruption
/// controller runs in these tests).
const PDBS: gangway_kube_double::store::Kind = gangway_kube_double::store::Kind {
    group: "policy",
    version: "v1",
    plural: "poddisruptionbudgets",
    kind: "PodDisruptionBudget",
    namespaced: true,
    status_subresource: true,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_spares_a_gang_a_disruption_budget_protects() {
    let env = start(4, 0, 0).await;
    let api = &env.api;
    create_priority_classes(api).await;
    api.create(
        &PDBS,
        json!({
            "metadata": {"name": "guarded", "namespace": NS},
            "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "guarded"}}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 4, "desiredHealthy": 4,
                       "expectedPods": 4, "observedGeneration": 1}
        }),
    )
    .await
    .expect("PodDisruptionBudget");
    // Two low gangs of equal cost fill the nodes; by name, "guarded" would go first.
    let guarded = create_priority_gang(api, "guarded", 4, "32", "low").await;
    let plain = create_priority_gang(api, "plain", 4, "32", "low").await;
    wait_for("both low gangs bound", Duration::from_secs(60), &env, |v| {
        v.bound(&guarded) && v.bound(&plain)
    })
    .await;
    let urgent = create_priority_gang(api, "urgent", 4, "32", "high").await;
    let now = wait_for(
        "the unprotected gang evicted for the urgent one",
        Duration::from_secs(60),
        &env,
        |v| plain.iter().all(|p| v.going(p)),
    )
    .await;
    for p in &guarded {
        assert!(
            now.node_of(p).is_some() && !now.going(p),
            "{p} is protected by its budget and was not evicted"
        );
    }
    finish_deletions(api, &plain).await;
    wait_for(
        "the urgent gang bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&urgent),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_binder_that_binds_before_the_victims_are_gone() {
    let env = start_armed(
        4,
        0,
        0,
        Setup::Admin,
        &[gangway_server::failpoints::BIND_BEFORE_VICTIMS_LEAVE],
    )
    .await;
    let (low, high) = preemption_begins(&env).await;
    // Nobody finishes the victims' deletions here, so they run on for good.
    wait_for(
        "a high pod bound on a node where a victim still runs (the bug switch)",
        Duration::from_secs(30),
        &env,
        |v| {
            high.iter().filter_map(|p| v.node_of(p)).any(|node| {
                low.iter()
                    .any(|victim| v.node_of(victim).as_deref() == Some(node.as_str()))
            })
        },
    )
    .await;
}

/// The metric names docs/METRICS.md lists (first column of its table).
fn catalogue() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/METRICS.md");
    let text = std::fs::read_to_string(path).expect("docs/METRICS.md");
    // Histograms recorded only by a preemption are checked by server/tests/preemption.rs,
    // and `gangway agent`'s own metrics by server/tests/device_plugins.rs.
    text.lines()
        .filter(|l| !l.contains("served after the first preemption"))
        .filter(|l| !l.starts_with("| `gangway_agent_"))
        .filter(|l| !l.contains("served once a queue exists"))
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
    let env = start(4, 2, 0).await;
    let (api, cluster) = (&env.api, &env.cluster);
    // Four pods of 60 CPUs: one per node, so the gang spans both shards (2PC with a decide).
    let wide = json!({"gang.scheduling.koordinator.sh/name": "wide",
                      "gang.scheduling.koordinator.sh/min-available": "4"});
    let mut pods: Vec<String> = (0..4).map(|i| format!("wide-{i}")).collect();
    for name in &pods {
        api.create(&PODS, pod_with_cpu(name, "60", wide.clone()))
            .await
            .expect("pod");
    }
    api.create(&PODS, gpu_pod("gpu-user", json!({}), json!({}), "one-gpu"))
        .await
        .expect("pod");
    pods.push("gpu-user".into());
    wait_for("the workload bound", Duration::from_secs(60), &env, |v| {
        v.bound(&pods)
    })
    .await;

    let documented = catalogue();
    assert!(documented.len() >= 10, "catalogue parsed: {documented:?}");
    let phases = [
        "pending", "quote", "begin", "reserve", "decide", "commit", "round", "bind",
    ];
    let start_wait = Instant::now();
    loop {
        // The sampler sets its gauges once a second.
        let (served, text) = scrape(cluster).await;
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

/// scheduler-plugins' ElasticQuotas (the chart's CRD).
const ELASTIC_QUOTAS: gangway_kube_double::store::Kind = gangway_kube_double::store::Kind {
    group: "scheduling.x-k8s.io",
    version: "v1alpha1",
    plural: "elasticquotas",
    kind: "ElasticQuota",
    namespaced: true,
    status_subresource: true,
};

/// The pods of `namespace` by name.
async fn pods_in(api: &ControlPlane, namespace: &str) -> BTreeMap<String, Value> {
    by_name(api.list(&PODS, Some(namespace)).await.unwrap_or_default())
}

/// Waits until `done` holds for the pods of both teams' namespaces.
async fn wait_for_teams(
    what: &str,
    api: &ControlPlane,
    done: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut pods = pods_in(api, "team-a").await;
        pods.extend(pods_in(api, "team-b").await);
        if done(&pods) {
            return pods;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 60 s: {pods:#?}"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

fn bound_in(pods: &BTreeMap<String, Value>, name: &str) -> bool {
    pods.get(name).is_some_and(|p| {
        p["spec"]["nodeName"].is_string() && p["metadata"]["deletionTimestamp"].is_null()
    })
}

fn going_in(pods: &BTreeMap<String, Value>, name: &str) -> bool {
    pods.get(name)
        .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
}

/// Two namespaces with ElasticQuotas guaranteeing each half the cluster (2 nodes of 64
/// CPUs): team-a borrows all of team-b's half while it is idle; team-b's pods then take
/// back exactly their min, the youngest of team-a's pods first, whole, and never
/// anything inside team-a's min. The queues are kept from the objects, and the admin
/// API cannot change them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elastic_quotas_are_queues_and_a_namespace_reclaims_its_min_from_a_borrower() {
    let env = start_with(2, 0, 0, Setup::Chart).await;
    let api = &env.api;
    for ns in ["team-a", "team-b"] {
        api.ensure_namespace(ns).await.expect("namespace");
        api.create(
            &ELASTIC_QUOTAS,
            json!({
                "metadata": {"name": "quota", "namespace": ns},
                "spec": {"min": {"cpu": "64"}, "max": {"cpu": 128}}
            }),
        )
        .await
        .expect("ElasticQuota");
    }
    let client = support::client(&env.cluster, 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let queues = client.queues().await.unwrap_or_default();
        let kept: Vec<String> = queues
            .iter()
            .filter_map(|q| q.spec.as_ref())
            .map(|s| format!("{} by {}", s.name, s.managed_by))
            .collect();
        if kept
            == [
                "team-a by ElasticQuota team-a/quota",
                "team-b by ElasticQuota team-b/quota",
            ]
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "queues not kept from the ElasticQuotas: {kept:?}"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let refused = client
        .put_queue(gangway_client::admin_api::QueueSpec {
            name: "team-a".into(),
            weight: 1,
            ..Default::default()
        })
        .await
        .expect_err("kept by its ElasticQuota");
    assert!(
        refused
            .to_string()
            .contains("kept by ElasticQuota team-a/quota"),
        "{refused}"
    );

    // team-a fills the cluster, one 32-CPU pod after another.
    for i in 0..4 {
        api.create(
            &PODS,
            support::objects::pod_with_cpu("team-a", &format!("a-{i}"), "32", json!({})),
        )
        .await
        .expect("pod");
        let name = format!("a-{i}");
        wait_for_teams("team-a's pod bound", api, |p| bound_in(p, &name)).await;
    }
    // Each of team-b's first two pods takes back one of team-a's, the youngest first.
    for (i, victim) in [(0, "a-3"), (1, "a-2")] {
        let b = format!("b-{i}");
        api.create(
            &PODS,
            support::objects::pod_with_cpu("team-b", &b, "32", json!({})),
        )
        .await
        .expect("pod");
        let now = wait_for_teams("a borrower evicted", api, |p| going_in(p, victim)).await;
        for keep in ["a-0", "a-1"] {
            assert!(
                bound_in(&now, keep),
                "{keep} is inside team-a's min: {now:#?}"
            );
        }
        match api.delete(&PODS, Some("team-a"), victim).await {
            Ok(_) => {}
            Err(e) if e.code() == Some(404) => {}
            Err(e) => panic!("finishing the deletion of {victim}: {e}"),
        }
        wait_for_teams("team-b's pod bound", api, |p| bound_in(p, &b)).await;
    }
    // Past its min, team-b waits, and team-a keeps its half.
    api.create(
        &PODS,
        support::objects::pod_with_cpu("team-b", "b-2", "32", json!({})),
    )
    .await
    .expect("pod");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = api.list(&EVENTS, Some("team-b")).await.unwrap_or_default();
        let said = events.iter().any(|e| {
            e["involvedObject"]["name"] == "b-2"
                && e["message"].as_str().is_some_and(|m| {
                    m.contains("no reclaim: queue team-b: cpu would be 96 of min 64")
                })
        });
        if said {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b-2 never said why it waits: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let mut now = pods_in(api, "team-a").await;
    now.extend(pods_in(api, "team-b").await);
    assert!(bound_in(&now, "a-0") && bound_in(&now, "a-1"), "{now:#?}");
    assert!(!now["b-2"]["spec"]["nodeName"].is_string());
    let usage: BTreeMap<String, String> = client
        .queues()
        .await
        .expect("queues")
        .into_iter()
        .filter_map(|q| Some((q.spec?.name, q.usage.get("cpu")?.clone())))
        .collect();
    assert_eq!(
        usage,
        BTreeMap::from([
            ("team-a".into(), "64".into()),
            ("team-b".into(), "64".into())
        ])
    );

    // The queue label takes no pod out of its namespace's quota: an empty label and
    // another namespace's queue are not honoured; a queue that lists the namespace is.
    client
        .put_queue(gangway_client::admin_api::QueueSpec {
            name: "shared".into(),
            weight: 1,
            namespaces: vec!["team-b".into()],
            ..Default::default()
        })
        .await
        .expect("a queue open to team-b");
    for (pod, label) in [
        ("b-empty-label", ""),
        ("b-foreign-label", "team-a"),
        ("b-shared-label", "shared"),
    ] {
        let mut object = support::objects::pod_with_cpu("team-b", pod, "1", json!({}));
        object["metadata"]["labels"] = json!({"scheduling.gangway.dev/queue": label});
        api.create(&PODS, object).await.expect("pod");
    }
    let charged = support::wait_for(
        "the labelled pods' groups",
        Duration::from_secs(30),
        async || {
            let groups = client.list_groups(false).await.ok()?;
            let queue_of = |pod: &str| {
                groups
                    .iter()
                    .find(|g| g.gangs.iter().any(|n| n == &format!("team-b/{pod}")))
                    .map(|g| g.queue.clone())
            };
            Some([
                queue_of("b-empty-label")?,
                queue_of("b-foreign-label")?,
                queue_of("b-shared-label")?,
            ])
        },
    )
    .await;
    assert_eq!(charged, ["team-b", "team-b", "shared"]);
}
