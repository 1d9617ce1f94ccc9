//! DRA allocation, gangway against kube-scheduler, on one real control plane.
//!
//! Each world (drawn from a seed) is a few nodes, each with a pool of GPUs (a model, a
//! memory size, a NUMA node, sometimes a NoSchedule taint) and, on half of them, a
//! partitionable GPU (a whole device and two halves on one shared counter, in a second
//! slice of the pool); two DeviceClasses (one with a driver config, one selecting big
//! GPUs); and pods with one claim each, from their own ResourceClaimTemplate: an exact
//! count with or without a model selector, a firstAvailable choice, two requests on one
//! NUMA node or on different ones, every matching GPU (`allocationMode: All`), or admin
//! access to one GPU (a monitoring agent: the device may be in use and stays free); some
//! requests tolerate the taint, some claims carry a config, a few selectors fail at run
//! time. Half the nodes also have a GPU that allows several allocations (consumable
//! capacity: 24 or 48 GiB of `mem`, requests in steps of 8, default 8), served only by a
//! third class; some claims ask it for 8–24 GiB or the default. About one claim in four
//! is a ResourceClaim shared by two or three pods (for gangway a Koordinator gang of
//! them; kube-scheduler ignores the annotations). Half the worlds also have a
//! network-attached pool: one to three GPUs in a ResourceSlice whose node selector
//! names some of the world's nodes (by hostname), or, in half of those, a slice that
//! chooses nodes per device (`perDeviceNodeSelection`: each GPU names one node, a
//! hostname selector, or its copy's nodes by label), which any claim may be served from beside its
//! node's GPUs. In half the worlds the GPUs' `numa` attribute is a list
//! (`DRAListTypeAttributes`, gated on for both schedulers), some GPUs near two NUMA
//! nodes: matchAttribute then holds where the devices' lists share a value, and
//! distinctAttribute where no two do. The world is created twice, on two sets of nodes (labels keep the copies apart):
//! once for kube-scheduler v1.36 (`default-scheduler` pods), once for gangway (three
//! `gangway serve` processes). Once neither has bound a pod for `SETTLE_MS`, a validator
//! written from the `resource.k8s.io/v1` rules (not from either allocator) checks both
//! sides: every allocation names devices of the pod's node (or of the network pool,
//! when it reaches that node) that exist, match the class
//! and request selectors and tolerate the taints, number what the request asks (every
//! matching one for All), keep the NUMA constraint and the shared counter, take a share
//! of a shared GPU (a share id, consuming what was asked) within its capacity, carry the
//! class's config (`FromClass`, naming the requests it served) and the claim's
//! (`FromClaim`), and are reserved for the pod; the allocation's node selector is the
//! pod's node when a device is node-local, else the network slice's (per device: one
//! that admits exactly the nodes every allocated device reaches); no device is
//! allocated to two claims; a shared claim's pods are all on nodes its selector admits;
//! no claim whose selectors fail at run time is allocated (the error aborts the
//! allocation).
//! Then gangway must have left no pod unbound whose claim fits in the devices it left
//! free (an exhaustive search over the small nodes), or whose shared claim is allocated: both place pods one at a time, in
//! their own order, so either may end with more pods bound in a world, and the run
//! reports how often each did. kube-scheduler's side checks the validator itself. A
//! failing world is shrunk (pods, then nodes) and printed with its seed.
//!
//! `GANGWAY_DRA_WORLDS` (default 3) and `GANGWAY_DRA_SEED` set the run; the longer runs
//! in docs/BENCHMARKS.md use more worlds.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gangway_kube_double::store::{
    DEVICE_CLASSES, EVENTS, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES,
};
use gangway_kube_env::{ControlPlane, Options, ADMIN_USER};
use serde_json::{json, Value};
use support::Cluster;

const DRIVER: &str = "gpu.diff.example.com";
/// The taint some devices carry.
const TAINT: &str = "example.com/maintenance";
/// The parameters of a claim's config.
static CLAIM_CONFIG: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| json!({"profile": "claim"}));
/// Worlds in a run unless `GANGWAY_DRA_WORLDS` says otherwise.
const WORLDS_DEFAULT: u64 = 3;
/// First seed unless `GANGWAY_DRA_SEED` says otherwise.
const SEED_DEFAULT: u64 = 0x6a09_e667;
/// A side has settled when it bound no pod for this long, in ms.
const SETTLE_MS: u64 = 5_000;
/// The feature gate list-typed device attributes need (alpha in 1.36), on both the API
/// server and kube-scheduler.
const LIST_ATTRIBUTES_GATE: &str = "--feature-gates=DRAListTypeAttributes=true";
/// How long a world's nodes and slices stand before its claims and pods are created,
/// in ms (longer than the ingest's idle pass gap, `INGEST_IDLE_PASS_MS`).
const INVENTORY_SETTLE_MS: u64 = 2_500;
/// Longest a world may take to settle, in ms.
const WORLD_TIMEOUT_MS: u64 = 90_000;
/// How often the test looks at the API server, in ms.
const POLL_MS: u64 = 250;

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

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// A GPU of a world.
#[derive(Debug, Clone)]
struct Gpu {
    name: String,
    model: &'static str,
    mem_gib: i64,
    numa: i64,
    /// Carries a NoSchedule taint (`example.com/maintenance`).
    tainted: bool,
    /// What it consumes of its node's shared counter (`pgpu/mem`, `COUNTER_TOTAL`);
    /// 0: nothing (a partition of one physical GPU consumes its share).
    consumes: i64,
    /// Consumable capacity: 0 for an exclusive device; else it allows several
    /// allocations and has this much `mem` to share (in steps of `SHARE_STEP`).
    shared_mem: i64,
    /// In a world with list attributes, a second NUMA node the GPU is near (its `numa`
    /// attribute is then the list of both).
    near: Option<i64>,
}

impl Gpu {
    /// An exclusive GPU named `name`: model, memory, NUMA node and (one in five) the
    /// maintenance taint, drawn in that order.
    fn draw(rng: &mut Rng, name: String) -> Gpu {
        Gpu {
            name,
            model: rng.pick(&MODELS),
            mem_gib: rng.pick(&MEMS),
            numa: (rng.next() % 2) as i64,
            tainted: rng.next().is_multiple_of(5),
            consumes: 0,
            shared_mem: 0,
            near: None,
        }
    }

    /// The NUMA nodes it is near: its own, and in a list world perhaps a second.
    fn numas(&self) -> BTreeSet<i64> {
        std::iter::once(self.numa).chain(self.near).collect()
    }

    /// What one allocation of it for `ask` takes of its room (1 of 1 for an exclusive
    /// device; the capacity requested, or the policy's default, for a shared one).
    fn need(&self, ask: &Ask) -> i64 {
        if self.shared_mem > 0 {
            ask.capacity.unwrap_or(SHARE_STEP)
        } else {
            1
        }
    }

    /// Its room when nothing holds it.
    fn room(&self) -> i64 {
        if self.shared_mem > 0 {
            self.shared_mem
        } else {
            1
        }
    }
}

/// A condition on a device, as the validator checks it (and as CEL says it).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pred {
    Model(&'static str),
    MemAtLeast(i64),
    /// A selector that fails at run time on every device: a misspelt attribute (no such
    /// key) or a string compared with a number. Never true.
    Broken(Mistake),
    /// Whether the device allows several allocations (consumable capacity).
    Shared(bool),
}

/// How a broken selector is wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mistake {
    MisspeltAttribute,
    WrongType,
}

impl Pred {
    fn cel(&self) -> String {
        match self {
            Pred::Model(m) => format!("device.attributes[\"{DRIVER}\"].model == \"{m}\""),
            Pred::MemAtLeast(g) => format!("device.attributes[\"{DRIVER}\"].memGiB >= {g}"),
            Pred::Broken(Mistake::MisspeltAttribute) => {
                format!("device.attributes[\"{DRIVER}\"].modle == \"a100\"")
            }
            Pred::Broken(Mistake::WrongType) => {
                format!("device.attributes[\"{DRIVER}\"].model == 80")
            }
            Pred::Shared(shared) => format!("device.allowMultipleAllocations == {shared}"),
        }
    }

    fn holds(&self, gpu: &Gpu) -> bool {
        match self {
            Pred::Model(m) => gpu.model == *m,
            Pred::MemAtLeast(g) => gpu.mem_gib >= *g,
            Pred::Broken(_) => false,
            Pred::Shared(shared) => (gpu.shared_mem > 0) == *shared,
        }
    }
}

/// A DeviceClass of a world: every device of the driver, and these conditions.
#[derive(Debug, Clone)]
struct Class {
    name: String,
    preds: Vec<Pred>,
    /// A driver config the allocation must carry (`FromClass`).
    config: Option<Value>,
}

/// One way to serve a request: a class, a count (or every matching device) and
/// selectors; whether it tolerates the maintenance taint.
#[derive(Debug, Clone)]
struct Ask {
    class: usize,
    count: Count,
    preds: Vec<Pred>,
    tolerates: bool,
    /// Admin access: the device is watched, not taken (it may be in use, and stays free).
    admin: bool,
    /// `mem` requested of a shared device (consumable capacity), in GiB.
    capacity: Option<i64>,
}

/// How many devices an ask takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    Exact(u64),
    /// allocationMode All: every matching device of the node, all free, at least one.
    All,
}

impl Ask {
    fn new(class: usize, count: Count, preds: Vec<Pred>, tolerates: bool) -> Ask {
        Ask {
            class,
            count,
            preds,
            tolerates,
            admin: false,
            capacity: None,
        }
    }

    /// Whether `gpu` may serve this ask: class and request selectors, and its taint.
    fn accepts(&self, world: &World, gpu: &Gpu) -> bool {
        let class = &world.classes[self.class];
        class.preds.iter().chain(&self.preds).all(|p| p.holds(gpu))
            && (!gpu.tainted || self.tolerates)
    }
}

/// A request of a claim.
#[derive(Debug, Clone)]
enum Request {
    Exactly {
        name: &'static str,
        ask: Ask,
    },
    FirstAvailable {
        name: &'static str,
        subs: Vec<(&'static str, Ask)>,
    },
}

/// A pod's claim.
#[derive(Debug, Clone)]
struct Claim {
    requests: Vec<Request>,
    /// How the claim's devices' NUMA nodes relate (matchAttribute, distinctAttribute).
    numa: NumaRule,
    /// A claim config for every request (`FromClaim` in the allocation).
    config: bool,
    /// How many pods use it: one (its own claim, from a template) or several (one
    /// ResourceClaim they all name; for gangway they form a Koordinator gang).
    sharers: usize,
}

impl Claim {
    /// The names of the pods of claim `p`.
    fn pod_names(&self, p: usize) -> Vec<String> {
        if self.sharers <= 1 {
            return vec![format!("p-{p}")];
        }
        (0..self.sharers).map(|j| format!("p-{p}-{j}")).collect()
    }

    /// Whether a selector the allocator must evaluate fails at run time: an exact
    /// request's, or a firstAvailable request's first choice (always tried). Such a claim
    /// cannot be allocated: the error aborts the allocation (upstream's allocator, and
    /// gangway's), it does not fall through to the next choice.
    fn breaks(&self) -> bool {
        let broken = |ask: &Ask| ask.preds.iter().any(|p| matches!(p, Pred::Broken(_)));
        self.requests.iter().any(|r| match r {
            Request::Exactly { ask, .. } => broken(ask),
            Request::FirstAvailable { subs, .. } => subs.first().is_some_and(|(_, a)| broken(a)),
        })
    }
}

/// A constraint on the NUMA attribute of a claim's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumaRule {
    Any,
    /// matchAttribute: one value for all.
    Same,
    /// distinctAttribute: a different value each.
    Distinct,
}

impl NumaRule {
    /// Whether devices near these NUMA nodes (a set per device; a scalar attribute is a
    /// set of one) keep the rule: matchAttribute when every device shares a value with
    /// the others (the sets intersect), distinctAttribute when no two share one.
    fn holds(&self, sets: &[BTreeSet<i64>]) -> bool {
        match self {
            NumaRule::Any => true,
            NumaRule::Same => sets
                .iter()
                .skip(1)
                .fold(sets.first().cloned(), |common, set| {
                    common.map(|c| c.intersection(set).copied().collect())
                })
                .is_none_or(|common| !common.is_empty()),
            NumaRule::Distinct => {
                let all: BTreeSet<i64> = sets.iter().flatten().copied().collect();
                all.len() == sets.iter().map(BTreeSet::len).sum::<usize>()
            }
        }
    }
}

/// Everything a world holds.
#[derive(Debug, Clone)]
struct World {
    index: u64,
    seed: u64,
    nodes: Vec<Vec<Gpu>>,
    /// A network-attached pool: its GPUs, and which nodes it reaches (by node index).
    network: Option<(Vec<Gpu>, Vec<bool>)>,
    /// Half the time the network pool's slice chooses nodes per device
    /// (`perDeviceNodeSelection`): per GPU, which nodes it reaches (the pool's own reach
    /// is then their union).
    per_device: Option<Vec<Vec<bool>>>,
    /// Half the time the GPUs' `numa` attribute is a list (`DRAListTypeAttributes`):
    /// some GPUs are near two NUMA nodes.
    lists: bool,
    classes: Vec<Class>,
    pods: Vec<Claim>,
}

/// Salt of the random stream that draws a world's network pool (a stream of its own,
/// so the rest of a world is what the same seed drew before network pools existed).
const NETWORK_SALT: u64 = 0x5be0_cd19_137e_2179;
/// Salt of the random stream that decides whether the network pool chooses nodes per
/// device, and which (again a stream of its own).
const PER_DEVICE_SALT: u64 = 0x1f83_d9ab_fb41_bd6b;
/// Salt of the random stream that decides whether a world's NUMA attributes are lists,
/// and which GPUs are near two nodes (again a stream of its own).
const LIST_SALT: u64 = 0x5be0_cd19_1f83_d9ab;

const MODELS: [&str; 3] = ["a100", "h100", "l4"];
/// The shared counter of a node with a partitionable GPU: its memory, split between a
/// whole-GPU device (all of it) and two halves.
const COUNTER_TOTAL: i64 = 80;
const MEMS: [i64; 3] = [16, 40, 80];
/// A shared GPU's capacity request policy: default, minimum and step, in GiB.
const SHARE_STEP: i64 = 8;

impl World {
    fn draw(index: u64, seed: u64) -> World {
        let mut rng = Rng(seed);
        let nodes: Vec<Vec<Gpu>> = (0..rng.range(2, 3))
            .map(|_| {
                let mut gpus: Vec<Gpu> = (0..rng.range(1, 4))
                    .map(|d| Gpu::draw(&mut rng, format!("gpu-{d}")))
                    .collect();
                gpus.extend(Self::partitions(rng.next().is_multiple_of(2)));
                if rng.next().is_multiple_of(2) {
                    // A GPU whose memory several claims share (consumable capacity).
                    let shared_mem = rng.pick(&[24, 48]);
                    gpus.push(Gpu {
                        name: "s-0".to_string(),
                        model: "l4",
                        mem_gib: shared_mem,
                        numa: 0,
                        tainted: false,
                        consumes: 0,
                        shared_mem,
                        near: None,
                    });
                }
                gpus
            })
            .collect();
        let classes = vec![
            Class {
                name: format!("w{index}-gpu"),
                preds: vec![Pred::Shared(false)],
                config: Some(json!({"world": index, "sharing": "exclusive"})),
            },
            Class {
                name: format!("w{index}-big"),
                preds: vec![Pred::Shared(false), Pred::MemAtLeast(40)],
                config: None,
            },
            Class {
                name: format!("w{index}-shared"),
                preds: vec![Pred::Shared(true)],
                config: None,
            },
        ];
        let pods = (0..rng.range(3, 8))
            .map(|_| {
                let class = (rng.next() % 2) as usize;
                let tolerates = rng.next().is_multiple_of(3);
                let config = rng.next().is_multiple_of(2);
                let (requests, numa) = match rng.next() % 7 {
                    0 => {
                        let preds = if rng.next().is_multiple_of(2) {
                            match rng.next() % 8 {
                                0 => vec![Pred::Broken(Mistake::MisspeltAttribute)],
                                1 => vec![Pred::Broken(Mistake::WrongType)],
                                _ => vec![Pred::Model(rng.pick(&MODELS))],
                            }
                        } else {
                            Vec::new()
                        };
                        let ask = Ask::new(class, Count::Exact(rng.range(1, 2)), preds, tolerates);
                        (vec![Request::Exactly { name: "gpu", ask }], NumaRule::Any)
                    }
                    1 => {
                        // Now and then the first choice's selector fails at run time.
                        let pred = if rng.next().is_multiple_of(6) {
                            Pred::Broken(Mistake::MisspeltAttribute)
                        } else {
                            Pred::Model("h100")
                        };
                        let first = Ask::new(0, Count::Exact(2), vec![pred], false);
                        let then = Ask::new(class, Count::Exact(1), Vec::new(), tolerates);
                        let subs = vec![("two-h100", first), ("one", then)];
                        (
                            vec![Request::FirstAvailable { name: "gpu", subs }],
                            NumaRule::Any,
                        )
                    }
                    2 => {
                        let a = Ask::new(0, Count::Exact(1), Vec::new(), tolerates);
                        let b = Ask::new(class, Count::Exact(1), Vec::new(), false);
                        let requests = vec![
                            Request::Exactly { name: "a", ask: a },
                            Request::Exactly { name: "b", ask: b },
                        ];
                        let rule = if rng.next().is_multiple_of(2) {
                            NumaRule::Same
                        } else {
                            NumaRule::Distinct
                        };
                        (requests, rule)
                    }
                    3 => {
                        // Every matching device; tolerating the taint, so which devices
                        // match does not hang on how upstream treats a tainted one here.
                        let ask =
                            Ask::new(1, Count::All, vec![Pred::Model(rng.pick(&MODELS))], true);
                        (vec![Request::Exactly { name: "gpu", ask }], NumaRule::Any)
                    }
                    4 => {
                        // A monitoring agent: admin access to one GPU, in use or not.
                        let mut ask = Ask::new(0, Count::Exact(1), Vec::new(), tolerates);
                        ask.admin = true;
                        (vec![Request::Exactly { name: "gpu", ask }], NumaRule::Any)
                    }
                    5 => {
                        let ask = Ask::new(1, Count::Exact(1), Vec::new(), tolerates);
                        (vec![Request::Exactly { name: "gpu", ask }], NumaRule::Any)
                    }
                    _ => {
                        // Memory of a shared GPU: a multiple of the step, or the default.
                        let mut ask = Ask::new(2, Count::Exact(1), Vec::new(), tolerates);
                        ask.capacity = rng.pick(&[None, Some(8), Some(16), Some(24)]);
                        (vec![Request::Exactly { name: "gpu", ask }], NumaRule::Any)
                    }
                };
                // Now and then one ResourceClaim for two or three pods.
                let sharers = if rng.next().is_multiple_of(4) {
                    rng.range(2, 3) as usize
                } else {
                    1
                };
                Claim {
                    requests,
                    numa,
                    config,
                    sharers,
                }
            })
            .collect();
        let mut network = Self::draw_network(seed, nodes.len());
        let per_device = network
            .as_ref()
            .and_then(|(gpus, _)| Self::draw_per_device(seed, gpus.len(), nodes.len()));
        if let (Some((_, reach)), Some(per)) = (&mut network, &per_device) {
            *reach = (0..nodes.len())
                .map(|n| per.iter().any(|d| d.get(n) == Some(&true)))
                .collect();
        }
        let mut nodes = nodes;
        let lists = Self::draw_lists(seed, &mut nodes, &mut network);
        World {
            index,
            seed,
            nodes,
            network,
            per_device,
            lists,
            classes,
            pods,
        }
    }

    /// Half the time, NUMA attributes as lists: one exclusive GPU in three (of the nodes
    /// and the network pool) is near the other NUMA node too.
    fn draw_lists(
        seed: u64,
        nodes: &mut [Vec<Gpu>],
        network: &mut Option<(Vec<Gpu>, Vec<bool>)>,
    ) -> bool {
        let mut rng = Rng(seed ^ LIST_SALT);
        if rng.next().is_multiple_of(2) {
            return false;
        }
        let network = network.iter_mut().flat_map(|(gpus, _)| gpus.iter_mut());
        for gpu in nodes.iter_mut().flatten().chain(network) {
            if gpu.shared_mem == 0 && gpu.consumes == 0 && rng.next().is_multiple_of(3) {
                gpu.near = Some(1 - gpu.numa);
            }
        }
        true
    }

    /// Half the time, each network GPU's own reach: one node (by name), a non-empty set
    /// of nodes (a hostname selector), or every node.
    fn draw_per_device(seed: u64, gpus: usize, nodes: usize) -> Option<Vec<Vec<bool>>> {
        let mut rng = Rng(seed ^ PER_DEVICE_SALT);
        if nodes == 0 || rng.next().is_multiple_of(2) {
            return None;
        }
        let per = (0..gpus)
            .map(|_| match rng.next() % 3 {
                0 => {
                    let only = (rng.next() % nodes as u64) as usize;
                    (0..nodes).map(|n| n == only).collect()
                }
                1 => {
                    let mut reach: Vec<bool> =
                        (0..nodes).map(|_| rng.next().is_multiple_of(2)).collect();
                    let first = (rng.next() % nodes as u64) as usize;
                    reach[first] = true;
                    reach
                }
                _ => vec![true; nodes],
            })
            .collect();
        Some(per)
    }

    /// Half the time, one to three exclusive GPUs reaching a non-empty set of the nodes.
    fn draw_network(seed: u64, nodes: usize) -> Option<(Vec<Gpu>, Vec<bool>)> {
        let mut rng = Rng(seed ^ NETWORK_SALT);
        if rng.next().is_multiple_of(2) {
            return None;
        }
        let gpus = (0..rng.range(1, 3))
            .map(|d| Gpu::draw(&mut rng, format!("fabric-{d}")))
            .collect();
        let mut reach: Vec<bool> = (0..nodes).map(|_| rng.next().is_multiple_of(2)).collect();
        if !reach.iter().any(|r| *r) {
            let first = (rng.next() % nodes.max(1) as u64) as usize;
            if let Some(r) = reach.get_mut(first) {
                *r = true;
            }
        }
        Some((gpus, reach))
    }

    /// The network pool's name in one copy of the world.
    fn network_pool(&self, side: Side) -> String {
        format!("w{}-{}-fabric", self.index, side.label())
    }

    /// Whether network GPU `d` reaches node `n`.
    fn reaches(&self, d: usize, n: usize) -> bool {
        match (&self.network, &self.per_device) {
            (Some(_), Some(per)) => per.get(d).and_then(|r| r.get(n)) == Some(&true),
            (Some((_, reach)), None) => reach.get(n) == Some(&true),
            (None, _) => false,
        }
    }

    /// The positions, in the network pool, of the GPUs node `n` reaches.
    fn network_reached(&self, n: usize) -> Vec<usize> {
        let count = self.network.as_ref().map_or(0, |(gpus, _)| gpus.len());
        (0..count).filter(|d| self.reaches(*d, n)).collect()
    }

    /// The network GPUs node `n` reaches (none without a pool).
    fn network_for(&self, n: usize) -> Vec<Gpu> {
        let Some((gpus, _)) = &self.network else {
            return Vec::new();
        };
        self.network_reached(n)
            .into_iter()
            .map(|d| gpus[d].clone())
            .collect()
    }

    /// Network GPU `d` as its slice publishes it: with `perDeviceNodeSelection`, with its
    /// own reach (a node no copy has when it reaches none, as after shrinking).
    fn network_device_json(&self, side: Side, d: usize, gpu: &Gpu) -> Value {
        let mut out = device_json(gpu, self.lists);
        let Some(per) = &self.per_device else {
            return out;
        };
        let names: Vec<String> = (0..self.nodes.len())
            .filter(|n| per.get(d).and_then(|r| r.get(*n)) == Some(&true))
            .map(|n| self.node_name(side, n))
            .collect();
        if names.len() == self.nodes.len() && !names.is_empty() {
            // Every node of this copy, by its label: `allNodes` would reach the other
            // copy's nodes too (kube.rs tests `allNodes` on its own).
            out["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "diff", "operator": "In", "values": [self.label(side)]}
            ]}]});
        } else if names.len() == 1 {
            out["nodeName"] = json!(names[0]);
        } else if names.is_empty() {
            out["nodeName"] = json!(format!("w{}-{}-gone", self.index, side.label()));
        } else {
            out["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": names}
            ]}]});
        }
        out
    }

    /// The network slice's node selector term in one copy (`None`: no pool, or it
    /// reaches no node).
    fn network_term(&self, side: Side) -> Option<Value> {
        let (_, reach) = self.network.as_ref()?;
        let names: Vec<String> = (0..self.nodes.len())
            .filter(|n| reach.get(*n) == Some(&true))
            .map(|n| self.node_name(side, n))
            .collect();
        if names.is_empty() {
            return None;
        }
        Some(json!({"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": names}
        ]}))
    }

    /// A partitionable a100 (whole, or two halves on shared counters), or nothing.
    fn partitions(present: bool) -> Vec<Gpu> {
        if !present {
            return Vec::new();
        }
        [
            ("p-whole", COUNTER_TOTAL),
            ("p-half-0", COUNTER_TOTAL / 2),
            ("p-half-1", COUNTER_TOTAL / 2),
        ]
        .into_iter()
        .map(|(name, share)| Gpu {
            name: name.to_string(),
            model: "a100",
            mem_gib: share,
            numa: 0,
            tainted: false,
            consumes: share,
            shared_mem: 0,
            near: None,
        })
        .collect()
    }

    /// How many pods the world has (a shared claim's pods each count).
    fn pod_count(&self) -> usize {
        self.pods.iter().map(|c| c.sharers.max(1)).sum()
    }

    /// How many of them share a claim.
    fn sharing_pods(&self) -> usize {
        self.pods
            .iter()
            .filter(|c| c.sharers > 1)
            .map(|c| c.sharers)
            .sum()
    }

    fn node_name(&self, side: Side, i: usize) -> String {
        format!("w{}-{}-{i}", self.index, side.label())
    }

    fn namespace(&self, side: Side) -> String {
        format!("w{}-{}", self.index, side.label())
    }

    fn label(&self, side: Side) -> String {
        format!("w{}-{}", self.index, side.label())
    }

    fn describe(&self) -> String {
        format!(
            "world {} (seed {:#x}):\n  nodes: {:?}\n  network: {:?}\n  per-device reach: {:?}\n  list attributes: {}\n  classes: {:?}\n  pods: {:?}",
            self.index, self.seed, self.nodes, self.network, self.per_device, self.lists, self.classes, self.pods
        )
    }
}

/// Which scheduler a copy of the world is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    KubeScheduler,
    Gangway,
}

impl Side {
    fn label(&self) -> &'static str {
        match self {
            Side::KubeScheduler => "kube",
            Side::Gangway => "ours",
        }
    }

    fn scheduler_name(&self) -> &'static str {
        match self {
            Side::KubeScheduler => "default-scheduler",
            Side::Gangway => "gangway",
        }
    }
}

fn selectors(preds: &[Pred]) -> Vec<Value> {
    preds
        .iter()
        .map(|p| json!({"cel": {"expression": p.cel()}}))
        .collect()
}

fn ask_json(world: &World, ask: &Ask) -> Value {
    let mut v = json!({"deviceClassName": world.classes[ask.class].name});
    match ask.count {
        Count::Exact(n) => v["count"] = json!(n),
        Count::All => v["allocationMode"] = json!("All"),
    }
    if !ask.preds.is_empty() {
        v["selectors"] = Value::Array(selectors(&ask.preds));
    }
    if ask.tolerates {
        v["tolerations"] = json!([{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
    }
    if ask.admin {
        v["adminAccess"] = json!(true);
    }
    if let Some(mem) = ask.capacity {
        v["capacity"] = json!({"requests": {"mem": mem.to_string()}});
    }
    v
}

fn claim_spec(world: &World, claim: &Claim) -> Value {
    let requests: Vec<Value> = claim
        .requests
        .iter()
        .map(|r| match r {
            Request::Exactly { name, ask } => {
                json!({"name": name, "exactly": ask_json(world, ask)})
            }
            Request::FirstAvailable { name, subs } => {
                let subs: Vec<Value> = subs
                    .iter()
                    .map(|(sub, ask)| {
                        let mut v = ask_json(world, ask);
                        v["name"] = json!(sub);
                        v
                    })
                    .collect();
                json!({"name": name, "firstAvailable": subs})
            }
        })
        .collect();
    let mut devices = json!({"requests": requests});
    match claim.numa {
        NumaRule::Any => {}
        NumaRule::Same => {
            devices["constraints"] = json!([{"matchAttribute": format!("{DRIVER}/numa")}]);
        }
        NumaRule::Distinct => {
            devices["constraints"] = json!([{"distinctAttribute": format!("{DRIVER}/numa")}]);
        }
    }
    if claim.config {
        devices["config"] =
            json!([{"opaque": {"driver": DRIVER, "parameters": CLAIM_CONFIG.clone()}}]);
    }
    json!({"devices": devices})
}

/// Creates the world's classes, then both copies of its nodes, slices, templates and pods.
async fn create(api: &ControlPlane, world: &World) {
    for class in &world.classes {
        let mut preds = vec![format!("device.driver == \"{DRIVER}\"")];
        preds.extend(class.preds.iter().map(Pred::cel));
        let mut spec = json!({"selectors": [{"cel": {"expression": preds.join(" && ")}}]});
        if let Some(config) = &class.config {
            spec["config"] = json!([{"opaque": {"driver": DRIVER, "parameters": config}}]);
        }
        api.create(
            &DEVICE_CLASSES,
            json!({"metadata": {"name": class.name}, "spec": spec}),
        )
        .await
        .expect("class");
    }
    for side in [Side::KubeScheduler, Side::Gangway] {
        let ns = world.namespace(side);
        // Admin access is allowed only in namespaces labelled for it (API admission).
        api.call(
            http::Method::POST,
            "/api/v1/namespaces",
            "application/json",
            Some(
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns,
                "labels": {"resource.kubernetes.io/admin-access": "true"}}}),
            ),
        )
        .await
        .expect("namespace");
        for (i, gpus) in world.nodes.iter().enumerate() {
            let name = world.node_name(side, i);
            let mut node = support::objects::node(&name);
            node["metadata"]["labels"]["diff"] = json!(world.label(side));
            api.create(&NODES, node).await.expect("node");
            let devices: Vec<Value> = gpus.iter().map(|g| device_json(g, world.lists)).collect();
            // Counters and devices live in separate slices of the pool (resource.k8s.io/v1).
            let counted = gpus.iter().any(|g| g.consumes > 0);
            let slices = if counted { 2 } else { 1 };
            let pool = json!({"name": name, "generation": 1, "resourceSliceCount": slices});
            if counted {
                api.create(
                    &RESOURCE_SLICES,
                    json!({
                        "metadata": {"name": format!("{name}-counters")},
                        "spec": {"driver": DRIVER, "nodeName": name, "pool": pool,
                                 "sharedCounters": [{"name": "pgpu",
                                     "counters": {"mem": {"value": COUNTER_TOTAL.to_string()}}}]}
                    }),
                )
                .await
                .expect("counter slice");
            }
            api.create(
                &RESOURCE_SLICES,
                json!({
                    "metadata": {"name": format!("{name}-gpus")},
                    "spec": {"driver": DRIVER, "nodeName": name, "devices": devices, "pool": pool}
                }),
            )
            .await
            .expect("slice");
        }
        if let (Some((gpus, _)), Some(term)) = (&world.network, world.network_term(side)) {
            let name = world.network_pool(side);
            let devices: Vec<Value> = (gpus.iter().enumerate())
                .map(|(d, g)| world.network_device_json(side, d, g))
                .collect();
            let mut spec = json!({"driver": DRIVER, "devices": devices,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}});
            if world.per_device.is_some() {
                spec["perDeviceNodeSelection"] = json!(true);
            } else {
                spec["nodeSelector"] = json!({"nodeSelectorTerms": [term]});
            }
            api.create(
                &RESOURCE_SLICES,
                json!({"metadata": {"name": name}, "spec": spec}),
            )
            .await
            .expect("network slice");
        }
    }
    // Devices are published long before pods arrive in a real cluster; here both
    // schedulers get the time to see them, so the two runs compare allocations, not
    // which scheduler's informers saw the slices first.
    tokio::time::sleep(Duration::from_millis(INVENTORY_SETTLE_MS)).await;
    for side in [Side::KubeScheduler, Side::Gangway] {
        let ns = world.namespace(side);
        for (p, claim) in world.pods.iter().enumerate() {
            if claim.sharers > 1 {
                api.create(
                    &RESOURCE_CLAIMS,
                    json!({
                        "metadata": {"name": format!("shared-{p}"), "namespace": ns},
                        "spec": claim_spec(world, claim)
                    }),
                )
                .await
                .expect("claim");
            } else {
                api.create(
                    &RESOURCE_CLAIM_TEMPLATES,
                    json!({
                        "metadata": {"name": format!("claim-{p}"), "namespace": ns},
                        "spec": {"spec": claim_spec(world, claim)}
                    }),
                )
                .await
                .expect("template");
            }
        }
        for (p, claim) in world.pods.iter().enumerate() {
            let (source, annotations) = if claim.sharers > 1 {
                (
                    json!({"name": "gpu", "resourceClaimName": format!("shared-{p}")}),
                    json!({"gang.scheduling.koordinator.sh/name": format!("shared-{p}"),
                           "gang.scheduling.koordinator.sh/min-available": claim.sharers.to_string()}),
                )
            } else {
                (
                    json!({"name": "gpu", "resourceClaimTemplateName": format!("claim-{p}")}),
                    json!({}),
                )
            };
            for name in claim.pod_names(p) {
                api.create(&PODS, json!({
                    "metadata": {"name": name, "namespace": ns, "annotations": annotations},
                    "spec": {
                        "schedulerName": side.scheduler_name(),
                        "nodeSelector": {"diff": world.label(side)},
                        "containers": [{"name": "main", "image": "trainer", "resources": {"requests": {"cpu": "100m"}}}],
                        "resourceClaims": [source]
                    }
                }))
                .await
                .expect("pod");
            }
        }
    }
}

/// Whether an allocation's node selector admits the node `name` labelled `diff: copy`
/// (the labels the selectors here name: its hostname and its copy): no selector admits
/// every node; otherwise some term whose every requirement holds.
fn selector_admits(selector: &Value, name: &str, copy: &str) -> bool {
    let Some(terms) = selector["nodeSelectorTerms"].as_array() else {
        return selector.is_null();
    };
    let holds = |r: &Value, value: Option<&str>| {
        let listed = (r["values"].as_array().into_iter().flatten())
            .any(|v| value.is_some_and(|value| v == value));
        match r["operator"].as_str() {
            Some("In") => listed,
            Some("NotIn") => !listed,
            _ => false,
        }
    };
    let label = |key: &Value| match key.as_str() {
        Some("kubernetes.io/hostname") => Some(name),
        Some("diff") => Some(copy),
        _ => None,
    };
    terms.iter().any(|t| {
        let fields: Vec<&Value> = t["matchFields"].as_array().into_iter().flatten().collect();
        let labels: Vec<&Value> =
            (t["matchExpressions"].as_array().into_iter().flatten()).collect();
        !(fields.is_empty() && labels.is_empty())
            && fields
                .iter()
                .all(|r| r["key"] == "metadata.name" && holds(r, Some(name)))
            && labels.iter().all(|r| holds(r, label(&r["key"])))
    })
}

/// A GPU as a ResourceSlice publishes it (its `numa` a list in a list world).
fn device_json(g: &Gpu, lists: bool) -> Value {
    let numa = if lists {
        json!({"ints": g.numas()})
    } else {
        json!({"int": g.numa})
    };
    let mut d = json!({"name": g.name, "attributes": {
        "model": {"string": g.model}, "memGiB": {"int": g.mem_gib}, "numa": numa}});
    if g.tainted {
        d["taints"] = json!([{"key": TAINT, "value": "true", "effect": "NoSchedule"}]);
    }
    if g.consumes > 0 {
        d["consumesCounters"] = json!([{"counterSet": "pgpu",
            "counters": {"mem": {"value": g.consumes.to_string()}}}]);
    }
    if g.shared_mem > 0 {
        d["allowMultipleAllocations"] = json!(true);
        d["capacity"] = json!({"mem": {"value": g.shared_mem.to_string(),
            "requestPolicy": {"default": SHARE_STEP.to_string(),
                "validRange": {"min": SHARE_STEP.to_string(), "step": SHARE_STEP.to_string()}}}});
    }
    d
}

/// One copy's pods and claims by name, as the API server has them.
struct Placed {
    pods: BTreeMap<String, Value>,
    claims: BTreeMap<String, Value>,
    events: Vec<Value>,
}

async fn read(api: &ControlPlane, ns: &str) -> Placed {
    let by_name = |items: Vec<Value>| -> BTreeMap<String, Value> {
        items
            .into_iter()
            .filter_map(|o| Some((o["metadata"]["name"].as_str()?.to_string(), o)))
            .collect()
    };
    Placed {
        pods: by_name(api.list(&PODS, Some(ns)).await.unwrap_or_default()),
        claims: by_name(
            api.list(&RESOURCE_CLAIMS, Some(ns))
                .await
                .unwrap_or_default(),
        ),
        events: api.list(&EVENTS, Some(ns)).await.unwrap_or_default(),
    }
}

impl Placed {
    /// The latest FailedScheduling message of each of `pods` (why it waits).
    fn why_waiting(&self, pods: &[String]) -> Vec<String> {
        pods.iter()
            .map(|pod| {
                let why = self
                    .events
                    .iter()
                    .filter(|e| e["involvedObject"]["name"] == pod.as_str())
                    .filter(|e| e["reason"] == "FailedScheduling")
                    .filter_map(|e| e["message"].as_str())
                    .last()
                    .unwrap_or("no FailedScheduling event");
                format!("{pod}: {why}")
            })
            .collect()
    }

    fn bound(&self) -> usize {
        self.pods
            .values()
            .filter(|p| p["spec"]["nodeName"].is_string())
            .count()
    }
}

/// What the validator found on one side.
#[derive(Debug, Default)]
struct Verdict {
    bound: usize,
    /// Shares of shared GPUs allocated (one per claim).
    shares: usize,
    /// Network-attached devices allocated (admin access left out).
    network: usize,
    problems: Vec<String>,
}

/// Checks every bound pod's allocation against the world's rules (see the header).
fn validate(world: &World, side: Side, copy: &Placed) -> Verdict {
    let mut verdict = Verdict::default();
    // (pool, device) → the claim holding it (a node's pool is named after the node).
    let mut taken: BTreeMap<(String, String), String> = BTreeMap::new();
    let fabric = world.network_pool(side);
    // (node, shared device) → what each claim holding a share of it consumes.
    let mut shares: BTreeMap<(String, String), BTreeMap<String, i64>> = BTreeMap::new();
    let consumers = world
        .pods
        .iter()
        .enumerate()
        .flat_map(|(p, c)| c.pod_names(p).into_iter().map(move |n| (n, c)));
    for (name, claim_def) in consumers {
        let Some(pod) = copy.pods.get(&name) else {
            verdict.problems.push(format!("{name}: missing"));
            continue;
        };
        let Some(node) = pod["spec"]["nodeName"].as_str() else {
            continue;
        };
        verdict.bound += 1;
        let mut problem = |what: String| verdict.problems.push(format!("{name} on {node}: {what}"));
        let Some(i) = (0..world.nodes.len()).find(|i| world.node_name(side, *i) == node) else {
            problem("bound to a node of another copy".into());
            continue;
        };
        let gpus = &world.nodes[i];
        let network = world.network_for(i);
        let claim_name = claim_of(pod);
        let Some(claim) = copy.claims.get(claim_name) else {
            problem(format!("claim {claim_name:?} not found"));
            continue;
        };
        let allocation = &claim["status"]["allocation"];
        if allocation.is_null() {
            problem("bound with its claim unallocated".into());
            continue;
        }
        if claim_def.breaks() {
            problem("allocated although a selector it must evaluate fails at run time".into());
        }
        let reserved = claim["status"]["reservedFor"]
            .as_array()
            .is_some_and(|r| r.iter().any(|c| c["uid"] == pod["metadata"]["uid"]));
        if !reserved {
            problem("claim not reserved for the pod".into());
        }
        let selector_nodes: Vec<&str> = allocation["nodeSelector"]["nodeSelectorTerms"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| t["matchFields"].as_array().into_iter().flatten())
            .filter(|f| f["key"] == "metadata.name")
            .flat_map(|f| f["values"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        let results: Vec<&Value> = allocation["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        let node_local = results.iter().any(|r| r["pool"] != fabric.as_str());
        if node_local && selector_nodes != [node] {
            problem(format!("node selector names {selector_nodes:?}"));
        }
        if !node_local && world.per_device.is_some() {
            // Network devices that each say where they reach: the selector admits
            // exactly the nodes (of this copy) every allocated device reaches.
            let allocated: Vec<usize> = results
                .iter()
                .filter_map(|r| {
                    let (gpus, _) = world.network.as_ref()?;
                    gpus.iter().position(|g| r["device"] == g.name.as_str())
                })
                .collect();
            let admitted: Vec<usize> = (0..world.nodes.len())
                .filter(|n| {
                    let name = world.node_name(side, *n);
                    selector_admits(&allocation["nodeSelector"], &name, &world.label(side))
                })
                .collect();
            let reached: Vec<usize> = (0..world.nodes.len())
                .filter(|n| allocated.iter().all(|d| world.reaches(*d, *n)))
                .collect();
            if admitted != reached {
                problem(format!(
                    "node selector {} admits nodes {admitted:?}; the devices reach {reached:?}",
                    allocation["nodeSelector"]
                ));
            }
        } else if !node_local {
            // Network devices only: the slice's selector, which must admit the node.
            let want = world
                .network_term(side)
                .map(|term| json!({"nodeSelectorTerms": [term]}));
            if Some(&allocation["nodeSelector"]) != want.as_ref() {
                problem(format!(
                    "node selector {} for network devices, not the slice's {want:?}",
                    allocation["nodeSelector"]
                ));
            }
        }
        let mut numas: Vec<BTreeSet<i64>> = Vec::new();
        // Request name as results write it → the class it was served from.
        let mut served: Vec<(String, usize)> = Vec::new();
        for request in &claim_def.requests {
            let (main, choices): (&str, Vec<(String, &Ask)>) = match request {
                Request::Exactly { name, ask } => (name, vec![(name.to_string(), ask)]),
                Request::FirstAvailable { name, subs } => (
                    name,
                    subs.iter()
                        .map(|(s, a)| (format!("{name}/{s}"), a))
                        .collect(),
                ),
            };
            let mine: Vec<&&Value> = results
                .iter()
                .filter(|r| {
                    let n = r["request"].as_str().unwrap_or_default();
                    n == main || n.split('/').next() == Some(main)
                })
                .collect();
            let chosen: BTreeSet<&str> =
                mine.iter().filter_map(|r| r["request"].as_str()).collect();
            if chosen.len() != 1 {
                problem(format!("request {main}: results name {chosen:?}"));
                continue;
            }
            let chosen_name = chosen.iter().next().copied().unwrap_or_default();
            let Some((_, ask)) = choices.iter().find(|(n, _)| n == chosen_name) else {
                problem(format!("request {main}: {chosen_name} is no choice of it"));
                continue;
            };
            served.push((chosen_name.to_string(), ask.class));
            let wanted = match ask.count {
                Count::Exact(n) => usize::try_from(n).unwrap_or(usize::MAX),
                Count::All => gpus
                    .iter()
                    .chain(&network)
                    .filter(|g| ask.accepts(world, g))
                    .count(),
            };
            if mine.len() != wanted {
                problem(format!(
                    "{chosen_name}: {} devices, {wanted} asked ({:?})",
                    mine.len(),
                    ask.count
                ));
            }
            for r in mine {
                let device = r["device"].as_str().unwrap_or_default();
                let pool = r["pool"].as_str().unwrap_or_default();
                let from = if pool == node {
                    gpus.as_slice()
                } else if pool == fabric {
                    network.as_slice()
                } else {
                    &[]
                };
                if r["driver"] != DRIVER || from.is_empty() {
                    problem(format!(
                        "{chosen_name}: device {r} is not of the node's pool or a network pool reaching it"
                    ));
                    continue;
                }
                let Some(gpu) = from.iter().find(|g| g.name == device) else {
                    problem(format!("{chosen_name}: no device {device} in pool {pool}"));
                    continue;
                };
                if !ask.accepts(world, gpu) {
                    problem(format!(
                        "{chosen_name}: {device} ({gpu:?}) does not serve {ask:?}"
                    ));
                }
                numas.push(gpu.numas());
                if ask.admin != (r["adminAccess"] == true) {
                    problem(format!(
                        "{chosen_name}: adminAccess in the result {}",
                        r["adminAccess"]
                    ));
                }
                if ask.admin {
                    // Watched, not taken: in use by others or not, and it stays free.
                    continue;
                }
                if pool == fabric {
                    verdict.network += 1;
                }
                if gpu.shared_mem > 0 {
                    // Consumable capacity: a share of it, with its own id, consuming
                    // what was asked (or the policy's default).
                    let consumed = quantity(&r["consumedCapacity"]["mem"]);
                    if consumed != Some(gpu.need(ask)) || !r["shareID"].is_string() {
                        problem(format!(
                            "{chosen_name}: share of {device} is {r}, {} GiB asked",
                            gpu.need(ask)
                        ));
                    }
                    shares
                        .entry((node.to_string(), device.to_string()))
                        .or_default()
                        .insert(claim_name.to_string(), consumed.unwrap_or(0));
                    continue;
                }
                if r["shareID"].is_string() || !r["consumedCapacity"].is_null() {
                    problem(format!("{chosen_name}: a share of exclusive {device}: {r}"));
                }
                if let Some(other) = taken.insert(
                    (pool.to_string(), device.to_string()),
                    claim_name.to_string(),
                ) {
                    if other != claim_name {
                        problem(format!("{device} allocated to claim {other} too"));
                    }
                }
            }
        }
        let mains: Vec<&str> = claim_def
            .requests
            .iter()
            .map(|r| match r {
                Request::Exactly { name, .. } | Request::FirstAvailable { name, .. } => *name,
            })
            .collect();
        for r in &results {
            let n = r["request"].as_str().unwrap_or_default();
            if !mains.contains(&n.split('/').next().unwrap_or_default()) {
                problem(format!(
                    "a result for request {n:?}, which the claim does not have"
                ));
            }
        }
        if !claim_def.numa.holds(&numas) {
            problem(format!("{:?} numa broken: {numas:?}", claim_def.numa));
        }
        let from_claim = allocation["devices"]["config"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["source"] == "FromClaim" && e["opaque"]["parameters"] == *CLAIM_CONFIG);
        if from_claim != claim_def.config {
            problem(format!(
                "claim config in the allocation: {from_claim}, in the claim: {}",
                claim_def.config
            ));
        }
        for (c, class) in world.classes.iter().enumerate() {
            let Some(config) = &class.config else {
                continue;
            };
            let names: Vec<&str> = served
                .iter()
                .filter(|(_, k)| *k == c)
                .map(|(n, _)| n.as_str())
                .collect();
            if names.is_empty() {
                continue;
            }
            let found = allocation["devices"]["config"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| {
                    e["source"] == "FromClass"
                        && e["opaque"]["driver"] == DRIVER
                        && e["opaque"]["parameters"] == *config
                        && names.iter().all(|n| {
                            e["requests"]
                                .as_array()
                                .is_some_and(|rs| rs.iter().any(|r| r == n))
                        })
                });
            if !found {
                problem(format!(
                    "no FromClass config of {} for {names:?}: {}",
                    class.name, allocation["devices"]["config"]
                ));
            }
        }
    }
    // Consumable capacity: the shares of a device fit its capacity.
    verdict.shares = shares.values().map(BTreeMap::len).sum();
    for ((node, device), claims) in &shares {
        let total: i64 = claims.values().sum();
        let capacity = (0..world.nodes.len())
            .find(|n| world.node_name(side, *n) == *node)
            .and_then(|n| world.nodes[n].iter().find(|g| g.name == *device))
            .map_or(0, |g| g.shared_mem);
        if total > capacity {
            verdict.problems.push(format!(
                "{node}: shares of {device} consume {total} GiB of {capacity}: {claims:?}"
            ));
        }
    }
    // Shared counters: what the allocated partitions of a node consume fits its total.
    for (n, gpus) in world.nodes.iter().enumerate() {
        let node = world.node_name(side, n);
        let spent: i64 = gpus
            .iter()
            .filter(|g| taken.contains_key(&(node.clone(), g.name.clone())))
            .map(|g| g.consumes)
            .sum();
        if spent > COUNTER_TOTAL {
            verdict.problems.push(format!(
                "{node}: partitions consume {spent} of the shared counter's {COUNTER_TOTAL}"
            ));
        }
    }
    verdict
}

/// A quantity the worlds write (whole GiB, no suffix), as a number.
fn quantity(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// The name of the ResourceClaim a pod's one claim names or was made for.
fn claim_of(pod: &Value) -> &str {
    pod["spec"]["resourceClaims"][0]["resourceClaimName"]
        .as_str()
        .or_else(|| pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str())
        .unwrap_or_default()
}

/// Whether `claim` could be allocated on a node with these GPUs, the `free` ones only,
/// with `budget` of the shared counter left (an exhaustive search: nodes here have at
/// most 7 devices).
fn fits(world: &World, claim: &Claim, gpus: &[Gpu], room: &[i64], budget: i64) -> bool {
    if claim.breaks() {
        return false;
    }
    let asks: Vec<Vec<&Ask>> = claim
        .requests
        .iter()
        .map(|r| match r {
            Request::Exactly { ask, .. } => vec![ask],
            Request::FirstAvailable { subs, .. } => subs.iter().map(|(_, a)| a).collect(),
        })
        .collect();
    let mut used = vec![false; gpus.len()];
    let search = Search {
        world,
        claim,
        gpus,
        room,
        asks: &asks,
    };
    search.from(0, &mut used, &[], budget)
}

/// The fixed inputs of one feasibility search.
struct Search<'a> {
    world: &'a World,
    claim: &'a Claim,
    gpus: &'a [Gpu],
    /// What is left of each device: 1 or 0 for an exclusive one, capacity for a shared one.
    room: &'a [i64],
    asks: &'a [Vec<&'a Ask>],
}

impl Search<'_> {
    /// Whether requests `request..` can be served beside the `used` devices, whose NUMA
    /// nodes are `numas` (one set per device), with `budget` of the counter left.
    fn from(
        &self,
        request: usize,
        used: &mut Vec<bool>,
        numas: &[BTreeSet<i64>],
        budget: i64,
    ) -> bool {
        let Some(choices) = self.asks.get(request) else {
            return true;
        };
        let gpus = self.gpus;
        for ask in choices {
            let matching: Vec<usize> = (0..gpus.len())
                .filter(|&i| ask.accepts(self.world, &gpus[i]))
                .collect();
            let candidates: Vec<usize> = matching
                .iter()
                .copied()
                .filter(|&i| (ask.admin || self.room[i] >= gpus[i].need(ask)) && !used[i])
                .collect();
            let count = match ask.count {
                Count::Exact(n) => usize::try_from(n).unwrap_or(usize::MAX),
                // All of them, every one free.
                Count::All if !matching.is_empty() && candidates.len() == matching.len() => {
                    matching.len()
                }
                Count::All => continue,
            };
            // Every subset of `count` candidates (bit masks; at most 7 devices a node).
            for mask in 0u32..(1 << candidates.len()) {
                if mask.count_ones() as usize != count {
                    continue;
                }
                let picked: Vec<usize> = (0..candidates.len())
                    .filter(|b| mask & (1 << b) != 0)
                    .map(|b| candidates[b])
                    .collect();
                let spent: i64 = if ask.admin {
                    0
                } else {
                    picked.iter().map(|&i| gpus[i].consumes).sum()
                };
                if spent > budget {
                    continue;
                }
                let mut all = numas.to_vec();
                all.extend(picked.iter().map(|&i| gpus[i].numas()));
                if !self.claim.numa.holds(&all) {
                    continue;
                }
                for &i in &picked {
                    used[i] = true;
                }
                let ok = self.from(request + 1, used, &all, budget - spent);
                for &i in &picked {
                    used[i] = false;
                }
                if ok {
                    return true;
                }
            }
        }
        false
    }
}

/// The pods a side left unbound although their claim fits in the devices it left free
/// on some node: a scheduler that stopped early, whatever order it placed pods in.
fn placeable_left_over(world: &World, side: Side, copy: &Placed) -> Vec<String> {
    let mut room: Vec<Vec<i64>> = world
        .nodes
        .iter()
        .map(|gpus| gpus.iter().map(Gpu::room).collect())
        .collect();
    let fabric = world.network_pool(side);
    let mut network_room: Vec<i64> = match &world.network {
        Some((gpus, _)) => gpus.iter().map(Gpu::room).collect(),
        None => Vec::new(),
    };
    for claim in copy.claims.values() {
        for r in claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if r["adminAccess"] == true {
                continue;
            }
            let pool = r["pool"].as_str().unwrap_or_default();
            if pool == fabric {
                let gpus = world
                    .network
                    .as_ref()
                    .map_or(&[][..], |(g, _)| g.as_slice());
                if let Some(d) = gpus.iter().position(|g| r["device"] == g.name.as_str()) {
                    network_room[d] = 0;
                }
                continue;
            }
            let Some(n) = (0..world.nodes.len()).find(|n| world.node_name(side, *n) == pool) else {
                continue;
            };
            if let Some(d) = world.nodes[n]
                .iter()
                .position(|g| r["device"] == g.name.as_str())
            {
                let taken = match quantity(&r["consumedCapacity"]["mem"]) {
                    Some(share) if world.nodes[n][d].shared_mem > 0 => share,
                    _ => room[n][d],
                };
                room[n][d] -= taken;
            }
        }
    }
    let unbound = world.pods.iter().enumerate().flat_map(|(p, claim)| {
        claim
            .pod_names(p)
            .into_iter()
            .filter_map(move |name| Some((copy.pods.get(&name)?, name, claim)))
            .filter(|(pod, _, _)| pod["spec"]["nodeName"].is_null())
    });
    unbound
        .filter(|(pod, _, claim)| {
            // A shared claim already allocated: the pod could have joined it.
            let allocated = copy
                .claims
                .get(claim_of(pod))
                .is_some_and(|c| !c["status"]["allocation"].is_null());
            allocated
                || (0..world.nodes.len()).any(|n| {
                    let spent: i64 = world.nodes[n]
                        .iter()
                        .zip(&room[n])
                        .filter(|(g, left)| **left < g.room())
                        .map(|(g, _)| g.consumes)
                        .sum();
                    let counter = COUNTER_TOTAL - spent;
                    let network = world.network_for(n);
                    let network_left: Vec<i64> = (world.network_reached(n).into_iter())
                        .map(|d| network_room[d])
                        .collect();
                    if claim.sharers > 1 {
                        // A claim several pods share takes the node's GPUs or network
                        // GPUs, not both (gangway's rule, docs/ARCHITECTURE.md rule 15).
                        return fits(world, claim, &world.nodes[n], &room[n], counter)
                            || (!network.is_empty()
                                && fits(world, claim, &network, &network_left, COUNTER_TOTAL));
                    }
                    // The node's GPUs, then the network GPUs it reaches.
                    let mut gpus = world.nodes[n].clone();
                    let mut left = room[n].clone();
                    gpus.extend(network.iter().cloned());
                    left.extend(network_left);
                    fits(world, claim, &gpus, &left, counter)
                })
        })
        .map(|(_, name, _)| name)
        .collect()
}

/// Waits until neither side bound a pod for `SETTLE_MS` (or every pod is bound).
async fn settle(api: &ControlPlane, world: &World) -> (Placed, Placed) {
    let start = Instant::now();
    let mut last = (usize::MAX, usize::MAX);
    let mut since = Instant::now();
    loop {
        let kube = read(api, &world.namespace(Side::KubeScheduler)).await;
        let ours = read(api, &world.namespace(Side::Gangway)).await;
        let now = (kube.bound(), ours.bound());
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

/// A control plane running kube-scheduler, and three gangway processes (with these bug
/// switches armed) scheduling through it.
async fn start(failpoints: &[&str]) -> (ControlPlane, Cluster, tempfile::TempDir) {
    // List-typed attributes are alpha in 1.36: both sides need the gate.
    let mut api = ControlPlane::start(Options {
        apiserver_args: vec![LIST_ATTRIBUTES_GATE.to_string()],
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane starts: {e}"));
    api.start_kube_scheduler_with(&[LIST_ATTRIBUTES_GATE])
        .expect("kube-scheduler starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = support::kube::gangway_on(&api, ADMIN_USER, dir.path(), 2, &[], failpoints).await;
    (api, cluster, dir)
}

/// Figures over a run.
#[derive(Debug, Default)]
struct Totals {
    pods: usize,
    kube_shares: usize,
    gangway_shares: usize,
    network_worlds: usize,
    kube_network: usize,
    gangway_network: usize,
    sharing: usize,
    kube: usize,
    gangway: usize,
    kube_better: usize,
    gangway_better: usize,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One world, run on both sides.
struct Run {
    theirs: Verdict,
    mine: Verdict,
    /// Pods gangway left unbound although they fit.
    left: Vec<String>,
    /// Pods kube-scheduler left unbound although they fit.
    theirs_left: Vec<String>,
    /// Why gangway's `left` pods wait, as its events say.
    left_why: Vec<String>,
    /// Where each side put each pod and which devices it got (kube-scheduler's, then
    /// gangway's), printed where kube-scheduler bound more.
    layout: [String; 2],
}

impl Run {
    /// What is wrong with gangway's side, if anything.
    fn failure(&self) -> Option<String> {
        if !self.mine.problems.is_empty() {
            return Some(format!(
                "invalid gangway allocations: {:#?}",
                self.mine.problems
            ));
        }
        if !self.left.is_empty() {
            return Some(format!(
                "gangway left {:?} unbound although their claims fit in what is free (kube-scheduler bound {} and left {:?} so); gangway says {:?}",
                self.left, self.theirs.bound, self.theirs_left, self.left_why
            ));
        }
        None
    }
}

async fn run(api: &ControlPlane, world: &World) -> Run {
    create(api, world).await;
    let (kube, ours) = settle(api, world).await;
    let left = placeable_left_over(world, Side::Gangway, &ours);
    Run {
        theirs: validate(world, Side::KubeScheduler, &kube),
        mine: validate(world, Side::Gangway, &ours),
        left_why: ours.why_waiting(&left),
        left,
        theirs_left: placeable_left_over(world, Side::KubeScheduler, &kube),
        layout: [layout(world, &kube), layout(world, &ours)],
    }
}

/// One line per pod, in creation order: its node (or `-`) and its claim's devices.
fn layout(world: &World, copy: &Placed) -> String {
    let mut out = Vec::new();
    for p in 0..world.pods.len() {
        for name in world.pods[p].pod_names(p) {
            let Some(pod) = copy.pods.get(&name) else {
                continue;
            };
            let node = pod["spec"]["nodeName"].as_str().unwrap_or("-");
            let devices: Vec<String> = copy
                .claims
                .get(claim_of(pod))
                .and_then(|c| c["status"]["allocation"]["devices"]["results"].as_array())
                .into_iter()
                .flatten()
                .map(|r| {
                    format!(
                        "{}/{}",
                        r["pool"].as_str().unwrap_or_default(),
                        r["device"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            // Why an unbound pod waits, as its scheduler said (each reason once).
            let mut why: Vec<&str> = Vec::new();
            if node == "-" {
                let said = copy
                    .events
                    .iter()
                    .filter(|e| e["involvedObject"]["name"] == name.as_str())
                    .filter(|e| e["reason"] == "FailedScheduling")
                    .filter_map(|e| e["message"].as_str());
                for message in said {
                    if !why.contains(&message) {
                        why.push(message);
                    }
                }
            }
            out.push(format!("    {name} -> {node} {devices:?} {why:?}"));
        }
    }
    out.join("\n")
}

/// Runs smaller copies of a failing world (one pod fewer, then one node fewer, keeping
/// every removal after which `fails` still answers a failure), at most
/// `SHRINK_RUNS_MAX` runs; answers the smallest failing world and its failure. Each
/// copy gets a fresh index from `next_index`, so its objects are new.
async fn shrink(
    api: &ControlPlane,
    mut world: World,
    mut failure: String,
    next_index: &mut u64,
    fails: impl Fn(&Run) -> Option<String>,
) -> (World, String) {
    let mut runs = 0;
    for part in [Part::Pods, Part::Nodes] {
        let mut i = 0;
        while i < world.len_of(part) && world.len_of(part) > 1 && runs < SHRINK_RUNS_MAX {
            let smaller = world.without(part, i, *next_index);
            *next_index += 1;
            runs += 1;
            match fails(&run(api, &smaller).await) {
                Some(why) => {
                    world = smaller;
                    failure = why;
                }
                None => i += 1,
            }
        }
    }
    eprintln!("shrunk in {runs} runs");
    (world, failure)
}

/// Most worlds run while shrinking one.
const SHRINK_RUNS_MAX: u32 = 16;

/// What shrinking removes.
#[derive(Debug, Clone, Copy)]
enum Part {
    Pods,
    Nodes,
}

impl World {
    fn len_of(&self, part: Part) -> usize {
        match part {
            Part::Pods => self.pods.len(),
            Part::Nodes => self.nodes.len(),
        }
    }

    /// This world without its `i`th pod or node, under index `index`.
    fn without(&self, part: Part, i: usize, index: u64) -> World {
        let mut w = self.clone();
        match part {
            Part::Pods => {
                w.pods.remove(i);
            }
            Part::Nodes => {
                w.nodes.remove(i);
                if let Some((_, reach)) = &mut w.network {
                    if i < reach.len() {
                        reach.remove(i);
                    }
                }
                for reach in w.per_device.iter_mut().flatten() {
                    if i < reach.len() {
                        reach.remove(i);
                    }
                }
            }
        }
        w.index = index;
        for (c, class) in w.classes.iter_mut().enumerate() {
            class.name = format!("w{index}-{}", ["gpu", "big", "shared"][c.min(2)]);
            if let Some(config) = &mut class.config {
                config["world"] = json!(index);
            }
        }
        w
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangway_allocates_valid_devices_for_every_pod_kube_scheduler_places() {
    let worlds = env_u64("GANGWAY_DRA_WORLDS", WORLDS_DEFAULT);
    let seed = env_u64("GANGWAY_DRA_SEED", SEED_DEFAULT);
    let (api, cluster, _dir) = start(&[]).await;
    let mut totals = Totals::default();
    let mut next_index = worlds;
    for index in 0..worlds {
        let world = World::draw(index, seed.wrapping_add(index));
        let outcome = run(&api, &world).await;
        eprintln!(
            "world {index} (seed {:#x}): {} pods ({} sharing claims, {} network GPUs); kube-scheduler bound {} ({} GPU shares, {} network GPUs), gangway {} ({} GPU shares, {} network GPUs)",
            world.seed,
            world.pod_count(),
            world.sharing_pods(),
            world.network.as_ref().map_or(0, |(g, _)| g.len()),
            outcome.theirs.bound,
            outcome.theirs.shares,
            outcome.theirs.network,
            outcome.mine.bound,
            outcome.mine.shares,
            outcome.mine.network
        );
        assert!(
            outcome.theirs.problems.is_empty(),
            "the validator refuses kube-scheduler's allocations (a validator bug?): {:#?}\n{}",
            outcome.theirs.problems,
            world.describe()
        );
        if let Some(failure) = outcome.failure() {
            eprintln!("gangway's warnings:\n{}", warnings(&cluster));
            let seed = world.seed;
            let (small, why) = shrink(&api, world, failure, &mut next_index, Run::failure).await;
            panic!(
                "{why}\nsmallest failing world: {}\nrerun: GANGWAY_DRA_SEED={seed} GANGWAY_DRA_WORLDS=1",
                small.describe()
            );
        }
        if !outcome.theirs_left.is_empty() {
            eprintln!(
                "  kube-scheduler left {:?} unbound although they fit",
                outcome.theirs_left
            );
        }
        if outcome.theirs.bound > outcome.mine.bound {
            // Both placed pods one by one in their own order until nothing else fit.
            eprintln!(
                "  kube-scheduler bound more here (placement order); seed {:#x}\n  {}\n  kube-scheduler:\n{}\n  gangway:\n{}",
                world.seed,
                world.describe(),
                outcome.layout[0],
                outcome.layout[1]
            );
            totals.kube_better += 1;
        } else if outcome.mine.bound > outcome.theirs.bound {
            totals.gangway_better += 1;
        }
        totals.pods += world.pod_count();
        totals.kube_shares += outcome.theirs.shares;
        totals.gangway_shares += outcome.mine.shares;
        totals.network_worlds += usize::from(world.network.is_some());
        totals.kube_network += outcome.theirs.network;
        totals.gangway_network += outcome.mine.network;
        totals.sharing += world.sharing_pods();
        totals.kube += outcome.theirs.bound;
        totals.gangway += outcome.mine.bound;
    }
    eprintln!(
        "{worlds} worlds from seed {seed:#x} ({} with a network pool): {} pods each side ({} sharing claims); bound by kube-scheduler {} (GPU shares {}, network GPUs {}), by gangway {} (GPU shares {}, network GPUs {}); worlds where kube-scheduler bound more {}, gangway more {}; 0 invalid allocations, 0 double-bookings, 0 placeable pods left",
        totals.network_worlds, totals.pods, totals.sharing, totals.kube, totals.kube_shares, totals.kube_network, totals.gangway, totals.gangway_shares, totals.gangway_network, totals.kube_better, totals.gangway_better
    );
}

/// The last warnings and errors of each gangway process, for a failing world.
fn warnings(cluster: &Cluster) -> String {
    (1..=3)
        .map(|i| {
            let log = cluster.log(i);
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            let tail = lines[lines.len().saturating_sub(10)..].join("\n");
            format!("--- process {i} ---\n{tail}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Three pods that all fit on two nodes of two plain GPUs: one served by the class with
/// a config, two by the other.
fn three_pod_world() -> World {
    let gpu = |d: usize| Gpu {
        name: format!("gpu-{d}"),
        model: "a100",
        mem_gib: 80,
        numa: 0,
        tainted: false,
        consumes: 0,
        shared_mem: 0,
        near: None,
    };
    let mut world = World::draw(0, SEED_DEFAULT);
    world.nodes = vec![vec![gpu(0), gpu(1)], vec![gpu(0), gpu(1)]];
    world.network = None;
    world.per_device = None;
    world.lists = false;
    let claim = |class| Claim {
        requests: vec![Request::Exactly {
            name: "gpu",
            ask: Ask::new(class, Count::Exact(1), Vec::new(), false),
        }],
        numa: NumaRule::Any,
        config: false,
        sharers: 1,
    };
    world.pods = vec![claim(1), claim(0), claim(1)];
    world
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_validator_catches_allocations_without_their_class_config_and_shrinks_the_world() {
    let (api, _cluster, _dir) = start(&[gangway_server::failpoints::BINDER_DROPS_CONFIGS]).await;
    let world = three_pod_world();
    let outcome = run(&api, &world).await;
    assert_eq!(outcome.theirs.problems, Vec::<String>::new());
    let failure = outcome
        .failure()
        .expect("the bug switch drops every config");
    assert!(failure.contains("no FromClass config"), "{failure}");
    let mut next_index = 1;
    let missing_config = |r: &Run| r.failure().filter(|f| f.contains("no FromClass config"));
    let (small, why) = shrink(&api, world, failure, &mut next_index, missing_config).await;
    assert!(why.contains("no FromClass config"), "{why}");
    assert_eq!(
        small.pods.len(),
        1,
        "one pod shows it: {}",
        small.describe()
    );
    assert_eq!(small.nodes.len(), 1, "on one node: {}", small.describe());
    assert!(
        matches!(&small.pods[0].requests[0], Request::Exactly { ask, .. } if ask.class == 0),
        "the pod of the class with a config: {}",
        small.describe()
    );
}

/// One node with a shared GPU and one claim asking it for the default capacity.
fn one_share_world() -> World {
    let mut world = World::draw(1, SEED_DEFAULT);
    world.network = None;
    world.per_device = None;
    world.lists = false;
    world.nodes = vec![vec![Gpu {
        name: "s-0".into(),
        model: "l4",
        mem_gib: 48,
        numa: 0,
        tainted: false,
        consumes: 0,
        shared_mem: 48,
        near: None,
    }]];
    world.pods = vec![Claim {
        requests: vec![Request::Exactly {
            name: "gpu",
            ask: Ask::new(2, Count::Exact(1), Vec::new(), false),
        }],
        numa: NumaRule::Any,
        config: false,
        sharers: 1,
    }];
    world
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_catches_share_ids_the_api_server_refuses() {
    let (api, _cluster, _dir) = start(&[gangway_server::failpoints::SHARE_IDS_NOT_UUIDS]).await;
    let world = one_share_world();
    let outcome = run(&api, &world).await;
    assert_eq!(outcome.theirs.problems, Vec::<String>::new());
    assert_eq!(outcome.theirs.bound, 1, "kube-scheduler binds it");
    let failure = outcome
        .failure()
        .expect("the bug switch keeps the claim from being written");
    assert!(failure.contains("left [\"p-0\"] unbound"), "{failure}");
}
