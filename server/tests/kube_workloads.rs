//! Kubernetes' own gangs end to end: the v1.36 Workload and PodGroup API
//! (`scheduling.k8s.io/v1alpha2`, with the `GenericWorkload`, `GangScheduling`,
//! `TopologyAwareWorkloadScheduling` and `WorkloadWithJob` gates on) against a real control
//! plane (etcd, kube-apiserver, kube-controller-manager with the Job controller, from
//! `GANGWAY_K8S_ASSETS`) and three `gangway serve` processes. A PodGroup with a gang
//! policy binds all of its pods or none, says why in its `PodGroupScheduled` condition,
//! and binds once room frees; a pod naming a missing PodGroup waits with an event; a Job
//! is a gang end to end, including a pod the Job controller re-creates (its pods differ
//! in a label, so the two shards' plans must share them out: bug switch
//! `plans-read-every-label`) and a Job deleted while its gang waits; two gangs competing
//! for the same room never both bind in part. Also Volcano's PodGroups (the chart's CRD)
//! with `minTaskMember` and a queue, and a bin-packing `--scheduler-config`.

mod support;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gangway_kube_double::store::{
    EVENTS, JOBS, KUEUE_TOPOLOGIES, NODES, PODS, POD_GROUPS_K8S as POD_GROUPS,
    POD_GROUPS_VOLCANO as VOLCANO_POD_GROUPS, WORKLOADS,
};
use gangway_kube_env::{ControlPlane, Options};
use serde_json::{json, Value};
use support::Cluster;

/// One control plane at a time: each is a few hundred MB and a core while it starts.
static KUBE_SERIAL: Mutex<()> = Mutex::new(());
/// How often waits look at the API server.
const POLL_MS: u64 = 200;
/// How long a gang that must not bind is watched not binding.
const NOT_BOUND_WATCH_MS: u64 = 6_000;
const NS: &str = "train";
/// The chart's ServiceAccount (namespace, name) in these tests.
const CHART_SA: (&str, &str) = ("gangway", "gangway");

struct Env {
    api: ControlPlane,
    cluster: Cluster,
    _dir: tempfile::TempDir,
    _serial: MutexGuard<'static, ()>,
}

/// A node of `cpu` CPUs, ready.
fn node(name: &str, cpu: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
            "capacity": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    })
}

/// A pod of `cpu` CPUs; scheduled by gangway, in PodGroup `group` if given.
fn pod(name: &str, cpu: &str, group: Option<&str>) -> Value {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": "gangway",
            "containers": [{"name": "main", "image": "worker", "resources": {"requests": {"cpu": cpu}}}]
        }
    });
    if let Some(group) = group {
        pod["spec"]["schedulingGroup"] = json!({"podGroupName": group});
    }
    pod
}

/// A pod of another scheduler's, already bound to `node` (it holds `cpu` CPUs there).
fn filler(name: &str, node: &str, cpu: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "filler", "resources": {"requests": {"cpu": cpu}}}]
        }
    })
}

/// An Indexed Job of `pods` pods of `cpu` CPUs scheduled by gangway (its Workload and
/// PodGroup made by the Job controller, the gates on).
fn indexed_job(name: &str, pods: u32, cpu: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 6,
            "template": {"spec": {
                "schedulerName": "gangway", "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "worker", "resources": {"requests": {"cpu": cpu}}}]
            }}
        }
    })
}

/// A PodGroup with a gang policy of `min_count`.
fn gang(name: &str, min_count: u32) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    })
}

/// A control plane with the gang API on, `nodes` nodes of `cpu` CPUs, and three gangway
/// replicas (two shards) running as the chart's ServiceAccount with exactly the chart's
/// ClusterRole (reading Kubernetes' PodGroups and writing their status is in it).
async fn start(nodes: usize, cpu: &str) -> Env {
    start_armed(nodes, cpu, &[], &[]).await
}

/// `start`, with the CRDs of these chart templates installed first and every gangway
/// process with these test bug switches armed.
async fn start_armed(nodes: usize, cpu: &str, crds: &[&str], failpoints: &[&str]) -> Env {
    let nodes = (0..nodes)
        .map(|i| node(&format!("node-{i}"), cpu))
        .collect();
    start_on(nodes, crds, failpoints, &[]).await
}

/// `start_armed` on these nodes, every gangway process given `extra` flags too.
async fn start_on(nodes: Vec<Value>, crds: &[&str], failpoints: &[&str], extra: &[String]) -> Env {
    let serial = KUBE_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sa = gangway_kube_env::Identity::service_account(CHART_SA.0, CHART_SA.1);
    let api = ControlPlane::start(
        Options {
            identities: vec![sa.clone()],
            ..Options::default()
        }
        .with_workload_api(),
    )
    .await
    .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    for ns in [NS, CHART_SA.0] {
        api.ensure_namespace(ns).await.expect("namespace");
    }
    support::chart::apply_gangway_rbac(&api, "gangway", CHART_SA.0, CHART_SA.1).await;
    for crd in crds {
        api.install_crd(support::chart::chart_object(crd))
            .await
            .unwrap_or_else(|e| panic!("the chart's {crd} is accepted: {e}"));
    }
    for node in nodes {
        api.create(&NODES, node).await.expect("node");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = support::kube::gangway_on(&api, &sa.user, dir.path(), 2, extra, failpoints).await;
    Env {
        api,
        cluster,
        _dir: dir,
        _serial: serial,
    }
}

impl Env {
    /// This control plane with the gangway processes replaced by new ones (fresh data):
    /// `shards` shards, these extra flags.
    async fn with_gangway(self, shards: u32, extra: &[String]) -> Env {
        let Env {
            api,
            cluster,
            _dir,
            _serial,
        } = self;
        drop(cluster);
        let user = gangway_kube_env::Identity::service_account(CHART_SA.0, CHART_SA.1).user;
        let cluster = support::kube::gangway_on(&api, &user, _dir.path(), shards, extra, &[]).await;
        Env {
            api,
            cluster,
            _dir,
            _serial,
        }
    }
}

/// The test namespace as the API server has it now.
struct View {
    pods: BTreeMap<String, Value>,
    pod_groups: BTreeMap<String, Value>,
    events: Vec<Value>,
}

fn by_name(items: Vec<Value>) -> BTreeMap<String, Value> {
    items
        .into_iter()
        .filter_map(|o| Some((o["metadata"]["name"].as_str()?.to_string(), o)))
        .collect()
}

impl View {
    async fn read(api: &ControlPlane) -> Self {
        Self {
            pods: by_name(api.list(&PODS, Some(NS)).await.unwrap_or_default()),
            pod_groups: by_name(api.list(&POD_GROUPS, Some(NS)).await.unwrap_or_default()),
            events: api.list(&EVENTS, Some(NS)).await.unwrap_or_default(),
        }
    }

    fn node_of(&self, pod: &str) -> Option<&str> {
        self.pods.get(pod)?["spec"]["nodeName"].as_str()
    }

    /// How many of `pods` are bound.
    fn bound(&self, pods: &[String]) -> usize {
        pods.iter().filter(|p| self.node_of(p).is_some()).count()
    }

    /// The pods whose names start with `prefix`, live ones only.
    fn named(&self, prefix: &str) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(n, p)| n.starts_with(prefix) && p["metadata"]["deletionTimestamp"].is_null())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// `PodGroupScheduled` of PodGroup `group`: (status, reason, message).
    fn scheduled(&self, group: &str) -> Option<(String, String, String)> {
        let conditions = self.pod_groups.get(group)?["status"]["conditions"].as_array()?;
        let c = conditions
            .iter()
            .find(|c| c["type"] == "PodGroupScheduled")?;
        let text = |f: &str| c[f].as_str().unwrap_or_default().to_string();
        Some((text("status"), text("reason"), text("message")))
    }

    fn events_for(&self, pod: &str, reason: &str) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e["involvedObject"]["name"] == pod && e["reason"] == reason)
            .filter_map(|e| e["message"].as_str().map(String::from))
            .collect()
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
        let now = View::read(&env.api).await;
        if done(&now) {
            return now;
        }
        if start.elapsed() > timeout {
            let pods: Vec<(&String, Option<&str>)> =
                now.pods.keys().map(|p| (p, now.node_of(p))).collect();
            let conditions: Vec<(&String, &Value)> = now
                .pod_groups
                .iter()
                .map(|(n, g)| (n, &g["status"]))
                .collect();
            let groups = match env.cluster.live().first() {
                Some(id) => format!(
                    "{:#?}",
                    support::client(&env.cluster, *id)
                        .await
                        .list_groups(true)
                        .await
                ),
                None => "no live process".into(),
            };
            let nodes = match env.cluster.live().first() {
                Some(id) => format!(
                    "{:#?}",
                    env.cluster
                        .inventory(*id)
                        .await
                        .list_nodes(gangway_proto::v1::ListNodesRequest::default())
                        .await
                        .map(|r| r.into_inner())
                ),
                None => String::new(),
            };
            eprintln!("gangway's nodes: {nodes}");
            let events: Vec<String> = now
                .events
                .iter()
                .map(|e| {
                    format!(
                        "{} {}: {}",
                        e["involvedObject"]["name"], e["reason"], e["message"]
                    )
                })
                .collect();
            eprintln!("events: {events:#?}");
            for id in 1..=3 {
                let log = env.cluster.log(id);
                let lines: Vec<&str> = log
                    .lines()
                    .filter(|l| l.contains("ingest") || l.contains("WARN"))
                    .collect();
                eprintln!(
                    "--- node {id}: ingest and warnings ---\n{}",
                    lines.join("\n")
                );
            }
            panic!(
                "timed out after {timeout:?} waiting for {what}\npods: {pods:?}\npod groups: {conditions:#?}\ngang groups: {groups}\n--- node 1 log ---\n{}\n--- kube-controller-manager ---\n{}",
                tail(&env.cluster.log(1)),
                env.api.log_tail("kube-controller-manager"),
            );
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Watches `pods` for `NOT_BOUND_WATCH_MS`: none of them may bind. Answers the last view.
async fn stays_unbound(env: &Env, pods: &[String]) -> View {
    let until = Instant::now() + Duration::from_millis(NOT_BOUND_WATCH_MS);
    loop {
        let now = View::read(&env.api).await;
        let bound: Vec<(&String, Option<&str>)> = pods
            .iter()
            .map(|p| (p, now.node_of(p)))
            .filter(|(_, n)| n.is_some())
            .collect();
        assert!(bound.is_empty(), "part of a gang was bound: {bound:?}");
        if Instant::now() > until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

async fn create_pods(
    api: &ControlPlane,
    prefix: &str,
    n: usize,
    cpu: &str,
    group: &str,
) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        api.create(&PODS, pod(&name, cpu, Some(group)))
            .await
            .expect("pod");
        names.push(name);
    }
    names
}

/// The case the gang API exists for: 5 nodes of 4 CPUs, pods of 3. With two nodes
/// taken, a gang of 4 binds none (kube-scheduler's answer; each pod alone would bind 3)
/// and its PodGroup says why; a freed node binds all 4; a gang that fits binds whole;
/// a pod naming a PodGroup not made yet waits, with an event, until it is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_pod_group_binds_all_of_its_pods_or_none() {
    let env = start(5, "4").await;
    let api = &env.api;
    for (name, node) in [("filler-0", "node-0"), ("filler-1", "node-1")] {
        api.create(&PODS, filler(name, node, "3"))
            .await
            .expect("filler");
    }
    api.create(&POD_GROUPS, gang("four", 4))
        .await
        .expect("PodGroup");
    let four = create_pods(api, "four", 4, "3", "four").await;

    // Three nodes have room: the gang must not bind in part, and says why.
    let view = wait_for(
        "the PodGroup to say its gang is unschedulable",
        Duration::from_secs(60),
        &env,
        |v| v.scheduled("four").is_some_and(|(s, _, _)| s == "False"),
    )
    .await;
    let (_, reason, message) = view.scheduled("four").expect("condition");
    assert_eq!(reason, "Unschedulable");
    assert!(!message.is_empty(), "the condition says why");
    let view = stays_unbound(&env, &four).await;
    assert!(
        four.iter()
            .all(|p| !view.events_for(p, "FailedScheduling").is_empty()),
        "every pod of the waiting gang has a FailedScheduling event"
    );

    // A node frees: all four bind, each on its own node, and the PodGroup says so.
    api.delete(&PODS, Some(NS), "filler-0")
        .await
        .expect("delete");
    let view = wait_for(
        "the gang of four to bind once a node freed",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&four) == 4 && v.scheduled("four").is_some_and(|(s, _, _)| s == "True"),
    )
    .await;
    let nodes: std::collections::BTreeSet<&str> =
        four.iter().filter_map(|p| view.node_of(p)).collect();
    assert_eq!(nodes.len(), 4, "pods of 3 CPUs on nodes of 4: one per node");
    assert_eq!(
        view.scheduled("four").map(|(_, r, _)| r),
        Some("Scheduled".to_string())
    );

    // A pod naming a PodGroup that does not exist waits, and says what for.
    api.create(&PODS, pod("orphan", "100m", Some("later")))
        .await
        .expect("pod");
    let view = wait_for(
        "an event on the pod naming a missing PodGroup",
        Duration::from_secs(30),
        &env,
        |v| !v.events_for("orphan", "FailedScheduling").is_empty(),
    )
    .await;
    assert_eq!(view.node_of("orphan"), None);
    let said = view.events_for("orphan", "FailedScheduling").join(" | ");
    assert!(said.contains("PodGroup train/later"), "{said}");
    // A basic policy: the pod is scheduled on its own once its PodGroup exists.
    api.create(
        &POD_GROUPS,
        json!({"metadata": {"name": "later", "namespace": NS},
               "spec": {"schedulingPolicy": {"basic": {}}}}),
    )
    .await
    .expect("PodGroup");
    wait_for(
        "the pod to bind once its PodGroup exists",
        Duration::from_secs(30),
        &env,
        |v| v.node_of("orphan").is_some(),
    )
    .await;
}

/// A Job with the gates on: the Job controller makes the Workload and PodGroup, and the
/// pods are one gang that binds whole once the room is there; a pod deleted after binding
/// is re-created by the controller and binds alone (its gang's others still run); the API
/// server refuses to scale such a Job. Two PodGroups competing for room only one of them
/// fits: one binds whole, the other none. A Job deleted while its gang waits leaves
/// nothing bound and no group behind in gangway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_a_gang_and_competing_gangs_never_both_bind_in_part() {
    let env = start(4, "4").await;
    let api = &env.api;
    api.create(&PODS, filler("filler-0", "node-0", "3"))
        .await
        .expect("filler");
    api.create(&JOBS, indexed_job("train", 4, "3"))
        .await
        .expect("job");
    let view = wait_for(
        "the Job controller to make a Workload, a PodGroup and four pods",
        Duration::from_secs(60),
        &env,
        |v| v.named("train-").len() == 4 && !v.pod_groups.is_empty(),
    )
    .await;
    let workloads = api.list(&WORKLOADS, Some(NS)).await.expect("workloads");
    assert_eq!(workloads.len(), 1, "the Job controller made one Workload");
    let group = view.pod_groups.keys().next().cloned().expect("PodGroup");
    let pods = view.named("train-");
    for p in &pods {
        assert_eq!(
            view.pods[p]["spec"]["schedulingGroup"]["podGroupName"],
            json!(group),
            "the Job's pods name its PodGroup"
        );
    }
    // One node is 3 CPUs short: the Job's gang of 4 binds none of its pods.
    stays_unbound(&env, &pods).await;
    api.delete(&PODS, Some(NS), "filler-0")
        .await
        .expect("delete");
    let view = wait_for(
        "the Job's four pods to bind together",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&pods) == 4,
    )
    .await;
    assert_eq!(
        view.scheduled(&group).map(|(s, r, _)| (s, r)),
        Some(("True".to_string(), "Scheduled".to_string()))
    );

    // A pod of the running gang goes: the Job controller makes another, which binds on
    // the room its predecessor left, alone (three of its gang still run).
    let gone = pods[0].clone();
    let gone_from = view.node_of(&gone).map(String::from).expect("bound");
    api.update(&PODS, Some(NS), &gone, |p| {
        p["metadata"]["finalizers"] = json!([]);
    })
    .await
    .expect("finalizers dropped");
    api.delete(&PODS, Some(NS), &gone).await.expect("delete");
    let view = wait_for(
        "the re-created pod to bind where the deleted one was",
        Duration::from_secs(60),
        &env,
        |v| {
            let live = v.named("train-");
            live.len() == 4 && !live.contains(&gone) && v.bound(&live) == 4
        },
    )
    .await;
    let fresh: Vec<String> = view
        .named("train-")
        .into_iter()
        .filter(|p| !pods.contains(p))
        .collect();
    assert_eq!(fresh.len(), 1, "one pod re-created");
    assert_eq!(view.node_of(&fresh[0]), Some(gone_from.as_str()));

    // Kubernetes refuses to scale a Job whose PodGroup is gang-scheduled (its minCount was
    // fixed from the parallelism it was made with), so a gang never changes size under
    // gangway.
    let scaled = api
        .update(&JOBS, Some(NS), "train", |j| {
            j["spec"]["parallelism"] = json!(5);
            j["spec"]["completions"] = json!(5);
        })
        .await
        .expect_err("a gang's Job cannot be scaled");
    assert!(
        scaled.to_string().contains("gang-scheduled PodGroup"),
        "{scaled}"
    );

    // The Job holds 3 CPUs on every node; delete it and its pods, then let two gangs of
    // three 3-CPU pods compete for four nodes: only one fits.
    api.delete(&JOBS, Some(NS), "train")
        .await
        .expect("job deleted");
    for p in view.named("train-") {
        api.update(&PODS, Some(NS), &p, |o| {
            o["metadata"]["finalizers"] = json!([])
        })
        .await
        .ok();
        api.delete(&PODS, Some(NS), &p).await.ok();
    }
    wait_for("the Job's pods gone", Duration::from_secs(60), &env, |v| {
        v.named("train-").is_empty()
    })
    .await;
    for g in ["red", "blue"] {
        api.create(&POD_GROUPS, gang(g, 3)).await.expect("PodGroup");
    }
    let red = create_pods(api, "red", 3, "3", "red").await;
    let blue = create_pods(api, "blue", 3, "3", "blue").await;
    let view = wait_for(
        "one of two competing gangs to bind",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&red) == 3 || v.bound(&blue) == 3,
    )
    .await;
    let (winner, loser) = if view.bound(&red) == 3 {
        (&red, &blue)
    } else {
        (&blue, &red)
    };
    assert_eq!(view.bound(winner), 3);
    let view = stays_unbound(&env, loser).await;
    let loser_group = if loser == &red { "red" } else { "blue" };
    assert_eq!(
        view.scheduled(loser_group).map(|(s, r, _)| (s, r)),
        Some(("False".to_string(), "Unschedulable".to_string()))
    );

    // A Job whose gang waits for room is deleted mid-way: its pods go with it (garbage
    // collector), and so does gangway's group for them; nothing of it is bound.
    api.create(&JOBS, indexed_job("late", 2, "3"))
        .await
        .expect("job");
    let view = wait_for(
        "the late Job's two pods",
        Duration::from_secs(60),
        &env,
        |v| v.named("late-").len() == 2,
    )
    .await;
    let late_pods = view.named("late-");
    stays_unbound(&env, &late_pods).await;
    api.call(
        http::Method::DELETE,
        &format!("/apis/batch/v1/namespaces/{NS}/jobs/late"),
        "application/json",
        Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground", "gracePeriodSeconds": 0})),
    )
    .await
    .expect("job deleted");
    for p in &late_pods {
        // No kubelet: drop the Job's tracking finalizer so the pods can go.
        api.update(&PODS, Some(NS), p, |o| {
            o["metadata"]["finalizers"] = json!([])
        })
        .await
        .ok();
    }
    wait_for(
        "the late Job's pods gone",
        Duration::from_secs(60),
        &env,
        |v| v.named("late-").is_empty(),
    )
    .await;
    let admin = support::client(&env.cluster, 1).await;
    let start = Instant::now();
    loop {
        let groups = admin.list_groups(false).await.expect("groups");
        let live_late = groups
            .iter()
            .filter(|g| {
                g.gangs
                    .iter()
                    .any(|n| n.starts_with(&format!("{NS}/late-")))
            })
            .count();
        if live_late == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gangway still holds the deleted Job's group: {groups:#?}"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Bug switch `plans-read-every-label`: shards' plans keep each slot to its own member,
/// so a gang of pods that differ only in a label (as a Job's do), spread over two
/// shards of two nodes, collides on the same two members in both plans and never binds.
/// The Job test above binds such a gang; here it must stay unbound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_plans_that_keep_slots_to_their_own_members() {
    let env = start_armed(4, "4", &[], &["plans-read-every-label"]).await;
    let api = &env.api;
    api.create(&POD_GROUPS, gang("indexed", 4))
        .await
        .expect("PodGroup");
    let mut pods = Vec::new();
    for i in 0..4 {
        let name = format!("indexed-{i}");
        let mut object = pod(&name, "3", Some("indexed"));
        object["metadata"]["labels"] =
            json!({"batch.kubernetes.io/job-completion-index": i.to_string()});
        api.create(&PODS, object).await.expect("pod");
        pods.push(name);
    }
    wait_for(
        "the gang to be tried and found short",
        Duration::from_secs(60),
        &env,
        |v| v.scheduled("indexed").is_some_and(|(s, _, _)| s == "False"),
    )
    .await;
    stays_unbound(&env, &pods).await;
}

/// A kube-scheduler configuration that packs GPUs: NodeResourcesFit scores MostAllocated
/// over `nvidia.com/gpu`.
const GPU_PACKING: &str = "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: gangway
  plugins:
    score:
      disabled:
      - name: NodeResourcesBalancedAllocation
      enabled:
      - name: NodeResourcesFit
        weight: 5
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: nvidia.com/gpu
          weight: 1
";

/// Creates twelve pods of two GPUs named `prefix-N`, one at a time (each bound before the
/// next is made, so each is scored against the room the earlier ones left), and answers
/// how many nodes they went to.
async fn twelve_two_gpu_pods(env: &Env, prefix: &str) -> usize {
    let mut names = Vec::new();
    for i in 0..12 {
        let name = format!("{prefix}-{i}");
        let mut object = pod(&name, "100m", None);
        object["spec"]["containers"][0]["resources"]["limits"] = json!({"nvidia.com/gpu": "2"});
        env.api.create(&PODS, object).await.expect("pod");
        names.push(name);
        wait_for("a two-GPU pod bound", Duration::from_secs(30), env, |v| {
            v.bound(&names) == names.len()
        })
        .await;
    }
    let view = View::read(&env.api).await;
    let nodes: std::collections::BTreeSet<&str> =
        names.iter().filter_map(|p| view.node_of(p)).collect();
    for name in &names {
        env.api.delete(&PODS, Some(NS), name).await.expect("delete");
    }
    nodes.len()
}

/// `--scheduler-config` with a bin-packing profile: twelve pods of two GPUs on six nodes
/// of eight go onto three nodes, where gangway's default profile spreads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bin_packing_profile_packs_gpu_pods_where_the_default_spreads_them() {
    let env = start(0, "8").await;
    for i in 0..6 {
        let mut gpu_node = node(&format!("gpu-{i}"), "8");
        gpu_node["status"]["allocatable"]["nvidia.com/gpu"] = json!("8");
        gpu_node["status"]["capacity"]["nvidia.com/gpu"] = json!("8");
        env.api.create(&NODES, gpu_node).await.expect("node");
    }
    // One shard, so the default's choice is not split by the shard map.
    let env = env.with_gangway(1, &[]).await;
    let spread = twelve_two_gpu_pods(&env, "spread").await;
    assert!(spread > 3, "the default profile spreads: {spread} nodes");
    let config = env._dir.path().join("scheduler.yaml");
    std::fs::write(&config, GPU_PACKING).expect("config");
    let env = env
        .with_gangway(
            1,
            &["--scheduler-config".into(), config.display().to_string()],
        )
        .await;
    let packed = twelve_two_gpu_pods(&env, "packed").await;
    eprintln!(
        "twelve two-GPU pods: default profile on {spread} nodes, packing profile on {packed}"
    );
    assert_eq!(
        packed, 3,
        "MostAllocated over GPUs fills a node before the next"
    );
}

/// A pod of Volcano's PodGroup `group`, task `task`, of `cpu` CPUs.
fn volcano_pod(name: &str, group: &str, task: &str, cpu: &str) -> Value {
    let mut object = pod(name, cpu, None);
    object["metadata"]["annotations"] =
        json!({"scheduling.k8s.io/group-name": group, "volcano.sh/task-spec": task});
    object
}

/// A Volcano PodGroup (the chart's CRD, `volcanoPodGroupCRD.enabled`) with `minTaskMember`
/// and a queue: its pods wait until every task has its minimum, then bind together,
/// charged to the gangway queue of that name; the PodGroup shows `Running` and
/// `Scheduled` as Volcano writes them. A PodGroup naming a queue gangway does not have
/// is refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volcano_pod_group_binds_every_task_at_its_minimum_in_its_queue() {
    let env = start_armed(4, "4", &["volcano-podgroup-crd.yaml"], &[]).await;
    let api = &env.api;
    let admin = support::client(&env.cluster, 1).await;
    admin
        .put_queue(gangway_client::admin_api::QueueSpec {
            name: "research".into(),
            weight: 1,
            max: [("cpu".to_string(), "16".to_string())].into(),
            namespaces: vec![NS.into()],
            ..Default::default()
        })
        .await
        .expect("queue");
    api.create(
        &VOLCANO_POD_GROUPS,
        json!({"metadata": {"name": "job", "namespace": NS},
               "spec": {"minMember": 3, "minTaskMember": {"ps": 1, "worker": 2}, "queue": "research"}}),
    )
    .await
    .expect("PodGroup");
    let first = ["job-ps-0".to_string(), "job-worker-0".to_string()];
    api.create(&PODS, volcano_pod(&first[0], "job", "ps", "1"))
        .await
        .expect("pod");
    api.create(&PODS, volcano_pod(&first[1], "job", "worker", "3"))
        .await
        .expect("pod");
    // Three pods would meet minMember only with a second worker: nothing binds yet.
    stays_unbound(&env, &first).await;
    api.create(&PODS, volcano_pod("job-worker-1", "job", "worker", "3"))
        .await
        .expect("pod");
    let all = [
        first[0].clone(),
        first[1].clone(),
        "job-worker-1".to_string(),
    ];
    wait_for(
        "the Volcano job's three pods bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&all) == 3,
    )
    .await;
    let groups = admin.list_groups(true).await.expect("groups");
    let group = groups
        .iter()
        .find(|g| g.gangs.iter().any(|n| n.contains("job.worker")))
        .expect("the job's group");
    assert_eq!(group.queue, "research");
    assert_eq!(group.gangs.len(), 2, "one gang per task: {:?}", group.gangs);
    let status = wait_for_volcano_phase(&env, "job", "Running").await;
    assert_eq!(status["conditions"][0]["type"], "Scheduled");
    assert_eq!(status["running"], json!(0), "no kubelet runs the pods here");

    api.create(
        &VOLCANO_POD_GROUPS,
        json!({"metadata": {"name": "elsewhere", "namespace": NS},
               "spec": {"minMember": 1, "queue": "nope"}}),
    )
    .await
    .expect("PodGroup");
    api.create(&PODS, volcano_pod("elsewhere-0", "elsewhere", "main", "1"))
        .await
        .expect("pod");
    let view = wait_for(
        "a FailedScheduling event on the pod of a PodGroup naming no gangway queue",
        Duration::from_secs(30),
        &env,
        |v| !v.events_for("elsewhere-0", "FailedScheduling").is_empty(),
    )
    .await;
    let said = view
        .events_for("elsewhere-0", "FailedScheduling")
        .join(" | ");
    assert!(
        said.contains("spec.queue \"nope\"") && said.contains("no gangway queue nope"),
        "{said}"
    );
    assert_eq!(view.node_of("elsewhere-0"), None);
}

/// Waits until Volcano PodGroup `name` shows `phase`; answers its status.
async fn wait_for_volcano_phase(env: &Env, name: &str, phase: &str) -> Value {
    let start = Instant::now();
    loop {
        let group = env
            .api
            .get(&VOLCANO_POD_GROUPS, Some(NS), name)
            .await
            .expect("PodGroup");
        if group["status"]["phase"] == phase {
            return group["status"].clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "PodGroup {name} never showed {phase}: {:#}",
            group["status"]
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

// ---- topology ------------------------------------------------------------------------------

const RACK: &str = "example.com/rack";
const BLOCK: &str = "example.com/block";
/// Racks (each two nodes of 4 CPUs) and their blocks.
const RACKS: [(&str, &str); 3] = [("r0", "b0"), ("r1", "b0"), ("r2", "b1")];

/// Node `i` of `rack` (in `block`), 4 CPUs.
fn rack_node(rack: &str, block: &str, i: usize) -> Value {
    let mut n = node(&format!("{rack}-n{i}"), "4");
    n["metadata"]["labels"][RACK] = json!(rack);
    n["metadata"]["labels"][BLOCK] = json!(block);
    n
}

/// A pod of `cpu` CPUs in Kueue's plain pod group `group` of `total`, with Kueue's
/// pod-set topology `annotations`.
fn kueue_pod(name: &str, group: &str, total: usize, cpu: &str, annotations: Value) -> Value {
    let mut object = pod(name, cpu, None);
    object["metadata"]["labels"] = json!({"kueue.x-k8s.io/pod-group-name": group});
    let mut all = json!({"kueue.x-k8s.io/pod-group-total-count": total.to_string()});
    if let (Some(all), Some(more)) = (all.as_object_mut(), annotations.as_object()) {
        all.extend(more.clone());
    }
    object["metadata"]["annotations"] = all;
    object
}

/// The rack of each pod's node (node names start with their rack).
fn racks_of(view: &View, pods: &[String]) -> std::collections::BTreeSet<String> {
    pods.iter()
        .filter_map(|p| view.node_of(p))
        .filter_map(|n| n.split('-').next())
        .map(String::from)
        .collect()
}

/// Deletes `pods` for good (no kubelet finishes a bound pod's deletion here).
async fn delete_pods(api: &ControlPlane, pods: &[String]) {
    for name in pods {
        match api.delete(&PODS, Some(NS), name).await {
            Ok(_) => {}
            Err(e) if e.code() == Some(404) => {}
            Err(e) => panic!("deleting {name}: {e}"),
        }
    }
}

/// Topology through every Kubernetes dialect, against the real API server: three racks
/// in two blocks on two shards (the rack is the shard label). Kueue's required-rack
/// annotation keeps a pod group in one rack; a Kubernetes PodGroup requiring a rack no
/// rack can hold binds nothing and says why, though both shards' racks together could
/// hold it; a soft Volcano `networkTopology` gang stays in one rack while one holds it
/// and spreads over the fewest racks when none does; a high-priority pod group that
/// needs one rack evicts low pods inside one rack only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_constraints_from_kueue_kubernetes_and_volcano_hold_on_a_real_cluster() {
    let nodes = RACKS
        .iter()
        .flat_map(|(rack, block)| (0..2).map(move |i| rack_node(rack, block, i)))
        .collect();
    let extra: Vec<String> = [
        "--topology-label",
        RACK,
        "--topology-levels",
        "example.com/block,example.com/rack,kubernetes.io/hostname",
    ]
    .map(String::from)
    .to_vec();
    let env = start_on(nodes, &["volcano-podgroup-crd.yaml"], &[], &extra).await;
    let api = &env.api;

    // Kueue: six pods of one CPU that must share a rack.
    let kueue: Vec<String> = (0..6).map(|i| format!("kq-{i}")).collect();
    for name in &kueue {
        let required = json!({"kueue.x-k8s.io/podset-required-topology": RACK});
        api.create(&PODS, kueue_pod(name, "kq", 6, "1", required))
            .await
            .expect("pod");
    }
    let view = wait_for(
        "the Kueue pod group bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&kueue) == kueue.len(),
    )
    .await;
    assert_eq!(
        racks_of(&view, &kueue).len(),
        1,
        "{:?}",
        racks_of(&view, &kueue)
    );

    // A Kubernetes PodGroup of ten that must share a rack: no rack has ten CPUs free
    // (18 are free over both shards), so nothing binds and the PodGroup says why.
    api.create(&POD_GROUPS, {
        let mut g = gang("big", 10);
        g["spec"]["schedulingConstraints"] = json!({"topology": [{"key": RACK}]});
        g
    })
    .await
    .expect("PodGroup");
    let big = create_pods(api, "big", 10, "1", "big").await;
    let view = wait_for(
        "PodGroup big Unschedulable naming the rack",
        Duration::from_secs(60),
        &env,
        |v| {
            v.scheduled("big").is_some_and(|(status, _, message)| {
                status == "False"
                    && message.contains("in no example.com/rack that holds 10 members")
            })
        },
    )
    .await;
    assert_eq!(view.bound(&big), 0);
    stays_unbound(&env, &big).await;
    delete_pods(api, &big).await;

    // Volcano, soft: four fit one rack, so one rack; then twelve, which no rack holds
    // (2 + 4 + 8 CPUs free): the fewest racks, two.
    for (name, size) in [("soft4", 4), ("soft12", 12)] {
        api.create(
            &VOLCANO_POD_GROUPS,
            json!({"metadata": {"name": name, "namespace": NS},
                   "spec": {"minMember": size, "networkTopology": {"mode": "soft"}}}),
        )
        .await
        .expect("PodGroup");
        let pods: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
        for p in &pods {
            let mut object = pod(p, "1", None);
            object["metadata"]["annotations"] = json!({"scheduling.k8s.io/group-name": name});
            api.create(&PODS, object).await.expect("pod");
        }
        let view = wait_for(
            &format!("Volcano gang {name} bound"),
            Duration::from_secs(60),
            &env,
            |v| v.bound(&pods) == pods.len(),
        )
        .await;
        let want = if size == 4 { 1 } else { 2 };
        assert_eq!(
            racks_of(&view, &pods).len(),
            want,
            "{name}: {:?}",
            racks_of(&view, &pods)
        );
        if size == 4 {
            // Room for twelve below: the Kueue group goes.
            delete_pods(api, &kueue).await;
        }
        delete_pods(api, &pods).await;
    }

    // Preemption: a low pod on every node (r1's a little less low, so the victims come
    // from the shard of r0 and r2), pinned so that the cheapest victims of that shard
    // (by name) alternate racks; a high pod group needing one rack of two whole nodes
    // evicts the two low pods of one rack, no others.
    support::kube::create_priority_classes(api, &[("low", 10), ("mid", 100), ("high", 1000)]).await;
    let mut low = Vec::new();
    for (k, (i, (rack, _))) in [0, 1]
        .iter()
        .flat_map(|i| RACKS.iter().map(move |r| (*i, r)))
        .enumerate()
    {
        let name = format!("v{k}");
        let mut object = pod(&name, "4", None);
        let class = if *rack == "r1" { "mid" } else { "low" };
        object["spec"]["priorityClassName"] = json!(class);
        object["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": format!("{rack}-n{i}")});
        api.create(&PODS, object).await.expect("pod");
        low.push(name);
    }
    wait_for("every low pod bound", Duration::from_secs(60), &env, |v| {
        v.bound(&low) == low.len()
    })
    .await;
    let high: Vec<String> = (0..2).map(|i| format!("hi-{i}")).collect();
    for name in &high {
        let mut object = kueue_pod(
            name,
            "hi",
            2,
            "4",
            json!({"kueue.x-k8s.io/podset-required-topology": RACK}),
        );
        object["spec"]["priorityClassName"] = json!("high");
        api.create(&PODS, object).await.expect("pod");
    }
    let going = |v: &View| -> Vec<String> {
        low.iter()
            .filter(|p| {
                v.pods
                    .get(*p)
                    .is_none_or(|o| !o["metadata"]["deletionTimestamp"].is_null())
            })
            .cloned()
            .collect()
    };
    let before = wait_for("two low pods evicted", Duration::from_secs(60), &env, |v| {
        going(v).len() >= 2
    })
    .await;
    let racks_before: BTreeMap<String, String> = low
        .iter()
        .filter_map(|p| Some((p.clone(), before.node_of(p)?.split('-').next()?.to_string())))
        .collect();
    // Watch a while: no third victim.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(NOT_BOUND_WATCH_MS) {
        let now = View::read(api).await;
        assert_eq!(
            going(&now).len(),
            2,
            "more victims than one rack needs: {:?}",
            going(&now)
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let victims = going(&View::read(api).await);
    let victim_racks: std::collections::BTreeSet<&String> =
        victims.iter().filter_map(|p| racks_before.get(p)).collect();
    assert_eq!(
        victim_racks.len(),
        1,
        "victims {victims:?} in racks {victim_racks:?}"
    );
    delete_pods(api, &victims).await;
    let view = wait_for(
        "the high pod group bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&high) == high.len(),
    )
    .await;
    let rack = racks_of(&view, &high);
    assert_eq!(rack.len(), 1, "{rack:?}");
    assert_eq!(
        rack.iter().next(),
        victim_racks.iter().next().copied(),
        "in the victims' rack"
    );
}

/// Kueue's Topology CRD as far as gangway reads it (Kueue itself is not installed here).
fn kueue_topology_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "topologies.kueue.x-k8s.io"},
        "spec": {
            "group": "kueue.x-k8s.io", "scope": "Cluster",
            "names": {"plural": "topologies", "singular": "topology", "kind": "Topology", "listKind": "TopologyList"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    })
}

/// Without `--topology-levels`, the hierarchy a Kueue Topology object defines is the
/// cluster's: a Volcano PodGroup whose hard `networkTopology` names tier 1 (the rack, the
/// narrowest level above the host) binds in one rack once the Topology exists, where it
/// was refused before ("0 tiers").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kueue_topology_object_gives_the_hierarchy() {
    let nodes = RACKS
        .iter()
        .flat_map(|(rack, block)| (0..2).map(move |i| rack_node(rack, block, i)))
        .collect();
    let extra: Vec<String> = ["--topology-label", RACK].map(String::from).to_vec();
    let env = start_on(nodes, &["volcano-podgroup-crd.yaml"], &[], &extra).await;
    let api = &env.api;
    api.install_crd(kueue_topology_crd())
        .await
        .expect("Kueue's Topology CRD");
    api.create(
        &VOLCANO_POD_GROUPS,
        json!({"metadata": {"name": "tier1", "namespace": NS},
               "spec": {"minMember": 3, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}}),
    )
    .await
    .expect("PodGroup");
    let pods: Vec<String> = (0..3).map(|i| format!("tier1-{i}")).collect();
    for p in &pods {
        let mut object = pod(p, "2", None);
        object["metadata"]["annotations"] = json!({"scheduling.k8s.io/group-name": "tier1"});
        api.create(&PODS, object).await.expect("pod");
    }
    let view = wait_for(
        "the tier refused while no hierarchy is known",
        Duration::from_secs(60),
        &env,
        |v| {
            v.events_for("tier1-0", "FailedScheduling")
                .iter()
                .any(|m| m.contains("names tier 1") && m.contains("0 tiers"))
        },
    )
    .await;
    assert_eq!(view.bound(&pods), 0);
    api.create(
        &KUEUE_TOPOLOGIES,
        json!({"metadata": {"name": "default"}, "spec": {"levels": [
            {"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]}}),
    )
    .await
    .expect("Topology");
    let view = wait_for(
        "the Volcano gang bound",
        Duration::from_secs(60),
        &env,
        |v| v.bound(&pods) == pods.len(),
    )
    .await;
    assert_eq!(
        racks_of(&view, &pods).len(),
        1,
        "{:?}",
        racks_of(&view, &pods)
    );
}
