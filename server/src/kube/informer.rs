//! Informers: one kube-rs watcher per kind, each keeping an in-memory copy of its
//! objects (as JSON) that the ingest loop and the binders read. A watch restart
//! (including after a 410 Gone) re-lists and swaps the copy whole, so readers
//! never see half a list. Every change bumps one revision that wakes the loops.
//! Owned by `kube::run`; each watcher task stops with its shutdown signal.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::sync::watch;

/// The kinds watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Slot {
    /// Every pod (ours pending, anyone's bound).
    Pods,
    /// Nodes.
    Nodes,
    /// PodGroups of scheduling.x-k8s.io.
    PodGroupsX,
    /// PodGroups of scheduling.sigs.k8s.io.
    PodGroupsSigs,
    /// Kubernetes' own PodGroups (scheduling.k8s.io/v1alpha2, served where the cluster
    /// turned that API version on).
    PodGroupsK8s,
    /// Volcano's PodGroups (scheduling.volcano.sh/v1beta1, a CRD).
    PodGroupsVolcano,
    /// DRA ResourceSlices.
    ResourceSlices,
    /// DRA DeviceClasses.
    DeviceClasses,
    /// DRA ResourceClaims.
    ResourceClaims,
    /// PodDisruptionBudgets (policy/v1), which preemption respects when it can.
    PodDisruptionBudgets,
    /// DRA DeviceTaintRules (`resource.k8s.io/v1beta2`, served only where the cluster
    /// turned that API version on).
    DeviceTaintRules,
    /// scheduler-plugins' ElasticQuotas (scheduling.x-k8s.io), kept as queues.
    ElasticQuotas,
    /// Kueue's Topologies (kueue.x-k8s.io/v1beta1, a CRD), read as topology hierarchies.
    KueueTopologies,
}

/// Every slot, in watch start order.
pub const SLOTS: [Slot; 13] = [
    Slot::Nodes,
    Slot::KueueTopologies,
    Slot::ElasticQuotas,
    Slot::PodDisruptionBudgets,
    Slot::DeviceClasses,
    Slot::DeviceTaintRules,
    Slot::ResourceSlices,
    Slot::PodGroupsX,
    Slot::PodGroupsSigs,
    Slot::PodGroupsK8s,
    Slot::PodGroupsVolcano,
    Slot::ResourceClaims,
    Slot::Pods,
];

impl Slot {
    /// The API resource of the slot.
    pub fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Slot::Pods => ("", "v1", "Pod", "pods"),
            Slot::Nodes => ("", "v1", "Node", "nodes"),
            Slot::PodGroupsX => ("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
            Slot::PodGroupsSigs => (
                "scheduling.sigs.k8s.io",
                "v1alpha1",
                "PodGroup",
                "podgroups",
            ),
            Slot::PodGroupsK8s => ("scheduling.k8s.io", "v1alpha2", "PodGroup", "podgroups"),
            Slot::PodGroupsVolcano => ("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups"),
            Slot::ResourceSlices => ("resource.k8s.io", "v1", "ResourceSlice", "resourceslices"),
            Slot::DeviceClasses => ("resource.k8s.io", "v1", "DeviceClass", "deviceclasses"),
            Slot::ResourceClaims => ("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"),
            Slot::PodDisruptionBudgets => (
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
            ),
            Slot::DeviceTaintRules => (
                "resource.k8s.io",
                "v1beta2",
                "DeviceTaintRule",
                "devicetaintrules",
            ),
            Slot::ElasticQuotas => (
                "scheduling.x-k8s.io",
                "v1alpha1",
                "ElasticQuota",
                "elasticquotas",
            ),
            Slot::KueueTopologies => ("kueue.x-k8s.io", "v1beta1", "Topology", "topologies"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    /// Whether the cluster may lack the kind (a CRD, an API version off by default), or
    /// gangway may lack the right to read it (PodDisruptionBudgets, under an older
    /// ClusterRole): its absence must not hold up the rest.
    pub fn optional(self) -> bool {
        matches!(
            self,
            Slot::PodGroupsX
                | Slot::PodGroupsSigs
                | Slot::PodGroupsK8s
                | Slot::PodGroupsVolcano
                | Slot::PodDisruptionBudgets
                | Slot::DeviceTaintRules
                | Slot::ElasticQuotas
                | Slot::KueueTopologies
        )
    }
}

impl Slot {
    /// What it means that the API server does not serve the kind, for a kind a cluster
    /// may leave off without anything being wrong (an API version off by default).
    pub fn when_unserved(self) -> Option<&'static str> {
        match self {
            Slot::DeviceTaintRules => Some("no device taint rules apply"),
            Slot::PodGroupsK8s => Some("no pod names a Kubernetes PodGroup"),
            Slot::PodGroupsVolcano => {
                Some("Volcano is not installed; no pod names a Volcano PodGroup")
            }
            Slot::KueueTopologies => Some(
                "Kueue is not installed; topology hierarchies come from --topology-levels only",
            ),
            _ => None,
        }
    }
}

/// Objects by (namespace, name); cluster-scoped objects have an empty namespace.
/// Shared, so a reader's copy of a whole kind costs a pointer per object.
pub type Objects = BTreeMap<(String, String), Arc<Value>>;

/// The (namespace, name) of an object.
pub type Key = (String, String);

/// Keys changed since a reader last asked ([`Cache::take_changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// The kind was listed again (or never read): every object may have changed.
    All,
    /// These objects were added, changed or deleted.
    Keys(BTreeSet<Key>),
}

#[derive(Default)]
struct SlotState {
    objects: Objects,
    synced: bool,
    /// Changed keys not yet taken; `None`: everything (a re-list, or not taken yet).
    changed: Option<BTreeSet<Key>>,
}

impl SlotState {
    fn mark(&mut self, key: Key) {
        if let Some(changed) = self.changed.as_mut() {
            changed.insert(key);
        }
    }
}

/// The informers' copies of the cluster's objects.
pub struct Cache {
    slots: RwLock<BTreeMap<Slot, SlotState>>,
    revision: watch::Sender<u64>,
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            slots: RwLock::new(BTreeMap::new()),
            revision: watch::channel(0).0,
        }
    }
}

fn key_of(object: &Value) -> Option<Key> {
    let meta = &object["metadata"];
    Some((
        meta["namespace"].as_str().unwrap_or("").to_string(),
        meta["name"].as_str()?.to_string(),
    ))
}

impl Cache {
    /// Runs `f` over the objects of `slot`.
    pub fn read<T>(&self, slot: Slot, f: impl FnOnce(&Objects) -> T) -> T {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        match slots.get(&slot) {
            Some(state) => f(&state.objects),
            None => f(&Objects::new()),
        }
    }

    /// One object.
    pub fn get(&self, slot: Slot, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.read(slot, |o| {
            o.get(&(namespace.to_string(), name.to_string())).cloned()
        })
    }

    /// The pod of `uid` in `namespace`: the one named `name` (a member's own name) when
    /// it has that uid, else any pod of the namespace with it (a pod a member selected
    /// by labels is named otherwise).
    pub fn pod_with_uid(&self, namespace: &str, name: &str, uid: &str) -> Option<Arc<Value>> {
        self.read(Slot::Pods, |o| {
            let has = |p: &&Arc<Value>| p["metadata"]["uid"].as_str() == Some(uid);
            if let Some(p) = o
                .get(&(namespace.to_string(), name.to_string()))
                .filter(has)
            {
                return Some(p.clone());
            }
            o.range((namespace.to_string(), String::new())..)
                .take_while(|((ns, _), _)| ns == namespace)
                .map(|(_, p)| p)
                .find(has)
                .cloned()
        })
    }

    /// The keys of `slot` changed since the last call (one reader: the ingest loop).
    pub fn take_changes(&self, slot: Slot) -> Changes {
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let state = slots.entry(slot).or_default();
        match state.changed.replace(BTreeSet::new()) {
            Some(keys) => Changes::Keys(keys),
            None => Changes::All,
        }
    }

    /// Whether `slot` has been listed once (an optional kind the cluster does not serve
    /// never is).
    pub fn listed(&self, slot: Slot) -> bool {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.get(&slot).is_some_and(|st| st.synced)
    }

    /// Whether every required kind has been listed once.
    pub fn synced(&self) -> bool {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        SLOTS
            .iter()
            .filter(|s| !s.optional())
            .all(|s| slots.get(s).is_some_and(|st| st.synced))
    }

    /// A receiver that changes whenever any object does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    fn edit(&self, slot: Slot, f: impl FnOnce(&mut SlotState)) {
        {
            let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
            f(slots.entry(slot).or_default());
        }
        self.revision.send_modify(|r| *r += 1);
    }

    /// Applies one watcher event; `buffer` collects a re-list until it is complete.
    fn apply(&self, slot: Slot, event: Event<DynamicObject>, buffer: &mut Option<Objects>) {
        let json = |o: &DynamicObject| serde_json::to_value(o).ok();
        match event {
            Event::Init => *buffer = Some(Objects::new()),
            Event::InitApply(o) => {
                if let (Some(buf), Some(v)) = (buffer.as_mut(), json(&o)) {
                    if let Some(k) = key_of(&v) {
                        buf.insert(k, Arc::new(v));
                    }
                }
            }
            Event::InitDone => {
                let listed = buffer.take().unwrap_or_default();
                tracing::info!(kind = ?slot, objects = listed.len(), "listed");
                self.edit(slot, |s| {
                    s.objects = listed;
                    s.synced = true;
                    s.changed = None;
                });
            }
            Event::Apply(o) => {
                if let Some(v) = json(&o) {
                    if let Some(k) = key_of(&v) {
                        self.edit(slot, |s| {
                            s.mark(k.clone());
                            s.objects.insert(k, Arc::new(v));
                        });
                    }
                }
            }
            Event::Delete(o) => {
                if let Some(k) = json(&o).as_ref().and_then(key_of) {
                    self.edit(slot, |s| {
                        s.mark(k.clone());
                        s.objects.remove(&k);
                    });
                }
            }
        }
    }
}

/// First wait after a failed watch or list, in ms.
pub const WATCH_RETRY_FIRST_MS: u64 = 500;
/// Longest wait between retries, in ms (a missing CRD is asked for this often).
pub const WATCH_RETRY_MAX_MS: u64 = 30_000;

/// The wait after the `failures`-th failure in a row: doubling from
/// `WATCH_RETRY_FIRST_MS` up to `WATCH_RETRY_MAX_MS`.
pub fn retry_delay_ms(failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(16);
    WATCH_RETRY_FIRST_MS
        .saturating_mul(1 << doublings)
        .min(WATCH_RETRY_MAX_MS)
}

/// Watches one kind into `cache` until `stop` fires. A failure backs off
/// ([`retry_delay_ms`]) and is logged once per outage: the watcher announces every
/// re-list (`Event::Init`) before it fails again, so only a real answer (objects or
/// the end of a list) ends an outage.
pub async fn run(
    client: kube::Client,
    slot: Slot,
    cache: Arc<Cache>,
    mut stop: watch::Receiver<bool>,
) {
    let resource = slot.resource();
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    // Lists are answered from the API server's watch cache (resourceVersion 0), as
    // client-go's reflectors do: a quorum read of 10,000 pods from etcd, page by page,
    // takes seconds on every replica at start and on every re-list.
    let config = watcher::Config::default().any_semantic();
    let stream = watcher::watcher(api, config);
    futures::pin_mut!(stream);
    let mut buffer: Option<Objects> = None;
    let mut failures: u32 = 0;
    loop {
        let next = tokio::select! {
            _ = stop.changed() => return,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(event)) => {
                if !matches!(event, Event::Init) {
                    if failures > 0 {
                        tracing::info!(kind = %resource.plural, group = %resource.group, failures, "watch recovered");
                    }
                    failures = 0;
                }
                cache.apply(slot, event, &mut buffer);
            }
            Some(Err(e)) => {
                failures = failures.saturating_add(1);
                let delay_ms = retry_delay_ms(failures);
                let unserved = slot.when_unserved().filter(|_| not_served(&e));
                if let (1, Some(meaning)) = (failures, unserved) {
                    // Off by default in Kubernetes 1.36: nothing wrong.
                    tracing::info!(kind = %resource.plural, group = %resource.group, version = %resource.version, "not served by this API server; {meaning} (asked for again with backoff)");
                } else if failures == 1 {
                    tracing::warn!(kind = %resource.plural, group = %resource.group, error = %e, "watch failed; retrying with backoff (logged once until it recovers)");
                } else {
                    tracing::debug!(kind = %resource.plural, group = %resource.group, error = %e, failures, delay_ms, "watch failed again");
                }
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(delay_ms)) => {}
                }
            }
            None => return,
        }
    }
}

/// Whether the API server answered that it does not serve the kind (404).
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 404,
        _ => false,
    }
}

#[cfg(test)]
#[path = "informer_tests.rs"]
mod tests;
