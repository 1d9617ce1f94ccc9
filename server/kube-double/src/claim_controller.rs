//! The part of kube-controller-manager's resourceclaim controller the tests need:
//! a pod naming a ResourceClaimTemplate gets a ResourceClaim made from it (owned by
//! the pod, named `<pod>-<claim>-<suffix>`), and the names land in
//! `pod.status.resourceClaimStatuses`; deleting the pod deletes its claims, as the
//! garbage collector does. It runs inside the write that created or deleted the
//! pod, where the real controller acts a moment later. Called by the HTTP layer.

use serde_json::{json, Value};

use crate::store::{Store, PODS, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES};

/// Creates the claims of a new pod's template references and records their names.
pub fn pod_created(store: &mut Store, pod: &Value) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let mut statuses = Vec::new();
    for entry in pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let (Some(claim), Some(template)) = (
            entry["name"].as_str(),
            entry["resourceClaimTemplateName"].as_str(),
        ) else {
            continue;
        };
        // A missing template leaves the pod waiting, as upstream (which also records an event).
        let Ok(template) = store.get(&RESOURCE_CLAIM_TEMPLATES, Some(ns), template) else {
            continue;
        };
        let object = json!({
            "metadata": {
                "generateName": format!("{name}-{claim}-"),
                "namespace": ns,
                "annotations": {"resource.kubernetes.io/pod-claim-name": claim},
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true,
                }],
                "labels": template["spec"]["metadata"]["labels"].clone(),
            },
            "spec": template["spec"]["spec"].clone(),
        });
        if let Ok(created) = store.create(&RESOURCE_CLAIMS, Some(ns), object) {
            if let Some(claim_name) = created["metadata"]["name"].as_str() {
                statuses.push(json!({"name": claim, "resourceClaimName": claim_name}));
            }
        }
    }
    if statuses.is_empty() {
        return;
    }
    let _ = store.update(&PODS, Some(ns), name, None, |p| {
        p["status"]["resourceClaimStatuses"] = Value::Array(statuses);
        Ok(())
    });
}

/// Deletes the claims a deleted pod owned.
pub fn pod_deleted(store: &mut Store, pod: &Value) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let selector = crate::store::Selector {
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let (claims, _) = store.list(&RESOURCE_CLAIMS, &selector);
    for claim in claims {
        let owned = claim["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)));
        if let (true, Some(name)) = (owned, claim["metadata"]["name"].as_str()) {
            let _ = store.delete(&RESOURCE_CLAIMS, Some(ns), name, None, None);
        }
    }
}
