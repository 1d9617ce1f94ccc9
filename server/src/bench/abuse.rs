//! `gangway bench abuse`: how long a plain gang of one tenant takes from submission to
//! `Placed` while another tenant attacks the cluster, against the same gang on an idle
//! cluster. Three real `gangway serve` processes on 127.0.0.1 (the e2e bench's) with an
//! access policy: an administrator, the attacker `team-a` (at most
//! [`ATTACKER_LIVE_GROUPS_MAX`] live groups) and the victim `team-b`. The attacks, each
//! for as long as the victim's samples take:
//!
//! - `oversize`: submissions of 10,000 copies of a 1 MiB pod spec, from several loops;
//! - `watches`: 2,000 watch streams opened and held (the bound lets a few hundred through);
//! - `live-groups`: unplaceable groups submitted past the attacker's live-group bound;
//! - `state-hash`: `Status` with state hashes, which only administrators may ask;
//! - `admin`: membership changes and shard growth, which only administrators may make.
//!
//! Every attacker call is counted with the code it was answered. Processes and data
//! dirs are removed on every exit path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_client::spec::{GangBuilder, GangGroupBuilder};
use gangway_client::{Client, Credentials};
use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::shards_client::ShardsClient;
use gangway_proto::admin::{ChangeMembershipRequest, GrowShardsRequest, StatusRequest};
use gangway_proto::v1::scheduler_client::SchedulerClient;
use gangway_proto::v1::{SubmitGangGroupRequest, WatchGangGroupRequest};
use serde_json::json;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::e2e::{register_nodes, spawn_cluster_flags};
use super::percentile;
use gangway_core::wire::WireFormat;

/// Live groups the attacking tenant may have.
pub const ATTACKER_LIVE_GROUPS_MAX: u32 = 64;
/// Attack loops running at once (besides held watches).
pub const ATTACK_LOOPS: usize = 8;
/// Watch streams the `watches` attack asks for.
pub const WATCHES_ASKED: usize = 2_000;
/// Most samples per attack.
pub const ABUSE_SAMPLES_MAX: usize = 10_000;
/// Longest one victim gang may take to be placed.
pub const PLACE_TIMEOUT_S: u64 = 60;
/// How often the victim reads its group's state, in ms.
const POLL_MS: u64 = 2;

const ADMIN: &str = "bench-admin-token-0123456789";
const ATTACKER: &str = "bench-attacker-token-0123456789";
const VICTIM: &str = "bench-victim-token-0123456789";

/// Flags of `gangway bench abuse`.
#[derive(Debug, clap::Args)]
pub struct AbuseBenchArgs {
    /// Victim gangs placed per attack (and idle).
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// Shards of the cluster.
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Nodes registered (64 CPUs each).
    #[arg(long, default_value_t = 16)]
    pub nodes: usize,
    /// Attacks to run, comma-separated (oversize, watches, live-groups, state-hash, admin).
    #[arg(long, default_value = "oversize,watches,live-groups,state-hash,admin")]
    pub attacks: String,
}

/// The attacks, by name.
const ATTACKS: [&str; 5] = ["oversize", "watches", "live-groups", "state-hash", "admin"];

fn policy() -> String {
    format!(
        r#"identities:
  - {{name: ops, roles: [admin], tokens: [{ADMIN}]}}
  - name: team-a
    roles: [tenant]
    tokens: [{ATTACKER}]
    tenant: {{namespaces: [team-a], queues: [team-a], defaultQueue: team-a, maxPriority: 0, liveGroupsMax: {ATTACKER_LIVE_GROUPS_MAX}}}
  - name: team-b
    roles: [tenant]
    tokens: [{VICTIM}]
    tenant: {{namespaces: [team-b], queues: [team-b], defaultQueue: team-b, maxPriority: 0}}
"#
    )
}

#[derive(Clone)]
struct Bearer(String);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let value = format!("Bearer {}", self.0)
            .parse()
            .map_err(|_| tonic::Status::internal("token header"))?;
        req.metadata_mut().insert("authorization", value);
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Bearer>;

/// Codes the attacker's calls were answered with.
#[derive(Default)]
struct Answers(Mutex<BTreeMap<String, u64>>);

impl Answers {
    fn note<T>(&self, r: &Result<T, tonic::Status>) {
        let code = match r {
            Ok(_) => "OK".to_string(),
            Err(s) => format!("{:?}", s.code()),
        };
        if let Ok(mut a) = self.0.lock() {
            *a.entry(code).or_default() += 1;
        }
    }

    fn summary(&self) -> String {
        self.0
            .lock()
            .map(|a| {
                a.iter()
                    .map(|(c, n)| format!("{n} {c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    }
}

/// A Strict gang of `members` members of `pod`, in a group keyed and named `key`.
fn request(
    key: &str,
    namespace: &str,
    members: u32,
    pod: serde_json::Value,
) -> SubmitGangGroupRequest {
    GangGroupBuilder::new(key)
        .idempotency_key(key)
        .gang(GangBuilder::new(namespace, key, members).members("m", members, pod))
        .build()
}

/// One attack loop, until `stop`.
async fn attack(
    name: &str,
    loop_id: usize,
    ch: Channel,
    stop: Arc<AtomicBool>,
    answers: Arc<Answers>,
) {
    let token = Bearer(ATTACKER.into());
    let mut scheduler = SchedulerClient::with_interceptor(ch.clone(), token.clone());
    let mut admin = AdminClient::with_interceptor(ch.clone(), token.clone());
    let mut shards = ShardsClient::with_interceptor(ch, token);
    let huge_pod = {
        let labels: serde_json::Map<String, serde_json::Value> = (0..16_000)
            .map(|i| {
                (
                    format!("label-{i:05}"),
                    format!("value-{i:05}-of-a-label-xxxxxxxxxxxxxxxxxxxxxxxxxxx").into(),
                )
            })
            .collect();
        json!({"requests": {"cpu": "1"}, "labels": labels})
    };
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        match name {
            "oversize" => {
                let r = request(
                    &format!("huge-{loop_id}-{n}"),
                    "team-a",
                    10_000,
                    huge_pod.clone(),
                );
                answers.note(&scheduler.submit_gang_group(r).await);
            }
            "live-groups" => {
                let unfit = json!({"requests": {"cpu": "100000"}});
                let r = request(&format!("unfit-{loop_id}-{n}"), "team-a", 1, unfit);
                answers.note(&scheduler.submit_gang_group(r).await);
            }
            "state-hash" => {
                let r = admin
                    .status(StatusRequest {
                        include_state_hash: true,
                    })
                    .await;
                answers.note(&r);
            }
            "admin" => {
                let r = admin
                    .change_membership(ChangeMembershipRequest {
                        group_id: Some(0),
                        voters: vec![1],
                    })
                    .await;
                answers.note(&r);
                answers.note(&shards.grow_shards(GrowShardsRequest { shards: 256 }).await);
            }
            _ => return,
        }
    }
}

/// Opens watches as the attacker (kept until the returned streams are dropped).
async fn open_watches(
    ch: &Channel,
    group: u64,
    answers: &Answers,
) -> Vec<tonic::Streaming<gangway_proto::v1::GangGroupStatus>> {
    let mut scheduler: SchedulerClient<Svc> =
        SchedulerClient::with_interceptor(ch.clone(), Bearer(ATTACKER.into()));
    let mut open = Vec::new();
    for _ in 0..WATCHES_ASKED {
        let r = scheduler
            .watch_gang_group(WatchGangGroupRequest {
                id: group,
                after_version: 0,
            })
            .await;
        answers.note(&r);
        if let Ok(stream) = r {
            open.push(stream.into_inner());
        }
    }
    open
}

/// One victim gang: submitted, placed, released; the µs to `Placed`.
async fn victim_sample(victim: &Client, key: &str) -> anyhow::Result<u64> {
    let start = Instant::now();
    let id = victim
        .submit(request(key, "team-b", 4, json!({"requests": {"cpu": "1"}})))
        .await?
        .id;
    loop {
        let s = victim.get(id).await?;
        if s.state == "Placed" {
            break;
        }
        if start.elapsed() > Duration::from_secs(PLACE_TIMEOUT_S) {
            bail!(
                "victim gang {key} not placed within {PLACE_TIMEOUT_S} s: {}",
                s.state
            );
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    let placed = start.elapsed().as_micros() as u64;
    victim.release(id).await?;
    Ok(placed)
}

async fn samples(victim: &Client, label: &str, n: usize) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(victim_sample(victim, &format!("victim-{label}-{i}")).await?);
    }
    out.sort_unstable();
    Ok(out)
}

/// Runs the benchmark and prints a markdown table.
pub async fn run(args: AbuseBenchArgs) -> anyhow::Result<()> {
    if !(1..=ABUSE_SAMPLES_MAX).contains(&args.samples) {
        bail!(
            "--samples: {} is not in 1..={ABUSE_SAMPLES_MAX}",
            args.samples
        );
    }
    let mut attacks: Vec<&'static str> = Vec::new();
    for asked in args.attacks.split(',').map(str::trim) {
        match ATTACKS.iter().find(|a| **a == asked) {
            Some(a) => attacks.push(a),
            None => bail!("--attacks: {asked:?} is not one of {}", ATTACKS.join(", ")),
        }
    }
    let dir = std::env::temp_dir().join(format!("gangway-bench-abuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let policy_path = dir.join("policy.yaml");
    std::fs::write(&policy_path, policy())?;
    let extra = vec![
        "--policy-file".to_string(),
        policy_path.display().to_string(),
    ];
    let procs = spawn_cluster_flags(args.shards, &dir, Vec::new(), WireFormat::default(), extra)?;
    let as_who = |token: &str| Credentials {
        tls: None,
        token: Some(token.to_string()),
    };
    // Wait for leaders as the administrator (`e2e::wait_ready` sends no token).
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(admin) = Client::connect_with(&procs.grpc, as_who(ADMIN)).await {
                if let Ok(s) = admin.status(false).await {
                    if s.groups.iter().all(|g| g.leader != 0) {
                        return admin;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let Ok(admin) = ready else {
        bail!("the benchmark cluster did not elect its leaders within 30 s");
    };
    for q in ["team-a", "team-b"] {
        admin
            .put_queue(gangway_proto::admin::QueueSpec {
                name: q.into(),
                weight: 1,
                ..Default::default()
            })
            .await?;
    }
    register_nodes(&admin, args.nodes)
        .await
        .context("registering the fleet")?;
    let victim = Client::connect_with(&procs.grpc, as_who(VICTIM)).await?;
    let attacker = Client::connect_with(&procs.grpc, as_who(ATTACKER)).await?;
    let target = attacker
        .submit(request(
            "attacker-own",
            "team-a",
            1,
            json!({"requests": {"cpu": "1"}}),
        ))
        .await?
        .id;
    // Warm-up, then the idle figure.
    samples(&victim, "warmup", 5.min(args.samples)).await?;
    let idle = samples(&victim, "idle", args.samples).await?;
    let channel = Endpoint::from_shared(format!("http://{}", procs.grpc[0]))?
        .connect()
        .await?;
    let mut rows = Vec::new();
    for name in attacks {
        let answers = Arc::new(Answers::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = Vec::new();
        let mut held = Vec::new();
        if name == "watches" {
            held = open_watches(&channel, target, &answers).await;
        } else {
            for i in 0..ATTACK_LOOPS {
                loops.push(tokio::spawn(attack(
                    name,
                    i,
                    channel.clone(),
                    stop.clone(),
                    answers.clone(),
                )));
            }
            // Let the attack reach its steady state.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let rss_before = procs
            .pids()
            .first()
            .and_then(|p| super::rss_bytes(Some(*p)));
        let under = samples(&victim, name, args.samples).await;
        stop.store(true, Ordering::Relaxed);
        for l in loops {
            let _ = l.await;
        }
        let rss_after = procs
            .pids()
            .first()
            .and_then(|p| super::rss_bytes(Some(*p)));
        drop(held);
        rows.push((name, under?, answers.summary(), rss_before, rss_after));
        // The next attack starts from the same state: the attacker's groups (but the one
        // its watches follow) are cancelled.
        for g in attacker.list_groups(false).await? {
            if g.id != target {
                attacker.cancel(g.id).await?;
            }
        }
    }
    drop(procs);
    let ms = |us: u64| us as f64 / 1e3;
    let (idle50, idle99) = (percentile(&idle, 50.0), percentile(&idle, 99.0));
    println!("| attack | samples | p50 placed | p99 placed | p99 / idle p99 | replica 1 RSS before → after | attacker's calls answered |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    println!(
        "| none (idle) | {} | {:.1} ms | {:.1} ms | 1.00 | | |",
        idle.len(),
        ms(idle50),
        ms(idle99)
    );
    for (name, s, answers, before, after) in rows {
        let mib =
            |b: Option<u64>| b.map_or("?".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
        println!(
            "| {name} | {} | {:.1} ms | {:.1} ms | {:.2} | {} → {} | {answers} |",
            s.len(),
            ms(percentile(&s, 50.0)),
            ms(percentile(&s, 99.0)),
            percentile(&s, 99.0) as f64 / idle99.max(1) as f64,
            mib(before),
            mib(after),
        );
    }
    Ok(())
}
