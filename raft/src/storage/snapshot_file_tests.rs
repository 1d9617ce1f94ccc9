//! Unit tests of `snapshot_file.rs`: a slot keeps the last whole snapshot, and a stopped
//! write's partial file is never read and is removed at the next open.

use super::*;

#[test]
fn a_slot_holds_the_last_whole_snapshot_and_removes_a_partial_one() {
    let dir =
        std::env::temp_dir().join(format!("gangway-snapshot-file-test-{}", std::process::id()));
    let slot = SnapshotFile::open(dir.clone(), "g0").expect("open");
    assert_eq!(slot.read().expect("read"), None);
    assert!(!slot.is_written().expect("look"));
    slot.replace(&[b"head", b"-body"]).expect("replace");
    assert_eq!(
        slot.read().expect("read").as_deref(),
        Some(&b"head-body"[..])
    );
    assert!(slot.is_written().expect("look"));
    // A write that stopped halfway left only its partial file behind, which the
    // next open removes.
    let half = slot.partial(7);
    fs::write(&half, b"half").expect("write partial");
    let reopened = SnapshotFile::open(dir.clone(), "g0").expect("reopen");
    assert_eq!(
        reopened.read().expect("read").as_deref(),
        Some(&b"head-body"[..])
    );
    assert!(
        !half.exists(),
        "a stopped write's partial file is removed at open"
    );
    reopened.replace(&[b"next"]).expect("replace again");
    assert_eq!(
        reopened.read().expect("read").as_deref(),
        Some(&b"next"[..])
    );
    let names: Vec<String> = fs::read_dir(&dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["g0"], "the partial file became the snapshot");
    let _ = fs::remove_dir_all(&dir);
}
