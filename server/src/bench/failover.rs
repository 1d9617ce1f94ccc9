//! `gangway bench failover`: how long placement stops when the meta leader dies, with
//! many gang groups placed. The e2e bench's cluster (three real `gangway serve`
//! processes on 127.0.0.1, sled data dirs); groups of one small pod are placed up to
//! each count, then, per sample, the meta leader is SIGKILLed and a probe group is
//! submitted at once, failing over across the live replicas. The figure is kill →
//! probe `Placed`: election, the new coordinator's first round (delivering what is
//! undelivered, recovering what is undecided) and one placement. The killed replica
//! restarts and catches up before the next sample (timed: restart → caught up). Each
//! count's last `--window` groups are timed alone (the admission rate at that count),
//! and every replica's RSS is read once the count is placed. Processes and data dirs
//! are removed on every exit path.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use gangway_proto::v1::{NodeSpec, SubmitGangGroupRequest};
use serde_json::json;

use super::e2e::{fetch_metrics, parse_list, spawn_cluster, wait_ready, Processes};
use super::{percentile, rss_bytes};

/// Most groups the benchmark places.
pub const FAILOVER_PLACED_MAX: usize = 1_000_000;
/// Most kills per count.
pub const FAILOVER_SAMPLES_MAX: usize = 1_000;
/// Pods one node takes (the groups' pods are small; pods are the binding limit).
pub const NODE_PODS: usize = 1_000;
/// Longest the groups of one count may take to be placed.
pub const FILL_TIMEOUT_S: u64 = 1_800;
/// Longest one probe may take from the kill to `Placed`.
pub const PROBE_TIMEOUT_S: u64 = 60;
/// Longest a restarted replica may take to catch up.
pub const CATCH_UP_TIMEOUT_S: u64 = 600;
/// Time one probe call may take before the next replica is tried.
pub const PROBE_CALL_TIMEOUT_MS: u64 = 500;
/// How often the probe's state is read.
pub const PROBE_POLL_MS: u64 = 5;
/// How often catch-up is read.
pub const PROGRESS_POLL_MS: u64 = 500;
/// How often fill progress is read.
pub const FILL_POLL_MS: u64 = 50;
/// How often a timed window reads the log's changes.
pub const WINDOW_POLL_MS: u64 = 10;
/// Changes read per call by a timed window.
pub const CHANGES_PAGE: u32 = 10_000;
/// The meta group's id in `Status`.
const META_GROUP_ID: u64 = 0;

/// Flags of `gangway bench failover`.
#[derive(Debug, clap::Args)]
pub struct FailoverBenchArgs {
    /// Placed-group counts to measure at, ascending, comma-separated (groups accumulate
    /// on one cluster).
    #[arg(long, default_value = "5,10000,100000")]
    pub placed: String,
    /// Meta leader kills per count.
    #[arg(long, default_value_t = 20)]
    pub samples: usize,
    /// Shards of the cluster.
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Nodes registered (64 cpu, 512Gi, 1,000 pods each); they must hold every group.
    #[arg(long, default_value_t = 200)]
    pub nodes: usize,
    /// Submissions in flight at once while groups are placed.
    #[arg(long, default_value_t = 64)]
    pub submit_concurrency: usize,
    /// The last groups of each count, timed alone: the admission rate at that count.
    #[arg(long, default_value_t = 10_000)]
    pub window: usize,
}

/// One group of one pod (10m cpu, 16Mi), its gang named like the group.
fn small_group(name: String) -> SubmitGangGroupRequest {
    let pod = json!({"requests": {"cpu": "10m", "memory": "16Mi"}});
    GangGroupBuilder::new(name.clone())
        .idempotency_key(name.clone())
        .gang(GangBuilder::new("bench", name, 1).members("w", 1, pod))
        .build()
}

async fn register_nodes(client: &Client, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        let name = format!("node-{i:05}");
        let node = NodeSpec {
            name: name.clone(),
            labels: [("kubernetes.io/hostname".to_string(), name)]
                .into_iter()
                .collect(),
            allocatable: [
                ("cpu", "64".to_string()),
                ("memory", "512Gi".to_string()),
                ("pods", NODE_PODS.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            ..Default::default()
        };
        client.register_node(node).await?;
    }
    Ok(())
}

/// `gangway_gang_groups{state="Placed"}` as the meta leader reports it (the gauge is
/// zero elsewhere), or 0 if no process answers.
async fn placed_groups(http: &[String]) -> u64 {
    let mut most = 0;
    for addr in http {
        let Ok(text) = fetch_metrics(addr).await else {
            continue;
        };
        let placed = text
            .lines()
            .find_map(|l| l.strip_prefix("gangway_gang_groups{state=\"Placed\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        most = most.max(placed as u64);
    }
    most
}

/// Submits groups `from..to`, at most `concurrency` at once (answers are dropped as
/// they come, so a million submissions hold no million answers); returns the group
/// ids and the lowest change stamp their submissions answered with.
async fn submit_range(
    client: &Client,
    from: usize,
    to: usize,
    concurrency: usize,
) -> anyhow::Result<(HashSet<u64>, u64)> {
    let mut running = tokio::task::JoinSet::new();
    let mut ids = HashSet::with_capacity(to - from);
    let mut lowest = u64::MAX;
    let mut note = |status: gangway_proto::v1::GangGroupStatus| {
        ids.insert(status.id);
        lowest = lowest.min(status.version);
    };
    for g in from..to {
        if running.len() >= concurrency {
            if let Some(done) = running.join_next().await {
                note(done??);
            }
        }
        let client = client.clone();
        running.spawn(async move { client.submit(small_group(format!("fill-{g}"))).await });
    }
    while let Some(done) = running.join_next().await {
        note(done??);
    }
    Ok((ids, lowest))
}

/// Submits groups `from..to` and waits until at least `to` groups are placed.
async fn fill(
    client: &Client,
    http: &[String],
    from: usize,
    to: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    submit_range(client, from, to, concurrency).await?;
    let deadline = Instant::now() + Duration::from_secs(FILL_TIMEOUT_S);
    while placed_groups(http).await < to as u64 {
        if Instant::now() > deadline {
            bail!("{to} groups not placed within {FILL_TIMEOUT_S} s");
        }
        tokio::time::sleep(Duration::from_millis(FILL_POLL_MS)).await;
    }
    Ok(())
}

/// Submits groups `from..to` and follows the log's changes until every one of them
/// is placed; returns the seconds from the first submission to the last placement
/// seen (exact to one poll, unlike the once-a-second gauge `fill` waits on).
async fn timed_window(
    client: &Client,
    from: usize,
    to: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let (mut waiting, lowest) = submit_range(client, from, to, concurrency).await?;
    let mut stamp = lowest.saturating_sub(1);
    let deadline = Instant::now() + Duration::from_secs(FILL_TIMEOUT_S);
    while !waiting.is_empty() {
        let page = client.list_changes(stamp, CHANGES_PAGE).await?;
        for g in &page.groups {
            if g.state == "Placed" {
                waiting.remove(&g.id);
            }
        }
        stamp = page.stamp;
        if waiting.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{} of groups {from}..{to} not placed within {FILL_TIMEOUT_S} s",
                waiting.len()
            );
        }
        if !page.more {
            tokio::time::sleep(Duration::from_millis(WINDOW_POLL_MS)).await;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The replica (0-based) that leads the meta group, as the live replicas see it.
async fn meta_leader(clients: &[Client]) -> Option<usize> {
    for c in clients {
        if let Ok(s) = c.status(false).await {
            let leader = s
                .groups
                .iter()
                .find(|g| g.group_id == META_GROUP_ID)
                .map(|g| g.leader)?;
            if leader != 0 {
                return Some(leader as usize - 1);
            }
        }
    }
    None
}

/// Submits the probe through the live replicas in turn until one accepts it, then
/// reads its state until it is placed; returns its group id.
async fn probe(clients: &[Client], dead: usize, name: String) -> anyhow::Result<u64> {
    let live: Vec<&Client> = clients
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != dead)
        .map(|(_, c)| c)
        .collect();
    let call = Duration::from_millis(PROBE_CALL_TIMEOUT_MS);
    let deadline = Instant::now() + Duration::from_secs(PROBE_TIMEOUT_S);
    let request = small_group(name);
    let mut turn = 0;
    let id = loop {
        let c = live[turn % live.len()];
        turn += 1;
        if let Ok(Ok(status)) = tokio::time::timeout(call, c.submit_once(request.clone())).await {
            break status.id;
        }
        if Instant::now() > deadline {
            bail!("the probe was not accepted within {PROBE_TIMEOUT_S} s of the kill");
        }
        tokio::time::sleep(Duration::from_millis(PROBE_POLL_MS)).await;
    };
    loop {
        let c = live[turn % live.len()];
        if let Ok(Ok(status)) = tokio::time::timeout(call, c.get(id)).await {
            match status.state.as_str() {
                "Placed" => return Ok(id),
                "Queued" | "Placing" => {}
                other => bail!("probe group {id} ended {other}: {}", status.reason),
            }
        } else {
            turn += 1;
        }
        if Instant::now() > deadline {
            bail!("probe group {id} not placed within {PROBE_TIMEOUT_S} s of the kill");
        }
        tokio::time::sleep(Duration::from_millis(PROBE_POLL_MS)).await;
    }
}

/// Waits until replica `i` knows every group's leader and has applied what the others
/// had committed when it was asked.
async fn caught_up(clients: &[Client], i: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(CATCH_UP_TIMEOUT_S);
    loop {
        if replica_caught_up(clients, i).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "replica {} did not catch up within {CATCH_UP_TIMEOUT_S} s",
                i + 1
            );
        }
        tokio::time::sleep(Duration::from_millis(PROGRESS_POLL_MS)).await;
    }
}

async fn replica_caught_up(clients: &[Client], i: usize) -> bool {
    let mut committed = std::collections::BTreeMap::new();
    for (j, c) in clients.iter().enumerate() {
        if j == i {
            continue;
        }
        let Ok(s) = c.status(false).await else {
            return false;
        };
        for g in s.groups {
            let e = committed.entry(g.group_id).or_insert(0);
            *e = (*e).max(g.committed_index);
        }
    }
    let Ok(own) = clients[i].status(false).await else {
        return false;
    };
    !own.groups.is_empty()
        && own.groups.iter().all(|g| {
            g.leader != 0 && g.applied_index >= committed.get(&g.group_id).copied().unwrap_or(0)
        })
}

/// What the kills at one count measured, sorted (ms).
struct KillFigures {
    /// Kill → probe placed.
    recovery_ms: Vec<u64>,
    /// Restart of the killed replica → caught up with the others.
    catch_up_ms: Vec<u64>,
}

/// Kills the meta leader `samples` times.
async fn kill_samples(
    procs: &mut Processes,
    clients: &[Client],
    placed: usize,
    samples: usize,
) -> anyhow::Result<KillFigures> {
    let mut recovery_ms = Vec::with_capacity(samples);
    let mut catch_up_ms = Vec::with_capacity(samples);
    for k in 0..samples {
        let leader = meta_leader(clients)
            .await
            .context("no replica knows the meta leader")?;
        let killed = Instant::now();
        procs.kill(leader);
        let id = probe(clients, leader, format!("probe-{placed}-{k}")).await?;
        let ms = killed.elapsed().as_millis() as u64;
        recovery_ms.push(ms);
        eprintln!(
            "  {placed} placed, kill {}: replica {} led meta; probe placed after {ms} ms",
            k + 1,
            leader + 1
        );
        let restarted = Instant::now();
        procs.start(leader)?;
        caught_up(clients, leader).await?;
        let caught = restarted.elapsed().as_millis() as u64;
        catch_up_ms.push(caught);
        eprintln!(
            "  replica {} restarted and caught up in {caught} ms",
            leader + 1
        );
        let release = clients
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .map(|(_, c)| c);
        for c in release {
            if c.release(id).await.is_ok() {
                break;
            }
        }
    }
    recovery_ms.sort_unstable();
    catch_up_ms.sort_unstable();
    Ok(KillFigures {
        recovery_ms,
        catch_up_ms,
    })
}

/// One count's row of the table.
struct Row {
    placed: usize,
    /// Groups timed alone at the end of the fill, and the seconds they took.
    window: (usize, f64),
    /// Each replica's resident bytes once the count was placed.
    rss: Vec<u64>,
    kills: KillFigures,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: FailoverBenchArgs) -> anyhow::Result<()> {
    let counts = parse_list("--placed", &args.placed)?;
    if counts.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--placed: {} is not ascending", args.placed);
    }
    if counts.last().is_some_and(|c| *c > FAILOVER_PLACED_MAX) {
        bail!("--placed: counts above {FAILOVER_PLACED_MAX} are not measured");
    }
    if !(1..=FAILOVER_SAMPLES_MAX).contains(&args.samples) {
        bail!(
            "--samples: {} is not in 1..={FAILOVER_SAMPLES_MAX}",
            args.samples
        );
    }
    if args.shards == 0 || args.nodes == 0 || args.submit_concurrency == 0 || args.window == 0 {
        bail!("--shards, --nodes, --submit-concurrency and --window must be >= 1");
    }
    let room = args.nodes * NODE_PODS;
    let most = counts.last().copied().unwrap_or(0) + args.samples;
    if most > room {
        bail!(
            "--nodes: {} nodes of {NODE_PODS} pods hold {room} groups, fewer than {most}",
            args.nodes
        );
    }
    let dir = std::env::temp_dir().join(format!("gangway-bench-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut procs = spawn_cluster(args.shards, &dir)?;
    let client = wait_ready(&procs.grpc).await?;
    let mut clients = Vec::new();
    for addr in &procs.grpc {
        clients.push(Client::connect(std::slice::from_ref(addr)).await?);
    }
    register_nodes(&client, args.nodes).await?;
    let rss_empty: Vec<u64> = procs
        .pids()
        .iter()
        .map(|p| rss_bytes(Some(*p)).unwrap_or(0))
        .collect();
    let mut rows = Vec::new();
    let mut placed = 0;
    for &count in &counts {
        let t = Instant::now();
        let timed_from = count - args.window.min(count - placed);
        fill(
            &client,
            &procs.http,
            placed,
            timed_from,
            args.submit_concurrency,
        )
        .await?;
        let secs = timed_window(&client, timed_from, count, args.submit_concurrency).await?;
        let window = (count - timed_from, secs);
        eprintln!(
            "{count} groups placed ({} new in {:.1} s; the last {} in {:.2} s)",
            count - placed,
            t.elapsed().as_secs_f64(),
            window.0,
            window.1
        );
        placed = count;
        let rss = procs
            .pids()
            .iter()
            .map(|p| rss_bytes(Some(*p)).unwrap_or(0))
            .collect();
        let kills = kill_samples(&mut procs, &clients, count, args.samples).await?;
        rows.push(Row {
            placed: count,
            window,
            rss,
            kills,
        });
    }
    drop(procs);
    println!(
        "| placed groups | admission (last groups) | replica RSS | RSS per placed group | kills | kill→placed p50 · p99 · max | restart→caught up p50 · max |"
    );
    println!("|---:|---:|---|---:|---:|---|---|");
    for r in rows {
        let rate = r.window.0 as f64 / r.window.1.max(1e-9);
        let most = r.rss.iter().copied().max().unwrap_or(0);
        let base = rss_empty.iter().copied().max().unwrap_or(0);
        let per_group = most.saturating_sub(base) as f64 / r.placed.max(1) as f64;
        let rss: Vec<String> = r.rss.iter().map(|b| format!("{:.0}", mib(*b))).collect();
        let (rec, up) = (&r.kills.recovery_ms, &r.kills.catch_up_ms);
        println!(
            "| {} | {:.0}/s ({} in {:.2} s) | {} MiB | {:.0} B | {} | {} · {} · {} ms | {} · {} ms |",
            r.placed,
            rate,
            r.window.0,
            r.window.1,
            rss.join(", "),
            per_group,
            rec.len(),
            percentile(rec, 50.0),
            percentile(rec, 99.0),
            rec.last().copied().unwrap_or(0),
            percentile(up, 50.0),
            up.last().copied().unwrap_or(0)
        );
    }
    println!(
        "(replica RSS with nodes registered and no group: {} MiB)",
        rss_empty
            .iter()
            .map(|b| format!("{:.0}", mib(*b)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
