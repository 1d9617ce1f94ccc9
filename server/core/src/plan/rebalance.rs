//! Rebalancing: which nodes to move so that no shard holds much more than the mean
//! capacity (docs/ARCHITECTURE.md §3a). Pure: it reads a list of weighted nodes and
//! returns moves, and the coordinator or `gangctl shards rebalance` begins them one
//! at a time.
//!
//! A shard is over the bound when its weight exceeds `bound_percent` of the mean. The
//! plan repeatedly takes the heaviest shard and the lightest one and moves from the
//! first to the second at most what brings either to the mean: a whole domain's nodes
//! there if some domain fits, else nodes of its largest domain in name order (a zone
//! larger than a shard's share is split, the rest of it stays together). Every step
//! moves weight from a shard above the mean to one below it, so the sum of squared
//! loads falls and the plan ends; it is also cut at [`PLAN_STEPS_MAX`].

use std::collections::BTreeMap;

use crate::ledger::command::MOVE_NODES_MAX;

/// Default period of the coordinator's checks of the shards' balance, in ms (when no
/// move runs; right after a move ends, the next check comes at once).
pub const REBALANCE_CHECK_MS_DEFAULT: u64 = 30_000;

/// Whether and when the coordinator rebalances shards on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebalancePolicy {
    /// Off: only `gangctl shards rebalance` and `move` move nodes.
    pub auto: bool,
    /// A shard above this percentage of the mean capacity starts a rebalance.
    pub bound_percent: u64,
    /// Period of the checks, in ms.
    pub check_ms: u64,
}

impl Default for RebalancePolicy {
    fn default() -> Self {
        Self {
            auto: true,
            bound_percent: REBALANCE_BOUND_PERCENT_DEFAULT,
            check_ms: REBALANCE_CHECK_MS_DEFAULT,
        }
    }
}

/// The default bound: a shard above 125% of the mean capacity is rebalanced.
pub const REBALANCE_BOUND_PERCENT_DEFAULT: u64 = 125;
/// Most steps one plan takes.
pub const PLAN_STEPS_MAX: usize = 1_024;

/// A node as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedNode {
    /// Node name.
    pub name: String,
    /// Its shard.
    pub shard: u32,
    /// Its topology domain.
    pub domain: Option<String>,
    /// Its weight (allocatable cpu in millicores, `query::node_weight`).
    pub weight: u64,
}

/// One move of a plan: nodes of one source shard to a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    /// The source shard.
    pub from: u32,
    /// The target shard.
    pub to: u32,
    /// The nodes (at most `MOVE_NODES_MAX`), in name order.
    pub nodes: Vec<String>,
    /// Their summed weight.
    pub weight: u64,
}

/// Each shard's summed weight (index = shard id; index 0 unused).
pub fn loads(nodes: &[WeightedNode], shards: u32) -> Vec<u64> {
    let mut loads = vec![0u64; shards as usize + 1];
    for n in nodes {
        if let Some(l) = loads.get_mut(n.shard as usize) {
            *l = l.saturating_add(n.weight);
        }
    }
    loads
}

/// The heaviest shard's load over the mean, in percent (100 when balanced or empty).
pub fn peak_percent(loads: &[u64]) -> u64 {
    let shards = loads.len().saturating_sub(1) as u128;
    let total: u128 = loads.iter().skip(1).map(|l| u128::from(*l)).sum();
    let max = loads.iter().skip(1).copied().max().unwrap_or(0);
    if total == 0 || shards == 0 {
        return 100;
    }
    (u128::from(max) * 100 * shards / total) as u64
}

/// The moves that bring every shard to at most `bound_percent` of the mean (or as
/// close as whole nodes allow), in the order to make them.
pub fn plan(nodes: &[WeightedNode], shards: u32, bound_percent: u64) -> Vec<PlannedMove> {
    if shards < 2 {
        return Vec::new();
    }
    let mut loads = loads(nodes, shards);
    let total: u64 = loads.iter().fold(0, |a, l| a.saturating_add(*l));
    let mean = total / u64::from(shards);
    // shard → domain ("" for none) → nodes (name order) with weights.
    let mut parts: BTreeMap<u32, BTreeMap<String, BTreeMap<String, u64>>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| (1..=shards).contains(&n.shard)) {
        parts
            .entry(n.shard)
            .or_default()
            .entry(n.domain.clone().unwrap_or_default())
            .or_default()
            .insert(n.name.clone(), n.weight);
    }
    let mut moves = Vec::new();
    for _ in 0..PLAN_STEPS_MAX {
        if peak_percent(&loads) <= bound_percent {
            break;
        }
        let (Some(hi), Some(lo)) = (heaviest(&loads), lightest(&loads)) else {
            break;
        };
        let amount = loads[hi as usize]
            .saturating_sub(mean)
            .min(mean.saturating_sub(loads[lo as usize]));
        let Some((domain, chosen)) = choose(
            parts.get(&hi),
            amount,
            loads[lo as usize],
            loads[hi as usize],
        ) else {
            break;
        };
        let on_hi = parts
            .entry(hi)
            .or_default()
            .entry(domain.clone())
            .or_default();
        let mut taken = Vec::new();
        for name in chosen {
            if let Some(w) = on_hi.remove(&name) {
                taken.push((name, w));
            }
        }
        let on_lo = parts.entry(lo).or_default().entry(domain).or_default();
        for chunk in taken.chunks(MOVE_NODES_MAX) {
            let weight = chunk.iter().fold(0u64, |a, (_, w)| a.saturating_add(*w));
            loads[hi as usize] = loads[hi as usize].saturating_sub(weight);
            loads[lo as usize] = loads[lo as usize].saturating_add(weight);
            for (name, w) in chunk {
                on_lo.insert(name.clone(), *w);
            }
            moves.push(PlannedMove {
                from: hi,
                to: lo,
                nodes: chunk.iter().map(|(n, _)| n.clone()).collect(),
                weight,
            });
        }
    }
    moves
}

fn heaviest(loads: &[u64]) -> Option<u32> {
    (1..loads.len())
        .max_by_key(|s| (loads[*s], std::cmp::Reverse(*s)))
        .map(|s| s as u32)
}

fn lightest(loads: &[u64]) -> Option<u32> {
    (1..loads.len())
        .min_by_key(|s| (loads[*s], *s))
        .map(|s| s as u32)
}

/// What to move off a shard whose domains are `parts`: a whole domain's nodes of at
/// most `amount` (the heaviest such), else nodes of its heaviest domain up to
/// `amount`, else its lightest node if moving it still lowers the pair's peak.
fn choose(
    parts: Option<&BTreeMap<String, BTreeMap<String, u64>>>,
    amount: u64,
    lo_load: u64,
    hi_load: u64,
) -> Option<(String, Vec<String>)> {
    let parts = parts?;
    let weight =
        |nodes: &BTreeMap<String, u64>| nodes.values().fold(0u64, |a, w| a.saturating_add(*w));
    let whole = parts
        .iter()
        .filter(|(_, nodes)| !nodes.is_empty())
        .map(|(d, nodes)| (weight(nodes), d))
        .filter(|(w, _)| *w <= amount && *w > 0)
        .max_by_key(|(w, d)| (*w, std::cmp::Reverse(*d)));
    if let Some((_, d)) = whole {
        return Some((d.clone(), parts[d].keys().cloned().collect()));
    }
    let (_, d) = parts
        .iter()
        .filter(|(_, nodes)| !nodes.is_empty())
        .map(|(d, nodes)| (weight(nodes), d))
        .max_by_key(|(w, d)| (*w, std::cmp::Reverse(*d)))?;
    let mut acc = 0u64;
    let mut chosen = Vec::new();
    for (name, w) in &parts[d] {
        if acc.saturating_add(*w) > amount {
            break;
        }
        acc += w;
        chosen.push(name.clone());
    }
    if !chosen.is_empty() {
        return Some((d.clone(), chosen));
    }
    let (name, w, d) = parts
        .iter()
        .flat_map(|(d, nodes)| nodes.iter().map(move |(n, w)| (n, *w, d)))
        .min_by_key(|(n, w, _)| (*w, *n))?;
    (lo_load.saturating_add(w) < hi_load).then(|| (d.clone(), vec![name.clone()]))
}

#[cfg(test)]
#[path = "rebalance_tests.rs"]
mod tests;
