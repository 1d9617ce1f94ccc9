//! Shard moves with real `gangway serve` processes (docs/ARCHITECTURE.md §3a): four zones
//! of unequal size on eight shards rebalanced within the bound, a zone moved back and
//! forth under a stream of submissions and releases losing nothing acknowledged,
//! automatic rebalancing, a coordinator killed between a move's handoff and its
//! adoption (the next one finishes the move), and the shard count grown on a live
//! cluster (under a stream, with a replica restarted, and with one down).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gangway_client::Client;
use gangway_proto::v1::NodeSpec;
use support::gangs::{gang, submission, wait_state};
use support::{client, Cluster};

const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

fn zone_node(zone: &str, i: usize, cpu: &str) -> NodeSpec {
    let mut spec = support::node_spec(&format!("{zone}-{i:03}"), cpu, false);
    spec.labels.insert(ZONE_LABEL.to_string(), zone.to_string());
    spec
}

/// Each node's shard, as the shards' ledgers list it.
async fn shards_of_nodes(c: &Client) -> BTreeMap<String, u32> {
    c.list_nodes(None)
        .await
        .expect("nodes")
        .into_iter()
        .filter_map(|n| Some((n.node?.name, n.shard)))
        .collect()
}

/// Registers `count` nodes of `zone`; the shard each landed on.
async fn register_zone(c: &Client, zone: &str, count: usize, cpu: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for i in 0..count {
        let spec = zone_node(zone, i, cpu);
        let info = c.register_node(spec.clone()).await.expect("register node");
        out.insert(spec.name, info.shard);
    }
    out
}

fn cluster(shards: u32, extra: &[&str]) -> Cluster {
    let mut args = vec!["--topology-label".to_string(), ZONE_LABEL.to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    Cluster::start_with(3, shards, args, Vec::new())
}

/// Each shard's allocatable cpu (millicores) as the shards list it.
async fn capacities(c: &Client) -> BTreeMap<u32, u64> {
    c.shards()
        .await
        .expect("list shards")
        .iter()
        .map(|s| (s.shard, s.capacity_milli_cpu))
        .collect()
}

/// Every node is on exactly one shard's ledger: the one the shard map names.
async fn assert_one_owner(c: &Client, nodes: usize) {
    let listed = c.list_nodes(None).await.expect("list nodes");
    let names: BTreeSet<String> = listed
        .iter()
        .filter_map(|n| n.node.as_ref().map(|s| s.name.clone()))
        .collect();
    assert_eq!(listed.len(), nodes, "a node listed twice or missing");
    assert_eq!(names.len(), nodes, "a node listed twice");
    let per_shard: BTreeMap<u32, u32> = listed.iter().fold(BTreeMap::new(), |mut m, n| {
        *m.entry(n.shard).or_default() += 1;
        m
    });
    for s in c.shards().await.expect("shards") {
        assert_eq!(
            per_shard.get(&s.shard).copied().unwrap_or(0),
            s.nodes,
            "shard {}: the map and the ledger disagree",
            s.shard
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_unequal_zones_on_eight_shards_rebalance_within_the_bound() {
    let c = cluster(8, &["--auto-rebalance", "false"]);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    let sizes = [("a", 40), ("b", 24), ("c", 10), ("d", 6)];
    for (zone, count) in sizes {
        let shards: BTreeSet<u32> = register_zone(&cl, zone, count, "8")
            .await
            .into_values()
            .collect();
        assert_eq!(
            shards.len(),
            1,
            "zone {zone} split at registration: {shards:?}"
        );
    }
    // Each new zone took the least loaded shard: 1, 2, 3, 4; shards 5–8 are empty.
    let before = capacities(&cl).await;
    assert_eq!(before[&1], 40 * 8_000);
    assert_eq!(before[&5], 0);
    let dry = cl.rebalance(0, true).await.expect("plan");
    assert!(dry.moves.is_empty() && !dry.plan.is_empty());
    assert_eq!(dry.peak_percent_before, 400);
    assert!(dry.peak_percent_after <= 125, "{dry:?}");

    let started = Instant::now();
    let reply = cl.rebalance(0, false).await.expect("rebalance");
    eprintln!(
        "rebalanced in {} moves, {:?}: {}% → {}% of the mean",
        reply.moves.len(),
        started.elapsed(),
        reply.peak_percent_before,
        reply.peak_percent_after
    );
    assert!(reply.moves.iter().all(|m| m.phase == "done"), "{reply:?}");
    let after = capacities(&cl).await;
    let total: u64 = after.values().sum();
    assert_eq!(total, 80 * 8_000, "capacity lost or doubled in the moves");
    let mean = total / 8;
    let max = after.values().copied().max().unwrap_or(0);
    assert!(
        max * 100 <= mean * 125,
        "a shard holds {max} millicores, more than 1.25 × the mean {mean}: {after:?}"
    );
    assert_eq!(reply.peak_percent_after, max * 100 / mean);
    assert_one_owner(&cl, 80).await;
    // Zones small enough stayed whole.
    let shards = cl.shards().await.expect("shards");
    for zone in ["c", "d"] {
        let holding = shards
            .iter()
            .filter(|s| s.domains.contains_key(zone))
            .count();
        assert_eq!(holding, 1, "zone {zone} was split: {shards:?}");
    }
    c.wait_converged(&[1, 2, 3], Duration::from_secs(30)).await;
}

/// Submits groups of two one-cpu members one after another (every third released once
/// placed) until `stop`; the ids of the groups acknowledged and of those released.
async fn stream(c: Client, stop: tokio::sync::watch::Receiver<bool>) -> (Vec<u64>, Vec<u64>) {
    let mut submitted = Vec::new();
    let mut released = Vec::new();
    let mut i = 0;
    while !*stop.borrow() {
        let key = format!("stream-{i}");
        let status = c
            .submit(submission(&key, vec![gang(&key, 2, 2, "1", 0)]))
            .await
            .unwrap_or_else(|e| panic!("submission {key} failed: {e}"));
        submitted.push(status.id);
        if i % 3 == 2 {
            let id = submitted[submitted.len() - 2];
            let placed = wait_state(&c, id, "Placed", Duration::from_secs(60)).await;
            assert_eq!(placed.placements.len(), 2);
            c.release(id)
                .await
                .unwrap_or_else(|e| panic!("release {id}: {e}"));
            released.push(id);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (submitted, released)
}

/// Stops `stream` and checks what it was told: every acknowledged group is placed (or
/// was released), on nodes of the shard the map names, and the ledgers hold exactly the
/// placed groups' members. The groups acknowledged, and those released.
async fn stop_and_check_stream(
    cl: &Client,
    stop: tokio::sync::watch::Sender<bool>,
    streamer: tokio::task::JoinHandle<(Vec<u64>, Vec<u64>)>,
    during: &str,
) -> (Vec<u64>, BTreeSet<u64>) {
    stop.send(true).expect("stop");
    let (submitted, released) = streamer.await.expect("stream");
    assert!(
        submitted.len() >= 10,
        "only {} submissions",
        submitted.len()
    );
    eprintln!(
        "{} groups submitted and {} released {during}",
        submitted.len(),
        released.len()
    );
    let released: BTreeSet<u64> = released.into_iter().collect();
    let shard_of = shards_of_nodes(cl).await;
    let mut placed_pods: BTreeMap<String, u32> = BTreeMap::new();
    for id in &submitted {
        let want = if released.contains(id) {
            "Released"
        } else {
            "Placed"
        };
        let s = wait_state(cl, *id, want, Duration::from_secs(60)).await;
        for p in s.placements.iter().filter(|_| want == "Placed") {
            assert_eq!(
                shard_of.get(&p.node),
                Some(&p.shard),
                "{p:?} names a shard the node is not on"
            );
            *placed_pods.entry(p.node.clone()).or_default() += 1;
        }
    }
    let held = support::gangs::held(cl).await;
    assert_eq!(
        held, placed_pods,
        "the ledgers hold other pods than the placed groups list"
    );
    (submitted, released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_moved_under_a_stream_of_submissions_loses_nothing_acknowledged() {
    let c = cluster(2, &["--auto-rebalance", "false"]);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    let a = register_zone(&cl, "a", 8, "4").await;
    let b = register_zone(&cl, "b", 8, "4").await;
    assert!(a.values().all(|s| *s == 1) && b.values().all(|s| *s == 2));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let streamer = tokio::spawn(stream(client(&c, 2).await, stop_rx));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Zone a to shard 2 and back, then half of zone b to shard 1, all while submitting.
    for (domain, to) in [("a", 2), ("a", 1)] {
        let reply = cl
            .move_nodes(Some(domain.into()), Vec::new(), to, true)
            .await
            .expect("move");
        let m = reply.shard_move.expect("move");
        assert_eq!((m.phase.as_str(), m.to), ("done", to), "{m:?}");
    }
    let half: Vec<String> = b.keys().take(4).cloned().collect();
    let reply = cl.move_nodes(None, half, 1, true).await.expect("move");
    assert_eq!(reply.shard_move.map(|m| m.phase), Some("done".to_string()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (submitted, released) =
        stop_and_check_stream(&cl, stop_tx, streamer, "during three moves").await;
    assert_one_owner(&cl, 16).await;
    // Released, every group gives everything back.
    for id in submitted.iter().filter(|id| !released.contains(id)) {
        cl.release(*id).await.expect("release");
        wait_state(&cl, *id, "Released", Duration::from_secs(60)).await;
    }
    assert!(
        support::gangs::held(&cl).await.is_empty(),
        "capacity leaked in the moves"
    );
    c.wait_converged(&[1, 2, 3], Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_rebalances_on_its_own_past_the_bound() {
    let c = cluster(
        2,
        &["--auto-rebalance", "true", "--rebalance-check-ms", "500"],
    );
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    // One zone of 12 nodes lands on shard 1: 200% of the mean.
    register_zone(&cl, "a", 12, "4").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let caps = capacities(&cl).await;
        let (max, total) = (
            caps.values().copied().max().unwrap_or(0),
            caps.values().sum::<u64>(),
        );
        if total > 0 && max * 100 <= total / 2 * 125 {
            break;
        }
        assert!(Instant::now() < deadline, "not rebalanced: {caps:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let moves = cl.shard_moves().await.expect("moves");
    assert!(
        moves
            .iter()
            .any(|m| m.phase == "done" && m.reason.starts_with("rebalance")),
        "{moves:?}"
    );
    assert_one_owner(&cl, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_after_the_handoff_leaves_the_move_to_the_next() {
    let mut c = cluster(2, &["--auto-rebalance", "false", "--test-failpoints"]);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    register_zone(&cl, "a", 4, "4").await;
    register_zone(&cl, "b", 4, "4").await;
    let first = cl
        .submit(submission("before", vec![gang("before", 4, 4, "1", 0)]))
        .await
        .expect("submit");
    wait_state(&cl, first.id, "Placed", Duration::from_secs(30)).await;
    let meta_leader = c.agreed_leader(0, &[1, 2, 3]).await.expect("meta leader");
    // Only the meta leader runs the coordinator: arm the crash point there and restart it.
    c.kill(meta_leader);
    let armed = support::arm_failpoints(&mut Vec::new(), &["coordinator-move-after-handoff"]);
    c.env.extend(armed);
    c.spawn(meta_leader);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let armed_leader = loop {
        let leader = c.agreed_leader(0, &[1, 2, 3]).await.expect("meta leader");
        if leader == meta_leader {
            break leader;
        }
        let status = c
            .admin(leader)
            .await
            .transfer_leader(gangway_proto::admin::TransferLeaderRequest {
                group_id: 0,
                to_node: meta_leader,
            })
            .await;
        assert!(status.is_ok(), "{status:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let survivor = [1, 2, 3]
        .into_iter()
        .find(|id| *id != armed_leader)
        .expect("another");
    let cl = client(&c, survivor).await;
    let reply = cl
        .move_nodes(Some("a".into()), Vec::new(), 2, false)
        .await
        .expect("move");
    let id = reply.shard_move.expect("move").id;
    // The armed coordinator dies after the handoff; another finishes the move.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let moves = cl.shard_moves().await.unwrap_or_default();
        if moves.iter().any(|m| m.id == id && m.phase == "done") {
            break;
        }
        assert!(Instant::now() < deadline, "move {id} not done: {moves:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        c.exited(armed_leader).is_some(),
        "the armed coordinator did not crash"
    );
    assert_one_owner(&cl, 8).await;
    let s = cl.get(first.id).await.expect("group");
    assert_eq!(s.state, "Placed");
    let shard_of = shards_of_nodes(&cl).await;
    for p in &s.placements {
        assert_eq!(shard_of.get(&p.node), Some(&p.shard), "{p:?}");
    }
    cl.release(first.id).await.expect("release");
    wait_state(&cl, first.id, "Released", Duration::from_secs(30)).await;
    assert!(support::gangs::held(&cl).await.is_empty());
}

/// The first rollout of an upgrade (replicas writing JSON beside a release that reads
/// nothing else): new nodes get their shard by the old hash rule (nodes of one zone
/// together, whichever shard is emptiest), and no move is begun, by hand or on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_writing_for_the_first_rollout_moves_nothing() {
    let c = cluster(2, &["--wire-format", "json", "--rebalance-check-ms", "200"]);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    let a = register_zone(&cl, "a", 6, "4").await;
    let shards: BTreeSet<u32> = a.values().copied().collect();
    assert_eq!(shards.len(), 1, "one zone, one shard: {a:?}");
    let expected = gangway_core::ledger::meta::hashed_shard("x", Some("a"), 2);
    assert_eq!(shards.into_iter().next(), Some(expected));
    let refused = cl
        .move_nodes(Some("a".into()), Vec::new(), 3 - expected, true)
        .await
        .expect_err("a move while writing for the first rollout");
    assert!(refused.to_string().contains("first rollout"), "{refused}");
    // Past the bound (all on one shard) for many checks: still no move.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(cl.shard_moves().await.expect("moves").is_empty());
    // Nor a grow of the shard count, which the release before could not read either.
    let (code, msg) = refusal(cl.grow_shards(3).await);
    assert_eq!(code, tonic::Code::FailedPrecondition, "{msg}");
    assert!(msg.contains("first rollout"), "{msg}");
    assert_eq!(cl.shards().await.expect("shards").len(), 2);
}

/// The status code and message of a failed call.
fn refusal<T: std::fmt::Debug>(r: Result<T, gangway_client::ClientError>) -> (tonic::Code, String) {
    match r {
        Err(gangway_client::ClientError::Rpc(s)) => (s.code(), s.message().to_string()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// `gangctl shards grow` on a live cluster: two shards become four under a stream of
/// submissions and releases; every replica opens the added shards' groups; a rebalance
/// fills them; a new zone goes to the emptiest; nothing acknowledged is lost; and a
/// replica restarted with the `--shards` the cluster was created with opens them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_count_grows_on_a_live_cluster_and_a_restarted_replica_follows() {
    let mut c = cluster(2, &["--auto-rebalance", "false"]);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    register_zone(&cl, "a", 8, "4").await;
    register_zone(&cl, "b", 8, "4").await;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let streamer = tokio::spawn(stream(client(&c, 2).await, stop_rx));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Bad counts are refused naming the field, and change nothing.
    for (bad, code) in [
        (0, tonic::Code::InvalidArgument),
        (257, tonic::Code::InvalidArgument),
        (1, tonic::Code::FailedPrecondition),
    ] {
        let (got, msg) = refusal(cl.grow_shards(bad).await);
        assert_eq!(got, code, "{bad}: {msg}");
        assert!(msg.starts_with("shards:"), "{msg}");
    }
    assert_eq!(cl.shards().await.expect("shards").len(), 2);

    let grown = client(&c, 3).await.grow_shards(4).await.expect("grow");
    assert_eq!((grown.shards_before, grown.shards), (2, 4), "{grown:?}");
    assert_eq!(grown.ready, vec![3, 4], "{grown:?}");
    let again = cl.grow_shards(4).await.expect("grow again");
    assert_eq!(
        (again.shards_before, again.shards),
        (4, 4),
        "a retried grow changes nothing"
    );

    // Every replica serves the four shards, each with a leader.
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    for id in [1, 2, 3] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let shards = client(&c, id).await.shards().await.expect("shards");
            if shards.len() == 4 && shards.iter().all(|s| s.leader != 0) {
                break;
            }
            assert!(Instant::now() < deadline, "replica {id}: {shards:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // The added shards start empty; a rebalance fills them within the bound.
    let reply = cl.rebalance(0, false).await.expect("rebalance");
    assert!(!reply.moves.is_empty(), "{reply:?}");
    assert!(reply.peak_percent_after <= 125, "{reply:?}");
    let caps = capacities(&cl).await;
    assert!(
        caps.values().all(|c| *c > 0),
        "an added shard is still empty: {caps:?}"
    );
    // A new zone goes to a least loaded shard, which may be an added one.
    let c_zone = register_zone(&cl, "c", 2, "4").await;
    assert!(c_zone.values().all(|s| (1..=4).contains(s)), "{c_zone:?}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let (submitted, released) = stop_and_check_stream(
        &cl,
        stop_tx,
        streamer,
        "while the cluster grew and rebalanced",
    )
    .await;
    assert_one_owner(&cl, 18).await;

    // A replica restarted with the count the cluster was created with opens the added
    // shards again once its meta replica applied the grow, and catches up on them.
    c.kill(3);
    c.spawn(3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let all = c.wait_converged(&[1, 2, 3], Duration::from_secs(60)).await;
    for groups in &all {
        let ids: Vec<u64> = groups.iter().map(|g| g.group_id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4], "{groups:?}");
    }
    // The added shards take part in placements after the restart too.
    for id in submitted.iter().filter(|id| !released.contains(id)) {
        cl.release(*id).await.expect("release");
        wait_state(&cl, *id, "Released", Duration::from_secs(60)).await;
    }
    let wide = cl
        .submit(submission("wide", vec![gang("wide", 16, 16, "3", 0)]))
        .await
        .expect("submit");
    let placed = wait_state(&cl, wide.id, "Placed", Duration::from_secs(60)).await;
    let shards: BTreeSet<u32> = placed.placements.iter().map(|p| p.shard).collect();
    assert!(shards.contains(&3) || shards.contains(&4), "{shards:?}");
    cl.release(wide.id).await.expect("release");
    wait_state(&cl, wide.id, "Released", Duration::from_secs(60)).await;
    assert!(
        support::gangs::held(&cl).await.is_empty(),
        "capacity leaked"
    );
}

/// A replica that is down while the cluster grows: the added shard's designated
/// initializer is that replica, so the others create the group after the fallback
/// delay; back (with the `--shards` it was created with), the replica opens the shard,
/// its own initialization of a group that already runs changes nothing, and it catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_down_while_the_cluster_grows_opens_the_added_shard_when_back() {
    let mut c = cluster(2, &["--auto-rebalance", "false"]);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 2).await;
    register_zone(&cl, "a", 2, "4").await;
    register_zone(&cl, "b", 2, "4").await;
    // Shard 3's designated initializer is voter 1 (3 mod 3 = 0, the first voter).
    c.kill(1);
    let grown = cl.grow_shards(3).await.expect("grow with a replica down");
    assert_eq!((grown.shards_before, grown.shards), (2, 3), "{grown:?}");
    assert_eq!(grown.ready, vec![3], "{grown:?}");
    let reply = cl
        .move_nodes(Some("b".into()), Vec::new(), 3, true)
        .await
        .expect("move onto the added shard");
    assert_eq!(reply.shard_move.map(|m| m.phase), Some("done".to_string()));
    let before = cl
        .submit(submission("before", vec![gang("before", 4, 4, "3", 0)]))
        .await
        .expect("submit");
    wait_state(&cl, before.id, "Placed", Duration::from_secs(30)).await;

    c.spawn(1);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let all = c.wait_converged(&[1, 2, 3], Duration::from_secs(60)).await;
    for groups in &all {
        let ids: Vec<u64> = groups.iter().map(|g| g.group_id).collect();
        assert_eq!(ids, vec![0, 1, 2, 3], "{groups:?}");
        assert!(
            groups.iter().all(|g| g.voters == vec![1, 2, 3]),
            "{groups:?}"
        );
    }
    // Through the replica that was down: the placement and shard 3 are there.
    let via1 = client(&c, 1).await;
    let s = via1.get(before.id).await.expect("group");
    assert_eq!(s.state, "Placed");
    assert!(
        s.placements.iter().any(|p| p.shard == 3),
        "{:?}",
        s.placements
    );
    assert_eq!(via1.shards().await.expect("shards").len(), 3);
    via1.release(before.id).await.expect("release");
    wait_state(&via1, before.id, "Released", Duration::from_secs(30)).await;
    assert!(
        support::gangs::held(&via1).await.is_empty(),
        "capacity leaked"
    );
    assert_one_owner(&via1, 4).await;
}
