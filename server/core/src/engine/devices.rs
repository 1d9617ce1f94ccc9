//! Device allocation: which devices of a node satisfy a pod's claims.
//!
//! Owns [`DeviceDemand`] (a pod template's claims and device-backed extended resources,
//! resolved once per placement call against the ledger's device classes, selectors
//! compiled through the CEL cache) and the structured allocator that runs inside the
//! engine's node pass, with the semantics of Kubernetes' structured allocator: requests
//! are satisfied claim by claim, request by request, device by device, over the node's
//! pools in (driver, pool) order and their devices in name order; a device qualifies
//! when it is healthy, every NoSchedule/NoExecute taint is tolerated, the class's and
//! the request's CEL selectors match (a selector runtime error aborts the node, as it
//! aborts Kubernetes' allocation), and its capacity can serve the request's capacity
//! requirements; it is taken when it is free (or, if it allows multiple allocations,
//! has capacity left), its shared counters have room, and the claim's matchAttribute /
//! distinctAttribute constraints hold. `ExactCount` takes that many devices, `All`
//! every qualifying device (at least one, all of them free); `firstAvailable` tries its
//! sub-requests in order; on a dead end the search backtracks, bounded by
//! [`SEARCH_STEPS_MAX`] steps per allocation. Admin-access requests take nothing. The
//! firstAvailable preference of the result is the node's device score
//! (Σ 8 − chosen index, as upstream). Extended resources such as `nvidia.com/gpu: 2`
//! are served from devices of the class that names them on nodes whose allocatable does
//! not list them (upstream's DRA extended resources), through an implicit claim named
//! [`EXTENDED_RESOURCE_CLAIM`]; elsewhere they count against allocatable. Invariants:
//! pure and deterministic (no clock, no randomness; the qualifying devices of a node are
//! kept per node position and definition stamp — see
//! [`crate::ledger::devices::NodeDevices::definition_stamp`] — which changes speed
//! only); what it allocates respects I1 against the ledger's holdings plus the pods
//! planned earlier in the same round. Called by filters
//! (fit and copies), placement (the allocation recorded per member) and preemption.

mod search;
use search::*;
mod table;
use table::*;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::engine::cluster::Cluster;
use crate::engine::filter::FilterReason;
use crate::ledger::devices::{AgentLink, NodeDevices, PoolKey};
use crate::ledger::network::NetworkPools;
use crate::model::cel::{compile_selector, split_qualified, CompiledSelector};
use crate::model::claim::{
    AdminAccess, AllocationMode, ConstraintRule, DeviceAllocation, DeviceToleration, PodClaim,
    RequestSpec, CLAIM_DEVICES_MAX, EXTENDED_RESOURCE_CLAIM,
};
use crate::model::device::{
    AllocationSharing, AttributeValue, CelSelector, Device, DeviceClass, DeviceId, DeviceQuantity,
    DeviceTaint, DeviceTaintEffect,
};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::{PodSpec, PodSummary};
use crate::model::reach::PoolReach;
use crate::model::resources::{ResourceName, Resources};

/// Most search steps (devices tried) one allocation may take before the node is given up.
pub const SEARCH_STEPS_MAX: u64 = 100_000;
/// Upstream's FirstAvailableDeviceRequestMaxSize: the score of a first choice is this.
pub const FIRST_AVAILABLE_SCORE_BASE: u32 = 8;
/// Network-attached devices one allocation's score tells apart (more score as this
/// many): with network pools, a node that serves a pod with fewer of them scores higher.
pub const NETWORK_PICKS_SCORED_MAX: u32 = 64;

/// One way to satisfy a request.
#[derive(Debug, Clone)]
struct Alternative {
    /// `request` or `request/sub-request`, as the allocation records it.
    reference: String,
    /// The sub-request name, for a firstAvailable alternative.
    sub: Option<String>,
    selectors: Vec<Arc<CompiledSelector>>,
    mode: AllocationMode,
    admin: AdminAccess,
    tolerations: Vec<DeviceToleration>,
    capacity: BTreeMap<String, DeviceQuantity>,
}

/// One request of a claim, with its alternatives in preference order.
#[derive(Debug, Clone)]
struct RequestNeed {
    name: String,
    alternatives: Vec<Alternative>,
    prioritized: bool,
}

/// A constraint and the requests it covers (empty: all).
#[derive(Debug, Clone)]
struct ConstraintNeed {
    covers: Vec<(String, Option<String>)>,
    rule: ConstraintRule,
}

impl ConstraintNeed {
    fn applies(&self, request: &str, sub: Option<&str>) -> bool {
        self.covers.is_empty()
            || self.covers.iter().any(|(base, only)| {
                base == request && only.as_deref().is_none_or(|s| Some(s) == sub)
            })
    }

    fn attribute(&self) -> &str {
        match &self.rule {
            ConstraintRule::MatchAttribute(a) | ConstraintRule::DistinctAttribute(a) => a,
        }
    }
}

/// Which devices may serve a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimReach {
    /// The node's own and those of the network-attached pools that reach it.
    Anywhere,
    /// Either, but all from one source: a ResourceClaim shared with other pods is
    /// carried on its carrier's node (its pods share that node) or, all its devices
    /// network-attached, under the claim's network hold (its pods run wherever those
    /// pools reach; docs/ARCHITECTURE.md rule 15), never split between the two.
    OneSource,
}

/// Where a device of a node's table comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceSource {
    /// One of the node's pools.
    Node,
    /// A network-attached pool that reaches the node.
    Network,
}

/// A claim, resolved.
#[derive(Debug, Clone)]
struct ClaimNeed {
    name: String,
    requests: Vec<RequestNeed>,
    constraints: Vec<ConstraintNeed>,
    reach: ClaimReach,
}

/// An extended resource a device class serves.
#[derive(Debug, Clone)]
struct ExtendedNeed {
    resource: String,
    count: u64,
    request: RequestNeed,
}

/// The qualifying devices of one node, per (request, alternative).
#[derive(Debug)]
struct NodeCandidates {
    /// `lists[r][a]`: table positions, in table order.
    lists: Vec<Vec<Vec<usize>>>,
}

/// Qualifying devices (or the selector error) of a node position, for one definition
/// stamp and one set of device-served extended resources (which shapes the requests).
type Kept = (Stamps, Vec<bool>, Result<Arc<NodeCandidates>, FilterReason>);

/// What a node's qualifying devices depend on: the definition stamps of its own devices
/// and of the network-attached pools, and which of those pools reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamps {
    node: u64,
    network: u64,
    reached: Vec<bool>,
}

/// A pod template's device needs, resolved against the device classes.
#[derive(Debug)]
pub struct DeviceDemand {
    claims: Vec<ClaimNeed>,
    extended: Vec<ExtendedNeed>,
    /// The classes the template names, in name order (what results depend on).
    classes: Vec<DeviceClass>,
    /// Every class name the claims name, with the class found (for reuse checks).
    named: Vec<(String, Option<DeviceClass>)>,
    /// Every extended resource requested, with the class that serves it (if any).
    mapped: Vec<(String, Option<DeviceClass>)>,
    /// A failure of the whole template (unknown class, bad selector), reported on every node.
    failure: Option<FilterReason>,
    /// Per node position: qualifying devices for a definition stamp.
    memo: Mutex<HashMap<usize, Kept>>,
}

/// What a node's devices can do for a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFit {
    /// Copies whose claims can all be allocated, one after the other.
    pub copies: u64,
    /// The first copy's firstAvailable preference score.
    pub score: u32,
}

/// One device taken by a search.
#[derive(Debug, Clone)]
struct Pick {
    request: usize,
    alternative: usize,
    slot: usize,
    consumed: Vec<DeviceQuantity>,
}

fn resolve_exact(
    reference: String,
    sub: Option<String>,
    exact: &crate::model::claim::ExactRequest,
    classes: &BTreeMap<String, DeviceClass>,
    used: &mut BTreeMap<String, DeviceClass>,
) -> Result<Alternative, FilterReason> {
    let class = classes
        .get(&exact.device_class_name)
        .ok_or_else(|| FilterReason::DeviceClassNotFound(exact.device_class_name.clone()))?;
    used.insert(class.name.clone(), class.clone());
    let selectors = compile_all(class.selectors.iter().chain(&exact.selectors))?;
    Ok(Alternative {
        reference,
        sub,
        selectors,
        mode: exact.allocation_mode,
        admin: exact.admin_access,
        tolerations: exact.tolerations.clone(),
        capacity: exact.capacity.clone(),
    })
}

fn compile_all<'s>(
    selectors: impl Iterator<Item = &'s CelSelector>,
) -> Result<Vec<Arc<CompiledSelector>>, FilterReason> {
    selectors
        .map(|s| {
            compile_selector(&s.expression).map_err(|e| {
                FilterReason::DeviceSelectorError(format!("\"{}\": {e}", s.expression))
            })
        })
        .collect()
}

fn resolve_claim(
    claim: &PodClaim,
    classes: &BTreeMap<String, DeviceClass>,
    used: &mut BTreeMap<String, DeviceClass>,
) -> Result<ClaimNeed, FilterReason> {
    let mut requests = Vec::with_capacity(claim.requests.len());
    for request in &claim.requests {
        let need = match &request.spec {
            RequestSpec::Exactly(exact) => RequestNeed {
                name: request.name.clone(),
                alternatives: vec![resolve_exact(
                    request.name.clone(),
                    None,
                    exact,
                    classes,
                    used,
                )?],
                prioritized: false,
            },
            RequestSpec::FirstAvailable(subs) => RequestNeed {
                name: request.name.clone(),
                alternatives: subs
                    .iter()
                    .map(|sub| {
                        resolve_exact(
                            format!("{}/{}", request.name, sub.name),
                            Some(sub.name.clone()),
                            &sub.exact,
                            classes,
                            used,
                        )
                    })
                    .collect::<Result<_, _>>()?,
                prioritized: true,
            },
        };
        requests.push(need);
    }
    let constraints = claim
        .constraints
        .iter()
        .map(|c| ConstraintNeed {
            covers: c
                .requests
                .iter()
                .map(|r| match r.split_once('/') {
                    Some((base, sub)) => (base.to_string(), Some(sub.to_string())),
                    None => (r.clone(), None),
                })
                .collect(),
            rule: c.rule.clone(),
        })
        .collect();
    Ok(ClaimNeed {
        name: claim.name.clone(),
        requests,
        constraints,
        reach: ClaimReach::Anywhere,
    })
}

/// The class serving extended resource `name`, if any (the first by class name).
fn serving<'c>(classes: &'c BTreeMap<String, DeviceClass>, name: &str) -> Option<&'c DeviceClass> {
    classes
        .values()
        .find(|c| c.extended_resource_name.as_deref() == Some(name))
}

/// Every device class name `spec`'s claims name, in order.
fn named_classes(spec: &PodSpec) -> impl Iterator<Item = &str> + '_ {
    spec.claims.iter().flat_map(|c| {
        c.requests.iter().flat_map(|r| -> Vec<&str> {
            match &r.spec {
                RequestSpec::Exactly(exact) => vec![exact.device_class_name.as_str()],
                RequestSpec::FirstAvailable(subs) => subs
                    .iter()
                    .map(|s| s.exact.device_class_name.as_str())
                    .collect(),
            }
        })
    })
}

/// Every selector a plan for `spec` may evaluate under `classes` (its claims' classes and
/// requests, and the classes serving its extended resources), compiled; ones that do not
/// compile are left out (the plan reports them).
pub fn selectors_of(
    spec: &PodSpec,
    classes: &BTreeMap<String, DeviceClass>,
) -> Vec<Arc<CompiledSelector>> {
    let mut exacts: Vec<&crate::model::claim::ExactRequest> = Vec::new();
    for claim in &spec.claims {
        for request in &claim.requests {
            match &request.spec {
                RequestSpec::Exactly(e) => exacts.push(e),
                RequestSpec::FirstAvailable(subs) => exacts.extend(subs.iter().map(|s| &s.exact)),
            }
        }
    }
    let mut texts: Vec<&CelSelector> = Vec::new();
    for e in exacts {
        if let Some(class) = classes.get(&e.device_class_name) {
            texts.extend(&class.selectors);
        }
        texts.extend(&e.selectors);
    }
    for name in spec.requests.extended.keys() {
        if let Some(class) = serving(classes, name) {
            texts.extend(&class.selectors);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    texts
        .into_iter()
        .filter(|s| seen.insert(s.expression.as_str()))
        .filter_map(|s| compile_selector(&s.expression).ok())
        .collect()
}

/// Whether `spec` may need devices under `classes` (claims, or a served extended resource).
pub fn needs_devices(spec: &PodSpec, classes: &BTreeMap<String, DeviceClass>) -> bool {
    !spec.claims.is_empty()
        || spec
            .requests
            .extended
            .keys()
            .any(|name| serving(classes, name).is_some())
}

impl DeviceDemand {
    /// Whether this demand, built for `spec`, still resolves the same way under `classes`.
    pub fn resolves_same(&self, spec: &PodSpec, classes: &BTreeMap<String, DeviceClass>) -> bool {
        let named = named_classes(spec).count() == self.named.len()
            && named_classes(spec)
                .zip(&self.named)
                .all(|(name, (kept, class))| name == kept && classes.get(name) == class.as_ref());
        let mapped = spec.requests.extended.len() == self.mapped.len()
            && spec
                .requests
                .extended
                .keys()
                .zip(&self.mapped)
                .all(|(name, (kept, class))| {
                    name == kept && serving(classes, name) == class.as_ref()
                });
        named && mapped
    }

    /// The device needs of `spec` against `classes`, or `None` if it needs no device.
    pub fn build(spec: &PodSpec, classes: &BTreeMap<String, DeviceClass>) -> Option<Self> {
        if !needs_devices(spec, classes) {
            return None;
        }
        let mapped: Vec<(&String, u64, &DeviceClass)> = spec
            .requests
            .extended
            .iter()
            .filter_map(|(name, count)| Some((name, *count, serving(classes, name)?)))
            .collect();
        let mut used = BTreeMap::new();
        let mut failure = None;
        let mut claims = Vec::with_capacity(spec.claims.len());
        for claim in &spec.claims {
            match resolve_claim(claim, classes, &mut used) {
                Ok(mut need) => {
                    if spec.carried_shares().any(|s| s.pod_claim == claim.name) {
                        need.reach = ClaimReach::OneSource;
                    }
                    claims.push(need);
                }
                Err(reason) => {
                    failure.get_or_insert(reason);
                }
            }
        }
        let mut extended = Vec::with_capacity(mapped.len());
        for (resource, count, class) in mapped {
            used.insert(class.name.clone(), class.clone());
            let mode = u32::try_from(count)
                .ok()
                .filter(|n| *n <= CLAIM_DEVICES_MAX)
                .map(AllocationMode::ExactCount);
            let Some(mode) = mode else {
                failure.get_or_insert(FilterReason::CannotAllocateDevices);
                continue;
            };
            match compile_all(class.selectors.iter()) {
                Ok(selectors) => extended.push(ExtendedNeed {
                    resource: resource.clone(),
                    count,
                    request: RequestNeed {
                        name: resource.clone(),
                        alternatives: vec![Alternative {
                            reference: resource.clone(),
                            sub: None,
                            selectors,
                            mode,
                            admin: AdminAccess::Disabled,
                            tolerations: Vec::new(),
                            capacity: BTreeMap::new(),
                        }],
                        prioritized: false,
                    },
                }),
                Err(reason) => {
                    failure.get_or_insert(reason);
                }
            }
        }
        Some(Self {
            claims,
            extended,
            classes: used.into_values().collect(),
            named: named_classes(spec)
                .map(|name| (name.to_string(), classes.get(name).cloned()))
                .collect(),
            mapped: spec
                .requests
                .extended
                .keys()
                .map(|name| (name.clone(), serving(classes, name).cloned()))
                .collect(),
            failure,
            memo: Mutex::new(HashMap::new()),
        })
    }

    /// The classes the template depends on, in name order.
    pub fn classes(&self) -> &[DeviceClass] {
        &self.classes
    }

    /// Whether a firstAvailable request makes scores differ between nodes.
    pub fn scores(&self) -> bool {
        self.claims
            .iter()
            .any(|c| c.requests.iter().any(|r| r.prioritized))
    }

    /// The extended resources `node` serves from devices (it does not list them as allocatable).
    fn served<'d>(&'d self, node: &Node) -> impl Iterator<Item = &'d ExtendedNeed> + 'd {
        let listed: Vec<bool> = self
            .extended
            .iter()
            .map(|e| node.allocatable.extended.contains_key(&e.resource))
            .collect();
        self.extended
            .iter()
            .zip(listed)
            .filter(|(_, listed)| !listed)
            .map(|(e, _)| e)
    }

    /// The footprint left for allocatable on `node`: device-served extended resources removed.
    pub fn footprint_on(&self, node: &Node, footprint: &Resources) -> Resources {
        let mut out = footprint.clone();
        for e in self.served(node) {
            out.set(&ResourceName::Extended(e.resource.clone()), 0);
        }
        out
    }

    /// Whether any extended resource may be served from devices.
    pub fn serves_extended(&self) -> bool {
        !self.extended.is_empty()
    }

    /// How many copies (up to `cap`) node `idx` can allocate devices for, one after the
    /// other beside what is held and planned, and the first copy's score.
    pub fn fit(
        &self,
        cluster: &Cluster<'_>,
        idx: usize,
        cap: u64,
    ) -> Result<DeviceFit, FilterReason> {
        if let Some(reason) = &self.failure {
            return Err(reason.clone());
        }
        let (Some(node), Some(view)) = (cluster.node(idx), cluster.view(idx)) else {
            return Err(FilterReason::NodeNotReady);
        };
        let claims = self.claims_on(node);
        let (table, stamps) = Table::for_node(node, &view.usage.devices, cluster.network());
        let served = self.served_mask(node);
        let candidates = self.candidates(idx, (stamps, &served), &table, &claims)?;
        let mut search = Search::new(&table, &claims, &candidates);
        search.preload(cluster.planned_devices(idx));
        search.preload(cluster.planned_network_devices_elsewhere(idx));
        let mut copies = 0u64;
        let mut score = 0u32;
        while copies < cap {
            match search.allocate() {
                Ok(Some(_)) => {
                    if copies == 0 {
                        score = search.score(cluster.network().is_some());
                    }
                    copies += 1;
                }
                Ok(None) => break,
                Err(Abort) if copies == 0 => return Err(FilterReason::DeviceSearchLimit),
                Err(Abort) => break,
            }
        }
        if copies == 0 {
            return Err(FilterReason::CannotAllocateDevices);
        }
        Ok(DeviceFit { copies, score })
    }

    /// The summary of member `key` placed on node `idx`: `base` with device-served
    /// extended resources removed from its requests and the devices allocated recorded.
    pub fn allocate(
        &self,
        cluster: &Cluster<'_>,
        idx: usize,
        key: &MemberKey,
        base: &PodSummary,
    ) -> Result<PodSummary, FilterReason> {
        let mut out = self.allocate_each(cluster, idx, &[key], base)?;
        out.pop().ok_or(FilterReason::CannotAllocateDevices)
    }

    /// [`DeviceDemand::allocate`] for several members on one node, one after the
    /// other (each sees the devices of the ones before); stops at the first that does
    /// not fit, so the result may be shorter than `keys`. `Err` if none fits.
    pub fn allocate_each(
        &self,
        cluster: &Cluster<'_>,
        idx: usize,
        keys: &[&MemberKey],
        base: &PodSummary,
    ) -> Result<Vec<PodSummary>, FilterReason> {
        if let Some(reason) = &self.failure {
            return Err(reason.clone());
        }
        let (Some(node), Some(view)) = (cluster.node(idx), cluster.view(idx)) else {
            return Err(FilterReason::NodeNotReady);
        };
        let claims = self.claims_on(node);
        let (table, stamps) = Table::for_node(node, &view.usage.devices, cluster.network());
        let served = self.served_mask(node);
        let candidates = self.candidates(idx, (stamps, &served), &table, &claims)?;
        let mut search = Search::new(&table, &claims, &candidates);
        search.preload(cluster.planned_devices(idx));
        search.preload(cluster.planned_network_devices_elsewhere(idx));
        let mut template = base.clone();
        for e in self.served(node) {
            template
                .requests
                .set(&ResourceName::Extended(e.resource.clone()), 0);
        }
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let picks = match search.allocate() {
                Ok(Some(picks)) => picks,
                Ok(None) if out.is_empty() => return Err(FilterReason::CannotAllocateDevices),
                Err(Abort) if out.is_empty() => return Err(FilterReason::DeviceSearchLimit),
                Ok(None) | Err(Abort) => break,
            };
            let mut summary = template.clone();
            summary.devices = picks
                .iter()
                .filter_map(|pick| record(&table, &claims, key, pick))
                .collect();
            out.push(summary);
        }
        Ok(out)
    }

    /// The user claims, then the implicit claim of the extended resources `node` serves.
    fn claims_on(&self, node: &Node) -> Vec<ClaimRef<'_>> {
        let mut out: Vec<ClaimRef<'_>> = self
            .claims
            .iter()
            .map(|c| ClaimRef {
                name: &c.name,
                requests: c.requests.iter().collect(),
                constraints: &c.constraints,
                reach: c.reach,
            })
            .collect();
        let served: Vec<&RequestNeed> = self.served(node).map(|e| &e.request).collect();
        if !served.is_empty() {
            out.push(ClaimRef {
                name: EXTENDED_RESOURCE_CLAIM,
                requests: served,
                constraints: &[],
                reach: ClaimReach::Anywhere,
            });
        }
        out
    }

    /// The qualifying devices of node `idx` (whose devices, and the network pools it
    /// reaches, have definition stamps `stamp`, and which serves the extended resources
    /// `served` from devices) per request and alternative, kept per position, stamps
    /// and served set.
    fn candidates(
        &self,
        idx: usize,
        (stamp, served): (Stamps, &[bool]),
        table: &Table<'_>,
        claims: &[ClaimRef<'_>],
    ) -> Result<Arc<NodeCandidates>, FilterReason> {
        if let Ok(memo) = self.memo.lock() {
            if let Some((kept, kept_served, hit)) = memo.get(&idx) {
                if *kept == stamp && kept_served.as_slice() == served {
                    return hit.clone();
                }
            }
        }
        let computed = compute_candidates(table, claims).map(Arc::new);
        if let Ok(mut memo) = self.memo.lock() {
            memo.insert(idx, (stamp, served.to_vec(), computed.clone()));
        }
        computed
    }

    /// Which extended resources `node` serves from devices, in demand order.
    fn served_mask(&self, node: &Node) -> Vec<bool> {
        self.extended
            .iter()
            .map(|e| !node.allocatable.extended.contains_key(&e.resource))
            .collect()
    }

    /// The extended resources this demand may serve, with their counts.
    pub fn extended_counts(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.extended.iter().map(|e| (e.resource.as_str(), e.count))
    }
}

/// A claim as one node sees it.
#[derive(Debug, Clone)]
struct ClaimRef<'d> {
    name: &'d str,
    requests: Vec<&'d RequestNeed>,
    constraints: &'d [ConstraintNeed],
    reach: ClaimReach,
}

fn record(
    table: &Table<'_>,
    claims: &[ClaimRef<'_>],
    key: &MemberKey,
    pick: &Pick,
) -> Option<DeviceAllocation> {
    let (claim, request) = flat_request(claims, pick.request)?;
    let alternative = request.alternatives.get(pick.alternative)?;
    let slot = table.slots.get(pick.slot)?;
    let shared = slot.device.sharing == AllocationSharing::Shared
        && alternative.admin == AdminAccess::Disabled;
    let reference = &alternative.reference;
    Some(DeviceAllocation {
        claim: claim.name.to_string(),
        request: reference.clone(),
        device: DeviceId::new(slot.driver, slot.pool, &slot.device.name),
        admin_access: alternative.admin,
        tolerations: alternative.tolerations.clone(),
        share_id: shared.then(|| share_uid(&format!("{key}:{}:{reference}", claim.name))),
        consumed_capacity: if shared {
            slot.device
                .capacity
                .keys()
                .map(|name| name.to_string())
                .zip(pick.consumed.iter().copied())
                .collect()
        } else {
            BTreeMap::new()
        },
    })
}

/// The share id of one allocation of a shared device, from what names the allocation
/// (member, claim, request): the API server takes only a UUID (RFC 4122 text), so the
/// name's two 64-bit FNV-1a hashes are written as one, version 8 (custom), variant
/// RFC 4122. Deterministic, as the engine must be; two names of one device colliding
/// would be refused by the ledger, never double-counted.
fn share_uid(name: &str) -> String {
    let fnv = |basis: u64| {
        name.bytes().fold(basis, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let hi = fnv(0xcbf2_9ce4_8422_2325);
    let lo = fnv(0x8422_2325_cbf2_9ce4);
    let hi = (hi & !0xf000) | 0x8000;
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// The claim and request at flattened position `r`.
fn flat_request<'c, 'd>(
    claims: &'c [ClaimRef<'d>],
    r: usize,
) -> Option<(&'c ClaimRef<'d>, &'d RequestNeed)> {
    let mut r = r;
    for claim in claims {
        if r < claim.requests.len() {
            return Some((claim, claim.requests.get(r)?));
        }
        r -= claim.requests.len();
    }
    None
}
