//! Reservations for the head of the line, with backfill, through real `gangway serve`
//! processes (docs/ARCHITECTURE.md §4, "Reservations"). Four nodes of 4 cpu over two
//! shards are held by four one-node groups: two declare run-time limits (4 s and 14 s),
//! two run on. A two-node gang then lacks room: gangway reserves the two nodes whose
//! groups end first, and the reservation is the same after the meta leader is killed. When
//! the first of those nodes frees, a group that runs on (no limit) is kept off it, while a
//! group whose 2 s limit ends before the gang's start backfills it; both limited groups
//! are released at their limits; the gang starts on its reserved nodes when the second
//! frees, and the group that runs on, now first in line, holds a reservation with no
//! known start. Under the bug switch `coordinator-ignores-reservations`, the unlimited group
//! takes the freed node, which the second test tells apart.

mod support;

use std::time::{Duration, Instant};

use gangway_client::Client;
use gangway_proto::admin::HeadReservation;
use gangway_proto::v1::SubmitGangGroupRequest;
use support::gangs::{fleet, gang, submission, wait_state};
use support::{client, Cluster};

/// A group of `members` members of 4 cpu (a whole node each) running at most
/// `limit_s` seconds (0: no limit).
fn whole_nodes(key: &str, members: u32, limit_s: u64) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        run_limit_seconds: limit_s,
        ..submission(key, vec![gang(key, members, members, "4", 0)])
    }
}

/// The reservations, read until one is held for `group` (or `timeout` passes).
async fn reservation_for(cl: &Client, group: u64, timeout: Duration) -> HeadReservation {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(list) = cl.reservations().await {
            if let Some(r) = list.into_iter().find(|r| r.group == group) {
                return r;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no reservation for gang group {group} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reserved_nodes(r: &HeadReservation) -> Vec<String> {
    let mut nodes: Vec<String> = r.nodes.iter().flat_map(|s| s.nodes.clone()).collect();
    nodes.sort();
    nodes
}

/// The node group `id` is placed on (its first member's).
async fn node_of(cl: &Client, id: u64) -> String {
    let s = cl.get(id).await.expect("get");
    s.placements
        .first()
        .map(|p| p.node.clone())
        .unwrap_or_default()
}

/// Places the four holders; their ids, first two limited to 4 s and 14 s.
async fn hold_every_node(cl: &Client) -> [u64; 4] {
    let mut ids = [0u64; 4];
    for (i, limit_s) in [4u64, 14, 0, 0].into_iter().enumerate() {
        let key = format!("holder-{i}");
        let g = cl
            .submit(whole_nodes(&key, 1, limit_s))
            .await
            .expect("holder");
        wait_state(cl, g.id, "Placed", Duration::from_secs(10)).await;
        ids[i] = g.id;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_gang_starts_on_its_nodes_while_only_groups_that_end_first_backfill_them() {
    let mut c = Cluster::start_with(
        3,
        2,
        vec!["--head-reservations".into(), "backfill".into()],
        Vec::new(),
    );
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 2, "4").await;
    let holders = hold_every_node(&cl).await;
    let first_free = [
        node_of(&cl, holders[0]).await,
        node_of(&cl, holders[1]).await,
    ];

    let big = cl.submit(whole_nodes("big", 2, 0)).await.expect("big");
    let held = reservation_for(&cl, big.id, Duration::from_secs(10)).await;
    let mut expected = first_free.to_vec();
    expected.sort();
    assert_eq!(
        reserved_nodes(&held),
        expected,
        "the nodes that free first: {held:?}"
    );
    assert!(
        held.starts_by_ms > 0,
        "every holder there declared a limit: {held:?}"
    );
    let s = cl.get(big.id).await.expect("get");
    assert!(s.reason.contains("2 nodes reserved for it"), "{}", s.reason);

    // A new meta leader holds the same reservation.
    let cl = support::kill_meta_leader(&mut c).await;
    let after = reservation_for(&cl, big.id, Duration::from_secs(20)).await;
    assert_eq!(after, held, "the reservation after the meta failover");

    // The 4 s holder is released at its limit, by gangway.
    let released = wait_state(&cl, holders[0], "Released", Duration::from_secs(15)).await;
    assert!(
        released.reason.contains("run-time limit"),
        "{}",
        released.reason
    );
    let runs_on = cl
        .submit(whole_nodes("runs-on", 1, 0))
        .await
        .expect("runs-on");
    let quick = cl.submit(whole_nodes("quick", 1, 2)).await.expect("quick");
    wait_state(&cl, quick.id, "Placed", Duration::from_secs(10)).await;
    assert_eq!(node_of(&cl, quick.id).await, first_free[0], "backfilled");
    wait_state(&cl, quick.id, "Released", Duration::from_secs(10)).await;
    let waiting = cl.get(runs_on.id).await.expect("get");
    assert_eq!(
        waiting.state, "Queued",
        "kept off the reserved nodes: {waiting:?}"
    );
    assert!(
        waiting.reason.contains("reserved for groups ahead of it"),
        "{}",
        waiting.reason
    );

    // The gang starts on its reserved nodes once the 14 s holder is released.
    let placed = wait_state(&cl, big.id, "Placed", Duration::from_secs(25)).await;
    let mut on: Vec<String> = placed.placements.iter().map(|p| p.node.clone()).collect();
    on.sort();
    assert_eq!(on, expected);
    let deadline = Instant::now() + Duration::from_secs(5);
    let holds_one = |list: &[HeadReservation]| list.iter().any(|r| r.group == big.id);
    while holds_one(&cl.reservations().await.expect("list")) {
        assert!(
            Instant::now() < deadline,
            "the placed gang's reservation stayed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Now the head of the line, the group that runs on holds one with no known start
    // (nothing placed declares when it ends).
    let next = reservation_for(&cl, runs_on.id, Duration::from_secs(10)).await;
    assert_eq!(next.starts_by_ms, 0, "{next:?}");
    assert_eq!(cl.get(runs_on.id).await.expect("get").state, "Queued");
    cl.release(big.id).await.expect("release");
    wait_state(&cl, runs_on.id, "Placed", Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_that_ignores_reservations_lets_a_group_that_runs_on_take_the_freed_node() {
    let mut args = vec!["--head-reservations".into(), "backfill".into()];
    let env = support::arm_failpoints(
        &mut args,
        &[gangway_server::failpoints::RESERVATIONS_IGNORED],
    );
    let c = Cluster::start_with(1, 1, args, env);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    // A run-time limit past a year is refused, naming the field.
    let err = cl
        .submit(whole_nodes("forever", 1, 366 * 24 * 3_600))
        .await
        .expect_err("past a year");
    let gangway_client::ClientError::Rpc(status) = err else {
        panic!("expected a status, got {err:?}");
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("run_limit_seconds"),
        "{}",
        status.message()
    );
    fleet(&cl, 1, 4, "4").await;
    let holders = hold_every_node(&cl).await;
    let big = cl.submit(whole_nodes("big", 2, 0)).await.expect("big");
    reservation_for(&cl, big.id, Duration::from_secs(10)).await;
    wait_state(&cl, holders[0], "Released", Duration::from_secs(15)).await;
    let runs_on = cl
        .submit(whole_nodes("runs-on", 1, 0))
        .await
        .expect("runs-on");
    // Caught: the group that never ends takes the reserved node, delaying the gang.
    wait_state(&cl, runs_on.id, "Placed", Duration::from_secs(10)).await;
}
