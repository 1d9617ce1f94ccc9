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
                .cloned()
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

// ---- the node's device table ----------------------------------------------------------

/// One device of a node as the search reads it.
#[derive(Debug)]
struct Slot<'a> {
    driver: &'a str,
    pool: &'a str,
    device: &'a Device,
    source: DeviceSource,
    healthy: bool,
    rule_taints: &'a [DeviceTaint],
    base_holders: u32,
    /// What held allocations consume, parallel to `device.capacity`.
    base_consumed: Vec<DeviceQuantity>,
    /// Counters it consumes while in use: (counter position, amount).
    counters: Vec<(usize, DeviceQuantity)>,
}

/// One shared counter of a node.
#[derive(Debug, Clone, Copy)]
struct CounterSlot {
    total: DeviceQuantity,
    used: DeviceQuantity,
}

/// A node's devices in (driver, pool, name) order, with what is held of them.
#[derive(Debug)]
struct Table<'a> {
    slots: Vec<Slot<'a>>,
    counters: Vec<CounterSlot>,
}

/// Advances a sorted `(key, value)` iterator to `key`; the value there, if any.
fn seek<K: Ord, V>(
    it: &mut std::iter::Peekable<impl Iterator<Item = (K, V)>>,
    key: &K,
) -> Option<V> {
    while let Some((k, _)) = it.peek() {
        match k.cmp(key) {
            std::cmp::Ordering::Less => {
                it.next();
            }
            std::cmp::Ordering::Equal => return it.next().map(|(_, v)| v),
            std::cmp::Ordering::Greater => return None,
        }
    }
    None
}

impl<'a> Table<'a> {
    /// The table of `node`'s own devices and of the network-attached pools that reach
    /// it, with what the table depends on.
    fn for_node(
        node: &Node,
        devices: &'a NodeDevices,
        network: Option<&'a NetworkPools>,
    ) -> (Self, Stamps) {
        let mut table = Self::of(devices, |_, _| true);
        let mut stamps = Stamps {
            node: devices.definition_stamp(),
            network: 0,
            reached: Vec::new(),
        };
        if let Some(network) = network {
            stamps.network = network.devices().definition_stamp();
            for (key, reach) in network.pools() {
                match reach {
                    PoolReach::PerDevice => stamps.reached.extend(
                        (network.devices().pools.get(key).into_iter())
                            .flat_map(|pool| pool.devices.values())
                            .map(|d| reach.admits_device(d, node)),
                    ),
                    _ => stamps.reached.push(reach.admits(node)),
                }
            }
            let reached = |key: &PoolKey, device: &Device| {
                network
                    .reach(key)
                    .is_some_and(|r| r.admits_device(device, node))
            };
            if stamps.reached.iter().any(|r| *r) {
                table.append(Self::of(network.devices(), reached));
            }
        }
        (table, stamps)
    }

    /// Adds another table's devices (of other pools), keeping (driver, pool, name) order.
    fn append(&mut self, other: Self) {
        let shift = self.counters.len();
        self.counters.extend(other.counters);
        self.slots.extend(other.slots.into_iter().map(|mut slot| {
            for (pos, _) in &mut slot.counters {
                *pos += shift;
            }
            slot.source = DeviceSource::Network;
            slot
        }));
        self.slots.sort_by(|a, b| {
            (a.driver, a.pool, &a.device.name).cmp(&(b.driver, b.pool, &b.device.name))
        });
    }

    /// The table of the pools of `devices` that `keep` keeps; the health, taint,
    /// holding and counter maps (all in (driver, pool, …) order, as the pools are) are
    /// read in one merged pass.
    fn of(devices: &'a NodeDevices, keep: impl Fn(&PoolKey, &Device) -> bool) -> Self {
        let mut slots = Vec::new();
        let mut counters = Vec::new();
        let lost = matches!(devices.agent, AgentLink::Lost { .. });
        let id_of = |id: &'a DeviceId| (id.driver.as_str(), id.pool.as_str(), id.device.as_str());
        let mut unhealthy = devices
            .unhealthy
            .iter()
            .map(|id| (id_of(id), ()))
            .peekable();
        let mut taints = devices
            .rule_taints
            .iter()
            .map(|(id, t)| (id_of(id), t))
            .peekable();
        let mut held = devices.held.iter().map(|(id, u)| (id_of(id), u)).peekable();
        let mut used = devices
            .counters
            .iter()
            .map(|(k, q)| {
                (
                    (
                        k.driver.as_str(),
                        k.pool.as_str(),
                        k.counter_set.as_str(),
                        k.counter.as_str(),
                    ),
                    *q,
                )
            })
            .peekable();
        // A pool none of whose devices is kept (a network pool that does not reach the
        // node) adds neither counters nor devices.
        let offered = (devices.pools.iter()).filter(|(key, pool)| {
            pool.standing.is_offered() && pool.devices.values().any(|d| keep(key, d))
        });
        for (key, pool) in offered {
            let (driver, pool_name) = (key.driver.as_str(), key.pool.as_str());
            let mut counter_pos: BTreeMap<(&str, &str), usize> = BTreeMap::new();
            for (set, values) in &pool.counter_sets {
                for (counter, total) in values {
                    let used = seek(
                        &mut used,
                        &(driver, pool_name, set.as_str(), counter.as_str()),
                    )
                    .unwrap_or_default();
                    counter_pos.insert((set.as_str(), counter.as_str()), counters.len());
                    counters.push(CounterSlot {
                        total: *total,
                        used,
                    });
                }
            }
            for (name, device) in pool.devices.iter().filter(|(_, d)| keep(key, d)) {
                let id = (driver, pool_name, name.as_str());
                let use_ = seek(&mut held, &id);
                let base_consumed = device
                    .capacity
                    .keys()
                    .map(|c| {
                        use_.and_then(|u| u.consumed.get(c))
                            .copied()
                            .unwrap_or_default()
                    })
                    .collect();
                let device_counters = device
                    .consumes_counters
                    .iter()
                    .flat_map(|c| {
                        let counter_pos = &counter_pos;
                        c.counters.iter().filter_map(move |(counter, amount)| {
                            counter_pos
                                .get(&(c.counter_set.as_str(), counter.as_str()))
                                .map(|pos| (*pos, *amount))
                        })
                    })
                    .collect();
                slots.push(Slot {
                    driver,
                    pool: pool_name,
                    device,
                    source: DeviceSource::Node,
                    healthy: !lost && seek(&mut unhealthy, &id).is_none(),
                    rule_taints: seek(&mut taints, &id).map_or(&[], Vec::as_slice),
                    base_holders: use_.map_or(0, |u| u.holders),
                    base_consumed,
                    counters: device_counters,
                });
            }
        }
        Self { slots, counters }
    }

    /// The position of a device, if the node publishes it.
    fn position(&self, id: &DeviceId) -> Option<usize> {
        let wanted = (id.driver.as_str(), id.pool.as_str(), id.device.as_str());
        self.slots
            .binary_search_by(|s| (s.driver, s.pool, s.device.name.as_str()).cmp(&wanted))
            .ok()
    }
}

/// The capacity a request asks of `device` under its capacity name `name`, if any.
fn requested_of(
    driver: &str,
    name: &str,
    capacity: &BTreeMap<String, DeviceQuantity>,
) -> Option<DeviceQuantity> {
    let wanted = split_qualified(driver, name);
    capacity
        .iter()
        .find(|(n, _)| split_qualified(driver, n) == wanted)
        .map(|(_, q)| *q)
}

/// Whether `slot` can serve `alternative` whatever is allocated: healthy, taints
/// tolerated, capacity requirements servable, selectors matching.
fn qualifies(slot: &Slot<'_>, alternative: &Alternative) -> Result<bool, FilterReason> {
    if !slot.healthy {
        return Ok(false);
    }
    let tolerated = |t: &DeviceTaint| {
        !matches!(
            t.effect,
            DeviceTaintEffect::NoSchedule | DeviceTaintEffect::NoExecute
        ) || alternative.tolerations.iter().any(|tol| tol.tolerates(t))
    };
    if !slot.device.taints.iter().all(tolerated) || !slot.rule_taints.iter().all(tolerated) {
        return Ok(false);
    }
    for (name, amount) in &alternative.capacity {
        let Some(capacity) = slot.device.capacity_of(slot.driver, name) else {
            return Ok(false);
        };
        let servable = match slot.device.sharing {
            AllocationSharing::Exclusive => *amount <= capacity.value,
            AllocationSharing::Shared => capacity
                .consumed_by(Some(*amount))
                .is_some_and(|c| c <= capacity.value),
        };
        if !servable {
            return Ok(false);
        }
    }
    for selector in &alternative.selectors {
        match selector.matches(slot.driver, slot.device) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => return Err(FilterReason::DeviceSelectorError(e.to_string())),
        }
    }
    Ok(true)
}

fn compute_candidates(
    table: &Table<'_>,
    claims: &[ClaimRef<'_>],
) -> Result<NodeCandidates, FilterReason> {
    let mut lists = Vec::new();
    for claim in claims {
        for request in &claim.requests {
            let mut per_alternative = Vec::with_capacity(request.alternatives.len());
            for alternative in &request.alternatives {
                let mut list = Vec::new();
                for (pos, slot) in table.slots.iter().enumerate() {
                    if qualifies(slot, alternative)? {
                        list.push(pos);
                    }
                }
                per_alternative.push(list);
            }
            lists.push(per_alternative);
        }
    }
    Ok(NodeCandidates { lists })
}

// ---- the search -----------------------------------------------------------------------

/// The search ran out of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Abort;

/// What one constraint has seen so far in the current allocation.
#[derive(Debug, Clone, Default)]
struct ConstraintSeen {
    values: Vec<AttributeValue>,
}

/// Backtracking allocation of one pod's claims on one node, over held + planned +
/// earlier copies.
struct Search<'t, 'a, 'd> {
    table: &'t Table<'a>,
    claims: &'t [ClaimRef<'d>],
    candidates: &'t NodeCandidates,
    /// Flattened request → claim position.
    claim_of: Vec<usize>,
    /// Extra holders per slot (planned, earlier copies, current picks).
    holders: Vec<u32>,
    /// Extra consumption per slot, parallel to the device's capacity.
    consumed: Vec<Vec<DeviceQuantity>>,
    /// Extra counter use, by counter position.
    counters: Vec<DeviceQuantity>,
    /// Devices per claim in the current allocation.
    claim_devices: Vec<u32>,
    /// Per claim, per constraint.
    seen: Vec<Vec<ConstraintSeen>>,
    picks: Vec<Pick>,
    /// Chosen alternative per flattened request.
    chosen: Vec<usize>,
    /// Per claim, the one source its devices come from (claims of
    /// [`ClaimReach::OneSource`] only, while it is being allocated).
    source: Vec<Option<DeviceSource>>,
    /// Whether the table has network-attached devices.
    has_network: bool,
    steps: u64,
}

impl<'t, 'a, 'd> Search<'t, 'a, 'd> {
    fn new(
        table: &'t Table<'a>,
        claims: &'t [ClaimRef<'d>],
        candidates: &'t NodeCandidates,
    ) -> Self {
        let claim_of: Vec<usize> = claims
            .iter()
            .enumerate()
            .flat_map(|(c, claim)| std::iter::repeat_n(c, claim.requests.len()))
            .collect();
        Self {
            table,
            claims,
            candidates,
            chosen: vec![0; claim_of.len()],
            claim_of,
            holders: vec![0; table.slots.len()],
            consumed: table
                .slots
                .iter()
                .map(|s| vec![DeviceQuantity::ZERO; s.device.capacity.len()])
                .collect(),
            counters: vec![DeviceQuantity::ZERO; table.counters.len()],
            claim_devices: vec![0; claims.len()],
            seen: claims
                .iter()
                .map(|c| vec![ConstraintSeen::default(); c.constraints.len()])
                .collect(),
            picks: Vec::new(),
            source: vec![None; claims.len()],
            has_network: table
                .slots
                .iter()
                .any(|s| s.source == DeviceSource::Network),
            steps: 0,
        }
    }

    /// Counts allocations planned earlier in the round as taken.
    fn preload<'p>(&mut self, planned: impl Iterator<Item = &'p DeviceAllocation>) {
        for a in planned {
            if a.admin_access == AdminAccess::Enabled {
                continue;
            }
            let Some(slot) = self.table.position(&a.device) else {
                continue;
            };
            let amounts: Vec<DeviceQuantity> = self.table.slots[slot]
                .device
                .capacity
                .keys()
                .map(|name| a.consumed_capacity.get(name).copied().unwrap_or_default())
                .collect();
            self.take(slot, &amounts);
        }
    }

    fn in_use(&self, slot: usize) -> bool {
        self.table.slots[slot].base_holders + self.holders[slot] > 0
    }

    fn take(&mut self, slot: usize, amounts: &[DeviceQuantity]) {
        if !self.in_use(slot) {
            for &(pos, amount) in &self.table.slots[slot].counters {
                self.counters[pos] = self.counters[pos]
                    .checked_add(&amount)
                    .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
            }
        }
        self.holders[slot] += 1;
        for (q, amount) in self.consumed[slot].iter_mut().zip(amounts) {
            *q = q
                .checked_add(amount)
                .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
        }
    }

    fn untake(&mut self, slot: usize, amounts: &[DeviceQuantity]) {
        self.holders[slot] = self.holders[slot].saturating_sub(1);
        for (q, amount) in self.consumed[slot].iter_mut().zip(amounts) {
            *q = q.saturating_sub(amount);
        }
        if !self.in_use(slot) {
            for &(pos, amount) in &self.table.slots[slot].counters {
                self.counters[pos] = self.counters[pos].saturating_sub(&amount);
            }
        }
    }

    /// One more allocation of every claim beside everything counted so far; its picks
    /// stay counted (so the next call allocates the next copy).
    fn allocate(&mut self) -> Result<Option<Vec<Pick>>, Abort> {
        self.picks.clear();
        self.steps = 0;
        for n in &mut self.claim_devices {
            *n = 0;
        }
        for source in &mut self.source {
            *source = None;
        }
        for claim in &mut self.seen {
            for seen in claim.iter_mut() {
                seen.values.clear();
            }
        }
        if self.request(0)? {
            Ok(Some(self.picks.clone()))
        } else {
            Ok(None)
        }
    }

    /// The firstAvailable preference of the current picks; where the cluster has
    /// network-attached pools (`network`), then, at a lower rank, how few network
    /// devices they take: a node that serves a pod from its own devices leaves the
    /// network's, which many nodes can use, to pods that have nothing else (gangway's
    /// addition to DynamicResources scoring; upstream scores firstAvailable only).
    fn score(&self, network: bool) -> u32 {
        let preference = self.preference();
        if !network {
            return preference;
        }
        let taken = self
            .picks
            .iter()
            .filter(|p| self.table.slots[p.slot].source == DeviceSource::Network)
            .count();
        let taken = u32::try_from(taken).map_or(NETWORK_PICKS_SCORED_MAX, |n| {
            n.min(NETWORK_PICKS_SCORED_MAX)
        });
        preference
            .saturating_mul(NETWORK_PICKS_SCORED_MAX + 1)
            .saturating_add(NETWORK_PICKS_SCORED_MAX - taken)
    }

    /// The firstAvailable preference of the current picks.
    fn preference(&self) -> u32 {
        let mut score = 0;
        for (r, &alternative) in self.chosen.iter().enumerate() {
            if let Some((_, request)) = flat_request(self.claims, r) {
                if request.prioritized {
                    let index = u32::try_from(alternative).unwrap_or(u32::MAX);
                    score += FIRST_AVAILABLE_SCORE_BASE.saturating_sub(index);
                }
            }
        }
        score
    }

    fn request(&mut self, r: usize) -> Result<bool, Abort> {
        let claims = self.claims;
        let Some((claim, _)) = flat_request(claims, r) else {
            return Ok(true);
        };
        let c = self.claim_of[r];
        let first = r == 0 || self.claim_of[r - 1] != c;
        if !(first && claim.reach == ClaimReach::OneSource) {
            return self.alternatives(r);
        }
        // The node's devices first, else the network-attached ones.
        for source in [DeviceSource::Node, DeviceSource::Network] {
            if source == DeviceSource::Network && !self.has_network {
                continue;
            }
            self.source[c] = Some(source);
            if self.alternatives(r)? {
                return Ok(true);
            }
        }
        self.source[c] = None;
        Ok(false)
    }

    /// Tries each alternative of request `r` in order.
    fn alternatives(&mut self, r: usize) -> Result<bool, Abort> {
        let claims = self.claims;
        let Some((_, need)) = flat_request(claims, r) else {
            return Ok(true);
        };
        for a in 0..need.alternatives.len() {
            self.chosen[r] = a;
            if self.device(r, a, 0, 0)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Picks device `k` of request `r`, alternative `a`, among candidates from `from`.
    fn device(&mut self, r: usize, a: usize, k: usize, from: usize) -> Result<bool, Abort> {
        let candidates: &'t NodeCandidates = self.candidates;
        let Some(list) = candidates.lists.get(r).and_then(|l| l.get(a)) else {
            return Ok(false);
        };
        let claims = self.claims;
        let Some((_, need)) = flat_request(claims, r) else {
            return Ok(false);
        };
        let Some(alternative) = need.alternatives.get(a) else {
            return Ok(false);
        };
        let source = self.source[self.claim_of[r]];
        let table = self.table;
        let admits = |pos: usize| source.is_none_or(|s| table.slots[list[pos]].source == s);
        let (wanted, every) = match alternative.mode {
            AllocationMode::ExactCount(n) => (n as usize, false),
            AllocationMode::All => ((0..list.len()).filter(|&p| admits(p)).count(), true),
        };
        if wanted == 0 {
            return Ok(false);
        }
        if k == wanted {
            return self.request(r + 1);
        }
        let range = if every {
            match (from..list.len()).find(|&p| admits(p)) {
                Some(pos) => pos..pos + 1,
                None => return Ok(false),
            }
        } else {
            from..list.len()
        };
        for pos in range {
            if !every && list.len() - pos < wanted - k {
                break;
            }
            if !admits(pos) {
                continue;
            }
            self.steps += 1;
            if self.steps > SEARCH_STEPS_MAX {
                return Err(Abort);
            }
            let slot = list[pos];
            if self.try_take(r, alternative, slot).is_some() {
                if self.device(r, a, k + 1, pos + 1)? {
                    return Ok(true);
                }
                self.release_last();
            }
        }
        Ok(false)
    }

    /// Takes `slot` for request `r` if it is free enough, has counters left and keeps
    /// the claim's constraints; records the pick.
    fn try_take(&mut self, r: usize, alternative: &Alternative, slot: usize) -> Option<()> {
        let claim = self.claim_of[r];
        if self.claim_devices[claim] >= CLAIM_DEVICES_MAX {
            return None;
        }
        let table = self.table;
        let s = &table.slots[slot];
        let mut amounts = Vec::new();
        if alternative.admin == AdminAccess::Disabled {
            match s.device.sharing {
                AllocationSharing::Exclusive => {
                    if self.in_use(slot) {
                        return None;
                    }
                }
                AllocationSharing::Shared => {
                    for (i, (name, capacity)) in s.device.capacity.iter().enumerate() {
                        let requested = requested_of(s.driver, name, &alternative.capacity);
                        let amount = capacity.consumed_by(requested)?;
                        let total = s.base_consumed[i]
                            .checked_add(&self.consumed[slot][i])?
                            .checked_add(&amount)?;
                        if total > capacity.value {
                            return None;
                        }
                        amounts.push(amount);
                    }
                }
            }
            if !self.in_use(slot) {
                for &(pos, amount) in &s.counters {
                    let counter = table.counters[pos];
                    let used = counter
                        .used
                        .checked_add(&self.counters[pos])?
                        .checked_add(&amount)?;
                    if used > counter.total {
                        return None;
                    }
                }
            }
        }
        let claims = self.claims;
        let (claim_ref, need) = flat_request(claims, r)?;
        let sub = alternative.sub.as_deref();
        for (c, constraint) in claim_ref.constraints.iter().enumerate() {
            if !constraint.applies(&need.name, sub) {
                continue;
            }
            let value = s.device.attribute(s.driver, constraint.attribute())?;
            let seen = &self.seen[claim][c].values;
            // Values are sets (a scalar is a set of one, DRAListTypeAttributes): matched
            // devices share a value, distinct ones none pairwise.
            let ok = match constraint.rule {
                ConstraintRule::MatchAttribute(_) => {
                    seen.is_empty()
                        || value
                            .items()
                            .into_iter()
                            .any(|item| seen.iter().all(|v| v.holds(item)))
                }
                ConstraintRule::DistinctAttribute(_) => !seen.iter().any(|v| v.overlaps(value)),
            };
            if !ok {
                return None;
            }
        }
        for (c, constraint) in claim_ref.constraints.iter().enumerate() {
            if constraint.applies(&need.name, sub) {
                if let Some(value) = s.device.attribute(s.driver, constraint.attribute()) {
                    self.seen[claim][c].values.push(value.clone());
                }
            }
        }
        if alternative.admin == AdminAccess::Disabled {
            self.take(slot, &amounts);
        }
        self.claim_devices[claim] += 1;
        self.picks.push(Pick {
            request: r,
            alternative: self.chosen[r],
            slot,
            consumed: amounts,
        });
        Some(())
    }

    /// Undoes the last pick.
    fn release_last(&mut self) {
        let Some(pick) = self.picks.pop() else {
            return;
        };
        let claim = self.claim_of[pick.request];
        self.claim_devices[claim] = self.claim_devices[claim].saturating_sub(1);
        let claims = self.claims;
        let Some((claim_ref, need)) = flat_request(claims, pick.request) else {
            return;
        };
        let Some(alternative) = need.alternatives.get(pick.alternative) else {
            return;
        };
        let sub = alternative.sub.as_deref();
        for (c, constraint) in claim_ref.constraints.iter().enumerate() {
            if constraint.applies(&need.name, sub) {
                self.seen[claim][c].values.pop();
            }
        }
        if alternative.admin == AdminAccess::Disabled {
            self.untake(pick.slot, &pick.consumed);
        }
    }
}
