//! Drills by name: start a cluster, run the workload, inject the drill's
//! faults on a schedule drawn from the seed, heal, quiesce, read the final
//! state and check it. The runner owns the supervisor (so it alone signals
//! processes) and the workload's tasks (stopped and joined before return).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::checker::{self, FinalState, GroupHash, Verdict, Violation};
use crate::history::{Entry, Event, History};
use crate::kube_workload::{self, KubeWorkload};
use crate::proxy::LinkMode;
use crate::rng::Rng;
use crate::supervisor::{ClusterSpec, Supervisor, SupervisorError};
use crate::workload::{self, CallResult, Replicas, Workload, TERMINAL};
use gangway_kube_double::store::PODS;
use gangway_kube_double::ApiServerDouble;

/// Crash point: coordinator between reserve and decide.
pub const FP_AFTER_RESERVE: &str = "coordinator-after-reserve";
/// Crash point: coordinator between decide and commit.
pub const FP_AFTER_DECIDE: &str = "coordinator-after-decide";
/// Crash point: a participant (shard leader) during reserve.
pub const FP_PARTICIPANT: &str = "participant-after-reserve";
/// Crash point: a shard leader bound a pod through the API and has not recorded it.
pub const FP_BINDER: &str = "binder-after-bind";
/// Crash point: coordinator between a preemption's displacing reservations and its decision.
pub const FP_PREEMPT_AFTER_RESERVE: &str = "coordinator-preemption-after-reserve";
/// Crash point: coordinator between a preemption's COMMIT and telling the shards.
pub const FP_PREEMPT_AFTER_DECIDE: &str = "coordinator-preemption-after-decide";
/// Crash point: the coordinator has a shard move's parcels and has not had the target adopt them.
pub const FP_MOVE_AFTER_HANDOFF: &str = "coordinator-move-after-handoff";
/// Bug switch for the checker's self-test: COMMIT sent with no decision written.
pub const BUG_SKIP_DECISION: &str = "coordinator-skips-decision";
/// Bug switch: ReleaseMembers frees shard slots before meta agrees.
pub const BUG_RELEASE_SHARDS_FIRST: &str = "release-members-shards-first";
/// Bug switch: a NonStrict group planned again plans the members it holds.
pub const BUG_REPLAN_HELD: &str = "coordinator-replans-held-members";
/// Bug switch: the Raft transport serves clients.
pub const BUG_TRANSPORT_OPEN: &str = "raft-transport-open-to-clients";
/// Bug switch: meta forgets decisions participants have not acknowledged.
pub const BUG_FORGET_UNACKED: &str = "meta-forgets-unacknowledged-decisions";
/// Bug switch: the binder binds a preemptor's pods before its victims' pods are gone.
pub const BUG_BIND_BEFORE_VICTIMS: &str = "binder-binds-before-victims-leave";
/// Bug switch: meta accepts a new group declaring a gang a Placed group declares.
pub const BUG_TWINS_OF_PLACED: &str = "meta-admits-twins-of-placed-groups";
/// Bug switch: plans leave out the gangs' topology constraints.
pub const BUG_PLANS_WITHOUT_TOPOLOGY: &str = "coordinator-plans-without-topology";
/// Every bug switch a drill may arm.
pub const BUGS: [&str; 8] = [
    BUG_SKIP_DECISION,
    BUG_RELEASE_SHARDS_FIRST,
    BUG_BIND_BEFORE_VICTIMS,
    BUG_REPLAN_HELD,
    BUG_TRANSPORT_OPEN,
    BUG_FORGET_UNACKED,
    BUG_TWINS_OF_PLACED,
    BUG_PLANS_WITHOUT_TOPOLOGY,
];
/// The bug switches the self-test arms, one per drill; the checker must catch each.
/// Not `BUG_REPLAN_HELD`: meta's commit point refuses the double placement it
/// causes (rule 8), so what remains is a group that never completes, a liveness
/// failure the checker does not judge under faults. Not `BUG_FORGET_UNACKED`: a
/// forgotten decision costs members only once a group outlives its reservations'
/// deadline (10 s) after a participant missed COMMIT, and the workload's groups are
/// released long before; the release commits first, so the final state is clean.
/// `server/tests/two_phase.rs` finds both without faults.
pub const SELF_TEST_BUGS: [&str; 5] = [
    BUG_SKIP_DECISION,
    BUG_RELEASE_SHARDS_FIRST,
    BUG_TRANSPORT_OPEN,
    BUG_TWINS_OF_PLACED,
    BUG_PLANS_WITHOUT_TOPOLOGY,
];
/// Crash points every drill's replicas honour (disarmed until a fault arms one).
pub const CRASH_POINTS: [&str; 7] = [
    FP_AFTER_RESERVE,
    FP_AFTER_DECIDE,
    FP_PARTICIPANT,
    FP_BINDER,
    FP_PREEMPT_AFTER_RESERVE,
    FP_PREEMPT_AFTER_DECIDE,
    FP_MOVE_AFTER_HANDOFF,
];

/// Time the cluster may take to elect every leader at start and after a heal.
pub const READY_TIMEOUT_MS: u64 = 30_000;
/// Time an armed crash point may take to fire before it is disarmed.
pub const ARMED_WINDOW_MS: u64 = 4_000;
/// Time the workers may take to finish their operation once told to stop.
pub const WORKERS_STOP_MS: u64 = 5_000;
/// Time for every group to settle (no Placing, Releasing or Queued) after the workload stops.
pub const QUIESCE_MS: u64 = 25_000;
/// Time for replicas to reach equal applied indexes for the hash comparison.
pub const CONVERGE_MS: u64 = 15_000;
/// Time a shard move still running when the groups settled may take to end.
pub const MOVES_SETTLE_MS: u64 = 30_000;
/// Pause between the mover's attempts to begin a shard move, in ms (lower, upper).
pub const MOVER_GAP_MS: (u64, u64) = (200, 700);
/// Interval at which the runner looks for replicas that exited on their own.
pub const WATCH_MS: u64 = 50;

/// The named drills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DrillKind {
    /// SIGKILL the leader of a group (meta or shard), restart it.
    LeaderKill,
    /// Crash the coordinator between reserve and decide, or decide and commit.
    #[value(name = "coordinator-kill-mid-2pc")]
    #[serde(rename = "coordinator-kill-mid-2pc")]
    CoordinatorKillMid2pc,
    /// Crash a participant shard leader right after it applied a reservation.
    ParticipantKillMidReserve,
    /// Pods through Kubernetes: crash a shard leader right after a binding, before it
    /// is recorded, or SIGKILL a shard leader while it binds.
    BinderKill,
    /// Isolate a group's leader in a minority of one.
    PartitionLeaderMinority,
    /// SIGSTOP a group's leader, then SIGCONT.
    PauseLeader,
    /// Restart every replica in turn (SIGTERM, start, wait ready).
    RollingRestart,
    /// SIGKILL every replica, start them all again.
    FullRestart,
    /// Urgent groups preempt wide ones: crash the coordinator inside a preemption
    /// (between its reservations and its decision, or its decision and commit), or kill
    /// the meta leader.
    Preemption,
    /// Nodes move between shards all along: crash the coordinator between a move's
    /// handoff and its adoption, or kill the meta leader or a shard leader mid-move.
    ShardMove,
    /// All of the above and more (follower faults, 2/1 splits, one-way loss, latency).
    Mixed,
}

impl DrillKind {
    /// Every drill, in the order `list` and `ci` use.
    pub const ALL: [DrillKind; 11] = [
        Self::LeaderKill,
        Self::CoordinatorKillMid2pc,
        Self::ParticipantKillMidReserve,
        Self::BinderKill,
        Self::PartitionLeaderMinority,
        Self::PauseLeader,
        Self::RollingRestart,
        Self::FullRestart,
        Self::Preemption,
        Self::ShardMove,
        Self::Mixed,
    ];

    /// The drill's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::LeaderKill => "leader-kill",
            Self::CoordinatorKillMid2pc => "coordinator-kill-mid-2pc",
            Self::ParticipantKillMidReserve => "participant-kill-mid-reserve",
            Self::BinderKill => "binder-kill",
            Self::PartitionLeaderMinority => "partition-leader-minority",
            Self::PauseLeader => "pause-leader",
            Self::RollingRestart => "rolling-restart",
            Self::FullRestart => "full-restart",
            Self::Preemption => "preemption",
            Self::ShardMove => "shard-move",
            Self::Mixed => "mixed",
        }
    }
}

/// One drill's settings.
#[derive(Debug, Clone)]
pub struct DrillSpec {
    /// Which drill.
    pub kind: DrillKind,
    /// Seed of the fault schedule and workload.
    pub seed: u64,
    /// How long faults are injected.
    pub duration_ms: u64,
    /// Replicas.
    pub replicas: u64,
    /// Shards.
    pub shards: u32,
    /// The gangway binary.
    pub bin: PathBuf,
    /// Work dir (data dirs, logs, history).
    pub dir: PathBuf,
    /// First port, or None for free ones.
    pub base_port: Option<u16>,
    /// Bug switches to arm (self-test only).
    pub bugs: Vec<String>,
}

/// One fault as planned from the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillLeader(u64),
    KillFollower,
    PauseLeader(u64),
    IsolateLeader(u64),
    IsolateFollower,
    /// Two replicas (one a leader) cut off from the rest... with 3 replicas, 2/1 with the
    /// leader of the group on the minority or the majority side.
    Split {
        group: u64,
        leader_in_minority: bool,
    },
    /// The leader of a group stops reaching one follower (the other way works).
    OneWay(u64),
    /// Every link delayed by this many ms.
    Latency(u64),
    CrashPoint(&'static str),
    FullRestart,
    RollingRestart,
}

impl Fault {
    fn name(self) -> String {
        match self {
            Self::KillLeader(g) => format!("kill-leader-of-group-{g}"),
            Self::KillFollower => "kill-follower".into(),
            Self::PauseLeader(g) => format!("pause-leader-of-group-{g}"),
            Self::IsolateLeader(g) => format!("isolate-leader-of-group-{g}"),
            Self::IsolateFollower => "isolate-follower".into(),
            Self::Split {
                group,
                leader_in_minority,
            } => format!(
                "split-2-1-leader-of-group-{group}-in-{}",
                if leader_in_minority {
                    "minority"
                } else {
                    "majority"
                }
            ),
            Self::OneWay(g) => format!("one-way-loss-from-leader-of-group-{g}"),
            Self::Latency(ms) => format!("latency-{ms}ms"),
            Self::CrashPoint(p) => format!("crash-point-{p}"),
            Self::FullRestart => "full-restart".into(),
            Self::RollingRestart => "rolling-restart".into(),
        }
    }
}

/// What a drill produced.
#[derive(Debug, Clone, Serialize)]
pub struct DrillReport {
    /// Drill name.
    pub drill: String,
    /// Seed.
    pub seed: u64,
    /// Fault window (ms).
    pub duration_ms: u64,
    /// Wall time of the whole drill (ms).
    pub elapsed_ms: u64,
    /// Faults injected.
    pub faults: Vec<String>,
    /// Operations invoked / ok / fail / unknown.
    pub operations: OperationCounts,
    /// Gang groups that ended Preempted (what the preemption paths were exercised by).
    pub preempted: usize,
    /// Shard moves the `shard-move` drill's mover began.
    pub moves_begun: u64,
    /// The shard count at the start and at the end (the `shard-move` drill grows it).
    pub shards: (u32, u32),
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Recovery per fault.
    pub recoveries: Vec<checker::Recovery>,
    /// The command that replays this drill.
    pub replay: String,
    /// Where the history and logs are (kept when a violation is found).
    pub work_dir: String,
}

/// Operation outcomes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OperationCounts {
    /// Invoked.
    pub invoked: u64,
    /// Acknowledged.
    pub ok: u64,
    /// Refused.
    pub fail: u64,
    /// Unknown.
    pub unknown: u64,
}

fn count(history: &[Entry]) -> OperationCounts {
    let mut c = OperationCounts::default();
    for e in history {
        match e.event {
            Event::Invoke { .. } => c.invoked += 1,
            Event::Ok { .. } => c.ok += 1,
            Event::Fail { .. } => c.fail += 1,
            Event::Unknown { .. } => c.unknown += 1,
            _ => {}
        }
    }
    c
}

/// The command line that replays `spec`.
pub fn replay_command(spec: &DrillSpec) -> String {
    let mut cmd = format!(
        "gangway-chaos run --drill {} --seed {} --duration {}ms",
        spec.kind.name(),
        spec.seed,
        spec.duration_ms
    );
    if spec.replicas != 3 {
        cmd.push_str(&format!(" --replicas {}", spec.replicas));
    }
    if spec.shards != 2 {
        cmd.push_str(&format!(" --shards {}", spec.shards));
    }
    for b in &spec.bugs {
        cmd.push_str(&format!(" --bug {b}"));
    }
    cmd
}

/// Runs one drill to the end. `Err` only when it cannot start.
pub async fn run(spec: DrillSpec) -> Result<DrillReport, SupervisorError> {
    let started = Instant::now();
    let mut failpoints: Vec<String> = CRASH_POINTS.iter().map(|s| s.to_string()).collect();
    failpoints.extend(spec.bugs.iter().cloned());
    let kube = spec.kind == DrillKind::BinderKill;
    let mut extra_args = Vec::new();
    let api = if kube {
        std::fs::create_dir_all(&spec.dir).map_err(|e| SupervisorError::DataDir {
            path: spec.dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let kubeconfig = spec.dir.join("kubeconfig");
        let api = kube_workload::start_api(&kubeconfig)
            .await
            .map_err(|e| SupervisorError::Os {
                what: "start the API server double".into(),
                reason: e.to_string(),
            })?;
        extra_args.push("--kubeconfig".to_string());
        extra_args.push(kubeconfig.display().to_string());
        Some(Arc::new(api))
    } else {
        None
    };
    let cluster = ClusterSpec {
        bin: spec.bin.clone(),
        replicas: spec.replicas,
        shards: spec.shards,
        dir: spec.dir.clone(),
        base_port: spec.base_port,
        failpoints,
        cluster_id: format!("chaos-{}", spec.seed),
        extra_args,
    };
    let sup = Supervisor::start(cluster).await?;
    for p in CRASH_POINTS {
        sup.disarm(p);
    }
    let history = History::new(Some(&spec.dir.join("history.jsonl"))).map_err(|e| {
        SupervisorError::DataDir {
            path: spec.dir.display().to_string(),
            reason: e.to_string(),
        }
    })?;
    let mut runner = Runner {
        sup,
        history: history.clone(),
        rng: Rng::new(spec.seed),
        spec: spec.clone(),
        next_fault: 1,
        faults: Vec::new(),
        violations: Vec::new(),
    };
    runner.sup.wait_ready(READY_TIMEOUT_MS).await?;
    let replicas = Arc::new(Replicas::new(runner.sup.endpoints()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let workload = Workload::new(
        replicas.clone(),
        history.clone(),
        format!("s{}", spec.seed),
        format!("chaos-{}", spec.seed),
    );
    let (agents, mut workers) = match &api {
        None => {
            let agents = start_fleet(&replicas, spec.shards, &stop_rx).await?;
            let mix = match spec.kind {
                DrillKind::Preemption => workload::Mix::Preemption,
                _ => workload::Mix::Default,
            };
            (
                agents,
                workload.spawn(&mut runner.rng, stop_rx.clone(), mix),
            )
        }
        Some(api) => {
            let kube = KubeWorkload::new(api.clone(), history.clone());
            (Vec::new(), kube.spawn(&mut runner.rng, stop_rx.clone()))
        }
    };

    let mover = (spec.kind == DrillKind::ShardMove).then(|| {
        tokio::spawn(mover(
            replicas.clone(),
            spec.shards,
            Rng::new(spec.seed ^ 0x5eed),
            stop_rx.clone(),
        ))
    });
    runner.inject_faults().await;
    runner.heal_everything().await;
    runner.await_recovery().await;

    stop_tx.send_replace(true);
    let joined = tokio::time::timeout(Duration::from_millis(WORKERS_STOP_MS), async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if joined.is_err() {
        workers.abort_all();
    }
    let (moves_begun, shards_after) = match mover {
        Some(m) => m.await.unwrap_or((0, spec.shards)),
        None => (0, spec.shards),
    };
    let mut fin = settle(&runner, &workload, &replicas, api.as_deref()).await;
    fin.unreadable.append(&mut runner.violations);
    fin.unreadable.extend(check_shard_map(&replicas).await);
    for a in agents {
        a.abort();
    }
    let entries = history.entries();
    let mut verdict: Verdict = checker::check(&entries, &fin);
    if let Some(api) = &api {
        let view = kube_workload::api_view(api);
        verdict.violations.extend(checker::check_kube(&view, &fin));
    }
    drop(runner);
    Ok(DrillReport {
        drill: spec.kind.name().to_string(),
        seed: spec.seed,
        duration_ms: spec.duration_ms,
        elapsed_ms: started.elapsed().as_millis() as u64,
        faults: entries
            .iter()
            .filter_map(|e| match &e.event {
                Event::Fault { what, targets, .. } => Some(format!("{what} {targets:?}")),
                _ => None,
            })
            .collect(),
        operations: count(&entries),
        preempted: fin.groups.iter().filter(|g| g.state == "Preempted").count(),
        moves_begun,
        shards: (spec.shards, shards_after),
        violations: verdict.violations,
        recoveries: verdict.recoveries,
        replay: replay_command(&spec),
        work_dir: spec.dir.display().to_string(),
    })
}

/// The `shard-move` drill's mover: until `stop`, begins moving a random node to a random
/// other shard (refused while another move runs, or while a fault holds a leader: tried
/// again after a pause); how many moves it began and the shard count it left. Once its first move began, it grows the
/// cluster by one shard (`GrowShards`, asked again until answered: a grow to the count
/// there is changes nothing), so moves under faults reach a shard added to the live
/// cluster, and replicas the drill restarts (with the `--shards` they were created with)
/// open it again.
async fn mover(
    replicas: Arc<Replicas>,
    shards: u32,
    mut rng: Rng,
    stop: watch::Receiver<bool>,
) -> (u64, u32) {
    let mut begun = 0;
    let mut shards = shards;
    let grow_to = shards + 1;
    while !*stop.borrow() && shards > 1 {
        let gap = rng.range(MOVER_GAP_MS.0, MOVER_GAP_MS.1);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        if begun > 0 && shards < grow_to {
            let grown = replicas
                .call(|c| async move { c.grow_shards(grow_to).await })
                .await;
            if let CallResult::Ok(reply) = grown {
                shards = reply.shards;
            }
            continue;
        }
        let nodes = match replicas
            .call(|c| async move { c.list_nodes(None).await })
            .await
        {
            CallResult::Ok(nodes) => nodes,
            _ => continue,
        };
        let Some(n) = rng.pick(&nodes) else {
            continue;
        };
        let (Some(name), from) = (n.node.as_ref().map(|s| s.name.clone()), n.shard) else {
            continue;
        };
        let others: Vec<u32> = (1..=shards).filter(|s| *s != from).collect();
        let Some(&to) = rng.pick(&others) else {
            continue;
        };
        let moved = replicas
            .call(|c| {
                let name = name.clone();
                async move { c.move_nodes(None, vec![name], to, false).await }
            })
            .await;
        if matches!(moved, CallResult::Ok(_)) {
            begun += 1;
        }
    }
    (begun, shards)
}

/// After the groups settled: every shard move ends within [`MOVES_SETTLE_MS`], and then
/// every node is on exactly one shard's ledger, the one the shard map names (I3).
async fn check_shard_map(replicas: &Replicas) -> Vec<Violation> {
    let violation = |detail: String| Violation {
        invariant: "I3".into(),
        detail,
    };
    let deadline = Instant::now() + Duration::from_millis(MOVES_SETTLE_MS);
    loop {
        let moves = replicas
            .call(|c| async move { c.shard_moves().await })
            .await;
        match moves {
            CallResult::Ok(moves) => {
                let running: Vec<_> = moves
                    .iter()
                    .filter(|m| !matches!(m.phase.as_str(), "done" | "cancelled"))
                    .collect();
                if running.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    return vec![violation(format!(
                        "shard moves still running {MOVES_SETTLE_MS} ms after the groups settled: {running:?}"
                    ))];
                }
            }
            CallResult::Fail(e) | CallResult::Unknown(e) => {
                return vec![violation(format!("shard moves could not be listed: {e}"))]
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes = replicas
        .call(|c| async move { c.list_nodes(None).await })
        .await;
    let shards = replicas.call(|c| async move { c.shards().await }).await;
    let (CallResult::Ok(nodes), CallResult::Ok(shards)) = (nodes, shards) else {
        return vec![violation("nodes or shards could not be listed".into())];
    };
    let mut out = Vec::new();
    let mut seen: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let mut per_shard: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
    for n in &nodes {
        let name = n.node.as_ref().map(|s| s.name.clone()).unwrap_or_default();
        *per_shard.entry(n.shard).or_default() += 1;
        if let Some(other) = seen.insert(name.clone(), n.shard) {
            out.push(violation(format!(
                "node {name} is on the ledgers of shards {other} and {}",
                n.shard
            )));
        }
    }
    for s in &shards {
        let held = per_shard.get(&s.shard).copied().unwrap_or(0);
        if held != s.nodes {
            out.push(violation(format!(
                "shard {}: the map names {} nodes, its ledger holds {held}",
                s.shard, s.nodes
            )));
        }
    }
    out
}

async fn start_fleet(
    replicas: &Arc<Replicas>,
    shards: u32,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, SupervisorError> {
    let setup = |reason: String| SupervisorError::NotReady {
        ms: READY_TIMEOUT_MS,
        detail: reason,
    };
    let device_nodes = workload::register_fleet(replicas, shards)
        .await
        .map_err(setup)?;
    let mut agents = Vec::new();
    let mut published = Vec::new();
    for node in device_nodes {
        let (tx, rx) = watch::channel(false);
        published.push((node.clone(), rx));
        agents.push(tokio::spawn(workload::device_agent(
            replicas.clone(),
            node,
            tx,
            stop.clone(),
        )));
    }
    for (node, mut rx) in published {
        let ok = tokio::time::timeout(Duration::from_millis(READY_TIMEOUT_MS), rx.wait_for(|p| *p))
            .await;
        if !matches!(ok, Ok(Ok(_))) {
            for a in &agents {
                a.abort();
            }
            return Err(setup(format!("the devices of {node} were not published")));
        }
    }
    Ok(agents)
}

struct Runner {
    sup: Supervisor,
    history: History,
    rng: Rng,
    spec: DrillSpec,
    next_fault: u64,
    /// Faults not healed yet: (id, what to undo).
    faults: Vec<(u64, Undo)>,
    /// Violations seen while faults ran (unexpected exits, no leader after heal).
    violations: Vec<Violation>,
}

/// How to end a fault.
#[derive(Debug, Clone)]
enum Undo {
    Restart(Vec<u64>),
    Resume(u64),
    HealLinks,
    Nothing,
}

impl Runner {
    fn plan(&mut self) -> Fault {
        let groups = u64::from(self.spec.shards) + 1;
        let group = self.rng.range(0, groups - 1);
        match self.spec.kind {
            DrillKind::LeaderKill => Fault::KillLeader(group),
            // The two points in turn, after-decide first, so a short drill reaches the
            // side of the decision that only its delivery can finish.
            DrillKind::CoordinatorKillMid2pc => Fault::CrashPoint(if self.next_fault % 2 == 1 {
                FP_AFTER_DECIDE
            } else {
                FP_AFTER_RESERVE
            }),
            DrillKind::ParticipantKillMidReserve => Fault::CrashPoint(FP_PARTICIPANT),
            DrillKind::BinderKill => {
                if self.rng.chance(60) {
                    Fault::CrashPoint(FP_BINDER)
                } else {
                    // Any group's leader: the meta leader runs the ingest, which must read
                    // back which pods it already submitted.
                    Fault::KillLeader(self.rng.range(0, groups - 1))
                }
            }
            DrillKind::PartitionLeaderMinority => Fault::IsolateLeader(group),
            DrillKind::PauseLeader => Fault::PauseLeader(group),
            DrillKind::RollingRestart => Fault::RollingRestart,
            DrillKind::FullRestart => Fault::FullRestart,
            // The two points in turn, after-decide first; every third fault kills the
            // meta leader instead (its coordinator may be mid-preemption).
            DrillKind::Preemption => match self.next_fault % 3 {
                1 => Fault::CrashPoint(FP_PREEMPT_AFTER_DECIDE),
                2 => Fault::CrashPoint(FP_PREEMPT_AFTER_RESERVE),
                _ => Fault::KillLeader(0),
            },
            // The crash point, the coordinator, then any group's leader (a source or
            // target shard mid-handoff), in turn.
            DrillKind::ShardMove => match self.next_fault % 3 {
                1 => Fault::CrashPoint(FP_MOVE_AFTER_HANDOFF),
                2 => Fault::KillLeader(group),
                _ => Fault::KillLeader(0),
            },
            DrillKind::Mixed => {
                let menu: [(u64, Fault); 16] = [
                    (14, Fault::KillLeader(group)),
                    (6, Fault::KillFollower),
                    (10, Fault::PauseLeader(group)),
                    (10, Fault::IsolateLeader(group)),
                    (5, Fault::IsolateFollower),
                    (
                        5,
                        Fault::Split {
                            group,
                            leader_in_minority: true,
                        },
                    ),
                    (
                        5,
                        Fault::Split {
                            group,
                            leader_in_minority: false,
                        },
                    ),
                    (6, Fault::OneWay(group)),
                    (5, Fault::Latency(self.rng.range(20, 120))),
                    (8, Fault::CrashPoint(FP_AFTER_RESERVE)),
                    (8, Fault::CrashPoint(FP_AFTER_DECIDE)),
                    (8, Fault::CrashPoint(FP_PARTICIPANT)),
                    (5, Fault::CrashPoint(FP_PREEMPT_AFTER_RESERVE)),
                    (5, Fault::CrashPoint(FP_PREEMPT_AFTER_DECIDE)),
                    (3, Fault::FullRestart),
                    (3, Fault::RollingRestart),
                ];
                let weights: Vec<u64> = menu.iter().map(|(w, _)| *w).collect();
                let i = self.rng.weighted(&weights).unwrap_or(0);
                menu[i].1
            }
        }
    }

    /// Injects faults one after another until the drill's duration has passed.
    async fn inject_faults(&mut self) {
        let end = Instant::now() + Duration::from_millis(self.spec.duration_ms);
        // Let the workload reach a steady state first.
        let warmup = self.rng.range(300, 800);
        self.watch_for(warmup).await;
        while Instant::now() < end {
            let fault = self.plan();
            let hold = self.rng.range(400, 2_000);
            self.inject(fault, hold).await;
            self.heal_everything().await;
            let gap = self.rng.range(600, 1_500);
            self.watch_for(gap).await;
        }
    }

    fn record_fault(&mut self, what: &str, targets: Vec<u64>, led: Vec<u64>, single: bool) -> u64 {
        let id = self.next_fault;
        self.next_fault += 1;
        self.history.record(Event::Fault {
            fault: id,
            what: what.to_string(),
            targets,
            led,
            single_replica: single,
        });
        id
    }

    /// A replica other than `leader`, drawn from the seed.
    fn other_than(&mut self, leader: Option<u64>) -> Option<u64> {
        let others: Vec<u64> = self
            .sup
            .ids()
            .into_iter()
            .filter(|id| Some(*id) != leader)
            .collect();
        self.rng.pick(&others).copied()
    }

    async fn inject(&mut self, fault: Fault, hold_ms: u64) {
        let name = fault.name();
        match fault {
            Fault::KillLeader(g) | Fault::PauseLeader(g) | Fault::IsolateLeader(g) => {
                let Some(target) = self.sup.leader_of(g).await else {
                    self.note(format!("{name}: no leader of group {g} known; skipped"));
                    return;
                };
                self.single(fault, name, target, hold_ms).await;
            }
            Fault::KillFollower | Fault::IsolateFollower => {
                let leader = self.sup.leader_of(0).await;
                let Some(target) = self.other_than(leader) else {
                    return;
                };
                self.single(fault, name, target, hold_ms).await;
            }
            Fault::Split {
                group,
                leader_in_minority,
            } => {
                let ids = self.sup.ids();
                let Some(leader) = self.sup.leader_of(group).await else {
                    self.note(format!("{name}: no leader of group {group} known; skipped"));
                    return;
                };
                let others: Vec<u64> = ids.iter().copied().filter(|i| *i != leader).collect();
                let Some(&buddy) = self.rng.pick(&others) else {
                    return;
                };
                // Minority side: one replica. With the leader there, it is alone; otherwise
                // the leader keeps `buddy` and loses the third.
                let minority: Vec<u64> = if leader_in_minority {
                    vec![leader]
                } else {
                    ids.iter()
                        .copied()
                        .filter(|i| *i != leader && *i != buddy)
                        .collect()
                };
                let majority: Vec<u64> = ids
                    .iter()
                    .copied()
                    .filter(|i| !minority.contains(i))
                    .collect();
                let led = self.led(&minority).await;
                let id = self.record_fault(&name, minority.clone(), led, minority.len() == 1);
                self.sup.partition(&minority, &majority);
                self.faults.push((id, Undo::HealLinks));
                self.watch_for(hold_ms).await;
            }
            Fault::OneWay(g) => {
                let Some(leader) = self.sup.leader_of(g).await else {
                    return;
                };
                let Some(to) = self.other_than(Some(leader)) else {
                    return;
                };
                let id = self.record_fault(&name, vec![leader, to], vec![], false);
                self.sup.set_link(leader, to, LinkMode::Cut);
                self.faults.push((id, Undo::HealLinks));
                self.watch_for(hold_ms).await;
            }
            Fault::Latency(ms) => {
                let ids = self.sup.ids();
                let id = self.record_fault(&name, ids.clone(), vec![], false);
                for a in &ids {
                    for b in &ids {
                        if a != b {
                            self.sup.set_link(*a, *b, LinkMode::Delay(ms));
                        }
                    }
                }
                self.faults.push((id, Undo::HealLinks));
                self.watch_for(hold_ms).await;
            }
            Fault::CrashPoint(point) => self.crash_point(point, hold_ms).await,
            Fault::FullRestart => {
                let ids = self.sup.ids();
                let id = self.record_fault(&name, ids.clone(), vec![], false);
                for r in &ids {
                    self.sup.kill(*r);
                }
                self.faults.push((id, Undo::Restart(ids)));
                self.watch_for(hold_ms.min(1_000)).await;
            }
            Fault::RollingRestart => {
                let ids = self.sup.ids();
                let id = self.record_fault(&name, ids.clone(), vec![], false);
                for r in ids {
                    self.sup.stop(r).await;
                    if let Err(e) = self.sup.spawn(r) {
                        self.violations.push(Violation {
                            invariant: "I7".into(),
                            detail: format!("replica {r} could not restart: {e}"),
                        });
                    }
                    self.ready_or_violation("rolling restart").await;
                }
                self.faults.push((id, Undo::Nothing));
            }
        }
    }

    async fn led(&self, ids: &[u64]) -> Vec<u64> {
        let mut led = Vec::new();
        for id in ids {
            led.extend(self.sup.groups_led_by(*id).await);
        }
        led
    }

    /// A fault on one replica: kill, pause or isolate it.
    async fn single(&mut self, fault: Fault, name: String, target: u64, hold_ms: u64) {
        let led = self.led(&[target]).await;
        let id = self.record_fault(&name, vec![target], led, true);
        let undo = match fault {
            Fault::KillLeader(_) | Fault::KillFollower => {
                self.sup.kill(target);
                Undo::Restart(vec![target])
            }
            Fault::PauseLeader(_) => {
                self.sup.pause(target);
                Undo::Resume(target)
            }
            _ => {
                let others: Vec<u64> = self
                    .sup
                    .ids()
                    .into_iter()
                    .filter(|i| *i != target)
                    .collect();
                self.sup.partition(&[target], &others);
                Undo::HealLinks
            }
        };
        self.faults.push((id, undo));
        self.watch_for(hold_ms).await;
    }

    /// Arms a crash point and waits for it to fire; the crashed replica restarts after `hold_ms`.
    async fn crash_point(&mut self, point: &'static str, hold_ms: u64) {
        let leaders = self.leaders().await;
        self.sup.arm(point);
        let deadline = Instant::now() + Duration::from_millis(ARMED_WINDOW_MS);
        loop {
            let exits = self.sup.exits();
            if let Some(exit) = exits.iter().find(|e| e.failpoint.as_deref() == Some(point)) {
                let led: Vec<u64> = leaders
                    .iter()
                    .filter(|(_, l)| **l == exit.id)
                    .map(|(g, _)| *g)
                    .collect();
                let id =
                    self.record_fault(&format!("crash-point-{point}"), vec![exit.id], led, true);
                self.faults.push((id, Undo::Restart(vec![exit.id])));
                self.unexpected(exits.iter().filter(|e| e.id != exit.id));
                self.watch_for(hold_ms).await;
                return;
            }
            self.unexpected(exits.iter());
            if Instant::now() >= deadline {
                if self.sup.disarm(point) {
                    self.note(format!(
                        "crash point {point} did not fire within {ARMED_WINDOW_MS} ms"
                    ));
                } else {
                    // It fired just now: the exit shows up on the next watch.
                    self.watch_for(WATCH_MS * 2).await;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(WATCH_MS)).await;
        }
    }

    async fn leaders(&self) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        for g in 0..=u64::from(self.spec.shards) {
            if let Some(l) = self.sup.leader_of(g).await {
                out.insert(g, l);
            }
        }
        out
    }

    fn note(&self, text: String) {
        self.history.record(Event::Note { text });
    }

    /// Records replicas that exited on their own as violations (and restarts them).
    fn unexpected<'a>(&mut self, exits: impl Iterator<Item = &'a crate::supervisor::Exit>) {
        for e in exits {
            let detail = match &e.failpoint {
                Some(p) => format!(
                    "replica {} hit crash point {p} while it was not under test",
                    e.id
                ),
                None => format!(
                    "replica {} exited unexpectedly ({}): {}",
                    e.id, e.status, e.last_line
                ),
            };
            if e.failpoint.is_some() {
                // A crash point armed earlier fired late: an injected fault after all.
                let id = self.record_fault(&detail, vec![e.id], vec![], true);
                self.faults.push((id, Undo::Restart(vec![e.id])));
                continue;
            }
            self.violations.push(Violation {
                invariant: "I7".into(),
                detail,
            });
            if let Err(err) = self.sup.spawn(e.id) {
                self.note(format!("replica {} could not restart: {err}", e.id));
            }
        }
    }

    /// Sleeps `ms`, watching for replicas that exit on their own.
    async fn watch_for(&mut self, ms: u64) {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            let exits = self.sup.exits();
            self.unexpected(exits.iter());
            tokio::time::sleep(Duration::from_millis(WATCH_MS)).await;
        }
    }

    /// Ends every open fault and waits for the cluster to have leaders again.
    async fn heal_everything(&mut self) {
        let faults = std::mem::take(&mut self.faults);
        if faults.is_empty() {
            return;
        }
        for (_, undo) in &faults {
            match undo {
                Undo::Restart(ids) => {
                    for id in ids {
                        if let Err(e) = self.sup.spawn(*id) {
                            self.violations.push(Violation {
                                invariant: "I7".into(),
                                detail: format!("replica {id} could not restart: {e}"),
                            });
                        }
                    }
                }
                Undo::Resume(id) => self.sup.resume(*id),
                Undo::HealLinks => self.sup.heal_links(),
                Undo::Nothing => {}
            }
        }
        for (id, _) in &faults {
            self.history.record(Event::Heal { fault: *id });
        }
        self.ready_or_violation("heal").await;
    }

    async fn ready_or_violation(&mut self, when: &str) {
        if let Err(e) = self.sup.wait_ready(READY_TIMEOUT_MS).await {
            self.violations.push(Violation {
                invariant: "I7".into(),
                detail: format!("after {when}: {e}"),
            });
            if let SupervisorError::Exited { id, .. } = e {
                if let Err(err) = self.sup.spawn(id) {
                    self.note(format!("replica {id} could not restart: {err}"));
                }
            }
        }
    }

    /// Lets the workload run until a placement follows the last heal (bounded).
    async fn await_recovery(&mut self) {
        let from = self.history.now_ms();
        let deadline = Instant::now() + Duration::from_millis(checker::RECOVERY_MAX_MS);
        while Instant::now() < deadline {
            let placed = checker::placements(&self.history.entries());
            if checker::first_placement_after(&placed, from).is_some() {
                return;
            }
            self.watch_for(100).await;
        }
    }
}

/// Cancels what still waits, lets every group settle and the reservations
/// expire, then reads groups, nodes and every replica's state hashes. With
/// Kubernetes, waiting gangs are deleted as pods, and settling includes every
/// live gang being bound whole or not at all.
async fn settle(
    runner: &Runner,
    workload: &Workload,
    replicas: &Replicas,
    api: Option<&ApiServerDouble>,
) -> FinalState {
    let mut fin = FinalState::default();
    let deadline = Instant::now() + Duration::from_millis(QUIESCE_MS);
    let mut cancelled = std::collections::BTreeSet::new();
    let mut checked_live = false;
    loop {
        let groups = match replicas
            .call(|c| async move { c.list_groups(true).await })
            .await
        {
            CallResult::Ok(g) => g,
            CallResult::Fail(e) | CallResult::Unknown(e) => {
                fin.unreadable.push(Violation {
                    invariant: "I4".into(),
                    detail: format!("gang groups could not be listed: {e}"),
                });
                return fin;
            }
        };
        if api.is_none() && !checked_live {
            checked_live = true;
            // Before anything is cancelled: what waits must hold what it lists.
            if let CallResult::Ok(nodes) = replicas
                .call(|c| async move { c.list_nodes(None).await })
                .await
            {
                fin.unreadable
                    .extend(checker::live_placements_missing(&groups, &nodes));
            }
        }
        for g in groups.iter().filter(|g| g.state == "Queued") {
            if cancelled.insert(g.id) {
                match api {
                    None => workload.give_back("cancel", g.id).await,
                    Some(api) => delete_waiting_pods(api, g),
                }
            }
        }
        let nodes = match replicas
            .call(|c| async move { c.list_nodes(None).await })
            .await
        {
            CallResult::Ok(n) => n,
            CallResult::Fail(e) | CallResult::Unknown(e) => {
                fin.unreadable.push(Violation {
                    invariant: "I3".into(),
                    detail: format!("nodes could not be listed: {e}"),
                });
                return fin;
            }
        };
        let busy = groups
            .iter()
            .any(|g| g.state != "Placed" && !TERMINAL.contains(&g.state.as_str()));
        let reserved = nodes
            .iter()
            .any(|n| n.pod_slots.iter().any(|s| s.state == "Reserved"));
        let half_bound =
            api.is_some_and(|api| !kube_workload::api_view(api).partly_bound().is_empty());
        let unconfirmed = api.is_some()
            && nodes
                .iter()
                .any(|n| n.pod_slots.iter().any(|s| s.state == "Committed"));
        let settled = !busy && !reserved && !half_bound && !unconfirmed;
        if settled || Instant::now() >= deadline {
            // Read the groups again: the snapshot is consistent only if nothing moved.
            let again = replicas
                .call(|c| async move { c.list_groups(true).await })
                .await;
            let same = matches!(&again, CallResult::Ok(g) if versions(g) == versions(&groups));
            if same || Instant::now() >= deadline {
                fin.groups = groups;
                fin.nodes = nodes;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fin.replicas = converged_hashes(&runner.sup).await;
    fin
}

/// Deletes the pods of a gang group that still waits (its job gave up).
fn delete_waiting_pods(api: &ApiServerDouble, g: &gangway_proto::v1::GangGroupStatus) {
    for pod in api.list(&PODS, Some(kube_workload::KUBE_NAMESPACE)) {
        let gang = pod["metadata"]["annotations"]["gang.scheduling.koordinator.sh/name"]
            .as_str()
            .unwrap_or_default();
        let full = format!("{}/{gang}", kube_workload::KUBE_NAMESPACE);
        if g.gangs.contains(&full) {
            if let Some(name) = pod["metadata"]["name"].as_str() {
                let _ = api.delete(&PODS, Some(kube_workload::KUBE_NAMESPACE), name);
            }
        }
    }
}

fn versions(groups: &[gangway_proto::v1::GangGroupStatus]) -> Vec<(u64, u64)> {
    groups.iter().map(|g| (g.id, g.version)).collect()
}

/// Every replica's (applied index, hash) per group, read until all applied indexes agree.
async fn converged_hashes(sup: &Supervisor) -> BTreeMap<u64, Option<Vec<GroupHash>>> {
    let deadline = Instant::now() + Duration::from_millis(CONVERGE_MS);
    loop {
        let mut out = BTreeMap::new();
        for id in sup.ids() {
            let groups = sup.status(id, true).await.map(|s| {
                s.groups
                    .iter()
                    .map(|g| GroupHash {
                        group: g.group_id,
                        applied: g.applied_index,
                        hash: g.state_hash.clone(),
                    })
                    .collect::<Vec<_>>()
            });
            out.insert(id, groups);
        }
        let mut applied: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
        let complete = out.values().all(Option::is_some);
        for groups in out.values().flatten() {
            for g in groups {
                applied.entry(g.group).or_default().insert(g.applied);
            }
        }
        if (complete && applied.values().all(|s| s.len() == 1)) || Instant::now() >= deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
#[path = "drill_tests.rs"]
mod tests;
