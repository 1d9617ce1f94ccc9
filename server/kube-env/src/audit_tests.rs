//! Unit tests of `audit.rs`.

use super::*;

#[test]
fn a_binding_line_is_read_with_its_node_and_a_failed_one_is_not_a_binding() {
    let ok = r#"{"kind":"Event","stage":"ResponseComplete","verb":"create","user":{"username":"admin"},"objectRef":{"resource":"pods","namespace":"train","name":"p-0","subresource":"binding"},"responseStatus":{"code":201},"requestObject":{"kind":"Binding","target":{"kind":"Node","name":"node-001"}},"requestReceivedTimestamp":"2026-11-25T13:00:00.000100Z","stageTimestamp":"2026-11-25T13:00:00.004000Z"}"#;
    let conflict = ok.replace("201", "409").replace("000100", "000200");
    let half = &ok[..40];
    let text = format!("{ok}\n{conflict}\n{half}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("audit.log");
    std::fs::write(&path, text).expect("write");
    let entries = read(&path);
    assert_eq!(entries.len(), 2, "the half-written line is skipped");
    assert_eq!(entries[1].code, 409);
    let bound = bindings(&entries);
    assert_eq!(
        bound,
        vec![Binding {
            namespace: "train".into(),
            pod: "p-0".into(),
            node: "node-001".into(),
            received: "2026-11-25T13:00:00.000100Z".into(),
        }]
    );
}
