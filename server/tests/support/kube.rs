//! Three `gangway serve` processes scheduling a real control plane (gangway-kube-env),
//! as the Kubernetes tests start them, and the PriorityClasses their preemptions use.
//! Used by `kube.rs`, `kube_workloads.rs`, `workload_differential.rs` and
//! `dra_differential.rs`.

use std::path::Path;
use std::time::Duration;

use gangway_kube_env::ControlPlane;

use super::{arm_failpoints, Cluster};

/// Three replicas (`shards` shards) scheduling `api` as `user` through a kubeconfig
/// written in `dir`, with `extra` flags and these test bug switches armed; answers
/// once every replica is ready.
pub async fn gangway_on(
    api: &ControlPlane,
    user: &str,
    dir: &Path,
    shards: u32,
    extra: &[String],
    failpoints: &[&str],
) -> Cluster {
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, user).expect("kubeconfig");
    let mut args = vec!["--kubeconfig".to_string(), kubeconfig.display().to_string()];
    args.extend(extra.iter().cloned());
    let vars = arm_failpoints(&mut args, failpoints);
    let cluster = Cluster::start_with(3, shards, args, vars);
    cluster
        .wait_ready(&[1, 2, 3], Duration::from_secs(30))
        .await;
    cluster
}

/// Makes these PriorityClasses (name, value); the API server's Priority admission then
/// resolves a pod's `priorityClassName` into `spec.priority`.
pub async fn create_priority_classes(api: &ControlPlane, classes: &[(&str, i32)]) {
    for (name, value) in classes {
        let class = serde_json::json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
        });
        api.call(
            http::Method::POST,
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            "application/json",
            Some(&class),
        )
        .await
        .expect("PriorityClass");
    }
}
