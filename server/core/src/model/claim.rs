//! Resource claims: what a pod asks of devices, and what it was given.
//!
//! Owns [`PodClaim`] (a pod's claim: requests, constraints, config, as a
//! ResourceClaimTemplate's spec), [`DeviceRequest`] (`exactly` one class of device with
//! selectors, ExactCount or All, admin access, tolerations and capacity requirements; or
//! `firstAvailable` sub-requests in preference order), [`DeviceConstraint`]
//! (matchAttribute, distinctAttribute), [`DeviceToleration`], [`DeviceAllocation`]
//! (one allocated device: request, device id, consumed capacity, share id, as the
//! upstream allocation result records it) and the Kubernetes-shaped `Raw*` forms.
//! Invariants of validated claims: names are unique DNS labels; counts are within
//! 1..=[`CLAIM_DEVICES_MAX`] (Kubernetes' AllocationResultsMaxSize: at most 32 devices
//! per claim, which also bounds the ExactCount sum); at most [`CLAIM_REQUESTS_MAX`]
//! requests, [`SUB_REQUESTS_MAX`] sub-requests each; selectors compile to bool;
//! constraints name existing requests. Device classes are resolved later, against the
//! ledger's classes (see [`PodClaim::check_classes`]). Called by pod spec validation,
//! the engine (allocation) and the ledger (allocations kept in pod summaries).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::device::{
    convert_configs, convert_selectors, validate_attribute_name, validate_configs,
    validate_selectors, CelSelector, DeviceClass, DeviceId, DeviceQuantity, DeviceTaint,
    DeviceTaintEffect, OpaqueConfig, RawConfig, RawSelector,
};
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::{
    validate_dns_label, validate_dns_subdomain, validate_label_value, validate_qualified_name,
};
use crate::model::pod::TolerationOperator;

/// Most devices allocated to one claim (Kubernetes' AllocationResultsMaxSize).
pub const CLAIM_DEVICES_MAX: u32 = 32;
/// Most requests in one claim (Kubernetes' DeviceRequestsMaxSize).
pub const CLAIM_REQUESTS_MAX: usize = 32;
/// Most sub-requests of a firstAvailable request (Kubernetes' FirstAvailableDeviceRequestMaxSize).
pub const SUB_REQUESTS_MAX: usize = 8;
/// Most constraints in one claim (Kubernetes' DeviceConstraintsMaxSize).
pub const CLAIM_CONSTRAINTS_MAX: usize = 32;
/// Most tolerations in one request (Kubernetes' DeviceTolerationsMaxLength).
pub const REQUEST_TOLERATIONS_MAX: usize = 16;
/// Most claims on one pod.
pub const POD_CLAIMS_MAX: usize = 16;
/// Name of the claim that serves a pod's device-backed extended resources.
pub const EXTENDED_RESOURCE_CLAIM: &str = "extended-resources";

/// Whether a request asks for admin access (monitoring a device in use, consuming nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AdminAccess {
    /// Ordinary access: the device is taken.
    #[default]
    Disabled,
    /// Admin access: the device may be in use and is not taken.
    Enabled,
}

fn is_disabled(access: &AdminAccess) -> bool {
    *access == AdminAccess::Disabled
}

/// How many devices a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllocationMode {
    /// Exactly this many (1..=[`CLAIM_DEVICES_MAX`]).
    ExactCount(u32),
    /// Every matching device on the node (at least one).
    All,
}

/// A toleration of device taints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceToleration {
    /// Taint key; empty with `Exists` tolerates every taint.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// How key and value are compared.
    pub operator: TolerationOperator,
    /// Value compared by `Equal`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Effect tolerated; `None` tolerates every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<DeviceTaintEffect>,
    /// How long a NoExecute taint is tolerated, in seconds (eviction only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

impl DeviceToleration {
    /// Whether this toleration tolerates `taint` (Kubernetes' ToleratesTaint).
    pub fn tolerates(&self, taint: &DeviceTaint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => true,
            TolerationOperator::Equal => self.value == taint.value,
        }
    }
}

/// One concrete way to satisfy a request: a class, selectors, a count and its options.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExactRequest {
    /// The device class.
    pub device_class_name: String,
    /// Selectors (besides the class's), all of which must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<CelSelector>,
    /// How many devices.
    pub allocation_mode: AllocationMode,
    /// Admin access.
    #[serde(default, skip_serializing_if = "is_disabled")]
    pub admin_access: AdminAccess,
    /// Tolerated device taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    /// Capacity wanted of each device (qualified capacity name → amount).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, DeviceQuantity>,
}

impl ExactRequest {
    /// One device of `class`, nothing else asked.
    pub fn one_of(class: impl Into<String>) -> Self {
        Self {
            device_class_name: class.into(),
            selectors: Vec::new(),
            allocation_mode: AllocationMode::ExactCount(1),
            admin_access: AdminAccess::Disabled,
            tolerations: Vec::new(),
            capacity: BTreeMap::new(),
        }
    }
}

/// One alternative of a firstAvailable request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SubRequest {
    /// Name (a DNS label), unique within the request.
    pub name: String,
    /// What it asks (admin access is not allowed here).
    pub exact: ExactRequest,
}

/// What a request asks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RequestSpec {
    /// Exactly this.
    Exactly(ExactRequest),
    /// The first of these that can be satisfied, in preference order.
    FirstAvailable(Vec<SubRequest>),
}

/// One request of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceRequest {
    /// Name (a DNS label), unique within the claim.
    pub name: String,
    /// What it asks.
    pub spec: RequestSpec,
}

/// A rule across the devices of several requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConstraintRule {
    /// Every device has this attribute, with one value for all.
    MatchAttribute(String),
    /// Every device has this attribute, with a different value each.
    DistinctAttribute(String),
}

/// A constraint over some (or all) requests of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceConstraint {
    /// The requests it covers; empty covers all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// The rule.
    pub rule: ConstraintRule,
}

/// Driver config for some (or all) requests of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimConfig {
    /// The requests it applies to; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// The config.
    pub opaque: OpaqueConfig,
}

/// A pod's resource claim (the spec of a ResourceClaimTemplate, one claim per pod).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodClaim {
    /// Name (a DNS label), unique within the pod.
    pub name: String,
    /// Requests.
    pub requests: Vec<DeviceRequest>,
    /// Constraints across requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<DeviceConstraint>,
    /// Driver config.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<ClaimConfig>,
}

impl PodClaim {
    /// Checks the claim on its own (classes are checked by [`PodClaim::check_classes`]).
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_dns_label(&path.child("name"), &self.name)?;
        let requests_path = path.child("requests");
        if self.requests.is_empty() || self.requests.len() > CLAIM_REQUESTS_MAX {
            return Err(requests_path.error(format!(
                "must have 1 to {CLAIM_REQUESTS_MAX} requests, got {}",
                self.requests.len()
            )));
        }
        let mut names = BTreeSet::new();
        let mut counted: u64 = 0;
        for (i, request) in self.requests.iter().enumerate() {
            let at = requests_path.index(i);
            validate_dns_label(&at.child("name"), &request.name)?;
            if !names.insert(request.name.as_str()) {
                return Err(at
                    .child("name")
                    .error(format!("duplicate request name \"{}\"", request.name)));
            }
            match &request.spec {
                RequestSpec::Exactly(exact) => {
                    validate_exact(&at.child("exactly"), exact)?;
                    if let AllocationMode::ExactCount(n) = exact.allocation_mode {
                        counted += u64::from(n);
                    }
                }
                RequestSpec::FirstAvailable(subs) => {
                    let subs_path = at.child("firstAvailable");
                    if subs.is_empty() || subs.len() > SUB_REQUESTS_MAX {
                        return Err(subs_path.error(format!(
                            "must have 1 to {SUB_REQUESTS_MAX} sub-requests, got {}",
                            subs.len()
                        )));
                    }
                    let mut sub_names = BTreeSet::new();
                    let mut most = 0;
                    for (j, sub) in subs.iter().enumerate() {
                        let sub_at = subs_path.index(j);
                        validate_dns_label(&sub_at.child("name"), &sub.name)?;
                        if !sub_names.insert(sub.name.as_str()) {
                            return Err(sub_at
                                .child("name")
                                .error(format!("duplicate sub-request name \"{}\"", sub.name)));
                        }
                        if sub.exact.admin_access == AdminAccess::Enabled {
                            return Err(sub_at
                                .child("adminAccess")
                                .error("admin access is not allowed in sub-requests"));
                        }
                        validate_exact(&sub_at, &sub.exact)?;
                        if let AllocationMode::ExactCount(n) = sub.exact.allocation_mode {
                            most = most.max(n);
                        }
                    }
                    counted += u64::from(most);
                }
            }
        }
        if counted > u64::from(CLAIM_DEVICES_MAX) {
            return Err(requests_path.error(format!(
                "the requests ask for {counted} devices; a claim holds at most {CLAIM_DEVICES_MAX}"
            )));
        }
        let constraints_path = path.child("constraints");
        if self.constraints.len() > CLAIM_CONSTRAINTS_MAX {
            return Err(constraints_path.error(format!(
                "at most {CLAIM_CONSTRAINTS_MAX} constraints, got {}",
                self.constraints.len()
            )));
        }
        for (i, constraint) in self.constraints.iter().enumerate() {
            let at = constraints_path.index(i);
            check_request_refs(&at.child("requests"), &constraint.requests, &names)?;
            match &constraint.rule {
                ConstraintRule::MatchAttribute(name) => {
                    validate_constraint_attribute(&at.child("matchAttribute"), name)?
                }
                ConstraintRule::DistinctAttribute(name) => {
                    validate_constraint_attribute(&at.child("distinctAttribute"), name)?
                }
            }
        }
        let config_path = path.child("config");
        let opaque: Vec<OpaqueConfig> = self.config.iter().map(|c| c.opaque.clone()).collect();
        validate_configs(&config_path, &opaque)?;
        for (i, config) in self.config.iter().enumerate() {
            check_request_refs(
                &config_path.index(i).child("requests"),
                &config.requests,
                &names,
            )?;
        }
        Ok(())
    }

    /// Checks that every device class the claim names exists in `classes`; the error
    /// names the field (`…requests[1].exactly.deviceClassName`).
    pub fn check_classes(
        &self,
        path: &FieldPath,
        classes: &BTreeMap<String, DeviceClass>,
    ) -> Result<(), ValidationError> {
        for (i, request) in self.requests.iter().enumerate() {
            let at = path.child("requests").index(i);
            let unknown = |at: FieldPath, name: &str| {
                at.child("deviceClassName")
                    .error(format!("device class \"{name}\" not found"))
            };
            match &request.spec {
                RequestSpec::Exactly(exact) => {
                    if !classes.contains_key(&exact.device_class_name) {
                        return Err(unknown(at.child("exactly"), &exact.device_class_name));
                    }
                }
                RequestSpec::FirstAvailable(subs) => {
                    for (j, sub) in subs.iter().enumerate() {
                        if !classes.contains_key(&sub.exact.device_class_name) {
                            return Err(unknown(
                                at.child("firstAvailable").index(j),
                                &sub.exact.device_class_name,
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn validate_constraint_attribute(path: &FieldPath, name: &str) -> Result<(), ValidationError> {
    if !name.contains('/') {
        return Err(path.error(format!("\"{name}\" must be fully qualified (domain/name)")));
    }
    validate_attribute_name(path, name)
}

fn check_request_refs(
    path: &FieldPath,
    refs: &[String],
    names: &BTreeSet<&str>,
) -> Result<(), ValidationError> {
    for (j, name) in refs.iter().enumerate() {
        let base = name.split_once('/').map_or(name.as_str(), |(b, _)| b);
        if !names.contains(base) {
            return Err(path
                .index(j)
                .error(format!("request \"{name}\" is not in the claim")));
        }
    }
    Ok(())
}

fn validate_exact(path: &FieldPath, exact: &ExactRequest) -> Result<(), ValidationError> {
    validate_dns_subdomain(&path.child("deviceClassName"), &exact.device_class_name)?;
    validate_selectors(&path.child("selectors"), &exact.selectors)?;
    if let AllocationMode::ExactCount(n) = exact.allocation_mode {
        if n == 0 || n > CLAIM_DEVICES_MAX {
            return Err(path.child("count").error(format!(
                "count {n} out of range 1..={CLAIM_DEVICES_MAX} (devices per claim)"
            )));
        }
    }
    let tolerations = path.child("tolerations");
    if exact.tolerations.len() > REQUEST_TOLERATIONS_MAX {
        return Err(tolerations.error(format!(
            "at most {REQUEST_TOLERATIONS_MAX} tolerations, got {}",
            exact.tolerations.len()
        )));
    }
    for (i, t) in exact.tolerations.iter().enumerate() {
        validate_device_toleration(&tolerations.index(i), t)?;
    }
    for name in exact.capacity.keys() {
        validate_attribute_name(&path.child("capacity").child("requests").key(name), name)?;
    }
    Ok(())
}

fn validate_device_toleration(
    path: &FieldPath,
    t: &DeviceToleration,
) -> Result<(), ValidationError> {
    if t.key.is_empty() {
        if t.operator != TolerationOperator::Exists {
            return Err(path
                .child("operator")
                .error("an empty key needs operator Exists"));
        }
    } else {
        validate_qualified_name(&path.child("key"), &t.key)?;
    }
    match t.operator {
        TolerationOperator::Exists if !t.value.is_empty() => {
            return Err(path
                .child("value")
                .error("must be empty when operator is Exists"))
        }
        TolerationOperator::Equal => validate_label_value(&path.child("value"), &t.value)?,
        TolerationOperator::Exists => {}
    }
    if t.toleration_seconds.is_some() && t.effect != Some(DeviceTaintEffect::NoExecute) {
        return Err(path
            .child("tolerationSeconds")
            .error("only allowed with effect NoExecute"));
    }
    Ok(())
}

/// Checks a pod's claims: each valid, names unique, at most [`POD_CLAIMS_MAX`].
pub fn validate_claims(path: &FieldPath, claims: &[PodClaim]) -> Result<(), ValidationError> {
    if claims.len() > POD_CLAIMS_MAX {
        return Err(path.error(format!(
            "at most {POD_CLAIMS_MAX} claims per pod, got {}",
            claims.len()
        )));
    }
    let mut names = BTreeSet::new();
    for (i, claim) in claims.iter().enumerate() {
        let at = path.index(i);
        claim.validate(&at)?;
        if !names.insert(claim.name.as_str()) || claim.name == EXTENDED_RESOURCE_CLAIM {
            return Err(at.child("name").error(format!(
                "duplicate or reserved claim name \"{}\"",
                claim.name
            )));
        }
    }
    Ok(())
}

/// How many pods may share one ResourceClaim (upstream's `reservedFor` limit).
pub const CLAIM_CONSUMERS_MAX: usize = 256;

/// A ResourceClaim object that several pods name (Kubernetes `resourceClaimName`). Its
/// devices are allocated once, on one node: one consumer there *carries* the
/// allocation (its spec has a pod claim named `pod_claim`, its slot the devices), the
/// others only name it and must be placed on the carrier's node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClaimShare {
    /// The pod's own name for the claim.
    pub pod_claim: String,
    /// The shared object, `namespace/name`.
    pub claim: String,
}

/// Checks a pod's shared claims: valid names, each pod claim and each object once.
pub fn validate_shares(path: &FieldPath, shares: &[ClaimShare]) -> Result<(), ValidationError> {
    if shares.len() > POD_CLAIMS_MAX {
        return Err(path.error(format!(
            "at most {POD_CLAIMS_MAX} shared claims per pod, got {}",
            shares.len()
        )));
    }
    let mut pod_claims = BTreeSet::new();
    let mut objects = BTreeSet::new();
    for (i, share) in shares.iter().enumerate() {
        let at = path.index(i);
        validate_dns_label(&at.child("podClaim"), &share.pod_claim)?;
        let Some((namespace, name)) = share.claim.split_once('/') else {
            return Err(at
                .child("claim")
                .error(format!("\"{}\" is not namespace/name", share.claim)));
        };
        validate_dns_label(&at.child("claim"), namespace)?;
        validate_dns_subdomain(&at.child("claim"), name)?;
        if !pod_claims.insert(share.pod_claim.as_str()) {
            return Err(at
                .child("podClaim")
                .error(format!("duplicate pod claim \"{}\"", share.pod_claim)));
        }
        if !objects.insert(share.claim.as_str()) {
            return Err(at
                .child("claim")
                .error(format!("claim {} named twice", share.claim)));
        }
    }
    Ok(())
}

/// One device allocated to a claim (an upstream DeviceRequestAllocationResult).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceAllocation {
    /// The pod claim (or [`EXTENDED_RESOURCE_CLAIM`]).
    pub claim: String,
    /// The request, `request/sub-request` for a firstAvailable choice.
    pub request: String,
    /// The device.
    pub device: DeviceId,
    /// Admin access: the device is monitored, not taken.
    #[serde(default, skip_serializing_if = "is_disabled")]
    pub admin_access: AdminAccess,
    /// The request's tolerations (taint eviction reads them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    /// Which share of a shared device this is (shared devices only; unique per device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Capacity consumed of a shared device.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, DeviceQuantity>,
}

impl fmt::Display for DeviceAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} → {}", self.claim, self.request, self.device)
    }
}

/// Checks allocations as the ledger receives them: valid names, no device twice for
/// one pod unless shared (with distinct share ids).
pub fn validate_allocations(
    path: &FieldPath,
    allocations: &[DeviceAllocation],
) -> Result<(), ValidationError> {
    let mut seen: BTreeSet<(&DeviceId, Option<&str>)> = BTreeSet::new();
    for (i, a) in allocations.iter().enumerate() {
        let at = path.index(i);
        crate::model::device::validate_driver_name(&at.child("driver"), &a.device.driver)?;
        crate::model::device::validate_pool_name(&at.child("pool"), &a.device.pool)?;
        validate_dns_label(&at.child("device"), &a.device.device)?;
        for name in a.consumed_capacity.keys() {
            validate_attribute_name(&at.child("consumedCapacity").key(name), name)?;
        }
        if a.admin_access == AdminAccess::Enabled {
            continue;
        }
        if !seen.insert((&a.device, a.share_id.as_deref())) {
            return Err(at.error(format!("device {} allocated twice", a.device)));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Submitted (Kubernetes JSON) forms.
// ---------------------------------------------------------------------------------------

/// A device toleration as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDeviceToleration {
    /// Key.
    #[serde(default)]
    pub key: String,
    /// `Equal` (default) or `Exists`.
    #[serde(default)]
    pub operator: Option<String>,
    /// Value.
    #[serde(default)]
    pub value: String,
    /// Effect.
    #[serde(default)]
    pub effect: Option<String>,
    /// Seconds tolerated.
    #[serde(default)]
    pub toleration_seconds: Option<i64>,
}

/// Capacity requirements as submitted: `{"requests": {"memory": "10Gi"}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCapacityRequirements {
    /// Capacity name → amount.
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
}

/// An exact request (or a sub-request) as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawExactRequest {
    /// Sub-request name (firstAvailable entries only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Device class.
    #[serde(default)]
    pub device_class_name: String,
    /// Selectors.
    #[serde(default)]
    pub selectors: Vec<RawSelector>,
    /// `ExactCount` (default) or `All`.
    #[serde(default)]
    pub allocation_mode: Option<String>,
    /// Count for ExactCount (default 1).
    #[serde(default)]
    pub count: Option<i64>,
    /// Admin access.
    #[serde(default)]
    pub admin_access: Option<bool>,
    /// Tolerations.
    #[serde(default)]
    pub tolerations: Vec<RawDeviceToleration>,
    /// Capacity requirements.
    #[serde(default)]
    pub capacity: Option<RawCapacityRequirements>,
}

/// A request as submitted: `exactly` or `firstAvailable`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDeviceRequest {
    /// Name.
    pub name: String,
    /// Exact request.
    #[serde(default)]
    pub exactly: Option<RawExactRequest>,
    /// Alternatives.
    #[serde(default)]
    pub first_available: Vec<RawExactRequest>,
}

/// A constraint as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDeviceConstraint {
    /// Requests covered.
    #[serde(default)]
    pub requests: Vec<String>,
    /// Attribute that must match.
    #[serde(default)]
    pub match_attribute: Option<String>,
    /// Attribute that must differ.
    #[serde(default)]
    pub distinct_attribute: Option<String>,
}

/// Claim config as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClaimConfig {
    /// Requests it applies to.
    #[serde(default)]
    pub requests: Vec<String>,
    /// The opaque config.
    #[serde(flatten)]
    pub config: RawConfig,
}

/// A pod claim as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPodClaim {
    /// Name.
    pub name: String,
    /// Requests.
    #[serde(default)]
    pub requests: Vec<RawDeviceRequest>,
    /// Constraints.
    #[serde(default)]
    pub constraints: Vec<RawDeviceConstraint>,
    /// Config.
    #[serde(default)]
    pub config: Vec<RawClaimConfig>,
}

fn convert_toleration(
    path: &FieldPath,
    raw: &RawDeviceToleration,
) -> Result<DeviceToleration, ValidationError> {
    let operator = TolerationOperator::parse(&path.child("operator"), raw.operator.as_deref())?;
    let effect = match raw.effect.as_deref() {
        None | Some("") => None,
        Some(text) => Some(DeviceTaintEffect::parse(&path.child("effect"), text)?),
    };
    Ok(DeviceToleration {
        key: raw.key.clone(),
        operator,
        value: raw.value.clone(),
        effect,
        toleration_seconds: raw.toleration_seconds,
    })
}

fn convert_exact(path: &FieldPath, raw: &RawExactRequest) -> Result<ExactRequest, ValidationError> {
    let allocation_mode = match raw.allocation_mode.as_deref() {
        None | Some("") | Some("ExactCount") => {
            let count = raw.count.unwrap_or(1);
            let n = u32::try_from(count)
                .ok()
                .filter(|n| (1..=CLAIM_DEVICES_MAX).contains(n))
                .ok_or_else(|| {
                    path.child("count").error(format!(
                        "count {count} out of range 1..={CLAIM_DEVICES_MAX} (devices per claim)"
                    ))
                })?;
            AllocationMode::ExactCount(n)
        }
        Some("All") => {
            if raw.count.is_some() {
                return Err(path
                    .child("count")
                    .error("must not be set with allocationMode All"));
            }
            AllocationMode::All
        }
        Some(other) => {
            return Err(path.child("allocationMode").error(format!(
                "unknown allocation mode \"{other}\": expected one of ExactCount, All"
            )))
        }
    };
    let tolerations = raw
        .tolerations
        .iter()
        .enumerate()
        .map(|(i, t)| convert_toleration(&path.child("tolerations").index(i), t))
        .collect::<Result<_, _>>()?;
    let capacity = match &raw.capacity {
        None => BTreeMap::new(),
        Some(c) => c
            .requests
            .iter()
            .map(|(name, amount)| {
                let at = path.child("capacity").child("requests").key(name);
                DeviceQuantity::parse(amount)
                    .map(|q| (name.clone(), q))
                    .map_err(|e| at.error(e.to_string()))
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(ExactRequest {
        device_class_name: raw.device_class_name.clone(),
        selectors: convert_selectors(&raw.selectors),
        allocation_mode,
        admin_access: if raw.admin_access == Some(true) {
            AdminAccess::Enabled
        } else {
            AdminAccess::Disabled
        },
        tolerations,
        capacity,
    })
}

impl RawPodClaim {
    /// Converts (without validating: [`PodClaim::validate`] does that) under `path`.
    pub fn convert(&self, path: &FieldPath) -> Result<PodClaim, ValidationError> {
        let mut requests = Vec::with_capacity(self.requests.len());
        for (i, r) in self.requests.iter().enumerate() {
            let at = path.child("requests").index(i);
            let spec = match (&r.exactly, r.first_available.is_empty()) {
                (Some(exact), true) => {
                    if exact.name.is_some() {
                        return Err(at
                            .child("exactly")
                            .child("name")
                            .error("only sub-requests have names"));
                    }
                    RequestSpec::Exactly(convert_exact(&at.child("exactly"), exact)?)
                }
                (None, false) => RequestSpec::FirstAvailable(
                    r.first_available
                        .iter()
                        .enumerate()
                        .map(|(j, sub)| {
                            let sub_at = at.child("firstAvailable").index(j);
                            Ok(SubRequest {
                                name: sub.name.clone().unwrap_or_default(),
                                exact: convert_exact(&sub_at, sub)?,
                            })
                        })
                        .collect::<Result<_, ValidationError>>()?,
                ),
                _ => return Err(at.error("exactly one of exactly and firstAvailable must be set")),
            };
            requests.push(DeviceRequest {
                name: r.name.clone(),
                spec,
            });
        }
        let constraints =
            self.constraints
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let rule =
                        match (&c.match_attribute, &c.distinct_attribute) {
                            (Some(a), None) => ConstraintRule::MatchAttribute(a.clone()),
                            (None, Some(a)) => ConstraintRule::DistinctAttribute(a.clone()),
                            _ => return Err(path.child("constraints").index(i).error(
                                "exactly one of matchAttribute and distinctAttribute must be set",
                            )),
                        };
                    Ok(DeviceConstraint {
                        requests: c.requests.clone(),
                        rule,
                    })
                })
                .collect::<Result<_, _>>()?;
        let opaque = convert_configs(
            &self
                .config
                .iter()
                .map(|c| c.config.clone())
                .collect::<Vec<_>>(),
        );
        let config = self
            .config
            .iter()
            .zip(opaque)
            .map(|(c, opaque)| ClaimConfig {
                requests: c.requests.clone(),
                opaque,
            })
            .collect();
        Ok(PodClaim {
            name: self.name.clone(),
            requests,
            constraints,
            config,
        })
    }
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod tests;
