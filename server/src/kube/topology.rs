//! Topology constraints as Kubernetes users already write them: Kueue's pod-set
//! annotations, the topology constraint of Kubernetes' own PodGroup
//! (`spec.schedulingConstraints.topology`), and Volcano's `spec.networkTopology`
//! (tiers counted from the narrowest level of the cluster's first topology hierarchy);
//! and the hierarchies Kueue's `Topology` objects define ([`kueue_hierarchy`]).
//! Pure: [`crate::kube::gangs`] calls it while it works out a pod's gang, and a problem
//! is a [`PodProblem::Invalid`] naming the annotation or field, so the pod stays pending
//! with the reason rather than be placed without its constraint.

use serde_json::Value;

use crate::kube::gangs::annotation;
use crate::kube::objects::PodProblem;
use gangway_core::model::names::is_qualified_name;
use gangway_core::model::node::LABEL_HOSTNAME;
use gangway_core::model::{TopologyConstraint, TopologyHierarchy, TopologySlice};

/// Kueue: every pod of the pod set in one domain of this node label.
pub const KUEUE_REQUIRED: &str = "kueue.x-k8s.io/podset-required-topology";
/// Kueue: the pod set in as few domains of this node label as possible.
pub const KUEUE_PREFERRED: &str = "kueue.x-k8s.io/podset-preferred-topology";
/// Kueue: each slice of the pod set in one domain of this node label.
pub const KUEUE_SLICE_REQUIRED: &str = "kueue.x-k8s.io/podset-slice-required-topology";
/// Kueue: pods per slice.
pub const KUEUE_SLICE_SIZE: &str = "kueue.x-k8s.io/podset-slice-size";

/// The label keys of Volcano's network tiers, tier 1 first: the first hierarchy's levels
/// from the narrowest, without the host level (a tier groups nodes, as a HyperNode does).
pub fn volcano_tiers(hierarchies: &[TopologyHierarchy]) -> Vec<String> {
    hierarchies
        .first()
        .map(|h| {
            h.levels
                .iter()
                .rev()
                .filter(|l| l.as_str() != LABEL_HOSTNAME)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// A node label key named by `field`, checked.
fn level(field: &str, key: &str) -> Result<String, PodProblem> {
    if is_qualified_name(key) {
        Ok(key.to_string())
    } else {
        Err(PodProblem::Invalid(format!(
            "{field}: \"{key}\" is not a node label key"
        )))
    }
}

/// Kueue's pod-set topology annotations on `pod`, if it has any.
pub fn kueue_topology(pod: &Value) -> Result<Option<TopologyConstraint>, PodProblem> {
    let required = annotation(pod, KUEUE_REQUIRED)
        .map(|k| level(&format!("annotation {KUEUE_REQUIRED}"), k))
        .transpose()?;
    let preferred = annotation(pod, KUEUE_PREFERRED)
        .map(|k| level(&format!("annotation {KUEUE_PREFERRED}"), k))
        .transpose()?;
    let slice = match (
        annotation(pod, KUEUE_SLICE_REQUIRED),
        annotation(pod, KUEUE_SLICE_SIZE),
    ) {
        (None, None) => None,
        (Some(key), Some(size)) => {
            let key = level(&format!("annotation {KUEUE_SLICE_REQUIRED}"), key)?;
            let size = size
                .parse::<u32>()
                .ok()
                .filter(|s| *s >= 1)
                .ok_or_else(|| {
                    PodProblem::Invalid(format!(
                        "annotation {KUEUE_SLICE_SIZE}: \"{size}\" is not a positive integer"
                    ))
                })?;
            Some(TopologySlice { key, size })
        }
        (Some(_), None) => {
            return Err(PodProblem::Invalid(format!(
                "annotation {KUEUE_SLICE_REQUIRED} needs {KUEUE_SLICE_SIZE}"
            )))
        }
        (None, Some(_)) => {
            return Err(PodProblem::Invalid(format!(
                "annotation {KUEUE_SLICE_SIZE} needs {KUEUE_SLICE_REQUIRED}"
            )))
        }
    };
    let constraint = TopologyConstraint {
        required,
        preferred,
        slice,
    };
    Ok((!constraint.is_none()).then_some(constraint))
}

/// The topology constraint of a Kubernetes PodGroup (`spec`): one entry, whose `key`
/// every pod of the group shares one domain of.
pub fn kubernetes_topology(what: &str, spec: &Value) -> Result<TopologyConstraint, PodProblem> {
    let Some(entries) = spec["schedulingConstraints"]["topology"]
        .as_array()
        .filter(|t| !t.is_empty())
    else {
        return Ok(TopologyConstraint::default());
    };
    let field = "spec.schedulingConstraints.topology";
    if entries.len() > 1 {
        let keys: Vec<&str> = entries.iter().filter_map(|t| t["key"].as_str()).collect();
        return Err(PodProblem::Invalid(format!(
            "{what}: {field} lists {} keys ({}); gangway takes one",
            entries.len(),
            keys.join(", ")
        )));
    }
    let key = entries[0]["key"]
        .as_str()
        .ok_or_else(|| PodProblem::Invalid(format!("{what}: {field}[0].key is missing")))?;
    Ok(TopologyConstraint {
        required: Some(level(&format!("{what}: {field}[0].key"), key)?),
        ..TopologyConstraint::default()
    })
}

/// The topology constraint of a Volcano PodGroup (`spec.networkTopology`): `hard` keeps
/// every pod within one domain of tier `highestTierAllowed` (default 1); `soft` packs the
/// pods into as few tier-1 domains as it can, falling back tier by tier.
pub fn volcano_topology(
    what: &str,
    spec: &Value,
    tiers: &[String],
) -> Result<TopologyConstraint, PodProblem> {
    let network = &spec["networkTopology"];
    if network.is_null() {
        return Ok(TopologyConstraint::default());
    }
    let tier_key = |tier: u64| {
        usize::try_from(tier)
            .ok()
            .and_then(|t| t.checked_sub(1))
            .and_then(|t| tiers.get(t))
            .cloned()
            .ok_or_else(|| {
                PodProblem::Invalid(format!(
                    "{what}: spec.networkTopology names tier {tier}, and the cluster's topology has {} tiers (gangway's --topology-levels, narrowest first without the host level)",
                    tiers.len()
                ))
            })
    };
    match network["mode"].as_str().unwrap_or("hard") {
        "hard" => {
            let tier = match &network["highestTierAllowed"] {
                Value::Null => 1,
                v => v.as_u64().filter(|t| *t >= 1).ok_or_else(|| {
                    PodProblem::Invalid(format!(
                        "{what}: spec.networkTopology.highestTierAllowed {v} is not a positive integer"
                    ))
                })?,
            };
            Ok(TopologyConstraint {
                required: Some(tier_key(tier)?),
                ..TopologyConstraint::default()
            })
        }
        "soft" => Ok(TopologyConstraint {
            preferred: Some(tier_key(1)?),
            ..TopologyConstraint::default()
        }),
        other => Err(PodProblem::Invalid(format!(
            "{what}: spec.networkTopology.mode \"{other}\" is not hard or soft"
        ))),
    }
}

/// The hierarchy a Kueue `Topology` object (`kueue.x-k8s.io/v1beta1`) gives: its
/// `spec.levels[].nodeLabel`, widest first, named `kueue:NAME`.
pub fn kueue_hierarchy(object: &Value) -> Result<TopologyHierarchy, String> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let levels = object["spec"]["levels"]
        .as_array()
        .ok_or_else(|| format!("Topology {name}: spec.levels is missing"))?
        .iter()
        .enumerate()
        .map(|(i, l)| {
            l["nodeLabel"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("Topology {name}: spec.levels[{i}].nodeLabel is missing"))
        })
        .collect::<Result<Vec<String>, String>>()?;
    let hierarchy = TopologyHierarchy {
        name: format!("kueue:{name}"),
        levels,
    };
    hierarchy
        .validate(&gangway_core::model::FieldPath::root().child("spec"))
        .map_err(|e| format!("Topology {name}: {e}"))?;
    Ok(hierarchy)
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
