//! The web view in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`; `.ci/run` installs them) against three `gangway serve`
//! processes: every page renders, a submitted gang shows while it waits with the
//! reason in words, then with its members → nodes once placed, a node opens with its
//! pods on click, every tab loads promptly however often it is opened, and when the
//! meta leader is SIGKILLed the page open on another replica shows new leaders for its
//! groups within 2 s. Screenshots of each page are
//! saved under `$CARGO_TARGET_TMPDIR/ui-screenshots` (not compared).

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gangway_server::bench::webdriver::{Browser, BrowserPaths};
use serde_json::{json, Value};
use support::gangs::{gang, submission};
use support::{client, node_spec, Cluster};

fn shots_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

async fn shot(browser: &Browser, name: &str) {
    let path = shots_dir().join(format!("{name}.png"));
    browser.screenshot(&path).await.expect("screenshot");
    eprintln!("screenshot: {}", path.display());
}

/// Waits until `script` returns something other than null/false, printing the page's
/// main element on failure.
async fn until(
    browser: &Browser,
    what: &str,
    script: &str,
    args: Value,
    within: Duration,
) -> Value {
    match browser.wait_for(what, script, args, within).await {
        Ok(v) => v,
        Err(e) => {
            let page = browser
                .eval("return document.querySelector('main') ? document.querySelector('main').innerText : document.body.innerText;", json!([]))
                .await
                .unwrap_or(Value::Null);
            panic!("{e}\npage:\n{}", page.as_str().unwrap_or(""));
        }
    }
}

async fn open_live(browser: &Browser, url: &str) {
    browser.goto(url).await.expect("open page");
    until(
        browser,
        "the event stream to open",
        "return document.getElementById('live').textContent === 'live';",
        json!([]),
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_browser_follows_gangs_nodes_and_a_leader_failover() {
    // The scenario's future is large in a debug build: on the heap, not the test's stack.
    Box::pin(follow_gangs_nodes_and_a_failover()).await;
}

async fn follow_gangs_nodes_and_a_failover() {
    let mut cluster = Cluster::start(3, 2);
    cluster
        .wait_ready(&[1, 2, 3], Duration::from_secs(30))
        .await;
    let c = client(&cluster, 1).await;
    let browser = Browser::start(&BrowserPaths::default(), 1400, 1000)
        .await
        .expect(
            "headless Chromium through ChromeDriver (apt-get install chromium chromium-driver)",
        );
    let node = Box::pin(waiting_then_placed(&browser, &c, &ui(&cluster, 1))).await;
    Box::pin(fleet_and_other_pages(&browser, &ui(&cluster, 1), &node)).await;
    Box::pin(failover(&browser, &c, &mut cluster)).await;
    browser.quit().await;
}

fn ui(cluster: &Cluster, id: u64) -> String {
    format!("http://{}", cluster.procs[&id].http)
}

/// Submits a gang to an empty fleet, sees it wait with its reason, registers nodes and
/// sees it placed; answers a node it was placed on.
async fn waiting_then_placed(browser: &Browser, c: &gangway_client::Client, base: &str) -> String {
    open_live(browser, &format!("{base}/ui/gangs")).await;
    // A gang submitted to an empty fleet waits, and the page says why in words.
    let submitted = c
        .submit(submission("train", vec![gang("train", 2, 2, "2", 0)]))
        .await
        .expect("submit");
    let reason = until(
        browser,
        "the waiting gang and its reason",
        r#"const row = document.querySelector('#waiting tr[data-name="train"]');
           if (!row) return null;
           const why = row.querySelector('td.reason').innerText;
           return why.includes('members fit') ? why : null;"#,
        json!([]),
        Duration::from_secs(15),
    )
    .await;
    let reason = reason.as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains("gang team-a/train: 0 of minMember 2 members fit"),
        "{reason}"
    );
    assert!(
        reason.contains("worker (2 members, 2 without a node)"),
        "per template: {reason}"
    );
    assert!(
        !reason.contains('{') && !reason.contains("Some("),
        "words, not a debug string: {reason}"
    );
    shot(browser, "gangs-waiting").await;

    // Nodes arrive: the same open page shows the gang placed, members → nodes.
    for i in 0..4 {
        c.register_node(node_spec(&format!("node-{i}"), "4", false))
            .await
            .expect("register node");
    }
    let placed_on = until(
        browser,
        "the gang placed, with its members' nodes",
        r#"const row = document.querySelector('#placed tr[data-name="train"]');
           if (!row || row.getAttribute('data-state') !== 'Placed') return null;
           const nodes = [...row.querySelectorAll('a.node')].map(a => a.getAttribute('data-n'));
           return nodes.length ? nodes : null;"#,
        json!([]),
        Duration::from_secs(15),
    )
    .await;
    let node = placed_on[0].as_str().expect("a node name").to_string();
    let status = c.get(submitted.id).await.expect("get");
    assert!(
        status.placements.iter().any(|p| p.node == node),
        "the page names gangway's node {node}: {status:?}"
    );
    shot(browser, "gangs-placed").await;

    node
}

/// The fleet grid and a node's detail, then the queues, transactions and cluster pages.
async fn fleet_and_other_pages(browser: &Browser, base: &str, node: &str) {
    // The fleet: one cell per node; a click opens the node with its pods.
    browser
        .goto(&format!("{base}/ui/fleet"))
        .await
        .expect("fleet");
    let cells = browser
        .eval(
            "return document.querySelectorAll('.cell[data-n]').length;",
            json!([]),
        )
        .await
        .expect("count cells");
    assert_eq!(cells, json!(4), "a cell per node");
    browser
        .eval(
            "document.querySelector('.cell[data-n=\"' + arguments[0] + '\"]').click();",
            json!([node]),
        )
        .await
        .expect("click the node");
    until(
        browser,
        "the node's detail with its pod",
        r#"const d = document.getElementById('node-detail');
           return d && d.getAttribute('data-node') === arguments[0] && d.innerText.includes('team-a/train/worker') ? true : null;"#,
        json!([node]),
        Duration::from_secs(10),
    )
    .await;
    shot(browser, "fleet").await;

    // Clicking through every tab twice: a page left behind must not keep its event
    // stream open (the browser allows six connections per host; the seventh page would
    // wait about a minute for one).
    for round in 0..2 {
        for page in ["", "fleet", "gangs", "queues", "txns"] {
            let url = format!("{base}/ui/{page}");
            tokio::time::timeout(Duration::from_secs(10), browser.goto(&url))
                .await
                .unwrap_or_else(|_| panic!("round {round}: /ui/{page} did not load within 10 s"))
                .expect("open page");
        }
    }

    for (page, marker) in [
        ("queues", "#queues"),
        ("txns", "#recent"),
        ("", "#p-cluster table.groups"),
    ] {
        browser
            .goto(&format!("{base}/ui/{page}"))
            .await
            .expect("open page");
        until(
            browser,
            &format!("page /ui/{page} to render"),
            "return document.querySelector(arguments[0]) !== null;",
            json!([marker]),
            Duration::from_secs(10),
        )
        .await;
        shot(browser, if page.is_empty() { "cluster" } else { page }).await;
    }
    browser
        .goto(&format!("{base}/ui/txns"))
        .await
        .expect("txns");
    let recent = browser
        .eval(
            "return document.getElementById('recent').innerText;",
            json!([]),
        )
        .await
        .expect("recent decisions");
    let recent = recent.as_str().unwrap_or_default();
    assert!(
        recent
            .lines()
            .any(|l| l.contains("train") && l.contains("commit")),
        "the placement's commit is listed: {recent}"
    );
}

/// SIGKILLs the meta leader; the cluster page of another replica shows new leaders.
async fn failover(browser: &Browser, c: &gangway_client::Client, cluster: &mut Cluster) {
    // The meta leader dies: the cluster page of another replica shows new leaders.
    let status = c.status(false).await.expect("status");
    let meta_leader = status
        .groups
        .iter()
        .find(|g| g.group_id == 0)
        .map(|g| g.leader)
        .expect("meta");
    let led: Vec<u64> = status
        .groups
        .iter()
        .filter(|g| g.leader == meta_leader)
        .map(|g| g.group_id)
        .collect();
    let watcher = (1..=3)
        .find(|id| *id != meta_leader)
        .expect("another replica");
    open_live(browser, &format!("{}/ui", ui(cluster, watcher))).await;
    let killed_at = Instant::now();
    cluster.kill(meta_leader);
    until(
        browser,
        "new leaders for the killed replica's groups",
        r#"const [led, dead] = arguments;
           return led.every(g => {
             const row = document.querySelector('#p-cluster tr[data-group="' + g + '"]');
             const l = row ? Number(row.getAttribute('data-leader')) : 0;
             return l !== 0 && l !== dead;
           });"#,
        json!([led, meta_leader]),
        Duration::from_secs(10),
    )
    .await;
    let shown = killed_at.elapsed();
    eprintln!("groups {led:?} of killed replica {meta_leader} showed new leaders {shown:?} after the kill");
    shot(browser, "cluster-after-failover").await;
    let unreachable = browser
        .eval(
            "return document.querySelector('#p-cluster tr[data-replica=\"' + arguments[0] + '\"]').innerText;",
            json!([meta_leader]),
        )
        .await
        .expect("the dead replica's row");
    assert!(
        unreachable
            .as_str()
            .unwrap_or_default()
            .contains("unreachable"),
        "the killed replica is shown unreachable: {unreachable}"
    );
    assert!(
        shown < Duration::from_secs(2),
        "new leaders showed {shown:?} after the kill (issue bound: 2 s)"
    );
}
