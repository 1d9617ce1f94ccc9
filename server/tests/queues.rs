//! Queues with real `gangway serve` processes: groups are charged to their queue and
//! every ancestor, a full queue keeps its groups waiting (saying why, without backoff)
//! while other queues' groups are placed, a burst of concurrent submissions never
//! takes a queue past its max (I8), and the usage survives the loss of the meta
//! leader. Errors carry precise codes and name the field.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gangway_client::admin_api::{QueueSpec, QueueStatus};
use gangway_client::{Client, ClientError};
use gangway_proto::v1::SubmitGangGroupRequest;
use support::gangs::{fleet, gang, held, submission, wait_state};
use support::{client, Cluster};

fn amounts(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn queue(name: &str, parent: &str, max: &[(&str, &str)]) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        parent: parent.into(),
        weight: 1,
        min: HashMap::new(),
        max: amounts(max),
        lend: HashMap::new(),
        managed_by: String::new(),
        namespaces: Vec::new(),
    }
}

fn into(queue: &str, key: &str, members: u32, cpu: &str) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        queue: queue.into(),
        ..submission(key, vec![gang(key, members, members, cpu, 0)])
    }
}

fn code(e: ClientError) -> (tonic::Code, String) {
    match e {
        ClientError::Rpc(s) => (s.code(), s.message().to_string()),
        other => panic!("not a gRPC error: {other}"),
    }
}

async fn usage(c: &Client) -> HashMap<String, QueueStatus> {
    c.queues()
        .await
        .expect("list queues")
        .into_iter()
        .filter_map(|q| Some((q.spec.clone()?.name, q)))
        .collect()
}

fn cpu_used(q: &HashMap<String, QueueStatus>, name: &str) -> String {
    q.get(name)
        .and_then(|s| s.usage.get("cpu").cloned())
        .unwrap_or_else(|| "0".into())
}

/// Waits until group `id` is Queued with a reason starting `why`.
async fn waiting(c: &Client, id: u64, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.get(id).await.expect("get");
        if s.state == "Queued" && s.reason.starts_with(why) {
            assert_eq!(s.attempts, 0, "waiting for room is not a failed attempt");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group {id} never waited with {why:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits ten one-cpu groups to `queue` at once; how many are Placed once a
/// second passes with no change (at most 10 s).
async fn burst_into(cl: &Client, queue: &str) -> usize {
    let burst = (0..10).map(|i| {
        let cl = cl.clone();
        async move { cl.submit(into(queue, &format!("{queue}{i}"), 1, "1")).await }
    });
    let ids: Vec<u64> = futures::future::join_all(burst)
        .await
        .into_iter()
        .map(|r| r.expect("burst submit").id)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut last, mut steady_since) = (usize::MAX, Instant::now());
    loop {
        let mut placed = 0;
        for id in &ids {
            if cl.get(*id).await.expect("get").state == "Placed" {
                placed += 1;
            }
        }
        if placed != last {
            (last, steady_since) = (placed, Instant::now());
        }
        if steady_since.elapsed() > Duration::from_secs(1) || Instant::now() > deadline {
            return placed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_bound_their_groups_across_shards_and_failover() {
    let mut c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 2, "8").await;

    // Bad input: each refusal names the field, with a precise code.
    let (code_of, msg) = code(
        cl.submit(into("nowhere", "lost", 1, "1"))
            .await
            .expect_err("unknown queue"),
    );
    assert_eq!(code_of, tonic::Code::NotFound, "{msg}");
    assert!(msg.starts_with("queue: no queue nowhere"), "{msg}");
    let mut bad = queue("a", "", &[("cpu", "2")]);
    bad.min = amounts(&[("cpu", "4")]);
    let (code_of, msg) = code(cl.put_queue(bad).await.expect_err("min above max"));
    assert_eq!(code_of, tonic::Code::InvalidArgument, "{msg}");
    assert!(msg.starts_with("queue.min.cpu"), "{msg}");

    cl.put_queue(queue("org", "", &[("cpu", "12")]))
        .await
        .expect("org");
    cl.put_queue(queue("a", "org", &[("cpu", "8")]))
        .await
        .expect("a");
    cl.put_queue(queue("b", "org", &[])).await.expect("b");
    cl.put_queue(queue("c", "", &[("cpu", "3")]))
        .await
        .expect("c");

    // Queue a up to its max, then one more waits, saying why, holding nothing.
    let a1 = cl.submit(into("a", "a1", 2, "2")).await.expect("a1");
    let a2 = cl.submit(into("a", "a2", 2, "2")).await.expect("a2");
    wait_state(&cl, a1.id, "Placed", Duration::from_secs(10)).await;
    wait_state(&cl, a2.id, "Placed", Duration::from_secs(10)).await;
    let a3 = cl.submit(into("a", "a3", 1, "2")).await.expect("a3");
    waiting(
        &cl,
        a3.id,
        "queue a has no room: cpu 2 asked, 8 used of max 8",
    )
    .await;
    assert_eq!(a3.queue, "a");

    // A sibling borrows what org has left, and no more.
    let b1 = cl.submit(into("b", "b1", 2, "2")).await.expect("b1");
    wait_state(&cl, b1.id, "Placed", Duration::from_secs(10)).await;
    let b2 = cl.submit(into("b", "b2", 1, "1")).await.expect("b2");
    waiting(&cl, b2.id, "queue b's ancestor org has no room").await;
    let q = usage(&cl).await;
    assert_eq!(cpu_used(&q, "org"), "12");
    assert_eq!(cpu_used(&q, "a"), "8");
    assert_eq!(q.get("a").map(|s| (s.queued, s.admitted)), Some((1, 2)));

    // A burst of concurrent submissions into queue c (3 cpu): at most 3 placed.
    let placed = burst_into(&cl, "c").await;
    assert_eq!(
        placed, 3,
        "queue c holds 3 one-cpu groups, no more, no fewer"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cpu_used(&usage(&cl).await, "c"), "3");
    let on_ledgers: u32 = held(&cl).await.values().sum();
    assert_eq!(
        on_ledgers,
        2 + 2 + 2 + 3,
        "the ledgers hold exactly the admitted pods"
    );

    // The meta leader dies: the usage is replicated, and the next leader keeps the bound.
    let cl = support::kill_meta_leader(&mut c).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let q = loop {
        match cl.queues().await {
            Ok(_) => break usage(&cl).await,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no meta leader after failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(cpu_used(&q, "org"), "12");
    assert_eq!(cpu_used(&q, "c"), "3");

    // Room comes back with a release, and the waiting group is placed without backoff.
    cl.release(a1.id).await.expect("release a1");
    wait_state(&cl, a3.id, "Placed", Duration::from_secs(15)).await;
    wait_state(&cl, b2.id, "Placed", Duration::from_secs(15)).await;
    let q = usage(&cl).await;
    assert_eq!(cpu_used(&q, "a"), "6");
    assert_eq!(cpu_used(&q, "b"), "5");
    assert_eq!(cpu_used(&q, "org"), "11");

    // A queue in use cannot be deleted; an unknown one is not found.
    let (code_of, msg) = code(cl.delete_queue("c").await.expect_err("in use"));
    assert_eq!(code_of, tonic::Code::FailedPrecondition, "{msg}");
    let (code_of, _) = code(cl.delete_queue("zzz").await.expect_err("unknown"));
    assert_eq!(code_of, tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_a_meta_group_that_charges_without_asking() {
    let mut args = Vec::new();
    let env = support::arm_failpoints(&mut args, &["meta-admits-over-quota"]);
    let c = Cluster::start_with(1, 1, args, env);
    c.wait_ready(&[1], Duration::from_secs(20)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 1, 2, "8").await;
    cl.put_queue(queue("c", "", &[("cpu", "3")]))
        .await
        .expect("c");
    let placed = burst_into(&cl, "c").await;
    assert!(
        placed > 3,
        "with the switch on, queue c takes {placed} one-cpu groups"
    );
}

fn guaranteed(name: &str, min_cpu: &str, max_cpu: &str) -> QueueSpec {
    QueueSpec {
        min: amounts(&[("cpu", min_cpu)]),
        ..queue(name, "", &[("cpu", max_cpu)])
    }
}

/// Two queues with half the cluster guaranteed each: A borrows all of B's half while
/// B is idle; B's gangs then reclaim exactly what they need, whole gangs, the youngest
/// of A's first, and nothing of A's own half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_reclaims_its_guarantee_from_a_borrower_whole_gangs_youngest_first() {
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 2, "4").await; // 16 cpu over four nodes on two shards
    cl.put_queue(guaranteed("a", "8", "16")).await.expect("a");
    cl.put_queue(guaranteed("b", "8", "16")).await.expect("b");

    let mut a = Vec::new();
    for i in 0..4 {
        let s = cl
            .submit(into("a", &format!("a{i}"), 2, "2"))
            .await
            .expect("a");
        wait_state(&cl, s.id, "Placed", Duration::from_secs(10)).await;
        a.push(s.id);
    }
    assert_eq!(
        cpu_used(&usage(&cl).await, "a"),
        "16",
        "a borrowed b's idle half"
    );

    let b0 = cl.submit(into("b", "b0", 2, "2")).await.expect("b0");
    wait_state(&cl, b0.id, "Placed", Duration::from_secs(15)).await;
    let b1 = cl.submit(into("b", "b1", 2, "2")).await.expect("b1");
    wait_state(&cl, b1.id, "Placed", Duration::from_secs(15)).await;
    for (i, id) in a.iter().enumerate() {
        let s = cl.get(*id).await.expect("get a");
        let expected = if i < 2 { "Placed" } else { "Preempted" };
        assert_eq!(
            s.state, expected,
            "a{i}: the youngest go, a's min stays: {s:?}"
        );
    }
    let q = usage(&cl).await;
    assert_eq!(
        (cpu_used(&q, "a"), cpu_used(&q, "b")),
        ("8".into(), "8".into())
    );

    // Past its min, b borrows nothing back by force: it waits, and a keeps its half.
    let b2 = cl.submit(into("b", "b2", 1, "2")).await.expect("b2");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let s = cl.get(b2.id).await.expect("get b2");
    assert_eq!(s.state, "Queued", "{s:?}");
    assert!(
        s.reason
            .contains("no reclaim: queue b: cpu would be 10 of min 8"),
        "{}",
        s.reason
    );
    for id in &a[..2] {
        assert_eq!(cl.get(*id).await.expect("get a").state, "Placed");
    }
    let on_ledgers: u32 = held(&cl).await.values().sum();
    assert_eq!(
        on_ledgers, 8,
        "whole gangs went: a0, a1, b0 and b1 hold two pods each"
    );

    // The meta leader reports the queues (docs/METRICS.md).
    let leader = c.agreed_leader(0, &[1, 2, 3]).await.expect("meta leader");
    let deadline = Instant::now() + Duration::from_secs(10);
    let expected = [
        r#"gangway_queue_usage{queue="a",resource="cpu"} 8000"#,
        r#"gangway_queue_min{queue="b",resource="cpu"} 8000"#,
        r#"gangway_queue_max{queue="b",resource="pods"} -1"#,
        r#"gangway_queue_share{queue="a"} 1"#,
        r#"gangway_queue_gang_groups{queue="b",state="queued"} 1"#,
        r#"gangway_queue_reclaims_total{queue="b"} 2"#,
    ];
    loop {
        let (_, body) = support::http_get(&c.procs[&leader].http, "/metrics").await;
        let missing: Vec<&&str> = expected.iter().filter(|e| !body.contains(**e)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "missing {missing:?} in\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A lending limit keeps part of an idle queue's guarantee free of borrowers: with A
/// (min 8, lending 4) idle, B borrows only A's lendable 4 and then waits, saying why;
/// A's first gang is placed at once, evicting nothing; A's next, still within its
/// min, reclaims what B borrowed (the youngest of B's gangs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lending_limit_keeps_part_of_an_idle_guarantee_free_of_borrowers() {
    let c = Cluster::start(3, 2);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 2, "4").await; // 16 cpu over four nodes on two shards
    let mut a = guaranteed("a", "8", "16");
    a.lend = amounts(&[("cpu", "4")]);
    let put = cl.put_queue(a).await.expect("a");
    assert_eq!(
        put.spec.expect("spec").lend.get("cpu").map(String::as_str),
        Some("4")
    );
    cl.put_queue(guaranteed("b", "8", "16")).await.expect("b");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = cl.queue_list().await.expect("list queues");
        if list.capacity.get("cpu").map(String::as_str) == Some("16") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster's capacity was not recorded: {:?}",
            list.capacity
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let too_much = QueueSpec {
        lend: amounts(&[("cpu", "9")]),
        ..guaranteed("c", "8", "16")
    };
    let (code_of, message) = code(cl.put_queue(too_much).await.expect_err("lend above min"));
    assert_eq!(code_of, tonic::Code::InvalidArgument);
    assert!(
        message.starts_with("queue.lend.cpu: 9 is above min 8"),
        "{message}"
    );

    let mut b = Vec::new();
    for i in 0..3 {
        let s = cl
            .submit(into("b", &format!("b{i}"), 2, "2"))
            .await
            .expect("b");
        wait_state(&cl, s.id, "Placed", Duration::from_secs(10)).await;
        b.push(s.id);
    }
    let b3 = cl.submit(into("b", "b3", 2, "2")).await.expect("b3");
    waiting(
        &cl,
        b3.id,
        "queue b would borrow cpu that lending limits keep: 4 asked, 12 used of the cluster's 16, 4 kept free (4 for a)",
    )
    .await;

    let a0 = cl.submit(into("a", "a0", 2, "2")).await.expect("a0");
    wait_state(&cl, a0.id, "Placed", Duration::from_secs(10)).await;
    for id in &b {
        let s = cl.get(*id).await.expect("get b");
        assert_eq!(s.state, "Placed", "a's kept half needed no reclaim: {s:?}");
    }

    let a1 = cl.submit(into("a", "a1", 2, "2")).await.expect("a1");
    wait_state(&cl, a1.id, "Placed", Duration::from_secs(15)).await;
    let states: Vec<String> = futures::future::join_all(b.iter().map(|id| cl.get(*id)))
        .await
        .into_iter()
        .map(|s| s.expect("get b").state)
        .collect();
    assert_eq!(
        states,
        ["Placed", "Placed", "Preempted"],
        "within its min, a took back what b borrowed of its lendable part"
    );
    let q = usage(&cl).await;
    assert_eq!(
        (cpu_used(&q, "a"), cpu_used(&q, "b")),
        ("8".into(), "8".into())
    );
    let on_ledgers: u32 = held(&cl).await.values().sum();
    assert_eq!(on_ledgers, 8, "a0, a1, b0 and b1 hold two pods each");
}

/// A cpu quantity as the API writes it ("6", "5800m"), in millicores.
fn millicores(q: &HashMap<String, QueueStatus>, name: &str, field: &str) -> u64 {
    let status = q.get(name).expect("queue listed");
    let amounts = match field {
        "decayed" => &status.decayed_usage,
        _ => &status.usage,
    };
    match amounts.get("cpu") {
        None => 0,
        Some(text) => match text.strip_suffix('m') {
            Some(milli) => milli.parse().expect("millicores"),
            None => text.parse::<u64>().expect("cores") * 1_000,
        },
    }
}

/// Fair sharing over time with a 2 s half-life, on three processes: queue a uses the
/// whole cluster for two half-lives and b nothing. Its decayed usage is replicated: the
/// meta leader dies, and the next one continues it (it only grows while a still holds
/// the cluster). When a's group ends, b's waiting group goes before a's (a submitted
/// first, both idle now); once b has used the cluster for two half-lives and a's past
/// has decayed, the shares have crossed and a's goes before b's next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_share_over_time_puts_the_idle_queue_first_until_the_shares_cross_across_failover() {
    const HALF_LIFE_MS: u64 = 2_000;
    let mut c = Cluster::start_with(
        3,
        2,
        vec!["--fair-share-half-life-ms".into(), HALF_LIFE_MS.to_string()],
        Vec::new(),
    );
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30)).await;
    let cl = client(&c, 1).await;
    fleet(&cl, 2, 1, "4").await; // 8 cpu: two 4-cpu nodes on two shards
    cl.put_queue(queue("org", "", &[("cpu", "8")]))
        .await
        .expect("org");
    for name in ["a", "b"] {
        let mut spec = queue(name, "org", &[]);
        spec.min = amounts(&[("cpu", "4")]);
        cl.put_queue(spec).await.expect("team queue");
    }
    // The coordinator's first sample starts the history.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cl.queue_list().await.expect("list").fair_share_half_life_ms != HALF_LIFE_MS {
        assert!(Instant::now() < deadline, "usage never sampled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // a holds the whole cluster for two half-lives; a1 and b1 wait for org's room.
    let long = cl
        .submit(into("a", "a-long", 2, "4"))
        .await
        .expect("a-long");
    wait_state(&cl, long.id, "Placed", Duration::from_secs(10)).await;
    let a1 = cl.submit(into("a", "a1", 2, "4")).await.expect("a1");
    let b1 = cl.submit(into("b", "b1", 2, "4")).await.expect("b1");
    waiting(&cl, a1.id, "queue a's ancestor org has no room").await;
    waiting(&cl, b1.id, "queue b's ancestor org has no room").await;
    tokio::time::sleep(Duration::from_millis(2 * HALF_LIFE_MS)).await;
    let q = usage(&cl).await;
    let before = millicores(&q, "a", "decayed");
    assert!(
        (3_000..8_000).contains(&before),
        "8 cpu for two half-lives decays to about 6: {before}m"
    );
    assert_eq!(millicores(&q, "b", "decayed"), 0, "b used nothing");

    // The meta leader dies: the next one continues the same history.
    let cl = support::kill_meta_leader(&mut c).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        match cl.queues().await {
            Ok(_) => break millicores(&usage(&cl).await, "a", "decayed"),
            Err(e) => {
                assert!(Instant::now() < deadline, "no meta leader: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        after >= before && after < 8_000,
        "a still holds 8 cpu: its decayed usage grows from {before}m, not from zero: {after}m"
    );

    // a's group ends: b (nothing decayed) goes before a (submitted first).
    cl.release(long.id).await.expect("release a-long");
    wait_state(&cl, b1.id, "Placed", Duration::from_secs(15)).await;
    let a1_now = cl.get(a1.id).await.expect("a1");
    assert_eq!(a1_now.state, "Queued", "{a1_now:?}");

    // b holds the cluster for two half-lives; a's past halves twice meanwhile.
    let b2 = cl.submit(into("b", "b2", 2, "4")).await.expect("b2");
    waiting(&cl, b2.id, "queue b's ancestor org has no room").await;
    tokio::time::sleep(Duration::from_millis(2 * HALF_LIFE_MS)).await;
    let q = usage(&cl).await;
    let (a_past, b_past) = (
        millicores(&q, "a", "decayed"),
        millicores(&q, "b", "decayed"),
    );
    assert!(
        a_past < b_past,
        "the decayed shares crossed: a {a_past}m, b {b_past}m"
    );
    cl.release(b1.id).await.expect("release b1");
    wait_state(&cl, a1.id, "Placed", Duration::from_secs(15)).await;
    let b2_now = cl.get(b2.id).await.expect("b2");
    assert_eq!(b2_now.state, "Queued", "a goes first now: {b2_now:?}");
}
