//! Devices in the Kubernetes DRA structured-parameters model, their pools and classes.
//!
//! Owns [`DeviceId`] (driver, pool, device), [`Device`] (attributes, capacity with an
//! optional request policy, taints, consumed shared counters, and whether several claims
//! may share it), [`ResourcePool`] (one driver's devices and counter sets on one node,
//! published with a generation as ResourceSlices are), [`DeviceClass`] (CEL selectors,
//! opaque config, an optional extended resource name it serves), [`DeviceQuantity`]
//! (capacities and counters in exact nano-units) and the Kubernetes-shaped `Raw*` JSON
//! forms. Invariants of a validated pool: driver, pool and device names follow
//! Kubernetes' rules; device names are unique; every device has at most
//! [`DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX`] attributes and capacities with qualified
//! names (`id` or `domain/id`), string and version values of at most
//! [`ATTRIBUTE_VALUE_LENGTH_MAX`] bytes (versions are semver 2.0.0), attribute lists
//! (`ints`, `bools`, `strings`, `versions`: Kubernetes' `DRAListTypeAttributes`) that are
//! not empty, at most [`DEVICE_ATTRIBUTE_VALUES_MAX`] values in all, well-formed request
//! policies, at most [`DEVICE_TAINTS_MAX`] taints, and consumes only counters that its
//! pool's counter sets declare. A validated class has selectors that compile to bool.
//! Errors name the field path. Called by the ledger (PublishPool, PutDeviceClass), the
//! engine (allocation) and the kube adapter (through the raw forms).

mod raw;
mod validate;
pub use raw::*;
pub use validate::*;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::cel::compile_selector;
use crate::model::compact::{SmallMap, Symbol, SymbolTable};
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::{
    validate_dns_label, validate_dns_subdomain, validate_label_value, validate_qualified_name,
    DNS1123_LABEL_MAX,
};
use crate::model::quantity::{parse_nano, QuantityError, QuantityErrorKind};
use crate::model::reach::PoolReach;
use crate::model::semver::Semver;

/// Most devices in one published pool (a pool may span several 128-device ResourceSlices).
pub const POOL_DEVICES_MAX: usize = 1024;
/// Most attributes plus capacities on one device (Kubernetes: 32).
pub const DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX: usize = 32;
/// Longest string or version attribute value, in bytes (Kubernetes: 64).
pub const ATTRIBUTE_VALUE_LENGTH_MAX: usize = 64;
/// Most attribute values per device, scalars and list items together (Kubernetes'
/// ResourceSliceMaxAttributeValues).
pub const DEVICE_ATTRIBUTE_VALUES_MAX: usize = 48;
/// Longest attribute, capacity or counter identifier after its domain, in bytes (Kubernetes: 32).
pub const ATTRIBUTE_ID_LENGTH_MAX: usize = 32;
/// Longest driver name, in bytes (Kubernetes: 63).
pub const DRIVER_NAME_LENGTH_MAX: usize = 63;
/// Longest pool name, in bytes (Kubernetes: 253).
pub const POOL_NAME_LENGTH_MAX: usize = 253;
/// Most taints on one device (Kubernetes: 4).
pub const DEVICE_TAINTS_MAX: usize = 4;
/// Most counter sets in one pool.
pub const COUNTER_SETS_MAX: usize = 32;
/// Most counters in one counter set.
pub const COUNTERS_PER_SET_MAX: usize = 32;
/// Most counter sets one device consumes from.
pub const CONSUMED_COUNTER_SETS_MAX: usize = 8;
/// Most valid values in a capacity request policy (Kubernetes: 10).
pub const POLICY_VALID_VALUES_MAX: usize = 10;
/// Most selectors in a device class or a request (Kubernetes: 32).
pub const SELECTORS_MAX: usize = 32;
/// Most config entries in a device class or claim (Kubernetes: 32).
pub const CONFIGS_MAX: usize = 32;
/// Longest opaque config parameters, in bytes of JSON.
pub const CONFIG_PARAMETERS_LENGTH_MAX: usize = 10 * 1024;

/// A capacity or counter amount in nano-units (10^-9), exact.
///
/// Kept as two 64-bit halves (high first, so the derived order is the numeric one):
/// a `u128` field would align every capacity entry, and every device holding one, to
/// 16 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceQuantity {
    high: u64,
    low: u64,
}

impl DeviceQuantity {
    /// Zero.
    pub const ZERO: Self = Self { high: 0, low: 0 };

    /// A quantity of `nano` nano-units.
    pub fn from_nano(nano: u128) -> Self {
        Self {
            high: (nano >> 64) as u64,
            low: nano as u64,
        }
    }

    /// A quantity of whole units.
    pub fn from_units(units: u64) -> Self {
        Self::from_nano(u128::from(units) * 1_000_000_000)
    }

    /// The amount in nano-units.
    pub fn nano(&self) -> u128 {
        (u128::from(self.high) << 64) | u128::from(self.low)
    }

    /// Parses a Kubernetes quantity (`"40Gi"`, `"1500m"`); negative values are refused.
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let nano = parse_nano(input)?;
        u128::try_from(nano)
            .map(Self::from_nano)
            .map_err(|_| QuantityError {
                input: input.to_string(),
                kind: QuantityErrorKind::Negative,
            })
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(&self, other: &Self) -> Option<Self> {
        self.nano().checked_add(other.nano()).map(Self::from_nano)
    }

    /// `self - other`, floored at zero.
    pub fn saturating_sub(&self, other: &Self) -> Self {
        Self::from_nano(self.nano().saturating_sub(other.nano()))
    }
}

impl fmt::Display for DeviceQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nano();
        if n % 1_000_000_000 == 0 {
            write!(f, "{}", n / 1_000_000_000)
        } else if n % 1_000_000 == 0 {
            write!(f, "{}m", n / 1_000_000)
        } else if n % 1_000 == 0 {
            write!(f, "{}u", n / 1_000)
        } else {
            write!(f, "{n}n")
        }
    }
}

impl Serialize for DeviceQuantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for DeviceQuantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A device's identity: driver, pool and device name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceId {
    /// Driver name (`gpu.example.com`).
    pub driver: String,
    /// Pool name.
    pub pool: String,
    /// Device name within the pool.
    pub device: String,
}

impl DeviceId {
    /// Builds an id.
    pub fn new(
        driver: impl Into<String>,
        pool: impl Into<String>,
        device: impl Into<String>,
    ) -> Self {
        Self {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// One attribute value (exactly one of Kubernetes' `int`, `bool`, `string`, `version`,
/// or, with `DRAListTypeAttributes`, a non-empty list: `ints`, `bools`, `strings`,
/// `versions`). A list is a set of values, a scalar a set of one: `matchAttribute`
/// holds where the devices' sets share a value, `distinctAttribute` where they share none.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AttributeValue {
    /// A 64-bit integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string of at most [`ATTRIBUTE_VALUE_LENGTH_MAX`] bytes.
    String(Symbol),
    /// A semver 2.0.0 version.
    Version(Symbol),
    /// Integers. Lists are boxed slices, so a value is 24 bytes, not 32.
    Ints(Box<[i64]>),
    /// Booleans.
    Bools(Box<[bool]>),
    /// Strings of at most [`ATTRIBUTE_VALUE_LENGTH_MAX`] bytes each.
    Strings(Box<[String]>),
    /// Semver 2.0.0 versions.
    Versions(Box<[String]>),
}

/// One value of an attribute: a scalar, or one item of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributeItem<'a> {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(&'a str),
    /// A version, as written.
    Version(&'a str),
}

impl AttributeValue {
    /// Its values: the scalar, or the list's items.
    pub fn items(&self) -> Vec<AttributeItem<'_>> {
        match self {
            Self::Int(n) => vec![AttributeItem::Int(*n)],
            Self::Bool(b) => vec![AttributeItem::Bool(*b)],
            Self::String(s) => vec![AttributeItem::String(s)],
            Self::Version(v) => vec![AttributeItem::Version(v)],
            Self::Ints(l) => l.iter().map(|n| AttributeItem::Int(*n)).collect(),
            Self::Bools(l) => l.iter().map(|b| AttributeItem::Bool(*b)).collect(),
            Self::Strings(l) => l.iter().map(|s| AttributeItem::String(s)).collect(),
            Self::Versions(l) => l.iter().map(|v| AttributeItem::Version(v)).collect(),
        }
    }

    /// How many values it holds (one for a scalar).
    pub fn value_count(&self) -> usize {
        match self {
            Self::Int(_) | Self::Bool(_) | Self::String(_) | Self::Version(_) => 1,
            Self::Ints(l) => l.len(),
            Self::Bools(l) => l.len(),
            Self::Strings(l) => l.len(),
            Self::Versions(l) => l.len(),
        }
    }

    /// Whether `item` is one of its values.
    pub fn holds(&self, item: AttributeItem<'_>) -> bool {
        match (self, item) {
            (Self::Int(n), AttributeItem::Int(m)) => *n == m,
            (Self::Bool(b), AttributeItem::Bool(c)) => *b == c,
            (Self::String(s), AttributeItem::String(t)) => s == t,
            (Self::Version(v), AttributeItem::Version(w)) => v == w,
            (Self::Ints(l), AttributeItem::Int(m)) => l.contains(&m),
            (Self::Bools(l), AttributeItem::Bool(c)) => l.contains(&c),
            (Self::Strings(l), AttributeItem::String(t)) => l.iter().any(|s| s == t),
            (Self::Versions(l), AttributeItem::Version(w)) => l.iter().any(|v| v == w),
            _ => false,
        }
    }

    /// Whether it shares a value with `other` (scalars are sets of one).
    pub fn overlaps(&self, other: &AttributeValue) -> bool {
        self.items().into_iter().any(|item| other.holds(item))
    }
}

/// Which amounts a request may take of a shared device's capacity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CapacityValidity {
    /// Any amount.
    Any,
    /// One of these amounts, ascending; a request is rounded up to the next one.
    Values(Vec<DeviceQuantity>),
    /// `min`, then steps of `step` (if set), never above `max` (if set).
    Range {
        /// Smallest amount; smaller requests are rounded up to it.
        min: DeviceQuantity,
        /// Largest amount.
        max: Option<DeviceQuantity>,
        /// Granularity above `min`; requests are rounded up to it.
        step: Option<DeviceQuantity>,
    },
}

/// How requests consume a capacity of a device that allows multiple allocations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CapacityRequestPolicy {
    /// Consumed when a request names no amount; without it, the whole capacity.
    pub default: Option<DeviceQuantity>,
    /// Which amounts are valid.
    pub valid: CapacityValidity,
}

/// One capacity of a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceCapacity {
    /// The total amount.
    pub value: DeviceQuantity,
    /// How shared allocations consume it (shared devices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<Box<CapacityRequestPolicy>>,
}

impl DeviceCapacity {
    /// A capacity without a request policy.
    pub fn fixed(value: DeviceQuantity) -> Self {
        Self {
            value,
            request_policy: None,
        }
    }

    /// What one allocation consumes of it when `requested` is asked for, or `None` if
    /// the request violates the policy (Kubernetes' consumable-capacity rules: no
    /// amount means the default, else the whole capacity; an amount is rounded up to a
    /// valid value or step, and must then be valid).
    pub fn consumed_by(&self, requested: Option<DeviceQuantity>) -> Option<DeviceQuantity> {
        let Some(requested) = requested else {
            return Some(
                self.request_policy
                    .as_ref()
                    .and_then(|p| p.default)
                    .unwrap_or(self.value),
            );
        };
        let Some(policy) = &self.request_policy else {
            return Some(requested);
        };
        match &policy.valid {
            CapacityValidity::Any => Some(requested),
            CapacityValidity::Values(values) => values.iter().copied().find(|v| *v >= requested),
            CapacityValidity::Range { min, max, step } => {
                let rounded = if requested <= *min {
                    *min
                } else {
                    match step {
                        Some(step) if step.nano() > 0 => {
                            let above = requested.nano() - min.nano();
                            let steps = above.div_ceil(step.nano());
                            DeviceQuantity::from_nano(
                                min.nano().checked_add(steps.checked_mul(step.nano())?)?,
                            )
                        }
                        _ => requested,
                    }
                };
                match max {
                    Some(max) if rounded > *max => None,
                    _ => Some(rounded),
                }
            }
        }
    }
}

/// What a device taint does to claims that do not tolerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DeviceTaintEffect {
    /// The device takes no new allocations.
    NoSchedule,
    /// The device takes no new allocations and pods using it are evicted.
    NoExecute,
}

impl DeviceTaintEffect {
    /// Parses the Kubernetes spelling, naming the allowed values on error.
    pub fn parse(path: &FieldPath, value: &str) -> Result<Self, ValidationError> {
        match value {
            "NoSchedule" => Ok(Self::NoSchedule),
            "NoExecute" => Ok(Self::NoExecute),
            other => Err(path.error(format!(
                "unknown taint effect \"{other}\": expected one of NoSchedule, NoExecute"
            ))),
        }
    }
}

impl fmt::Display for DeviceTaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        })
    }
}

/// A device taint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceTaint {
    /// Taint key (a qualified name).
    pub key: String,
    /// Taint value (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Effect.
    pub effect: DeviceTaintEffect,
    /// When the taint was added, in ms since the epoch (eviction deadlines count from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added_ms: Option<u64>,
}

/// A named set of shared counters in a pool (e.g. one physical GPU's memory and slices).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CounterSet {
    /// Name, unique in the pool.
    pub name: String,
    /// Counter name → total amount.
    pub counters: BTreeMap<String, DeviceQuantity>,
}

/// What a device consumes of one counter set while it is allocated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CounterConsumption {
    /// The counter set.
    pub counter_set: String,
    /// Counter name → amount consumed.
    pub counters: BTreeMap<String, DeviceQuantity>,
}

/// Whether several claims may hold a device at once (Kubernetes' `allowMultipleAllocations`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllocationSharing {
    /// One claim at a time.
    #[default]
    Exclusive,
    /// Several claims, each consuming part of its capacity.
    Shared,
}

/// One device as its driver publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Device {
    /// Name, unique in the pool (a DNS label).
    pub name: Symbol,
    /// Qualified attribute name → value.
    #[serde(default, skip_serializing_if = "SmallMap::is_empty")]
    pub attributes: SmallMap<Symbol, AttributeValue>,
    /// Qualified capacity name → capacity.
    #[serde(default, skip_serializing_if = "SmallMap::is_empty")]
    pub capacity: SmallMap<Symbol, DeviceCapacity>,
    /// Shared counters it consumes while allocated (partitionable devices). Boxed slices
    /// here and in `taints`: most devices have none, and a fleet holds many devices.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub consumes_counters: Box<[CounterConsumption]>,
    /// Taints.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub taints: Box<[DeviceTaint]>,
    /// Whether claims may share it.
    #[serde(default, skip_serializing_if = "is_exclusive")]
    pub sharing: AllocationSharing,
    /// The nodes it is reachable from, in a network-attached pool whose devices each
    /// say (`perDeviceNodeSelection`); `None` everywhere else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reach: Option<Box<PoolReach>>,
}

fn is_exclusive(sharing: &AllocationSharing) -> bool {
    *sharing == AllocationSharing::Exclusive
}

impl Device {
    /// A device without attributes, capacity, counters or taints.
    pub fn new(name: impl Into<Symbol>) -> Self {
        Self {
            name: name.into(),
            attributes: SmallMap::new(),
            capacity: SmallMap::new(),
            consumes_counters: Box::default(),
            taints: Box::default(),
            sharing: AllocationSharing::Exclusive,
            reach: None,
        }
    }

    /// Adds a shared counter use (reallocates: devices are built once).
    pub fn push_counter_use(&mut self, consumption: CounterConsumption) {
        let mut all = std::mem::take(&mut self.consumes_counters).into_vec();
        all.push(consumption);
        self.consumes_counters = all.into_boxed_slice();
    }

    /// Adds a taint (reallocates: devices are built once).
    pub fn push_taint(&mut self, taint: DeviceTaint) {
        let mut all = std::mem::take(&mut self.taints).into_vec();
        all.push(taint);
        self.taints = all.into_boxed_slice();
    }

    /// Shares its repeated strings (name, attribute and capacity names, string and
    /// version values) with every other device interned through `symbols`.
    pub fn intern(&mut self, symbols: &mut SymbolTable) {
        self.name = symbols.intern(&self.name);
        symbols.intern_keys(&mut self.attributes);
        symbols.intern_keys(&mut self.capacity);
        for value in self.attributes.values_mut() {
            if let AttributeValue::String(text) | AttributeValue::Version(text) = value {
                *text = symbols.intern(text);
            }
        }
    }

    /// The attribute with qualified name `name` (`id` under the driver's domain, or `domain/id`).
    pub fn attribute(&self, driver: &str, name: &str) -> Option<&AttributeValue> {
        let (domain, id) = crate::model::cel::split_qualified(driver, name);
        self.attributes
            .iter()
            .find(|(n, _)| crate::model::cel::split_qualified(driver, n) == (domain, id))
            .map(|(_, v)| v)
    }

    /// The capacity with qualified name `name`.
    pub fn capacity_of(&self, driver: &str, name: &str) -> Option<&DeviceCapacity> {
        let (domain, id) = crate::model::cel::split_qualified(driver, name);
        self.capacity
            .iter()
            .find(|(n, _)| crate::model::cel::split_qualified(driver, n) == (domain, id))
            .map(|(_, v)| v)
    }
}

/// A driver's devices on one node, as one published pool generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourcePool {
    /// Driver name.
    pub driver: String,
    /// Pool name.
    pub name: String,
    /// Generation: a newer one replaces the pool, an older one is ignored.
    pub generation: u64,
    /// Devices.
    pub devices: Vec<Device>,
    /// Shared counter sets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counter_sets: Vec<CounterSet>,
}

impl ResourcePool {
    /// Checks every rule of a published pool; errors name the field under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_pool(
            path,
            &self.driver,
            &self.name,
            &self.devices,
            &self.counter_sets,
        )
    }
}

/// A CEL expression selecting devices.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CelSelector {
    /// The expression; it must evaluate to bool.
    pub expression: String,
}

impl CelSelector {
    /// A selector with `expression`.
    pub fn new(expression: impl Into<String>) -> Self {
        Self {
            expression: expression.into(),
        }
    }
}

/// Checks a list of selectors: each compiles and evaluates to bool.
pub fn validate_selectors(
    path: &FieldPath,
    selectors: &[CelSelector],
) -> Result<(), ValidationError> {
    if selectors.len() > SELECTORS_MAX {
        return Err(path.error(format!(
            "at most {SELECTORS_MAX} selectors, got {}",
            selectors.len()
        )));
    }
    for (i, selector) in selectors.iter().enumerate() {
        compile_selector(&selector.expression).map_err(|message| {
            path.index(i)
                .child("cel")
                .child("expression")
                .error(message)
        })?;
    }
    Ok(())
}

/// Opaque driver configuration: a driver and its parameters as canonical JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpaqueConfig {
    /// The driver the parameters are for.
    pub driver: String,
    /// Parameters, JSON text.
    pub parameters: String,
}

/// Checks a list of opaque configs.
pub fn validate_configs(path: &FieldPath, configs: &[OpaqueConfig]) -> Result<(), ValidationError> {
    if configs.len() > CONFIGS_MAX {
        return Err(path.error(format!(
            "at most {CONFIGS_MAX} configs, got {}",
            configs.len()
        )));
    }
    for (i, config) in configs.iter().enumerate() {
        let at = path.index(i).child("opaque");
        validate_driver_name(&at.child("driver"), &config.driver)?;
        if config.parameters.len() > CONFIG_PARAMETERS_LENGTH_MAX {
            return Err(at
                .child("parameters")
                .error(format!("longer than {CONFIG_PARAMETERS_LENGTH_MAX} bytes")));
        }
        serde_json::from_str::<serde_json::Value>(&config.parameters)
            .map_err(|e| at.child("parameters").error(format!("not JSON: {e}")))?;
    }
    Ok(())
}

/// A device class: selectors every device of the class satisfies, and config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceClass {
    /// Name (a DNS subdomain).
    pub name: String,
    /// Selectors, all of which must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<CelSelector>,
    /// Driver configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<OpaqueConfig>,
    /// The device-plugin style extended resource (`nvidia.com/gpu`) this class serves, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<String>,
}

impl DeviceClass {
    /// Checks the class; errors name the field under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_dns_subdomain(&path.child("name"), &self.name)?;
        let spec = path.child("spec");
        validate_selectors(&spec.child("selectors"), &self.selectors)?;
        validate_configs(&spec.child("config"), &self.config)?;
        if let Some(name) = &self.extended_resource_name {
            let at = spec.child("extendedResourceName");
            if !name.contains('/') || name.starts_with("kubernetes.io/") {
                return Err(at.error(format!(
                    "\"{name}\" is not an extended resource name (domain-qualified, outside kubernetes.io)"
                )));
            }
            validate_qualified_name(&at, name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
