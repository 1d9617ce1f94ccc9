//! Which nodes a network-attached device pool serves.
//!
//! Owns [`PoolReach`]: a ResourceSlice's `allNodes: true`, or its `nodeSelector` (one
//! term, as `resource.k8s.io/v1` validation demands: label requirements and
//! `metadata.name` field requirements, all ANDed), and its validation (errors name the
//! field), or each device's own (`perDeviceNodeSelection`: the device's `nodeName`,
//! `nodeSelector` or `allNodes`, kept on the device). Node-local pools (`nodeName`) are
//! not described here: their devices live on their node. Invariant: a validated selector has at least one requirement, so it never
//! silently serves every node. Pure; called by the ledger (which nodes a pool admits,
//! checked at reservation), the engine (which pools a node sees) and the Kubernetes
//! adapter (slices in, an allocation's node selector out).

use serde::{Deserialize, Serialize};

use crate::model::device::Device;
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::validate_qualified_name;
use crate::model::node::Node;
use crate::model::pod::{NodeSelectorOperator, NodeSelectorRequirement};
use crate::model::selectors::requirement_matches;

/// The only field a node selector's `matchFields` may name.
pub const NODE_NAME_FIELD: &str = "metadata.name";
/// Most requirements in a pool's node selector (labels and fields together).
pub const REACH_REQUIREMENTS_MAX: usize = 32;
/// Most values in one requirement.
pub const REACH_VALUES_MAX: usize = 128;

/// The nodes a network-attached pool's devices are reachable from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PoolReach {
    /// Every node (`allNodes: true`).
    AllNodes,
    /// The nodes one node selector term admits.
    Selected(ReachTerm),
    /// Each device says (`perDeviceNodeSelection`: every device carries its own
    /// `nodeName`, `nodeSelector` or `allNodes`, kept as the device's reach).
    PerDevice,
}

/// One node selector term: every requirement must hold. As the API server demands, a
/// field requirement names exactly one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReachTerm {
    /// Requirements on node labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    /// Requirements on the node's name (`metadata.name`, In or NotIn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

impl PoolReach {
    /// Whether the pool's devices are reachable from `node`; for a pool whose devices
    /// each say, whether some may be (ask [`PoolReach::admits_device`] per device).
    pub fn admits(&self, node: &Node) -> bool {
        match self {
            Self::AllNodes | Self::PerDevice => true,
            Self::Selected(term) => term.admits(node),
        }
    }

    /// Whether `device` of a pool with this reach is reachable from `node`: its own
    /// reach where its pool lets each device say, else the pool's.
    pub fn admits_device(&self, device: &Device, node: &Node) -> bool {
        match (self, &device.reach) {
            (Self::PerDevice, Some(own)) => own.admits(node),
            (Self::PerDevice, None) => false,
            (pool, _) => pool.admits(node),
        }
    }

    /// Checks the selector; errors name the field under `path` (the slice's `spec`).
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        match self {
            Self::AllNodes | Self::PerDevice => Ok(()),
            Self::Selected(term) => term.validate(&path.child("nodeSelector")),
        }
    }
}

impl ReachTerm {
    /// Whether every requirement holds for `node`.
    pub fn admits(&self, node: &Node) -> bool {
        self.match_expressions
            .iter()
            .all(|r| requirement_matches(r, &node.labels))
            && self
                .match_fields
                .iter()
                .all(|r| name_matches(r, &node.name))
    }

    /// Checks the term; errors name the field under `path` (the `nodeSelector`).
    pub fn validate(&self, path: &FieldPath) -> Result<(), ValidationError> {
        let term = path.child("nodeSelectorTerms").index(0);
        let count = self.match_expressions.len() + self.match_fields.len();
        if count == 0 {
            return Err(term.error("must have at least one requirement"));
        }
        if count > REACH_REQUIREMENTS_MAX {
            return Err(term.error(format!(
                "has {count} requirements; at most {REACH_REQUIREMENTS_MAX} are supported"
            )));
        }
        for (i, req) in self.match_expressions.iter().enumerate() {
            let at = term.child("matchExpressions").index(i);
            validate_qualified_name(&at.child("key"), &req.key)?;
            validate_values(&at, req)?;
        }
        for (i, req) in self.match_fields.iter().enumerate() {
            let at = term.child("matchFields").index(i);
            if req.key != NODE_NAME_FIELD {
                return Err(at.child("key").error(format!(
                    "\"{}\" is not supported: only {NODE_NAME_FIELD}",
                    crate::model::error::clip(&req.key)
                )));
            }
            if !matches!(
                req.operator,
                NodeSelectorOperator::In | NodeSelectorOperator::NotIn
            ) {
                return Err(at
                    .child("operator")
                    .error("must be In or NotIn for a field requirement"));
            }
            if req.values.len() != 1 {
                return Err(at
                    .child("values")
                    .error("must be exactly one node name for a field requirement"));
            }
        }
        Ok(())
    }
}

/// A field requirement on the node's name.
fn name_matches(req: &NodeSelectorRequirement, name: &str) -> bool {
    let listed = req.values.iter().any(|v| v == name);
    match req.operator {
        NodeSelectorOperator::In => listed,
        NodeSelectorOperator::NotIn => !listed,
        _ => false,
    }
}

/// The values an operator needs: some for In and NotIn, none for Exists and
/// DoesNotExist, one integer for Gt and Lt.
fn validate_values(at: &FieldPath, req: &NodeSelectorRequirement) -> Result<(), ValidationError> {
    let values = at.child("values");
    if req.values.len() > REACH_VALUES_MAX {
        return Err(values.error(format!(
            "has {} values; at most {REACH_VALUES_MAX} are supported",
            req.values.len()
        )));
    }
    match req.operator {
        NodeSelectorOperator::In | NodeSelectorOperator::NotIn if req.values.is_empty() => {
            Err(values.error("must not be empty for In and NotIn"))
        }
        NodeSelectorOperator::Exists | NodeSelectorOperator::DoesNotExist
            if !req.values.is_empty() =>
        {
            Err(values.error("must be empty for Exists and DoesNotExist"))
        }
        NodeSelectorOperator::Gt | NodeSelectorOperator::Lt
            if req.values.len() != 1 || req.values[0].parse::<i64>().is_err() =>
        {
            Err(values.error("must be one integer for Gt and Lt"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "reach_tests.rs"]
mod tests;
