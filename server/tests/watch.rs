//! Watching gang groups as a framework does, with three `gangway serve` processes: a
//! stream of every group of one namespace (none of another's), resumed on another
//! replica after the one it was on is killed, from the last version received: every
//! change made meanwhile arrives, and nothing twice; a single group's watch resumed
//! the same way.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_proto::v1::GangGroupStatus;
use support::gangs::{fleet, gang, submission, wait_state};
use support::{client, Cluster};

/// The longest wait for a status on a stream.
const NEXT_S: u64 = 20;

/// The next status on `stream`, failing the test past `NEXT_S`.
async fn next(stream: &mut tonic::Streaming<GangGroupStatus>) -> GangGroupStatus {
    tokio::time::timeout(Duration::from_secs(NEXT_S), stream.message())
        .await
        .expect("a status in time")
        .expect("the stream")
        .expect("not ended")
}

/// Reads `stream` until `done` holds for the latest status of every group seen;
/// answers those latest statuses and every version received, in order.
async fn read_until(
    stream: &mut tonic::Streaming<GangGroupStatus>,
    mut done: impl FnMut(&BTreeMap<u64, GangGroupStatus>) -> bool,
) -> (BTreeMap<u64, GangGroupStatus>, Vec<u64>) {
    let mut latest = BTreeMap::new();
    let mut versions = Vec::new();
    while !done(&latest) {
        let s = next(stream).await;
        versions.push(s.version);
        latest.insert(s.id, s);
    }
    (latest, versions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_stream_resumes_on_another_replica_without_a_missed_change() {
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(20)).await;
    let on_1 = client(&c, 1).await;
    fleet(&on_1, 2, 2, "4").await;

    let mut other = gang("other", 1, 1, "1", 0);
    other.namespace = "team-b".into();
    let placed = on_1
        .submit(submission("placed", vec![gang("placed", 2, 2, "1", 0)]))
        .await
        .expect("submit");
    let theirs = on_1
        .submit(submission("theirs", vec![other]))
        .await
        .expect("submit");
    let too_big = on_1
        .submit(submission("too-big", vec![gang("too-big", 1, 1, "64", 0)]))
        .await
        .expect("submit");
    wait_state(&on_1, placed.id, "Placed", Duration::from_secs(20)).await;
    wait_state(&on_1, theirs.id, "Placed", Duration::from_secs(20)).await;

    let mut stream = on_1.watch_groups("team-a", "", 0).await.expect("watch");
    let (seen, versions) = read_until(&mut stream, |l| {
        l.get(&placed.id).is_some_and(|s| s.state == "Placed") && l.contains_key(&too_big.id)
    })
    .await;
    assert!(
        !seen.contains_key(&theirs.id),
        "another namespace's group: {seen:?}"
    );
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "oldest change first: {versions:?}"
    );
    let last = *versions.last().expect("a version");

    // The replica the stream was on goes; meanwhile both groups change.
    drop(stream);
    c.kill(1);
    let on_2 = client(&c, 2).await;
    on_2.release(placed.id).await.expect("release");
    on_2.cancel(too_big.id).await.expect("cancel");
    wait_state(&on_2, placed.id, "Released", Duration::from_secs(20)).await;

    let mut resumed = on_2.watch_groups("team-a", "", last).await.expect("resume");
    let (after, versions) = read_until(&mut resumed, |l| {
        l.get(&placed.id).is_some_and(|s| s.state == "Released")
            && l.get(&too_big.id).is_some_and(|s| s.state == "Cancelled")
    })
    .await;
    assert!(
        versions.iter().all(|v| *v > last),
        "nothing twice: {versions:?} after {last}"
    );
    assert!(!after.contains_key(&theirs.id));

    // One group's watch resumes the same way: from before its end, the end; from its
    // end, nothing more.
    let end = &after[&placed.id];
    let mut one = on_2.watch(placed.id, last).await.expect("watch one");
    assert_eq!(next(&mut one).await.state, "Released");
    let mut done = on_2.watch(placed.id, end.version).await.expect("watch one");
    let rest = tokio::time::timeout(Duration::from_secs(NEXT_S), done.message())
        .await
        .expect("the stream of an ended group ends");
    assert!(matches!(rest, Ok(None)), "nothing after its end: {rest:?}");
}
