//! The victims' room during a preemption: what a shard holds for the victims of an
//! open preemption transaction on one node, beside the preemptor's members.
//!
//! A preemption's first phase (`LedgerOp::ReserveDisplacing`) takes the victims' slots
//! out of their node and holds the preemptor's members on the room they leave. Until
//! the decision the victims may come back (ABORT), so whatever of their room the
//! preemptor does not take stays held, by placeholder slots of the same transaction:
//! every resource the victims used, beyond what the members take, their host ports the
//! members do not use, their device allocations except exclusive devices a member now
//! holds, and their required anti-affinity. With the members and placeholders freed, the
//! victims fit exactly where they were, so an ABORT can always put them back (I2, I1),
//! and no other reservation can take their room meanwhile. COMMIT drops the
//! placeholders with the victims.
//!
//! Pure; called by the shard ledger only.

use crate::ledger::command::{TxnId, VICTIM_ROOM_NS};
use crate::model::gang::MemberKey;
use crate::model::pod::PodSummary;
use crate::model::resources::{ResourceName, Resources};

/// The key of placeholder `i` of transaction `txn_id` on `node`.
pub fn placeholder_key(txn_id: TxnId, node: &str, i: usize) -> MemberKey {
    MemberKey::new(VICTIM_ROOM_NS, txn_id.to_string(), format!("{node}~{i}"))
}

/// Whether `key` names a placeholder (no gang member can: `~` is not in namespace names).
pub fn is_placeholder(key: &MemberKey) -> bool {
    key.namespace == VICTIM_ROOM_NS
}

/// The placeholders that hold, on `node`, what the preemptor's `members` there leave of
/// the `victims`' room. Each slot counts one pod, so there are as many as the victims
/// outnumber the members (at least one if anything else is left); the first carries
/// everything else.
pub fn victim_room(
    txn_id: TxnId,
    node: &str,
    victims: &[&PodSummary],
    members: &[&PodSummary],
) -> Vec<(MemberKey, PodSummary)> {
    let sum = |pods: &[&PodSummary]| {
        pods.iter().fold(Resources::default(), |acc, p| {
            acc.saturating_add(&p.requests)
        })
    };
    let mut requests = sum(victims).saturating_sub(&sum(members));
    requests.set(&ResourceName::Pods, 0);
    let member_ports: Vec<_> = members.iter().flat_map(|p| p.host_ports.iter()).collect();
    let host_ports = victims
        .iter()
        .flat_map(|p| p.host_ports.iter())
        .filter(|port| !member_ports.contains(port))
        .copied()
        .collect::<Vec<_>>();
    let taken_exclusive = |device: &crate::model::device::DeviceId| {
        members
            .iter()
            .flat_map(|p| p.devices.iter())
            .any(|d| &d.device == device && d.share_id.is_none())
    };
    let devices = victims
        .iter()
        .flat_map(|p| p.devices.iter())
        .filter(|d| !(d.share_id.is_none() && taken_exclusive(&d.device)))
        .cloned()
        .collect::<Vec<_>>();
    let anti_affinity = victims
        .iter()
        .flat_map(|p| p.anti_affinity.iter().cloned())
        .collect::<Vec<_>>();
    let priority = victims.iter().map(|p| p.priority).max().unwrap_or(0);
    let rest = !requests.is_zero()
        || !host_ports.is_empty()
        || !devices.is_empty()
        || !anti_affinity.is_empty();
    let count = victims
        .len()
        .saturating_sub(members.len())
        .max(usize::from(rest));
    let mut first = Some(PodSummary {
        requests,
        priority,
        host_ports,
        anti_affinity,
        devices,
        ..PodSummary::default()
    });
    (0..count)
        .map(|i| {
            let pod = first.take().unwrap_or_else(|| PodSummary {
                priority,
                ..PodSummary::default()
            });
            (placeholder_key(txn_id, node, i), pod)
        })
        .collect()
}

#[cfg(test)]
#[path = "displace_tests.rs"]
mod tests;
