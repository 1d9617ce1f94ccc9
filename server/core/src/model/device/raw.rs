//! The submitted (Kubernetes JSON) forms of pools, devices and device classes, and their
//! conversion to the model with every error naming its field. Part of
//! `model/device.rs`.

use super::*;

/// A quantity wrapped as Kubernetes wraps counters: `{"value": "40Gi"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCounter {
    /// The amount.
    pub value: String,
}

/// A capacity request policy range as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawValidRange {
    /// Smallest amount.
    pub min: String,
    /// Largest amount.
    #[serde(default)]
    pub max: Option<String>,
    /// Step above `min`.
    #[serde(default)]
    pub step: Option<String>,
}

/// A capacity request policy as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawRequestPolicy {
    /// Default amount.
    #[serde(default)]
    pub default: Option<String>,
    /// Valid amounts.
    #[serde(default)]
    pub valid_values: Vec<String>,
    /// Valid range.
    #[serde(default)]
    pub valid_range: Option<RawValidRange>,
}

/// A device capacity as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawCapacity {
    /// Total amount.
    pub value: String,
    /// Request policy.
    #[serde(default)]
    pub request_policy: Option<RawRequestPolicy>,
}

/// A device taint as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDeviceTaint {
    /// Key.
    pub key: String,
    /// Value.
    #[serde(default)]
    pub value: String,
    /// `NoSchedule` or `NoExecute`.
    pub effect: String,
    /// When it was added, in ms since the epoch.
    #[serde(default)]
    pub time_added_ms: Option<u64>,
}

/// Counters a device consumes, as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawCounterConsumption {
    /// Counter set name.
    pub counter_set: String,
    /// Counter → amount.
    pub counters: BTreeMap<String, RawCounter>,
}

/// A device as submitted (ResourceSlice `devices[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDevice {
    /// Name.
    pub name: String,
    /// Attributes (`{"model": {"string": "a100"}}`).
    #[serde(default)]
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacities.
    #[serde(default)]
    pub capacity: BTreeMap<String, RawCapacity>,
    /// Consumed counters.
    #[serde(default)]
    pub consumes_counters: Vec<RawCounterConsumption>,
    /// Taints.
    #[serde(default)]
    pub taints: Vec<RawDeviceTaint>,
    /// Whether several claims may share it.
    #[serde(default)]
    pub allow_multiple_allocations: bool,
}

/// A counter set as submitted (ResourceSlice `sharedCounters[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCounterSet {
    /// Name.
    pub name: String,
    /// Counter → total.
    pub counters: BTreeMap<String, RawCounter>,
}

/// A pool reference as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPoolRef {
    /// Pool name.
    pub name: String,
    /// Generation.
    pub generation: u64,
}

/// A pool as submitted, shaped like a ResourceSlice spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawResourcePool {
    /// Driver.
    pub driver: String,
    /// Pool name and generation.
    pub pool: RawPoolRef,
    /// Devices.
    #[serde(default)]
    pub devices: Vec<RawDevice>,
    /// Counter sets.
    #[serde(default)]
    pub shared_counters: Vec<RawCounterSet>,
}

pub(super) fn quantity_at(path: &FieldPath, text: &str) -> Result<DeviceQuantity, ValidationError> {
    DeviceQuantity::parse(text).map_err(|e| path.error(e.to_string()))
}

pub(super) fn counters_at(
    path: &FieldPath,
    raw: &BTreeMap<String, RawCounter>,
) -> Result<BTreeMap<String, DeviceQuantity>, ValidationError> {
    raw.iter()
        .map(|(name, c)| {
            Ok((
                name.clone(),
                quantity_at(&path.key(name).child("value"), &c.value)?,
            ))
        })
        .collect()
}

pub(super) fn convert_capacity(
    path: &FieldPath,
    raw: &RawCapacity,
) -> Result<DeviceCapacity, ValidationError> {
    let value = quantity_at(&path.child("value"), &raw.value)?;
    let request_policy = match &raw.request_policy {
        None => None,
        Some(p) => {
            let at = path.child("requestPolicy");
            let default = match &p.default {
                Some(d) => Some(quantity_at(&at.child("default"), d)?),
                None => None,
            };
            let valid = match (&p.valid_range, p.valid_values.is_empty()) {
                (Some(_), false) => {
                    return Err(at.error("validValues and validRange are mutually exclusive"))
                }
                (Some(r), true) => {
                    let range = at.child("validRange");
                    CapacityValidity::Range {
                        min: quantity_at(&range.child("min"), &r.min)?,
                        max: match &r.max {
                            Some(m) => Some(quantity_at(&range.child("max"), m)?),
                            None => None,
                        },
                        step: match &r.step {
                            Some(s) => Some(quantity_at(&range.child("step"), s)?),
                            None => None,
                        },
                    }
                }
                (None, false) => CapacityValidity::Values(
                    p.valid_values
                        .iter()
                        .enumerate()
                        .map(|(i, v)| quantity_at(&at.child("validValues").index(i), v))
                        .collect::<Result<_, _>>()?,
                ),
                (None, true) => CapacityValidity::Any,
            };
            Some(CapacityRequestPolicy { default, valid })
        }
    };
    Ok(DeviceCapacity {
        value,
        request_policy: request_policy.map(Box::new),
    })
}

pub(super) fn convert_device(path: &FieldPath, raw: &RawDevice) -> Result<Device, ValidationError> {
    let capacity = raw
        .capacity
        .iter()
        .map(|(name, c)| {
            Ok((
                name.clone(),
                convert_capacity(&path.child("capacity").key(name), c)?,
            ))
        })
        .collect::<Result<_, ValidationError>>()?;
    let consumes_counters = raw
        .consumes_counters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let at = path.child("consumesCounters").index(i);
            Ok(CounterConsumption {
                counter_set: c.counter_set.clone(),
                counters: counters_at(&at.child("counters"), &c.counters)?,
            })
        })
        .collect::<Result<_, ValidationError>>()?;
    let taints = raw
        .taints
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Ok(DeviceTaint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: DeviceTaintEffect::parse(
                    &path.child("taints").index(i).child("effect"),
                    &t.effect,
                )?,
                time_added_ms: t.time_added_ms,
            })
        })
        .collect::<Result<_, ValidationError>>()?;
    Ok(Device {
        name: raw.name.clone().into(),
        attributes: raw.attributes.iter().map(|(k, v)| (k, v.clone())).collect(),
        capacity,
        consumes_counters,
        taints,
        sharing: if raw.allow_multiple_allocations {
            AllocationSharing::Shared
        } else {
            AllocationSharing::Exclusive
        },
        reach: None,
    })
}

impl RawResourcePool {
    /// Validates and converts into a [`ResourcePool`]; errors name the field path.
    pub fn validate(&self) -> Result<ResourcePool, ValidationError> {
        let root = FieldPath::new("spec");
        let devices = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| convert_device(&root.child("devices").index(i), d))
            .collect::<Result<_, _>>()?;
        let counter_sets = self
            .shared_counters
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let at = root.child("sharedCounters").index(i);
                Ok(CounterSet {
                    name: s.name.clone(),
                    counters: counters_at(&at.child("counters"), &s.counters)?,
                })
            })
            .collect::<Result<_, ValidationError>>()?;
        let pool = ResourcePool {
            driver: self.driver.clone(),
            name: self.pool.name.clone(),
            generation: self.pool.generation,
            devices,
            counter_sets,
        };
        pool.validate(&root)?;
        Ok(pool)
    }
}

/// A CEL selector as submitted: `{"cel": {"expression": "…"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSelector {
    /// The CEL part.
    pub cel: RawCelExpression,
}

/// The expression of a submitted selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCelExpression {
    /// The expression.
    pub expression: String,
}

/// Opaque config as submitted: `{"opaque": {"driver": …, "parameters": {…}}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The opaque part.
    pub opaque: RawOpaque,
}

/// Opaque parameters as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOpaque {
    /// Driver.
    pub driver: String,
    /// Parameters, any JSON.
    pub parameters: serde_json::Value,
}

/// A device class spec as submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawDeviceClassSpec {
    /// Selectors.
    #[serde(default)]
    pub selectors: Vec<RawSelector>,
    /// Config.
    #[serde(default)]
    pub config: Vec<RawConfig>,
    /// Extended resource served.
    #[serde(default)]
    pub extended_resource_name: Option<String>,
}

/// A device class as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeviceClass {
    /// Name.
    pub name: String,
    /// Spec.
    #[serde(default)]
    pub spec: RawDeviceClassSpec,
}

/// Converts submitted selectors.
pub fn convert_selectors(raw: &[RawSelector]) -> Vec<CelSelector> {
    raw.iter()
        .map(|s| CelSelector::new(s.cel.expression.clone()))
        .collect()
}

/// Converts submitted opaque configs (parameters become canonical JSON text).
pub fn convert_configs(raw: &[RawConfig]) -> Vec<OpaqueConfig> {
    raw.iter()
        .map(|c| OpaqueConfig {
            driver: c.opaque.driver.clone(),
            parameters: c.opaque.parameters.to_string(),
        })
        .collect()
}

impl RawDeviceClass {
    /// Validates and converts into a [`DeviceClass`]; errors name the field path.
    pub fn validate(&self) -> Result<DeviceClass, ValidationError> {
        let class = DeviceClass {
            name: self.name.clone(),
            selectors: convert_selectors(&self.spec.selectors),
            config: convert_configs(&self.spec.config),
            extended_resource_name: self.spec.extended_resource_name.clone(),
        };
        class.validate(&FieldPath::root())?;
        Ok(class)
    }
}
