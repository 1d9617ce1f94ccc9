use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::frontdoor::scheduler::validate_submission;
use gangway_core::ledger::meta::{MetaCommand, MetaQuery, MetaReply, MetaState};
use gangway_proto::v1::{GangSpec, KubernetesPods, MemberSpec, SubmitGangGroupRequest};

const NS: &str = "train";

/// A group `job` of one gang whose `n` members of 1 cpu name pods `w-0` … (or the
/// names given).
fn request(n: u32, names: &[&str]) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        name: "job".into(),
        gangs: vec![GangSpec {
            name: "workers".into(),
            namespace: NS.into(),
            min_member: n.max(names.len() as u32),
            members: vec![MemberSpec {
                name: "w".into(),
                count: n,
                pod_json: r#"{"requests": {"cpu": "1"}}"#.into(),
                pods: Some(KubernetesPods {
                    names: names.iter().map(|s| s.to_string()).collect(),
                    selector: Default::default(),
                }),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The record meta keeps of `req` once submitted.
fn record(req: &SubmitGangGroupRequest) -> GroupRecord {
    let group = validate_submission(req).expect("a valid submission");
    let mut meta = MetaState::new(1);
    meta.apply(&MetaCommand::Submit {
        key: "k".into(),
        group,
        at_ms: 1,
        live_max: None,
    });
    match meta.query(&MetaQuery::Groups { active_only: true }) {
        MetaReply::Groups { mut records } => records.remove(0),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// A pod of ours named `name` for group `job`, asking `cpu`.
fn pod(name: &str, cpu: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "annotations": {ANNOTATION_GROUP: "job"}},
        "spec": {"schedulerName": "gangway",
                 "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}
    })
}

fn look(group: &GroupRecord, pods: &[Value]) -> NamedPods {
    let by_name: BTreeMap<String, Arc<Value>> = pods
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                Arc::new(p.clone()),
            )
        })
        .collect();
    let pod = |ns: &str, name: &str| by_name.get(name).filter(|_| ns == NS).cloned();
    let pods_in = |ns: &str| {
        by_name
            .values()
            .filter(|p| p["metadata"]["namespace"] == ns)
            .cloned()
            .collect()
    };
    let view = PodView {
        scheduler: "gangway",
        pod: &pod,
        pods_in: &pods_in,
        taken: &|full: &str| full == "train/taken",
    };
    check(group, &view, |_| Some("node-1".to_string()))
}

#[test]
fn a_group_binds_only_once_every_named_pod_exists_and_matches() {
    let g = record(&request(3, &[]));
    let all: Vec<Value> = (0..3).map(|i| pod(&format!("w-{i}"), "1")).collect();
    match look(&g, &all) {
        NamedPods::Ready(uids) => {
            assert_eq!(uids.len(), 3);
            assert!(uids
                .values()
                .all(|(name, uid)| *uid == format!("uid-{name}")));
        }
        other => panic!("three matching pods are ready: {other:?}"),
    }
    match look(&g, &all[..2]) {
        NamedPods::Waiting(why) => assert!(
            why.contains("1 of its 3 named pods") && why.contains("train/w-2"),
            "{why}"
        ),
        other => panic!("a missing pod makes the group wait: {other:?}"),
    }
    let mut going = all.clone();
    going[0]["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:00Z");
    assert!(
        matches!(look(&g, &going), NamedPods::Waiting(_)),
        "a pod being deleted is not there"
    );
}

#[test]
fn explicit_names_name_the_members() {
    let g = record(&request(0, &["alpha", "beta"]));
    let names: Vec<&str> = g.group.gangs[0]
        .members
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert!(
        matches!(look(&g, &[pod("alpha", "1"), pod("beta", "1")]), NamedPods::Ready(u) if u.len() == 2)
    );
}

#[test]
fn a_pod_that_cannot_be_its_member_is_refused_with_the_field_at_fault() {
    let g = record(&request(2, &[]));
    let refused = |p: Value| match look(&g, &[pod("w-0", "1"), p]) {
        NamedPods::Refused { why, pod } => {
            assert_eq!(pod, (NS.to_string(), "w-1".to_string()));
            why
        }
        other => panic!("refused: {other:?}"),
    };
    let why = refused(pod("w-1", "2"));
    assert!(
        why.contains("pod train/w-1 requests cpu=2, but its member asks cpu=1"),
        "{why}"
    );
    let mut other_scheduler = pod("w-1", "1");
    other_scheduler["spec"]["schedulerName"] = json!("default-scheduler");
    assert!(refused(other_scheduler).contains("spec.schedulerName"));
    let mut unannotated = pod("w-1", "1");
    unannotated["metadata"]["annotations"] = json!({});
    assert!(refused(unannotated).contains("lacks the annotation gangway.io/group"));
    let mut foreign = pod("w-1", "1");
    foreign["metadata"]["annotations"][ANNOTATION_GROUP] = json!("other");
    assert!(refused(foreign).contains("\"other\""));
    let mut elsewhere = pod("w-1", "1");
    elsewhere["spec"]["nodeName"] = json!("node-9");
    assert!(refused(elsewhere).contains("bound to node node-9"));
    let mut claims = pod("w-1", "1");
    claims["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": "c"}]);
    assert!(refused(claims).contains("ResourceClaims"));
}

#[test]
fn a_pod_already_bound_to_its_members_node_is_ready() {
    let g = record(&request(1, &[]));
    let mut bound = pod("w", "1");
    bound["spec"]["nodeName"] = json!("node-1");
    assert!(matches!(look(&g, &[bound]), NamedPods::Ready(_)));
}

#[test]
fn submissions_that_name_pods_wrongly_are_refused_naming_the_field() {
    let mut bad = request(3, &["a", "b"]);
    let e = validate_submission(&bad).expect_err("count and names disagree");
    assert!(
        e.message().contains("gangs[0].members[0].count"),
        "{}",
        e.message()
    );
    bad = request(0, &["Not_A_Name"]);
    let e = validate_submission(&bad).expect_err("a pod name must be a DNS subdomain");
    assert!(e.message().contains("name"), "{}", e.message());
    let mut twice = request(0, &["a"]);
    let mut second = twice.gangs[0].clone();
    second.name = "other".into();
    twice.gangs.push(second);
    let e = validate_submission(&twice).expect_err("two members naming one pod");
    assert!(
        e.message().contains("pod train/a is named by two members"),
        "{}",
        e.message()
    );
}

#[test]
fn a_selector_copied_to_every_member_counts_toward_the_groups_size() {
    let mut big = selecting();
    big.gangs[0].members[0].count = 5_000;
    big.gangs[0].min_member = 5_000;
    if let Some(pods) = big.gangs[0].members[0].pods.as_mut() {
        for i in 0..200 {
            pods.selector.insert(format!("key-{i}"), "v".repeat(60));
        }
    }
    let e = validate_submission(&big).expect_err("too large once copied");
    assert!(
        e.message().contains("gangs[0].members[0].count"),
        "{}",
        e.message()
    );
}

#[test]
fn a_pod_named_by_a_live_group_cannot_be_named_by_another() {
    let first = validate_submission(&request(1, &["solo"])).expect("valid");
    let mut meta = MetaState::new(1);
    let submit = |meta: &mut MetaState, key: &str, group| {
        meta.apply(&MetaCommand::Submit {
            key: key.into(),
            group,
            at_ms: 1,
            live_max: None,
        })
    };
    assert!(matches!(
        submit(&mut meta, "a", first.clone()),
        MetaReply::Submitted { created: true, .. }
    ));
    let mut again = request(1, &["solo"]);
    again.gangs[0].name = "another-gang".into();
    let second = validate_submission(&again).expect("valid");
    match submit(&mut meta, "b", second.clone()) {
        MetaReply::Rejected { reason, .. } => assert!(
            reason.contains("pod train/solo is already named by gang group 1"),
            "{reason}"
        ),
        other => panic!("a second group naming the pod is refused: {other:?}"),
    }
    match meta.query(&MetaQuery::NamedPod {
        pod: "train/solo".into(),
    }) {
        MetaReply::Groups { records } => {
            assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [1])
        }
        other => panic!("{other:?}"),
    }
    meta.apply(&MetaCommand::Cancel { seq: 1, at_ms: 2 });
    assert!(
        matches!(
            submit(&mut meta, "b", second),
            MetaReply::Submitted { created: true, .. }
        ),
        "the claim lapses when the first group ends"
    );
}

/// A group `job` whose 2 members of 1 cpu select pods labelled `role=worker`.
fn selecting() -> SubmitGangGroupRequest {
    let mut req = request(2, &[]);
    let pods = req.gangs[0].members[0]
        .pods
        .get_or_insert_with(Default::default);
    pods.selector.insert("role".into(), "worker".into());
    req
}

fn labelled(name: &str, cpu: &str) -> Value {
    let mut p = pod(name, cpu);
    p["metadata"]["labels"] = json!({"role": "worker"});
    p
}

#[test]
fn members_selecting_pods_get_them_chosen_in_name_order_then_bind_them() {
    let g = record(&selecting());
    // One fitting pod of two: it waits, saying for what.
    match look(&g, &[labelled("b", "1"), pod("unlabelled", "1")]) {
        NamedPods::Waiting(why) => assert!(
            why.contains("1 more pods in train with labels role=worker"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // Pods that do not fit (another request, taken by another group, already bound) are
    // passed over; the rest are proposed in name order.
    let mut bound = labelled("a0", "1");
    bound["spec"]["nodeName"] = json!("node-1");
    let pods = [
        labelled("c", "1"),
        labelled("b", "1"),
        labelled("a", "2"),
        labelled("taken", "1"),
        bound,
    ];
    let choices = match look(&g, &pods) {
        NamedPods::Choose(choices) => choices,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        choices,
        [
            ("train/workers/w-0".to_string(), "b".to_string()),
            ("train/workers/w-1".to_string(), "c".to_string())
        ]
    );
    // Recorded, they are the members' pods as named ones are.
    let mut meta = MetaState::new(1);
    meta.apply(&MetaCommand::Submit {
        key: "k".into(),
        group: g.group.clone(),
        at_ms: 1,
        live_max: None,
    });
    let seq = g.seq;
    assert!(matches!(
        meta.apply(&MetaCommand::ChoosePods {
            seq,
            choices: choices.clone()
        }),
        MetaReply::Group { .. }
    ));
    match meta.apply(&MetaCommand::ChoosePods { seq, choices }) {
        MetaReply::Rejected { reason, .. } => {
            assert!(reason.contains("already stands for a pod"), "{reason}")
        }
        other => panic!("a second choice is refused: {other:?}"),
    }
    let chosen = match meta.query(&MetaQuery::NamedPod {
        pod: "train/b".into(),
    }) {
        MetaReply::Groups { mut records } => records.remove(0),
        other => panic!("{other:?}"),
    };
    match look(&chosen, &pods) {
        NamedPods::Ready(uids) => assert_eq!(
            uids.values()
                .map(|(_, uid)| uid.as_str())
                .collect::<Vec<_>>(),
            ["uid-b", "uid-c"]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_choice_of_a_pod_another_live_group_names_is_refused() {
    let mut meta = MetaState::new(1);
    let submit = |meta: &mut MetaState, key: &str, req: &SubmitGangGroupRequest| {
        meta.apply(&MetaCommand::Submit {
            key: key.into(),
            group: validate_submission(req).expect("valid"),
            at_ms: 1,
            live_max: None,
        })
    };
    submit(&mut meta, "a", &request(1, &["solo"]));
    let mut sel = selecting();
    sel.gangs[0].name = "other".into();
    submit(&mut meta, "b", &sel);
    let choose = MetaCommand::ChoosePods {
        seq: 2,
        choices: vec![
            ("train/other/w-0".into(), "solo".into()),
            ("train/other/w-1".into(), "x".into()),
        ],
    };
    match meta.apply(&choose) {
        MetaReply::Rejected { reason, .. } => assert!(
            reason.contains("choices[0]: pod train/solo is already taken"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    let not_selecting = MetaCommand::ChoosePods {
        seq: 1,
        choices: vec![("train/workers/solo".into(), "y".into())],
    };
    assert!(matches!(
        meta.apply(&not_selecting),
        MetaReply::Rejected { .. }
    ));
}

#[test]
fn two_templates_selecting_the_same_pods_are_given_different_ones() {
    let mut req = selecting();
    // A second template whose selector picks the same pods (they carry both labels).
    let mut second = req.gangs[0].members[0].clone();
    second.name = "v".into();
    second.count = 1;
    if let Some(pods) = second.pods.as_mut() {
        pods.selector.insert("tier".into(), "x".into());
    }
    req.gangs[0].members.push(second);
    req.gangs[0].min_member = 3;
    let g = record(&req);
    let both = |name: &str| {
        let mut p = labelled(name, "1");
        p["metadata"]["labels"]["tier"] = json!("x");
        p
    };
    let pods = [both("a"), both("b"), both("c")];
    let choices = match look(&g, &pods) {
        NamedPods::Choose(choices) => choices,
        other => panic!("{other:?}"),
    };
    let picked: BTreeSet<&str> = choices.iter().map(|(_, pod)| pod.as_str()).collect();
    assert_eq!(picked.len(), 3, "each pod to one member: {choices:?}");
}
