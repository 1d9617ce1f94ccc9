//! Network-attached device pools of a shard, and who holds their devices.
//!
//! Owns [`NetworkPools`]: the pools whose ResourceSlices name no single node
//! (`allNodes`, or a `nodeSelector`), which nodes each serves ([`PoolReach`]), their
//! devices with health and taints, and the *holds*: per gang member, the network
//! devices it was allocated and the transaction that holds them; per shared
//! ResourceClaim allocated with network devices, the devices under the claim's key
//! (`namespace/~claim/name`) and its *consumers*, the members that use it wherever they
//! run, each with the transaction that added it. A claim hold lives while it has a
//! consumer: its carrier may go first, and its last consumer frees it. Such a pool serves
//! nodes of every shard, so every shard keeps a full copy of it, and a transaction
//! that allocates one of its devices holds it on every shard (each shard is a
//! participant of the two-phase transaction, docs/ARCHITECTURE.md §5, rule 15). Two
//! transactions that want one device therefore meet on every shard, and at least one
//! shard refuses one of them: no device is held twice (I1), whatever shard places the
//! pod, and a shard plans with its own copy, which counts every hold of the cluster.
//! Invariants (checked by [`NetworkPools::check`]): the accounting is that of the
//! holds, as a node's is of its slots; a hold is never empty; a claim hold has a
//! consumer, and consumers belong to claim holds. Pure; called by the shard
//! ledger ([`crate::ledger::shard`]) and read by the engine through
//! [`crate::ledger::view::LedgerView::network`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ledger::command::{
    claim_key, HoldKind, NetworkHold, RefusalCause, TxnId, CLAIM_GANG, OBSERVED_GANG,
};
use crate::ledger::devices::{
    pairs, DeviceBatch, DeviceEviction, EvictionCause, NodeDevices, PoolChange, PoolKey, PoolParts,
    PoolWithdrawal,
};
use crate::ledger::usage::{PodSlot, SlotState};
use crate::model::device::{DeviceId, DeviceTaint};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
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
    /// Member (or shared claim's key) → the network devices it holds (in
    /// `pod.devices`) and under which transaction.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    holds: BTreeMap<MemberKey, PodSlot>,
    /// Shared claim's key → the members that use it, with the transaction that added each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    consumers: BTreeMap<MemberKey, BTreeMap<MemberKey, TxnId>>,
}

impl NetworkPools {
    /// Whether no pool is published and nothing is held.
    pub fn is_empty(&self) -> bool {
        self.reach.is_empty()
            && self.devices.is_empty()
            && self.holds.is_empty()
            && self.consumers.is_empty()
    }

    /// The pools' devices and accounting.
    pub fn devices(&self) -> &NodeDevices {
        &self.devices
    }

    /// Which nodes a pool serves (none: not a network pool of this shard).
    pub fn reach(&self, pool: &PoolKey) -> Option<&PoolReach> {
        self.reach.get(pool)
    }

    /// Whether `device` is published here and reachable from `node` (its pool's reach,
    /// or its own where the pool lets each device say).
    pub fn reaches(&self, device: &DeviceId, node: &Node) -> bool {
        self.reach_of(device, node) == Some(true)
    }

    /// Whether `device` is published here and not reachable from `node`.
    pub fn out_of_reach(&self, device: &DeviceId, node: &Node) -> bool {
        self.reach_of(device, node) == Some(false)
    }

    /// Whether a published `device` is reachable from `node` (`None`: not published).
    fn reach_of(&self, device: &DeviceId, node: &Node) -> Option<bool> {
        let reach = self.reach.get(&pool_of(device))?;
        let published = self.devices.device(device)?;
        Some(reach.admits_device(published, node))
    }

    /// Every pool with the nodes it serves.
    pub fn pools(&self) -> impl Iterator<Item = (&PoolKey, &PoolReach)> {
        self.reach.iter()
    }

    /// Whether `device` is a device of one of these pools.
    pub fn has_pool_of(&self, device: &DeviceId) -> bool {
        self.reach.contains_key(&pool_of(device))
    }

    /// The holds, by member (or shared claim's key).
    pub fn holds(&self) -> &BTreeMap<MemberKey, PodSlot> {
        &self.holds
    }

    /// The hold of shared claim `claim` (`namespace/name`), if it is held here.
    pub fn claim_hold(&self, claim: &str) -> Option<&PodSlot> {
        self.holds.get(&claim_key(claim))
    }

    /// Whether `member` uses shared claim `claim` through its network hold.
    pub fn uses(&self, member: &MemberKey, claim: &str) -> bool {
        self.consumers
            .get(&claim_key(claim))
            .is_some_and(|c| c.contains_key(member))
    }

    /// Every member that uses a shared claim held here, with the transaction that added it.
    pub fn consumers(&self) -> impl Iterator<Item = (&MemberKey, TxnId)> + '_ {
        self.consumers
            .values()
            .flat_map(|c| c.iter().map(|(m, t)| (m, *t)))
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
            || self.consumers().any(|(_, t)| t == txn_id)
    }

    /// Members (not claims) whose holds `txn_id` holds (reserved or committed).
    pub fn held_by(&self, txn_id: TxnId) -> Vec<MemberKey> {
        self.holds
            .iter()
            .filter(|(key, slot)| key.gang != CLAIM_GANG && slot.state.txn_id() == Some(txn_id))
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
        let current = (self.devices.pools.get(&key))
            .filter(|p| p.standing.is_offered())
            .map(|p| p.generation);
        if current == Some(pool.generation) && self.reach.get(&key) != Some(reach) {
            return Err(pool.generation);
        }
        let (change, evictions) = self.devices.publish("", pool, &self.holds, at_ms)?;
        if matches!(change, PoolChange::Added | PoolChange::Replaced) {
            self.reach.insert(key, reach.clone());
        }
        Ok((change, self.of_consumers(evictions)))
    }

    /// Withdraws a pool whose slices are gone (it keeps its reach and holds).
    pub fn withdraw(&mut self, key: &PoolKey) -> PoolWithdrawal {
        self.devices.withdraw(key)
    }

    /// Why each hold of a reservation cannot be taken beside the held ones and the
    /// holds before it in the same list, if so. A shared claim is carried once; it is
    /// used where it is held committed or carried by the same list (a reserved claim
    /// belongs to another transaction, which may yet abort).
    pub fn refusals(&self, holds: &[NetworkHold], at_ms: u64) -> Vec<(MemberKey, RefusalCause)> {
        let mut batch = DeviceBatch::default();
        let mut out = Vec::new();
        let mut carried: BTreeSet<&str> = BTreeSet::new();
        for hold in holds {
            let cause = match hold.kind() {
                HoldKind::Own if self.holds.contains_key(&hold.member) => {
                    Some(RefusalCause::NetworkDevicesHeld)
                }
                HoldKind::Carry(claim)
                    if carried.contains(claim) || self.holds.contains_key(&claim_key(claim)) =>
                {
                    Some(RefusalCause::SharedClaimCarried {
                        claim: claim.to_string(),
                    })
                }
                HoldKind::Use(_) => continue,
                HoldKind::Own | HoldKind::Carry(_) => {
                    self.devices.refusal_for(&batch, &hold.devices, Some(at_ms))
                }
            };
            match cause {
                Some(cause) => out.push((hold.member.clone(), cause)),
                None => {
                    self.devices.count_into(&mut batch, &hold.devices);
                    if let HoldKind::Carry(claim) = hold.kind() {
                        carried.insert(claim);
                    }
                }
            }
        }
        for hold in holds {
            let HoldKind::Use(claim) = hold.kind() else {
                continue;
            };
            let committed = self
                .claim_hold(claim)
                .is_some_and(|slot| slot.state.is_gangway() && !slot.state.is_reserved());
            let cause = if self.uses(&hold.member, claim) {
                Some(RefusalCause::NetworkDevicesHeld)
            } else if !committed && !carried.contains(claim) {
                Some(RefusalCause::SharedClaimNotHere {
                    claim: claim.to_string(),
                })
            } else {
                None
            };
            if let Some(cause) = cause {
                out.push((hold.member.clone(), cause));
            }
        }
        out
    }

    /// Holds a member's network devices, or carries or uses a shared claim (callers
    /// check [`NetworkPools::refusals`] first).
    pub fn hold(&mut self, hold: &NetworkHold, state: SlotState) {
        let key = hold.key();
        if let HoldKind::Own | HoldKind::Carry(_) = hold.kind() {
            self.devices.hold(&hold.devices);
            let pod = PodSummary {
                devices: hold.devices.clone(),
                ..PodSummary::default()
            };
            self.holds.insert(key.clone(), PodSlot { pod, state });
        }
        if let (HoldKind::Carry(_) | HoldKind::Use(_), Some(txn_id)) = (hold.kind(), state.txn_id())
        {
            self.consumers
                .entry(key)
                .or_default()
                .insert(hold.member.clone(), txn_id);
        }
    }

    /// `member` stops using every shared claim; a claim left without consumers is
    /// given back. Returns whether it used any.
    pub fn leave(&mut self, member: &MemberKey) -> bool {
        !self.drop_consumers(|m, _| m == member).is_empty()
    }

    /// Every shared claim `member` uses is given back, whoever else uses it: the bug
    /// behind `ledger-frees-shared-claims-with-their-carrier` for network claims (what
    /// holding a claim's devices under its carrier's key would do). Test-only in effect:
    /// production leaves through [`NetworkPools::leave`].
    pub fn leave_freeing(&mut self, member: &MemberKey) -> bool {
        let claims: Vec<MemberKey> = self
            .consumers
            .iter()
            .filter(|(_, c)| c.contains_key(member))
            .map(|(claim, _)| claim.clone())
            .collect();
        for claim in &claims {
            self.consumers.remove(claim);
            self.take(claim);
        }
        !claims.is_empty()
    }

    /// The consumers `txn_id` added go; a claim left without consumers is given back.
    /// Returns the members that went (once each).
    pub fn leave_txn(&mut self, txn_id: TxnId) -> Vec<MemberKey> {
        self.drop_consumers(|_, t| t == txn_id)
    }

    fn drop_consumers(&mut self, going: impl Fn(&MemberKey, TxnId) -> bool) -> Vec<MemberKey> {
        let mut gone = BTreeSet::new();
        let mut emptied = Vec::new();
        for (claim, consumers) in &mut self.consumers {
            consumers.retain(|m, t| {
                let goes = going(m, *t);
                if goes {
                    gone.insert(m.clone());
                }
                !goes
            });
            if consumers.is_empty() {
                emptied.push(claim.clone());
            }
        }
        for claim in emptied {
            self.consumers.remove(&claim);
            self.take(&claim);
        }
        gone.into_iter().collect()
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
        let evictions = self
            .devices
            .set_rule_taints("", device, taints, &self.holds, at_ms)?;
        Ok(self.of_consumers(evictions))
    }

    /// Evictions by hold, with a shared claim's replaced by one per consumer (every
    /// pod using a device goes with it).
    pub fn of_consumers(&self, evictions: Vec<DeviceEviction>) -> Vec<DeviceEviction> {
        let mut out = Vec::with_capacity(evictions.len());
        for e in evictions {
            match self.consumers.get(&e.member) {
                Some(consumers) if e.member.gang == CLAIM_GANG => {
                    out.extend(consumers.keys().map(|m| DeviceEviction {
                        member: m.clone(),
                        ..e.clone()
                    }));
                }
                _ => out.push(e),
            }
        }
        out
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
        self.of_consumers(detached.chain(bad).collect())
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
        let unused = |(key, slot): &(&MemberKey, &PodSlot)| {
            key.gang == CLAIM_GANG
                && slot.state.is_gangway()
                && self.consumers.get(*key).is_none_or(BTreeMap::is_empty)
        };
        if let Some((claim, _)) = self.holds.iter().find(unused) {
            return Err(format!(
                "I1: shared claim {claim} is held with no pod using it"
            ));
        }
        if let Some(claim) = self.consumers.keys().find(|k| {
            k.gang != CLAIM_GANG || !self.holds.get(*k).is_some_and(|s| s.state.is_gangway())
        }) {
            return Err(format!(
                "{claim} has consumers but is no shared claim held here"
            ));
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
