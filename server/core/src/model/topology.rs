//! Topology: the hierarchies of node labels a cluster is built from, and what a gang asks
//! of them.
//!
//! Owns [`TopologyHierarchy`] (node label keys from widest to narrowest, such as block →
//! rack → host; a cluster may have several, a network one and an NVLink one) and
//! [`TopologyConstraint`] (a gang's *required* level: every member in one domain of it;
//! its *preferred* level: as few domains of it as possible; its *slices*: members in
//! consecutive slices of N, each in one domain of a level). A domain is a label key with
//! one of its values; a node without the key is in no domain of it. Invariants of a
//! validated value: every key is a qualified name, a hierarchy names no key twice, a
//! slice is at least one member. Called by the gang model (validation), the engine
//! (placement) and every dialect that writes a constraint (gRPC, Kubernetes ingest).

use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::validate_qualified_name;

/// Most levels in one hierarchy.
pub const TOPOLOGY_LEVELS_MAX: usize = 16;
/// Most hierarchies in a profile.
pub const TOPOLOGY_HIERARCHIES_MAX: usize = 8;

/// Node label keys from the widest domain to the narrowest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologyHierarchy {
    /// A name for messages (Kueue's Topology object name, or the flag's position).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Label keys, widest first.
    pub levels: Vec<String>,
}

impl TopologyHierarchy {
    /// Checks the keys; errors name the field under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        let levels = path.child("levels");
        if self.levels.is_empty() {
            return Err(levels.error("a topology needs at least one level"));
        }
        if self.levels.len() > TOPOLOGY_LEVELS_MAX {
            return Err(levels.error(format!(
                "{} levels exceed the limit of {TOPOLOGY_LEVELS_MAX}",
                self.levels.len()
            )));
        }
        for (i, key) in self.levels.iter().enumerate() {
            validate_qualified_name(&levels.index(i), key)?;
            if self.levels[..i].contains(key) {
                return Err(levels
                    .index(i)
                    .error(format!("level \"{key}\" named twice")));
            }
        }
        Ok(())
    }

    /// The levels wider than `key`, narrowest first (empty if `key` is not a level).
    pub fn wider_than(&self, key: &str) -> Vec<&str> {
        match self.levels.iter().position(|l| l == key) {
            Some(at) => self.levels[..at].iter().rev().map(String::as_str).collect(),
            None => Vec::new(),
        }
    }

    /// The level just narrower than `key`, if `key` is a level and one follows it.
    pub fn below(&self, key: &str) -> Option<&str> {
        let at = self.levels.iter().position(|l| l == key)?;
        self.levels.get(at + 1).map(String::as_str)
    }
}

/// Hierarchies learned at run time (Kueue's `Topology` objects), shared between the
/// Kubernetes ingest, which writes them, and the coordinator and ingest of the same
/// replica, which read them after the configured ones.
#[derive(Debug, Default)]
pub struct LearnedHierarchies {
    learned: RwLock<Vec<TopologyHierarchy>>,
}

impl LearnedHierarchies {
    /// Replaces what was learned; whether it changed.
    pub fn replace(&self, hierarchies: Vec<TopologyHierarchy>) -> bool {
        let mut learned = self
            .learned
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = *learned != hierarchies;
        *learned = hierarchies;
        changed
    }

    /// `configured`, then each learned hierarchy whose levels none of them has already.
    pub fn merged(&self, configured: &[TopologyHierarchy]) -> Vec<TopologyHierarchy> {
        let learned = self
            .learned
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = configured.to_vec();
        for h in learned.iter() {
            if !out.iter().any(|c| c.levels == h.levels) {
                out.push(h.clone());
            }
        }
        out.truncate(TOPOLOGY_HIERARCHIES_MAX);
        out
    }
}

/// The first hierarchy of `hierarchies` that has `key` as a level.
pub fn hierarchy_of<'h>(
    hierarchies: &'h [TopologyHierarchy],
    key: &str,
) -> Option<&'h TopologyHierarchy> {
    hierarchies
        .iter()
        .find(|h| h.levels.iter().any(|l| l == key))
}

/// Members in consecutive slices of `size`, each slice in one domain of `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologySlice {
    /// The level each slice stays inside.
    pub key: String,
    /// Members per slice (the last slice may be smaller).
    pub size: u32,
}

/// Where a gang's members may go, in terms of topology domains.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologyConstraint {
    /// Every member in one domain of this level, or the gang does not place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<String>,
    /// As few domains of this level as possible (one if any holds the gang).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<String>,
    /// Slices of members, each in one domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<TopologySlice>,
}

impl TopologyConstraint {
    /// Whether the constraint asks nothing.
    pub fn is_none(&self) -> bool {
        self.required.is_none() && self.preferred.is_none() && self.slice.is_none()
    }

    /// Whether the constraint confines members to single domains (a required level or
    /// slices): such members are never combined from two shards' plans.
    pub fn confines(&self) -> bool {
        self.required.is_some() || self.slice.is_some()
    }

    /// Checks the keys and the slice size; errors name the field under `path`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        if let Some(key) = &self.required {
            validate_qualified_name(&path.child("required"), key)?;
        }
        if let Some(key) = &self.preferred {
            validate_qualified_name(&path.child("preferred"), key)?;
        }
        if let Some(slice) = &self.slice {
            let at = path.child("slice");
            validate_qualified_name(&at.child("key"), &slice.key)?;
            if slice.size == 0 {
                return Err(at.child("size").error("must be at least 1"));
            }
        }
        Ok(())
    }

    /// A short description for messages ("required rack, slices of 4 in host").
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(key) = &self.required {
            parts.push(format!("required {key}"));
        }
        if let Some(key) = &self.preferred {
            parts.push(format!("preferred {key}"));
        }
        if let Some(slice) = &self.slice {
            parts.push(format!("slices of {} in {}", slice.size, slice.key));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
