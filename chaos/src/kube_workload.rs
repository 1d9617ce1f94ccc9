//! The binder drill's world: an API server double (in this process; a real
//! kube-apiserver cannot run here, and the double answers as one does:
//! resourceVersions, watches, the binding subresource, 409 for a pod already
//! bound) with a fleet of nodes, and workers that create Koordinator gangs as
//! pods, wait until every pod is bound, hold them, then delete them as a
//! finished job would. Each gang is one operation in the history:
//! invoke → ok (all pods bound) / unknown; its deletion is a `release`.

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
/// Workers creating gangs.
pub const KUBE_WORKERS: usize = 3;
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

fn pod(gang: &str, name: &str, size: u32) -> Value {
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
            "containers": [{"name": "main", "image": "worker",
                            "resources": {"requests": {"cpu": POD_CPUS.to_string()}}}]
        }
    })
}

/// The node a pod is bound to, if any.
pub fn node_of(api: &ApiServerDouble, name: &str) -> Option<String> {
    api.get(&PODS, Some(KUBE_NAMESPACE), name)
        .ok()?
        .pointer("/spec/nodeName")
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
        for _ in 0..KUBE_WORKERS {
            let w = self.clone();
            let rng = rng.fork();
            set.spawn(w.worker(rng, stop.clone()));
        }
        set
    }

    async fn worker(self: Arc<Self>, mut rng: Rng, stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let size = rng.range(2, 4) as u32;
            let hold = rng.range(100, 600);
            self.cycle(size, hold).await;
        }
    }

    /// Creates a gang of `size` pods, waits until all are bound, holds, deletes them.
    async fn cycle(&self, size: u32, hold_ms: u64) {
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
                priority: 0,
            }],
            members: vec![],
        });
        for name in &names {
            if let Err(e) = self.api.create(&PODS, pod(&gang, name, size)) {
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
            let nodes: Vec<Option<String>> = names.iter().map(|n| node_of(&self.api, n)).collect();
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

    /// Deletes a gang's pods (the job finished), recorded as a release.
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
        for name in names {
            if let Err(e) = self.api.delete(&PODS, Some(KUBE_NAMESPACE), name) {
                errors.push(format!("{name}: {e:?}"));
            }
        }
        let event = if errors.is_empty() {
            Event::Ok {
                op,
                group: 0,
                state: "Deleted".into(),
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
}

/// Reads the view from the double.
pub fn api_view(api: &ApiServerDouble) -> ApiView {
    let mut view = ApiView::default();
    for b in api.bindings() {
        view.bindings
            .entry(format!("{}/{}", b.namespace, b.pod))
            .or_default()
            .push(b.node);
    }
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
