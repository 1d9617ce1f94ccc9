//! Unit tests of `allocations.rs`.

use super::*;

#[test]
fn a_checkpoint_that_cannot_be_written_stays_unsaved_until_it_is() {
    let dir = tempfile::tempdir().expect("dir");
    let mut unsaved = true;
    save(
        &Checkpoint::default(),
        &dir.path().join("missing-dir").join(CHECKPOINT_FILE),
        &mut unsaved,
    );
    assert!(unsaved, "the write failed: nothing may be reported");
    save(
        &Checkpoint::default(),
        &dir.path().join(CHECKPOINT_FILE),
        &mut unsaved,
    );
    assert!(!unsaved);
}

#[test]
fn the_checkpoint_survives_a_round_trip_and_refuses_what_it_cannot_read() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join(CHECKPOINT_FILE);
    let mut cp = Checkpoint::load(&path).expect("none yet");
    assert!(cp.entries.is_empty());
    cp.entries.entry("ml/g/w-0".into()).or_default().insert(
        "vendor.example/gpu".into(),
        Entry {
            txn: "txn-7".into(),
            allocation: NodeAllocation {
                resource: "vendor.example/gpu".into(),
                device_ids: vec!["DEV-1".into()],
                ..Default::default()
            },
            reported: true,
        },
    );
    cp.save(&path).expect("save");
    assert_eq!(Checkpoint::load(&path).expect("load"), cp);
    std::fs::write(&path, "{not json").expect("write");
    let err = Checkpoint::load(&path).expect_err("corrupt");
    assert!(err.to_string().contains("move it away"), "{err}");
}
