//! Cross-shard victim choice for gang-aware preemption: given what each shard could
//! host of a preemptor group as it evicts more and more victim units, choose the
//! cheapest set of units over all shards that lets the *whole* group fit, or none.
//!
//! A victim unit is a placed gang evicted whole (all its pods, on every shard): a
//! Strict gang is never left partial. Each shard offers a nested sequence of steps
//! (its own order, cheapest first): after the units of steps 1..=k are gone, it could
//! host so many members of each preemptor gang at once. A set of units `E` lets a
//! shard host what its longest prefix of steps within `E` says (room freed by units
//! of other shards' steps is not counted: conservative), and the group fits when the
//! shards' counts reach every gang's minMember.
//!
//! Order (cheapest first): the highest victim priority, then the fewest pods evicted,
//! then the lowest sum of priorities, then unit names. Exact over every subset up to
//! `EXACT_UNITS_MAX` offered units; above that, greedy (the step that frees most
//! missing members per evicted pod) then reprieve (units dropped, highest priority
//! first, while the group still fits), so no single unit of the answer is needless.
//!
//! Invariants: a unit of priority equal to or above the preemptor's is never chosen
//! (a step holding one ends that shard's offer); the answer always fits by the rule
//! above; when nothing fits, nothing is evicted; a gang any shard names ineligible is
//! no unit ([`from_group_offers`]); the gangs of one victim group form one unit
//! ([`by_group`]), so the cost counts everything that goes. Pure and deterministic. Called by the coordinator's
//! preemption (`coordinator/preempt.rs`) with the shards' offers
//! (`engine/group_preemption.rs`); the placement that follows is planned and checked by
//! the shards again, so a choice that does not hold there evicts nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::group_preemption::GroupOffer;
use crate::model::GangId;

/// Up to this many offered units the choice is exact (every subset is tried).
pub const EXACT_UNITS_MAX: usize = 12;

/// A placed gang that may be evicted, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VictimUnit {
    /// Highest priority among its pods.
    pub priority: i32,
    /// Its pods, over every shard.
    pub pods: u32,
}

/// One step of a shard's offer: evict these units too, then the shard could host this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferStep {
    /// Units this step adds (those already evicted by earlier steps are not repeated).
    pub evict: Vec<GangId>,
    /// Preemptor gang → members the shard could host at once after this step.
    pub hostable: BTreeMap<GangId, u32>,
}

/// What one shard could host of the preemptor group, now and as it evicts more.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardOffer {
    /// Preemptor gang → members the shard could host with nothing evicted.
    pub hostable_now: BTreeMap<GangId, u32>,
    /// Cumulative steps, cheapest first.
    pub steps: Vec<OfferStep>,
}

/// The chosen victims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VictimChoice {
    /// Units to evict (empty: the group fits as things are).
    pub evict: BTreeSet<GangId>,
    /// Shard → how many of its steps the choice covers.
    pub steps_used: BTreeMap<u32, usize>,
}

/// Cost of evicting a set of units; lower is cheaper.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cost {
    /// Highest victim priority (`i32::MIN` for none).
    pub max_priority: i32,
    /// Pods evicted.
    pub pods: u64,
    /// Sum of the units' priorities, offset so it is never negative.
    pub priority_sum: i64,
    /// Unit names, for a total order.
    pub names: Vec<GangId>,
}

/// The chooser's units and offers from every shard's [`GroupOffer`]: a unit's priority
/// is its highest over the shards and its pods their sum; a gang any shard names
/// ineligible is no unit (the steps naming it end those shards' offers).
pub fn from_group_offers(
    offers: &BTreeMap<u32, GroupOffer>,
) -> (BTreeMap<GangId, VictimUnit>, BTreeMap<u32, ShardOffer>) {
    let ineligible: BTreeSet<&GangId> = offers.values().flat_map(|o| o.ineligible.iter()).collect();
    let mut units: BTreeMap<GangId, VictimUnit> = BTreeMap::new();
    for offer in offers.values() {
        for (gang, local) in offer.units.iter().filter(|(g, _)| !ineligible.contains(g)) {
            let unit = units.entry(gang.clone()).or_insert(VictimUnit {
                priority: i32::MIN,
                pods: 0,
            });
            unit.priority = unit.priority.max(local.priority);
            unit.pods += local.members.len() as u32;
        }
    }
    let shard_offers = offers
        .iter()
        .map(|(shard, o)| {
            let steps = o
                .steps
                .iter()
                .map(|step| OfferStep {
                    evict: vec![step.gang.clone()],
                    hostable: step.hostable.clone(),
                })
                .collect();
            let offer = ShardOffer {
                hostable_now: o.hostable_now.clone(),
                steps,
            };
            (*shard, offer)
        })
        .collect();
    (units, shard_offers)
}

/// Units of whole gang groups, since a victim group goes whole: the units of a group's
/// gangs (`gangs_of`: gang → every gang of its group) become one, keyed by the group's
/// first gang, with the highest priority and the sum of pods; every step names that key
/// instead (a step whose group an earlier step of the shard took adds nothing, which
/// only ever undercounts what the shard could host). A group with a gang `ineligible`
/// names is no unit; a gang whose group is unknown stays a unit of its own.
pub fn by_group(
    units: &BTreeMap<GangId, VictimUnit>,
    offers: &BTreeMap<u32, ShardOffer>,
    gangs_of: &BTreeMap<GangId, Vec<GangId>>,
    ineligible: &BTreeSet<GangId>,
) -> (BTreeMap<GangId, VictimUnit>, BTreeMap<u32, ShardOffer>) {
    let key = |g: &GangId| -> GangId {
        gangs_of
            .get(g)
            .and_then(|all| all.iter().min())
            .unwrap_or(g)
            .clone()
    };
    let blocked = |g: &GangId| {
        gangs_of
            .get(g)
            .is_some_and(|all| all.iter().any(|x| ineligible.contains(x)))
    };
    let mut merged: BTreeMap<GangId, VictimUnit> = BTreeMap::new();
    for (gang, unit) in units.iter().filter(|(g, _)| !blocked(g)) {
        let m = merged.entry(key(gang)).or_insert(VictimUnit {
            priority: i32::MIN,
            pods: 0,
        });
        m.priority = m.priority.max(unit.priority);
        m.pods += unit.pods;
    }
    let renamed = offers
        .iter()
        .map(|(shard, offer)| {
            let mut taken: BTreeSet<GangId> = BTreeSet::new();
            let steps = offer
                .steps
                .iter()
                .map(|step| OfferStep {
                    // A blocked group's key is no unit: the step ends the offer.
                    evict: step
                        .evict
                        .iter()
                        .map(|g| if blocked(g) { g.clone() } else { key(g) })
                        .filter(|k| taken.insert(k.clone()))
                        .collect(),
                    hostable: step.hostable.clone(),
                })
                .collect();
            let offer = ShardOffer {
                hostable_now: offer.hostable_now.clone(),
                steps,
            };
            (*shard, offer)
        })
        .collect();
    (merged, renamed)
}

/// The cost of evicting `set`.
pub fn cost_of(units: &BTreeMap<GangId, VictimUnit>, set: &BTreeSet<GangId>) -> Cost {
    let chosen = || set.iter().filter_map(|g| units.get(g));
    Cost {
        max_priority: chosen().map(|u| u.priority).max().unwrap_or(i32::MIN),
        pods: chosen().map(|u| u64::from(u.pods)).sum(),
        priority_sum: chosen()
            .map(|u| i64::from(u.priority) - i64::from(i32::MIN))
            .sum(),
        names: set.iter().cloned().collect(),
    }
}

/// The shards' offers with every step past one that names an ineligible or unknown
/// unit cut off.
fn eligible_offers(
    units: &BTreeMap<GangId, VictimUnit>,
    offers: &BTreeMap<u32, ShardOffer>,
    preemptor_priority: i32,
) -> BTreeMap<u32, ShardOffer> {
    let eligible = |g: &GangId| {
        units
            .get(g)
            .is_some_and(|u| u.priority < preemptor_priority)
    };
    offers
        .iter()
        .map(|(shard, offer)| {
            let usable = offer
                .steps
                .iter()
                .take_while(|s| s.evict.iter().all(eligible))
                .cloned()
                .collect();
            let offer = ShardOffer {
                hostable_now: offer.hostable_now.clone(),
                steps: usable,
            };
            (*shard, offer)
        })
        .collect()
}

/// How many steps of `offer` lie within `evicted` (the longest such prefix).
fn prefix_within(offer: &ShardOffer, evicted: &BTreeSet<GangId>) -> usize {
    offer
        .steps
        .iter()
        .take_while(|s| s.evict.iter().all(|g| evicted.contains(g)))
        .count()
}

/// Preemptor gang → members the shards could host with `evicted` gone.
fn hostable_with(
    offers: &BTreeMap<u32, ShardOffer>,
    evicted: &BTreeSet<GangId>,
) -> BTreeMap<GangId, u64> {
    let mut total: BTreeMap<GangId, u64> = BTreeMap::new();
    for offer in offers.values() {
        let used = prefix_within(offer, evicted);
        let counts = match used {
            0 => &offer.hostable_now,
            k => &offer.steps[k - 1].hostable,
        };
        for (gang, n) in counts {
            *total.entry(gang.clone()).or_default() += u64::from(*n);
        }
    }
    total
}

/// Members still missing for each gang to reach its minimum (0 when it does).
fn missing(hostable: &BTreeMap<GangId, u64>, need: &BTreeMap<GangId, u32>) -> u64 {
    need.iter()
        .map(|(gang, min)| u64::from(*min).saturating_sub(hostable.get(gang).copied().unwrap_or(0)))
        .sum()
}

/// Whether the group fits with `evicted` gone.
pub fn fits_with(
    offers: &BTreeMap<u32, ShardOffer>,
    need: &BTreeMap<GangId, u32>,
    evicted: &BTreeSet<GangId>,
) -> bool {
    missing(&hostable_with(offers, evicted), need) == 0
}

fn choice(offers: &BTreeMap<u32, ShardOffer>, evict: BTreeSet<GangId>) -> VictimChoice {
    let steps_used = offers
        .iter()
        .map(|(shard, offer)| (*shard, prefix_within(offer, &evict)))
        .collect();
    VictimChoice { evict, steps_used }
}

/// The cheapest set of units whose eviction lets every preemptor gang reach its
/// minimum (`need`: gang → minMember), or `None` if no eligible set does.
pub fn choose_victims(
    units: &BTreeMap<GangId, VictimUnit>,
    offers: &BTreeMap<u32, ShardOffer>,
    need: &BTreeMap<GangId, u32>,
    preemptor_priority: i32,
) -> Option<VictimChoice> {
    let offers = eligible_offers(units, offers, preemptor_priority);
    if fits_with(&offers, need, &BTreeSet::new()) {
        return Some(choice(&offers, BTreeSet::new()));
    }
    let offered: BTreeSet<GangId> = offers
        .values()
        .flat_map(|o| o.steps.iter().flat_map(|s| s.evict.iter().cloned()))
        .collect();
    if !fits_with(&offers, need, &offered) {
        return None;
    }
    let evict = if offered.len() <= EXACT_UNITS_MAX {
        cheapest_subset(units, &offers, need, &offered)
    } else {
        reprieve(units, &offers, need, greedy(units, &offers, need))
    };
    Some(choice(&offers, evict))
}

/// Every subset of `offered`, the cheapest that fits (`offered` itself fits).
fn cheapest_subset(
    units: &BTreeMap<GangId, VictimUnit>,
    offers: &BTreeMap<u32, ShardOffer>,
    need: &BTreeMap<GangId, u32>,
    offered: &BTreeSet<GangId>,
) -> BTreeSet<GangId> {
    let list: Vec<&GangId> = offered.iter().collect();
    let mut best: Option<(Cost, BTreeSet<GangId>)> = None;
    for mask in 1u32..(1u32 << list.len()) {
        let set: BTreeSet<GangId> = list
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, g)| (*g).clone())
            .collect();
        if !fits_with(offers, need, &set) {
            continue;
        }
        let cost = cost_of(units, &set);
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, set));
        }
    }
    best.map(|(_, set)| set).unwrap_or_else(|| offered.clone())
}

/// One shard's next step, as the greedy weighs it.
struct NextStep {
    /// Pods the step adds to the eviction (at least 1, the divisor).
    pods: u64,
    /// Missing members it supplies.
    gained: u64,
    /// Highest priority it adds.
    priority: i32,
    shard: u32,
    /// The eviction with the step taken.
    evicted: BTreeSet<GangId>,
}

impl NextStep {
    /// More members per evicted pod (compared as cross products), then the lower
    /// added priority, then the lower shard.
    fn beats(&self, other: &NextStep) -> bool {
        let mine = u128::from(self.gained) * u128::from(other.pods);
        let theirs = u128::from(other.gained) * u128::from(self.pods);
        mine > theirs
            || (mine == theirs && (self.priority, self.shard) < (other.priority, other.shard))
    }
}

/// Extends one shard's prefix at a time, by the step that frees the most missing
/// members per pod it evicts, until the group fits. Called only when evicting every
/// offered unit fits, so it ends fitting (each step adds at least one unit).
fn greedy(
    units: &BTreeMap<GangId, VictimUnit>,
    offers: &BTreeMap<u32, ShardOffer>,
    need: &BTreeMap<GangId, u32>,
) -> BTreeSet<GangId> {
    let mut evicted: BTreeSet<GangId> = BTreeSet::new();
    loop {
        let before = missing(&hostable_with(offers, &evicted), need);
        if before == 0 {
            return evicted;
        }
        let mut best: Option<NextStep> = None;
        for (shard, offer) in offers {
            let Some(next) = offer.steps.get(prefix_within(offer, &evicted)) else {
                continue;
            };
            let mut with = evicted.clone();
            with.extend(next.evict.iter().cloned());
            let added: BTreeSet<GangId> = with.difference(&evicted).cloned().collect();
            let cost = cost_of(units, &added);
            let candidate = NextStep {
                pods: cost.pods.max(1),
                gained: before - missing(&hostable_with(offers, &with), need),
                priority: cost.max_priority,
                shard: *shard,
                evicted: with,
            };
            if best.as_ref().is_none_or(|b| candidate.beats(b)) {
                best = Some(candidate);
            }
        }
        match best {
            Some(step) => evicted = step.evicted,
            // No shard has a step left: everything offered is evicted, which fits.
            None => return evicted,
        }
    }
}

/// Drops units, highest priority (then most pods) first, while the group still fits.
fn reprieve(
    units: &BTreeMap<GangId, VictimUnit>,
    offers: &BTreeMap<u32, ShardOffer>,
    need: &BTreeMap<GangId, u32>,
    mut evicted: BTreeSet<GangId>,
) -> BTreeSet<GangId> {
    let mut order: Vec<GangId> = evicted.iter().cloned().collect();
    order.sort_by_key(|g| {
        let u = units.get(g);
        (
            std::cmp::Reverse(u.map_or(i32::MIN, |u| u.priority)),
            std::cmp::Reverse(u.map_or(0, |u| u.pods)),
            g.clone(),
        )
    });
    for gang in order {
        evicted.remove(&gang);
        if !fits_with(offers, need, &evicted) {
            evicted.insert(gang);
        }
    }
    evicted
}

#[cfg(test)]
mod tests;
