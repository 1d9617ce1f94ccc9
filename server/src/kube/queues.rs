//! Queues from Kubernetes: scheduler-plugins' ElasticQuota objects
//! (`scheduling.x-k8s.io/v1alpha1`, `spec.min` and `spec.max` per resource) kept as
//! queues, and the queue a pod is charged to.
//!
//! An ElasticQuota keeps the queue named after its namespace (one per namespace, as
//! scheduler-plugins allows; a second one in a namespace is ignored and reported), marked
//! `managed_by: ElasticQuota namespace/name`, so the admin API cannot change it and it
//! cannot take over a queue made there. A pod is charged to the queue its
//! `scheduling.gangway.dev/queue` label names, else to its namespace's ElasticQuota
//! queue, else to none. Pure; called by the ingest (`ingest.rs`) on the meta leader.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::model::queue::{Limits, QUEUE_WEIGHT_DEFAULT};
use crate::model::{FieldPath, QueueSpec};

/// The pod label naming the queue a pod is charged to.
pub const QUEUE_LABEL: &str = "scheduling.gangway.dev/queue";

/// What an ElasticQuota keeps: the queue, or why it cannot.
pub fn queue_of_elastic_quota(object: &Value) -> Result<QueueSpec, String> {
    let meta = &object["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let name = meta["name"].as_str().unwrap_or_default();
    let read = |field: &str| -> Result<Limits, String> {
        let mut list = BTreeMap::new();
        if let Some(map) = object["spec"][field].as_object() {
            for (resource, amount) in map {
                let text = match amount {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    other => {
                        return Err(format!(
                            "ElasticQuota {namespace}/{name}: spec.{field}.{resource}: {other} is not a quantity"
                        ))
                    }
                };
                list.insert(resource.clone(), text);
            }
        }
        Limits::from_quantities(&FieldPath::new("spec").child(field), &list)
            .map_err(|e| format!("ElasticQuota {namespace}/{name}: {e}"))
    };
    let spec = QueueSpec {
        name: namespace.to_string(),
        parent: String::new(),
        weight: QUEUE_WEIGHT_DEFAULT,
        min: read("min")?,
        max: read("max")?,
        lend: crate::model::queue::Limits::none(),
        managed_by: format!("ElasticQuota {namespace}/{name}"),
    };
    spec.validate(&FieldPath::new("queue"))
        .map_err(|e| format!("ElasticQuota {namespace}/{name}: {e}"))?;
    Ok(spec)
}

/// The queues the ElasticQuotas keep, by queue name, and the problems of those that
/// keep none (subject → message).
pub fn queues_of<'a>(
    quotas: impl Iterator<Item = &'a Value>,
) -> (BTreeMap<String, QueueSpec>, BTreeMap<String, String>) {
    let mut queues = BTreeMap::new();
    let mut problems = BTreeMap::new();
    for object in quotas {
        let subject = format!(
            "ElasticQuota {}/{}",
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        match queue_of_elastic_quota(object) {
            Ok(spec) => match queues.get(&spec.name) {
                Some(first) => {
                    let first: &QueueSpec = first;
                    problems.insert(
                        subject.clone(),
                        format!(
                            "{subject} is ignored: namespace {} already has {}",
                            spec.name, first.managed_by
                        ),
                    );
                }
                None => {
                    queues.insert(spec.name.clone(), spec);
                }
            },
            Err(why) => {
                problems.insert(subject, why);
            }
        }
    }
    (queues, problems)
}

/// The queue `pod` is charged to: its label's, else its namespace's when an
/// ElasticQuota keeps one (`kept`), else none.
pub fn queue_of_pod(pod: &Value, kept: &BTreeSet<String>) -> String {
    if let Some(label) = pod["metadata"]["labels"][QUEUE_LABEL].as_str() {
        return label.to_string();
    }
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    if kept.contains(namespace) {
        return namespace.to_string();
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ResourceName;
    use serde_json::json;

    fn quota(namespace: &str, name: &str, min: Value, max: Value) -> Value {
        json!({"metadata": {"namespace": namespace, "name": name},
               "spec": {"min": min, "max": max}})
    }

    #[test]
    fn an_elastic_quota_keeps_its_namespaces_queue() {
        let q = queue_of_elastic_quota(&quota(
            "team-a",
            "quota",
            json!({"cpu": "8", "memory": "16Gi"}),
            json!({"cpu": 16, "nvidia.com/gpu": "4"}),
        ))
        .expect("valid");
        assert_eq!(q.name, "team-a");
        assert_eq!(q.managed_by, "ElasticQuota team-a/quota");
        assert_eq!(q.min.get(&ResourceName::Cpu), Some(8_000));
        assert_eq!(q.max.get(&ResourceName::Cpu), Some(16_000));
        assert_eq!(
            q.max.get(&ResourceName::Extended("nvidia.com/gpu".into())),
            Some(4)
        );
    }

    #[test]
    fn bad_quotas_and_second_quotas_of_a_namespace_are_reported() {
        let bad = quota("a", "q", json!({"cpu": "lots"}), json!({}));
        let above = quota("b", "q", json!({"cpu": "9"}), json!({"cpu": "8"}));
        let first = quota("c", "first", json!({}), json!({}));
        let second = quota("c", "second", json!({}), json!({}));
        let (queues, problems) = queues_of([&bad, &above, &first, &second].into_iter());
        assert_eq!(queues.keys().collect::<Vec<_>>(), vec!["c"]);
        assert!(
            problems["ElasticQuota a/q"].contains("spec.min.cpu"),
            "{problems:?}"
        );
        assert!(
            problems["ElasticQuota b/q"].contains("above max"),
            "{problems:?}"
        );
        assert!(
            problems["ElasticQuota c/second"].contains("already has ElasticQuota c/first"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_pod_is_charged_to_its_label_then_its_namespaces_quota() {
        let kept = BTreeSet::from(["team-a".to_string()]);
        let labelled =
            json!({"metadata": {"namespace": "team-a", "labels": {QUEUE_LABEL: "gpu-pool"}}});
        assert_eq!(queue_of_pod(&labelled, &kept), "gpu-pool");
        let plain = json!({"metadata": {"namespace": "team-a"}});
        assert_eq!(queue_of_pod(&plain, &kept), "team-a");
        let elsewhere = json!({"metadata": {"namespace": "team-b"}});
        assert_eq!(queue_of_pod(&elsewhere, &kept), "");
    }
}
