//! Event-driven requeueing with real `gangway serve` processes (docs/ARCHITECTURE.md §4,
//! "Parking"): a group that fits nowhere is parked, not retried on its backoff; it
//! stays parked while only changes that cannot help it happen (room freed, for a group
//! no node's labels admit or one larger than every node); a change that can (a matching node, a larger one) places it
//! at once, long before the safety net; a new meta leader looks at every parked group
//! once and parks it again. With the switch `coordinator-never-parks` (the blind
//! backoff) the same idle minute costs attempt after attempt, which the test tells
//! apart.

mod support;

use std::time::{Duration, Instant};

use gangway_proto::v1::{GangSpec, MemberSpec, NodeSpec};
use support::gangs::{fleet, gang, submission, wait_state};
use support::{client, Cluster};

/// A one-member gang whose pod asks `cpu` and, when given, a `gpu` node label.
fn one(name: &str, cpu: &str, gpu: Option<&str>) -> GangSpec {
    let selector = gpu.map_or(String::new(), |g| {
        format!(r#", "nodeSelector": {{"gpu": "{g}"}}"#)
    });
    GangSpec {
        members: vec![MemberSpec {
            name: "worker".into(),
            count: 1,
            pod_json: format!(r#"{{"requests": {{"cpu": "{cpu}", "memory": "1Gi"}}{selector}}}"#),
            pods: None,
        }],
        ..gang(name, 1, 1, cpu, 0)
    }
}

fn labelled(name: &str, cpu: &str, gpu: &str) -> NodeSpec {
    let mut spec = support::node_spec(name, cpu, false);
    spec.labels.insert("gpu".into(), gpu.into());
    spec
}

/// Group `id`'s attempts, once its reason says it is parked (or after 10 s, whatever
/// they are).
async fn attempts_once_parked(cl: &gangway_client::Client, id: u64) -> (u32, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = cl.get(id).await.expect("get");
        if s.reason.contains("parked") || Instant::now() > deadline {
            return (s.attempts, s.reason);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_fits_nowhere_waits_parked_until_a_change_can_help_it() {
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 1, "4").await;

    let selector = cl
        .submit(submission("h100", vec![one("h100", "1", Some("h100"))]))
        .await
        .expect("h100");
    let too_big = cl
        .submit(submission("big", vec![one("big", "6", None)]))
        .await
        .expect("big");
    let (parked_at, reason) = attempts_once_parked(&cl, selector.id).await;
    assert!(
        reason.contains("didn't match Pod's node affinity/selector")
            && reason.ends_with("parked until the nodes change or room frees"),
        "{reason}"
    );
    let (big_parked_at, big_reason) = attempts_once_parked(&cl, too_big.id).await;
    assert!(
        big_reason.contains("node(s) had less allocatable cpu than the pod requests")
            && big_reason.ends_with("parked until the nodes change or room frees"),
        "{big_reason}"
    );

    // Room freed again and again: it cannot help a group no node's labels admit, nor
    // one larger than every node.
    for i in 0..6 {
        let key = format!("churn-{i}");
        let g = cl
            .submit(submission(&key, vec![gang(&key, 2, 2, "2", 0)]))
            .await
            .expect("churn");
        wait_state(&cl, g.id, "Placed", Duration::from_secs(10)).await;
        cl.release(g.id).await.expect("release");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = cl.get(selector.id).await.expect("get");
    assert_eq!(
        s.attempts, parked_at,
        "nothing that could help it happened: {s:?}"
    );
    let s = cl.get(too_big.id).await.expect("get");
    assert_eq!(
        s.attempts, big_parked_at,
        "room freed on nodes smaller than its request cannot help it: {s:?}"
    );

    // A new meta leader looks at every parked group once, and parks it again.
    let cl = support::kill_meta_leader(&mut c).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let after_failover = loop {
        if let Ok(s) = cl.get(selector.id).await {
            if s.attempts > parked_at && s.reason.contains("parked") {
                break s.attempts;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the new leader never looked at the parked group"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = cl.get(selector.id).await.expect("get");
    assert_eq!(s.attempts, after_failover, "parked again: {s:?}");

    // A node it matches, and a node large enough: both are placed at once, long
    // before the safety net.
    let woken_at = Instant::now();
    cl.register_node(labelled("gpu-node", "4", "h100"))
        .await
        .expect("register");
    cl.register_node(support::node_spec("big-node", "8", false))
        .await
        .expect("register");
    let placed = wait_state(&cl, selector.id, "Placed", Duration::from_secs(10)).await;
    let on = placed.placements.first().map(|p| p.node.clone());
    assert_eq!(on.as_deref(), Some("gpu-node"));
    wait_state(&cl, too_big.id, "Placed", Duration::from_secs(10)).await;
    assert!(
        woken_at.elapsed() < Duration::from_secs(20),
        "woken by the change, not the safety net (30 s and more)"
    );
}

/// Attempts a group that fits nowhere makes in `idle` after it first failed.
async fn attempts_while_idle(failpoints: &[&str], idle: Duration) -> u32 {
    let mut args = Vec::new();
    let env = support::arm_failpoints(&mut args, failpoints);
    let c = Cluster::start_with(1, 1, args, env);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 1, 1, "4").await;
    let g = cl
        .submit(submission(
            "nowhere",
            vec![one("nowhere", "1", Some("h100"))],
        ))
        .await
        .expect("submit");
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let s = cl.get(g.id).await.expect("get");
        if s.attempts > 0 {
            break s.attempts;
        }
        assert!(Instant::now() < deadline, "never tried: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(idle).await;
    cl.get(g.id).await.expect("get").attempts - first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parking_replaces_the_blind_backoff_and_the_check_tells_them_apart() {
    let idle = Duration::from_secs(4);
    let parked = attempts_while_idle(&[], idle).await;
    let blind = attempts_while_idle(&["coordinator-never-parks"], idle).await;
    assert_eq!(
        parked, 0,
        "a parked group is not planned while nothing changes"
    );
    assert!(
        blind >= 3,
        "on its backoff (100, 200, 400, 800, 1600 ms…) it is planned again and again: {blind}"
    );
}
