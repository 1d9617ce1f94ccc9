//! `gangway bench ui`: how the web view holds up on a large cluster. Starts three
//! `gangway serve` processes on 127.0.0.1, registers `--nodes` nodes and submits
//! `--groups` gang groups (most placed, some that cannot fit and wait with a reason),
//! then drives a real headless Chromium through ChromeDriver:
//! - time to first render of every page (Navigation and Paint Timing: first byte,
//!   DOM ready, first contentful paint) and its size, over `--samples` fresh loads;
//! - update latency: from the moment a submission is acknowledged to the moment the
//!   open gangs page (filtered to the probes' namespace, as an operator following one
//!   team would) shows the new group waiting, then placed (the browser's clock and this
//!   process's are the same machine's wall clock).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use serde_json::json;
use tokio::sync::Semaphore;

use super::e2e::{register_nodes, spawn_cluster, wait_ready};
use super::percentile;
use super::webdriver::{Browser, BrowserPaths};

/// Largest fleet the benchmark registers.
pub const UI_BENCH_NODES_MAX: usize = 100_000;
/// Largest number of groups it submits.
pub const UI_BENCH_GROUPS_MAX: usize = 50_000;
/// Submissions in flight at once.
const SUBMIT_CONCURRENCY: usize = 64;
/// Time the submitted groups get to settle (placed or waiting), in ms.
const SETTLE_TIMEOUT_MS: u64 = 300_000;
/// Time one update may take to reach the page, in ms.
const UPDATE_TIMEOUT_MS: u64 = 30_000;

/// Flags of `gangway bench ui`.
#[derive(Debug, Clone, Args)]
pub struct UiBenchArgs {
    /// Shard groups.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Nodes to register (64 cpu, 8 GPUs each, in 8 zones).
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Gang groups to submit (gangs of 4 with a GPU each).
    #[arg(long, default_value_t = 5_000)]
    pub groups: usize,
    /// One group in this many asks 9 GPUs of 8-GPU nodes: it cannot fit, and waits with
    /// its reason (0: none waits).
    #[arg(long, default_value_t = 10)]
    pub waiting_every: usize,
    /// Fresh loads of each page, and updates timed.
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    /// Save a screenshot of each page here.
    #[arg(long)]
    pub screenshots: Option<PathBuf>,
}

const PAGES: [&str; 5] = ["/ui", "/ui/fleet", "/ui/gangs", "/ui/queues", "/ui/txns"];

/// What one fresh load of a page measured, in ms (bytes for the size).
#[derive(Debug, Default, Clone)]
struct Load {
    first_byte: Vec<u64>,
    dom_ready: Vec<u64>,
    first_paint: Vec<u64>,
    bytes: u64,
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Namespace of the groups whose updates are timed (the page is filtered to it, as an
/// operator following one team's gangs among thousands would).
const PROBE_NAMESPACE: &str = "probe";

fn group_request(
    namespace: &str,
    name: String,
    waits: bool,
) -> gangway_proto::v1::SubmitGangGroupRequest {
    let gpus = if waits { "9" } else { "1" };
    let pod = json!({"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": gpus}});
    GangGroupBuilder::new(name.clone())
        .idempotency_key(name.clone())
        .gang(GangBuilder::new(namespace, name, 4).members("w", 4, pod))
        .build()
}

/// Whether group `g` is one that cannot fit.
fn waits(g: usize, every: usize) -> bool {
    every > 0 && g % every == every - 1
}

async fn submit_groups(client: &Client, count: usize, every: usize) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut tasks = Vec::new();
    for g in 0..count {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            client
                .submit(group_request(
                    "bench-ui",
                    format!("bench-{g:05}"),
                    waits(g, every),
                ))
                .await
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn wait_settled(client: &Client, count: usize, every: usize) -> anyhow::Result<()> {
    let waiting = (0..count).filter(|g| waits(*g, every)).count();
    let deadline = Instant::now() + Duration::from_millis(SETTLE_TIMEOUT_MS);
    loop {
        let groups = client.list_groups(false).await?;
        let placed = groups.iter().filter(|g| g.state == "Placed").count();
        let tried = groups
            .iter()
            .filter(|g| g.state == "Queued" && g.attempts > 0)
            .count();
        if placed >= count - waiting && tried >= waiting {
            return Ok(());
        }
        if Instant::now() > deadline {
            let mut states: BTreeMap<(String, u32), usize> = BTreeMap::new();
            for g in &groups {
                *states
                    .entry((g.state.clone(), g.attempts.min(3)))
                    .or_default() += 1;
            }
            let example = groups
                .iter()
                .find(|g| g.state == "Queued")
                .map(|g| g.reason.clone())
                .unwrap_or_default();
            bail!(
                "{placed} of {} groups placed and {tried} of {waiting} tried within {SETTLE_TIMEOUT_MS} ms; \
                 (state, attempts up to 3): {states:?}; a queued one says {example:?}",
                count - waiting
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

const TIMING_SCRIPT: &str = r#"
const nav = performance.getEntriesByType('navigation')[0];
const paint = performance.getEntriesByType('paint').find(p => p.name === 'first-contentful-paint');
if (!nav || nav.domContentLoadedEventEnd === 0) return null;
return { first_byte: nav.responseStart - nav.requestStart,
         dom_ready: nav.domContentLoadedEventEnd - nav.startTime,
         first_paint: paint ? paint.startTime : null,
         bytes: nav.decodedBodySize };
"#;

async fn time_page(browser: &Browser, url: &str, load: &mut Load) -> anyhow::Result<()> {
    browser.goto(url).await?;
    let t = browser
        .wait_for(
            "navigation timing",
            TIMING_SCRIPT,
            json!([]),
            Duration::from_secs(30),
        )
        .await?;
    let ms = |k: &str| t[k].as_f64().map(|v| v.round() as u64);
    load.first_byte.push(ms("first_byte").unwrap_or(0));
    load.dom_ready.push(ms("dom_ready").unwrap_or(0));
    if let Some(p) = ms("first_paint") {
        load.first_paint.push(p);
    }
    load.bytes = t["bytes"].as_u64().unwrap_or(0);
    Ok(())
}

const SEEN_SCRIPT: &str = r#"
const row = document.querySelector('#p-gangs tr[data-name="' + arguments[0] + '"]');
if (!row) return null;
if (arguments[1] && row.getAttribute('data-state') !== arguments[1]) return null;
return true;
"#;

const DIAGNOSIS_SCRIPT: &str = r#"
const rows = [...document.querySelectorAll('#p-gangs tr[data-name]')];
return { rows: rows.length,
         this_one: rows.filter(r => r.getAttribute('data-name') === arguments[0]).map(r => r.getAttribute('data-state')),
         last_rows: rows.slice(-3).map(r => r.getAttribute('data-name') + ':' + r.getAttribute('data-state')),
         updates: window.gangwayUpdates.length,
         last_update: window.gangwayUpdates.slice(-1),
         live: document.getElementById('live').textContent,
         now: Date.now() };
"#;

/// Installs an observer that notes, on the browser's wall clock, when group `name`'s
/// row first shows in state `state`.
const WATCH_SCRIPT: &str = r#"
const name = arguments[0], state = arguments[1];
window.__seen = null;
const check = () => {
  const row = document.querySelector('#p-gangs tr[data-name="' + name + '"]');
  if (row && row.getAttribute('data-state') === state && window.__seen === null) window.__seen = Date.now();
};
if (window.__observer) window.__observer.disconnect();
window.__observer = new MutationObserver(check);
window.__observer.observe(document.getElementById('p-gangs'), { childList: true, subtree: true, attributes: true });
check();
"#;

/// How long one update took: (submission acknowledged or group placed → row shown in
/// `state`, submission acknowledged → placed as gangway reported it), in ms.
async fn time_update(
    browser: &Browser,
    client: &Client,
    name: String,
    waits: bool,
) -> anyhow::Result<(u64, Option<u64>)> {
    let state = if waits { "Queued" } else { "Placed" };
    browser.eval(WATCH_SCRIPT, json!([name, state])).await?;
    let submitted = client
        .submit(group_request(PROBE_NAMESPACE, name.clone(), waits))
        .await?;
    let acked = epoch_ms();
    let mut changed = acked;
    let mut placed_after = None;
    if !waits {
        let deadline = Instant::now() + Duration::from_millis(UPDATE_TIMEOUT_MS);
        loop {
            if client.get(submitted.id).await?.state == "Placed" {
                changed = epoch_ms();
                placed_after = Some(changed.saturating_sub(acked));
                break;
            }
            if Instant::now() > deadline {
                bail!("group {name} was not placed within {UPDATE_TIMEOUT_MS} ms");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    if let Err(e) = browser
        .wait_for(
            &format!("group {name} showing {state}"),
            SEEN_SCRIPT,
            json!([name, state]),
            Duration::from_millis(UPDATE_TIMEOUT_MS),
        )
        .await
    {
        let page = browser.eval(DIAGNOSIS_SCRIPT, json!([name])).await?;
        bail!("{e}; the page: {page}");
    }
    let seen = browser
        .eval("return window.__seen;", json!([]))
        .await?
        .as_u64()
        .context("the observer noted no time")?;
    Ok((seen.saturating_sub(changed), placed_after))
}

/// Runs the benchmark and prints its tables.
pub async fn run(args: UiBenchArgs) -> anyhow::Result<()> {
    if args.nodes == 0 || args.nodes > UI_BENCH_NODES_MAX {
        bail!("--nodes: {} is not in 1..={UI_BENCH_NODES_MAX}", args.nodes);
    }
    if args.groups == 0 || args.groups > UI_BENCH_GROUPS_MAX {
        bail!(
            "--groups: {} is not in 1..={UI_BENCH_GROUPS_MAX}",
            args.groups
        );
    }
    if args.shards == 0 || args.shards > crate::config::SHARDS_MAX as usize {
        bail!(
            "--shards: {} is not in 1..={}",
            args.shards,
            crate::config::SHARDS_MAX
        );
    }
    if args.samples == 0 {
        bail!("--samples: must be at least 1");
    }
    let dir = std::env::temp_dir().join(format!("gangway-bench-ui-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let procs = spawn_cluster(args.shards, &dir)?;
    let client = wait_ready(&procs.grpc).await?;
    let t = Instant::now();
    register_nodes(&client, args.nodes).await?;
    eprintln!(
        "{} nodes registered in {:.1} s",
        args.nodes,
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    submit_groups(&client, args.groups, args.waiting_every).await?;
    wait_settled(&client, args.groups, args.waiting_every).await?;
    eprintln!(
        "{} groups submitted and settled in {:.1} s",
        args.groups,
        t.elapsed().as_secs_f64()
    );

    let browser = Browser::start(&BrowserPaths::default(), 1400, 1000).await?;
    let base = format!("http://{}", procs.http[0]);
    let mut loads: Vec<(&str, Load)> = PAGES.iter().map(|p| (*p, Load::default())).collect();
    for _ in 0..args.samples {
        for (page, load) in &mut loads {
            time_page(&browser, &format!("{base}{page}"), load).await?;
        }
    }
    if let Some(shots) = &args.screenshots {
        std::fs::create_dir_all(shots)?;
        for page in PAGES {
            browser.goto(&format!("{base}{page}")).await?;
            let file = if page == "/ui" { "cluster" } else { &page[4..] };
            browser
                .screenshot(&shots.join(format!("bench-{file}.png")))
                .await?;
        }
    }
    browser
        .goto(&format!("{base}/ui/gangs?namespace={PROBE_NAMESPACE}"))
        .await?;
    browser
        .wait_for(
            "the event stream to open",
            "return document.getElementById('live').textContent === 'live';",
            json!([]),
            Duration::from_secs(10),
        )
        .await?;
    let mut waiting_ms = Vec::new();
    let mut placed_ms = Vec::new();
    let mut placing_ms = Vec::new();
    for i in 0..args.samples {
        let (shown, _) = time_update(&browser, &client, format!("probe-wait-{i}"), true).await?;
        waiting_ms.push(shown);
        let (shown, placed) =
            time_update(&browser, &client, format!("probe-place-{i}"), false).await?;
        placed_ms.push(shown);
        placing_ms.extend(placed);
    }
    browser.quit().await;
    drop(procs);

    println!(
        "Web view, {} nodes on {} shards, {} groups ({} waiting), replica 1 of 3, {} fresh loads per page:",
        args.nodes,
        args.shards,
        args.groups,
        (0..args.groups)
            .filter(|g| waits(*g, args.waiting_every))
            .count(),
        args.samples
    );
    println!();
    println!(
        "| page | size | first byte p50 | DOM ready p50 | first paint p50 | first paint max |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (page, load) in &mut loads {
        for v in [
            &mut load.first_byte,
            &mut load.dom_ready,
            &mut load.first_paint,
        ] {
            v.sort_unstable();
        }
        println!(
            "| `{page}` | {} KiB | {} ms | {} ms | {} ms | {} ms |",
            load.bytes / 1024,
            percentile(&load.first_byte, 50.0),
            percentile(&load.dom_ready, 50.0),
            percentile(&load.first_paint, 50.0),
            load.first_paint.last().copied().unwrap_or(0)
        );
    }
    for v in [&mut waiting_ms, &mut placed_ms, &mut placing_ms] {
        v.sort_unstable();
    }
    println!();
    println!(
        "Update latency on the open gangs page (filtered to the probes' namespace), {} samples:",
        args.samples
    );
    println!();
    println!("| update | p50 | max |");
    println!("|---|---:|---:|");
    let row = |what: &str, v: &[u64]| {
        println!(
            "| {what} | {} ms | {} ms |",
            percentile(v, 50.0),
            v.last().copied().unwrap_or(0)
        )
    };
    row(
        "submission acknowledged → the group shown waiting",
        &waiting_ms,
    );
    row(
        "submission acknowledged → placed (gangway, read by gRPC)",
        &placing_ms,
    );
    row("placed (read by gRPC) → the group shown placed", &placed_ms);
    Ok(())
}
