//! The binder drill's world: an API server double (in this process; a real
//! kube-apiserver cannot run here, and the double answers as one does:
//! resourceVersions, watches, the binding subresource, 409 for a pod already
//! bound) with a fleet of nodes, and workers that create Koordinator gangs as
//! pods, wait until every pod is bound, hold them, then delete them as a
//! finished job would. Fillers hold big low-priority gangs longer, so urgent
//! gangs (priority [`URGENT_PRIORITY`]) find the fleet full and preempt them:
//! gangway evicts the victims' pods (the double deletes at once; no kubelet) and
//! binds the urgent pods once they are gone. Each gang is one operation in the
//! history: invoke → ok (all pods bound) / fail (preempted before it was bound) /
//! unknown; its deletion is a `delete_pods`, `Preempted` when gangway deleted them
//! first. The view ([`ApiView`]) replays every binding and deletion in revision
//! order, so the checker sees whether a node ever ran more than it has.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gangway_kube_double::store::{NODES, PODS};
use gangway_kube_double::{ApiServerDouble, Options};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::history::{Event, GangShape, History, Placed};
use crate::rng::Rng;
use crate::workload::{PLACE_WAIT_MS, POLL_MS};

/// Nodes the double lists.
pub const KUBE_NODES: usize = 6;
/// CPUs per node.
pub const KUBE_NODE_CPUS: u32 = 16;
/// CPUs each pod requests.
pub const POD_CPUS: u32 = 3;
/// Workers creating small gangs.
pub const KUBE_WORKERS: usize = 3;
/// Workers creating big low-priority gangs held longer (the usual victims).
pub const KUBE_FILLERS: usize = 2;
/// Workers creating urgent gangs.
pub const KUBE_URGENT_WORKERS: usize = 1;
/// Priority of urgent gangs (the others have 0).
pub const URGENT_PRIORITY: i32 = 100;
/// The namespace of every pod.
pub const KUBE_NAMESPACE: &str = "chaos";

/// Starts the double with the fleet and writes its kubeconfig to `kubeconfig`.
pub async fn start_api(kubeconfig: &Path) -> std::io::Result<ApiServerDouble> {
    let api = ApiServerDouble::start(Options::default()).await?;
    api.write_kubeconfig(kubeconfig)?;
    for i in 0..KUBE_NODES {
        let name = format!("node-{i:03}");
        let node = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {
                "allocatable": {"cpu": KUBE_NODE_CPUS.to_string(), "memory": "64Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        api.create(&NODES, node)
            .map_err(|e| std::io::Error::other(format!("node {name}: {e:?}")))?;
    }
    Ok(api)
}

/// What a worker submits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 2–3 pods, held 100–600 ms.
    Small,
    /// 6–8 pods, held 600–1,500 ms.
    Filler,
    /// 3–5 pods of priority [`URGENT_PRIORITY`], held 100–400 ms.
    Urgent,
}

impl Kind {
    /// (size, hold in ms, priority), drawn from `rng`.
    fn draw(self, rng: &mut Rng) -> (u32, u64, i32) {
        match self {
            Kind::Small => (rng.range(2, 4) as u32, rng.range(100, 600), 0),
            Kind::Filler => (rng.range(6, 9) as u32, rng.range(600, 1_500), 0),
            Kind::Urgent => (rng.range(3, 6) as u32, rng.range(100, 400), URGENT_PRIORITY),
        }
    }
}

/// The API server's own pod priority (no PriorityClass admission in the double).
fn pod(gang: &str, name: &str, size: u32, priority: i32) -> Value {
    json!({
        "metadata": {
            "name": name,
            "namespace": KUBE_NAMESPACE,
            "annotations": {
                "gang.scheduling.koordinator.sh/name": gang,
                "gang.scheduling.koordinator.sh/min-available": size.to_string()
            }
        },
        "spec": {
            "schedulerName": "gangway",
            "priority": priority,
            "containers": [{"name": "main", "image": "worker",
                            "resources": {"requests": {"cpu": POD_CPUS.to_string()}}}]
        }
    })
}

/// The node `pod` is bound to, if any.
fn node_name(pod: &Value) -> Option<String> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The binder drill's workload.
pub struct KubeWorkload {
    api: Arc<ApiServerDouble>,
    history: History,
    next_op: AtomicU64,
}

impl KubeWorkload {
    /// A workload creating pods in `api`, recording into `history`.
    pub fn new(api: Arc<ApiServerDouble>, history: History) -> Arc<Self> {
        Arc::new(Self {
            api,
            history,
            next_op: AtomicU64::new(1),
        })
    }

    /// Starts the workers; they stop when `stop` turns true.
    pub fn spawn(self: &Arc<Self>, rng: &mut Rng, stop: watch::Receiver<bool>) -> JoinSet<()> {
        let mut set = JoinSet::new();
        let kinds = std::iter::repeat_n(Kind::Small, KUBE_WORKERS)
            .chain(std::iter::repeat_n(Kind::Filler, KUBE_FILLERS))
            .chain(std::iter::repeat_n(Kind::Urgent, KUBE_URGENT_WORKERS));
        for kind in kinds {
            let w = self.clone();
            let rng = rng.fork();
            set.spawn(w.worker(kind, rng, stop.clone()));
        }
        set
    }

    async fn worker(self: Arc<Self>, kind: Kind, mut rng: Rng, stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let (size, hold, priority) = kind.draw(&mut rng);
            self.cycle(size, hold, priority).await;
        }
    }

    /// Creates a gang of `size` pods, waits until all are bound, holds, deletes them.
    async fn cycle(&self, size: u32, hold_ms: u64, priority: i32) {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        let gang = format!("g{op}");
        let names: Vec<String> = (0..size).map(|i| format!("{gang}-{i}")).collect();
        self.history.record(Event::Invoke {
            op,
            f: "place".into(),
            key: format!("{KUBE_NAMESPACE}/{gang}"),
            gangs: vec![GangShape {
                name: format!("{KUBE_NAMESPACE}/{gang}"),
                min_member: size,
                members: size,
                mode: "Strict".into(),
                cpu: POD_CPUS,
                gpu: 0,
                priority,
                required: None,
            }],
            members: vec![],
        });
        for name in &names {
            if let Err(e) = self.api.create(&PODS, pod(&gang, name, size, priority)) {
                self.history.record(Event::Fail {
                    op,
                    error: format!("pod {name} not created: {e:?}"),
                });
                self.delete(&gang, &names).await;
                return;
            }
        }
        let deadline = Instant::now() + Duration::from_millis(PLACE_WAIT_MS);
        let placed = loop {
            let pods: Vec<Option<Value>> = names
                .iter()
                .map(|n| self.api.get(&PODS, Some(KUBE_NAMESPACE), n).ok())
                .collect();
            if pods.iter().any(Option::is_none) {
                // Committed, then preempted before every pod was bound.
                self.history.record(Event::Fail {
                    op,
                    error: format!("gang {gang} lost pods to a preemption before it was bound"),
                });
                self.delete(&gang, &names).await;
                return;
            }
            let nodes: Vec<Option<String>> = pods
                .iter()
                .map(|p| p.as_ref().and_then(node_name))
                .collect();
            if nodes.iter().all(Option::is_some) {
                break Some(
                    names
                        .iter()
                        .zip(nodes.into_iter().flatten())
                        .map(|(n, node)| Placed {
                            member: format!("{KUBE_NAMESPACE}/{gang}/{n}"),
                            node,
                            devices: vec![],
                        })
                        .collect::<Vec<_>>(),
                );
            }
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        };
        match placed {
            Some(placed) => {
                // Group 0: the client does not know the id gangway gave the gang.
                self.history.record(Event::Ok {
                    op,
                    group: 0,
                    state: "Placed".into(),
                    placed,
                });
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            }
            None => {
                self.history.record(Event::Unknown {
                    op,
                    error: format!("gang {gang} not bound within {PLACE_WAIT_MS} ms"),
                });
            }
        }
        self.delete(&gang, &names).await;
    }

    /// Deletes a gang's pods (the job finished), recorded as a release; pods gangway
    /// deleted first (a preemption's victims) are no error.
    async fn delete(&self, gang: &str, names: &[String]) {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.history.record(Event::Invoke {
            op,
            f: "delete_pods".into(),
            key: format!("{KUBE_NAMESPACE}/{gang}"),
            gangs: vec![],
            members: names.to_vec(),
        });
        let mut errors = Vec::new();
        let mut gone = 0;
        for name in names {
            match self.api.delete(&PODS, Some(KUBE_NAMESPACE), name) {
                Ok(_) => {}
                Err(e) if e.code == 404 => gone += 1,
                Err(e) => errors.push(format!("{name}: {e:?}")),
            }
        }
        let event = if errors.is_empty() {
            Event::Ok {
                op,
                group: 0,
                state: if gone == 0 { "Deleted" } else { "Preempted" }.into(),
                placed: vec![],
            }
        } else {
            Event::Fail {
                op,
                error: errors.join("; "),
            }
        };
        self.history.record(event);
    }
}

/// What the API server says about every binding and pod, for the checker.
#[derive(Debug, Clone, Default)]
pub struct ApiView {
    /// Successful bindings per pod (namespace/name).
    pub bindings: BTreeMap<String, Vec<String>>,
    /// Live pods: name -> (gang, node if bound).
    pub pods: BTreeMap<String, (String, Option<String>)>,
    /// Every binding and deletion of a bound pod, in revision order.
    pub timeline: Vec<NodeChange>,
}

/// A pod arriving on or leaving a node, at an API revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeChange {
    /// The revision.
    pub revision: u64,
    /// The pod.
    pub pod: String,
    /// The node.
    pub node: String,
    /// Whether it arrived (bound) or left (deleted).
    pub arrived: bool,
}

impl ApiView {
    /// Gangs with some but not all of their live pods bound: (gang, bound, pods).
    pub fn partly_bound(&self) -> Vec<(&str, usize, usize)> {
        let mut gangs: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (gang, node) in self.pods.values() {
            let e = gangs.entry(gang.as_str()).or_default();
            e.0 += 1;
            e.1 += usize::from(node.is_some());
        }
        gangs
            .into_iter()
            .filter(|(_, (pods, bound))| *bound > 0 && bound < pods)
            .map(|(gang, (pods, bound))| (gang, bound, pods))
            .collect()
    }

    /// Nodes that, at some revision, held more pods than their CPUs allow:
    /// (node, revision, CPUs requested). Every pod requests [`POD_CPUS`].
    pub fn over_capacity(&self) -> Vec<(String, u64, u32)> {
        let mut used: BTreeMap<&str, u32> = BTreeMap::new();
        let mut over = Vec::new();
        for c in &self.timeline {
            let cpu = used.entry(c.node.as_str()).or_default();
            if c.arrived {
                *cpu += POD_CPUS;
                if *cpu > KUBE_NODE_CPUS {
                    over.push((c.node.clone(), c.revision, *cpu));
                }
            } else {
                *cpu = cpu.saturating_sub(POD_CPUS);
            }
        }
        over
    }
}

/// Reads the view from the double.
pub fn api_view(api: &ApiServerDouble) -> ApiView {
    let mut view = ApiView::default();
    for b in api.bindings() {
        view.timeline.push(NodeChange {
            revision: b.revision,
            pod: b.pod.clone(),
            node: b.node.clone(),
            arrived: true,
        });
        view.bindings
            .entry(format!("{}/{}", b.namespace, b.pod))
            .or_default()
            .push(b.node);
    }
    for gone in api.deleted() {
        let (Some(node), Some(name), Some(revision)) = (
            gone["spec"]["nodeName"].as_str(),
            gone["metadata"]["name"].as_str(),
            gone["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if !gone["spec"]["containers"].is_array() {
            continue;
        }
        view.timeline.push(NodeChange {
            revision,
            pod: name.to_string(),
            node: node.to_string(),
            arrived: false,
        });
    }
    view.timeline.sort_by_key(|c| c.revision);
    for p in api.list(&PODS, Some(KUBE_NAMESPACE)) {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let gang = p["metadata"]["annotations"]["gang.scheduling.koordinator.sh/name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let node = p["spec"]["nodeName"].as_str().map(str::to_string);
        view.pods.insert(name, (gang, node));
    }
    view
}

#[cfg(test)]
#[path = "kube_workload_tests.rs"]
mod tests;
