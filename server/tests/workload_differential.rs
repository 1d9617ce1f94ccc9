//! Kubernetes' own gangs (the v1.36 Workload and PodGroup API), gangway against
//! kube-scheduler with its GangScheduling plugin, on one real control plane with the
//! gang API on.
//!
//! Each world (drawn from a seed) is a few nodes of 4 or 8 CPUs, and, in a random order,
//! gangs (a PodGroup with a gang policy of `minCount` 1 to 4, its pods of 1 to 3 CPUs, one
//! more pod than `minCount` now and then) and lone pods; some worlds fit, some do not,
//! gangs compete for the same room. The world is created twice, on two sets of nodes
//! (a label and a node selector keep the copies apart): once for kube-scheduler
//! (`default-scheduler` pods), once for gangway (three `gangway serve` processes), pod
//! by pod alternately, so both see the same arrival order. Once neither has bound a pod
//! for `SETTLE_MS`, both sides are checked: no node holds more CPU than it has, and no
//! gang is bound in part (fewer than `minCount` of its pods bound, but some); then gangway
//! must have bound at least as many gangs as kube-scheduler, or the test prints the world
//! with both sides' placements and the seed.
//!
//! `GANGWAY_WORKLOAD_WORLDS` (default 4) and `GANGWAY_WORKLOAD_SEED` set the run.

mod support;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gangway_kube_double::store::{NODES, PODS, POD_GROUPS_K8S as POD_GROUPS};
use gangway_kube_env::{ControlPlane, Options, ADMIN_USER, WORKLOAD_API_GATES};
use serde_json::json;
use support::Cluster;

/// One control plane at a time: each is a few hundred MB and a core while it starts.
static KUBE_SERIAL: Mutex<()> = Mutex::new(());
/// Worlds in a run unless `GANGWAY_WORKLOAD_WORLDS` says otherwise.
const WORLDS_DEFAULT: u64 = 4;
/// First seed unless `GANGWAY_WORKLOAD_SEED` says otherwise.
const SEED_DEFAULT: u64 = 0x3c6e_f372;
/// A side has settled when it bound no pod for this long, in ms.
const SETTLE_MS: u64 = 6_000;
/// Longest a world may take to settle, in ms.
const WORLD_TIMEOUT_MS: u64 = 90_000;
/// How often the test looks at the API server, in ms.
const POLL_MS: u64 = 250;
/// The node label that keeps the two copies of a world apart.
const COPY_LABEL: &str = "diff.gangway.dev/copy";

/// splitmix64: the worlds must be the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Which scheduler a copy of the world is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    KubeScheduler,
    Gangway,
}

impl Side {
    fn tag(self) -> &'static str {
        match self {
            Side::KubeScheduler => "kube",
            Side::Gangway => "gw",
        }
    }

    fn scheduler(self) -> &'static str {
        match self {
            Side::KubeScheduler => "default-scheduler",
            Side::Gangway => "gangway",
        }
    }
}

/// A gang (a PodGroup and its pods) or a lone pod.
#[derive(Debug, Clone)]
struct Unit {
    name: String,
    /// `minCount`; none for a lone pod.
    min_count: Option<u32>,
    /// Each pod's CPUs.
    pods: Vec<u32>,
}

/// One world: nodes (their CPUs) and units in creation order.
#[derive(Debug, Clone)]
struct World {
    index: u64,
    seed: u64,
    nodes: Vec<u32>,
    units: Vec<Unit>,
}

impl World {
    fn draw(index: u64, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let nodes = (0..rng.range(3, 6))
            .map(|_| if rng.range(0, 2) == 0 { 8 } else { 4 })
            .collect();
        let mut units = Vec::new();
        for g in 0..rng.range(2, 5) {
            let min = rng.range(1, 4) as u32;
            let extra = u32::from(rng.range(0, 3) == 0);
            let cpu = rng.range(1, 3) as u32;
            units.push(Unit {
                name: format!("g{g}"),
                min_count: Some(min),
                pods: vec![cpu; (min + extra) as usize],
            });
        }
        for l in 0..rng.range(0, 3) {
            let at = rng.range(0, units.len() as u64) as usize;
            units.insert(
                at,
                Unit {
                    name: format!("lone{l}"),
                    min_count: None,
                    pods: vec![rng.range(1, 3) as u32],
                },
            );
        }
        Self {
            index,
            seed,
            nodes,
            units,
        }
    }

    fn namespace(&self, side: Side) -> String {
        format!("w{}-{}", self.index, side.tag())
    }

    fn node_name(&self, side: Side, i: usize) -> String {
        format!("w{}-{}-n{i}", self.index, side.tag())
    }

    fn pod_count(&self) -> usize {
        self.units.iter().map(|u| u.pods.len()).sum()
    }

    fn describe(&self) -> String {
        let units: Vec<String> = self
            .units
            .iter()
            .map(|u| match u.min_count {
                Some(min) => format!("{} (minCount {min}, pods of {:?} CPUs)", u.name, u.pods),
                None => format!("{} (lone pod of {} CPUs)", u.name, u.pods[0]),
            })
            .collect();
        format!(
            "world {} (seed {:#x}): nodes of {:?} CPUs; in order: {}",
            self.index,
            self.seed,
            self.nodes,
            units.join(", ")
        )
    }
}

fn pod_name(unit: &Unit, i: usize) -> String {
    format!("{}-{i}", unit.name)
}

async fn create(api: &ControlPlane, world: &World) {
    for side in [Side::KubeScheduler, Side::Gangway] {
        let ns = world.namespace(side);
        api.ensure_namespace(&ns).await.expect("namespace");
        for (i, cpu) in world.nodes.iter().enumerate() {
            let name = world.node_name(side, i);
            let node = json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, COPY_LABEL: ns}},
                "status": {
                    "allocatable": {"cpu": cpu.to_string(), "memory": "64Gi", "pods": "110"},
                    "capacity": {"cpu": cpu.to_string(), "memory": "64Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]
                }
            });
            api.create(&NODES, node).await.expect("node");
        }
    }
    // Let gangway register the nodes before the first pod arrives.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for unit in &world.units {
        for side in [Side::KubeScheduler, Side::Gangway] {
            if let Some(min) = unit.min_count {
                let group = json!({
                    "metadata": {"name": unit.name, "namespace": world.namespace(side)},
                    "spec": {"schedulingPolicy": {"gang": {"minCount": min}}}
                });
                api.create(&POD_GROUPS, group).await.expect("PodGroup");
            }
        }
        for (i, cpu) in unit.pods.iter().enumerate() {
            for side in [Side::KubeScheduler, Side::Gangway] {
                let ns = world.namespace(side);
                let mut pod = json!({
                    "metadata": {"name": pod_name(unit, i), "namespace": ns},
                    "spec": {
                        "schedulerName": side.scheduler(),
                        "nodeSelector": {COPY_LABEL: ns},
                        "containers": [{"name": "main", "image": "worker",
                                        "resources": {"requests": {"cpu": cpu.to_string()}}}]
                    }
                });
                if unit.min_count.is_some() {
                    pod["spec"]["schedulingGroup"] = json!({"podGroupName": unit.name});
                }
                api.create(&PODS, pod).await.expect("pod");
            }
        }
    }
}

/// Where one side's pods went: pod → node.
struct Placed(BTreeMap<String, String>);

async fn read(api: &ControlPlane, world: &World, side: Side) -> Placed {
    let pods = api
        .list(&PODS, Some(&world.namespace(side)))
        .await
        .unwrap_or_default();
    Placed(
        pods.iter()
            .filter_map(|p| {
                Some((
                    p["metadata"]["name"].as_str()?.to_string(),
                    p["spec"]["nodeName"].as_str()?.to_string(),
                ))
            })
            .collect(),
    )
}

/// What a side did with a world.
struct Verdict {
    /// Gangs with at least `minCount` pods bound.
    gangs: usize,
    /// Pods bound.
    pods: usize,
    /// Broken rules.
    problems: Vec<String>,
}

fn judge(world: &World, side: Side, placed: &Placed) -> Verdict {
    let mut problems = Vec::new();
    let mut used: BTreeMap<&str, u32> = BTreeMap::new();
    let mut gangs = 0;
    for unit in &world.units {
        let mut bound = 0;
        for (i, cpu) in unit.pods.iter().enumerate() {
            if let Some(node) = placed.0.get(&pod_name(unit, i)) {
                bound += 1;
                *used.entry(node.as_str()).or_default() += cpu;
            }
        }
        if let Some(min) = unit.min_count {
            if bound >= min {
                gangs += 1;
            } else if bound > 0 {
                problems.push(format!(
                    "gang {} bound in part: {bound} of minCount {min}",
                    unit.name
                ));
            }
        }
    }
    for (i, cpu) in world.nodes.iter().enumerate() {
        let name = world.node_name(side, i);
        let held = used.remove(name.as_str()).unwrap_or(0);
        if held > *cpu {
            problems.push(format!("node {name} holds {held} of {cpu} CPUs"));
        }
    }
    if let Some(node) = used.keys().next() {
        problems.push(format!("a pod is bound to {node}, outside its copy"));
    }
    Verdict {
        gangs,
        pods: placed.0.len(),
        problems,
    }
}

/// One line per pod, in creation order: its node or `-`.
fn layout(world: &World, placed: &Placed) -> String {
    let mut lines = Vec::new();
    for unit in &world.units {
        for (i, cpu) in unit.pods.iter().enumerate() {
            let name = pod_name(unit, i);
            let node = placed.0.get(&name).map(String::as_str).unwrap_or("-");
            lines.push(format!("    {name} ({cpu} CPUs): {node}"));
        }
    }
    lines.join("\n")
}

/// Waits until neither side bound a pod for `SETTLE_MS` (or every pod is bound).
async fn settle(api: &ControlPlane, world: &World) -> (Placed, Placed) {
    let start = Instant::now();
    let mut last = (usize::MAX, usize::MAX);
    let mut since = Instant::now();
    loop {
        let kube = read(api, world, Side::KubeScheduler).await;
        let ours = read(api, world, Side::Gangway).await;
        let now = (kube.0.len(), ours.0.len());
        let all = world.pod_count();
        if now == (all, all) {
            return (kube, ours);
        }
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() > Duration::from_millis(SETTLE_MS) {
            return (kube, ours);
        }
        assert!(
            start.elapsed() < Duration::from_millis(WORLD_TIMEOUT_MS),
            "{} did not settle: bound {now:?} of {all}",
            world.describe()
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// A control plane with the gang API on, running kube-scheduler (GangScheduling in its
/// default profile), and three gangway processes (with these bug switches armed).
async fn start(failpoints: &[&str]) -> (ControlPlane, Cluster, Serial) {
    let serial = KUBE_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut api = ControlPlane::start(Options::default().with_workload_api())
        .await
        .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    api.start_kube_scheduler_with(&[&format!("--feature-gates={WORKLOAD_API_GATES}")])
        .expect("kube-scheduler starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = support::kube::gangway_on(&api, ADMIN_USER, dir.path(), 2, &[], failpoints).await;
    (
        api,
        cluster,
        Serial {
            _dir: dir,
            _turn: serial,
        },
    )
}

/// What a test keeps while its control plane runs: the kubeconfig's folder and its turn.
struct Serial {
    _dir: tempfile::TempDir,
    _turn: MutexGuard<'static, ()>,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Both sides of one world.
struct Run {
    theirs: Verdict,
    mine: Verdict,
    /// kube-scheduler's placements, then gangway's.
    layout: [String; 2],
}

impl Run {
    /// What is wrong with gangway's side, if anything.
    fn failure(&self) -> Option<String> {
        if !self.mine.problems.is_empty() {
            return Some(format!(
                "gangway broke the rules: {:#?}",
                self.mine.problems
            ));
        }
        if self.mine.gangs < self.theirs.gangs {
            return Some(format!(
                "gangway bound {} gangs, kube-scheduler {}",
                self.mine.gangs, self.theirs.gangs
            ));
        }
        None
    }
}

async fn run(api: &ControlPlane, world: &World) -> Run {
    create(api, world).await;
    let (kube, ours) = settle(api, world).await;
    Run {
        theirs: judge(world, Side::KubeScheduler, &kube),
        mine: judge(world, Side::Gangway, &ours),
        layout: [layout(world, &kube), layout(world, &ours)],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangway_binds_no_gang_in_part_and_at_least_as_many_gangs_as_kube_scheduler() {
    let worlds = env_u64("GANGWAY_WORKLOAD_WORLDS", WORLDS_DEFAULT);
    let seed = env_u64("GANGWAY_WORKLOAD_SEED", SEED_DEFAULT);
    let (api, _cluster, _dir) = start(&[]).await;
    let (mut kube_gangs, mut our_gangs, mut kube_pods, mut our_pods, mut gangs) = (0, 0, 0, 0, 0);
    for index in 0..worlds {
        let world = World::draw(index, seed.wrapping_add(index));
        let outcome = run(&api, &world).await;
        eprintln!(
            "{}\n  kube-scheduler bound {} gangs ({} pods), gangway {} gangs ({} pods)",
            world.describe(),
            outcome.theirs.gangs,
            outcome.theirs.pods,
            outcome.mine.gangs,
            outcome.mine.pods
        );
        assert!(
            outcome.theirs.problems.is_empty(),
            "the checks refuse kube-scheduler's placements (a checker bug?): {:#?}\n{}",
            outcome.theirs.problems,
            world.describe()
        );
        if let Some(failure) = outcome.failure() {
            panic!(
                "{failure}\n{}\n  kube-scheduler:\n{}\n  gangway:\n{}\nrerun: GANGWAY_WORKLOAD_SEED={} GANGWAY_WORKLOAD_WORLDS=1",
                world.describe(),
                outcome.layout[0],
                outcome.layout[1],
                world.seed
            );
        }
        gangs += world.units.iter().filter(|u| u.min_count.is_some()).count();
        kube_gangs += outcome.theirs.gangs;
        our_gangs += outcome.mine.gangs;
        kube_pods += outcome.theirs.pods;
        our_pods += outcome.mine.pods;
    }
    eprintln!(
        "{worlds} worlds from seed {seed:#x}: {gangs} gangs each side; bound by kube-scheduler {kube_gangs} gangs ({kube_pods} pods), by gangway {our_gangs} gangs ({our_pods} pods); 0 gangs bound in part"
    );
}

/// A world of three nodes of 4 CPUs and a gang of four 3-CPU pods: nothing may bind.
fn too_big_world() -> World {
    World {
        index: 100,
        seed: 0,
        nodes: vec![4, 4, 4],
        units: vec![Unit {
            name: "big".into(),
            min_count: Some(4),
            pods: vec![3; 4],
        }],
    }
}

/// Bug switch `ingest-ignores-kubernetes-pod-groups`: gangway schedules each pod of a
/// PodGroup alone, as it did before reading them; the checks must see the gang bound in
/// part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_catch_a_gang_bound_in_part() {
    let (api, _cluster, _dir) = start(&["ingest-ignores-kubernetes-pod-groups"]).await;
    let world = too_big_world();
    let outcome = run(&api, &world).await;
    assert!(
        outcome.theirs.problems.is_empty(),
        "{:?}",
        outcome.theirs.problems
    );
    assert_eq!(
        outcome.theirs.pods, 0,
        "kube-scheduler binds none of the gang"
    );
    let failure = outcome.failure().unwrap_or_default();
    assert!(
        failure.contains("gang big bound in part: 3 of minCount 4"),
        "{failure}\n{}",
        outcome.layout[1]
    );
}
