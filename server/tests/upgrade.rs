//! Upgrade in place: a `gangway dev` data dir written by a gangway that wrote its Raft
//! log and snapshots as JSON (fixtures/json-format-dev.tar.gz, made by
//! fixtures/make-json-format-dev.sh from commit 5863025) restarts under this build,
//! keeps every placement, takes new work (written in the binary format after the JSON
//! entries), compacts to binary snapshots, and restarts again on that mixed data.
//!
//! The second test runs the second rollout of a rolling upgrade: replicas writing JSON
//! and binary side by side, one of them leading, snapshots installed across formats.
//!
//! The fixture's replicas listen on 127.0.0.1:19610–19613 (recorded in the Raft
//! membership): below the ephemeral range and below the ports
//! `gangway_client::loopback::free_port` hands out (20,768 and up by default), so no
//! other test is handed them.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use serde_json::json;

/// The fixture's replica addresses.
const REPLICAS: [&str; 3] = ["127.0.0.1:19611", "127.0.0.1:19612", "127.0.0.1:19613"];
/// Longest the dev cluster may take to come up.
const START_TIMEOUT_S: u64 = 90;
/// Longest a group may take to be placed or released, and any one call.
const CALL_TIMEOUT_S: u64 = 30;
/// Placements at the time the fixture was made: "group member node" per line.
const PLACEMENTS: &str = include_str!("fixtures/json-format-dev.placements.txt");

struct Dev {
    child: Child,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `gangway dev` on `data` (the fixture's shape) and waits for its fleet.
async fn start(data: &Path, run: u32) -> Dev {
    let out = data.with_extension(format!("out{run}"));
    let err = data.with_extension(format!("err{run}"));
    let child = Command::new(support::gangway_bin())
        .args(["dev", "--shards", "4", "--nodes", "12", "--data"])
        .arg(data)
        .stdout(Stdio::from(
            std::fs::File::create(&out).expect("stdout file"),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(&err).expect("stderr file"),
        ))
        .spawn()
        .expect("spawn gangway dev");
    let mut dev = Dev { child, out, err };
    let deadline = Instant::now() + Duration::from_secs(START_TIMEOUT_S);
    while !std::fs::read_to_string(&dev.out)
        .unwrap_or_default()
        .contains("simulated nodes registered")
    {
        let exited = dev.child.try_wait().expect("wait");
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "gangway dev (run {run}) did not come up on the old data dir ({exited:?}); \
             are 127.0.0.1:19610-19613 free?\nstdout:\n{}\nstderr:\n{}",
            std::fs::read_to_string(&dev.out).unwrap_or_default(),
            std::fs::read_to_string(&dev.err).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dev
}

/// Stops `dev` with SIGTERM and waits for it to exit.
async fn stop(mut dev: Dev) {
    let status = Command::new("kill")
        .args(["-s", "TERM", &dev.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.child.try_wait().expect("wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "gangway dev did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `call`'s answer, failing the test after [`CALL_TIMEOUT_S`].
async fn bounded<T, E: std::fmt::Debug>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> T {
    match tokio::time::timeout(Duration::from_secs(CALL_TIMEOUT_S), call).await {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => panic!("{what}: {e:?}"),
        Err(_) => panic!("{what}: no answer within {CALL_TIMEOUT_S} s"),
    }
}

/// "group member node" lines of the placed groups `ids`, sorted.
async fn placements(client: &Client, ids: &[u64]) -> Vec<String> {
    let mut lines = Vec::new();
    for &id in ids {
        let g = bounded("get group", client.get(id)).await;
        assert_eq!(g.state, "Placed", "group {id}: {g:?}");
        lines.extend(
            g.placements
                .iter()
                .map(|p| format!("{id} {} {}", p.member, p.node)),
        );
    }
    lines.sort();
    lines
}

async fn connect() -> Client {
    let endpoints: Vec<String> = REPLICAS.iter().map(|a| format!("http://{a}")).collect();
    bounded("connect", Client::connect(&endpoints)).await
}

async fn wait_for_state(client: &Client, id: u64, state: &str) {
    let watch = client.watch_until(id, |s| s.state == state);
    let reached = match tokio::time::timeout(Duration::from_secs(CALL_TIMEOUT_S), watch).await {
        Ok(reached) => reached.expect("watch"),
        Err(_) => {
            let now = client.get(id).await;
            panic!("group {id} not {state} within {CALL_TIMEOUT_S} s: {now:?}");
        }
    };
    assert_eq!(reached.state, state, "{reached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_written_as_json_restarts_keeps_its_placements_and_moves_to_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/json-format-dev.tar.gz");
    let untar = Command::new("tar")
        .arg("xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("tar");
    assert!(untar.success(), "cannot unpack {}", fixture.display());
    let data = dir.path().join("dev");
    let expected: Vec<String> = {
        let mut lines: Vec<String> = PLACEMENTS.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    assert!(!expected.is_empty());

    // First start on the JSON data: snapshots and log entries are read as JSON.
    let dev = start(&data, 1).await;
    let client = connect().await;
    assert_eq!(placements(&client, &[1, 2, 4]).await, expected);
    let released = bounded("group 3", client.get(3)).await;
    assert_eq!(released.state, "Released", "{released:?}");
    assert_eq!(bounded("nodes", client.list_nodes(None)).await.len(), 12);

    // New work lands after the JSON entries, written in the binary format.
    let upgraded = GangGroupBuilder::new("upgraded")
        .idempotency_key("upgraded")
        .gang(GangBuilder::new("upgrade", "workers", 2).members(
            "worker",
            2,
            json!({"requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "8"}}),
        ))
        .build();
    let submitted = bounded("submit", client.submit(upgraded)).await;
    wait_for_state(&client, submitted.id, "Placed").await;
    let new_lines = placements(&client, &[submitted.id]).await;
    assert_eq!(new_lines.len(), 2);
    // A release after the upgrade is written in the binary format too.
    let released_again = bounded("release group 2", client.release(2)).await;
    assert!(
        ["Released", "Releasing"].contains(&released_again.state.as_str()),
        "{released_again:?}"
    );
    for addr in REPLICAS {
        let one = bounded(
            "connect replica",
            Client::connect(&[format!("http://{addr}")]),
        )
        .await;
        bounded("compact to binary snapshots", one.compact(None)).await;
    }
    drop(client);
    stop(dev).await;

    // Second start: binary snapshots, then whatever was logged after them.
    let dev = start(&data, 2).await;
    let client = connect().await;
    let mut kept: Vec<String> = expected
        .iter()
        .filter(|l| !l.starts_with("2 "))
        .cloned()
        .collect();
    kept.extend(new_lines);
    kept.sort();
    assert_eq!(placements(&client, &[1, 4, submitted.id]).await, kept);
    wait_for_state(&client, 2, "Released").await;
    stop(dev).await;
}

/// A gang group of `members` one-cpu pods.
fn small_group(name: &str, members: u32) -> gangway_proto::v1::SubmitGangGroupRequest {
    GangGroupBuilder::new(name)
        .idempotency_key(name)
        .gang(GangBuilder::new("mixed", name, members).members(
            "w",
            members,
            json!({"requests": {"cpu": "1"}}),
        ))
        .build()
}

/// Submits `names` through replica `via` and waits for each to be placed.
async fn place_through(c: &support::Cluster, via: u64, names: &[&str]) -> Vec<u64> {
    let client = support::client(c, via).await;
    let mut ids = Vec::new();
    for name in names {
        let submitted = bounded("submit", client.submit(small_group(name, 2))).await;
        wait_for_state(&client, submitted.id, "Placed").await;
        ids.push(submitted.id);
    }
    ids
}

/// While replicas write different formats they read each other's entries, snapshots
/// and answers; once the last one writes binary too, all three hold byte-identical
/// state (the state hash is over the binary snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_writing_json_and_binary_side_by_side_keep_one_state() {
    let all = [1, 2, 3];
    let ready = Duration::from_secs(CALL_TIMEOUT_S);
    let mut c = support::Cluster::prepare(3, 2, Vec::new(), Vec::new());
    let json_writer = vec!["--wire-format".to_string(), "json".to_string()];
    c.proc_args.insert(1, json_writer);
    for id in all {
        c.spawn(id);
    }
    c.wait_ready(&all, ready).await;
    let mut inventory = c.inventory(1).await;
    for i in 0..4 {
        let node = support::node_spec(&format!("n{i}"), "8", false);
        let request = gangway_proto::v1::RegisterNodeRequest {
            node: Some(node),
            update: false,
        };
        bounded("register", inventory.register_node(request)).await;
    }
    let mut placed = place_through(&c, 1, &["a", "b"]).await;
    c.wait_converged(&[2, 3], ready).await;

    // Replica 2 away: 1 (JSON) and 3 (binary) lead between them and compact, so 2
    // comes back through a snapshot in either format.
    c.kill(2);
    c.wait_ready(&[1, 3], ready).await;
    let balanced = bounded("balance", support::client(&c, 1).await.balance()).await;
    assert!(
        balanced.leaders_per_node.get(&1).is_some_and(|n| *n > 0),
        "the JSON writer leads a group: {balanced:?}"
    );
    c.wait_ready(&[1, 3], ready).await;
    placed.extend(place_through(&c, 3, &["c", "d"]).await);
    for id in [1, 3] {
        let one = support::client(&c, id).await;
        bounded("compact", one.compact(None)).await;
    }
    c.spawn(2);
    c.wait_ready(&all, ready).await;
    placed.extend(place_through(&c, 2, &["e"]).await);
    c.wait_converged(&[2, 3], ready).await;

    // The last rollout step: replica 1 writes binary too.
    c.proc_args.remove(&1);
    c.kill(1);
    c.spawn(1);
    c.wait_ready(&all, ready).await;
    c.wait_converged(&all, ready).await;
    let client = support::client(&c, 1).await;
    for id in placed {
        let g = bounded("get group", client.get(id)).await;
        assert_eq!(g.state, "Placed", "{g:?}");
    }
}
