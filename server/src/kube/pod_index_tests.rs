//! Unit tests of `pod_index.rs`.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn pod(name: &str, uid: &str, node: Option<&str>, group: Option<&str>, phase: &str) -> Arc<Value> {
    let mut labels = serde_json::Map::new();
    if let Some(g) = group {
        labels.insert(gangs::LABEL_POD_GROUP.into(), json!(g));
    }
    Arc::new(json!({
        "metadata": {"namespace": "ns", "name": name, "uid": uid, "labels": labels},
        "spec": {"schedulerName": "gangway", "nodeName": node.unwrap_or("")},
        "status": {"phase": phase},
    }))
}

fn key(name: &str) -> Key {
    ("ns".into(), name.into())
}

#[test]
fn a_binding_touches_the_node_and_the_pod_group() {
    let mut index = PodIndex::default();
    let mut touched = Touched::default();
    index.update(
        key("a"),
        Some(pod("a", "u1", None, Some("pg"), "Pending")),
        "gangway",
        &mut touched,
    );
    assert!(index.get(&key("a")).is_some_and(PodFacts::pending_ours));
    let mut touched = Touched::default();
    index.update(
        key("a"),
        Some(pod("a", "u1", Some("n1"), Some("pg"), "Pending")),
        "gangway",
        &mut touched,
    );
    assert_eq!(touched.nodes, BTreeSet::from(["n1".to_string()]));
    assert_eq!(touched.pod_groups, BTreeSet::from([key("pg")]));
    assert!(touched.deleted.is_empty());
    assert_eq!(index.on_node("n1").count(), 1);
    assert_eq!(
        index
            .in_pod_group(PodGroupApi::SchedulerPlugins, &key("pg"))
            .count(),
        1
    );
    assert_eq!(index.in_gang("ns", "pg").count(), 1);
}

#[test]
fn a_pod_replaced_under_its_name_counts_as_deleted() {
    let mut index = PodIndex::default();
    let mut touched = Touched::default();
    index.update(
        key("a"),
        Some(pod("a", "u1", Some("n1"), None, "Running")),
        "gangway",
        &mut touched,
    );
    let mut touched = Touched::default();
    index.update(
        key("a"),
        Some(pod("a", "u2", None, None, "Pending")),
        "gangway",
        &mut touched,
    );
    assert_eq!(touched.deleted.len(), 1);
    assert_eq!(touched.deleted[0].uid, "u1");
    assert_eq!(touched.nodes, BTreeSet::from(["n1".to_string()]));
    assert_eq!(index.on_node("n1").count(), 0);
    let old = PodRef {
        namespace: "ns".into(),
        name: "a".into(),
        uid: "u1".into(),
    };
    assert!(!index.alive(&old));
}

#[test]
fn a_finished_pod_is_not_alive() {
    let mut index = PodIndex::default();
    let mut touched = Touched::default();
    index.update(
        key("a"),
        Some(pod("a", "u1", Some("n1"), None, "Succeeded")),
        "gangway",
        &mut touched,
    );
    let r = PodRef {
        namespace: "ns".into(),
        name: "a".into(),
        uid: "u1".into(),
    };
    assert!(!index.alive(&r));
    assert!(index.same(&r).is_some());
}

#[test]
fn a_claim_change_touches_the_nodes_of_the_pods_naming_it() {
    let mut index = PodIndex::default();
    let mut touched = Touched::default();
    let with_claim = |name: &str, uid: &str, node: &str, claim: &str| {
        Arc::new(json!({
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "spec": {"schedulerName": "other", "nodeName": node,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": "Running"},
        }))
    };
    index.update(
        key("a"),
        Some(with_claim("a", "u1", "n1", "c1")),
        "gangway",
        &mut touched,
    );
    index.update(
        key("b"),
        Some(with_claim("b", "u2", "n2", "c2")),
        "gangway",
        &mut touched,
    );
    let c1 = ("ns".to_string(), "c1".to_string());
    assert_eq!(
        index.nodes_using_claims([&c1]),
        BTreeSet::from(["n1".to_string()])
    );
    index.update(key("a"), None, "gangway", &mut touched);
    assert!(index.nodes_using_claims([&c1]).is_empty());
    index.assert_consistent();
}

/// One step of the property test: set pod `name` to a state, or delete it.
#[derive(Debug, Clone)]
enum Step {
    Set {
        name: u8,
        uid: u8,
        node: Option<u8>,
        group: Option<u8>,
        finished: bool,
    },
    Delete {
        name: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0u8..6,
            0u8..3,
            proptest::option::of(0u8..3),
            proptest::option::of(0u8..2),
            any::<bool>()
        )
            .prop_map(|(name, uid, node, group, finished)| Step::Set {
                name,
                uid,
                node,
                group,
                finished
            }),
        (0u8..6).prop_map(|name| Step::Delete { name }),
    ]
}

proptest! {
    /// After any sequence of updates the index equals one rebuilt from the final
    /// objects, its secondary sets agree with its facts, and every step's Touched
    /// names the nodes and PodGroups the pod left and entered.
    #[test]
    fn updates_agree_with_a_rebuild(steps in proptest::collection::vec(step(), 1..60)) {
        let mut index = PodIndex::default();
        let mut objects: std::collections::BTreeMap<Key, Arc<Value>> = Default::default();
        for s in steps {
            let mut touched = Touched::default();
            match s {
                Step::Set { name, uid, node, group, finished } => {
                    let n = format!("p{name}");
                    let node = node.map(|x| format!("n{x}"));
                    let group = group.map(|x| format!("g{x}"));
                    let before = index.get(&key(&n)).cloned();
                    let object = pod(&n, &format!("u{name}-{uid}"), node.as_deref(), group.as_deref(),
                        if finished { "Failed" } else { "Running" });
                    objects.insert(key(&n), object.clone());
                    index.update(key(&n), Some(object), "gangway", &mut touched);
                    for f in before.iter().chain(index.get(&key(&n))) {
                        if let Some(node) = &f.node { prop_assert!(touched.nodes.contains(node)); }
                        if let Some(g) = &f.pod_group { prop_assert!(touched.pod_groups.contains(&("ns".to_string(), g.clone()))); }
                    }
                }
                Step::Delete { name } => {
                    let n = format!("p{name}");
                    let before = index.get(&key(&n)).cloned();
                    objects.remove(&key(&n));
                    index.update(key(&n), None, "gangway", &mut touched);
                    if let Some(before) = before {
                        prop_assert_eq!(touched.deleted.clone(), vec![before.pod.clone()]);
                    }
                }
            }
            index.assert_consistent();
        }
        let mut rebuilt = PodIndex::default();
        rebuilt.rebuild(objects.iter(), "gangway");
        prop_assert_eq!(rebuilt.len(), index.len());
        for (k, f) in &rebuilt.pods {
            let mine = index.get(k);
            prop_assert!(mine.is_some());
            let mine = mine.map(|m| (&m.pod, &m.node, m.finished, &m.pod_group));
            prop_assert_eq!(mine, Some((&f.pod, &f.node, f.finished, &f.pod_group)));
        }
    }
}
