//! Kubernetes objects (as JSON from the API server) into gangway's model: Nodes,
//! ResourceSlices, DeviceClasses, DeviceTaintRules, PodDisruptionBudgets, pods with
//! their ResourceClaims (a claim the pods of one gang share is carried by one of them
//! and followed by the others; one shared beyond the gang is refused), and pods other
//! schedulers bound (with the devices their allocated claims hold, a shared claim's
//! once). Pure
//! functions; every error names the object and the field (Kubernetes JSON names),
//! so the reason can go into a FailedScheduling event as is. Called by the ingest
//! loop (`kube::ingest`) and the gang recognizer (`kube::gangs`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::kube::api;
use gangway_core::ledger::command::{NetworkHold, OBSERVED_GANG};
use gangway_core::ledger::ObservedPod;
use gangway_core::model::claim::CLAIM_CONSUMERS_MAX;
use gangway_core::model::device::{DeviceTaint, DeviceTaintEffect};
use gangway_core::model::names::{validate_label_value, validate_qualified_name};
use gangway_core::model::pod::{
    convert_label_selector, NodeSelectorOperator, NodeSelectorRequirement, RawLabelSelector,
};
use gangway_core::model::reach::{PoolReach, ReachTerm, NODE_NAME_FIELD};
use gangway_core::model::resources::{RawQuantity, RawResourceList, ResourceListKind};
use gangway_core::model::DeviceClass;
use gangway_core::model::{
    AdminAccess, DeviceAllocation, DeviceId, DeviceQuantity, MemberKey, PodSummary,
};
use gangway_core::model::{
    FieldPath, Node, PodSpec, RawDeviceClass, RawNode, RawPodClaim, RawPodSpec, RawResourcePool,
    ResourcePool, Resources, ValidationError,
};
use gangway_core::plan::budgets::DisruptionBudget;

/// Identity of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The identity of `pod`, if it has one.
pub fn pod_ref(pod: &Value) -> Option<PodRef> {
    let meta = &pod["metadata"];
    Some(PodRef {
        namespace: meta["namespace"].as_str().unwrap_or("default").to_string(),
        name: meta["name"].as_str()?.to_string(),
        uid: meta["uid"].as_str()?.to_string(),
    })
}

/// Why a pod cannot be submitted yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodProblem {
    /// Something it needs does not exist yet (a claim, a PodGroup); not an error.
    Waiting(String),
    /// An object it names does not exist, and nothing but a person or a controller will
    /// create it (Kubernetes' PodGroup): it waits, and an event says what for.
    Missing(String),
    /// The pod (or an object it names) is invalid; a person must fix it.
    Invalid(String),
}

impl std::fmt::Display for PodProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Waiting(why) | Self::Missing(why) | Self::Invalid(why) => f.write_str(why),
        }
    }
}

fn invalid(e: ValidationError) -> PodProblem {
    PodProblem::Invalid(e.to_string())
}

fn text_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn quantities(value: &Value) -> RawResourceList {
    value
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let q = match v {
                        Value::String(s) => RawQuantity::Text(s.clone()),
                        Value::Number(n) => n
                            .as_i64()
                            .map(RawQuantity::Integer)
                            .unwrap_or_else(|| RawQuantity::Text(n.to_string())),
                        other => RawQuantity::Text(other.to_string()),
                    };
                    (k.clone(), q)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn without(mut value: Value, fields: &[&str]) -> Value {
    if let Some(map) = value.as_object_mut() {
        for f in fields {
            map.remove(*f);
        }
    }
    value
}

/// A Node: allocatable, labels, taints, unschedulable and the Ready condition.
pub fn node(object: &Value) -> Result<Node, ValidationError> {
    let ready = object["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"] == "True")
        .unwrap_or(false);
    let taints = object["spec"]["taints"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| without(t.clone(), &["timeAdded"]))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let raw: RawNode = serde_json::from_value(json!({
        "name": object["metadata"]["name"],
        "labels": object["metadata"]["labels"].as_object().cloned().unwrap_or_default(),
        "taints": taints,
        "unschedulable": object["spec"]["unschedulable"].as_bool().unwrap_or(false),
        "ready": ready,
    }))
    .map_err(|e| FieldPath::new("node").error(e.to_string()))?;
    let raw = RawNode {
        allocatable: quantities(&object["status"]["allocatable"]),
        ..raw
    };
    raw.validate()
}

/// Where a ResourceSlice's devices are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceScope {
    /// On one node (`nodeName`).
    Node(String),
    /// Network-attached, reachable from the nodes of `allNodes` or a `nodeSelector`.
    Network(PoolReach),
}

/// A ResourceSlice: where its devices are, and its pool. A slice that chooses nodes
/// device by device (`perDeviceNodeSelection`) is network-attached, each device with
/// its own reach. `Ok(None)` for a slice that says nothing of where its devices are.
pub fn slice(object: &Value) -> Result<Option<(SliceScope, ResourcePool)>, ValidationError> {
    let spec = &object["spec"];
    let Some(scope) = slice_scope(spec)? else {
        return Ok(None);
    };
    let reaches = match scope {
        SliceScope::Network(PoolReach::PerDevice) => Some(device_reaches(spec)?),
        _ => None,
    };
    let devices: Vec<Value> = spec["devices"]
        .as_array()
        .map(|ds| {
            ds.iter()
                .map(|d| {
                    let mut d = without(
                        d.clone(),
                        &[
                            "bindsToNode",
                            "bindingConditions",
                            "bindingFailureConditions",
                            "nodeName",
                            "nodeSelector",
                            "allNodes",
                        ],
                    );
                    if let Some(taints) = d.get_mut("taints").and_then(Value::as_array_mut) {
                        // `None` (informational) and effects added later have no effect.
                        taints.retain(|t| has_effect(&t["effect"]));
                        for t in taints {
                            *t = device_taint(t);
                        }
                    }
                    d
                })
                .collect()
        })
        .unwrap_or_default();
    let raw = json!({
        "driver": spec["driver"],
        "pool": without(spec["pool"].clone(), &["resourceSliceCount"]),
        "devices": devices,
        "sharedCounters": spec["sharedCounters"].as_array().cloned().unwrap_or_default(),
    });
    let raw: RawResourcePool =
        serde_json::from_value(raw).map_err(|e| FieldPath::new("spec").error(e.to_string()))?;
    let mut pool = raw.validate()?;
    for (device, reach) in pool.devices.iter_mut().zip(reaches.into_iter().flatten()) {
        device.reach = Some(Box::new(reach));
    }
    Ok(Some((scope, pool)))
}

/// Each device's own reach in a slice with `perDeviceNodeSelection`: exactly one of
/// `nodeName` (that node), `nodeSelector` (one term) or `allNodes: true`; errors name
/// the device's field.
fn device_reaches(spec: &Value) -> Result<Vec<PoolReach>, ValidationError> {
    let devices = spec["devices"].as_array().cloned().unwrap_or_default();
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let at = FieldPath::new("spec").child("devices").index(i);
            let node = d["nodeName"].as_str().filter(|n| !n.is_empty());
            let all = d["allNodes"].as_bool() == Some(true);
            let selector = !d["nodeSelector"].is_null();
            let reach = match (node, selector, all) {
                (Some(node), false, false) => PoolReach::Selected(ReachTerm {
                    match_expressions: Vec::new(),
                    match_fields: vec![NodeSelectorRequirement {
                        key: NODE_NAME_FIELD.to_string(),
                        operator: NodeSelectorOperator::In,
                        values: vec![node.to_string()],
                    }],
                }),
                (None, true, false) => selector_reach(&d["nodeSelector"], &at.child("nodeSelector"))?,
                (None, false, true) => PoolReach::AllNodes,
                _ => {
                    return Err(at.error(
                        "must set exactly one of nodeName, nodeSelector and allNodes (perDeviceNodeSelection)",
                    ))
                }
            };
            reach.validate(&at)?;
            Ok(reach)
        })
        .collect()
}

/// Where a slice spec's devices are; errors name the field of a bad node selector.
fn slice_scope(spec: &Value) -> Result<Option<SliceScope>, ValidationError> {
    if let Some(node) = spec["nodeName"].as_str().filter(|n| !n.is_empty()) {
        return Ok(Some(SliceScope::Node(node.to_string())));
    }
    if spec["allNodes"].as_bool() == Some(true) {
        return Ok(Some(SliceScope::Network(PoolReach::AllNodes)));
    }
    if spec["perDeviceNodeSelection"].as_bool() == Some(true) {
        return Ok(Some(SliceScope::Network(PoolReach::PerDevice)));
    }
    if spec["nodeSelector"].is_null() {
        return Ok(None);
    }
    let path = FieldPath::new("spec").child("nodeSelector");
    let reach = selector_reach(&spec["nodeSelector"], &path)?;
    reach.validate(&FieldPath::new("spec"))?;
    Ok(Some(SliceScope::Network(reach)))
}

/// A node selector of exactly one term (as `resource.k8s.io/v1` demands of slices and
/// their devices), read as a reach; `path` names the `nodeSelector`.
fn selector_reach(selector: &Value, path: &FieldPath) -> Result<PoolReach, ValidationError> {
    let terms = selector["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let [term] = terms.as_slice() else {
        return Err(path
            .child("nodeSelectorTerms")
            .error(format!("must have exactly one term, not {}", terms.len())));
    };
    let at = path.child("nodeSelectorTerms").index(0);
    Ok(PoolReach::Selected(selector_term(term, &at)?))
}

/// One node selector term as the API writes it (`matchExpressions`, `matchFields`),
/// read as is: an unknown operator is an error naming the field under `at`; keys and
/// values are checked by [`ReachTerm::validate`] where the caller wants them checked.
pub fn selector_term(term: &Value, at: &FieldPath) -> Result<ReachTerm, ValidationError> {
    let requirements = |field: &str| -> Result<Vec<NodeSelectorRequirement>, ValidationError> {
        term[field]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| {
                let here = at.child(field).index(i);
                Ok(NodeSelectorRequirement {
                    key: r["key"].as_str().unwrap_or_default().to_string(),
                    operator: NodeSelectorOperator::parse(
                        &here.child("operator"),
                        r["operator"].as_str().unwrap_or_default(),
                    )?,
                    values: r["values"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|v| v.as_str().unwrap_or_default().to_string())
                        .collect(),
                })
            })
            .collect()
    };
    Ok(ReachTerm {
        match_expressions: requirements("matchExpressions")?,
        match_fields: requirements("matchFields")?,
    })
}

/// A device taint in the form the model reads: `timeAdded` (which tolerationSeconds
/// count from) as milliseconds.
fn device_taint(taint: &Value) -> Value {
    let mut out = without(taint.clone(), &["timeAdded"]);
    if let Some(ms) = taint["timeAdded"].as_str().and_then(api::parse_rfc3339_ms) {
        out["timeAddedMs"] = json!(ms);
    }
    out
}

/// A DeviceTaintRule (`resource.k8s.io/v1beta2`): one taint for the devices its
/// selector picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintRule {
    /// The rule's name.
    pub name: String,
    /// Which devices; `None` (no selector) picks none, an empty one picks every device.
    pub selector: Option<TaintSelector>,
    /// The taint; `None` when its effect does nothing (`None`, or one gangway does not
    /// know).
    pub taint: Option<DeviceTaint>,
}

/// The devices a DeviceTaintRule picks: each field set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaintSelector {
    /// Driver name.
    pub driver: Option<String>,
    /// Pool name.
    pub pool: Option<String>,
    /// Device name.
    pub device: Option<String>,
}

impl TaintRule {
    /// The taint this rule puts on `device`, if it picks it and its taint does anything.
    pub fn taint_for(&self, device: &DeviceId) -> Option<&DeviceTaint> {
        let s = self.selector.as_ref()?;
        let matches = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        let picked = matches(&s.driver, &device.driver)
            && matches(&s.pool, &device.pool)
            && matches(&s.device, &device.device);
        picked.then_some(self.taint.as_ref()).flatten()
    }
}

/// Reads a DeviceTaintRule, naming the field at fault.
pub fn taint_rule(object: &Value) -> Result<TaintRule, ValidationError> {
    let spec = FieldPath::new("spec");
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
    let selector = match &object["spec"]["deviceSelector"] {
        Value::Null => None,
        s => Some(TaintSelector {
            driver: text(&s["driver"]),
            pool: text(&s["pool"]),
            device: text(&s["device"]),
        }),
    };
    let raw = &object["spec"]["taint"];
    let path = spec.child("taint");
    let key = raw["key"].as_str().unwrap_or_default();
    validate_qualified_name(&path.child("key"), key)?;
    let value = raw["value"].as_str().unwrap_or_default();
    validate_label_value(&path.child("value"), value)?;
    let taint = if has_effect(&raw["effect"]) {
        let effect = raw["effect"].as_str().unwrap_or_default();
        Some(DeviceTaint {
            key: key.to_string(),
            value: value.to_string(),
            effect: DeviceTaintEffect::parse(&path.child("effect"), effect)?,
            time_added_ms: raw["timeAdded"].as_str().and_then(api::parse_rfc3339_ms),
        })
    } else {
        None
    };
    Ok(TaintRule {
        name: object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        selector,
        taint,
    })
}

/// Whether a device taint's effect does something: `NoSchedule` or `NoExecute`.
/// Kubernetes asks consumers to treat `None` and any effect they do not know as none.
fn has_effect(effect: &Value) -> bool {
    matches!(effect.as_str(), Some("NoSchedule" | "NoExecute"))
}

/// The slices of one node-local pool at its newest generation, merged into one
/// ResourceSlice-shaped object once all `resourceSliceCount` of them are there.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolSlices {
    /// Every slice is there: one object with all their devices and shared counters.
    Complete {
        /// The slices' names, for messages.
        names: Vec<String>,
        /// The merged slice.
        merged: Value,
    },
    /// Some slices of the newest generation are missing (still being written).
    Incomplete {
        /// The slices seen.
        names: Vec<String>,
        /// How many the pool has.
        want: u64,
    },
}

/// A device pool: (node, driver, pool name); the node is empty for a network-attached
/// pool.
pub type PoolKey = (String, String, String);

/// The pool a ResourceSlice belongs to, if it is node-local or network-attached.
pub fn pool_key(object: &Value) -> Option<PoolKey> {
    let spec = &object["spec"];
    let network = spec["allNodes"].as_bool() == Some(true)
        || !spec["nodeSelector"].is_null()
        || spec["perDeviceNodeSelection"].as_bool() == Some(true);
    let node = match spec["nodeName"].as_str().filter(|n| !n.is_empty()) {
        Some(node) => node,
        None if network => "",
        None => return None,
    };
    Some((
        node.to_string(),
        spec["driver"].as_str().unwrap_or_default().to_string(),
        spec["pool"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    ))
}

/// Groups slices (name, object) by pool ([`pool_key`]: node-local pools by node, driver
/// and pool, network-attached ones by driver and pool), keeps each pool's newest
/// generation, and merges its slices (a pool may span several, as
/// `spec.pool.resourceSliceCount` says; the first by name gives the rest of the spec).
/// Pools `current` says are known at their newest generation are left out (nothing to
/// merge).
pub fn node_pools(
    slices: Vec<(String, std::sync::Arc<Value>)>,
    current: impl Fn(&PoolKey, u64) -> bool,
) -> Vec<PoolSlices> {
    type Named = (String, std::sync::Arc<Value>);
    let mut pools: BTreeMap<PoolKey, Vec<Named>> = BTreeMap::new();
    for (name, object) in slices {
        let Some(key) = pool_key(&object) else {
            continue;
        };
        pools.entry(key).or_default().push((name, object));
    }
    let generation = |o: &Value| o["spec"]["pool"]["generation"].as_u64().unwrap_or(0);
    pools
        .into_iter()
        .filter_map(|(key, list)| {
            let newest = list.iter().map(|(_, o)| generation(o)).max().unwrap_or(0);
            (!current(&key, newest)).then_some((list, newest))
        })
        .map(|(mut list, newest)| {
            list.retain(|(_, o)| generation(o) == newest);
            list.sort_by(|a, b| a.0.cmp(&b.0));
            let want = list
                .iter()
                .map(|(_, o)| {
                    o["spec"]["pool"]["resourceSliceCount"]
                        .as_u64()
                        .unwrap_or(1)
                })
                .max()
                .unwrap_or(1);
            let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
            if (list.len() as u64) < want {
                return PoolSlices::Incomplete { names, want };
            }
            let mut merged = (*list[0].1).clone();
            let concat = |field: &str| -> Value {
                Value::Array(
                    list.iter()
                        .flat_map(|(_, o)| o["spec"][field].as_array().cloned().unwrap_or_default())
                        .collect(),
                )
            };
            merged["spec"]["devices"] = concat("devices");
            merged["spec"]["sharedCounters"] = concat("sharedCounters");
            PoolSlices::Complete { names, merged }
        })
        .collect()
}

/// A DeviceClass.
pub fn device_class(object: &Value) -> Result<DeviceClass, ValidationError> {
    let raw = json!({
        "name": object["metadata"]["name"],
        "spec": without(object["spec"].clone(), &[]),
    });
    let raw: RawDeviceClass =
        serde_json::from_value(raw).map_err(|e| FieldPath::new("spec").error(e.to_string()))?;
    raw.validate()
}

/// A policy/v1 PodDisruptionBudget as preemption reads it: its selector and
/// `status.disruptionsAllowed` (0 until the disruption controller wrote it). A budget
/// with a selector gangway cannot read is refused (the caller skips it, as
/// kube-scheduler does).
pub fn disruption_budget(object: &Value) -> Result<DisruptionBudget, ValidationError> {
    let selector = match &object["spec"]["selector"] {
        Value::Null => None,
        raw => {
            let path = FieldPath::new("spec").child("selector");
            let raw: RawLabelSelector =
                serde_json::from_value(raw.clone()).map_err(|e| path.error(e.to_string()))?;
            Some(convert_label_selector(&path, &raw)?)
        }
    };
    let allowed = object["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
    Ok(DisruptionBudget {
        namespace: object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        name: object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        selector,
        disruptions_allowed: u32::try_from(allowed.max(0)).unwrap_or(u32::MAX),
    })
}

/// ResourceClaims by namespace and name.
pub type ClaimIndex = BTreeMap<(String, String), std::sync::Arc<Value>>;

/// The name of the ResourceClaim behind pod claim `entry`: given directly, or made
/// from a template by the resourceclaim controller and recorded in the pod's status.
fn claim_object_name(pod: &Value, entry: &Value) -> Result<String, PodProblem> {
    let claim = entry["name"].as_str().unwrap_or_default();
    if let Some(name) = entry["resourceClaimName"].as_str() {
        return Ok(name.to_string());
    }
    if entry["resourceClaimTemplateName"].is_string() {
        let made = pod["status"]["resourceClaimStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"].as_str() == Some(claim)))
            .and_then(|s| s["resourceClaimName"].as_str());
        return made.map(String::from).ok_or_else(|| {
            PodProblem::Waiting(format!(
                "waiting for the ResourceClaim of pod claim \"{claim}\" to be created from its template"
            ))
        });
    }
    Err(PodProblem::Invalid(format!(
        "spec.resourceClaims[{claim}]: names neither resourceClaimName nor resourceClaimTemplateName"
    )))
}

/// The ResourceClaim objects the pod's claims name, as far as they are known yet (a
/// claim from a template has a name once the controller recorded it in the status).
pub fn claim_object_names(pod: &Value) -> Vec<String> {
    pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| claim_object_name(pod, entry).ok())
        .collect()
}

/// The pod's claims with their ResourceClaims' device requests, and the claim object names.
fn pod_claims(
    pod: &Value,
    namespace: &str,
    claims: &ClaimIndex,
) -> Result<(Vec<RawPodClaim>, BTreeMap<String, String>), PodProblem> {
    let mut out = Vec::new();
    let mut names = BTreeMap::new();
    for (i, entry) in pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let claim = entry["name"].as_str().unwrap_or_default().to_string();
        let object_name = claim_object_name(pod, entry)?;
        let object = claims
            .get(&(namespace.to_string(), object_name.clone()))
            .ok_or_else(|| {
                PodProblem::Waiting(format!(
                    "waiting for ResourceClaim {namespace}/{object_name} (pod claim \"{claim}\")"
                ))
            })?;
        let devices = &object["spec"]["devices"];
        let raw = json!({
            "name": claim,
            "requests": devices["requests"].as_array().cloned().unwrap_or_default(),
            "constraints": devices["constraints"].as_array().cloned().unwrap_or_default(),
            "config": devices["config"].as_array().cloned().unwrap_or_default(),
        });
        let raw: RawPodClaim = serde_json::from_value(raw).map_err(|e| {
            PodProblem::Invalid(format!(
                "ResourceClaim {namespace}/{object_name}: spec.devices: {e} (pod spec.resourceClaims[{i}])"
            ))
        })?;
        names.insert(claim, object_name);
        out.push(raw);
    }
    Ok((out, names))
}

/// Requests of a pod as the scheduler counts them: the sum over containers, at least
/// the largest init container's, plus the pod overhead.
pub(crate) fn pod_requests(pod: &Value) -> Result<Resources, PodProblem> {
    let spec = &pod["spec"];
    // Each container list's requests, with the field path an error names.
    let requests = |list: &'static str| {
        spec[list]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(move |(i, c)| {
                let path = FieldPath::new("spec")
                    .child(list)
                    .index(i)
                    .child("resources")
                    .child("requests");
                Resources::from_raw(
                    &path,
                    &quantities(&c["resources"]["requests"]),
                    ResourceListKind::Requests,
                )
                .map_err(invalid)
            })
    };
    let mut sum = Resources::zero();
    for r in requests("containers") {
        sum = sum.saturating_add(&r?);
    }
    for r in requests("initContainers") {
        sum = sum.elementwise_max(&r?);
    }
    let overhead = Resources::from_raw(
        &FieldPath::new("spec").child("overhead"),
        &quantities(&spec["overhead"]),
        ResourceListKind::Requests,
    )
    .map_err(invalid)?;
    Ok(sum.saturating_add(&overhead))
}

fn host_ports(pod: &Value) -> Vec<Value> {
    pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .filter(|p| p["hostPort"].as_i64().is_some_and(|h| h > 0))
        .map(
            |p| json!({"port": p["hostPort"], "protocol": p["protocol"].as_str().unwrap_or("TCP")}),
        )
        .collect()
}

/// Affinity with the pod-affinity fields gangway does not read removed when empty
/// (a non-empty one stays, and the conversion names it).
fn affinity(pod: &Value) -> Value {
    let mut a = pod["spec"]["affinity"].clone();
    for kind in ["podAffinity", "podAntiAffinity"] {
        for list in [
            "requiredDuringSchedulingIgnoredDuringExecution",
            "preferredDuringSchedulingIgnoredDuringExecution",
        ] {
            // `get_mut`, not indexing: indexing a missing key would insert a null.
            let terms = a
                .get_mut(kind)
                .and_then(|k| k.get_mut(list))
                .and_then(Value::as_array_mut);
            if let Some(terms) = terms {
                for t in terms {
                    let term = if t.get("podAffinityTerm").is_some() {
                        &mut t["podAffinityTerm"]
                    } else {
                        t
                    };
                    // (the key exists, so indexing inserts nothing)
                    if let Some(map) = term.as_object_mut() {
                        for f in [
                            "namespaces",
                            "namespaceSelector",
                            "matchLabelKeys",
                            "mismatchLabelKeys",
                        ] {
                            let empty = map.get(f).is_some_and(|v| {
                                v.is_null()
                                    || v.as_array().is_some_and(|a| a.is_empty())
                                    || v.as_object().is_some_and(|o| o.is_empty())
                            });
                            if empty {
                                map.remove(f);
                            }
                        }
                    }
                }
            }
        }
    }
    a
}

/// Whether the pod's claim `claim` names its ResourceClaim directly
/// (`resourceClaimName`), rather than through a template.
pub fn names_claim_directly(pod: &Value, claim: &str) -> bool {
    pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"].as_str() == Some(claim) && c["resourceClaimName"].is_string())
}

/// Another pod naming the same ResourceClaim, as the ingest's pod index knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharer {
    /// Pod name.
    pub name: String,
    /// Pod uid.
    pub uid: String,
    /// Whether gangway schedules it.
    pub ours: bool,
    /// The gang it names, if any.
    pub gang: Option<String>,
    /// Whether it is bound or already submitted (placed or queued with the claim).
    pub placed: bool,
    /// Whether it is being deleted: it still uses the claim, but no pod follows it now.
    pub going: bool,
}

/// What a pod does with one of its ResourceClaims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareRole {
    /// No other pod names it: the pod's own claim.
    Alone,
    /// Other pods of its gang name it and it allocates it for them.
    Carrier,
    /// Other pods of its gang name it and one of them allocates (or allocated) it.
    Follower,
}

/// How pod `pod` of gang `gang` uses its ResourceClaim `object_name` (pod claim `claim`), given the
/// other unfinished pods naming it (`others`) and the object. Pods of one gang share a
/// claim: the first of them by uid allocates it when it is not allocated for another of
/// them and none of them is placed already (pods being deleted left out); the others
/// follow it to its node. A claim also named or
/// reserved by a pod outside the gang (or another scheduler's) is refused, as is one
/// named by more pods than `reservedFor` can hold.
pub fn share_role(
    pod: &Value,
    gang: Option<&str>,
    claim: &str,
    object_name: &str,
    object: Option<&Value>,
    others: &[Sharer],
) -> Result<ShareRole, PodProblem> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let reserved: Vec<(&str, &str)> = object
        .into_iter()
        .flat_map(|o| o["status"]["reservedFor"].as_array().into_iter().flatten())
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default(),
                c["uid"].as_str().unwrap_or_default(),
            )
        })
        .filter(|(_, u)| *u != uid)
        .collect();
    let mut strangers: Vec<String> = others
        .iter()
        .filter(|o| !o.ours || gang.is_none() || o.gang.as_deref() != gang)
        .map(|o| o.name.clone())
        .collect();
    for (name, consumer) in &reserved {
        if !others.iter().any(|o| o.uid == *consumer) && !strangers.iter().any(|s| s == name) {
            strangers.push(name.to_string());
        }
    }
    if !strangers.is_empty() {
        strangers.sort();
        strangers.dedup();
        let within = match gang {
            Some(g) => format!("the pods of one gang it schedules (here {namespace}/{g})"),
            None => "the pods of one gang it schedules, and this pod is in none".to_string(),
        };
        return Err(PodProblem::Invalid(format!(
            "spec.resourceClaims[{claim}]: ResourceClaim {namespace}/{object_name} is also used by pod {}; gangway shares a claim only among {within} (give each pod its own claim, e.g. through resourceClaimTemplateName)",
            strangers.join(", ")
        )));
    }
    if others.len() + 1 > CLAIM_CONSUMERS_MAX {
        return Err(PodProblem::Invalid(format!(
            "spec.resourceClaims[{claim}]: ResourceClaim {namespace}/{object_name} is named by {} pods; at most {CLAIM_CONSUMERS_MAX} can share a claim",
            others.len() + 1
        )));
    }
    // A pod being deleted is left out of the choice: following it would leave this pod
    // without a carrier once it is gone.
    let staying: Vec<&Sharer> = others.iter().filter(|o| !o.going).collect();
    if staying.is_empty() {
        return Ok(ShareRole::Alone);
    }
    // Allocated for another of its pods (an allocation reserved for none, or for this
    // pod only or pods going, is left from an earlier placement: the binder replaces it).
    let held = object.is_some_and(|o| !o["status"]["allocation"].is_null())
        && reserved
            .iter()
            .any(|(_, consumer)| staying.iter().any(|o| o.uid == *consumer));
    let first = staying.iter().all(|o| o.uid.as_str() > uid);
    if !held && first && !staying.iter().any(|o| o.placed) {
        Ok(ShareRole::Carrier)
    } else {
        Ok(ShareRole::Follower)
    }
}

/// A pod's scheduling spec and the ResourceClaim object name of each pod claim.
pub fn pod_spec(
    pod: &Value,
    claims: &ClaimIndex,
) -> Result<(PodSpec, BTreeMap<String, String>), PodProblem> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let (raw_claims, claim_names) = pod_claims(pod, namespace, claims)?;
    let tolerations = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let raw = json!({
        "nodeSelector": pod["spec"]["nodeSelector"].as_object().cloned().unwrap_or_default(),
        "affinity": affinity(pod),
        "tolerations": tolerations,
        "hostPorts": host_ports(pod),
        "priority": pod["spec"]["priority"].as_i64().unwrap_or(0),
        "labels": text_map(&pod["metadata"]["labels"]),
    });
    let mut raw: RawPodSpec =
        serde_json::from_value(raw).map_err(|e| PodProblem::Invalid(format!("spec: {e}")))?;
    raw.claims = raw_claims;
    raw.preemption_policy = pod["spec"]["preemptionPolicy"].as_str().map(str::to_string);
    let mut spec = raw.validate(&FieldPath::new("spec")).map_err(invalid)?;
    spec.requests = pod_requests(pod)?;
    spec.validate(&FieldPath::new("spec")).map_err(invalid)?;
    Ok((spec, claim_names))
}

/// A pod another scheduler bound, as the ledger records it: its requests, labels,
/// priority, host ports and required anti-affinity (when gangway can read them; an
/// affinity it cannot read is left out rather than the pod), and the devices its
/// allocated ResourceClaims hold (claims not allocated yet hold nothing). A claim in
/// `counted` (namespace, name) is left out: several pods sharing one claim hold its
/// devices once, and the caller counts each claim for the first of them (by uid), so
/// when that pod goes the next one carries the devices in the same ledger command.
pub fn observed_pod(
    pod: &Value,
    claims: &ClaimIndex,
    counted: &mut BTreeSet<(String, String)>,
) -> Result<ObservedPod, PodProblem> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let uid = pod["metadata"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| PodProblem::Invalid("metadata.uid: missing".into()))?;
    let raw = json!({
        "affinity": affinity(pod),
        "hostPorts": host_ports(pod),
        "priority": pod["spec"]["priority"].as_i64().unwrap_or(0),
        "labels": text_map(&pod["metadata"]["labels"]),
    });
    let read = serde_json::from_value::<RawPodSpec>(raw)
        .ok()
        .and_then(|raw| raw.validate(&FieldPath::new("spec")).ok());
    let mut summary = match read {
        Some(spec) => PodSummary::from_spec(&spec),
        None => PodSummary {
            priority: i32::try_from(pod["spec"]["priority"].as_i64().unwrap_or(0)).unwrap_or(0),
            labels: text_map(&pod["metadata"]["labels"]),
            host_ports: serde_json::from_value(Value::Array(host_ports(pod))).unwrap_or_default(),
            ..PodSummary::default()
        },
    };
    summary.requests = pod_requests(pod)?;
    summary.devices = allocated_devices(pod, namespace, claims, counted);
    summary.uid = Some(uid.to_string());
    Ok(ObservedPod {
        namespace: namespace.to_string(),
        uid: uid.to_string(),
        pod: summary,
    })
}

/// The devices the pod's allocated ResourceClaims hold (from `status.allocation`).
fn allocated_devices(
    pod: &Value,
    namespace: &str,
    claims: &ClaimIndex,
    counted: &mut BTreeSet<(String, String)>,
) -> Vec<DeviceAllocation> {
    let mut out = Vec::new();
    for entry in pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Ok(object_name) = claim_object_name(pod, entry) else {
            continue;
        };
        let key = (namespace.to_string(), object_name);
        let Some(claim) = claims.get(&key) else {
            continue;
        };
        let results = claim["status"]["allocation"]["devices"]["results"].as_array();
        if results.is_some_and(|r| !r.is_empty()) && !counted.insert(key) {
            continue;
        }
        let name = entry["name"].as_str().unwrap_or_default();
        out.extend(
            results
                .into_iter()
                .flatten()
                .filter_map(|r| result_allocation(name, r)),
        );
    }
    out
}

/// One result of a claim's `status.allocation` as a device allocation of pod claim
/// `pod_claim`, if it names a device.
fn result_allocation(pod_claim: &str, r: &Value) -> Option<DeviceAllocation> {
    let (Some(driver), Some(pool), Some(device)) = (
        r["driver"].as_str(),
        r["pool"].as_str(),
        r["device"].as_str(),
    ) else {
        return None;
    };
    let consumed_capacity = r["consumedCapacity"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, q)| {
            let q = DeviceQuantity::parse(q.as_str()?).ok()?;
            Some((name.clone(), q))
        })
        .collect();
    Some(DeviceAllocation {
        claim: pod_claim.to_string(),
        request: r["request"].as_str().unwrap_or_default().to_string(),
        device: DeviceId::new(driver, pool, device),
        admin_access: if r["adminAccess"].as_bool() == Some(true) {
            AdminAccess::Enabled
        } else {
            AdminAccess::Disabled
        },
        tolerations: Vec::new(),
        share_id: r["shareID"].as_str().map(String::from),
        consumed_capacity,
    })
}

/// The network-attached devices (those `is_network` says are) that an allocated
/// ResourceClaim holds, as one observed hold keyed `namespace/~observed/name`; `None`
/// when it holds none (admin access takes nothing) or any of `ours` (pod uids gangway
/// placed) consumes it, since gangway holds those itself.
pub fn observed_network_hold(
    (namespace, name): &(String, String),
    claim: &Value,
    is_network: &dyn Fn(&DeviceId) -> bool,
    ours: &dyn Fn(&str) -> bool,
) -> Option<NetworkHold> {
    let consumers = claim["status"]["reservedFor"].as_array();
    if consumers
        .into_iter()
        .flatten()
        .any(|c| c["uid"].as_str().is_some_and(ours))
    {
        return None;
    }
    let devices: Vec<DeviceAllocation> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| result_allocation(name, r))
        .filter(|a| a.admin_access == AdminAccess::Disabled && is_network(&a.device))
        .collect();
    (!devices.is_empty()).then(|| NetworkHold {
        member: MemberKey::new(namespace.clone(), OBSERVED_GANG, name.clone()),
        devices,
        claim: None,
    })
}

#[cfg(test)]
#[path = "objects_tests.rs"]
mod tests;
