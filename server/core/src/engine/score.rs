//! Scores: how good is each feasible node for a pod template.
//!
//! Owns the score plugins, each giving 0..=[`MAX_NODE_SCORE`] per node with Kubernetes'
//! arithmetic: LeastAllocated, MostAllocated and RequestedToCapacityRatio (weighted over
//! the profile's resources, skipping resources a node does not have), BalancedAllocation
//! (one minus the standard deviation of the requested fractions), NodeAffinity (sum of
//! matching preferred weights, normalized by the maximum), TaintToleration (intolerable
//! PreferNoSchedule taints, normalized and reversed), InterPodAffinity (preferred
//! terms, min–max normalized) and DynamicResources (the firstAvailable preference of
//! the devices the filter allocated, then, where the cluster has network-attached pools,
//! how few network devices they take; normalized by the maximum). The total is the weighted sum over enabled plugins.
//! "Requested" means what the node holds plus the candidate's own footprint. Pure
//! functions, and [`Scorer`], the same sums prepared once per pod template and read from
//! a node's [`NodeFit`] summary; called by placement, quoting and preemption.

use crate::engine::cluster::Cluster;
use crate::engine::devices::DeviceDemand;
use crate::engine::interpod::InterPodState;
use crate::engine::profile::{Profile, ScorePlugin, ShapePoint};
use crate::engine::taints::intolerable_prefer_no_schedule;
use crate::ledger::view::{fixed_dims, NodeFit, FIXED_DIMS};
use crate::model::pod::PodSpec;
use crate::model::resources::{ResourceName, Resources};
use crate::model::selectors::preferred_affinity_weight;

/// Highest score one plugin gives a node.
pub const MAX_NODE_SCORE: u64 = 100;
/// Highest utilization, in percent.
const MAX_UTILIZATION: u64 = 100;
/// Factor from shape scores (0..=10) to node scores (0..=100).
const SHAPE_SCALE: i64 = (MAX_NODE_SCORE / 10) as i64;
/// Fractions kept on the stack by BalancedAllocation before it spills to the heap.
const INLINE_FRACTIONS: usize = 8;

/// Whether a normalized score rises or falls with the raw value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Higher raw value, higher score.
    Ascending,
    /// Higher raw value, lower score.
    Descending,
}

/// Weighted mean of `f(requested, capacity)` over `(requested, capacity, weight)`
/// triples whose capacity is non-zero.
fn weighted_mean(items: impl Iterator<Item = (u64, u64, u64)>, f: impl Fn(u64, u64) -> u64) -> u64 {
    let mut sum: u128 = 0;
    let mut weight_sum: u128 = 0;
    for (requested, capacity, weight) in items {
        if capacity == 0 {
            continue;
        }
        sum += u128::from(f(requested, capacity)) * u128::from(weight);
        weight_sum += u128::from(weight);
    }
    if weight_sum == 0 {
        return 0;
    }
    let mean = match (u64::try_from(sum), u64::try_from(weight_sum)) {
        (Ok(sum), Ok(weight_sum)) => u128::from(sum / weight_sum),
        _ => sum / weight_sum,
    };
    u64::try_from(mean).unwrap_or(MAX_NODE_SCORE)
}

/// `(requested, capacity, weight)` of every weighted resource.
fn by_name<'w>(
    requested: &'w Resources,
    allocatable: &'w Resources,
    weights: &'w [(ResourceName, u64)],
) -> impl Iterator<Item = (u64, u64, u64)> + 'w {
    weights
        .iter()
        .map(|(name, weight)| (requested.get(name), allocatable.get(name), *weight))
}

/// `a * b / c` without overflow (c > 0).
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let c = c.max(1);
    match a.checked_mul(b) {
        Some(product) => product / c,
        None => u64::try_from(u128::from(a) * u128::from(b) / u128::from(c)).unwrap_or(u64::MAX),
    }
}

fn least_one(requested: u64, capacity: u64) -> u64 {
    if requested > capacity {
        0
    } else {
        mul_div(capacity - requested, MAX_NODE_SCORE, capacity)
    }
}

fn most_one(requested: u64, capacity: u64) -> u64 {
    mul_div(requested.min(capacity), MAX_NODE_SCORE, capacity)
}

/// LeastAllocated: `(capacity - requested) * 100 / capacity`, 0 when over capacity.
pub fn least_allocated(
    requested: &Resources,
    allocatable: &Resources,
    weights: &[(ResourceName, u64)],
) -> u64 {
    weighted_mean(by_name(requested, allocatable, weights), least_one)
}

/// MostAllocated: `min(requested, capacity) * 100 / capacity`.
pub fn most_allocated(
    requested: &Resources,
    allocatable: &Resources,
    weights: &[(ResourceName, u64)],
) -> u64 {
    weighted_mean(by_name(requested, allocatable, weights), most_one)
}

/// The piecewise-linear shape function (Kubernetes' BuildBrokenLinearFunction), on 0..=100 scores.
pub fn broken_linear(shape: &[ShapePoint], utilization: i64) -> i64 {
    let point = |p: &ShapePoint| (i64::from(p.utilization), i64::from(p.score) * SHAPE_SCALE);
    for (i, p) in shape.iter().enumerate() {
        let (x1, y1) = point(p);
        if utilization <= x1 {
            if i == 0 {
                return y1;
            }
            let (x0, y0) = point(&shape[i - 1]);
            return y0 + (y1 - y0) * (utilization - x0) / (x1 - x0).max(1);
        }
    }
    shape.last().map(|p| point(p).1).unwrap_or(0)
}

/// RequestedToCapacityRatio: the shape at each resource's utilization, weighted, rounded.
///
/// As in Kubernetes, a resource scoring zero does not count towards the weights.
pub fn requested_to_capacity_ratio(
    requested: &Resources,
    allocatable: &Resources,
    weights: &[(ResourceName, u64)],
    shape: &[ShapePoint],
) -> u64 {
    ratio_of(by_name(requested, allocatable, weights), shape)
}

fn ratio_of(items: impl Iterator<Item = (u64, u64, u64)>, shape: &[ShapePoint]) -> u64 {
    let mut sum: i128 = 0;
    let mut weight_sum: i128 = 0;
    for (req, capacity, weight) in items {
        if capacity == 0 {
            continue;
        }
        let utilization = if req > capacity {
            MAX_UTILIZATION
        } else {
            mul_div(req, MAX_UTILIZATION, capacity)
        };
        let score = broken_linear(shape, i64::try_from(utilization).unwrap_or(0));
        if score > 0 {
            sum += i128::from(score) * i128::from(weight);
            weight_sum += i128::from(weight);
        }
    }
    if weight_sum == 0 {
        return 0;
    }
    // Round half away from zero, like math.Round on a non-negative quotient.
    u64::try_from((2 * sum + weight_sum) / (2 * weight_sum)).unwrap_or(0)
}

/// BalancedAllocation: `(1 - std(fractions)) * 100` over resources the node has.
pub fn balanced_allocation(
    requested: &Resources,
    allocatable: &Resources,
    names: &[ResourceName],
) -> u64 {
    balanced_of(
        names
            .iter()
            .map(|name| (requested.get(name), allocatable.get(name))),
    )
}

fn balanced_of(pairs: impl Iterator<Item = (u64, u64)>) -> u64 {
    let mut inline = [0.0f64; INLINE_FRACTIONS];
    let mut spilled: Vec<f64> = Vec::new();
    let mut len = 0;
    for (requested, capacity) in pairs {
        if capacity == 0 {
            continue;
        }
        let fraction = (requested as f64 / capacity as f64).min(1.0);
        match inline.get_mut(len) {
            Some(slot) => *slot = fraction,
            None => {
                if spilled.is_empty() {
                    spilled.extend_from_slice(&inline);
                }
                spilled.push(fraction);
            }
        }
        len += 1;
    }
    let fractions = if len <= INLINE_FRACTIONS {
        &inline[..len]
    } else {
        &spilled[..]
    };
    let std = match fractions {
        [a, b] => ((a - b) / 2.0).abs(),
        [_, _, _, ..] => {
            let n = fractions.len() as f64;
            let mean = fractions.iter().sum::<f64>() / n;
            (fractions
                .iter()
                .map(|f| (f - mean) * (f - mean))
                .sum::<f64>()
                / n)
                .sqrt()
        }
        _ => 0.0,
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as u64
}

/// One raw score scaled to 0..=100 by the maximum of its set.
fn scale_by_max(score: u64, max: u64, direction: Direction) -> u64 {
    let scaled = if max == 0 {
        0
    } else {
        mul_div(score, MAX_NODE_SCORE, max)
    };
    match (direction, max) {
        (Direction::Descending, 0) => MAX_NODE_SCORE,
        (Direction::Descending, _) => MAX_NODE_SCORE - scaled.min(MAX_NODE_SCORE),
        (Direction::Ascending, _) => scaled,
    }
}

/// One raw score scaled to 0..=100 between the minimum and maximum of its set.
fn scale_min_max(score: i64, min: i64, max: i64) -> u64 {
    let span = i128::from(max) - i128::from(min);
    if span <= 0 {
        return 0;
    }
    let scaled = (i128::from(score) - i128::from(min)) * i128::from(MAX_NODE_SCORE) / span;
    u64::try_from(scaled).unwrap_or(0)
}

/// Scales raw scores to 0..=100 by the maximum (DefaultNormalizeScore).
pub fn normalize_by_max(raw: &[u64], direction: Direction) -> Vec<u64> {
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|&score| scale_by_max(score, max, direction))
        .collect()
}

/// Scales raw scores to 0..=100 between their minimum and maximum (all 0 if equal).
pub fn normalize_min_max(raw: &[i64]) -> Vec<u64> {
    let min = raw.iter().copied().min().unwrap_or(0);
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|&score| scale_min_max(score, min, max))
        .collect()
}

/// What scoring needs to know about the candidate.
#[derive(Debug, Clone, Copy)]
pub struct ScoreInput<'s> {
    /// The spec.
    pub spec: &'s PodSpec,
    /// Its footprint.
    pub footprint: &'s Resources,
    /// Its inter-pod state.
    pub interpod: &'s InterPodState,
    /// The profile.
    pub profile: &'s Profile,
}

/// One node's score before normalization: the weighted sum of the plugins that score
/// a node on its own, and the raw values of those normalized over the scored set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawScore {
    /// Weighted sum of the resource-fit strategy and BalancedAllocation scores.
    pub local: u64,
    /// Summed weights of the matching preferred node affinity terms.
    pub affinity: u64,
    /// Intolerable PreferNoSchedule taints.
    pub taints: u64,
    /// Preferred inter-pod (anti-)affinity score.
    pub interpod: i64,
    /// firstAvailable preference of the devices the node would allocate (DynamicResources).
    pub devices: u64,
}

impl RawScore {
    /// A score with only the node-local part.
    #[inline]
    pub fn local_only(local: u64) -> Self {
        Self {
            local,
            affinity: 0,
            taints: 0,
            interpod: 0,
            devices: 0,
        }
    }
}

/// Normalization of a scored set: the weighted sum of the normalized scores that are
/// the same on every node, and the maxima (and minimum) of those that vary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Normalizer {
    constant: u64,
    affinity: Option<(u64, u64)>,
    taints: Option<(u64, u64)>,
    interpod: Option<(u64, i64, i64)>,
    devices: Option<(u64, u64)>,
}

impl Normalizer {
    /// The weighted total of a node of the set.
    #[inline]
    pub fn total(&self, raw: &RawScore) -> u64 {
        let mut total = raw.local.saturating_add(self.constant);
        if let Some((weight, max)) = self.affinity {
            let score = scale_by_max(raw.affinity, max, Direction::Ascending);
            total = total.saturating_add(score.saturating_mul(weight));
        }
        if let Some((weight, max)) = self.taints {
            let score = scale_by_max(raw.taints, max, Direction::Descending);
            total = total.saturating_add(score.saturating_mul(weight));
        }
        if let Some((weight, min, max)) = self.interpod {
            let score = scale_min_max(raw.interpod, min, max);
            total = total.saturating_add(score.saturating_mul(weight));
        }
        if let Some((weight, max)) = self.devices {
            let score = scale_by_max(raw.devices, max, Direction::Ascending);
            total = total.saturating_add(score.saturating_mul(weight));
        }
        total
    }
}

/// A pod template's scoring prepared once for many nodes of one cluster.
///
/// Plugins that score a node on its own read the node's [`NodeFit`] when every fit
/// resource is a built-in one; the others read labels or taints only when the template
/// or the node's flags say the raw value can differ from zero. Totals equal
/// [`score_nodes`]' plugin-by-plugin sums.
#[derive(Debug, Clone)]
pub struct Scorer<'s> {
    input: ScoreInput<'s>,
    weights: Vec<(ResourceName, u64)>,
    names: Vec<ResourceName>,
    /// `(dimension, weight)` of every fit resource, when all are built-in.
    fixed: Option<Vec<(usize, u64)>>,
    footprint: [u64; FIXED_DIMS],
    /// Enabled node-local plugins with their weights, in profile order.
    local: Vec<(ScorePlugin, u64)>,
    /// Summed weights of the normalized plugins, when they can vary between nodes.
    affinity: Option<u64>,
    taints: Option<u64>,
    interpod: Option<u64>,
    /// Weight of the device score, when the template has firstAvailable requests.
    devices: Option<u64>,
}

fn fixed_dim(name: &ResourceName) -> Option<usize> {
    match name {
        ResourceName::Cpu => Some(0),
        ResourceName::Memory => Some(1),
        ResourceName::Pods => Some(2),
        ResourceName::EphemeralStorage => Some(3),
        ResourceName::Extended(_) => None,
    }
}

impl<'s> Scorer<'s> {
    /// Prepares scoring of `input`.
    pub fn new(input: ScoreInput<'s>) -> Self {
        let weights = input.profile.resource_weights();
        let names = weights.iter().map(|(name, _)| name.clone()).collect();
        let fixed = weights
            .iter()
            .map(|(name, weight)| Some((fixed_dim(name)?, *weight)))
            .collect();
        let mut local = Vec::new();
        let (mut affinity, mut taints, mut interpod) = (None, None, None);
        let add = |slot: &mut Option<u64>, weight: u64| {
            *slot = Some(slot.unwrap_or(0).saturating_add(weight));
        };
        for enabled in &input.profile.score_plugins {
            let weight = u64::from(enabled.weight);
            match enabled.plugin {
                ScorePlugin::NodeAffinity => {
                    if !input.spec.node_affinity.preferred.is_empty() {
                        add(&mut affinity, weight);
                    }
                }
                ScorePlugin::TaintToleration => add(&mut taints, weight),
                ScorePlugin::InterPodAffinity => {
                    if !input.interpod.prefers_nothing() {
                        add(&mut interpod, weight);
                    }
                }
                // Weighed through `with_devices`, from what the device filter found.
                ScorePlugin::DynamicResources => {}
                plugin => local.push((plugin, weight)),
            }
        }
        Self {
            input,
            weights,
            names,
            fixed,
            footprint: fixed_dims(input.footprint),
            local,
            affinity,
            taints,
            interpod,
            devices: None,
        }
    }

    /// The same scorer, also weighing the device score of `devices` (a template's
    /// device needs) when it has firstAvailable requests, or the cluster has
    /// network-attached pools (`network`), and the profile enables DynamicResources.
    pub fn with_devices(mut self, devices: Option<&DeviceDemand>, network: bool) -> Self {
        self.devices = match (
            devices,
            self.input.profile.weight_of(ScorePlugin::DynamicResources),
        ) {
            (Some(demand), Some(weight)) if demand.scores() || network => Some(u64::from(weight)),
            _ => None,
        };
        self
    }

    /// Raw score of node `idx` (planned pods included).
    pub fn raw(&self, cluster: &Cluster<'_>, idx: usize) -> RawScore {
        match cluster.fit(idx) {
            Some(fit) => self.raw_fit(cluster, idx, &fit),
            None => RawScore::default(),
        }
    }

    /// Whether every raw score but `local` is zero on nodes without
    /// [`NodeFit::SOFT_TAINTS`], and `local` depends on the node's summary alone.
    pub fn reads_fit_only(&self) -> bool {
        self.fixed.is_some() && self.affinity.is_none() && self.interpod.is_none()
    }

    /// [`Scorer::raw`] given node `idx`'s summary `fit` (`cluster.fit(idx)`).
    pub fn raw_fit(&self, cluster: &Cluster<'_>, idx: usize, fit: &NodeFit) -> RawScore {
        let Some(node) = cluster.node(idx) else {
            return RawScore::default();
        };
        let spec = self.input.spec;
        RawScore {
            local: self.local_score(cluster, idx, fit),
            affinity: match self.affinity {
                Some(_) => preferred_affinity_weight(&spec.node_affinity, &node.labels),
                None => 0,
            },
            taints: if self.taints.is_some() && fit.has(NodeFit::SOFT_TAINTS) {
                intolerable_prefer_no_schedule(&node.taints, &spec.tolerations)
            } else {
                0
            },
            interpod: match self.interpod {
                Some(_) => self.input.interpod.preferred_score(node),
                None => 0,
            },
            devices: 0,
        }
    }

    fn local_score(&self, cluster: &Cluster<'_>, idx: usize, fit: &NodeFit) -> u64 {
        if self.local.is_empty() {
            return 0;
        }
        let shape = &self.input.profile.shape;
        let mut total = 0u64;
        match &self.fixed {
            Some(dims) => {
                let mut requested = [0u64; FIXED_DIMS];
                for (d, slot) in requested.iter_mut().enumerate() {
                    *slot = fit.requested[d].saturating_add(self.footprint[d]);
                }
                let items = || {
                    dims.iter()
                        .map(|&(d, weight)| (requested[d], fit.allocatable[d], weight))
                };
                for &(plugin, weight) in &self.local {
                    let score = match plugin {
                        ScorePlugin::LeastAllocated => weighted_mean(items(), least_one),
                        ScorePlugin::MostAllocated => weighted_mean(items(), most_one),
                        ScorePlugin::RequestedToCapacityRatio => ratio_of(items(), shape),
                        ScorePlugin::BalancedAllocation => {
                            balanced_of(items().map(|(req, cap, _)| (req, cap)))
                        }
                        _ => 0,
                    };
                    total = total.saturating_add(score.saturating_mul(weight));
                }
            }
            None => {
                let Some(node) = cluster.node(idx) else {
                    return 0;
                };
                let requested = cluster.requested(idx).saturating_add(self.input.footprint);
                let allocatable = &node.allocatable;
                for &(plugin, weight) in &self.local {
                    let score = match plugin {
                        ScorePlugin::LeastAllocated => {
                            least_allocated(&requested, allocatable, &self.weights)
                        }
                        ScorePlugin::MostAllocated => {
                            most_allocated(&requested, allocatable, &self.weights)
                        }
                        ScorePlugin::RequestedToCapacityRatio => requested_to_capacity_ratio(
                            &requested,
                            allocatable,
                            &self.weights,
                            shape,
                        ),
                        ScorePlugin::BalancedAllocation => {
                            balanced_allocation(&requested, allocatable, &self.names)
                        }
                        _ => 0,
                    };
                    total = total.saturating_add(score.saturating_mul(weight));
                }
            }
        }
        total
    }

    /// The normalization of a scored set.
    pub fn normalizer<'r>(&self, raws: impl IntoIterator<Item = &'r RawScore>) -> Normalizer {
        let mut max_affinity = 0u64;
        let mut max_taints = 0u64;
        let mut max_devices = 0u64;
        let mut min_interpod = 0i64;
        let mut max_interpod = 0i64;
        for (i, raw) in raws.into_iter().enumerate() {
            max_affinity = max_affinity.max(raw.affinity);
            max_taints = max_taints.max(raw.taints);
            max_devices = max_devices.max(raw.devices);
            if i == 0 {
                (min_interpod, max_interpod) = (raw.interpod, raw.interpod);
            } else {
                min_interpod = min_interpod.min(raw.interpod);
                max_interpod = max_interpod.max(raw.interpod);
            }
        }
        // A set-wide maximum of zero (or an empty span) gives every node the same score.
        let mut constant = 0u64;
        let mut add = |weight: u64, score: u64| {
            constant = constant.saturating_add(score.saturating_mul(weight));
        };
        let affinity = match self.affinity {
            Some(weight) if max_affinity == 0 => {
                add(weight, scale_by_max(0, 0, Direction::Ascending));
                None
            }
            other => other.map(|weight| (weight, max_affinity)),
        };
        let taints = match self.taints {
            Some(weight) if max_taints == 0 => {
                add(weight, scale_by_max(0, 0, Direction::Descending));
                None
            }
            other => other.map(|weight| (weight, max_taints)),
        };
        let interpod = match self.interpod {
            Some(weight) if min_interpod == max_interpod => {
                add(weight, scale_min_max(0, 0, 0));
                None
            }
            other => other.map(|weight| (weight, min_interpod, max_interpod)),
        };
        let devices = match self.devices {
            Some(weight) if max_devices == 0 => {
                add(weight, scale_by_max(0, 0, Direction::Ascending));
                None
            }
            other => other.map(|weight| (weight, max_devices)),
        };
        Normalizer {
            constant,
            affinity,
            taints,
            interpod,
            devices,
        }
    }
}

/// Weighted total score of each feasible node (indexes into the cluster), in input order.
pub fn score_nodes(cluster: &Cluster<'_>, feasible: &[usize], input: &ScoreInput<'_>) -> Vec<u64> {
    let scorer = Scorer::new(*input);
    let raws: Vec<RawScore> = feasible.iter().map(|&i| scorer.raw(cluster, i)).collect();
    let normalizer = scorer.normalizer(&raws);
    raws.iter().map(|raw| normalizer.total(raw)).collect()
}

#[cfg(test)]
#[path = "score_tests.rs"]
mod tests;
