//! Scheduling profile: which score plugins run, with which weights and arguments.
//!
//! Owns [`Profile`], a KubeSchedulerConfiguration-like description (serde, camelCase):
//! enabled score plugins with weights (the default adds DynamicResources, weight 1), the resources and weights the resource-fit
//! strategies score, the RequestedToCapacityRatio shape (utilization 0..=100 → score
//! 0..=10, scaled to 0..=100 as Kubernetes does), the node label used to pack a gang
//! into one topology domain, the cluster's topology hierarchies, and `percentageOfNodesToScore` (how much of the cluster a
//! node search looks at, as kube-scheduler's setting of that name). Invariants of a
//! validated profile: weights within 1..=[`PLUGIN_WEIGHT_MAX`], at most one resource-fit
//! strategy, no plugin twice, a shape with strictly increasing utilizations, a
//! percentage within 0..=100. Called by the engine's scoring and placement,
//! and by configuration loading.

use serde::{Deserialize, Serialize};

use crate::engine::search::ALL_NODES_PERCENTAGE;
use crate::model::error::{FieldPath, ValidationError};
use crate::model::names::validate_qualified_name;
use crate::model::node::LABEL_ZONE;
use crate::model::resources::ResourceName;
use crate::model::topology::{TopologyHierarchy, TOPOLOGY_HIERARCHIES_MAX};

/// Largest plugin or resource weight.
pub const PLUGIN_WEIGHT_MAX: u32 = 100;
/// Largest utilization in a shape point (percent).
pub const SHAPE_UTILIZATION_MAX: u32 = 100;
/// Largest score in a shape point (Kubernetes' MaxCustomPriorityScore).
pub const SHAPE_SCORE_MAX: u32 = 10;

/// A score plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ScorePlugin {
    /// NodeResourcesFit, strategy LeastAllocated: prefer emptier nodes.
    LeastAllocated,
    /// NodeResourcesFit, strategy MostAllocated: prefer fuller nodes (bin packing).
    MostAllocated,
    /// NodeResourcesFit, strategy RequestedToCapacityRatio: a utilization → score shape.
    RequestedToCapacityRatio,
    /// NodeResourcesBalancedAllocation: prefer nodes whose resources stay balanced.
    BalancedAllocation,
    /// NodeAffinity: preferred node affinity terms.
    NodeAffinity,
    /// TaintToleration: fewer intolerable PreferNoSchedule taints.
    TaintToleration,
    /// InterPodAffinity: preferred pod affinity and anti-affinity terms.
    InterPodAffinity,
    /// DynamicResources: prefer nodes whose devices satisfy earlier firstAvailable
    /// choices, then (with network-attached pools) nodes that take fewer network devices.
    DynamicResources,
}

impl ScorePlugin {
    /// Whether this plugin is one of the three resource-fit strategies.
    pub fn is_fit_strategy(self) -> bool {
        matches!(
            self,
            Self::LeastAllocated | Self::MostAllocated | Self::RequestedToCapacityRatio
        )
    }
}

/// An enabled plugin and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginWeight {
    /// The plugin.
    pub plugin: ScorePlugin,
    /// Its weight in the weighted sum.
    pub weight: u32,
}

/// A resource scored by the fit strategies, and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceWeight {
    /// Resource name (`cpu`, `memory`, `nvidia.com/gpu`, …).
    pub name: String,
    /// Its weight.
    pub weight: u32,
}

/// One point of the RequestedToCapacityRatio shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShapePoint {
    /// Utilization in percent, 0..=100.
    pub utilization: u32,
    /// Score at that utilization, 0..=10.
    pub score: u32,
}

/// Score plugins and their arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    /// Enabled score plugins with weights.
    pub score_plugins: Vec<PluginWeight>,
    /// Resources (and weights) the fit strategies score.
    pub fit_resources: Vec<ResourceWeight>,
    /// RequestedToCapacityRatio shape.
    pub shape: Vec<ShapePoint>,
    /// Node label whose values are the domains a gang is packed into; `None` disables packing.
    pub gang_topology_key: Option<String>,
    /// kube-scheduler's percentageOfNodesToScore: a node search stops once it has found
    /// this share of the nodes feasible (never fewer than 100 nodes, and never before the
    /// found nodes hold every member being placed). 0 (the default) is adaptive,
    /// `50 - nodes/125` percent but at least 5; 100 searches every node.
    #[serde(default)]
    pub percentage_of_nodes_to_score: u32,
    /// The cluster's topology hierarchies (label keys widest first): a gang's preferred
    /// level falls back to the levels above it in its hierarchy, and a required level is
    /// packed into the level below it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topologies: Vec<TopologyHierarchy>,
}

impl Default for Profile {
    /// Kubernetes' default score weights, LeastAllocated over cpu and memory, a
    /// bin-packing RTCR shape, and zone packing for gangs.
    fn default() -> Self {
        let plugin = |plugin, weight| PluginWeight { plugin, weight };
        let resource = |name: &str| ResourceWeight {
            name: name.to_string(),
            weight: 1,
        };
        Self {
            score_plugins: vec![
                plugin(ScorePlugin::LeastAllocated, 1),
                plugin(ScorePlugin::BalancedAllocation, 1),
                plugin(ScorePlugin::NodeAffinity, 2),
                plugin(ScorePlugin::TaintToleration, 3),
                plugin(ScorePlugin::InterPodAffinity, 2),
                plugin(ScorePlugin::DynamicResources, 1),
            ],
            fit_resources: vec![resource("cpu"), resource("memory")],
            shape: vec![
                ShapePoint {
                    utilization: 0,
                    score: 0,
                },
                ShapePoint {
                    utilization: 100,
                    score: SHAPE_SCORE_MAX,
                },
            ],
            gang_topology_key: Some(LABEL_ZONE.to_string()),
            percentage_of_nodes_to_score: 0,
            topologies: Vec::new(),
        }
    }
}

impl Profile {
    /// The weight of `plugin`, if enabled.
    pub fn weight_of(&self, plugin: ScorePlugin) -> Option<u32> {
        self.score_plugins
            .iter()
            .find(|p| p.plugin == plugin)
            .map(|p| p.weight)
    }

    /// The fit resources as names and weights.
    pub fn resource_weights(&self) -> Vec<(ResourceName, u64)> {
        self.fit_resources
            .iter()
            .map(|r| (ResourceName::from_name(&r.name), u64::from(r.weight)))
            .collect()
    }

    /// Checks the profile; errors name the field path.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let root = FieldPath::root();
        self.validate_plugins(&root.child("scorePlugins"))?;
        self.validate_resources(&root.child("fitResources"))?;
        validate_shape(&root.child("shape"), &self.shape)?;
        if self.percentage_of_nodes_to_score > ALL_NODES_PERCENTAGE {
            return Err(root.child("percentageOfNodesToScore").error(format!(
                "{} out of range 0..={ALL_NODES_PERCENTAGE}",
                self.percentage_of_nodes_to_score
            )));
        }
        if let Some(key) = &self.gang_topology_key {
            validate_qualified_name(&root.child("gangTopologyKey"), key)?;
        }
        let topologies = root.child("topologies");
        if self.topologies.len() > TOPOLOGY_HIERARCHIES_MAX {
            return Err(topologies.error(format!(
                "{} topologies exceed the limit of {TOPOLOGY_HIERARCHIES_MAX}",
                self.topologies.len()
            )));
        }
        for (i, hierarchy) in self.topologies.iter().enumerate() {
            hierarchy.validate(&topologies.index(i))?;
        }
        Ok(())
    }

    fn validate_plugins(&self, path: &FieldPath) -> Result<(), ValidationError> {
        for (i, p) in self.score_plugins.iter().enumerate() {
            let at = path.index(i);
            validate_weight(&at.child("weight"), p.weight)?;
            if self.score_plugins[..i].iter().any(|q| q.plugin == p.plugin) {
                return Err(at.error(format!("plugin {:?} enabled twice", p.plugin)));
            }
            let other_fit = self.score_plugins[..i]
                .iter()
                .any(|q| q.plugin.is_fit_strategy());
            if p.plugin.is_fit_strategy() && other_fit {
                return Err(at.error(
                    "at most one of LeastAllocated, MostAllocated, RequestedToCapacityRatio may be enabled",
                ));
            }
        }
        Ok(())
    }

    fn validate_resources(&self, path: &FieldPath) -> Result<(), ValidationError> {
        for (i, r) in self.fit_resources.iter().enumerate() {
            let at = path.index(i);
            ResourceName::parse(&at.child("name"), &r.name)?;
            validate_weight(&at.child("weight"), r.weight)?;
            if self.fit_resources[..i].iter().any(|q| q.name == r.name) {
                return Err(at
                    .child("name")
                    .error(format!("resource {} listed twice", r.name)));
            }
        }
        Ok(())
    }
}

fn validate_weight(path: &FieldPath, weight: u32) -> Result<(), ValidationError> {
    if (1..=PLUGIN_WEIGHT_MAX).contains(&weight) {
        Ok(())
    } else {
        Err(path.error(format!(
            "weight {weight} out of range 1..={PLUGIN_WEIGHT_MAX}"
        )))
    }
}

fn validate_shape(path: &FieldPath, shape: &[ShapePoint]) -> Result<(), ValidationError> {
    if shape.is_empty() {
        return Err(path.error("needs at least one point"));
    }
    for (i, point) in shape.iter().enumerate() {
        let at = path.index(i);
        if point.utilization > SHAPE_UTILIZATION_MAX {
            return Err(at.child("utilization").error(format!(
                "{} out of range 0..={SHAPE_UTILIZATION_MAX}",
                point.utilization
            )));
        }
        if point.score > SHAPE_SCORE_MAX {
            return Err(at.child("score").error(format!(
                "{} out of range 0..={SHAPE_SCORE_MAX}",
                point.score
            )));
        }
        if i > 0 && shape[i - 1].utilization >= point.utilization {
            return Err(at
                .child("utilization")
                .error("utilizations must increase strictly"));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "profile_tests.rs"]
mod tests;
