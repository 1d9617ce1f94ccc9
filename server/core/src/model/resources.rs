//! The resource vector shared by node allocatable and pod requests.
//!
//! Owns [`Resources`] (cpu in milli-cores, memory and ephemeral storage in bytes, pod
//! count, extended resources such as `nvidia.com/gpu` as whole counts), its checked
//! arithmetic and the `fits` test, plus conversion from Kubernetes resource lists
//! (`{"cpu": "500m", "memory": "2Gi"}`). Invariant: `extended` never holds a zero entry,
//! so equal amounts compare and serialize identically. Called by model validation, the
//! ledger (I2 accounting) and the engine (fit and scores).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::validate_qualified_name;
use crate::model::quantity::{parse_milli, parse_units, parse_whole_units, Quantity};

/// Amounts of every schedulable resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// CPU in milli-cores.
    pub cpu_milli: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Number of pods.
    pub pods: u64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage_bytes: u64,
    /// Extended resources by name (`nvidia.com/gpu`), whole counts, never zero.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, u64>,
}

/// Name of one resource dimension.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceName {
    /// `cpu`.
    Cpu,
    /// `memory`.
    Memory,
    /// `pods`.
    Pods,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// An extended resource such as `nvidia.com/gpu`.
    Extended(String),
}

impl ResourceName {
    /// Maps a Kubernetes resource name; names without a domain other than the four built-ins are refused.
    pub fn parse(path: &FieldPath, name: &str) -> Result<Self, ValidationError> {
        match name {
            "cpu" => Ok(Self::Cpu),
            "memory" => Ok(Self::Memory),
            "pods" => Ok(Self::Pods),
            "ephemeral-storage" => Ok(Self::EphemeralStorage),
            other if other.contains('/') => {
                validate_qualified_name(path, other)?;
                Ok(Self::Extended(other.to_string()))
            }
            other => Err(path.error(format!(
                "unknown resource \"{other}\": expected cpu, memory, pods, ephemeral-storage or a domain-qualified extended resource such as nvidia.com/gpu"
            ))),
        }
    }
}

impl ResourceName {
    /// Maps a name already known to be valid: the four built-ins, anything else as extended.
    pub fn from_name(name: &str) -> Self {
        match name {
            "cpu" => Self::Cpu,
            "memory" => Self::Memory,
            "pods" => Self::Pods,
            "ephemeral-storage" => Self::EphemeralStorage,
            other => Self::Extended(other.to_string()),
        }
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Memory => f.write_str("memory"),
            Self::Pods => f.write_str("pods"),
            Self::EphemeralStorage => f.write_str("ephemeral-storage"),
            Self::Extended(name) => f.write_str(name),
        }
    }
}

/// What a resource list describes, which decides the names it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceListKind {
    /// A node's allocatable: every name allowed.
    Allocatable,
    /// A pod's requests: `pods` is implied (one per pod) and may not be requested.
    Requests,
}

/// A quantity as it appears in JSON: a string such as `"500m"` or a plain integer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawQuantity {
    /// `"500m"`, `"2Gi"`.
    Text(String),
    /// `4`.
    Integer(i64),
}

impl RawQuantity {
    /// The quantity in its string form.
    pub fn as_text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Integer(n) => n.to_string(),
        }
    }
}

/// A Kubernetes resource list as submitted: resource name → quantity.
pub type RawResourceList = BTreeMap<String, RawQuantity>;

impl Resources {
    /// No resources at all.
    pub fn zero() -> Self {
        Self::default()
    }

    /// Whether every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.cpu_milli == 0
            && self.memory_bytes == 0
            && self.pods == 0
            && self.ephemeral_storage_bytes == 0
            && self.extended.is_empty()
    }

    /// The amount of one dimension (zero for an absent extended resource).
    pub fn get(&self, name: &ResourceName) -> u64 {
        match name {
            ResourceName::Cpu => self.cpu_milli,
            ResourceName::Memory => self.memory_bytes,
            ResourceName::Pods => self.pods,
            ResourceName::EphemeralStorage => self.ephemeral_storage_bytes,
            ResourceName::Extended(n) => self.extended.get(n).copied().unwrap_or(0),
        }
    }

    /// Sets one dimension, keeping the no-zero-entry invariant.
    pub fn set(&mut self, name: &ResourceName, amount: u64) {
        match name {
            ResourceName::Cpu => self.cpu_milli = amount,
            ResourceName::Memory => self.memory_bytes = amount,
            ResourceName::Pods => self.pods = amount,
            ResourceName::EphemeralStorage => self.ephemeral_storage_bytes = amount,
            ResourceName::Extended(n) => {
                if amount == 0 {
                    self.extended.remove(n);
                } else {
                    self.extended.insert(n.clone(), amount);
                }
            }
        }
    }

    /// Combines two vectors dimension by dimension; `None` if `f` refuses any dimension.
    fn zip_with(&self, other: &Self, f: impl Fn(u64, u64) -> Option<u64>) -> Option<Self> {
        let mut out = Self {
            cpu_milli: f(self.cpu_milli, other.cpu_milli)?,
            memory_bytes: f(self.memory_bytes, other.memory_bytes)?,
            pods: f(self.pods, other.pods)?,
            ephemeral_storage_bytes: f(
                self.ephemeral_storage_bytes,
                other.ephemeral_storage_bytes,
            )?,
            extended: BTreeMap::new(),
        };
        for name in self.extended.keys().chain(other.extended.keys()) {
            if out.extended.contains_key(name) {
                continue;
            }
            let a = self.extended.get(name).copied().unwrap_or(0);
            let b = other.extended.get(name).copied().unwrap_or(0);
            let value = f(a, b)?;
            if value != 0 {
                out.extended.insert(name.clone(), value);
            }
        }
        Some(out)
    }

    /// The dimensions in which this vector is non-zero, in a fixed order, with amounts.
    pub fn nonzero(&self) -> impl Iterator<Item = (ResourceName, u64)> + '_ {
        let fixed = [
            (ResourceName::Cpu, self.cpu_milli),
            (ResourceName::Memory, self.memory_bytes),
            (ResourceName::Pods, self.pods),
            (ResourceName::EphemeralStorage, self.ephemeral_storage_bytes),
        ];
        fixed.into_iter().filter(|(_, amount)| *amount > 0).chain(
            self.extended
                .iter()
                .filter(|(_, amount)| **amount > 0)
                .map(|(name, amount)| (ResourceName::Extended(name.clone()), *amount)),
        )
    }

    /// The first dimension (fixed order) in which `self + other` overflows.
    pub fn first_overflow(&self, other: &Self) -> Option<ResourceName> {
        self.nonzero()
            .find(|(name, amount)| amount.checked_add(other.get(name)).is_none())
            .map(|(name, _)| name)
    }

    /// `self + other`, or `None` if any dimension overflows.
    pub fn checked_add(&self, other: &Self) -> Option<Self> {
        self.zip_with(other, u64::checked_add)
    }

    /// `self - other`, or `None` if any dimension would go below zero.
    pub fn checked_sub(&self, other: &Self) -> Option<Self> {
        self.zip_with(other, u64::checked_sub)
    }

    /// `self - other` with every dimension floored at zero.
    pub fn saturating_sub(&self, other: &Self) -> Self {
        self.zip_with(other, |a, b| Some(a.saturating_sub(b)))
            .unwrap_or_default()
    }

    /// The larger amount of each dimension (a pod's init containers against its containers).
    pub fn elementwise_max(&self, other: &Self) -> Self {
        self.zip_with(other, |a, b| Some(a.max(b)))
            .unwrap_or_default()
    }

    /// `self + other` with every dimension capped at `u64::MAX`.
    pub fn saturating_add(&self, other: &Self) -> Self {
        self.zip_with(other, |a, b| Some(a.saturating_add(b)))
            .unwrap_or_default()
    }

    /// Whether this amount fits within `available` in every dimension.
    pub fn fits(&self, available: &Self) -> bool {
        self.shortfall(available).is_none()
    }

    /// The first dimension (fixed order) in which this amount exceeds `available`.
    pub fn shortfall(&self, available: &Self) -> Option<ResourceName> {
        let fixed_fits = self.cpu_milli <= available.cpu_milli
            && self.memory_bytes <= available.memory_bytes
            && self.pods <= available.pods
            && self.ephemeral_storage_bytes <= available.ephemeral_storage_bytes;
        if fixed_fits && self.extended.is_empty() {
            return None;
        }
        self.nonzero()
            .find(|(name, amount)| *amount > available.get(name))
            .map(|(name, _)| name)
    }

    /// How many copies of this amount fit within `available` (`u64::MAX` for a zero amount).
    pub fn copies_within(&self, available: &Self) -> u64 {
        self.nonzero()
            .map(|(name, amount)| available.get(&name) / amount)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Converts a submitted resource list, naming the offending entry on error.
    pub fn from_raw(
        path: &FieldPath,
        list: &RawResourceList,
        kind: ResourceListKind,
    ) -> Result<Self, ValidationError> {
        let mut out = Self::zero();
        for (name, raw) in list {
            let entry = path.key(name);
            let resource = ResourceName::parse(&entry, name)?;
            if kind == ResourceListKind::Requests && resource == ResourceName::Pods {
                return Err(entry.error("pods cannot be requested: every pod counts as one"));
            }
            let text = raw.as_text();
            if Quantity::parse(&text).is_ok_and(|q| q.is_below_one_nano()) {
                return Err(entry.error(format!(
                    "{:?} is above zero but below the smallest unit (1n); write 0 or a real amount",
                    crate::model::clip(&text)
                )));
            }
            let amount = match resource {
                ResourceName::Cpu => parse_milli(&text),
                ResourceName::Memory | ResourceName::EphemeralStorage => parse_units(&text),
                ResourceName::Pods | ResourceName::Extended(_) => parse_whole_units(&text),
            }
            .map_err(|e| entry.error(e.to_string()))?;
            out.set(&resource, amount);
        }
        Ok(out)
    }

    /// Checks the no-zero-entry invariant and extended resource names.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        for (name, amount) in &self.extended {
            let entry = path.child("extended").key(name);
            if !name.contains('/') {
                return Err(entry.error("extended resource names must be domain-qualified"));
            }
            validate_qualified_name(&entry, name)?;
            if *amount == 0 {
                return Err(entry.error("zero amounts must be left out"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
