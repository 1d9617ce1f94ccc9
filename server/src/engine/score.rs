//! Scores: how good is each feasible node for a pod template.
//!
//! Owns the score plugins, each giving 0..=[`MAX_NODE_SCORE`] per node with Kubernetes'
//! arithmetic: LeastAllocated, MostAllocated and RequestedToCapacityRatio (weighted over
//! the profile's resources, skipping resources a node does not have), BalancedAllocation
//! (one minus the standard deviation of the requested fractions), NodeAffinity (sum of
//! matching preferred weights, normalized by the maximum), TaintToleration (intolerable
//! PreferNoSchedule taints, normalized and reversed) and InterPodAffinity (preferred
//! terms, min–max normalized). The total is the weighted sum over enabled plugins.
//! "Requested" means what the node holds plus the candidate's own footprint. Pure
//! functions; called by placement, quoting and preemption.

use crate::engine::cluster::Cluster;
use crate::engine::interpod::InterPodState;
use crate::engine::profile::{Profile, ScorePlugin, ShapePoint};
use crate::engine::selectors::preferred_affinity_weight;
use crate::engine::taints::intolerable_prefer_no_schedule;
use crate::model::pod::PodSpec;
use crate::model::resources::{ResourceName, Resources};

/// Highest score one plugin gives a node.
pub const MAX_NODE_SCORE: u64 = 100;
/// Highest utilization, in percent.
const MAX_UTILIZATION: u64 = 100;
/// Factor from shape scores (0..=10) to node scores (0..=100).
const SHAPE_SCALE: i64 = (MAX_NODE_SCORE / 10) as i64;

/// Whether a normalized score rises or falls with the raw value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Higher raw value, higher score.
    Ascending,
    /// Higher raw value, lower score.
    Descending,
}

/// Weighted mean over resources the node has (capacity > 0) of `f(requested, capacity)`.
fn weighted_mean(
    requested: &Resources,
    allocatable: &Resources,
    weights: &[(ResourceName, u64)],
    f: impl Fn(u64, u64) -> u64,
) -> u64 {
    let mut sum: u128 = 0;
    let mut weight_sum: u128 = 0;
    for (name, weight) in weights {
        let capacity = allocatable.get(name);
        if capacity == 0 {
            continue;
        }
        sum += u128::from(f(requested.get(name), capacity)) * u128::from(*weight);
        weight_sum += u128::from(*weight);
    }
    sum.checked_div(weight_sum)
        .map_or(0, |mean| u64::try_from(mean).unwrap_or(MAX_NODE_SCORE))
}

/// `a * b / c` without overflow (c > 0).
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c.max(1))).unwrap_or(u64::MAX)
}

/// LeastAllocated: `(capacity - requested) * 100 / capacity`, 0 when over capacity.
pub fn least_allocated(
    requested: &Resources,
    allocatable: &Resources,
    weights: &[(ResourceName, u64)],
) -> u64 {
    weighted_mean(requested, allocatable, weights, |req, cap| {
        if req > cap {
            0
        } else {
            mul_div(cap - req, MAX_NODE_SCORE, cap)
        }
    })
}

/// MostAllocated: `min(requested, capacity) * 100 / capacity`.
pub fn most_allocated(
    requested: &Resources,
    allocatable: &Resources,
    weights: &[(ResourceName, u64)],
) -> u64 {
    weighted_mean(requested, allocatable, weights, |req, cap| {
        mul_div(req.min(cap), MAX_NODE_SCORE, cap)
    })
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
    let mut sum: i128 = 0;
    let mut weight_sum: i128 = 0;
    for (name, weight) in weights {
        let capacity = allocatable.get(name);
        if capacity == 0 {
            continue;
        }
        let req = requested.get(name);
        let utilization = if req > capacity {
            MAX_UTILIZATION
        } else {
            mul_div(req, MAX_UTILIZATION, capacity)
        };
        let score = broken_linear(shape, i64::try_from(utilization).unwrap_or(0));
        if score > 0 {
            sum += i128::from(score) * i128::from(*weight);
            weight_sum += i128::from(*weight);
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
    let fractions: Vec<f64> = names
        .iter()
        .filter(|name| allocatable.get(name) > 0)
        .map(|name| (requested.get(name) as f64 / allocatable.get(name) as f64).min(1.0))
        .collect();
    let std = match fractions.as_slice() {
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

/// Scales raw scores to 0..=100 by the maximum (DefaultNormalizeScore).
pub fn normalize_by_max(raw: &[u64], direction: Direction) -> Vec<u64> {
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|&score| {
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
        })
        .collect()
}

/// Scales raw scores to 0..=100 between their minimum and maximum (all 0 if equal).
pub fn normalize_min_max(raw: &[i64]) -> Vec<u64> {
    let min = raw.iter().copied().min().unwrap_or(0);
    let max = raw.iter().copied().max().unwrap_or(0);
    let span = i128::from(max) - i128::from(min);
    raw.iter()
        .map(|&score| {
            if span <= 0 {
                0
            } else {
                let scaled =
                    (i128::from(score) - i128::from(min)) * i128::from(MAX_NODE_SCORE) / span;
                u64::try_from(scaled).unwrap_or(0)
            }
        })
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

/// Weighted total score of each feasible node (indexes into `cluster.nodes`), in input order.
pub fn score_nodes(cluster: &Cluster<'_>, feasible: &[usize], input: &ScoreInput<'_>) -> Vec<u64> {
    let mut totals = vec![0u64; feasible.len()];
    for enabled in &input.profile.score_plugins {
        let scores = plugin_scores(cluster, feasible, input, enabled.plugin);
        for (total, score) in totals.iter_mut().zip(scores) {
            *total = total.saturating_add(score.saturating_mul(u64::from(enabled.weight)));
        }
    }
    totals
}

fn plugin_scores(
    cluster: &Cluster<'_>,
    feasible: &[usize],
    input: &ScoreInput<'_>,
    plugin: ScorePlugin,
) -> Vec<u64> {
    let nodes = feasible.iter().filter_map(|&i| cluster.nodes.get(i));
    let weights = input.profile.resource_weights();
    let after = |requested: &Resources| requested.saturating_add(input.footprint);
    match plugin {
        ScorePlugin::LeastAllocated => nodes
            .map(|n| least_allocated(&after(&n.requested), &n.node.allocatable, &weights))
            .collect(),
        ScorePlugin::MostAllocated => nodes
            .map(|n| most_allocated(&after(&n.requested), &n.node.allocatable, &weights))
            .collect(),
        ScorePlugin::RequestedToCapacityRatio => nodes
            .map(|n| {
                requested_to_capacity_ratio(
                    &after(&n.requested),
                    &n.node.allocatable,
                    &weights,
                    &input.profile.shape,
                )
            })
            .collect(),
        ScorePlugin::BalancedAllocation => {
            let names: Vec<ResourceName> = weights.into_iter().map(|(name, _)| name).collect();
            nodes
                .map(|n| balanced_allocation(&after(&n.requested), &n.node.allocatable, &names))
                .collect()
        }
        ScorePlugin::NodeAffinity => {
            let raw: Vec<u64> = nodes
                .map(|n| preferred_affinity_weight(&input.spec.node_affinity, &n.node.labels))
                .collect();
            normalize_by_max(&raw, Direction::Ascending)
        }
        ScorePlugin::TaintToleration => {
            let raw: Vec<u64> = nodes
                .map(|n| intolerable_prefer_no_schedule(&n.node.taints, &input.spec.tolerations))
                .collect();
            normalize_by_max(&raw, Direction::Descending)
        }
        ScorePlugin::InterPodAffinity => {
            let raw: Vec<i64> = nodes
                .map(|n| input.interpod.preferred_score(n.node))
                .collect();
            normalize_min_max(&raw)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOO: &str = "intel.com/foo";
    const MIB: u64 = 1 << 20;

    fn res(cpu_milli: u64, memory_bytes: u64) -> Resources {
        Resources {
            cpu_milli,
            memory_bytes,
            ..Resources::zero()
        }
    }

    fn cpu_mem() -> Vec<(ResourceName, u64)> {
        vec![(ResourceName::Cpu, 1), (ResourceName::Memory, 1)]
    }

    fn shape(points: &[(u32, u32)]) -> Vec<ShapePoint> {
        points
            .iter()
            .map(|&(utilization, score)| ShapePoint { utilization, score })
            .collect()
    }

    #[test]
    fn least_and_most_allocated() {
        // Kubernetes' documented example: 3000m of 4000m cpu, 5000 of 10000 memory.
        let requested = res(3000, 5000);
        let capacity = res(4000, 10000);
        assert_eq!(least_allocated(&requested, &capacity, &cpu_mem()), 37);
        assert_eq!(most_allocated(&requested, &capacity, &cpu_mem()), 62);
        assert_eq!(
            least_allocated(&res(5000, 5000), &capacity, &cpu_mem()),
            25,
            "over capacity scores 0"
        );
        assert_eq!(
            most_allocated(&res(5000, 10000), &capacity, &cpu_mem()),
            100,
            "capped at capacity"
        );
        let gpu = vec![
            (ResourceName::Extended(FOO.into()), 1),
            (ResourceName::Cpu, 1),
        ];
        assert_eq!(
            least_allocated(&res(2000, 0), &capacity, &gpu),
            50,
            "resources the node lacks are skipped"
        );
        assert_eq!(
            least_allocated(&res(1, 1), &Resources::zero(), &cpu_mem()),
            0
        );
    }

    #[test]
    fn broken_linear_interpolates() {
        let down = shape(&[(0, 10), (100, 0)]);
        assert_eq!(broken_linear(&down, 0), 100);
        assert_eq!(broken_linear(&down, 30), 70);
        assert_eq!(broken_linear(&down, 100), 0);
        let peak = shape(&[(0, 0), (50, 10), (100, 0)]);
        assert_eq!(broken_linear(&peak, 25), 50);
        assert_eq!(broken_linear(&peak, 50), 100);
        assert_eq!(broken_linear(&peak, 75), 50);
        let inner = shape(&[(20, 5), (80, 10)]);
        assert_eq!(
            broken_linear(&inner, 10),
            50,
            "below the first point: its score"
        );
        assert_eq!(broken_linear(&inner, 50), 75);
        assert_eq!(
            broken_linear(&inner, 90),
            100,
            "above the last point: its score"
        );
        assert_eq!(broken_linear(&inner, 33), 60, "integer division truncates");
    }

    #[test]
    fn requested_to_capacity_ratio_matches_the_binpacking_example() {
        // Kubernetes' "resource bin packing" example, scores on the 0..=100 scale.
        let weights = vec![
            (ResourceName::Extended(FOO.into()), 5),
            (ResourceName::Memory, 1),
            (ResourceName::Cpu, 3),
        ];
        let binpack = shape(&[(0, 0), (100, 10)]);
        let mut capacity1 = res(8000, 1024 * MIB);
        capacity1.set(&ResourceName::Extended(FOO.into()), 4);
        let mut requested1 = res(3000, 512 * MIB);
        requested1.set(&ResourceName::Extended(FOO.into()), 3);
        // foo 75, memory 50, cpu 37 → (375 + 50 + 111) / 9 = 59.6 → 60
        assert_eq!(
            requested_to_capacity_ratio(&requested1, &capacity1, &weights, &binpack),
            60
        );
        let mut capacity2 = res(8000, 1024 * MIB);
        capacity2.set(&ResourceName::Extended(FOO.into()), 8);
        let mut requested2 = res(8000, 768 * MIB);
        requested2.set(&ResourceName::Extended(FOO.into()), 4);
        // foo 50, memory 75, cpu 100 → (250 + 75 + 300) / 9 = 69.4 → 69
        assert_eq!(
            requested_to_capacity_ratio(&requested2, &capacity2, &weights, &binpack),
            69
        );
        let over = res(9000, 2048 * MIB);
        assert_eq!(
            requested_to_capacity_ratio(&over, &res(8000, 1024 * MIB), &cpu_mem(), &binpack),
            100,
            "over capacity counts as full utilization"
        );
        assert_eq!(
            requested_to_capacity_ratio(&res(0, 0), &res(8000, 1024 * MIB), &cpu_mem(), &binpack),
            0,
            "zero scores carry no weight"
        );
    }

    #[test]
    fn balanced_allocation_scores() {
        let names = [ResourceName::Cpu, ResourceName::Memory];
        assert_eq!(
            balanced_allocation(&res(3000, 5000), &res(4000, 10000), &names),
            87
        );
        assert_eq!(
            balanced_allocation(&res(2000, 5000), &res(4000, 10000), &names),
            100
        );
        assert_eq!(
            balanced_allocation(&res(8000, 0), &res(4000, 10000), &names),
            50,
            "fractions cap at 1"
        );
        let mut three = res(4000, 0);
        three.set(&ResourceName::Extended(FOO.into()), 2);
        let mut cap3 = res(4000, 10000);
        cap3.set(&ResourceName::Extended(FOO.into()), 4);
        let names3 = [
            ResourceName::Cpu,
            ResourceName::Memory,
            ResourceName::Extended(FOO.into()),
        ];
        // fractions 1, 0, 0.5: mean 0.5, std sqrt(1/6) = 0.408 → 59
        assert_eq!(balanced_allocation(&three, &cap3, &names3), 59);
    }

    #[test]
    fn normalization() {
        assert_eq!(
            normalize_by_max(&[0, 5, 10], Direction::Ascending),
            vec![0, 50, 100]
        );
        assert_eq!(
            normalize_by_max(&[0, 1, 2], Direction::Descending),
            vec![100, 50, 0]
        );
        assert_eq!(
            normalize_by_max(&[0, 0], Direction::Descending),
            vec![100, 100]
        );
        assert_eq!(normalize_by_max(&[0, 0], Direction::Ascending), vec![0, 0]);
        assert_eq!(normalize_min_max(&[-5, 0, 5]), vec![0, 50, 100]);
        assert_eq!(normalize_min_max(&[3, 3]), vec![0, 0]);
    }
}
