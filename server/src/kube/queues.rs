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

use gangway_core::model::queue::{Limits, QUEUE_WEIGHT_DEFAULT};
use gangway_core::model::{FieldPath, QueueSpec};

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
        lend: gangway_core::model::queue::Limits::none(),
        managed_by: format!("ElasticQuota {namespace}/{name}"),
        namespaces: Vec::new(),
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

/// The queue `pod` is charged to, and why its label was not honoured if it was not. A
/// label naming a queue that lists the pod's namespace (`namespaces`, of `specs`) is
/// honoured; otherwise the pod is charged to its namespace's queue when an ElasticQuota
/// keeps one (`kept`), else to none. An empty label, or one naming a queue the
/// namespace may not use, never takes a pod out of its namespace's quota.
pub fn queue_of_pod(
    pod: &Value,
    kept: &BTreeSet<String>,
    specs: &BTreeMap<String, QueueSpec>,
) -> (String, Option<String>) {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let own = if kept.contains(namespace) {
        namespace.to_string()
    } else {
        String::new()
    };
    let Some(label) = pod["metadata"]["labels"][QUEUE_LABEL].as_str() else {
        return (own, None);
    };
    if label.is_empty() || label == own {
        return (own, None);
    }
    match specs.get(label) {
        Some(spec) if spec.admits_namespace(namespace) => (label.to_string(), None),
        Some(_) => (
            own,
            Some(format!(
                "label {QUEUE_LABEL}={label} is not honoured: queue {label} does not list namespace {namespace} (gangctl queues put {label} --namespace {namespace})"
            )),
        ),
        None => (
            own,
            Some(format!(
                "label {QUEUE_LABEL}={label} is not honoured: there is no queue {label}"
            )),
        ),
    }
}

/// The queue a Volcano PodGroup's `spec.queue` names for its pods in `namespace`: none
/// when it names none, or Volcano's `default` that gangway does not have; the queue when
/// gangway has it and it lists the namespace; else why not (the pods are then refused
/// rather than charged elsewhere).
pub fn queue_of_volcano_group(
    group: &Value,
    namespace: &str,
    specs: &BTreeMap<String, QueueSpec>,
) -> Result<Option<String>, String> {
    let name = group["spec"]["queue"].as_str().unwrap_or_default();
    let what = || {
        format!(
            "PodGroup {namespace}/{} (scheduling.volcano.sh): spec.queue \"{name}\"",
            group["metadata"]["name"].as_str().unwrap_or_default()
        )
    };
    match specs.get(name) {
        _ if name.is_empty() => Ok(None),
        None if name == VOLCANO_DEFAULT_QUEUE => Ok(None),
        None => Err(format!(
            "{}: there is no gangway queue {name} (gangctl queues put {name} --namespace {namespace})",
            what()
        )),
        Some(spec) if spec.admits_namespace(namespace) => Ok(Some(name.to_string())),
        Some(_) => Err(format!(
            "{}: queue {name} does not list namespace {namespace} (gangctl queues put {name} --namespace {namespace})",
            what()
        )),
    }
}

/// The queue Volcano gives PodGroups that name none.
pub const VOLCANO_DEFAULT_QUEUE: &str = "default";

#[cfg(test)]
#[path = "queues_tests.rs"]
mod tests;
