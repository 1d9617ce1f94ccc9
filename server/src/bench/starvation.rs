//! `gangway bench starvation`: whether a large gang starves behind a stream of small ones.
//! For each mode (`--head-reservations` off, reserve, backfill) a fresh three-process
//! cluster (this binary on 127.0.0.1) of nodes with 8 GPUs is kept busy by small gangs
//! of whole-node pods (8 GPUs each), each declaring a run time drawn uniformly from
//! `--run-min-seconds..=--run-max-seconds` as its run-time limit, so gangway releases it
//! when its time ends. They arrive at random (exponential gaps) at a rate offering
//! `--load-percent` of the cluster, so every freed node has takers. At `--big-at-seconds`
//! one gang of `--big-percent` of the nodes arrives, of higher priority (it is first in
//! line) and never preempting (its pods' `preemptionPolicy: Never`), so only reservations
//! can get it room.
//! Measured: the big gang's wait (submission to placed), and the GPUs held (as the
//! benchmark observes placements and releases) over the run and over the big gang's wait.
//! The same seed draws the same gangs in every mode. Processes and data dirs are removed
//! on every exit path.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use serde_json::json;

use super::e2e::{changes_since, cpu_seconds, register_nodes, spawn_cluster_flags, wait_ready};
use gangway_core::plan::backfill::ReservationMode;

/// GPUs per node (what `register_nodes` gives each).
const GPUS_PER_NODE: u64 = 8;
/// How often the benchmark reads changes, submits the arrivals due and samples usage, in ms.
const TICK_MS: u64 = 200;
/// Most nodes the benchmark registers.
pub const NODES_MAX: usize = 5_000;
/// Highest offered load, in percent of the cluster.
pub const LOAD_PERCENT_MAX: u64 = 400;
/// Most small gangs one run submits.
pub const SUBMISSIONS_MAX: usize = 200_000;
/// The big gang's priority (the small gangs' is 0).
const BIG_PRIORITY: i32 = 10;

/// Flags of `gangway bench starvation`.
#[derive(Debug, clap::Args)]
pub struct StarvationBenchArgs {
    /// Shards.
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Nodes registered (8 GPUs each).
    #[arg(long, default_value_t = 1_024)]
    pub nodes: usize,
    /// Nodes a small gang takes at most (one 8-GPU pod per node; at least one).
    #[arg(long, default_value_t = 4)]
    pub small_max_nodes: u64,
    /// Shortest run time of a small gang, in seconds.
    #[arg(long, default_value_t = 5)]
    pub run_min_seconds: u64,
    /// Longest run time of a small gang, in seconds.
    #[arg(long, default_value_t = 30)]
    pub run_max_seconds: u64,
    /// The small gangs' offered load, in percent of the cluster's node-seconds (above
    /// 100 keeps a queue, so freed nodes always have takers).
    #[arg(long, default_value_t = 110)]
    pub load_percent: u64,
    /// When the big gang arrives, in seconds from the start.
    #[arg(long, default_value_t = 60)]
    pub big_at_seconds: u64,
    /// The big gang's size, in percent of the nodes.
    #[arg(long, default_value_t = 75)]
    pub big_percent: u64,
    /// How long the big gang runs once placed, in seconds.
    #[arg(long, default_value_t = 10)]
    pub big_run_seconds: u64,
    /// How long the big gang may wait before the run stops and reports it unplaced.
    #[arg(long, default_value_t = 120)]
    pub give_up_seconds: u64,
    /// Modes to run, comma-separated: off, reserve, backfill.
    #[arg(long, default_value = "off,reserve,backfill")]
    pub modes: String,
    /// Seed of the small gangs' sizes and run times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// A small deterministic generator (SplitMix64): the same gangs in every mode.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// Exponential with mean `mean` (a gap between random arrivals).
    fn exponential(&mut self, mean: f64) -> f64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        -mean * (1.0 - u).ln()
    }
}

/// What one mode measured.
struct Outcome {
    mode: ReservationMode,
    /// Seconds from the big gang's submission to its placement (None: not within
    /// `--give-up-seconds`).
    big_wait_s: Option<f64>,
    /// Mean share of GPUs held, from the first time the cluster was full to the end.
    busy_run: f64,
    /// Mean share of GPUs held while the big gang waited.
    busy_waiting: f64,
    small_placed: u64,
    cpu_cores: f64,
}

/// A group the benchmark submitted and has not seen end.
struct Live {
    gpus: u64,
    placed: bool,
}

fn pod() -> serde_json::Value {
    json!({"requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": GPUS_PER_NODE.to_string()}})
}

/// The big gang's pod: first in line, and never preempting.
fn big_pod() -> serde_json::Value {
    let mut pod = pod();
    pod["priority"] = json!(BIG_PRIORITY);
    pod["preemptionPolicy"] = json!("Never");
    pod
}

fn small(i: usize, nodes: u64, run_s: u64) -> gangway_proto::v1::SubmitGangGroupRequest {
    let name = format!("small-{i:06}");
    GangGroupBuilder::new(name.clone())
        .idempotency_key(name.clone())
        .run_limit(Duration::from_secs(run_s))
        .gang(GangBuilder::new("bench", name, nodes as u32).members("w", nodes as u32, pod()))
        .build()
}

fn big(members: u64) -> gangway_proto::v1::SubmitGangGroupRequest {
    GangGroupBuilder::new("big")
        .idempotency_key("big")
        .gang(
            GangBuilder::new("bench", "big", members as u32)
                .priority(BIG_PRIORITY)
                .members("w", members as u32, big_pod()),
        )
        .build()
}

async fn run_mode(args: &StarvationBenchArgs, mode: ReservationMode) -> anyhow::Result<Outcome> {
    let dir = std::env::temp_dir().join(format!(
        "gangway-bench-starvation-{}-{}",
        std::process::id(),
        mode.name()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let extra = vec!["--head-reservations".to_string(), mode.name().to_string()];
    let procs = spawn_cluster_flags(args.shards, &dir, Vec::new(), Default::default(), extra)?;
    let client = wait_ready(&procs.grpc).await?;
    register_nodes(&client, args.nodes).await?;
    let pids = procs.pids();
    let cpu_before = cpu_seconds(&pids);

    let total_gpus = args.nodes as u64 * GPUS_PER_NODE;
    let big_members = (args.nodes as u64 * args.big_percent / 100).max(1);
    let mut draws = Draws(args.seed);
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut submitted = 0usize;
    // Node-seconds a small gang asks on average, and the gap between arrivals that
    // offers `--load-percent` of the cluster.
    let mean_demand = (1 + args.small_max_nodes) as f64 / 2.0
        * (args.run_min_seconds + args.run_max_seconds) as f64
        / 2.0;
    let mean_gap_s = mean_demand / (args.nodes as f64 * args.load_percent as f64 / 100.0);
    let mut next_arrival_s = 0.0f64;
    let mut small_placed = 0u64;
    let (_, mut stamp) = changes_since(&client, 0).await?;
    let start = Instant::now();
    let big_at = start + Duration::from_secs(args.big_at_seconds);
    let mut big_id: Option<u64> = None;
    let mut big_submitted: Option<Instant> = None;
    let mut big_placed: Option<Instant> = None;
    let mut full_since: Option<Instant> = None;
    // (when, GPUs held) samples.
    let mut samples: Vec<(Instant, u64)> = Vec::new();
    loop {
        let now = Instant::now();
        if big_id.is_none() && now >= big_at {
            let id = client.submit(big(big_members)).await?.id;
            live.insert(
                id,
                Live {
                    gpus: big_members * GPUS_PER_NODE,
                    placed: false,
                },
            );
            big_id = Some(id);
            big_submitted = Some(now);
        }
        while next_arrival_s <= start.elapsed().as_secs_f64() {
            if submitted >= SUBMISSIONS_MAX {
                bail!("{SUBMISSIONS_MAX} small gangs submitted: shorten the run");
            }
            next_arrival_s += draws.exponential(mean_gap_s);
            let nodes = draws.between(1, args.small_max_nodes);
            let run_s = draws.between(args.run_min_seconds, args.run_max_seconds);
            let id = client.submit(small(submitted, nodes, run_s)).await?.id;
            submitted += 1;
            live.insert(
                id,
                Live {
                    gpus: nodes * GPUS_PER_NODE,
                    placed: false,
                },
            );
        }
        let (changed, next) = changes_since(&client, stamp).await?;
        stamp = next;
        for g in changed {
            let Some(l) = live.get_mut(&g.id) else {
                continue;
            };
            match g.state.as_str() {
                "Placed" if !l.placed => {
                    l.placed = true;
                    if Some(g.id) == big_id {
                        big_placed = Some(Instant::now());
                    } else {
                        small_placed += 1;
                    }
                }
                "Released" | "Cancelled" | "TimedOut" | "Preempted" => {
                    live.remove(&g.id);
                }
                _ => {}
            }
        }
        let held: u64 = live.values().filter(|l| l.placed).map(|l| l.gpus).sum();
        samples.push((Instant::now(), held));
        if full_since.is_none() && held * 100 >= total_gpus * 95 {
            full_since = Some(Instant::now());
        }
        if let Some(placed) = big_placed {
            if placed.elapsed() >= Duration::from_secs(args.big_run_seconds) {
                if let Some(id) = big_id {
                    client.release(id).await?;
                }
                break;
            }
        } else if big_submitted
            .is_some_and(|at| at.elapsed() >= Duration::from_secs(args.give_up_seconds))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
    }
    let cpu_cores = (cpu_seconds(&pids) - cpu_before) / start.elapsed().as_secs_f64();
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
    let Some(full_since) = full_since else {
        bail!("the small gangs never held 95% of the GPUs: raise --load-percent");
    };
    let waited_until = big_placed.unwrap_or_else(Instant::now);
    let mean = |from: Instant, to: Instant| {
        let window: Vec<u64> = samples
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, held)| *held)
            .collect();
        let sum: u64 = window.iter().sum();
        sum as f64 / window.len().max(1) as f64 / total_gpus as f64
    };
    let end = samples.last().map_or(full_since, |(at, _)| *at);
    Ok(Outcome {
        mode,
        big_wait_s: match (big_submitted, big_placed) {
            (Some(s), Some(p)) => Some(p.duration_since(s).as_secs_f64()),
            _ => None,
        },
        busy_run: mean(full_since, end),
        busy_waiting: mean(big_submitted.unwrap_or(end), waited_until),
        small_placed,
        cpu_cores,
    })
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: StarvationBenchArgs) -> anyhow::Result<()> {
    if args.nodes == 0 || args.nodes > NODES_MAX {
        bail!("--nodes: {} is not between 1 and {NODES_MAX}", args.nodes);
    }
    if args.shards == 0 {
        bail!("--shards must be at least 1");
    }
    if args.small_max_nodes == 0 || args.small_max_nodes as usize > args.nodes {
        bail!(
            "--small-max-nodes: {} is not between 1 and --nodes",
            args.small_max_nodes
        );
    }
    if args.run_min_seconds == 0 || args.run_min_seconds > args.run_max_seconds {
        bail!("--run-min-seconds must be at least 1 and at most --run-max-seconds");
    }
    if args.load_percent == 0 || args.load_percent > LOAD_PERCENT_MAX {
        bail!(
            "--load-percent: {} is not between 1 and {LOAD_PERCENT_MAX}",
            args.load_percent
        );
    }
    if args.big_percent == 0 || args.big_percent > 100 {
        bail!(
            "--big-percent: {} is not between 1 and 100",
            args.big_percent
        );
    }
    let modes = args
        .modes
        .split(',')
        .map(|m| {
            m.parse::<ReservationMode>()
                .map_err(|e| anyhow::anyhow!("--modes: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut outcomes = Vec::new();
    for mode in modes {
        outcomes.push(run_mode(&args, mode).await?);
    }
    println!(
        "| --head-reservations | big gang's wait (s) | GPUs busy over the run | GPUs busy while it waited | small gangs placed | CPU (cores, 3 replicas) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for o in &outcomes {
        let wait = match o.big_wait_s {
            Some(s) => format!("{s:.1}"),
            None => format!("not placed in {} s", args.give_up_seconds),
        };
        println!(
            "| {} | {} | {:.1}% | {:.1}% | {} | {:.2} |",
            o.mode.name(),
            wait,
            o.busy_run * 100.0,
            o.busy_waiting * 100.0,
            o.small_placed,
            o.cpu_cores
        );
    }
    println!(
        "goal with backfill: a wait of at most {} s (the longest small run time plus 5 s), at least 90% busy",
        args.run_max_seconds + 5
    );
    Ok(())
}
