//! `gangway bench shards`: the shard map and shard moves with three real processes.
//!
//! Registers zones of unequal size (nodes labelled `topology.kubernetes.io/zone`, the
//! replicas started with it as their topology label and automatic rebalancing off), and
//! prints: each shard's capacity as the old rule (a hash of the zone) would have laid the
//! zones out, as least-loaded placement did, and after `gangway shards rebalance` (its
//! moves and time); then the placement throughput of gangs submitted all at once, alone
//! and with a zone moving back and forth between two shards meanwhile, checking that every
//! gang was placed and that the ledgers hold exactly their members. With `--grow-to`, it
//! then grows the live cluster, rebalances onto the added shards and places again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::Client;
use gangway_proto::v1::NodeSpec;
use serde_json::json;

use crate::bench::e2e::{spawn_cluster_flags, wait_ready, wait_released};
use gangway_core::ledger::meta::hashed_shard;
use gangway_core::plan::rebalance::peak_percent;
use gangway_core::wire::WireFormat;

/// The topology label the benchmark's nodes carry and its replicas partition by.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Longest one phase may take, in s.
const PHASE_TIMEOUT_S: u64 = 300;
/// Most shards.
const SHARDS_MAX: u32 = 64;
/// Most nodes over every zone.
const NODES_MAX: usize = 20_000;
/// Pause between a status poll's reads, in ms.
const POLL_MS: u64 = 20;

/// `gangway bench shards` arguments.
#[derive(Debug, Clone, Args)]
pub struct ShardsBenchArgs {
    /// Shards.
    #[arg(long, default_value_t = 8)]
    pub shards: u32,
    /// Nodes per zone, comma-separated (one zone each).
    #[arg(long, default_value = "40,24,10,6")]
    pub zones: String,
    /// CPUs per node.
    #[arg(long, default_value_t = 64)]
    pub cpu: u32,
    /// Gangs submitted at once in each load phase.
    #[arg(long, default_value_t = 256)]
    pub gangs: usize,
    /// Members per gang (one cpu each).
    #[arg(long, default_value_t = 8)]
    pub gang_size: usize,
    /// Then grow the live cluster to this many shards (`gangctl shards grow`), rebalance
    /// onto the added ones and place the gangs again (0: no growth).
    #[arg(long, default_value_t = 0)]
    pub grow_to: u32,
}

fn zone_name(z: usize) -> String {
    format!("zone-{}", (b'a' + (z % 26) as u8) as char)
}

fn node(zone: &str, i: usize, cpu: u32) -> NodeSpec {
    let name = format!("{zone}-{i:05}");
    NodeSpec {
        name: name.clone(),
        labels: [
            ("kubernetes.io/hostname".to_string(), name),
            (ZONE_LABEL.to_string(), zone.to_string()),
        ]
        .into_iter()
        .collect(),
        allocatable: [
            ("cpu".to_string(), cpu.to_string()),
            ("memory".to_string(), "512Gi".to_string()),
            ("pods".to_string(), "110".to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// Each shard's allocatable cpu in millicores (index = shard id).
async fn loads(client: &Client, shards: u32) -> anyhow::Result<Vec<u64>> {
    let mut out = vec![0; shards as usize + 1];
    for s in client.shards().await? {
        if let Some(l) = out.get_mut(s.shard as usize) {
            *l = s.capacity_milli_cpu;
        }
    }
    Ok(out)
}

fn cpus(loads: &[u64]) -> String {
    let list: Vec<String> = loads
        .iter()
        .skip(1)
        .map(|l| (l / 1000).to_string())
        .collect();
    list.join(" / ")
}

/// Submits `gangs` gangs at once and waits until every one is placed; seconds taken.
async fn place_all(
    client: &Client,
    tag: &str,
    args: &ShardsBenchArgs,
) -> anyhow::Result<(f64, Vec<u64>)> {
    let pod = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
    let started = Instant::now();
    let mut ids = Vec::with_capacity(args.gangs);
    for g in 0..args.gangs {
        let name = format!("{tag}-{g}");
        let request = GangGroupBuilder::new(name.clone())
            .idempotency_key(name.clone())
            .gang(
                GangBuilder::new("bench", name, args.gang_size as u32).members(
                    "w",
                    args.gang_size as u32,
                    pod.clone(),
                ),
            )
            .build();
        ids.push(client.submit(request).await?.id);
    }
    let deadline = started + Duration::from_secs(PHASE_TIMEOUT_S);
    for id in &ids {
        loop {
            let status = client.get(*id).await?;
            match status.state.as_str() {
                "Placed" => break,
                "Queued" | "Placing" => {}
                other => bail!("gang group {id} ended {other}: {}", status.reason),
            }
            if Instant::now() > deadline {
                bail!("gang group {id} not placed within {PHASE_TIMEOUT_S} s");
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }
    Ok((started.elapsed().as_secs_f64(), ids))
}

/// Checks that the ledgers hold exactly the members of `ids`, then releases them.
async fn check_and_release(client: &Client, ids: &[u64]) -> anyhow::Result<()> {
    let mut listed: BTreeMap<String, u32> = BTreeMap::new();
    for id in ids {
        for p in client.get(*id).await?.placements {
            *listed.entry(p.node).or_default() += 1;
        }
    }
    let held: BTreeMap<String, u32> = client
        .list_nodes(None)
        .await?
        .into_iter()
        .filter_map(|n| Some((n.node?.name, n.pods)))
        .filter(|(_, p)| *p > 0)
        .collect();
    if held != listed {
        bail!("the ledgers hold other pods than the placed groups list");
    }
    for id in ids {
        client.release(*id).await?;
    }
    wait_released(client).await?;
    Ok(())
}

/// `gangctl shards rebalance`: its reply, the seconds it took and the nodes it moved.
async fn rebalance_timed(
    client: &Client,
) -> anyhow::Result<(gangway_proto::admin::RebalanceReply, f64, usize)> {
    let t = Instant::now();
    let reply = client.rebalance(0, false).await?;
    let seconds = t.elapsed().as_secs_f64();
    let moved = reply
        .moves
        .iter()
        .map(|m| m.sources.iter().map(|s| s.nodes.len()).sum::<usize>())
        .sum();
    Ok((reply, seconds, moved))
}

/// Moves `zone` between shards `a` and `b` until `stop`; moves made and their durations.
async fn ping_pong(
    client: Client,
    zone: String,
    (a, b): (u32, u32),
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Vec<u64>> {
    let mut took = Vec::new();
    let mut to = b;
    while !*stop.borrow() {
        let at = Instant::now();
        let reply = client
            .move_nodes(Some(zone.clone()), Vec::new(), to, true)
            .await?;
        let phase = reply.shard_move.map(|m| m.phase).unwrap_or_default();
        if phase != "done" {
            bail!("a move of {zone} ended {phase}");
        }
        took.push(at.elapsed().as_millis() as u64);
        to = if to == a { b } else { a };
    }
    took.sort_unstable();
    Ok(took)
}

/// Runs the benchmark and prints its tables.
pub async fn run(args: ShardsBenchArgs) -> anyhow::Result<()> {
    let sizes = crate::bench::e2e::parse_list("--zones", &args.zones)?;
    let total: usize = sizes.iter().sum();
    if !(2..=SHARDS_MAX).contains(&args.shards) {
        bail!("--shards: {} is not in 2..={SHARDS_MAX}", args.shards);
    }
    if sizes.is_empty() || total == 0 || total > NODES_MAX || sizes.len() > 26 {
        bail!("--zones: 1 to 26 zones of 1..={NODES_MAX} nodes in all");
    }
    if args.gangs == 0 || args.gang_size == 0 || args.cpu == 0 {
        bail!("--gangs, --gang-size and --cpu must be >= 1");
    }
    if args.grow_to != 0 && !(args.shards + 1..=SHARDS_MAX).contains(&args.grow_to) {
        bail!(
            "--grow-to: {} is not in {}..={SHARDS_MAX} (above --shards; 0: no growth)",
            args.grow_to,
            args.shards + 1
        );
    }
    let dir = std::env::temp_dir().join(format!("gangway-bench-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let extra = ["--topology-label", ZONE_LABEL, "--auto-rebalance", "false"]
        .map(String::from)
        .to_vec();
    let procs = spawn_cluster_flags(
        args.shards as usize,
        &dir,
        Vec::new(),
        WireFormat::Binary,
        extra,
    )?;
    let client = wait_ready(&procs.grpc).await?;
    client.balance().await?;

    // What hashing each zone onto a shard (the rule before the recorded map) gives.
    let node_milli = u64::from(args.cpu) * 1000;
    let mut hashed = vec![0u64; args.shards as usize + 1];
    for (z, count) in sizes.iter().enumerate() {
        let shard = hashed_shard("", Some(&zone_name(z)), args.shards) as usize;
        hashed[shard] += node_milli * *count as u64;
    }
    let t = Instant::now();
    for (z, count) in sizes.iter().enumerate() {
        for i in 0..*count {
            client
                .register_node(node(&zone_name(z), i, args.cpu))
                .await?;
        }
    }
    let registration_s = t.elapsed().as_secs_f64();
    let placed = loads(&client, args.shards).await?;
    let (reply, rebalance_s, moved) = rebalance_timed(&client).await?;
    let balanced = loads(&client, args.shards).await?;

    println!(
        "Zones {:?} ({total} nodes of {} cpu) on {} shards; capacity per shard in cpus:",
        sizes, args.cpu, args.shards
    );
    println!();
    println!("| layout | cpus per shard | heaviest shard / mean |");
    println!("|---|---|---:|");
    println!(
        "| zone hashed onto a shard (before) | {} | {}% |",
        cpus(&hashed),
        peak_percent(&hashed)
    );
    println!(
        "| new zone to the least loaded shard | {} | {}% |",
        cpus(&placed),
        peak_percent(&placed)
    );
    println!(
        "| after `gangctl shards rebalance` | {} | {}% |",
        cpus(&balanced),
        peak_percent(&balanced)
    );
    println!();
    println!(
        "Registration: {total} nodes in {registration_s:.1} s. Rebalance: {} moves, {moved} nodes, {rebalance_s:.2} s ({:.0} nodes/s).",
        reply.moves.len(),
        moved as f64 / rebalance_s.max(1e-9)
    );

    // Placement throughput without and with a zone moving between two shards.
    let (quiet_s, ids) = place_all(&client, "quiet", &args).await?;
    check_and_release(&client, &ids).await?;
    let zone = zone_name(sizes.len() - 1);
    let shards_now = client.shards().await?;
    let home = shards_now
        .iter()
        .find(|s| s.homes.contains(&zone))
        .map(|s| s.shard)
        .unwrap_or(1);
    let other = if home == 1 { 2 } else { 1 };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mover = tokio::spawn(ping_pong(
        client.clone(),
        zone.clone(),
        (home, other),
        stop_rx,
    ));
    let (moving_s, ids) = place_all(&client, "moving", &args).await?;
    stop_tx.send_replace(true);
    let took = mover.await??;
    check_and_release(&client, &ids).await?;
    let pods = (args.gangs * args.gang_size) as f64;
    println!();
    println!("| {} gangs of {} submitted at once | seconds | pods/s | moves meanwhile | p50 move | max move |", args.gangs, args.gang_size);
    println!("|---|---:|---:|---:|---:|---:|");
    println!("| no move | {quiet_s:.2} | {:.0} | 0 | | |", pods / quiet_s);
    println!(
        "| {zone} ({} nodes) moving between shards {home} and {other} | {moving_s:.2} | {:.0} | {} | {} ms | {} ms |",
        sizes[sizes.len() - 1],
        pods / moving_s,
        took.len(),
        crate::bench::percentile(&took, 50.0),
        took.last().copied().unwrap_or(0)
    );
    if args.grow_to != 0 {
        grow(&client, &args).await?;
    }
    println!();
    println!("Every gang placed, the ledgers held exactly their members, and all was released.");
    drop(procs);
    Ok(())
}

/// Grows the cluster to `--grow-to` shards, rebalances onto the added ones and places
/// the gangs again; prints what each step took.
async fn grow(client: &Client, args: &ShardsBenchArgs) -> anyhow::Result<()> {
    let before = loads(client, args.shards).await?;
    let t = Instant::now();
    let grown = client.grow_shards(args.grow_to).await?;
    let grow_s = t.elapsed().as_secs_f64();
    if !grown.not_ready.is_empty() {
        bail!(
            "added shards {:?} had no leader when the grow answered",
            grown.not_ready
        );
    }
    let (reply, rebalance_s, moved) = rebalance_timed(client).await?;
    let after = loads(client, args.grow_to).await?;
    let (placed_s, ids) = place_all(client, "grown", args).await?;
    check_and_release(client, &ids).await?;
    println!();
    println!(
        "Growing the live cluster from {} to {} shards (`gangctl shards grow`), then `gangctl shards rebalance`:",
        args.shards, args.grow_to
    );
    println!();
    println!("| step | seconds | cpus per shard | heaviest shard / mean |");
    println!("|---|---:|---|---:|");
    println!(
        "| before | | {} | {}% |",
        cpus(&before),
        peak_percent(&before)
    );
    println!("| grow (every added shard led) | {grow_s:.2} | | |");
    println!(
        "| rebalance: {} moves, {moved} nodes | {rebalance_s:.2} | {} | {}% |",
        reply.moves.len(),
        cpus(&after),
        peak_percent(&after)
    );
    println!(
        "| {} gangs of {} placed on the grown cluster | {placed_s:.2} ({:.0} pods/s) | | |",
        args.gangs,
        args.gang_size,
        (args.gangs * args.gang_size) as f64 / placed_s
    );
    Ok(())
}
