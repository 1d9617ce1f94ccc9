//! The harness itself against the real binaries: a fresh control plane serves
//! objects with their status, audits bindings, runs the resourceclaim controller,
//! and applies RBAC to the identities it was asked for.

use gangway_kube_double::store::{
    DEVICE_CLASSES, NODES, PODS, POD_GROUPS_X, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES,
};
use gangway_kube_env::{ControlPlane, Identity, Options};
use http::Method;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_control_plane_serves_audits_binds_and_makes_claims_from_templates() {
    let options = Options {
        identities: vec![Identity::service_account("gangway", "gangway")],
        ..Options::default()
    };
    let plane = ControlPlane::start(options)
        .await
        .expect("control plane starts");
    plane.ensure_namespace("train").await.expect("namespace");

    let node = plane
        .create(
            &NODES,
            json!({"metadata": {"name": "node-0"},
                   "status": {"allocatable": {"cpu": "8", "pods": "110"},
                              "conditions": [{"type": "Ready", "status": "True"}]}}),
        )
        .await
        .expect("node");
    assert_eq!(
        node["status"]["allocatable"]["cpu"], "8",
        "status written: {node}"
    );

    plane
        .create(&DEVICE_CLASSES, json!({"metadata": {"name": "gpu.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]}}))
        .await
        .expect("class");
    plane
        .create(&RESOURCE_CLAIM_TEMPLATES, json!({"metadata": {"name": "one-gpu", "namespace": "train"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}}))
        .await
        .expect("template");
    let pod = plane
        .create(
            &PODS,
            json!({"metadata": {"name": "p-0", "namespace": "train"},
            "spec": {"schedulerName": "gangway",
                     "containers": [{"name": "main", "image": "trainer"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}}),
        )
        .await
        .expect("pod");

    // The resourceclaim controller makes the claim and names it in the pod's status.
    let start = Instant::now();
    let claim_name = loop {
        let pod = plane.get(&PODS, Some("train"), "p-0").await.expect("pod");
        if let Some(name) = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str()
        {
            break name.to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no claim made from the template: {pod}\n{}",
            plane.log_tail("kube-controller-manager")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    plane
        .get(&RESOURCE_CLAIMS, Some("train"), &claim_name)
        .await
        .expect("claim exists");

    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    plane
        .call(
            Method::POST,
            "/api/v1/namespaces/train/pods/p-0/binding",
            "application/json",
            Some(&json!({"apiVersion": "v1", "kind": "Binding",
                         "metadata": {"name": "p-0", "uid": uid},
                         "target": {"kind": "Node", "name": "node-0"}})),
        )
        .await
        .expect("binding");
    let bindings = plane.bindings();
    assert_eq!(bindings.len(), 1, "{bindings:?}");
    assert_eq!(
        (bindings[0].pod.as_str(), bindings[0].node.as_str()),
        ("p-0", "node-0")
    );

    // PodGroup CRDs of both groups are served.
    plane.install_pod_group_crds().await.expect("CRDs");
    plane
        .create(
            &POD_GROUPS_X,
            json!({"metadata": {"name": "g", "namespace": "train"}, "spec": {"minMember": 2}}),
        )
        .await
        .expect("PodGroup");

    // An identity with no role binding is refused (RBAC is on).
    let kubeconfig = plane.dir().join("sa.kubeconfig");
    plane
        .write_kubeconfig(&kubeconfig, "system:serviceaccount:gangway:gangway")
        .expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("read"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let request = http::Request::builder()
        .uri("/api/v1/nodes")
        .body(Vec::new())
        .expect("request");
    let refused = client.request::<serde_json::Value>(request).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "{refused:?}"
    );
}
