//! Gang placement across shards with real `gangway serve` processes: strict
//! groups are all-or-nothing on every shard's ledger, the same idempotency key
//! yields one group, the seeds' resource-deadlock case, waitTime expiry, and
//! the coordinator killed between reserve and decide and between decide and
//! commit (through test failpoints).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use support::gangs::{fleet, gang, held, submission, wait_state};
use support::{client, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_group_across_three_shards_is_all_or_nothing() {
    let c = Cluster::start(3, 3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 3, 2, "4").await;

    // Six 4-cpu members on six 4-cpu nodes, two per shard: only all three shards together fit it.
    let first = cl
        .submit(submission("train-1", vec![gang("train", 6, 6, "4", 0)]))
        .await
        .expect("submit");
    let placed = cl
        .watch_until(first.id, |s| s.state == "Placed")
        .await
        .expect("watch");
    assert_eq!(placed.state, "Placed", "{placed:?}");
    let shards: BTreeSet<u32> = placed.placements.iter().map(|p| p.shard).collect();
    assert_eq!(
        shards.len(),
        3,
        "spans three shards: {:?}",
        placed.placements
    );
    let on_ledgers = held(&cl).await;
    assert_eq!(on_ledgers.values().sum::<u32>(), 6, "{on_ledgers:?}");
    assert!(on_ledgers.values().all(|p| *p == 1));

    // The same key again: the same group, no second placement.
    let again = cl
        .submit(submission("train-1", vec![gang("train", 6, 6, "4", 0)]))
        .await
        .expect("resubmit");
    assert_eq!(again.id, first.id);
    assert_eq!(held(&cl).await.values().sum::<u32>(), 6);

    // A second gang cannot fit while the first holds everything: it waits and holds nothing.
    let second = cl
        .submit(submission("train-2", vec![gang("train2", 2, 2, "4", 0)]))
        .await
        .expect("submit");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let waiting = cl.get(second.id).await.expect("get");
    assert_eq!(waiting.state, "Queued", "{waiting:?}");
    assert!(!waiting.reason.is_empty(), "says why it waits");
    assert_eq!(
        held(&cl).await.values().sum::<u32>(),
        6,
        "the waiting gang holds nothing"
    );

    // One member finishes: only its node is given back, the rest stay placed.
    let one = &placed.placements[0];
    let name = format!("{}/{}/{}", one.namespace, one.gang, one.member);
    let after = cl
        .release_members(first.id, vec![name.clone()])
        .await
        .expect("release one member");
    assert_eq!(
        (after.state.as_str(), after.placements.len()),
        ("Placed", 5)
    );
    assert_eq!(held(&cl).await.values().sum::<u32>(), 5);
    let err = cl
        .release_members(first.id, vec![name])
        .await
        .expect_err("already released");
    assert!(err.to_string().contains("not a placed member"), "{err}");

    // Releasing the first lets the second in.
    cl.release(first.id).await.expect("release");
    wait_state(&cl, first.id, "Released", Duration::from_secs(10)).await;
    wait_state(&cl, second.id, "Placed", Duration::from_secs(10)).await;
    assert_eq!(held(&cl).await.values().sum::<u32>(), 2);

    // Invalid submissions name the field and store nothing.
    let mut bad = gang("bad", 2, 3, "1", 0);
    let err = cl
        .submit(submission("bad", vec![bad.clone()]))
        .await
        .expect_err("minMember > totalNumber");
    assert!(err.to_string().contains("minMember"), "{err}");
    bad.min_member = 1;
    bad.members[0].pod_json = "{\"requests\": {\"cpu\": \"-1\"}}".into();
    let err = cl
        .submit(submission("bad", vec![bad.clone()]))
        .await
        .expect_err("negative cpu");
    assert!(err.to_string().contains("requests.cpu"), "{err}");
    bad.members[0].pod_json = "{\"requests\": ".into();
    let err = cl
        .submit(submission("bad", vec![bad]))
        .await
        .expect_err("malformed json");
    assert!(
        err.to_string().contains("gangs[0].members[0].pod_json"),
        "{err}"
    );
    assert_eq!(cl.list_groups(true).await.expect("list").len(), 2);

    // Listing changes: everything from 0, nothing after the stamp, pages by limit,
    // then only what changed.
    let all = cl.list_changes(0, 0).await.expect("changes from 0");
    assert_eq!((all.groups.len(), all.more), (2, false), "{all:?}");
    assert!(all.stamp > 0);
    let stamp = all.stamp;
    let none = cl.list_changes(stamp, 0).await.expect("no changes");
    assert!(none.groups.is_empty() && !none.more, "{none:?}");
    assert_eq!(none.stamp, stamp);
    let page = cl.list_changes(0, 1).await.expect("first page");
    assert_eq!((page.groups.len(), page.more), (1, true));
    let rest = cl.list_changes(page.stamp, 1).await.expect("second page");
    assert_eq!((rest.groups.len(), rest.more), (1, false));
    assert_ne!(page.groups[0].id, rest.groups[0].id, "each group once");
    let err = cl
        .list_changes(0, 10_001)
        .await
        .expect_err("limit above the bound");
    assert!(err.to_string().contains("limit"), "{err}");
    cl.release(second.id).await.expect("release the second");
    wait_state(&cl, second.id, "Released", Duration::from_secs(10)).await;
    let changed = cl.list_changes(stamp, 0).await.expect("changes").groups;
    assert!(
        !changed.is_empty() && changed.iter().all(|g| g.id == second.id),
        "only the released group changed: {changed:?}"
    );
    assert_eq!(changed.last().map(|g| g.state.as_str()), Some("Released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_case_and_wait_time_expiry() {
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 2).await;
    // Capacity 10: ten 1-cpu nodes, five per shard.
    fleet(&cl, 2, 5, "1").await;

    // Three strict gangs of 5 submitted together: never three half-placed gangs.
    let mut ids = Vec::new();
    for k in 0..3 {
        let s = cl
            .submit(submission(
                &format!("dl-{k}"),
                vec![gang(&format!("dl{k}"), 5, 5, "1", 0)],
            ))
            .await
            .expect("submit");
        ids.push(s.id);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut placed = 0;
    for id in &ids {
        if cl.get(*id).await.expect("get").state == "Placed" {
            placed += 1;
        }
    }
    assert!(placed >= 1, "at least one gang placed");
    assert_eq!(
        held(&cl).await.values().sum::<u32>(),
        5 * placed,
        "only placed gangs hold capacity"
    );

    // A gang that cannot fit before its waitTime ends timed out, holding nothing.
    let late = cl
        .submit(submission("late", vec![gang("late", 20, 20, "1", 1_000)]))
        .await
        .expect("submit");
    let watch = cl.watch_until(late.id, |_| false);
    let end = tokio::time::timeout(Duration::from_secs(30), watch)
        .await
        .expect("ended within 30 s")
        .expect("watch");
    assert_eq!(end.state, "TimedOut", "{end:?}");
    assert_eq!(held(&cl).await.values().sum::<u32>(), 5 * placed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_strict_accumulates_across_rounds_and_wait_time_releases_all() {
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 1, "1").await;

    // Four 1-cpu members, two nodes: two are placed and held while the gang waits.
    let mut g = gang("ns", 4, 4, "1", 0);
    g.mode = "NonStrict".into();
    let s = cl
        .submit(submission("ns-1", vec![g]))
        .await
        .expect("submit");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = cl.get(s.id).await.expect("get");
        if now.placements.len() == 2 {
            assert_eq!(now.state, "Queued", "{now:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "two members never accumulated: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        held(&cl).await.values().sum::<u32>(),
        2,
        "accumulated members hold their nodes"
    );
    // More capacity arrives: the rest is placed in a later round.
    fleet(&cl, 2, 2, "1").await;
    let placed = wait_state(&cl, s.id, "Placed", Duration::from_secs(10)).await;
    assert_eq!(placed.placements.len(), 4);

    // A NonStrict gang that never reaches minMember releases what it held when waitTime passes.
    let mut g = gang("ns2", 3, 3, "1", 1_500);
    g.mode = "NonStrict".into();
    let before = held(&cl).await.values().sum::<u32>();
    fleet(&cl, 2, 3, "1").await;
    let s = cl
        .submit(submission("ns-2", vec![g]))
        .await
        .expect("submit");
    let watch = cl.watch_until(s.id, |_| false);
    let end = tokio::time::timeout(Duration::from_secs(30), watch)
        .await
        .expect("ended")
        .expect("watch");
    assert_eq!(end.state, "TimedOut", "{end:?}");
    assert_eq!(
        held(&cl).await.values().sum::<u32>(),
        before,
        "everything it held was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_leader_killed_during_reserve() {
    let mut c = Cluster::start(3, 3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 3, 2, "4").await;
    for (round, delay_ms) in [(0u64, 0u64), (1, 25), (2, 60)] {
        // Twelve 1-cpu members: more than one shard's 8 cpus, so at least two shards reserve.
        let shard = 1 + (round % 3);
        let victim = c
            .agreed_leader(shard, &[1, 2, 3])
            .await
            .expect("shard leader");
        let via = [1, 2, 3]
            .into_iter()
            .find(|id| *id != victim)
            .expect("another process");
        let cl = client(&c, via).await;
        let key = format!("pk-{round}");
        let s = cl
            .submit(submission(&key, vec![gang(&key, 12, 12, "1", 0)]))
            .await
            .expect("submit");
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        c.kill(victim);
        let placed = wait_state(&cl, s.id, "Placed", Duration::from_secs(30)).await;
        assert_eq!(placed.placements.len(), 12);
        let placed_nodes: BTreeMap<String, u32> =
            placed.placements.iter().fold(BTreeMap::new(), |mut m, p| {
                *m.entry(p.node.clone()).or_default() += 1;
                m
            });
        // No reservation is left half: ledgers hold exactly the placed members.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let h = held(&cl).await;
            if h == placed_nodes {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: ledgers hold {h:?}, placed {placed_nodes:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cl.release(s.id).await.expect("release");
        wait_state(&cl, s.id, "Released", Duration::from_secs(10)).await;
        c.spawn(victim);
        c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
        assert!(
            held(&cl).await.is_empty(),
            "round {round}: everything released"
        );
    }
    c.wait_converged(&[1, 2, 3], Duration::from_secs(20)).await;
}

async fn coordinator_crash(failpoint: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = vec![
        ("GANGWAY_TEST_FAILPOINTS".to_string(), failpoint.to_string()),
        (
            "GANGWAY_TEST_FAILPOINT_DIR".to_string(),
            dir.path().display().to_string(),
        ),
    ];
    let mut c = Cluster::start_with(3, 3, vec!["--test-failpoints".into()], env);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let meta_leader = c.agreed_leader(0, &[1, 2, 3]).await.expect("meta leader");
    let via = [1, 2, 3]
        .into_iter()
        .find(|id| *id != meta_leader)
        .expect("a follower");
    let cl = client(&c, via).await;
    fleet(&cl, 3, 2, "4").await;

    let g = cl
        .submit(submission("crash", vec![gang("crash", 6, 6, "4", 0)]))
        .await
        .expect("submit");
    // The meta leader's coordinator reaches the failpoint and dies; another takes over.
    support::wait_for_failpoint(dir.path(), failpoint, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.kill(meta_leader);
    let placed = wait_state(&cl, g.id, "Placed", Duration::from_secs(30)).await;
    assert_eq!(placed.placements.len(), 6);
    // Every reservation resolved: exactly the six placed members are held, once each.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let h = held(&cl).await;
        let placed_nodes: BTreeSet<String> =
            placed.placements.iter().map(|p| p.node.clone()).collect();
        let held_nodes: BTreeSet<String> = h.keys().cloned().collect();
        if h.values().sum::<u32>() == 6 && held_nodes == placed_nodes {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ledgers hold {h:?}, placements {:?}",
            placed.placements
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The crashed process comes back and agrees.
    c.spawn(meta_leader);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    c.wait_converged(&[1, 2, 3], Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_between_reserve_and_decide() {
    coordinator_crash("coordinator-after-reserve").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_killed_between_decide_and_commit() {
    coordinator_crash("coordinator-after-decide").await;
}

/// A full window of groups that fit nowhere (the coordinator reads 256 pending groups a
/// round) ahead of one that fits, on one replica; answers whether that one was placed
/// within `within`. The groups retry on their backoff (`coordinator-never-parks`): parked
/// groups are out of the window anyway (`ledger/meta/parking_tests.rs`).
async fn placed_behind_a_window_of_groups_that_fit_nowhere(
    failpoints: &[&str],
    within: Duration,
) -> bool {
    let mut args = Vec::new();
    let mut failpoints = failpoints.to_vec();
    failpoints.push("coordinator-never-parks");
    let env = support::arm_failpoints(&mut args, &failpoints);
    let c = Cluster::start_with(1, 1, args, env);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 1, 1, "4").await;
    let submits = (0..260).map(|i| {
        let cl = cl.clone();
        async move {
            let key = format!("huge-{i:03}");
            cl.submit(submission(&key, vec![gang(&key, 1, 1, "64", 0)]))
                .await
                .expect("submit a group that fits nowhere")
        }
    });
    futures::future::join_all(submits).await;
    let fits = cl
        .submit(submission("fits", vec![gang("fits", 1, 1, "1", 0)]))
        .await
        .expect("submit");
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cl.get(fits.id).await.expect("get").state == "Placed" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_that_fit_nowhere_do_not_stop_the_groups_behind_them() {
    assert!(
        placed_behind_a_window_of_groups_that_fit_nowhere(&[], Duration::from_secs(30)).await,
        "the group that fits was placed while 260 that fit nowhere wait ahead of it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_window_held_by_groups_in_backoff() {
    assert!(
        !placed_behind_a_window_of_groups_that_fit_nowhere(
            &["pending-keeps-backed-off-groups"],
            Duration::from_secs(10)
        )
        .await,
        "with the switch on, 256 groups waiting out their backoff hold the window"
    );
}
