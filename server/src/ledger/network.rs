//! Network-attached device pools of a shard, and who holds their devices.
//!
//! Owns [`NetworkPools`]: the pools whose ResourceSlices name no single node
//! (`allNodes`, or a `nodeSelector`), which nodes each serves ([`PoolReach`]), their
//! devices with health and taints, and the *holds*: per gang member, the network
//! devices it was allocated and the transaction that holds them. Such a pool serves
//! nodes of every shard, so every shard keeps a full copy of it, and a transaction
//! that allocates one of its devices holds it on every shard (each shard is a
//! participant of the two-phase transaction, docs/ARCHITECTURE.md §5, rule 15). Two
//! transactions that want one device therefore meet on every shard, and at least one
//! shard refuses one of them: no device is held twice (I1), whatever shard places the
//! pod, and a shard plans with its own copy, which counts every hold of the cluster.
//! Invariants (checked by [`NetworkPools::check`]): the accounting is that of the
//! holds, as a node's is of its slots; a hold is never empty. Pure; called by the shard
//! ledger ([`crate::ledger::shard`]) and read by the engine through
//! [`crate::ledger::view::LedgerView::network`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ledger::command::{NetworkHold, RefusalCause, TxnId, OBSERVED_GANG};
use crate::ledger::devices::{
    pairs, DeviceBatch, DeviceEviction, EvictionCause, NodeDevices, PoolChange, PoolKey, PoolParts,
};
use crate::ledger::usage::{PodSlot, SlotState};
use crate::model::device::{DeviceId, DeviceTaint};
use crate::model::gang::MemberKey;
use crate::model::pod::PodSummary;
use crate::model::reach::PoolReach;

/// The network-attached pools of a shard, with their holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPools {
    /// Which nodes each pool serves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "pairs")]
    reach: BTreeMap<PoolKey, PoolReach>,
    /// The pools' devices and what is held of them (kept as a node keeps its own).
    #[serde(default, skip_serializing_if = "NodeDevices::is_empty")]
    devices: NodeDevices,
    /// Member → the network devices it holds (in `pod.devices`) and under which transaction.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    holds: BTreeMap<MemberKey, PodSlot>,
}

impl NetworkPools {
    /// Whether no pool is published and nothing is held.
    pub fn is_empty(&self) -> bool {
        self.reach.is_empty() && self.devices.is_empty() && self.holds.is_empty()
    }

    /// The pools' devices and accounting.
    pub fn devices(&self) -> &NodeDevices {
        &self.devices
    }

    /// Which nodes a pool serves (none: not a network pool of this shard).
    pub fn reach(&self, pool: &PoolKey) -> Option<&PoolReach> {
        self.reach.get(pool)
    }

    /// Every pool with the nodes it serves.
    pub fn pools(&self) -> impl Iterator<Item = (&PoolKey, &PoolReach)> {
        self.reach.iter()
    }

    /// Whether `device` is a device of one of these pools.
    pub fn has_pool_of(&self, device: &DeviceId) -> bool {
        self.reach.contains_key(&pool_of(device))
    }

    /// The holds, by member.
    pub fn holds(&self) -> &BTreeMap<MemberKey, PodSlot> {
        &self.holds
    }

    /// The member's hold, if any.
    pub fn hold_of(&self, member: &MemberKey) -> Option<&PodSlot> {
        self.holds.get(member)
    }

    /// Whether `txn_id` holds anything here (reserved or committed).
    pub fn holds_any(&self, txn_id: TxnId) -> bool {
        self.holds
            .values()
            .any(|slot| slot.state.txn_id() == Some(txn_id))
    }

    /// Members whose holds `txn_id` holds (reserved or committed).
    pub fn held_by(&self, txn_id: TxnId) -> Vec<MemberKey> {
        self.holds
            .iter()
            .filter(|(_, slot)| slot.state.txn_id() == Some(txn_id))
            .map(|(member, _)| member.clone())
            .collect()
    }

    /// Publishes a validated pool serving `reach`. A newer generation replaces the old
    /// one (and its reach) and every hold is recounted; holders that lost their device,
    /// or whose device now taints them out, are returned (with an empty node: the
    /// caller names the node of the members it places). `Err(generation)` when the same
    /// generation arrives with other content.
    pub fn publish(
        &mut self,
        pool: PoolParts<'_>,
        reach: &PoolReach,
        at_ms: u64,
    ) -> Result<(PoolChange, Vec<DeviceEviction>), u64> {
        let key = PoolKey {
            driver: pool.driver.to_string(),
            pool: pool.name.to_string(),
        };
        let current = self.devices.pools.get(&key).map(|p| p.generation);
        if current == Some(pool.generation) && self.reach.get(&key) != Some(reach) {
            return Err(pool.generation);
        }
        let (change, evictions) = self.devices.publish("", pool, &self.holds, at_ms)?;
        if matches!(change, PoolChange::Added | PoolChange::Replaced) {
            self.reach.insert(key, reach.clone());
        }
        Ok((change, evictions))
    }

    /// Why each hold of a reservation cannot be taken beside the held ones and the
    /// holds before it in the same list, if so (one refusal per refused member).
    pub fn refusals(&self, holds: &[NetworkHold], at_ms: u64) -> Vec<(MemberKey, RefusalCause)> {
        let mut batch = DeviceBatch::default();
        let mut out = Vec::new();
        for hold in holds {
            if self.holds.contains_key(&hold.member) {
                out.push((hold.member.clone(), RefusalCause::NetworkDevicesHeld));
                continue;
            }
            match self.devices.refusal_for(&batch, &hold.devices, Some(at_ms)) {
                Some(cause) => out.push((hold.member.clone(), cause)),
                None => self.devices.count_into(&mut batch, &hold.devices),
            }
        }
        out
    }

    /// Holds a member's network devices (callers check [`NetworkPools::refusals`] first).
    pub fn hold(&mut self, hold: &NetworkHold, state: SlotState) {
        self.devices.hold(&hold.devices);
        let pod = PodSummary {
            devices: hold.devices.clone(),
            ..PodSummary::default()
        };
        self.holds
            .insert(hold.member.clone(), PodSlot { pod, state });
    }

    /// Replaces the taints rules put on one device; returns the holders to evict (those
    /// a NoExecute taint now puts out, with an empty node), or the device when no pool
    /// here publishes it.
    pub fn set_rule_taints(
        &mut self,
        device: &DeviceId,
        taints: &[DeviceTaint],
        at_ms: u64,
    ) -> Result<Vec<DeviceEviction>, DeviceId> {
        self.devices
            .set_rule_taints("", device, taints, &self.holds, at_ms)
    }

    /// The gangway holds to evict at `at_ms` (devices gone, unhealthy or tainted
    /// NoExecute past the toleration), with an empty node: the caller names the node of
    /// the members it places.
    pub fn evictions(&self, at_ms: u64) -> Vec<DeviceEviction> {
        let detached = self.devices.detached.iter().filter_map(|(member, index)| {
            let slot = self.holds.get(member).filter(|s| s.state.is_gangway())?;
            let a = slot.pod.devices.get(*index as usize)?;
            Some(DeviceEviction {
                member: member.clone(),
                node: String::new(),
                device: a.device.clone(),
                cause: EvictionCause::DeviceRemoved,
                evict_at_ms: at_ms,
            })
        });
        let bad = self
            .devices
            .evictions("", &self.holds, at_ms, |_| true)
            .into_iter()
            .filter(|e| e.evict_at_ms <= at_ms);
        detached.chain(bad).collect()
    }

    /// Commits a reserved hold.
    pub fn promote(&mut self, member: &MemberKey, at_ms: u64) {
        if let Some(slot) = self.holds.get_mut(member) {
            if let SlotState::Reserved { txn_id } = slot.state {
                slot.state = SlotState::Committed { txn_id, at_ms };
            }
        }
    }

    /// Gives a member's network devices back.
    pub fn take(&mut self, member: &MemberKey) -> Option<PodSlot> {
        let slot = self.holds.remove(member)?;
        self.devices.release(member, &slot.pod.devices);
        Some(slot)
    }

    /// Replaces the holds other schedulers' claims have (`SlotState::Observed`): all are
    /// given back, then each of `holds` is counted in order as it fits (a device
    /// gangway's holds, or an earlier one, have is detached: recorded, not counted).
    /// Returns the devices left out, per hold. Trying every hold again each time counts
    /// one that was left out as soon as the device it wants is free.
    pub fn set_observed(&mut self, holds: &[NetworkHold]) -> Vec<(MemberKey, Vec<DeviceId>)> {
        let old: Vec<MemberKey> = self
            .holds
            .iter()
            .filter(|(_, slot)| !slot.state.is_gangway())
            .map(|(member, _)| member.clone())
            .collect();
        for member in &old {
            self.take(member);
        }
        let mut conflicts = Vec::new();
        for hold in holds {
            let left_out = self.devices.observe(&hold.member, &hold.devices);
            let pod = PodSummary {
                devices: hold.devices.clone(),
                ..PodSummary::default()
            };
            self.holds.insert(
                hold.member.clone(),
                PodSlot {
                    pod,
                    state: SlotState::Observed,
                },
            );
            if !left_out.is_empty() {
                conflicts.push((hold.member.clone(), left_out));
            }
        }
        conflicts
    }

    /// Checks I1 and the accounting; the error says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if let Some((member, _)) = self.holds.iter().find(|(_, s)| s.pod.devices.is_empty()) {
            return Err(format!("network hold of {member} holds no device"));
        }
        let misfiled = |(member, slot): &(&MemberKey, &PodSlot)| {
            slot.state.is_gangway() == (member.gang == OBSERVED_GANG)
        };
        if let Some((member, _)) = self.holds.iter().find(misfiled) {
            return Err(format!(
                "network hold of {member} is keyed as another scheduler's it is not, or the reverse"
            ));
        }
        self.devices
            .check(&self.holds)
            .map_err(|e| format!("network pools: {e}"))
    }
}

/// The pool a device belongs to.
pub fn pool_of(device: &DeviceId) -> PoolKey {
    PoolKey {
        driver: device.driver.clone(),
        pool: device.pool.clone(),
    }
}
