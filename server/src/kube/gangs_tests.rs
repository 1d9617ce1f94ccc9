//! Unit tests of `gangs.rs`.

use super::*;
use crate::kube::objects::pod_ref;
use serde_json::json;

fn pod(name: &str, annotations: Value, labels: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                            "annotations": annotations, "labels": labels},
               "spec": {"containers": []}})
}

/// scheduler-plugins' PodGroups `index` and no Kubernetes ones.
fn plugins(index: PodGroupIndex) -> PodGroups {
    PodGroups {
        plugins: index,
        ..PodGroups::default()
    }
}

fn ready(p: &Value, groups: &PodGroups) -> ReadyPod {
    ReadyPod {
        pod: pod_ref(p).expect("ref"),
        spec: PodSpec::default(),
        identity: identify(p, groups).expect("identity"),
        arrival: Arrival::default(),
        run_limit_ms: p["spec"]["activeDeadlineSeconds"]
            .as_u64()
            .map(|s| s * 1_000),
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
    let groups = PodGroups::default();
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
    let Identity::Gang(params) = identify(&p, &PodGroups::default()).expect("gang") else {
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
    let err = identify(&p, &PodGroups::default()).expect_err("bad");
    assert!(err.to_string().contains("min-available"), "{err}");
    let p = pod(
        "a",
        json!({"gang.scheduling.koordinator.sh/name": "g", "gang.scheduling.koordinator.sh/min-available": "1",
                                "gang.scheduling.koordinator.sh/groups": "[not json"}),
        json!({}),
    );
    assert!(identify(&p, &PodGroups::default())
        .expect_err("bad")
        .to_string()
        .contains("groups"));
}

#[test]
fn pod_group_label_waits_for_its_pod_group() {
    let p = pod("a", json!({}), json!({LABEL_POD_GROUP: "pg"}));
    assert!(matches!(
        identify(&p, &PodGroups::default()),
        Err(PodProblem::Waiting(_))
    ));
    let groups = plugins(PodGroupIndex::from([(
        ("ns".into(), "pg".into()),
        std::sync::Arc::new(json!({"spec": {"minMember": 3, "scheduleTimeoutSeconds": 60}})),
    )]));
    let Ok(Identity::Gang(params)) = identify(&p, &groups) else {
        panic!("gang")
    };
    assert_eq!((params.min_member, params.wait_time_ms), (3, 60_000));
}

#[test]
fn gangs_wait_for_min_member_then_submit_once_with_a_stable_key() {
    let groups = plugins(PodGroupIndex::from([(
        ("ns".into(), "pg".into()),
        std::sync::Arc::new(json!({"spec": {"minMember": 2}})),
    )]));
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

#[test]
fn a_group_runs_as_long_as_its_longest_pod_deadline_only_when_every_pod_has_one() {
    let groups = plugins(PodGroupIndex::from([(
        ("ns".into(), "pg".into()),
        std::sync::Arc::new(json!({"spec": {"minMember": 2}})),
    )]));
    let member = |name: &str, deadline_s: Option<u64>| {
        let mut p = pod(name, json!({}), json!({LABEL_POD_GROUP: "pg"}));
        if let Some(s) = deadline_s {
            p["spec"]["activeDeadlineSeconds"] = json!(s);
        }
        ready(&p, &groups)
    };
    let both = submissions(
        &[member("a", Some(60)), member("b", Some(90))],
        &BTreeSet::new(),
    );
    assert_eq!(both[0].group.run_limit_ms, Some(90_000));
    let one = submissions(
        &[member("a", Some(60)), member("b", None)],
        &BTreeSet::new(),
    );
    assert_eq!(one[0].group.run_limit_ms, None, "a pod without one runs on");
    let mut single = pod("alone", json!({}), json!({}));
    single["spec"]["activeDeadlineSeconds"] = json!(30);
    let alone = submissions(&[ready(&single, &PodGroups::default())], &BTreeSet::new());
    assert_eq!(alone[0].group.run_limit_ms, Some(30_000));
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
    let none = PodGroups::default();
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
    let x = ready(&pod("x0", ann("x"), json!({})), &PodGroups::default());
    let y = ready(&pod("y0", ann("y"), json!({})), &PodGroups::default());
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

fn kubernetes_pod(name: &str, group: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
           "spec": {"containers": [], "schedulingGroup": {"podGroupName": group}}})
}

/// Kubernetes' PodGroup `pg` in `ns` with `spec`.
fn kubernetes(spec: Value) -> PodGroups {
    PodGroups {
        kubernetes: PodGroupIndex::from([(
            ("ns".into(), "pg".into()),
            std::sync::Arc::new(json!({ "spec": spec })),
        )]),
        ..PodGroups::default()
    }
}

#[test]
fn a_kubernetes_pod_group_is_a_strict_gang_that_waits_as_long_as_it_takes() {
    let p = kubernetes_pod("a", "pg");
    let groups = kubernetes(json!({"schedulingPolicy": {"gang": {"minCount": 4}}, "priority": 7}));
    let Ok(Identity::Gang(params)) = identify(&p, &groups) else {
        panic!("gang")
    };
    assert_eq!(params.id, GangId::new("ns", "pg"));
    assert_eq!(params.min_member, 4);
    assert_eq!(params.mode, GangMode::Strict);
    assert_eq!(
        params.wait_time_ms, 0,
        "no deadline: upstream retries a gang until it fits"
    );
    assert_eq!(params.match_policy, MatchPolicy::WaitingAndRunning);
    assert_eq!(params.priority, Some(7));
    assert!(params.topology.is_none());
    let racked = kubernetes(json!({"schedulingPolicy": {"gang": {"minCount": 4}},
        "schedulingConstraints": {"topology": [{"key": "example.com/rack"}]}}));
    let Ok(Identity::Gang(params)) = identify(&p, &racked) else {
        panic!("gang")
    };
    assert_eq!(
        params.topology.required.as_deref(),
        Some("example.com/rack")
    );
    let basic = kubernetes(json!({"schedulingPolicy": {"basic": {}}}));
    assert_eq!(identify(&p, &basic), Ok(Identity::Single));
}

#[test]
fn a_pod_naming_a_missing_kubernetes_pod_group_waits_and_says_so_whatever_else_exists() {
    let p = kubernetes_pod("a", "pg");
    // A scheduler-plugins PodGroup of the same name is another object.
    let other = plugins(PodGroupIndex::from([(
        ("ns".into(), "pg".into()),
        std::sync::Arc::new(json!({"spec": {"minMember": 1}})),
    )]));
    for groups in [PodGroups::default(), other] {
        let Err(PodProblem::Missing(why)) = identify(&p, &groups) else {
            panic!("missing expected")
        };
        assert!(
            why.contains("ns/pg") && why.contains("spec.schedulingGroup.podGroupName"),
            "{why}"
        );
    }
}

#[test]
fn bad_kubernetes_pod_groups_are_refused_naming_the_field() {
    let p = kubernetes_pod("a", "pg");
    for (spec, field) in [
        (
            json!({"schedulingPolicy": {"gang": {"minCount": 0}}}),
            "spec.schedulingPolicy.gang.minCount",
        ),
        (json!({"schedulingPolicy": {}}), "spec.schedulingPolicy"),
        (
            json!({"schedulingPolicy": {"gang": {"minCount": 2}},
                   "schedulingConstraints": {"topology": [{"key": "example.com/rack"}, {"key": "example.com/block"}]}}),
            "spec.schedulingConstraints.topology lists 2 keys (example.com/rack, example.com/block)",
        ),
        (
            json!({"schedulingPolicy": {"basic": {}},
                   "schedulingConstraints": {"topology": [{"key": "example.com/rack"}]}}),
            "spec.schedulingConstraints.topology needs schedulingPolicy.gang",
        ),
        (
            json!({"schedulingPolicy": {"gang": {"minCount": 2}}, "priority": 1u64 << 40}),
            "spec.priority",
        ),
    ] {
        let Err(PodProblem::Invalid(why)) = identify(&p, &kubernetes(spec)) else {
            panic!("invalid expected for {field}")
        };
        assert!(
            why.contains(field) && why.contains("PodGroup ns/pg"),
            "{why}"
        );
    }
}

#[test]
fn a_kubernetes_gang_counts_its_running_pods_toward_min_count() {
    let groups = kubernetes(json!({"schedulingPolicy": {"gang": {"minCount": 4}}}));
    let mut three: Vec<ReadyPod> = (0..3)
        .map(|i| ready(&kubernetes_pod(&format!("p{i}"), "pg"), &groups))
        .collect();
    let none = BTreeMap::new();
    assert!(apply_match_policies(&mut three, &none).is_empty());
    assert!(
        submissions(&three, &BTreeSet::new()).is_empty(),
        "3 of 4: nothing submitted"
    );
    // A Job re-creates one failed pod of a gang whose three others still run.
    let mut replacement = vec![ready(&kubernetes_pod("p3b", "pg"), &groups)];
    let running = BTreeMap::from([(
        GangId::new("ns", "pg"),
        BoundPods {
            running: 3,
            ever: 4,
        },
    )]);
    assert!(apply_match_policies(&mut replacement, &running).is_empty());
    let out = submissions(&replacement, &BTreeSet::new());
    assert_eq!(out.len(), 1);
    let topping = &out[0].group.gangs[0];
    assert_eq!(topping.min_member, 1);
    // The gang's first group still declares "pg" while its pods run.
    assert_eq!(
        GangId::new(topping.namespace.clone(), topping.name.clone()),
        topped_up(&GangId::new("ns", "pg"), &out[0].key)
    );
    assert!(topping.name.starts_with("pg.") && topping.name.len() == "pg.".len() + 8);
    let labels: Vec<String> = (0..5)
        .map(|_| format!("{}-", "a".repeat(59)) + "b")
        .collect();
    let long = GangId::new("ns", labels.join("."));
    let name = topped_up(&long, "kube:0123456789abcdef").name;
    assert_eq!(name.len(), 253, "{name}");
    assert!(
        name.ends_with(".01234567") && !name.contains("-."),
        "{name}"
    );
    let validated = Gang {
        name: name.clone(),
        namespace: "ns".into(),
        min_member: 1,
        total_number: 1,
        mode: GangMode::Strict,
        wait_time_ms: 0,
        priority: 0,
        creation_order: 0,
        members: vec![Member {
            name: "m".into(),
            spec: PodSpec::default(),
            uid: None,
            binding: Default::default(),
            pod_selector: Default::default(),
        }],
        topology: Default::default(),
    };
    assert!(
        validated
            .validate(&gangway_core::model::FieldPath::root())
            .is_ok(),
        "{name} is a valid gang name"
    );
}

#[test]
fn the_scheduled_condition_follows_bindings_and_the_last_reason() {
    let bound = json!({"spec": {"nodeName": "n1"}});
    let pending = json!({"spec": {}});
    assert_eq!(pod_group_scheduled(2, &[&bound, &pending], None), None);
    assert_eq!(
        pod_group_scheduled(2, &[&bound, &pending], Some("no room")),
        Some(GroupScheduled::Unschedulable("no room".into()))
    );
    assert_eq!(
        pod_group_scheduled(2, &[&bound, &bound], Some("no room")),
        Some(GroupScheduled::Scheduled)
    );
}

#[test]
fn the_scheduled_condition_keeps_other_conditions_and_its_transition_time() {
    let group = json!({"status": {"conditions": [
        {"type": "DisruptionTarget", "status": "False"},
        {"type": CONDITION_POD_GROUP_SCHEDULED, "status": "False", "reason": "Unschedulable",
         "message": "old", "lastTransitionTime": "T0"},
    ]}});
    let same = GroupScheduled::Unschedulable("old".into());
    assert_eq!(with_scheduled_condition(&group, &same, "T1"), None);
    let reworded = GroupScheduled::Unschedulable("new".into());
    let conditions = with_scheduled_condition(&group, &reworded, "T1").expect("changed");
    assert_eq!(conditions[0]["type"], "DisruptionTarget");
    assert_eq!(conditions[1]["message"], "new");
    assert_eq!(
        conditions[1]["lastTransitionTime"], "T0",
        "status did not change"
    );
    let conditions =
        with_scheduled_condition(&group, &GroupScheduled::Scheduled, "T1").expect("changed");
    assert_eq!(
        (
            &conditions[1]["status"],
            &conditions[1]["reason"],
            &conditions[1]["lastTransitionTime"]
        ),
        (&json!("True"), &json!("Scheduled"), &json!("T1"))
    );
    let fresh =
        with_scheduled_condition(&json!({}), &GroupScheduled::Scheduled, "T2").expect("new");
    assert_eq!(fresh.as_array().map(Vec::len), Some(1));
}

fn volcano_pod(name: &str, task: Option<&str>) -> Value {
    let mut annotations = json!({ANNOTATION_VOLCANO_GROUP: "job"});
    if let Some(task) = task {
        annotations[ANNOTATION_VOLCANO_TASK] = json!(task);
    }
    pod(name, annotations, json!({}))
}

/// Volcano's PodGroup `job` in `ns` with `spec`.
fn volcano(spec: Value) -> PodGroups {
    PodGroups {
        volcano: PodGroupIndex::from([(
            ("ns".into(), "job".into()),
            std::sync::Arc::new(json!({"metadata": {"name": "job"}, "spec": spec})),
        )]),
        ..PodGroups::default()
    }
}

#[test]
fn a_volcano_pod_group_is_a_gang_of_min_member_or_one_gang_per_task() {
    let whole = volcano(json!({"minMember": 3, "queue": "research"}));
    let Ok(Identity::Gang(params)) = identify(&volcano_pod("a", None), &whole) else {
        panic!("gang")
    };
    assert_eq!((params.id.name.as_str(), params.min_member), ("job", 3));
    assert_eq!(params.match_policy, MatchPolicy::WaitingAndRunning);
    assert_eq!(params.wait_time_ms, 0);
    let tasks = volcano(json!({"minMember": 3, "minTaskMember": {"ps": 1, "worker": 2}}));
    let Ok(Identity::Gang(ps)) = identify(&volcano_pod("p", Some("ps")), &tasks) else {
        panic!("gang")
    };
    assert_eq!((ps.id.name.as_str(), ps.min_member), ("job.ps", 1));
    assert_eq!(ps.group, BTreeSet::from([GangId::new("ns", "job.worker")]));
    // Both tasks' gangs go in one group once each has its minimum.
    let ready_pods: Vec<ReadyPod> = [("p", "ps"), ("w0", "worker"), ("w1", "worker")]
        .iter()
        .map(|(n, t)| ready(&volcano_pod(n, Some(t)), &tasks))
        .collect();
    assert!(submissions(&ready_pods[..2], &BTreeSet::new()).is_empty());
    let out = submissions(&ready_pods, &BTreeSet::new());
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].group.gangs.len(), 2);
    assert!(matches!(
        identify(&volcano_pod("a", None), &PodGroups::default()),
        Err(PodProblem::Waiting(_))
    ));
}

#[test]
fn volcano_task_minimums_gangway_cannot_honour_are_refused_by_name() {
    let tasks = volcano(json!({"minMember": 3, "minTaskMember": {"ps": 1, "worker": 2}}));
    for (pod, field) in [
        (volcano_pod("a", None), "annotation volcano.sh/task-spec"),
        (volcano_pod("a", Some("chief")), "task \"chief\""),
    ] {
        let Err(PodProblem::Invalid(why)) = identify(&pod, &tasks) else {
            panic!("invalid expected")
        };
        assert!(
            why.contains(field) && why.contains("PodGroup ns/job"),
            "{why}"
        );
    }
    let short = volcano(json!({"minMember": 4, "minTaskMember": {"ps": 1, "worker": 2}}));
    let Err(PodProblem::Invalid(why)) = identify(&volcano_pod("a", Some("ps")), &short) else {
        panic!("invalid expected")
    };
    assert!(
        why.contains("spec.minMember 4") && why.contains("(3)"),
        "{why}"
    );
}

#[test]
fn volcano_status_follows_bindings_and_keeps_its_transition_time() {
    let bound = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
    let pending = json!({"spec": {}, "status": {"phase": "Pending"}});
    let waiting = volcano_status(2, &[&pending, &pending], Some("no room"), &json!({}), "T1");
    assert_eq!(waiting["phase"], "Pending");
    assert_eq!(waiting["conditions"][0]["type"], "Unschedulable");
    assert_eq!(waiting["conditions"][0]["reason"], "NotEnoughResources");
    let again = volcano_status(
        2,
        &[&bound, &pending],
        Some("still no room"),
        &waiting,
        "T2",
    );
    assert_eq!(again["phase"], "Unknown");
    assert_eq!(again["conditions"][0]["lastTransitionTime"], "T1");
    let running = volcano_status(2, &[&bound, &bound], None, &again, "T3");
    assert_eq!(
        (
            &running["phase"],
            &running["running"],
            &running["conditions"][0]["type"]
        ),
        (&json!("Running"), &json!(2), &json!("Scheduled"))
    );
    assert_eq!(running["conditions"][0]["lastTransitionTime"], "T3");
}
