//! Queues: the tree of teams a cluster is shared by, each with a guaranteed (`min`) and
//! a ceiling (`max`) amount per resource.
//!
//! Owns [`QueueSpec`] (one queue as configured), [`Limits`] (an amount per named
//! resource; a resource a `max` does not name is unlimited, one a `min` does not name is
//! not guaranteed) and their validation. A queue's usage is charged against its own
//! `max` and every ancestor's, so a child may go past its `min` (borrow) as long as no
//! ancestor's `max` is passed. Plain data, so the meta group can log and snapshot it.
//! Called by the meta group (which keeps the queues and their usage), the front door's
//! admin API and the Kubernetes adapter (ElasticQuota objects).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::claim::{AdminAccess, AllocationMode, ExactRequest, RequestSpec};
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::validate_dns_label;
use crate::model::pod::{footprint_of, PodSpec};
use crate::model::quantity::{parse_milli, parse_units, parse_whole_units};
use crate::model::resources::{ResourceName, Resources};

/// The weight a queue gets when none is given.
pub const QUEUE_WEIGHT_DEFAULT: u32 = 1;
/// The largest weight a queue may have.
pub const QUEUE_WEIGHT_MAX: u32 = 1_000;
/// The most queues a cluster may define.
pub const QUEUES_MAX: usize = 1_000;
/// The deepest a queue may sit below the top (a top-level queue has depth 1).
pub const QUEUE_DEPTH_MAX: usize = 8;
/// The most resources one `min` or `max` may name.
pub const LIMIT_RESOURCES_MAX: usize = 32;

/// An amount per named resource (`cpu` in millicores, `memory` and
/// `ephemeral-storage` in bytes, `pods` and extended resources in units).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Limits(BTreeMap<String, u64>);

impl Limits {
    /// No resource named.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether no resource is named.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The amount named for `resource`, if any.
    pub fn get(&self, resource: &ResourceName) -> Option<u64> {
        self.0.get(&resource.to_string()).copied()
    }

    /// Names `amount` for `resource`.
    pub fn set(&mut self, resource: &ResourceName, amount: u64) {
        self.0.insert(resource.to_string(), amount);
    }

    /// The named resources with their amounts, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceName, u64)> + '_ {
        self.0
            .iter()
            .map(|(name, amount)| (ResourceName::from_name(name), *amount))
    }

    /// The named amounts as a resource vector (unnamed resources zero).
    pub fn as_resources(&self) -> Resources {
        let mut out = Resources::zero();
        for (name, amount) in self.iter() {
            out.set(&name, amount);
        }
        out
    }

    /// Reads Kubernetes quantities (`{"cpu": "10", "memory": "64Gi", "nvidia.com/gpu": "8"}`),
    /// naming the entry at fault.
    pub fn from_quantities(
        path: &FieldPath,
        list: &BTreeMap<String, String>,
    ) -> Result<Self, ValidationError> {
        if list.len() > LIMIT_RESOURCES_MAX {
            return Err(path.error(format!(
                "{} resources named, at most {LIMIT_RESOURCES_MAX}",
                list.len()
            )));
        }
        let mut out = Self::none();
        for (name, text) in list {
            let entry = path.key(name);
            let resource = ResourceName::parse(&entry, name)?;
            let amount = match resource {
                ResourceName::Cpu => parse_milli(text),
                ResourceName::Memory | ResourceName::EphemeralStorage => parse_units(text),
                ResourceName::Pods | ResourceName::Extended(_) => parse_whole_units(text),
            }
            .map_err(|e| entry.error(e.to_string()))?;
            out.set(&resource, amount);
        }
        Ok(out)
    }

    /// The first resource this `max` names that `usage` passes, with both amounts.
    pub fn first_exceeded(&self, usage: &Resources) -> Option<(ResourceName, u64, u64)> {
        self.iter()
            .map(|(name, max)| (usage.get(&name), name, max))
            .find(|(used, _, max)| used > max)
            .map(|(used, name, max)| (name, used, max))
    }

    fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        if self.0.len() > LIMIT_RESOURCES_MAX {
            return Err(path.error(format!(
                "{} resources named, at most {LIMIT_RESOURCES_MAX}",
                self.0.len()
            )));
        }
        for name in self.0.keys() {
            ResourceName::parse(&path.key(name), name)?;
        }
        Ok(())
    }
}

/// One resource amount as people read it: `cpu` in cores, sizes in bytes.
pub struct Amount<'a>(pub &'a ResourceName, pub u64);

impl fmt::Display for Amount<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            ResourceName::Cpu if self.1 % 1_000 == 0 => write!(f, "{}", self.1 / 1_000),
            ResourceName::Cpu => write!(f, "{}m", self.1),
            _ => write!(f, "{}", self.1),
        }
    }
}

/// The resource a queue counts a device class's devices under (the name Kubernetes
/// ResourceQuota uses for DRA devices).
pub fn device_class_resource(class: &str) -> ResourceName {
    ResourceName::Extended(format!("{class}.deviceclass.resource.k8s.io/devices"))
}

/// What one pod is charged to its queue: its requests, one pod, and the devices its
/// claims ask of each device class — an exact count as asked; `All` as one (at least
/// one device; how many is known only once allocated); a firstAvailable request the
/// most any of its choices asks of the class; admin access nothing (it takes no device).
/// Claims the pod follows (shared, carried by another pod) are charged to their carrier.
pub fn queue_footprint(spec: &PodSpec) -> Resources {
    let mut out = footprint_of(&spec.requests);
    let mut devices: BTreeMap<&str, u64> = BTreeMap::new();
    for claim in &spec.claims {
        for request in &claim.requests {
            let mut most: BTreeMap<&str, u64> = BTreeMap::new();
            let asks: Vec<&ExactRequest> = match &request.spec {
                RequestSpec::Exactly(exact) => vec![exact],
                RequestSpec::FirstAvailable(subs) => subs.iter().map(|s| &s.exact).collect(),
            };
            for exact in asks {
                let count = match (&exact.admin_access, &exact.allocation_mode) {
                    (AdminAccess::Enabled, _) => 0,
                    (_, AllocationMode::ExactCount(n)) => u64::from(*n),
                    (_, AllocationMode::All) => 1,
                };
                let entry = most.entry(exact.device_class_name.as_str()).or_default();
                *entry = (*entry).max(count);
            }
            for (class, count) in most {
                *devices.entry(class).or_default() += count;
            }
        }
    }
    for (class, count) in devices.into_iter().filter(|(_, c)| *c > 0) {
        let name = device_class_resource(class);
        let total = out.get(&name).saturating_add(count);
        out.set(&name, total);
    }
    out
}

/// A queue as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSpec {
    /// Its name: a DNS label, unique in the cluster.
    pub name: String,
    /// Its parent queue (empty: a top-level queue).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
    /// Its share of what its siblings compete for (1..=`QUEUE_WEIGHT_MAX`).
    pub weight: u32,
    /// What it is guaranteed (a resource not named: nothing).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub min: Limits,
    /// What it may use at most, borrowing included (a resource not named: no limit).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub max: Limits,
    /// How much of its `min` other queues may borrow while it is idle, per resource (a
    /// resource not named: all of it). The rest of its `min` is kept free for it alone.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub lend: Limits,
    /// What keeps it: empty for the admin API, `ElasticQuota namespace/name` for a queue
    /// the Kubernetes ingest keeps from that object. Only its keeper changes or deletes it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub managed_by: String,
    /// Kubernetes namespaces whose pods may name it with the queue label (`*`: every
    /// namespace). A pod is always charged to its own namespace's ElasticQuota queue
    /// without a label; a label naming a queue that does not list the pod's namespace is
    /// not honoured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
}

/// Most namespaces one queue may list.
pub const QUEUE_NAMESPACES_MAX: usize = 1_024;

impl QueueSpec {
    /// Whether pods of `namespace` may name this queue with the queue label.
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|n| n == "*" || n == namespace)
    }

    /// Checks the queue on its own: its names, its weight, and `min` within `max`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_dns_label(&path.child("name"), &self.name)?;
        if self.namespaces.len() > QUEUE_NAMESPACES_MAX {
            return Err(path
                .child("namespaces")
                .error(format!("at most {QUEUE_NAMESPACES_MAX}")));
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            if ns != "*" {
                validate_dns_label(&path.child("namespaces").index(i), ns)?;
            }
        }
        if !self.parent.is_empty() {
            validate_dns_label(&path.child("parent"), &self.parent)?;
            if self.parent == self.name {
                return Err(path
                    .child("parent")
                    .error("a queue cannot be its own parent"));
            }
        }
        if self.weight == 0 || self.weight > QUEUE_WEIGHT_MAX {
            return Err(path
                .child("weight")
                .error(format!("{} is not in 1..={QUEUE_WEIGHT_MAX}", self.weight)));
        }
        self.min.validate(&path.child("min"))?;
        self.max.validate(&path.child("max"))?;
        for (name, min) in self.min.iter() {
            if let Some(max) = self.max.get(&name) {
                if min > max {
                    return Err(path.child("min").key(&name.to_string()).error(format!(
                        "{} is above max {}",
                        Amount(&name, min),
                        Amount(&name, max)
                    )));
                }
            }
        }
        self.lend.validate(&path.child("lend"))?;
        for (name, lend) in self.lend.iter() {
            let entry = path.child("lend").key(&name.to_string());
            match self.min.get(&name) {
                None => {
                    return Err(entry.error(format!(
                        "min names no {name}; a queue lends only what it is guaranteed"
                    )))
                }
                Some(min) if lend > min => {
                    return Err(entry.error(format!(
                        "{} is above min {}",
                        Amount(&name, lend),
                        Amount(&name, min)
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// What of `resource` it keeps for itself alone: its `min` less what it lends (zero
    /// when it names no lending limit for it).
    pub fn unlendable(&self, resource: &ResourceName) -> u64 {
        match (self.min.get(resource), self.lend.get(resource)) {
            (Some(min), Some(lend)) => min.saturating_sub(lend),
            _ => 0,
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
