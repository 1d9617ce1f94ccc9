//! Unit tests of `queues.rs`.

use super::*;
use gangway_core::model::ResourceName;
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
fn a_label_is_honoured_only_for_a_queue_that_lists_the_namespace() {
    let kept = BTreeSet::from(["team-a".to_string(), "team-b".to_string()]);
    let specs: BTreeMap<String, QueueSpec> = [
        ("gpu-pool", vec!["team-a".to_string()]),
        ("open", vec!["*".to_string()]),
        ("team-b", Vec::new()),
    ]
    .into_iter()
    .map(|(n, ns)| {
        (
            n.to_string(),
            QueueSpec {
                name: n.into(),
                weight: 1,
                namespaces: ns,
                ..Default::default()
            },
        )
    })
    .collect();
    let pod = |ns: &str, label: Option<&str>| match label {
        Some(l) => json!({"metadata": {"namespace": ns, "labels": {QUEUE_LABEL: l}}}),
        None => json!({"metadata": {"namespace": ns}}),
    };
    let q = |ns, label| queue_of_pod(&pod(ns, label), &kept, &specs);
    assert_eq!(q("team-a", Some("gpu-pool")), ("gpu-pool".into(), None));
    assert_eq!(q("team-c", Some("open")), ("open".into(), None));
    assert_eq!(q("team-a", None), ("team-a".into(), None));
    assert_eq!(q("team-c", None), (String::new(), None));
    // No way out of the namespace's quota: an empty label, another namespace's
    // queue, a queue that does not list it, or one that does not exist.
    assert_eq!(q("team-a", Some("")), ("team-a".into(), None));
    for foreign in ["team-b", "gpu-pool", "missing"] {
        let (queue, why) = q(
            if foreign == "gpu-pool" {
                "team-b"
            } else {
                "team-a"
            },
            Some(foreign),
        );
        assert!(queue == "team-a" || queue == "team-b", "{foreign}: {queue}");
        assert!(
            why.is_some_and(|w| w.contains("is not honoured")),
            "{foreign}"
        );
    }
}

#[test]
fn a_volcano_pod_group_is_charged_to_its_queue_or_refused_with_the_reason() {
    let mut spec = QueueSpec {
        name: "research".into(),
        ..QueueSpec::default()
    };
    spec.namespaces = vec!["ml".into()];
    let specs = BTreeMap::from([("research".to_string(), spec)]);
    let group = |queue: &str| json!({"metadata": {"name": "job"}, "spec": {"queue": queue}});
    assert_eq!(
        queue_of_volcano_group(&group("research"), "ml", &specs),
        Ok(Some("research".into()))
    );
    assert_eq!(queue_of_volcano_group(&group(""), "ml", &specs), Ok(None));
    assert_eq!(
        queue_of_volcano_group(&group("default"), "ml", &specs),
        Ok(None)
    );
    let none = queue_of_volcano_group(&group("batch"), "ml", &specs).expect_err("no queue");
    assert!(
        none.contains("spec.queue \"batch\"") && none.contains("no gangway queue"),
        "{none}"
    );
    let foreign =
        queue_of_volcano_group(&group("research"), "web", &specs).expect_err("not listed");
    assert!(foreign.contains("does not list namespace web"), "{foreign}");
}
