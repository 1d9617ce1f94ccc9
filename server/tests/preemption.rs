//! Preemption with real `gangway serve` processes (three replicas, two shards): a
//! high-priority gang that needs the room of a low-priority Strict gang spread over both
//! shards evicts it whole and is placed; a preemption that would not make room, one at
//! equal priority and one by a preemptionPolicy Never pod evict nothing; and the
//! coordinator killed inside a preemption (between its reservations and its decision,
//! and between its decision and telling the shards) leaves either the old state or the
//! new, never a victim evicted while the preemptor is not held.

mod support;

use std::time::{Duration, Instant};

use gangway_client::Client;
use gangway_proto::v1::{GangGroupStatus, GangSpec};
use support::gangs::{fleet, gang, held, submission, wait_state};
use support::{client, Cluster};

/// Shards, nodes per shard and cpus per node: 8 nodes of 4 cpus in all.
const SHARDS: u32 = 2;
const NODES_PER_SHARD: u32 = 4;

fn with_priority(mut g: GangSpec, priority: i32) -> GangSpec {
    g.priority = priority;
    g
}

/// A low-priority Strict gang of 8 four-cpu members fills both shards.
async fn fill_with_low(cl: &Client) -> GangGroupStatus {
    fleet(cl, SHARDS, NODES_PER_SHARD, "4").await;
    let low = cl
        .submit(submission("low", vec![gang("low", 8, 8, "4", 0)]))
        .await
        .expect("submit low");
    let placed = wait_state(cl, low.id, "Placed", Duration::from_secs(20)).await;
    let shards: std::collections::BTreeSet<u32> =
        placed.placements.iter().map(|p| p.shard).collect();
    assert_eq!(
        shards.len(),
        2,
        "the low gang spans both shards: {placed:?}"
    );
    placed
}

/// Waits until the ledgers hold exactly `pods` pods, one per node.
async fn wait_held(cl: &Client, pods: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = held(cl).await;
        if h.values().sum::<u32>() == pods && h.values().all(|p| *p == 1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ledgers hold {h:?}, not {pods} pods"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The high gang is placed and the low one ends Preempted whole, naming it.
async fn assert_preempted(cl: &Client, low: u64, high: u64) {
    let placed = wait_state(cl, high, "Placed", Duration::from_secs(30)).await;
    assert_eq!(placed.placements.len(), 8);
    assert!(
        placed
            .reason
            .contains(&format!("preempting gang groups {low}")),
        "says whom it preempted: {}",
        placed.reason
    );
    let gone = wait_state(cl, low, "Preempted", Duration::from_secs(10)).await;
    assert!(gone.placements.is_empty(), "evicted whole: {gone:?}");
    assert!(
        gone.reason.contains(&format!("gang group {high}")),
        "names the preemptor: {}",
        gone.reason
    );
    wait_held(cl, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_gang_evicts_a_low_gang_whole_across_shards() {
    let c = Cluster::start(3, SHARDS);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    let low = fill_with_low(&cl).await;

    let high = cl
        .submit(submission(
            "high",
            vec![with_priority(gang("high", 8, 8, "4", 0), 100)],
        ))
        .await
        .expect("submit high");
    // Watching the low gang: every state it passes through is Placed, Preempting or
    // Preempted, and it never loses some members while keeping others.
    let seen = cl
        .watch_until(low.id, |s| {
            assert!(
                s.placements.is_empty() || s.placements.len() == 8,
                "a partial eviction: {s:?}"
            );
            s.state == "Preempted"
        })
        .await
        .expect("watch low");
    assert_eq!(seen.state, "Preempted");
    assert_preempted(&cl, low.id, high.id).await;
    c.wait_converged(&[1, 2, 3], Duration::from_secs(20)).await;

    // The coordinator that ran it counted it.
    let mut text = String::new();
    for id in c.live() {
        text.push_str(&support::http_get(&c.procs[&id].http, "/metrics").await.1);
    }
    for line in [
        "gangway_preemptions_total{outcome=\"committed\"} 1",
        "gangway_preempted_groups_total 1",
        "gangway_preempted_pods_total 8",
        "gangway_preemption_seconds_count 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} on /metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_evicted_when_it_would_not_make_room_or_is_not_allowed() {
    let c = Cluster::start(3, SHARDS);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 2).await;
    let low = fill_with_low(&cl).await;

    // Nine four-cpu members cannot fit eight four-cpu nodes, whoever leaves.
    let too_big = cl
        .submit(submission(
            "too-big",
            vec![with_priority(gang("too-big", 9, 9, "4", 0), 100)],
        ))
        .await
        .expect("submit");
    // Equal priority never preempts.
    let equal = cl
        .submit(submission("equal", vec![gang("equal", 1, 1, "4", 0)]))
        .await
        .expect("submit");
    // A pod with preemptionPolicy Never waits for room.
    let mut never = with_priority(gang("never", 1, 1, "4", 0), 100);
    never.members[0].pod_json = r#"{"requests": {"cpu": "4"}, "preemptionPolicy": "Never"}"#.into();
    let never = cl
        .submit(submission("never", vec![never]))
        .await
        .expect("submit");
    // Each is tried a few times (backoff from 100 ms).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for (id, why) in [
        (
            too_big.id,
            "no preemption: evicting every lower-priority gang",
        ),
        (equal.id, "fit"),
        (never.id, "fit"),
    ] {
        let s = cl.get(id).await.expect("get");
        assert_eq!(s.state, "Queued", "{s:?}");
        assert!(s.placements.is_empty());
        assert!(s.reason.contains(why), "group {id} says why: {}", s.reason);
    }
    // Neither may preempt: no placed group is below the equal one, and the other's pod
    // never preempts.
    for id in [equal.id, never.id] {
        let reason = cl.get(id).await.expect("get").reason;
        assert!(!reason.contains("preempt"), "{reason}");
    }
    let still = cl.get(low.id).await.expect("get low");
    assert_eq!(
        (still.state.as_str(), still.placements.len()),
        ("Placed", 8)
    );
    wait_held(&cl, 8).await;

    // A bad preemptionPolicy is refused, naming the field.
    let mut bad = gang("bad", 1, 1, "1", 0);
    bad.members[0].pod_json = r#"{"preemptionPolicy": "Sometimes"}"#.into();
    let err = cl
        .submit(submission("bad", vec![bad]))
        .await
        .expect_err("bad policy");
    assert!(err.to_string().contains("preemptionPolicy"), "{err}");
}

async fn coordinator_killed_in_a_preemption(failpoint: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = vec![
        ("GANGWAY_TEST_FAILPOINTS".to_string(), failpoint.to_string()),
        (
            "GANGWAY_TEST_FAILPOINT_DIR".to_string(),
            dir.path().display().to_string(),
        ),
    ];
    let mut c = Cluster::start_with(3, SHARDS, vec!["--test-failpoints".into()], env);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let meta_leader = c.agreed_leader(0, &[1, 2, 3]).await.expect("meta leader");
    let via = [1, 2, 3]
        .into_iter()
        .find(|id| *id != meta_leader)
        .expect("a follower");
    let cl = client(&c, via).await;
    let low = fill_with_low(&cl).await;
    let high = cl
        .submit(submission(
            "high",
            vec![with_priority(gang("high", 8, 8, "4", 0), 100)],
        ))
        .await
        .expect("submit high");
    support::wait_for_failpoint(dir.path(), failpoint, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.kill(meta_leader);
    // Whatever the new coordinator finds, the end is the same: the high gang placed,
    // the low one preempted whole, the ledgers holding exactly the high gang.
    assert_preempted(&cl, low.id, high.id).await;
    c.spawn(meta_leader);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    c.wait_converged(&[1, 2, 3], Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_between_a_preemptions_reservations_and_its_decision() {
    coordinator_killed_in_a_preemption("coordinator-preemption-after-reserve").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_between_a_preemptions_decision_and_its_commit() {
    coordinator_killed_in_a_preemption("coordinator-preemption-after-decide").await;
}
