//! Unit tests of `gangs.rs`.

use super::*;
use crate::kube::objects::pod_ref;
use serde_json::json;

fn pod(name: &str, annotations: Value, labels: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                            "annotations": annotations, "labels": labels},
               "spec": {"containers": []}})
}

fn ready(p: &Value, groups: &PodGroupIndex) -> ReadyPod {
    ReadyPod {
        pod: pod_ref(p).expect("ref"),
        spec: PodSpec::default(),
        identity: identify(p, groups).expect("identity"),
        arrival: Arrival::default(),
    }
}

#[test]
fn match_policies_count_bound_pods_their_own_way() {
    let annotated = |name: &str, policy: &str| {
        pod(
            name,
            json!({"gang.scheduling.koordinator.sh/name": policy, "gang.scheduling.koordinator.sh/min-available": "3",
                       "gang.scheduling.koordinator.sh/total-number": "4",
                       "gang.scheduling.koordinator.sh/match-policy": policy}),
            json!({}),
        )
    };
    let groups = PodGroupIndex::new();
    let mut pending: Vec<ReadyPod> = ["once-satisfied", "only-waiting", "waiting-and-running"]
        .iter()
        .map(|policy| ready(&annotated(&format!("p-{policy}"), policy), &groups))
        .collect();
    // Each gang had 3 pods bound, one of which finished.
    let bound: BTreeMap<GangId, BoundPods> =
        ["once-satisfied", "only-waiting", "waiting-and-running"]
            .iter()
            .map(|g| {
                (
                    GangId::new("ns", *g),
                    BoundPods {
                        running: 2,
                        ever: 3,
                    },
                )
            })
            .collect();
    let satisfied = apply_match_policies(&mut pending, &bound);
    assert_eq!(
        satisfied,
        BTreeSet::from([GangId::new("ns", "once-satisfied")])
    );
    let params = |i: usize| match &pending[i].identity {
        Identity::Gang(p) => (p.min_member, p.total_number),
        Identity::Single => panic!("gang expected"),
    };
    assert_eq!(params(1), (3, Some(4)), "only-waiting counts no bound pod");
    assert_eq!(
        params(2),
        (1, Some(2)),
        "waiting-and-running counts the 2 running"
    );
    let bad = annotated("bad", "sometimes");
    assert!(
        matches!(identify(&bad, &groups), Err(PodProblem::Invalid(m)) if m.contains("match-policy"))
    );
}

#[test]
fn koordinator_annotations_make_a_gang() {
    let p = pod(
        "a",
        json!({"gang.scheduling.koordinator.sh/name": "g", "gang.scheduling.koordinator.sh/min-available": "2",
                                "gang.scheduling.koordinator.sh/mode": "NonStrict", "gang.scheduling.koordinator.sh/waiting-time": "1m30s"}),
        json!({}),
    );
    let Identity::Gang(params) = identify(&p, &PodGroupIndex::new()).expect("gang") else {
        panic!("gang expected")
    };
    assert_eq!(
        (params.min_member, params.mode, params.wait_time_ms),
        (2, GangMode::NonStrict, 90_000)
    );
}

#[test]
fn bad_annotations_name_the_annotation() {
    let p = pod(
        "a",
        json!({"gang.scheduling.koordinator.sh/name": "g", "gang.scheduling.koordinator.sh/min-available": "two"}),
        json!({}),
    );
    let err = identify(&p, &PodGroupIndex::new()).expect_err("bad");
    assert!(err.to_string().contains("min-available"), "{err}");
    let p = pod(
        "a",
        json!({"gang.scheduling.koordinator.sh/name": "g", "gang.scheduling.koordinator.sh/min-available": "1",
                                "gang.scheduling.koordinator.sh/groups": "[not json"}),
        json!({}),
    );
    assert!(identify(&p, &PodGroupIndex::new())
        .expect_err("bad")
        .to_string()
        .contains("groups"));
}

#[test]
fn pod_group_label_waits_for_its_pod_group() {
    let p = pod("a", json!({}), json!({LABEL_POD_GROUP: "pg"}));
    assert!(matches!(
        identify(&p, &PodGroupIndex::new()),
        Err(PodProblem::Waiting(_))
    ));
    let groups = PodGroupIndex::from([(
        ("ns".into(), "pg".into()),
        std::sync::Arc::new(json!({"spec": {"minMember": 3, "scheduleTimeoutSeconds": 60}})),
    )]);
    let Ok(Identity::Gang(params)) = identify(&p, &groups) else {
        panic!("gang")
    };
    assert_eq!((params.min_member, params.wait_time_ms), (3, 60_000));
}

#[test]
fn gangs_wait_for_min_member_then_submit_once_with_a_stable_key() {
    let groups = PodGroupIndex::from([(
        ("ns".into(), "pg".into()),
        std::sync::Arc::new(json!({"spec": {"minMember": 2}})),
    )]);
    let a = ready(
        &pod("a", json!({}), json!({LABEL_POD_GROUP: "pg"})),
        &groups,
    );
    let b = ready(
        &pod("b", json!({}), json!({LABEL_POD_GROUP: "pg"})),
        &groups,
    );
    assert!(submissions(std::slice::from_ref(&a), &BTreeSet::new()).is_empty());
    let first = submissions(&[a.clone(), b.clone()], &BTreeSet::new());
    let again = submissions(&[b, a], &BTreeSet::new());
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].key, again[0].key);
    assert_eq!(first[0].group.gangs[0].members.len(), 2);
}

/// A gang whose first pod came before a lone pod is submitted (and so queued)
/// before it, as kube-scheduler would take the pods; not singles first.
#[test]
fn groups_are_submitted_in_the_order_their_first_pod_arrived() {
    let ann = json!({"gang.scheduling.koordinator.sh/name": "g",
                         "gang.scheduling.koordinator.sh/min-available": "2"});
    let at = |p: ReadyPod, created: &str, seen: u64| ReadyPod {
        arrival: Arrival {
            created: created.into(),
            seen,
        },
        ..p
    };
    let none = PodGroupIndex::new();
    let g0 = at(
        ready(&pod("g0", ann.clone(), json!({})), &none),
        "2026-01-01T00:00:01Z",
        1,
    );
    let g1 = at(
        ready(&pod("g1", ann, json!({})), &none),
        "2026-01-01T00:00:01Z",
        3,
    );
    let lone = at(
        ready(&pod("lone", json!({}), json!({})), &none),
        "2026-01-01T00:00:01Z",
        2,
    );
    let early = at(
        ready(&pod("early", json!({}), json!({})), &none),
        "2026-01-01T00:00:00Z",
        9,
    );
    let order: Vec<String> = submissions(&[lone, g0, g1, early], &BTreeSet::new())
        .iter()
        .map(|s| {
            s.pods
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    assert_eq!(order, ["early", "g0+g1", "lone"]);
}

#[test]
fn gang_groups_wait_for_every_gang() {
    let ann = |name: &str| {
        json!({"gang.scheduling.koordinator.sh/name": name, "gang.scheduling.koordinator.sh/min-available": "1",
                                      "gang.scheduling.koordinator.sh/groups": "[\"ns/x\", \"ns/y\"]"})
    };
    let x = ready(&pod("x0", ann("x"), json!({})), &PodGroupIndex::new());
    let y = ready(&pod("y0", ann("y"), json!({})), &PodGroupIndex::new());
    assert!(submissions(std::slice::from_ref(&x), &BTreeSet::new()).is_empty());
    let both = submissions(&[x, y], &BTreeSet::new());
    assert_eq!(both.len(), 1);
    assert_eq!(both[0].group.gangs.len(), 2);
}

#[test]
fn pod_group_status_counts_and_phases() {
    let bound = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}});
    let running = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running"}});
    let waiting = json!({"spec": {}, "status": {"phase": "Pending"}});
    assert_eq!(pod_group_status(2, &[&bound, &waiting])["phase"], "Pending");
    assert_eq!(
        pod_group_status(2, &[&bound, &running])["phase"],
        "Scheduled"
    );
    let status = pod_group_status(2, &[&running, &running]);
    assert_eq!(
        (status["phase"].as_str(), status["running"].as_u64()),
        (Some("Running"), Some(2))
    );
}

#[test]
fn durations_follow_go() {
    assert_eq!(parse_duration_ms("1h30m"), Some(5_400_000));
    assert_eq!(parse_duration_ms("1500ms"), Some(1_500));
    assert_eq!(parse_duration_ms("10"), None);
    assert_eq!(parse_duration_ms("5d"), None);
}
