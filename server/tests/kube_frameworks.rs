//! A batch framework's pods bound through gangway's gRPC API, against a real control
//! plane (etcd and kube-apiserver from `GANGWAY_K8S_ASSETS`) and three `gangway serve`
//! processes over two shards: a gRPC group whose members name Kubernetes pods binds
//! them all or none, whether the pods were created before or after the submission; a
//! gang whose pods are only partly created binds nothing and says which it waits for;
//! a pod asking other than its member is refused with a reason and an event, and binds
//! once re-created right; members that select their pods by labels get them chosen and
//! bound; the ingest never submits the named pods as groups of their
//! own; a bound pod deleted gives its member back (also one deleted while the ingest's
//! leader was being replaced); a group released before its pods
//! come binds none of them; and a higher-priority group preempts
//! a framework's gang whole: its pods are evicted and its watch stream says Preempted,
//! naming the preemptor. And the example framework (`client/python/examples/batch_job.py`)
//! runs a job end to end: creates its pods, submits the group, sees them bound, and
//! cleans up when its workers succeed, and when its job is preempted.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_kube_double::store::{EVENTS, NODES, PODS};
use gangway_kube_env::{ControlPlane, Options};
use gangway_proto::v1::GangGroupStatus;
use serde_json::{json, Value};
use support::Cluster;

const NS: &str = "train";
/// The chart's ServiceAccount (namespace, name) in these tests.
const CHART_SA: (&str, &str) = ("gangway", "gangway");
/// How often waits look at the API server.
const POLL_MS: u64 = 200;
/// How long a gang that must not bind is watched not binding.
const NOT_BOUND_WATCH_MS: u64 = 5_000;
/// The longest wait for anything gangway does here.
const WAIT: Duration = Duration::from_secs(60);
/// Nodes of `NODE_CPUS` CPUs each.
const NODES_N: usize = 6;
const NODE_CPUS: u32 = 8;

/// One control plane at a time: each is a few hundred MB and a core while it starts.
static KUBE_SERIAL: Mutex<()> = Mutex::new(());
/// The longest the example job may run.
const EXAMPLE_TIMEOUT_S: u64 = 120;

struct Env {
    api: ControlPlane,
    cluster: Cluster,
    dir: tempfile::TempDir,
    _serial: MutexGuard<'static, ()>,
}

fn node(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {"cpu": NODE_CPUS.to_string(), "memory": "64Gi", "pods": "110"},
            "capacity": {"cpu": NODE_CPUS.to_string(), "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    })
}

/// A framework's pod for gRPC group `group`: gangway's scheduler, the group annotation.
fn framework_pod(name: &str, group: &str, cpu: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "annotations": {"gangway.io/group": group}},
        "spec": {
            "schedulerName": "gangway",
            "containers": [{"name": "main", "image": "worker", "resources": {"requests": {"cpu": cpu}}}]
        }
    })
}

async fn start() -> Env {
    let serial = KUBE_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sa = gangway_kube_env::Identity::service_account(CHART_SA.0, CHART_SA.1);
    let api = ControlPlane::start(Options {
        identities: vec![sa.clone()],
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    for ns in [NS, CHART_SA.0] {
        api.ensure_namespace(ns).await.expect("namespace");
    }
    support::chart::apply_gangway_rbac(&api, "gangway", CHART_SA.0, CHART_SA.1).await;
    for i in 0..NODES_N {
        api.create(&NODES, node(&format!("node-{i}")))
            .await
            .expect("node");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = support::kube::gangway_on(&api, &sa.user, dir.path(), 2, &[], &[]).await;
    let env = Env {
        api,
        cluster,
        dir,
        _serial: serial,
    };
    let cl = client(&env).await;
    let deadline = Instant::now() + WAIT;
    while cl.list_nodes(None).await.map(|n| n.len()).unwrap_or(0) < NODES_N {
        assert!(Instant::now() < deadline, "the nodes never registered");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    env
}

async fn client(env: &Env) -> gangway_client::Client {
    let id = *env.cluster.live().first().expect("a live process");
    support::client(&env.cluster, id).await
}

/// A gRPC group `name` of one gang of `n` members of `cpu` CPUs standing for pods
/// `name-0..`, at `priority`.
fn group(
    name: &str,
    n: u32,
    cpu: &str,
    priority: i32,
) -> gangway_proto::v1::SubmitGangGroupRequest {
    GangGroupBuilder::new(name)
        .idempotency_key(name)
        .gang(
            GangBuilder::new(NS, name, n)
                .priority(priority)
                .kubernetes_pods(name, n, json!({"requests": {"cpu": cpu}})),
        )
        .build()
}

fn names(prefix: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

async fn create_pods(env: &Env, pods: &[String], group: &str, cpu: &str) {
    for p in pods {
        env.api
            .create(&PODS, framework_pod(p, group, cpu))
            .await
            .unwrap_or_else(|e| panic!("pod {p}: {e}"));
    }
}

/// Pod name → its node, for the live pods of the namespace that are bound.
async fn bound(env: &Env) -> BTreeMap<String, String> {
    let pods = env.api.list(&PODS, Some(NS)).await.unwrap_or_default();
    pods.iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["spec"]["nodeName"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Waits until every pod of `pods` is bound; answers where, and fails loudly with the
/// group's status and the logs' warnings when they are not.
async fn wait_bound(env: &Env, pods: &[String], group: u64) -> BTreeMap<String, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = bound(env).await;
        if pods.iter().all(|p| now.contains_key(p)) {
            return now;
        }
        if Instant::now() > deadline {
            let status = client(env).await.get(group).await;
            let warnings: Vec<String> = (1..=3)
                .flat_map(|id| {
                    env.cluster
                        .log(id)
                        .lines()
                        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                        .map(String::from)
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!("pods {pods:?} not all bound: bound {now:?}\ngroup: {status:#?}\nwarnings: {warnings:#?}");
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Watches `pods` for `NOT_BOUND_WATCH_MS`: none of them may bind.
async fn stays_unbound(env: &Env, pods: &[String]) {
    let until = Instant::now() + Duration::from_millis(NOT_BOUND_WATCH_MS);
    while Instant::now() < until {
        let now = bound(env).await;
        let part: Vec<&String> = pods.iter().filter(|p| now.contains_key(*p)).collect();
        assert!(part.is_empty(), "part of a gang was bound: {part:?}");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Waits until group `id`'s status satisfies `done`.
async fn wait_status(
    env: &Env,
    id: u64,
    what: &str,
    mut done: impl FnMut(&GangGroupStatus) -> bool,
) -> GangGroupStatus {
    let deadline = Instant::now() + WAIT;
    let cl = client(env).await;
    loop {
        let s = cl.get(id).await.expect("get");
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: the group stayed {s:#?}");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Each pod of `pods` is bound to the node its member was placed on.
fn bound_where_placed(status: &GangGroupStatus, now: &BTreeMap<String, String>, pods: &[String]) {
    let placed: BTreeMap<&str, &str> = status
        .placements
        .iter()
        .map(|p| (p.member.as_str(), p.node.as_str()))
        .collect();
    for p in pods {
        assert_eq!(
            placed.get(p.as_str()).copied(),
            now.get(p).map(String::as_str),
            "{p} is bound where its member was placed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frameworks_pods_are_bound_all_or_nothing_through_the_grpc_api() {
    let mut env = start().await;
    let cl = client(&env).await;

    // Pods created before the submission: bound, each where its member is.
    let before = names("before", 16);
    create_pods(&env, &before, "before", "1").await;
    let g_before = cl
        .submit(group("before", 16, "1", 0))
        .await
        .expect("submit before");
    let now = wait_bound(&env, &before, g_before.id).await;
    let status = wait_status(&env, g_before.id, "placed, bound, no reason", |s| {
        s.state == "Placed" && s.reason.is_empty()
    })
    .await;
    bound_where_placed(&status, &now, &before);

    // Submitted first: placed, and waiting for its pods; 15 of 16 bind nothing.
    let after = names("after", 16);
    let g_after = cl
        .submit(group("after", 16, "1", 0))
        .await
        .expect("submit after");
    wait_status(&env, g_after.id, "waiting for every pod", |s| {
        s.state == "Placed" && s.reason.contains("waiting for 16 of its 16 named pods")
    })
    .await;
    create_pods(&env, &after[..15], "after", "1").await;
    let waiting = wait_status(&env, g_after.id, "waiting for the last pod", |s| {
        s.reason.contains("waiting for 1 of its 16 named pods")
    })
    .await;
    assert!(
        waiting.reason.contains("train/after-15"),
        "{}",
        waiting.reason
    );
    stays_unbound(&env, &after[..15]).await;
    create_pods(&env, &after[15..], "after", "1").await;
    let now = wait_bound(&env, &after, g_after.id).await;
    let status = cl.get(g_after.id).await.expect("get after");
    bound_where_placed(&status, &now, &after);

    // The ingest left every named pod to its group: no group of its own for any.
    let groups: BTreeSet<String> = cl
        .list_groups(true)
        .await
        .expect("list")
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(
        groups,
        BTreeSet::from(["before".to_string(), "after".to_string()])
    );

    // A bound pod deleted gives its member back: half of them while the ingest runs,
    // half while it changes hands (its leader killed), which the next leader finds from
    // what the shards hold bound.
    for p in &before[..8] {
        env.api.delete(&PODS, Some(NS), p).await.expect("delete");
    }
    wait_status(
        &env,
        g_before.id,
        "the deleted pods' members released",
        |s| s.placements.len() == 8,
    )
    .await;
    let leader = env
        .cluster
        .agreed_leader(0, &[1, 2, 3])
        .await
        .expect("a meta leader");
    env.cluster.kill(leader);
    for p in &before[8..] {
        env.api.delete(&PODS, Some(NS), p).await.expect("delete");
    }
    env.cluster.spawn(leader);
    env.cluster.wait_ready(&[1, 2, 3], WAIT).await;
    wait_status(&env, g_before.id, "every member released", |s| {
        s.placements.is_empty()
    })
    .await;

    // A pod asking other than its member is refused, with a reason and an event; re-created
    // right, the group binds.
    let odd = names("odd", 2);
    let g_odd = cl
        .submit(group("odd", 2, "1", 0))
        .await
        .expect("submit odd");
    create_pods(&env, &odd[..1], "odd", "1").await;
    create_pods(&env, &odd[1..], "odd", "2").await;
    let refused = wait_status(&env, g_odd.id, "the odd pod refused", |s| {
        s.reason
            .contains("pod train/odd-1 requests cpu=2, but its member asks cpu=1")
    })
    .await;
    assert_eq!(refused.state, "Placed");
    stays_unbound(&env, &odd).await;
    let events = env.api.list(&EVENTS, Some(NS)).await.unwrap_or_default();
    assert!(
        events.iter().any(|e| e["involvedObject"]["name"] == "odd-1"
            && e["reason"] == "FailedScheduling"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("requests cpu=2"))),
        "an event on the refused pod"
    );
    env.api
        .delete(&PODS, Some(NS), &odd[1])
        .await
        .expect("delete");
    create_pods(&env, &odd[1..], "odd", "1").await;
    wait_bound(&env, &odd, g_odd.id).await;
    cl.release(g_odd.id).await.expect("release odd");
    for p in &odd {
        env.api.delete(&PODS, Some(NS), p).await.expect("delete");
    }

    // Members that select their pods by labels: any 4 pods so labelled, created after
    // the submission, are chosen and bound where the members were placed.
    let selected = GangGroupBuilder::new("sel")
        .gang(GangBuilder::new(NS, "sel", 4).kubernetes_pods_selected(
            "sel",
            4,
            &[("app", "sel")],
            json!({"requests": {"cpu": "1"}}),
        ))
        .build();
    let g_sel = cl.submit(selected).await.expect("submit sel");
    wait_status(&env, g_sel.id, "waiting for labelled pods", |s| {
        s.reason
            .contains("4 more pods in train with labels app=sel")
    })
    .await;
    let sel_pods: Vec<String> = ["alpha", "bravo", "charlie", "delta"]
        .iter()
        .map(|n| format!("sel-{n}"))
        .collect();
    for p in &sel_pods {
        let mut pod = framework_pod(p, "sel", "1");
        pod["metadata"]["labels"] = json!({"app": "sel"});
        env.api.create(&PODS, pod).await.expect("pod");
    }
    let now = wait_bound(&env, &sel_pods, g_sel.id).await;
    let status = cl.get(g_sel.id).await.expect("get sel");
    let mut placed: Vec<&str> = status.placements.iter().map(|p| p.node.as_str()).collect();
    let mut used: Vec<&str> = sel_pods
        .iter()
        .filter_map(|p| now.get(p))
        .map(String::as_str)
        .collect();
    placed.sort_unstable();
    used.sort_unstable();
    assert_eq!(
        placed, used,
        "the chosen pods are bound where the members were placed"
    );
    cl.release(g_sel.id).await.expect("release sel");
    for p in &sel_pods {
        env.api.delete(&PODS, Some(NS), p).await.expect("delete");
    }

    // A group released before its pods exist binds none of them once they come, and the
    // ingest still leaves them alone (they name a group, not a gang of their own).
    let late = names("late", 2);
    let g_late = cl
        .submit(group("late", 2, "1", 0))
        .await
        .expect("submit late");
    wait_status(&env, g_late.id, "placed", |s| s.state == "Placed").await;
    cl.release(g_late.id).await.expect("release late");
    wait_status(&env, g_late.id, "released", |s| s.state == "Released").await;
    create_pods(&env, &late, "late", "1").await;
    stays_unbound(&env, &late).await;
    let groups = cl.list_groups(true).await.expect("list");
    assert!(
        groups
            .iter()
            .all(|g| !g.gangs.iter().any(|n| n.starts_with("train/late-"))),
        "no group of the ingest's for a framework's pod: {groups:?}"
    );
    for p in &late {
        env.api.delete(&PODS, Some(NS), p).await.expect("delete");
    }

    // A group of higher priority that needs every node whole preempts the framework's
    // gang: its pods are evicted, its watch stream ends Preempted naming the preemptor,
    // and the preemptor's own named pods bind once the victims are gone.
    let urgent = names("urgent", NODES_N as u32);
    create_pods(&env, &urgent, "urgent", &NODE_CPUS.to_string()).await;
    let watcher = {
        let cl = client(&env).await;
        let id = g_after.id;
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let last = cl
                .watch_until(id, |s| {
                    seen.push(s.state.clone());
                    s.state == "Preempted"
                })
                .await;
            (seen, last)
        })
    };
    let g_urgent = cl
        .submit(group("urgent", NODES_N as u32, &NODE_CPUS.to_string(), 100))
        .await
        .expect("submit urgent");
    let Ok(watched) = tokio::time::timeout(WAIT, watcher).await else {
        panic!(
            "the watch did not report the preemption in time; the preemptor: {:#?}\nthe gang: {:?}\npreemption log: {}\nnodes: {:?}",
            cl.get(g_urgent.id).await,
            cl.get(g_after.id).await,
            (1..=3).flat_map(|id| env.cluster.log(id).lines().filter(|l| l.contains("preempt")).map(String::from).collect::<Vec<_>>()).collect::<Vec<_>>().join("\n"),
            cl.list_nodes(None).await.map(|nodes| nodes
                .into_iter()
                .map(|n| (n.node.map(|s| s.name), n.requested, n.pod_slots.into_iter().map(|p| (p.member, p.state)).collect::<Vec<_>>()))
                .collect::<Vec<_>>())
        );
    };
    let (seen, last) = watched.expect("the watcher");
    let last = last.expect("the watch");
    assert_eq!(last.state, "Preempted", "states seen: {seen:?}");
    assert!(
        last.reason.contains(&format!("gang group {}", g_urgent.id)),
        "names the preemptor: {}",
        last.reason
    );
    let notice = last.preempted.as_ref().expect("a preemption notice");
    assert_eq!(notice.by, g_urgent.id);
    assert_eq!(
        notice.members.len(),
        after.len(),
        "which members: {notice:?}"
    );
    assert!(notice.at_ms >= g_urgent.submitted_at_ms, "when: {notice:?}");
    // The victims are evicted (terminating: no kubelet here); finish as kubelets would.
    let deadline = Instant::now() + WAIT;
    loop {
        let pods = env.api.list(&PODS, Some(NS)).await.unwrap_or_default();
        let going = |name: &str| {
            pods.iter()
                .find(|p| p["metadata"]["name"] == name)
                .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
        };
        if after.iter().all(|p| going(p)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the preempted gang's pods were not all evicted"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    for p in &after {
        let _ = env.api.delete(&PODS, Some(NS), p).await;
    }
    let now = wait_bound(&env, &urgent, g_urgent.id).await;
    let nodes: BTreeSet<&String> = urgent.iter().filter_map(|p| now.get(p)).collect();
    assert_eq!(nodes.len(), NODES_N, "one urgent pod per node: {now:?}");
    // Bound, it still says whom it preempted (the binder clears only its own reasons).
    let urgent_now = cl.get(g_urgent.id).await.expect("get urgent");
    assert!(
        urgent_now
            .reason
            .contains(&format!("preempting gang groups {}", g_after.id)),
        "{}",
        urgent_now.reason
    );
}

/// Runs the example framework for job `name` of `workers` workers of `cpu` CPUs at
/// `priority`, against `env`'s gangway replicas and API server (as the admin).
fn example_job(
    env: &Env,
    name: &str,
    workers: u32,
    cpu: &str,
    priority: i32,
) -> tokio::process::Child {
    let kubeconfig = env.dir.path().join("admin.kubeconfig");
    env.api
        .write_kubeconfig(&kubeconfig, gangway_kube_env::ADMIN_USER)
        .expect("kubeconfig");
    let endpoints: Vec<String> = env
        .cluster
        .live()
        .iter()
        .map(|id| format!("http://{}", env.cluster.procs[id].grpc))
        .collect();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../client/python/examples/batch_job.py");
    let python = std::env::var("GANGWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    tokio::process::Command::new(python)
        .arg(script)
        .args(["--gangway", &endpoints.join(",")])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--namespace", NS, "--name", name, "--cpu", cpu])
        .args([
            "--workers",
            &workers.to_string(),
            "--priority",
            &priority.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the example runs (python3 with client/python installed: ./test.sh)")
}

/// Waits for the example to end; answers its exit code and what it printed.
async fn example_ends(job: tokio::process::Child) -> (Option<i32>, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(EXAMPLE_TIMEOUT_S),
        job.wait_with_output(),
    )
    .await
    .expect("the example ends in time")
    .expect("the example's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The id of the group named `name` once gangway has it.
async fn group_id(env: &Env, name: &str) -> u64 {
    let cl = client(env).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let groups = cl.list_groups(true).await.unwrap_or_default();
        if let Some(g) = groups.iter().find(|g| g.name == name) {
            return g.id;
        }
        assert!(Instant::now() < deadline, "no group {name}: {groups:?}");
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Acts as the kubelets would: the pods ran and exited 0.
async fn succeed(env: &Env, pods: &[String]) {
    for p in pods {
        let patch = json!({"status": {"phase": "Succeeded"}});
        env.api
            .call(
                http::Method::PATCH,
                &format!("/api/v1/namespaces/{NS}/pods/{p}/status"),
                "application/merge-patch+json",
                Some(&patch),
            )
            .await
            .unwrap_or_else(|e| panic!("{p} succeeded: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_framework_runs_a_job_end_to_end_and_cleans_up_after_preemption() {
    let env = start().await;
    let cl = client(&env).await;

    // A job of 4 workers: pods created, group submitted, every pod bound; its workers
    // succeed (as kubelets would say), and it releases the group and deletes the pods.
    let job = example_job(&env, "job-1", 4, "2", 0);
    let id = group_id(&env, "job-1").await;
    let workers = names("job-1", 4);
    let now = wait_bound(&env, &workers, id).await;
    bound_where_placed(&cl.get(id).await.expect("get"), &now, &workers);
    succeed(&env, &workers).await;
    let (code, said) = example_ends(job).await;
    assert_eq!(code, Some(0), "the job succeeded: {said}");
    assert!(said.contains("every worker succeeded"), "{said}");
    assert_eq!(cl.get(id).await.expect("get").state, "Released");
    let left: Vec<String> = bound(&env)
        .await
        .into_keys()
        .filter(|p| p.starts_with("job-1-"))
        .collect();
    assert!(left.is_empty(), "its pods deleted: {left:?}");

    // A job filling every node is preempted by a group of higher priority: the example
    // sees it on its watch, deletes its pods and says so.
    let job = example_job(&env, "job-2", NODES_N as u32, &NODE_CPUS.to_string(), 0);
    let id = group_id(&env, "job-2").await;
    wait_bound(&env, &names("job-2", NODES_N as u32), id).await;
    let urgent = GangGroupBuilder::new("urgent-plain")
        .gang(
            GangBuilder::new(NS, "urgent-plain", NODES_N as u32)
                .priority(100)
                .members(
                    "u",
                    NODES_N as u32,
                    json!({"requests": {"cpu": NODE_CPUS.to_string()}}),
                ),
        )
        .build();
    let urgent = cl.submit(urgent).await.expect("submit the preemptor");
    let (code, said) = example_ends(job).await;
    assert_eq!(code, Some(3), "the job was preempted: {said}");
    assert!(
        said.contains(&format!("preempted by gang group {}", urgent.id)),
        "{said}"
    );
    // Its pods went (evicted or deleted; no kubelet finishes a graceful deletion here).
    for p in names("job-2", NODES_N as u32) {
        let _ = env.api.delete(&PODS, Some(NS), &p).await;
    }
    wait_status(&env, urgent.id, "the preemptor placed", |s| {
        s.state == "Placed"
    })
    .await;
}
