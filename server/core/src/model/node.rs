//! Nodes as the scheduler sees them.
//!
//! Owns [`Node`] (name, labels, taints, allocatable, schedulability, readiness), its
//! [`Taint`]s, and [`RawNode`], the Kubernetes-shaped JSON form that validation turns
//! into a `Node`. Invariant: a validated node has a DNS-1123 name, valid label keys and
//! values, no duplicate (key, effect) taint, and canonical allocatable. Called by the
//! kube adapter and node agents (through validation), the ledger (RegisterNode) and the
//! engine (filters and scores).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::compact::{SmallMap, Symbol};
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::{
    validate_dns_subdomain, validate_label_value, validate_labels, validate_qualified_name,
};
use crate::model::resources::{RawResourceList, ResourceListKind, Resources};

/// Well-known label holding the node's name.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Well-known zone label, the default gang packing domain.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Taint key a cordoned node is treated as carrying (effect NoSchedule).
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// What a taint does to pods that do not tolerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    /// New pods are not scheduled here.
    NoSchedule,
    /// New pods avoid this node when they can (scoring only).
    PreferNoSchedule,
    /// New pods are not scheduled here and running ones are evicted.
    NoExecute,
}

impl TaintEffect {
    /// Parses the Kubernetes spelling, naming the allowed values on error.
    pub fn parse(path: &FieldPath, value: &str) -> Result<Self, ValidationError> {
        match value {
            "NoSchedule" => Ok(Self::NoSchedule),
            "PreferNoSchedule" => Ok(Self::PreferNoSchedule),
            "NoExecute" => Ok(Self::NoExecute),
            other => Err(path.error(format!(
                "unknown taint effect \"{other}\": expected one of NoSchedule, PreferNoSchedule, NoExecute"
            ))),
        }
    }
}

impl fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        };
        f.write_str(text)
    }
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    /// Taint key (a qualified name).
    pub key: String,
    /// Taint value (may be empty).
    pub value: String,
    /// Effect on pods that do not tolerate it.
    pub effect: TaintEffect,
}

/// Whether new pods may be placed on a node (`spec.unschedulable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Schedulability {
    /// Open for new pods.
    Schedulable,
    /// Cordoned: only pods tolerating `node.kubernetes.io/unschedulable:NoSchedule` may come.
    Cordoned,
}

/// The node's Ready condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Readiness {
    /// Ready=True.
    Ready,
    /// Ready=False or Unknown.
    NotReady,
}

/// A node's labels: keys and values shared with every other node that has them, once
/// the shard ledger has interned them.
pub type Labels = SmallMap<Symbol, Symbol>;

/// A node: what it offers and what it demands of pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Node name (DNS-1123 subdomain).
    pub name: String,
    /// Node labels.
    pub labels: Labels,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// Resources available to pods.
    pub allocatable: Resources,
    /// Cordon state.
    pub schedulability: Schedulability,
    /// Ready condition.
    pub readiness: Readiness,
}

impl Node {
    /// What a registration of `sent` would change in this node, one phrase per field
    /// (labels, taints, allocatable, cordon state; readiness is the lease's), each
    /// naming the registered value first. Empty for the same node.
    pub fn differences(&self, sent: &Node) -> Vec<String> {
        let mut out = Vec::new();
        let mut differ = |field: &str, registered: String, given: String| {
            if registered != given {
                out.push(format!(
                    "{field} ({} registered, {} sent)",
                    crate::model::clip(&registered),
                    crate::model::clip(&given)
                ));
            }
        };
        differ(
            "labels",
            format!("{:?}", self.labels),
            format!("{:?}", sent.labels),
        );
        differ(
            "taints",
            format!("{:?}", self.taints),
            format!("{:?}", sent.taints),
        );
        differ(
            "allocatable",
            format!("{:?}", self.allocatable),
            format!("{:?}", sent.allocatable),
        );
        differ(
            "unschedulable",
            format!("{}", self.schedulability == Schedulability::Cordoned),
            format!("{}", sent.schedulability == Schedulability::Cordoned),
        );
        out
    }

    /// A ready, schedulable node with no labels or taints.
    pub fn new(name: impl Into<String>, allocatable: Resources) -> Self {
        Self {
            name: name.into(),
            labels: Labels::new(),
            taints: Vec::new(),
            allocatable,
            schedulability: Schedulability::Schedulable,
            readiness: Readiness::Ready,
        }
    }

    /// The value of label `key`, if set.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(Symbol::as_str)
    }

    /// Checks a node built in code or decoded from a command.
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        validate_dns_subdomain(&path.child("name"), &self.name)?;
        validate_labels(&path.child("labels"), &self.labels)?;
        validate_taints(&path.child("taints"), &self.taints)?;
        self.allocatable.validate(&path.child("allocatable"))
    }
}

fn validate_taints(path: &FieldPath, taints: &[Taint]) -> Result<(), ValidationError> {
    for (i, taint) in taints.iter().enumerate() {
        let at = path.index(i);
        validate_qualified_name(&at.child("key"), &taint.key)?;
        validate_label_value(&at.child("value"), &taint.value)?;
        let duplicate = taints[..i]
            .iter()
            .any(|t| t.key == taint.key && t.effect == taint.effect);
        if duplicate {
            return Err(at.error(format!(
                "duplicate taint \"{}\" with effect {}",
                taint.key, taint.effect
            )));
        }
    }
    Ok(())
}

/// A taint as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawTaint {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// A node as submitted (Kubernetes field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawNode {
    /// Node name.
    pub name: String,
    /// Node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<RawTaint>,
    /// Allocatable resources as quantities.
    #[serde(default)]
    pub allocatable: RawResourceList,
    /// `spec.unschedulable`.
    #[serde(default)]
    pub unschedulable: bool,
    /// Ready condition; absent means ready.
    #[serde(default = "default_ready")]
    pub ready: bool,
}

fn default_ready() -> bool {
    true
}

impl RawNode {
    /// Validates and converts into a [`Node`]; errors name the field path.
    pub fn validate(&self) -> Result<Node, ValidationError> {
        let root = FieldPath::root();
        let taints = self
            .taints
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let at = root.child("taints").index(i);
                Ok(Taint {
                    key: t.key.clone(),
                    value: t.value.clone(),
                    effect: TaintEffect::parse(&at.child("effect"), &t.effect)?,
                })
            })
            .collect::<Result<Vec<_>, ValidationError>>()?;
        let node = Node {
            name: self.name.clone(),
            labels: self.labels.iter().collect(),
            taints,
            allocatable: Resources::from_raw(
                &root.child("allocatable"),
                &self.allocatable,
                ResourceListKind::Allocatable,
            )?,
            schedulability: if self.unschedulable {
                Schedulability::Cordoned
            } else {
                Schedulability::Schedulable
            },
            readiness: if self.ready {
                Readiness::Ready
            } else {
                Readiness::NotReady
            },
        };
        node.validate(&root)?;
        Ok(node)
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
