//! The drill's clients: a simulated fleet (nodes, some with device agents) and
//! workers that submit gang groups (Strict, NonStrict, GangGroups of two
//! gangs, groups too wide for one shard, NonStrict groups whose members arrive
//! over time across shards, members with devices, urgent groups of high priority that
//! preempt the others when they do not fit), hold them, release or cancel
//! them, or run a hostile probe (`hostile.rs`), plus a probe that submits a one-pod gang every
//! [`PROBE_INTERVAL_MS`] so recovery is seen within that resolution.
//!
//! Every call goes through the client library with an idempotency key and
//! fails over across replicas; every operation is recorded in the history as
//! invoke → ok / fail / unknown. Who calls it: the drill runner.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_client::{Client, ClientError};
use gangway_proto::v1::{
    DeviceHealth, DeviceListReport, GangGroupStatus, GangSpec, MemberSpec, NodeSpec, PluginDevice,
    SubmitGangGroupRequest, TopologySpec,
};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::history::{Event, GangShape, History, Placed};
use crate::rng::Rng;

/// Time one call may take on one replica before the next is tried.
pub const ATTEMPT_TIMEOUT_MS: u64 = 1_500;
/// Pause before trying the next replica.
pub const RETRY_BACKOFF_MS: u64 = 40;
/// Time one call may take over all its attempts before it is `unknown`.
pub const CALL_DEADLINE_MS: u64 = 20_000;
/// Time a submitted group may take to be placed before the operation is `unknown`.
pub const PLACE_WAIT_MS: u64 = 15_000;
/// Interval between status polls of a group being placed.
pub const POLL_MS: u64 = 40;
/// Interval between probe submissions.
pub const PROBE_INTERVAL_MS: u64 = 100;
/// Probes in flight at most (a new one is skipped while this many wait).
pub const PROBES_IN_FLIGHT_MAX: usize = 24;
/// Time a replica that failed a call is passed over (unless every replica failed).
pub const ENDPOINT_COOLDOWN_MS: u64 = 1_000;
/// Workers submitting gang groups.
pub const WORKERS: usize = 3;
/// Workers running hostile probes only (see `hostile.rs`).
pub const HOSTILE_WORKERS: usize = 1;
/// Nodes per shard in the simulated fleet (the first of each shard has devices).
pub const NODES_PER_SHARD: usize = 4;
/// CPUs per node.
pub const NODE_CPUS: u32 = 16;
/// Devices of a device node.
pub const NODE_GPUS: u32 = 4;
/// The device-plugin resource the device nodes serve.
pub const GPU_RESOURCE: &str = "example.com/gpu";
/// The namespace of every gang.
pub const NAMESPACE: &str = "chaos";

/// How one call ended.
#[derive(Debug)]
pub enum CallResult<T> {
    /// It took effect.
    Ok(T),
    /// A definite refusal.
    Fail(String),
    /// No replica gave a definite answer in time.
    Unknown(String),
}

/// Clients to every replica, with failover.
pub struct Replicas {
    endpoints: Vec<String>,
    clients: Mutex<BTreeMap<String, Client>>,
    next: AtomicU64,
    /// Replicas that failed a call recently, and until when they are passed over.
    cooling: Mutex<BTreeMap<String, Instant>>,
}

fn definite(e: &ClientError) -> bool {
    match e {
        ClientError::Rpc(s) => matches!(
            s.code(),
            tonic::Code::InvalidArgument
                | tonic::Code::NotFound
                | tonic::Code::AlreadyExists
                | tonic::Code::FailedPrecondition
                | tonic::Code::OutOfRange
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated
                | tonic::Code::Unimplemented
        ),
        ClientError::Connect { .. } | ClientError::Credentials(_) => false,
    }
}

impl Replicas {
    /// Clients for `endpoints` (host:port), connected on first use.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            clients: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            cooling: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every replica's address.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The next replica to try: round robin over those not cooling down (all if none).
    fn pick(&self) -> &str {
        let now = Instant::now();
        let n = self.endpoints.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        let cooling = self.cooling.lock().map(|c| c.clone()).unwrap_or_default();
        (0..n)
            .map(|k| &self.endpoints[(start + k) % n])
            .find(|addr| cooling.get(*addr).is_none_or(|until| *until <= now))
            .unwrap_or(&self.endpoints[start % n])
    }

    fn cool(&self, addr: &str) {
        if let Ok(mut c) = self.cooling.lock() {
            c.insert(
                addr.to_string(),
                Instant::now() + Duration::from_millis(ENDPOINT_COOLDOWN_MS),
            );
        }
    }

    fn warm(&self, addr: &str) {
        if let Ok(mut c) = self.cooling.lock() {
            c.remove(addr);
        }
    }

    async fn client(&self, addr: &str) -> Result<Client, String> {
        if let Some(c) = self.clients.lock().ok().and_then(|m| m.get(addr).cloned()) {
            return Ok(c);
        }
        let c = Client::connect(&[addr.to_string()])
            .await
            .map_err(|e| e.to_string())?;
        if let Ok(mut m) = self.clients.lock() {
            m.insert(addr.to_string(), c.clone());
        }
        Ok(c)
    }

    fn forget(&self, addr: &str) {
        if let Ok(mut m) = self.clients.lock() {
            m.remove(addr);
        }
    }

    /// Runs `f` on one replica after another until one answers definitely or
    /// [`CALL_DEADLINE_MS`] passes.
    pub async fn call<T, F, Fut>(&self, f: F) -> CallResult<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let deadline = Instant::now() + Duration::from_millis(CALL_DEADLINE_MS);
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            let addr = self.pick();
            let attempt = async {
                let c = self.client(addr).await.map_err(|e| (false, e))?;
                f(c).await.map_err(|e| (definite(&e), e.to_string()))
            };
            match tokio::time::timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS), attempt).await {
                Ok(Ok(v)) => {
                    self.warm(addr);
                    return CallResult::Ok(v);
                }
                Ok(Err((true, e))) => {
                    self.warm(addr);
                    return CallResult::Fail(e);
                }
                Ok(Err((false, e))) => last = format!("{addr}: {e}"),
                Err(_) => last = format!("{addr}: no answer in {ATTEMPT_TIMEOUT_MS} ms"),
            }
            self.forget(addr);
            self.cool(addr);
            tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)).await;
        }
        CallResult::Unknown(last)
    }
}

/// The fleet in registration order: node `i` is `node-{i:03}`, with devices when it is
/// one of the first `shards`. A fresh cluster gives each node without a topology domain
/// the shard with the fewest nodes (ties to the lowest id), so registered in this order
/// node `i` lands on shard `i % shards + 1`: every shard gets `NODES_PER_SHARD` nodes, the
/// first of them with devices. Shard moves (the `shard-move` drill, rebalancing) may move
/// them later; nothing in the workload depends on where a node is.
pub fn fleet(shards: u32) -> Vec<(String, bool)> {
    let shards = shards.max(1) as usize;
    (0..shards * NODES_PER_SHARD)
        .map(|i| (format!("node-{i:03}"), i < shards))
        .collect()
}

/// The node label naming a node's rack.
pub const RACK_LABEL: &str = "chaos/rack";

/// The rack of node `i` of a fleet over `shards` shards: two nodes of one shard (node `i`
/// lands on shard `i % shards + 1`), so a shard holds whole racks until a move.
pub fn rack_of(i: usize, shards: u32) -> String {
    let shards = shards.max(1) as usize;
    format!("rack-{}", i % shards + shards * (i / (2 * shards)))
}

fn node_spec(name: &str, devices: bool, rack: &str) -> NodeSpec {
    let mut allocatable = std::collections::HashMap::new();
    allocatable.insert("cpu".to_string(), NODE_CPUS.to_string());
    allocatable.insert("memory".to_string(), "64Gi".to_string());
    allocatable.insert("pods".to_string(), "110".to_string());
    let mut labels = std::collections::HashMap::new();
    if devices {
        labels.insert("chaos/devices".to_string(), "true".to_string());
    }
    labels.insert(RACK_LABEL.to_string(), rack.to_string());
    NodeSpec {
        name: name.to_string(),
        labels,
        allocatable,
        ..Default::default()
    }
}

fn device_report(node: &str) -> DeviceListReport {
    DeviceListReport {
        node: node.to_string(),
        resource_name: GPU_RESOURCE.to_string(),
        devices: (0..NODE_GPUS)
            .map(|i| PluginDevice {
                id: format!("gpu-{i}"),
                health: DeviceHealth::Healthy as i32,
                numa_nodes: vec![0],
            })
            .collect(),
    }
}

/// Registers the fleet; returns the device nodes.
pub async fn register_fleet(replicas: &Replicas, shards: u32) -> Result<Vec<String>, String> {
    let mut device_nodes = Vec::new();
    for (i, (name, devices)) in fleet(shards).into_iter().enumerate() {
        let spec = node_spec(&name, devices, &rack_of(i, shards));
        let r = replicas
            .call(|c| {
                let spec = spec.clone();
                async move { c.register_node(spec).await }
            })
            .await;
        match r {
            CallResult::Ok(_) => {}
            CallResult::Fail(e) | CallResult::Unknown(e) => {
                return Err(format!("registering node {name}: {e}"))
            }
        }
        if devices {
            device_nodes.push(name);
        }
    }
    Ok(device_nodes)
}

/// A device agent: keeps a device stream open to some replica and reports the
/// node's devices on every (re)connect, until `stop`. `published` turns true on
/// the first acknowledgement.
pub async fn device_agent(
    replicas: Arc<Replicas>,
    node: String,
    published: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut attempt = 0usize;
    loop {
        if *stop.borrow() {
            return;
        }
        let addr = replicas.endpoints[attempt % replicas.endpoints.len()].clone();
        attempt += 1;
        // The sender lives as long as the stream should: dropping it ends the stream.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let _ = tx.try_send(device_report(&node));
        let open = async {
            let c = replicas.client(&addr).await?;
            c.device_stream(ReceiverStream::new(rx))
                .await
                .map_err(|e| e.to_string())
        };
        let opened = tokio::time::timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS), open).await;
        if let Ok(Ok(mut acks)) = opened {
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    ack = acks.message() => match ack {
                        Ok(Some(_)) => { published.send_replace(true); }
                        _ => break,
                    },
                }
            }
        }
        replicas.forget(&addr);
        drop(tx);
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(RETRY_BACKOFF_MS)) => {}
        }
    }
}

/// The kinds of group the workers submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A GangGroup of two Strict gangs: two 3-CPU members, and two 9-CPU members (a
    /// node each) required to lie in one rack.
    PairGroup,
    /// A NonStrict gang: 2 of 3 two-CPU members.
    NonStrict,
    /// A Strict gang of two members with one device each.
    Devices,
    /// A Strict gang of five 12-CPU members: more nodes than one shard has.
    Wide,
    /// One member no node can hold: it waits, then is cancelled.
    Unfit,
    /// A NonStrict gang of five 12-CPU members, all needed: wider than one shard, its
    /// members arrive over time as room frees up on either shard.
    Accumulating,
    /// A Strict gang of four 12-CPU members of priority [`URGENT_PRIORITY`]: wider than
    /// one shard, it preempts lower-priority groups (every other shape) for room.
    Urgent,
    /// A Strict gang of three 10-CPU members, one per node: two fill six of the eight
    /// nodes, so an urgent group finds room only by preempting one.
    Filler,
    /// A hostile probe instead of a group's life (see `hostile.rs`); the hostile
    /// worker runs only these.
    Hostile,
    /// The probe: one 1-CPU member.
    Probe,
}

const SHAPES: [Shape; 8] = [
    Shape::PairGroup,
    Shape::NonStrict,
    Shape::Devices,
    Shape::Wide,
    Shape::Unfit,
    Shape::Accumulating,
    Shape::Urgent,
    Shape::Filler,
];
const SHAPE_WEIGHTS: [u64; 8] = [30, 20, 20, 20, 10, 10, 12, 0];
/// The preemption drill's weights: low-priority fillers fill the fleet and urgent
/// groups must preempt them. Fillers rather than wide groups (only one of which fits at
/// a time, so workers wait on each other), and no accumulating groups: they hold
/// members while queued, so they are never victims, and a few fill the fleet for good.
const PREEMPTION_WEIGHTS: [u64; 8] = [15, 0, 5, 0, 0, 0, 20, 60];

/// Which groups the workers submit, by weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Every shape, urgent groups among them.
    Default,
    /// Mostly wide groups and urgent ones that preempt them.
    Preemption,
}

impl Mix {
    /// Workers submitting groups: more in the preemption mix, so the fleet is full
    /// when urgent groups arrive.
    fn workers(self) -> usize {
        match self {
            Mix::Default => WORKERS,
            Mix::Preemption => WORKERS + 2,
        }
    }

    fn weights(self) -> &'static [u64; 8] {
        match self {
            Mix::Default => &SHAPE_WEIGHTS,
            Mix::Preemption => &PREEMPTION_WEIGHTS,
        }
    }

    /// How long a placed group of `shape` is held, in ms (from `rng`): in the
    /// preemption mix low-priority groups hold their room long enough for urgent ones
    /// to find the fleet full.
    fn hold_ms(self, shape: Shape, rng: &mut Rng) -> u64 {
        match (self, shape) {
            (_, Shape::Probe) => 0,
            (Mix::Preemption, s) if s != Shape::Urgent => rng.range(400, 1_500),
            _ => rng.range(50, 400),
        }
    }
}
/// The priority of urgent groups; every other group has 0.
pub const URGENT_PRIORITY: i32 = 100;

pub(crate) fn gangs_of(shape: Shape, op: u64) -> Vec<GangShape> {
    let gang = |k: u32, min: u32, members: u32, mode: &str, cpu: u32, gpu: u32| GangShape {
        name: format!("{NAMESPACE}/op{op}-{k}"),
        min_member: min,
        members,
        mode: mode.to_string(),
        cpu,
        gpu,
        priority: 0,
        required: None,
    };
    match shape {
        Shape::PairGroup => vec![
            gang(0, 2, 2, "Strict", 3, 0),
            GangShape {
                required: Some(RACK_LABEL.to_string()),
                ..gang(1, 2, 2, "Strict", 9, 0)
            },
        ],
        Shape::NonStrict => vec![gang(0, 2, 3, "NonStrict", 2, 0)],
        Shape::Devices => vec![gang(0, 2, 2, "Strict", 1, 1)],
        Shape::Wide => vec![gang(0, 5, 5, "Strict", 12, 0)],
        Shape::Unfit => vec![gang(0, 1, 1, "Strict", 1_000, 0)],
        Shape::Accumulating => vec![gang(0, 5, 5, "NonStrict", 12, 0)],
        Shape::Filler => vec![gang(0, 3, 3, "Strict", 10, 0)],
        Shape::Urgent => vec![GangShape {
            priority: URGENT_PRIORITY,
            ..gang(0, 4, 4, "Strict", 12, 0)
        }],
        Shape::Probe | Shape::Hostile => vec![gang(0, 1, 1, "Strict", 1, 0)],
    }
}

pub(crate) fn request_of(key: &str, gangs: &[GangShape]) -> SubmitGangGroupRequest {
    SubmitGangGroupRequest {
        queue: String::new(),
        run_limit_seconds: 0,
        idempotency_key: key.to_string(),
        name: key.to_string(),
        gangs: gangs
            .iter()
            .map(|g| {
                let (namespace, name) = g.name.split_once('/').unwrap_or((NAMESPACE, &g.name));
                let mut requests = serde_json::Map::new();
                requests.insert("cpu".into(), g.cpu.to_string().into());
                if g.gpu > 0 {
                    requests.insert(GPU_RESOURCE.into(), g.gpu.to_string().into());
                }
                let pod = serde_json::json!({ "requests": requests });
                GangSpec {
                    name: name.to_string(),
                    namespace: namespace.to_string(),
                    min_member: g.min_member,
                    total_number: g.members,
                    mode: g.mode.clone(),
                    wait_time_ms: 0,
                    priority: g.priority,
                    members: vec![MemberSpec {
                        name: "m".into(),
                        count: g.members,
                        pod_json: pod.to_string(),
                        pods: None,
                    }],
                    topology: g.required.as_ref().map(|key| TopologySpec {
                        required: key.clone(),
                        ..TopologySpec::default()
                    }),
                }
            })
            .collect(),
    }
}

/// Member names as namespace/gang/member of a group's placements.
pub fn placed_of(status: &GangGroupStatus) -> Vec<Placed> {
    status
        .placements
        .iter()
        .map(|p| Placed {
            member: format!("{}/{}/{}", p.namespace, p.gang, p.member),
            node: p.node.clone(),
            devices: p
                .devices
                .iter()
                .map(|d| format!("{}/{}/{}", d.driver, d.pool, d.device))
                .collect(),
        })
        .collect()
}

/// States in which a group holds nothing and never will again.
pub const TERMINAL: [&str; 4] = ["Released", "Cancelled", "TimedOut", "Preempted"];

/// The workload of one drill.
pub struct Workload {
    pub(crate) replicas: Arc<Replicas>,
    pub(crate) history: History,
    next_op: AtomicU64,
    /// The hostile probes run so far (they take turns).
    pub(crate) next_probe: AtomicU64,
    pub(crate) tag: String,
    /// The cluster's id, which forged envelopes name.
    pub(crate) cluster_id: String,
}

/// A group the workload submitted whose fate it does not know.
struct Submitted {
    id: u64,
    state: String,
}

impl Workload {
    /// A workload over `replicas` of cluster `cluster_id`, recording into `history`;
    /// `tag` prefixes its keys.
    pub fn new(
        replicas: Arc<Replicas>,
        history: History,
        tag: String,
        cluster_id: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            replicas,
            history,
            next_op: AtomicU64::new(1),
            next_probe: AtomicU64::new(0),
            tag,
            cluster_id,
        })
    }

    pub(crate) fn op_id(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts the workers and the probe; they stop when `stop` turns true.
    pub fn spawn(
        self: &Arc<Self>,
        rng: &mut Rng,
        stop: watch::Receiver<bool>,
        mix: Mix,
    ) -> JoinSet<()> {
        let mut set = JoinSet::new();
        for _ in 0..mix.workers() {
            let w = self.clone();
            let rng = rng.fork();
            set.spawn(w.worker(rng, stop.clone(), None, mix));
        }
        for _ in 0..HOSTILE_WORKERS {
            let w = self.clone();
            let rng = rng.fork();
            set.spawn(w.worker(rng, stop.clone(), Some(Shape::Hostile), mix));
        }
        set.spawn(self.clone().prober(stop));
        set
    }

    /// Runs group lives (of `only` this shape, or of every shape by weight) until `stop`.
    async fn worker(
        self: Arc<Self>,
        mut rng: Rng,
        stop: watch::Receiver<bool>,
        only: Option<Shape>,
        mix: Mix,
    ) {
        while !*stop.borrow() {
            let shape = only.unwrap_or_else(|| SHAPES[rng.weighted(mix.weights()).unwrap_or(0)]);
            self.cycle(shape, &mut rng, mix).await;
            tokio::time::sleep(Duration::from_millis(rng.range(0, 50))).await;
        }
    }

    async fn prober(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(PROBES_IN_FLIGHT_MAX));
        let mut probes = JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(PROBE_INTERVAL_MS));
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = tick.tick() => {}
            }
            while probes.try_join_next().is_some() {}
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let w = self.clone();
            probes.spawn(async move {
                let mut rng = Rng::new(0);
                w.cycle(Shape::Probe, &mut rng, Mix::Default).await;
                drop(permit);
            });
        }
        while probes.join_next().await.is_some() {}
    }

    /// One group's life: submit, wait for placement, hold, give back.
    async fn cycle(&self, shape: Shape, rng: &mut Rng, mix: Mix) {
        if shape == Shape::Hostile {
            self.hostile(rng).await;
            return;
        }
        let (id, placed) = match self.place(shape).await {
            Some(x) => x,
            None => return,
        };
        let Some(id) = id else { return };
        if !placed {
            // Waiting (no room, or the workload gave up waiting): take it back.
            self.give_back("cancel", id).await;
            return;
        }
        let hold_ms = mix.hold_ms(shape, rng);
        if hold_ms > 0 {
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        }
        if shape == Shape::NonStrict && rng.chance(50) {
            self.release_one(id).await;
        }
        let f = if rng.chance(10) { "cancel" } else { "release" };
        self.give_back(f, id).await;
    }

    /// Submits a group and waits for it to be placed: (id if known, placed).
    async fn place(&self, shape: Shape) -> Option<(Option<u64>, bool)> {
        let op = self.op_id();
        let key = format!("{}-op{op}", self.tag);
        let gangs = gangs_of(shape, op);
        let request = request_of(&key, &gangs);
        self.history.record(Event::Invoke {
            op,
            f: "place".into(),
            key: key.clone(),
            gangs,
            members: vec![],
        });
        let submitted = self
            .replicas
            .call(|c| {
                let r = request.clone();
                async move { c.submit_once(r).await }
            })
            .await;
        let status = match submitted {
            CallResult::Ok(s) => s,
            CallResult::Fail(error) => {
                self.history.record(Event::Fail { op, error });
                return Some((None, false));
            }
            CallResult::Unknown(error) => {
                self.history.record(Event::Unknown { op, error });
                return Some((None, false));
            }
        };
        let id = status.id;
        if shape == Shape::Unfit {
            self.history.record(Event::Unknown {
                op,
                error: format!("group {id} cannot fit; it waits in {}", status.state),
            });
            return Some((Some(id), false));
        }
        match self.wait_placed(id, status).await {
            Ok(s) if s.state == "Placed" => {
                self.history.record(Event::Ok {
                    op,
                    group: id,
                    state: s.state.clone(),
                    placed: placed_of(&s),
                });
                Some((Some(id), true))
            }
            Ok(s) => {
                self.history.record(Event::Fail {
                    op,
                    error: format!("group {id} ended {}: {}", s.state, s.reason),
                });
                Some((Some(id), false))
            }
            Err(w) => {
                self.history.record(Event::Unknown {
                    op,
                    error: format!(
                        "group {id} not placed within {PLACE_WAIT_MS} ms (last state {})",
                        w.state
                    ),
                });
                Some((Some(w.id), false))
            }
        }
    }

    async fn wait_placed(
        &self,
        id: u64,
        mut last: GangGroupStatus,
    ) -> Result<GangGroupStatus, Submitted> {
        let deadline = Instant::now() + Duration::from_millis(PLACE_WAIT_MS);
        loop {
            if last.state == "Placed" || TERMINAL.contains(&last.state.as_str()) {
                return Ok(last);
            }
            if Instant::now() >= deadline {
                return Err(Submitted {
                    id,
                    state: last.state,
                });
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
            if let CallResult::Ok(s) = self.replicas.call(|c| async move { c.get(id).await }).await
            {
                last = s;
            }
        }
    }

    async fn release_one(&self, id: u64) {
        let status = match self.replicas.call(|c| async move { c.get(id).await }).await {
            CallResult::Ok(s) => s,
            _ => return,
        };
        let Some(member) = placed_of(&status).into_iter().next().map(|p| p.member) else {
            return;
        };
        let op = self.op_id();
        self.history.record(Event::Invoke {
            op,
            f: "release_members".into(),
            key: id.to_string(),
            gangs: vec![],
            members: vec![member.clone()],
        });
        let r = self
            .replicas
            .call(|c| {
                let m = vec![member.clone()];
                async move { c.release_members(id, m).await }
            })
            .await;
        self.record_result(op, id, r);
    }

    /// Releases or cancels group `id`, recorded as operation `f`.
    pub async fn give_back(&self, f: &str, id: u64) {
        let op = self.op_id();
        self.history.record(Event::Invoke {
            op,
            f: f.to_string(),
            key: id.to_string(),
            gangs: vec![],
            members: vec![],
        });
        let cancel = f == "cancel";
        let r = self
            .replicas
            .call(|c| async move {
                if cancel {
                    c.cancel(id).await
                } else {
                    c.release(id).await
                }
            })
            .await;
        self.record_result(op, id, r);
    }

    pub(crate) fn record_result(&self, op: u64, id: u64, r: CallResult<GangGroupStatus>) {
        let event = match r {
            CallResult::Ok(s) => Event::Ok {
                op,
                group: id,
                state: s.state,
                placed: vec![],
            },
            CallResult::Fail(error) => Event::Fail { op, error },
            CallResult::Unknown(error) => Event::Unknown { op, error },
        };
        self.history.record(event);
    }
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
