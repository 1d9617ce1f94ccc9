//! `gangctl` against a real `gangway serve`: submit a YAML group, watch it to
//! Placed, release it; malformed YAML and invalid fields are reported with the
//! line or field and the documented exit codes; `gangctl cluster add` and
//! `remove` under a stream of submissions lose no acknowledged one.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_proto::v1::NodeSpec;
use serde_json::json;
use support::{client, free_port, Cluster};

/// Retries of a membership change answered UNAVAILABLE.
const REMOVE_RETRIES_MAX: usize = 3;

/// The gangctl binary (`support::gangctl_bin`).
fn gangctl() -> PathBuf {
    support::gangctl_bin()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_add_then_remove_under_load_loses_no_acknowledged_submission() {
    // Built (or waited for, behind cargo's lock) before the cluster starts: a first build
    // of gangctl beside the loaded cluster took both cores, and a leader transfer of
    // `cluster remove` timed out.
    gangctl();
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let via2 = client(&c, 2).await;
    via2.register_node(NodeSpec {
        name: "roomy".into(),
        allocatable: [("cpu", "10000"), ("memory", "10000Gi"), ("pods", "100000")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
    .await
    .expect("register a node");

    // A stream of one-pod gangs through replica 2, each with its own idempotency key.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (client, stop) = (via2.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut acked, mut slowest) = (Vec::new(), Duration::ZERO);
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("load-{i:05}");
                let request = GangGroupBuilder::new(key.clone())
                    .idempotency_key(key.clone())
                    .gang(GangBuilder::new("load", format!("g{i}"), 1).members(
                        "w",
                        1,
                        json!({"requests": {"cpu": "1"}}),
                    ))
                    .build();
                let started = Instant::now();
                if client.submit(request).await.is_ok() {
                    acked.push(key);
                    slowest = slowest.max(started.elapsed());
                }
                i += 1;
            }
            (acked, slowest)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Add replica 4 (started with --join), then remove replica 1, through gangctl.
    let addr4 = format!("127.0.0.1:{}", free_port());
    let peers = (1..=3).map(|id| (id, c.procs[&id].grpc.clone())).collect();
    c.add_proc(4, addr4.clone(), peers, true);
    c.spawn(4);
    let add = run(
        &c.procs[&2].grpc,
        &["cluster", "add", "--id", "4", "--addr", &addr4],
    );
    assert!(
        add.status.success(),
        "cluster add: {}\n{}",
        text(&add),
        c.log(4)
    );
    // Replica 4 votes in every group and applies its log (the load keeps the states moving,
    // so they are not compared here; the cluster tests compare them at rest).
    let start = Instant::now();
    loop {
        let four = c.status(4, false).await;
        let ok = four.as_ref().is_some_and(|s| {
            s.groups
                .iter()
                .all(|g| g.voters == vec![1, 2, 3, 4] && g.applied_index > 0)
        });
        if ok {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "replica 4 never became a voter of every group: {four:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // UNAVAILABLE (a leadership transfer that did not finish in time on a loaded machine)
    // changed nothing and asks for a retry, as any caller would.
    let mut remove = run(&c.procs[&2].grpc, &["cluster", "remove", "--id", "1"]);
    for _ in 0..REMOVE_RETRIES_MAX {
        if remove.status.success() || !text(&remove).contains("unavailable") {
            break;
        }
        eprintln!("cluster remove answered {}; retrying", text(&remove));
        tokio::time::sleep(Duration::from_secs(1)).await;
        remove = run(&c.procs[&2].grpc, &["cluster", "remove", "--id", "1"]);
    }
    assert!(remove.status.success(), "cluster remove: {}", text(&remove));
    let status = c.status(2, false).await.expect("status of 2");
    for g in &status.groups {
        assert_eq!(g.voters, vec![2, 3, 4], "group {} voters", g.group_id);
        assert_ne!(
            g.leader, 1,
            "group {} is not led by the removed replica",
            g.group_id
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let (acked, slowest) = load.await.expect("load task");
    assert!(acked.len() > 10, "the load made progress: {}", acked.len());
    eprintln!(
        "membership change under load: {} submissions acknowledged, slowest {slowest:?}",
        acked.len()
    );

    let known: BTreeSet<String> = via2
        .list_groups(true)
        .await
        .expect("list")
        .into_iter()
        .map(|g| g.idempotency_key)
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|k| !known.contains(*k)).collect();
    assert!(lost.is_empty(), "acknowledged submissions lost: {lost:?}");
    // An election takes at most a few election timeouts (300-600 ms each).
    assert!(
        slowest < Duration::from_secs(3),
        "a submission waited {slowest:?} while the membership changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_are_put_listed_and_deleted_and_bad_amounts_are_named() {
    let c = Cluster::start(1, 1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let server = c.procs[&1].grpc.clone();
    let out = run(
        &server,
        &[
            "queues",
            "put",
            "team-a",
            "--min",
            "cpu=4",
            "--max",
            "cpu=8,memory=16Gi",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let table = text(&out);
    assert!(
        table.contains("team-a") && table.contains("cpu=0/8 (4)"),
        "{table}"
    );
    let lends = run(
        &server,
        &[
            "queues", "put", "lender", "--min", "cpu=4", "--lend", "cpu=1",
        ],
    );
    assert!(lends.status.success(), "{}", text(&lends));
    assert!(
        text(&lends).contains("cpu=0/- (4, lends 1)"),
        "{}",
        text(&lends)
    );
    let over = run(
        &server,
        &[
            "queues", "put", "lender", "--min", "cpu=4", "--lend", "cpu=5",
        ],
    );
    assert_eq!(over.status.code(), Some(1), "{}", text(&over));
    assert!(text(&over).contains("queue.lend.cpu"), "{}", text(&over));
    let bad = run(&server, &["queues", "put", "team-b", "--max", "cpu"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("not NAME=QUANTITY"), "{}", text(&bad));
    let refused = run(&server, &["queues", "put", "team-b", "--max", "cpu=lots"]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("queue.max.cpu"),
        "{}",
        text(&refused)
    );
    let listed = run(&server, &["-o", "json", "queues"]);
    let list: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("queues as JSON");
    assert_eq!(list[0]["name"], "lender");
    assert_eq!(list[0]["lend"]["cpu"], "1");
    assert_eq!(list[1]["name"], "team-a");
    assert_eq!(list[1]["max"]["memory"], (16u64 << 30).to_string());
    let gone = run(&server, &["queues", "delete", "team-a"]);
    assert!(gone.status.success(), "{}", text(&gone));
    let again = run(&server, &["queues", "delete", "team-a"]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("no queue team-a"), "{}", text(&again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_grow_adds_a_shard_and_refuses_a_lower_count_naming_it() {
    let c = Cluster::start(1, 1);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let server = c.procs[&1].grpc.clone();
    let grown = run(&server, &["shards", "grow", "--to", "2"]);
    assert!(grown.status.success(), "{}", text(&grown));
    assert!(text(&grown).contains("shards: 1 -> 2"), "{}", text(&grown));
    let listed = run(&server, &["-o", "json", "shards", "grow", "--to", "2"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let reply: serde_json::Value =
        serde_json::from_slice(&listed.stdout).expect("grow answers JSON");
    assert_eq!(reply["shards_before"], json!(2), "{reply}");
    assert_eq!(reply["shards"], json!(2), "{reply}");
    let lower = run(&server, &["shards", "grow", "--to", "1"]);
    assert_eq!(lower.status.code(), Some(1), "{}", text(&lower));
    assert!(
        text(&lower).contains("shards: 1 is below the current count 2"),
        "{}",
        text(&lower)
    );
    let shards = client(&c, 1).await.shards().await.expect("shards");
    assert_eq!(shards.len(), 2, "{shards:?}");
    assert!(shards.iter().all(|s| s.leader == 1), "{shards:?}");
}
