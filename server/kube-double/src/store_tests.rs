//! Unit tests of `store.rs`.

use super::*;

fn pod(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"schedulerName": "gangway"}})
}

#[test]
fn create_assigns_identity_and_revision() {
    let mut s = Store::default();
    let a = s.create(&PODS, Some("ns"), pod("a")).expect("create");
    assert_eq!(a["metadata"]["resourceVersion"], "2");
    assert!(a["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let again = s.create(&PODS, Some("ns"), pod("a")).expect_err("taken");
    assert_eq!((again.code, again.reason), (409, "AlreadyExists"));
}

#[test]
fn stale_update_conflicts_and_deleted_uid_precondition_holds() {
    let mut s = Store::default();
    let a = s.create(&PODS, Some("ns"), pod("a")).expect("create");
    let rv = a["metadata"]["resourceVersion"].as_str().map(String::from);
    s.update(&PODS, Some("ns"), "a", rv.as_deref(), |o| {
        o["spec"]["nodeName"] = json!("n1");
        Ok(())
    })
    .expect("first update");
    let stale = s
        .update(&PODS, Some("ns"), "a", rv.as_deref(), |_| Ok(()))
        .expect_err("stale");
    assert_eq!(stale.code, 409);
    let wrong = s
        .delete(&PODS, Some("ns"), "a", Some("other"), None)
        .expect_err("uid");
    assert_eq!(wrong.code, 409);
    let uid = a["metadata"]["uid"].as_str();
    s.delete(&PODS, Some("ns"), "a", uid, None).expect("delete");
    assert_eq!(s.get(&PODS, Some("ns"), "a").expect_err("gone").code, 404);
}

#[test]
fn compacted_history_answers_gone() {
    let mut s = Store::new(2);
    for i in 0..5 {
        s.create(&PODS, Some("ns"), pod(&format!("p{i}")))
            .expect("create");
    }
    let all = Selector::default();
    assert_eq!(s.changes_since(&PODS, 1, &all).expect_err("old").code, 410);
    let recent = s
        .changes_since(&PODS, s.revision() - 1, &all)
        .expect("recent");
    assert_eq!(recent.len(), 1);
}

#[test]
fn selectors_filter_fields_and_labels() {
    let sel = Selector::parse(
        None,
        Some("spec.schedulerName=gangway"),
        Some("app=x,!skip"),
    )
    .expect("parse");
    let mut p = pod("a");
    p["metadata"]["labels"] = json!({"app": "x"});
    assert!(sel.matches(&p));
    p["metadata"]["labels"]["skip"] = json!("1");
    assert!(!sel.matches(&p));
    assert!(Selector::parse(None, None, Some("a in (b)")).is_err());
}

#[test]
fn merge_patch_removes_nulls_and_merges_maps() {
    let mut v = json!({"a": {"b": 1, "c": 2}, "d": [1]});
    merge_patch(&mut v, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
    assert_eq!(v, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
}

#[test]
fn dates_are_civil() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(20_000), (2024, 10, 04));
}
