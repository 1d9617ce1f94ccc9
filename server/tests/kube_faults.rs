//! The Kubernetes adapter under a fault the real API server cannot be made to show
//! here: `pods/binding` answered 503 ServiceUnavailable (as an overloaded server
//! does). It runs against the API server double (gangway-kube-double), which can;
//! every other Kubernetes test runs against the real control plane (`kube.rs`).

mod support;

use std::time::{Duration, Instant};

use gangway_kube_double::store::{NODES, PODS};
use gangway_kube_double::{ApiServerDouble, Options};
use serde_json::{json, Value};
use support::Cluster;

const NS: &str = "train";

fn pod_with_cpu(name: &str, cpu: &str, annotations: Value) -> Value {
    support::objects::pod_with_cpu(NS, name, cpu, annotations)
}

fn node_of(api: &ApiServerDouble, pod: &str) -> Option<String> {
    api.get(&PODS, Some(NS), pod)
        .ok()
        .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from))
}

fn failed_scheduling(api: &ApiServerDouble, pod: &str) -> Vec<String> {
    api.list(&gangway_kube_double::store::EVENTS, Some(NS))
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == pod && e["reason"] == "FailedScheduling")
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

fn tails(cluster: &Cluster) -> String {
    (1..=3)
        .map(|id| {
            let log = cluster.log(id);
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

async fn wait_until(what: &str, cluster: &Cluster, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}\n{}",
            tails(cluster)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_gang_that_loses_a_pod_while_bindings_fail_is_released_whole_and_waits_again() {
    let api = ApiServerDouble::start(Options::default())
        .await
        .expect("double starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    for name in ["node-000", "node-001"] {
        api.create(&NODES, support::objects::node(name))
            .expect("node");
    }
    let args = vec!["--kubeconfig".to_string(), kubeconfig.display().to_string()];
    let cluster = Cluster::start_with(3, 2, args, Vec::new());
    cluster
        .wait_ready(&[1, 2, 3], Duration::from_secs(30))
        .await;

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
    wait_until("the broken Strict gang reported", &cluster, || {
        ["strict-0", "strict-1"].iter().all(|p| {
            failed_scheduling(&api, p)
                .iter()
                .any(|m| m.contains("lost a pod before binding"))
        })
    })
    .await;
    api.set_bindings_unavailable(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for p in ["strict-0", "strict-1"] {
        assert_eq!(
            node_of(&api, p),
            None,
            "two of three do not bind ({p}); bindings: {:?}\n{}",
            api.bindings(),
            tails(&cluster)
        );
    }
    api.create(&PODS, pod_with_cpu("strict-3", "1", strict.clone()))
        .expect("pod");
    wait_until("the Strict gang bound with its new pod", &cluster, || {
        ["strict-0", "strict-1", "strict-3"]
            .iter()
            .all(|p| node_of(&api, p).is_some())
    })
    .await;
}
