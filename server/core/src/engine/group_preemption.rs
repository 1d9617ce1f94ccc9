//! Preemption offers for gang groups: on one shard, how much of a preemptor group
//! the shard could host as lower-priority gangs leave, step by step, for the
//! coordinator's choice across shards (`plan/victims.rs`).
//!
//! Victim units are whole gangs: a gang with any member reserved (not yet committed),
//! observed (bound by another scheduler) or of priority equal to or above the
//! preemptor's is never a unit, nor is a gang of the preemptor group itself. Units are
//! taken cheapest first (lowest priority, then fewest pods here, then name), one per
//! step, up to `OFFER_STEPS_MAX` steps or until the shard could host the whole group;
//! each step's counts come from placing the group on the shard as it would be with
//! every unit so far gone ([`WithoutGangs`]: their pods, footprints and devices given
//! back). A preemptor that must lie in one domain of a level (a required topology)
//! takes its victims from one domain only, the one where they cost least
//! ([`cheapest_in_one_domain`]). Pure; the shard leader answers the coordinator's `ShardQuery::PreemptionOffer`
//! with it, and plans a chosen preemption on [`WithoutGangs`] (`ShardQuery::PlanWithout`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::engine::cluster::Nomination;
use crate::engine::placement::place_group;
use crate::engine::profile::Profile;
use crate::ledger::usage::{NodeUsage, SlotState};
use crate::ledger::view::{LedgerView, NodeView};
use crate::model::device::DeviceClass;
use crate::model::gang::{GangGroup, GangId, MemberKey};

/// Steps one offer lists at most (each a full placement of the group on the shard).
pub const OFFER_STEPS_MAX: usize = 32;

/// A gang that could be evicted, as this shard sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalUnit {
    /// Highest priority among its pods here.
    pub priority: i32,
    /// Its pods on this shard, with their nodes.
    pub members: Vec<(MemberKey, String)>,
}

/// What this shard could host of a preemptor group, now and as units leave. Maps
/// keyed by gang travel as lists of pairs (a gang is no JSON map key).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GroupOffer {
    /// The units the steps name.
    #[serde(with = "as_pairs")]
    pub units: BTreeMap<GangId, LocalUnit>,
    /// Gangs with pods here that may not be evicted (a pod reserved, observed or of too
    /// high a priority): a gang is a unit only if no shard names it here.
    pub ineligible: BTreeSet<GangId>,
    /// Preemptor gang → members the shard could host as it is.
    #[serde(with = "as_pairs")]
    pub hostable_now: BTreeMap<GangId, u32>,
    /// One unit per step, with what the shard could host once it and every earlier
    /// step's unit are gone.
    pub steps: Vec<OfferedStep>,
}

/// One step of a shard's offer: this unit goes too, and the shard could then host this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedStep {
    /// The unit evicted at this step.
    pub gang: GangId,
    /// Preemptor gang → members hostable once it and every earlier unit are gone.
    #[serde(with = "as_pairs")]
    pub hostable: BTreeMap<GangId, u32>,
}

/// A map as a list of pairs, for keys JSON cannot use.
mod as_pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, K: Serialize, V: Serialize>(
        map: &BTreeMap<K, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(map.iter())
    }

    pub fn deserialize<'de, D, K, V>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        Vec::<(K, V)>::deserialize(deserializer).map(|pairs| pairs.into_iter().collect())
    }
}

/// A view of a shard with some gangs' pods gone, as if evicted.
pub struct WithoutGangs<'a, V: ?Sized> {
    base: &'a V,
    /// Nodes that lost pods, with their usage after.
    usages: BTreeMap<String, NodeUsage>,
}

impl<'a, V: LedgerView + ?Sized> WithoutGangs<'a, V> {
    /// `base` without the pods of `gone`.
    pub fn new(base: &'a V, gone: &BTreeSet<GangId>) -> Self {
        let mut usages = BTreeMap::new();
        for view in base.node_views() {
            let leaving: Vec<&MemberKey> = view
                .pods()
                .filter(|(key, _)| gone.iter().any(|g| key.is_in(g)))
                .map(|(key, _)| key)
                .collect();
            if leaving.is_empty() {
                continue;
            }
            let mut usage = view.usage.clone();
            for key in leaving {
                usage.take(key);
            }
            usages.insert(view.node.name.clone(), usage);
        }
        Self { base, usages }
    }

    fn adjusted<'s>(&'s self, view: NodeView<'s>) -> NodeView<'s> {
        match self.usages.get(&view.node.name) {
            Some(usage) => NodeView {
                node: view.node,
                usage,
            },
            None => view,
        }
    }
}

impl<V: LedgerView + ?Sized> LedgerView for WithoutGangs<'_, V> {
    fn node_views(&self) -> Vec<NodeView<'_>> {
        self.base
            .node_views()
            .into_iter()
            .map(|v| self.adjusted(v))
            .collect()
    }

    fn node_view(&self, name: &str) -> Option<NodeView<'_>> {
        self.base.node_view(name).map(|v| self.adjusted(v))
    }

    fn device_classes(&self) -> &BTreeMap<String, DeviceClass> {
        self.base.device_classes()
    }
}

/// The gangs on this shard that may be evicted for a preemptor of `priority`, and
/// those that may not (the preemptor's own gangs among them).
fn local_units<V: LedgerView + ?Sized>(
    view: &V,
    priority: i32,
    own: &BTreeSet<GangId>,
) -> (BTreeMap<GangId, LocalUnit>, BTreeSet<GangId>) {
    let mut units: BTreeMap<GangId, LocalUnit> = BTreeMap::new();
    let mut ineligible: BTreeSet<GangId> = own.clone();
    for node in view.node_views() {
        for (key, slot) in node.pods() {
            let gang = key.gang_id();
            let evictable = matches!(
                slot.state,
                SlotState::Committed { .. } | SlotState::Bound { .. }
            ) && slot.pod.priority < priority
                // Room held for a committed preemption's victims still on the node.
                && !crate::ledger::displace::is_placeholder(key);
            if !evictable {
                ineligible.insert(gang.clone());
            }
            let unit = units.entry(gang).or_insert(LocalUnit {
                priority: i32::MIN,
                members: Vec::new(),
            });
            unit.priority = unit.priority.max(slot.pod.priority);
            unit.members.push((key.clone(), node.node.name.clone()));
        }
    }
    // Holders (and users of shared claims) of network-attached devices hold them on
    // every shard, where a preemption
    // (whose participants are its victims' and preemptor's shards) could not free them.
    if let Some(network) = view.network() {
        ineligible.extend(network.holds().keys().map(MemberKey::gang_id));
        ineligible.extend(network.consumers().map(|(m, _)| m.gang_id()));
    }
    units.retain(|gang, _| !ineligible.contains(gang));
    (units, ineligible)
}

/// Preemptor gang → members placed when the group is placed on `view`.
fn hostable<V: LedgerView + ?Sized>(
    view: &V,
    group: &GangGroup,
    profile: &Profile,
    nominations: &[Nomination],
) -> BTreeMap<GangId, u32> {
    let mut counts: BTreeMap<GangId, u32> = group.gangs.iter().map(|g| (g.id(), 0)).collect();
    for placed in place_group(view, group, profile, nominations).assignments {
        *counts.entry(placed.member.gang_id()).or_default() += 1;
    }
    counts
}

/// What this shard could host of `group` (of `priority`) now and as its cheapest
/// victim units leave, one per step.
pub fn group_offer<V: LedgerView + ?Sized>(
    view: &V,
    group: &GangGroup,
    priority: i32,
    profile: &Profile,
    nominations: &[Nomination],
) -> GroupOffer {
    group_offer_keeping(
        view,
        group,
        priority,
        profile,
        nominations,
        &BTreeSet::new(),
    )
}

/// [`group_offer`] with the gangs of `keep` never units (the coordinator learned from
/// meta that their groups may not go): a unit the coordinator cannot use would cut
/// every step after it from the offer.
pub fn group_offer_keeping<V: LedgerView + ?Sized>(
    view: &V,
    group: &GangGroup,
    priority: i32,
    profile: &Profile,
    nominations: &[Nomination],
    keep: &BTreeSet<GangId>,
) -> GroupOffer {
    let mut own: BTreeSet<GangId> = group.gangs.iter().map(|g| g.id()).collect();
    own.extend(keep.iter().cloned());
    let total: BTreeMap<GangId, u32> = group
        .gangs
        .iter()
        .map(|g| (g.id(), g.members.len() as u32))
        .collect();
    let (units, ineligible) = local_units(view, priority, &own);
    if units.is_empty() {
        // Nothing here could go, but the room this shard has now still counts: the
        // victims on other shards may make up the rest (the coordinator asks only
        // while some placed group has a lower priority).
        return GroupOffer {
            hostable_now: hostable(view, group, profile, nominations),
            ineligible,
            ..GroupOffer::default()
        };
    }
    let mut order: Vec<(&GangId, &LocalUnit)> = units.iter().collect();
    order.sort_by_key(|(gang, unit)| (unit.priority, unit.members.len(), (*gang).clone()));
    let hostable_now = hostable(view, group, profile, nominations);
    let mut offer = GroupOffer {
        hostable_now: hostable_now.clone(),
        ineligible,
        ..GroupOffer::default()
    };
    let fits = |order: &[(&GangId, &LocalUnit)], budget: &mut usize| {
        let mut gone: BTreeSet<GangId> = BTreeSet::new();
        let mut counts = hostable_now.clone();
        let mut steps = Vec::new();
        for (gang, _) in order.iter().take(OFFER_STEPS_MAX) {
            if counts == total || *budget == 0 {
                break;
            }
            *budget -= 1;
            gone.insert((*gang).clone());
            counts = hostable(&WithoutGangs::new(view, &gone), group, profile, nominations);
            steps.push(OfferedStep {
                gang: (*gang).clone(),
                hostable: counts.clone(),
            });
        }
        (counts == total, steps)
    };
    let confined = group
        .gangs
        .iter()
        .find_map(|g| g.topology.required.as_deref());
    let steps = match confined.and_then(|key| cheapest_in_one_domain(view, key, &order, fits)) {
        Some(steps) => steps,
        None => {
            let mut unbounded = usize::MAX;
            fits(&order, &mut unbounded).1
        }
    };
    for step in &steps {
        if let Some(unit) = units.get(&step.gang) {
            offer.units.insert(step.gang.clone(), unit.clone());
        }
    }
    offer.steps = steps;
    offer
}

/// Placements one offer spends at most looking for victims inside single domains.
pub const OFFER_DOMAIN_PLACEMENTS_MAX: usize = 256;

/// For a preemptor whose gang must lie in one domain of `key`: the victims, cheapest
/// first, of the domain whose cheapest victims make the group fit at the least cost
/// (the highest priority evicted, then pods evicted, then name), only units with pods in
/// that domain; `None` when no domain frees enough. Evicting the cheapest units of the
/// whole shard instead frees room spread over domains the gang cannot use. Domains with
/// the most evictable pods are tried first, within [`OFFER_DOMAIN_PLACEMENTS_MAX`].
fn cheapest_in_one_domain<V: LedgerView + ?Sized>(
    view: &V,
    key: &str,
    order: &[(&GangId, &LocalUnit)],
    fits: impl Fn(&[(&GangId, &LocalUnit)], &mut usize) -> (bool, Vec<OfferedStep>),
) -> Option<Vec<OfferedStep>> {
    let domain_of: BTreeMap<String, String> = view
        .node_views()
        .iter()
        .filter_map(|n| Some((n.node.name.clone(), n.node.label(key)?.to_string())))
        .collect();
    let mut evictable: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, unit) in order {
        for (_, node) in &unit.members {
            if let Some(d) = domain_of.get(node) {
                *evictable.entry(d.as_str()).or_default() += 1;
            }
        }
    }
    let mut domains: Vec<(&str, usize)> = evictable.into_iter().collect();
    domains.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut budget = OFFER_DOMAIN_PLACEMENTS_MAX;
    let mut best: Option<((i32, usize, Vec<GangId>), Vec<OfferedStep>)> = None;
    for (domain, _) in domains {
        let inside: Vec<(&GangId, &LocalUnit)> = order
            .iter()
            .filter(|(_, u)| {
                u.members
                    .iter()
                    .any(|(_, n)| domain_of.get(n).map(String::as_str) == Some(domain))
            })
            .copied()
            .collect();
        let (fit, steps) = fits(&inside, &mut budget);
        if !fit {
            continue;
        }
        let chosen: Vec<&LocalUnit> = inside.iter().take(steps.len()).map(|(_, u)| *u).collect();
        let cost = (
            chosen.iter().map(|u| u.priority).max().unwrap_or(i32::MIN),
            chosen.iter().map(|u| u.members.len()).sum::<usize>(),
            steps.iter().map(|s| s.gang.clone()).collect::<Vec<_>>(),
        );
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, steps));
        }
    }
    best.map(|(_, steps)| steps)
}

#[cfg(test)]
mod tests;
