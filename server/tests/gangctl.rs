//! `gangctl` against a real `gangway serve`: submit a YAML group, watch it to
//! Placed, release it; malformed YAML and invalid fields are reported with the
//! line or field and the documented exit codes.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use gangway_proto::v1::NodeSpec;
use support::{client, Cluster};

/// The gangctl binary beside the gangway binary, built if this test run did not build it.
fn gangctl() -> PathBuf {
    let dir = PathBuf::from(support::gangway_bin())
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let path = dir.join("gangctl");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "gangway-client", "--bin", "gangctl"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building gangctl failed");
    }
    path
}

fn run(server: &str, args: &[&str]) -> Output {
    Command::new(gangctl())
        .args(["-s", server])
        .args(args)
        .output()
        .expect("run gangctl")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const GROUP: &str = "name: demo
idempotencyKey: demo-1
gangs:
  - name: workers
    namespace: team-a
    minMember: 2
    members:
      - name: worker
        count: 2
        pod:
          requests: {cpu: \"1\", memory: 1Gi}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_watch_release_round_trip() {
    let c = Cluster::start(1, 1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    for i in 0..2 {
        let node = NodeSpec {
            name: format!("n{i}"),
            allocatable: [("cpu", "2"), ("memory", "4Gi"), ("pods", "10")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        cl.register_node(node).await.expect("register");
    }
    let server = c.procs[&1].grpc.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("group.yaml");
    std::fs::write(&file, GROUP).expect("write group");
    let file = file.display().to_string();

    let out = run(&server, &["-o", "json", "submit", "-f", &file]);
    assert!(out.status.success(), "{}", text(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json output");
    let id = status["id"].as_u64().expect("id").to_string();
    let again = run(&server, &["-o", "json", "submit", "-f", &file]);
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).expect("json output");
    assert_eq!(
        again["id"].as_u64().map(|v| v.to_string()),
        Some(id.clone()),
        "same key, same group"
    );

    let out = run(&server, &["watch", &id, "--until", "Placed"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Placed"));
    let out = run(&server, &["release", &id]);
    assert!(out.status.success(), "{}", text(&out));
    let out = run(&server, &["watch", &id, "--until", "Released"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = run(&server, &["get", &id]);
    assert!(text(&out).contains("Released"), "{}", text(&out));

    // Malformed YAML: exit 2, the line named.
    std::fs::write(
        dir.path().join("bad.yaml"),
        "name: x\ngangs:\n  - name: [oops\n",
    )
    .expect("write");
    let out = run(
        &server,
        &[
            "submit",
            "-f",
            &dir.path().join("bad.yaml").display().to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 3"), "{}", text(&out));
    // An invalid field: the server refuses (exit 1) naming it.
    let invalid = GROUP
        .replace("minMember: 2", "minMember: 3")
        .replace("demo-1", "demo-2");
    std::fs::write(dir.path().join("invalid.yaml"), invalid).expect("write");
    let out = run(
        &server,
        &[
            "submit",
            "-f",
            &dir.path().join("invalid.yaml").display().to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("minMember"), "{}", text(&out));
    // Nobody listening: exit 3.
    let out = run(&format!("127.0.0.1:{}", support::free_port()), &["list"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}
