//! Unit tests of `policy.rs`.

use super::*;

const GOOD: &str = r#"
identities:
  - name: ops
    roles: [admin]
    tokens: ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
  - name: team-a
    roles: [tenant, viewer]
    certificates: [team-a]
    tokens: ["team-a-token-0123456789"]
    tenant:
      namespaces: [team-a]
      queues: [team-a]
      defaultQueue: team-a
      maxPriority: 100
  - name: node-7
    roles: [node]
    tokens: ["node-7-token-0123456789"]
    nodes: [node-7]
"#;

#[test]
fn identities_are_found_by_token_digest_and_certificate_subject() {
    let p = Policy::parse("p.yaml", GOOD).expect("valid");
    assert_eq!(p.len(), 3);
    // sha256("test")
    assert_eq!(
        p.by_token("test").map(|i| i.name.clone()),
        Some("ops".into())
    );
    let a = p.by_token("team-a-token-0123456789").expect("team-a");
    assert!(a.has(Role::Tenant) && a.has(Role::Viewer) && !a.has(Role::Admin));
    let t = a.tenant.as_ref().expect("grant");
    assert!(t.namespaces.allows("team-a") && !t.namespaces.allows("team-b"));
    assert_eq!(t.default_queue.as_deref(), Some("team-a"));
    assert_eq!(t.live_groups_max, LIVE_GROUPS_PER_IDENTITY_DEFAULT);
    assert_eq!(
        p.by_subject("team-a").map(|i| i.name.clone()),
        Some("team-a".into())
    );
    assert!(p.by_token("nobody-token-0123456").is_none());
    assert!(p.by_subject("node-7").is_none());
}

#[test]
fn every_error_names_its_field() {
    let cases = [
            ("identities: [{name: x, roles: [root], tokens: [aaaaaaaaaaaaaaaaaaaa]}]", "root"),
            ("identities: [{name: x, roles: [admin]}]", "identities[0]: no way to recognise it"),
            ("identities: [{name: x, roles: [admin], tokens: [short]}]", "identities[0].tokens[0]"),
            ("identities: [{name: x, roles: [admin], tokens: [\"sha256:zz\"]}]", "identities[0].tokens[0]"),
            ("identities: [{name: x, roles: [tenant], tokens: [aaaaaaaaaaaaaaaaaaaa]}]", "identities[0].tenant"),
            ("identities: [{name: x, roles: [admin], tokens: [aaaaaaaaaaaaaaaaaaaa], tenant: {}}]", "identities[0].tenant"),
            ("identities: [{name: x, roles: [node], tokens: [aaaaaaaaaaaaaaaaaaaa]}]", "identities[0].nodes"),
            ("identities: [{name: x, roles: [tenant], tokens: [aaaaaaaaaaaaaaaaaaaa], tenant: {queues: [a], defaultQueue: b}}]", "identities[0].tenant.defaultQueue"),
            ("identities: [{name: x, roles: [tenant], tokens: [aaaaaaaaaaaaaaaaaaaa], tenant: {namespaces: [\"*\", a]}}]", "identities[0].tenant.namespaces"),
            ("identities: [{name: x, roles: [tenant], tokens: [aaaaaaaaaaaaaaaaaaaa], tenant: {queues: [A]}}]", "identities[0].tenant.queues[0]"),
            ("identities: [{name: x, roles: [tenant], tokens: [aaaaaaaaaaaaaaaaaaaa], tenant: {liveGroupsMax: 0}}]", "identities[0].tenant.liveGroupsMax"),
            ("identities: [{name: x, roles: [admin], tokens: [aaaaaaaaaaaaaaaaaaaa]}, {name: x, roles: [admin], tokens: [bbbbbbbbbbbbbbbbbbbb]}]", "identities[1].name"),
            ("identities: [{name: x, roles: [admin], tokens: [aaaaaaaaaaaaaaaaaaaa]}, {name: y, roles: [admin], tokens: [aaaaaaaaaaaaaaaaaaaa]}]", "identities[1].tokens[0]"),
            ("identities: [{name: x, roles: [admin], tokens: [aaaaaaaaaaaaaaaaaaaa], colour: red}]", "colour"),
            ("identities: [{name: \"kube:alice\", roles: [admin], tokens: [aaaaaaaaaaaaaaaaaaaa]}]", "identities[0].name"),
        ];
    for (doc, named) in cases {
        let e = Policy::parse("p.yaml", doc).expect_err(doc).to_string();
        assert!(e.starts_with("--policy-file p.yaml: "), "{e}");
        assert!(e.contains(named), "{doc}: {e}");
    }
}

#[test]
fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_last_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, GOOD).expect("write");
    let file = PolicyFile::load(path.clone()).expect("load");
    assert_eq!(file.current().len(), 3);
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(
        &path,
        "identities: [{name: solo, roles: [admin], tokens: [solo-token-0123456789]}]",
    )
    .expect("write");
    file.reload_if_changed();
    assert_eq!(file.current().len(), 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&path, "identities: [{name: broken}]").expect("write");
    file.reload_if_changed();
    assert!(file.current().by_token("solo-token-0123456789").is_some());
}
