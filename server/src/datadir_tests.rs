//! Unit tests of `datadir.rs`.

use super::*;

#[test]
fn fresh_then_existing_then_foreign() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = Identity {
        cluster_id: "a".into(),
        node_id: 1,
        shards: 2,
    };
    assert_eq!(open(dir.path(), &id).expect("fresh"), DataDirState::Fresh);
    assert_eq!(
        open(dir.path(), &id).expect("existing"),
        DataDirState::Existing
    );
    let other = Identity {
        cluster_id: "b".into(),
        ..id.clone()
    };
    let err = open(dir.path(), &other).expect_err("foreign");
    assert!(
        err.to_string().contains("belongs to cluster \"a\""),
        "{err}"
    );
}

#[test]
fn non_empty_dir_without_identity_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("x"), b"x").expect("write");
    let id = Identity {
        cluster_id: "a".into(),
        node_id: 1,
        shards: 2,
    };
    assert!(open(dir.path(), &id).is_err());
}
