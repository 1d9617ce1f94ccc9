//! Event-driven requeueing: whether a group that fit nowhere is parked, and which later
//! changes wake it (docs/ARCHITECTURE.md §4, "Parking").
//!
//! A group the coordinator planned on every shard without success is parked when each
//! shard's plan says why in lasting terms. Per shard, what could help it there:
//! [`Helps::Nodes`] when every node failed a filter only a change to the nodes can lift
//! (selector, affinity, taint, readiness, device class, a node smaller than the pod's
//! request), [`Helps::NodesOrRoom`] when some
//! node passed those and lacked room (resources, ports, devices, a topology domain's
//! capacity, anti-affinity of pods there). A reason that passes by itself (a fence of a
//! moving node, a selector being evaluated, pod affinity to pods not yet placed, a
//! device search cut short) parks nothing: the group keeps its backoff. The shards'
//! change counts, taken before the plans, are compared with later ones: a parked group
//! is woken by a change on a shard where that kind of change could help it, and by any
//! change on a shard its plans did not cover (one added since). Pure; the coordinator
//! keeps the parked groups and the counts come from its replica's shard machines.

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::{FilterReason, GangPlacement, MemberLabels, Unplaced};
use crate::model::{GangGroup, MemberKey};
use crate::plan::assign::{assign, AssignOutcome};

/// What kind of change on one shard could let a parked group fit there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helps {
    /// Only a change to the nodes (added, relabelled, untainted, ready again, devices
    /// published or healthy, a device class added).
    Nodes,
    /// That, or room freed.
    NodesOrRoom,
}

/// How many applied operations on one shard may have helped parked groups so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangeCounts {
    /// Changes to nodes, devices or device classes.
    pub nodes: u64,
    /// Room freed.
    pub room: u64,
}

/// What one filter reason says about waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lasting {
    /// Only a change to the node lifts it.
    Node,
    /// Room freed (or a node change) may lift it.
    Room,
    /// It passes by itself: do not park.
    Passing,
}

fn lasting(reason: &FilterReason) -> Lasting {
    match reason {
        FilterReason::NodeNotReady
        | FilterReason::NodeUnschedulable
        | FilterReason::NodeAffinityMismatch
        | FilterReason::UntoleratedTaint { .. }
        | FilterReason::LargerThanNode(_)
        | FilterReason::DeviceClassNotFound(_)
        | FilterReason::DeviceSelectorError(_) => Lasting::Node,
        FilterReason::HostPortConflict
        | FilterReason::Insufficient(_)
        | FilterReason::PodAntiAffinityConflict
        | FilterReason::ExistingPodAntiAffinity
        | FilterReason::CapacityTakenByGang
        | FilterReason::CannotAllocateDevices
        | FilterReason::SharedClaimNotHere(_)
        | FilterReason::TopologyDomainTooSmall { .. } => Lasting::Room,
        FilterReason::NodeMoving
        | FilterReason::PodAffinityUnsatisfied
        | FilterReason::DeviceSearchLimit
        | FilterReason::SelectorsWarming => Lasting::Passing,
    }
}

/// Per shard of `shards`, what could help a group whose `plans` fell short; `None`
/// when it must not be parked (a shard did not answer, or a reason passes by itself).
pub fn what_helps(
    plans: &BTreeMap<u32, GangPlacement>,
    shards: impl IntoIterator<Item = u32>,
) -> Option<BTreeMap<u32, Helps>> {
    let mut out = BTreeMap::new();
    for shard in shards {
        let plan = plans.get(&shard)?;
        let mut helps = if plan.assignments.is_empty() {
            Helps::Nodes
        } else {
            // It planned some members there: more room would plan more.
            Helps::NodesOrRoom
        };
        for unplaced in &plan.unplaced {
            for reason in unplaced.diagnosis.reasons.keys() {
                match lasting(reason) {
                    Lasting::Passing => return None,
                    Lasting::Room => helps = Helps::NodesOrRoom,
                    Lasting::Node => {}
                }
            }
        }
        out.insert(shard, helps);
    }
    Some(out)
}

/// What could help `group` (whose members are `members`) and why it waits, when one
/// joint plan of many groups shows that only a change to the nodes could: every shard
/// of `shards` answered (`misses`: the members each left unplaced), none planned any
/// of its members (`assigned`: those any shard planned), and each left every one of
/// them unplaced for reasons only a node change lifts. Those reasons do not depend on
/// the other groups planned beside it, so its own plans would say the same; a reason
/// that room could lift (room the others took, say) gives `None`.
pub fn node_bound(
    group: &GangGroup,
    members: &BTreeSet<MemberKey>,
    misses: &BTreeMap<u32, Vec<Unplaced>>,
    assigned: &BTreeSet<MemberKey>,
    shards: impl IntoIterator<Item = u32>,
) -> Option<(BTreeMap<u32, Helps>, String)> {
    if members.is_empty() || members.iter().any(|k| assigned.contains(k)) {
        return None;
    }
    let mut plans = BTreeMap::new();
    for (shard, unplaced) in misses {
        let mine: Vec<Unplaced> = unplaced
            .iter()
            .filter(|u| members.contains(&u.member))
            .cloned()
            .collect();
        if mine.len() != members.len() {
            return None;
        }
        let plan = GangPlacement {
            assignments: Vec::new(),
            unplaced: mine,
            domain: None,
            network: Vec::new(),
            member_labels: MemberLabels::Read,
        };
        plans.insert(*shard, plan);
    }
    let helps = what_helps(&plans, shards)?;
    if helps.values().any(|h| *h != Helps::Nodes) {
        return None;
    }
    match assign(group, &plans, &BTreeSet::new()) {
        AssignOutcome::Short { reason, .. } => Some((helps, reason)),
        AssignOutcome::Ready(_) => None,
    }
}

/// Whether a group parked with `helps` when the counts were `then` may fit now that
/// they are `now`.
pub fn helped(
    helps: &BTreeMap<u32, Helps>,
    then: &BTreeMap<u32, ChangeCounts>,
    now: &BTreeMap<u32, ChangeCounts>,
) -> bool {
    now.iter().any(|(shard, after)| {
        let before = then.get(shard).copied().unwrap_or_default();
        match helps.get(shard) {
            Some(Helps::Nodes) => after.nodes != before.nodes,
            Some(Helps::NodesOrRoom) | None => *after != before,
        }
    })
}

#[cfg(test)]
#[path = "parking_tests.rs"]
mod tests;
