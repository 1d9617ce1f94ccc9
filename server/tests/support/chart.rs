//! The Helm chart's objects as the Kubernetes tests apply them: a template's lines
//! holding template actions dropped (the chart's RBAC rules and CRD schemas are plain
//! YAML), names set by the caller. Used by `kube.rs` and `kube_auth.rs`.

use gangway_kube_env::ControlPlane;
use serde_json::{json, Value};

/// Every object of chart template `template` (documents split on `---`).
pub fn chart_objects(template: &str) -> Vec<Value> {
    let path = format!(
        "{}/../helm/gangway/templates/{template}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // Lines holding a template action go, and so do the lines of an action (a
    // comment) that spans several: `open` counts the actions not closed yet.
    let mut open = 0usize;
    let mut plain = String::new();
    for line in text.lines() {
        let opens = line.matches("{{").count();
        let closes = line.matches("}}").count();
        let inside = open > 0 || opens > 0;
        open = (open + opens).saturating_sub(closes);
        if !inside {
            plain.push_str(line);
            plain.push('\n');
        }
    }
    plain
        .split("\n---\n")
        .filter(|doc| {
            doc.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|doc| serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

/// The one object of chart template `template`.
pub fn chart_object(template: &str) -> Value {
    let mut objects = chart_objects(template);
    assert_eq!(objects.len(), 1, "{template} holds one object");
    objects.remove(0)
}

async fn post(api: &ControlPlane, path: &str, object: &Value, what: &str) {
    api.call(http::Method::POST, path, "application/json", Some(object))
        .await
        .unwrap_or_else(|e| panic!("{what} is accepted: {e}"));
}

/// Applies the chart's ClusterRole for gangway (as `name`) and its binding to the
/// ServiceAccount `namespace/account`.
pub async fn apply_gangway_rbac(api: &ControlPlane, name: &str, namespace: &str, account: &str) {
    let mut role = chart_object("clusterrole.yaml");
    role["metadata"] = json!({"name": name});
    post(
        api,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        &role,
        "the chart's ClusterRole",
    )
    .await;
    let mut binding = chart_object("clusterrolebinding.yaml");
    binding["metadata"] = json!({"name": name});
    binding["roleRef"]["name"] = json!(name);
    binding["subjects"] =
        json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
    post(
        api,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &binding,
        "the chart's ClusterRoleBinding",
    )
    .await;
}

/// Applies the chart's ClusterRoles for gangway's users, named `gangway-<role>`
/// (admin, viewer, tenant, node); returns their names.
pub async fn apply_user_roles(api: &ControlPlane) -> Vec<String> {
    let mut names = Vec::new();
    for mut role in chart_objects("clusterrole-users.yaml") {
        let component = role["metadata"]["labels"]["app.kubernetes.io/component"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("rbac-")
            .to_string();
        let name = format!("gangway-{component}");
        role["metadata"] = json!({"name": name});
        post(
            api,
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            &role,
            &name,
        )
        .await;
        names.push(name);
    }
    names
}

/// A ClusterRole `name` with `rules`.
pub async fn cluster_role(api: &ControlPlane, name: &str, rules: Value) {
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                      "metadata": {"name": name}, "rules": rules});
    post(
        api,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        &role,
        name,
    )
    .await;
}

/// Binds ClusterRole `role` to ServiceAccount `namespace/account`: cluster-wide, or in
/// namespace `within` only (a RoleBinding).
pub async fn bind(
    api: &ControlPlane,
    role: &str,
    namespace: &str,
    account: &str,
    within: Option<&str>,
) {
    let name = format!("{role}--{namespace}-{account}");
    let subjects = json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
    let role_ref =
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role});
    match within {
        None => {
            let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                                 "metadata": {"name": name}, "roleRef": role_ref, "subjects": subjects});
            post(
                api,
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                &binding,
                &name,
            )
            .await;
        }
        Some(ns) => {
            let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                                 "metadata": {"name": name, "namespace": ns}, "roleRef": role_ref, "subjects": subjects});
            let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings");
            post(api, &path, &binding, &name).await;
        }
    }
}
