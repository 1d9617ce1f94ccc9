//! The device part of a node's ledger entry: the only writable record of its devices.
//!
//! Owns [`NodeDevices`]: the pools the node's drivers published (one generation each;
//! a newer generation replaces a pool, an older one is ignored), device health reported
//! device-plugin style, taints applied by rules, the node agent's link (a disconnect
//! marks every device unhealthy once its grace period has passed), and the accounting
//! of who holds what: per device the number of allocations that take it and the
//! capacity they consume, per shared counter what the devices in use consume, and the
//! allocations a republished pool no longer has room for ("detached": the pod is told to
//! go and they count nothing). Invariant I1, checked by [`NodeDevices::check`] (called
//! by the shard ledger's invariant check and debug-asserted after every command): an
//! exclusive device is held by at most one allocation, a shared device's holders
//! consume at most its capacity, no counter set is consumed beyond its amounts, every
//! counted allocation names a published device, and the accounting equals what the
//! node's slots hold. Admin-access allocations take nothing. Maps keyed by structured
//! ids encode as lists of pairs, so snapshots stay deterministic in every format. A definition
//! stamp (drawn like node stamps, no part of the state: snapshots and equality ignore
//! it) names the state of what decides which devices can serve a request (pools,
//! health, rule taints, agent link), so the engine can keep per-node results across
//! calls while allocations come and go. Called by the
//! node usage (hold, take, refusal checks), the shard ledger (publish, health, taints,
//! agent link) and the engine (reads).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ledger::command::{DeviceRefusal, RefusalCause};
use crate::ledger::usage::PodSlot;
use crate::ledger::view::next_stamp;
use crate::model::claim::{AdminAccess, DeviceAllocation};
use crate::model::compact::{SmallMap, SymbolTable};
use crate::model::device::{
    AllocationSharing, CounterSet, Device, DeviceId, DeviceQuantity, DeviceTaint, DeviceTaintEffect,
};
use crate::model::gang::MemberKey;

mod pool_devices;
pub use pool_devices::PoolDevices;

/// How long a disconnected node agent's devices stay healthy, in ms (the kubelet's
/// device-plugin grace period: 5 minutes).
pub const AGENT_GRACE_MS_DEFAULT: u64 = 5 * 60 * 1000;

/// A device's health, as a device plugin's ListAndWatch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DeviceHealth {
    /// Usable.
    Healthy,
    /// Takes no new allocations; pods holding it are told to go.
    Unhealthy,
}

/// The node agent's link to the ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentLink {
    /// Reporting.
    #[default]
    Connected,
    /// Gone since `since_ms`; devices count as unhealthy from `since_ms + grace_ms`.
    Disconnected {
        /// When the link dropped, in ms.
        since_ms: u64,
        /// Grace period, in ms.
        grace_ms: u64,
    },
    /// The grace period passed and every device was marked unhealthy.
    Lost {
        /// When the link dropped, in ms.
        since_ms: u64,
    },
}

impl AgentLink {
    /// Whether the agent is reporting.
    pub fn is_connected(&self) -> bool {
        *self == Self::Connected
    }

    /// Whether, at `at_ms`, the devices count as unhealthy because of the link.
    pub fn expired_at(&self, at_ms: Option<u64>) -> bool {
        match (self, at_ms) {
            (Self::Lost { .. }, _) => true,
            (Self::Disconnected { since_ms, grace_ms }, Some(at)) => {
                at >= since_ms.saturating_add(*grace_ms)
            }
            _ => false,
        }
    }
}

/// A pool as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedPool {
    /// Its generation.
    pub generation: u64,
    /// Devices by name.
    pub devices: PoolDevices,
    /// Counter sets by name: counter → total.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counter_sets: BTreeMap<String, BTreeMap<String, DeviceQuantity>>,
    /// Whether its devices are offered to new allocations.
    #[serde(default, skip_serializing_if = "PoolStanding::is_offered")]
    pub standing: PoolStanding,
}

/// Whether a pool's devices may be given out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolStanding {
    /// Its slices are published: its devices are offered.
    #[default]
    Offered,
    /// Its slices are gone (the driver unregistered, or deleted them): no new allocation
    /// takes its devices, while the holders keep theirs and stay counted, since a driver
    /// restart deletes and republishes the same devices. The next publication of any
    /// generation replaces it.
    Withdrawn,
}

impl PoolStanding {
    /// Whether the pool's devices are offered.
    pub fn is_offered(&self) -> bool {
        *self == Self::Offered
    }
}

/// What a withdrawal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolWithdrawal {
    /// The pool was offered and is withdrawn now.
    Withdrawn,
    /// It was withdrawn already.
    AlreadyWithdrawn,
    /// No such pool was ever published here.
    Absent,
}

impl PublishedPool {
    /// Shares its devices' repeated strings through `symbols` (see [`Device::intern`]).
    pub fn intern(&mut self, symbols: &mut SymbolTable) {
        for device in self.devices.values_mut() {
            device.intern(symbols);
        }
    }

    /// The ledger's form of a validated pool's generation, devices and counter sets.
    pub fn of(generation: u64, devices: &[Device], counter_sets: &[CounterSet]) -> Self {
        Self {
            generation,
            devices: PoolDevices::of(devices.to_vec()),
            counter_sets: counter_sets
                .iter()
                .map(|CounterSet { name, counters }| (name.clone(), counters.clone()))
                .collect(),
            standing: PoolStanding::Offered,
        }
    }
}

/// A pool as a PublishPool command carries it (validated).
#[derive(Debug, Clone, Copy)]
pub struct PoolParts<'p> {
    /// Driver.
    pub driver: &'p str,
    /// Pool name.
    pub name: &'p str,
    /// Generation.
    pub generation: u64,
    /// Devices.
    pub devices: &'p [Device],
    /// Counter sets.
    pub counter_sets: &'p [CounterSet],
}

/// A pool's identity on a node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PoolKey {
    /// Driver.
    pub driver: String,
    /// Pool name.
    pub pool: String,
}

/// One counter of one counter set of one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CounterKey {
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Counter set.
    pub counter_set: String,
    /// Counter.
    pub counter: String,
}

/// What the allocations holding one device take of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceUse {
    /// Allocations that take the device (admin access excluded).
    pub holders: u32,
    /// Capacity they consume (shared devices).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed: BTreeMap<String, DeviceQuantity>,
}

/// What a pod must be told when a device it holds goes bad.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EvictionCause {
    /// The device was reported (or, its agent lost, presumed) unhealthy.
    Unhealthy,
    /// A NoExecute taint the allocation does not tolerate (long enough).
    NoExecuteTaint {
        /// Taint key.
        key: String,
        /// Taint value.
        value: String,
    },
    /// A newer pool generation dropped the device, or no longer has room for the allocation.
    DeviceRemoved,
}

/// An eviction the caller acts on: the pod should be gone by `evict_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceEviction {
    /// The pod.
    pub member: MemberKey,
    /// Its node.
    pub node: String,
    /// The device.
    pub device: DeviceId,
    /// Why.
    pub cause: EvictionCause,
    /// When, in ms (the command's time, or a taint's time plus the toleration's seconds).
    pub evict_at_ms: u64,
}

/// One line of a health report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHealthReport {
    /// The device.
    pub device: DeviceId,
    /// Its health.
    pub health: DeviceHealth,
}

/// Devices, health and holdings of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDevices {
    /// Published pools (a node has a few).
    #[serde(default, skip_serializing_if = "SmallMap::is_empty", with = "pairs")]
    pub pools: SmallMap<PoolKey, PublishedPool>,
    /// Devices reported unhealthy (absent: healthy).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub unhealthy: BTreeSet<DeviceId>,
    /// Taints applied by rules, on top of the driver's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "pairs")]
    pub rule_taints: BTreeMap<DeviceId, Vec<DeviceTaint>>,
    /// The node agent's link.
    #[serde(default, skip_serializing_if = "AgentLink::is_connected")]
    pub agent: AgentLink,
    /// Accounting: what the counted allocations take of each device.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "pairs")]
    pub held: BTreeMap<DeviceId, DeviceUse>,
    /// Accounting: counters consumed by the devices in use.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "pairs")]
    pub counters: BTreeMap<CounterKey, DeviceQuantity>,
    /// Allocations (member, position in its list) a republished pool had no room for.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub detached: BTreeSet<(MemberKey, u32)>,
    /// Names the current pools, health, rule taints and agent link (not state).
    #[serde(skip)]
    stamp: DefinitionStamp,
}

/// A stamp no other definition state had; equal to every other stamp, so that state
/// comparisons ignore it.
#[derive(Debug, Clone, Copy)]
struct DefinitionStamp(u64);

impl Default for DefinitionStamp {
    fn default() -> Self {
        Self(next_stamp())
    }
}

impl PartialEq for DefinitionStamp {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for DefinitionStamp {}

/// Encodes maps with structured keys as lists of pairs (a JSON map key must be a string).
pub(crate) mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::model::compact::SmallMap;

    /// A map encoded as a list of pairs.
    pub trait PairMap: Sized {
        /// Its keys.
        type Key: Ord;
        /// Its values.
        type Value;
        /// Its entries in key order.
        fn pairs(&self) -> Vec<(&Self::Key, &Self::Value)>;
        /// The map of `pairs` (of duplicate keys the last wins).
        fn of_pairs(pairs: Vec<(Self::Key, Self::Value)>) -> Self;
    }

    impl<K: Ord, V> PairMap for BTreeMap<K, V> {
        type Key = K;
        type Value = V;
        fn pairs(&self) -> Vec<(&K, &V)> {
            self.iter().collect()
        }
        fn of_pairs(pairs: Vec<(K, V)>) -> Self {
            pairs.into_iter().collect()
        }
    }

    impl<K: Ord, V> PairMap for SmallMap<K, V> {
        type Key = K;
        type Value = V;
        fn pairs(&self) -> Vec<(&K, &V)> {
            self.iter().collect()
        }
        fn of_pairs(pairs: Vec<(K, V)>) -> Self {
            pairs.into_iter().collect()
        }
    }

    pub fn serialize<M, S>(map: &M, s: S) -> Result<S::Ok, S::Error>
    where
        M: PairMap,
        M::Key: Serialize,
        M::Value: Serialize,
        S: Serializer,
    {
        map.pairs().serialize(s)
    }

    pub fn deserialize<'de, M, D>(d: D) -> Result<M, D::Error>
    where
        M: PairMap,
        M::Key: Deserialize<'de>,
        M::Value: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Vec::deserialize(d).map(M::of_pairs)
    }
}

/// What publishing a pool did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolChange {
    /// The pool was new.
    Added,
    /// A newer generation replaced the pool.
    Replaced,
    /// The same generation with the same content: nothing changed.
    Unchanged,
    /// An older generation: ignored.
    Stale {
        /// The generation kept.
        current: u64,
    },
}

/// Allocations being checked or counted together, over the held accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Overlay {
    held: BTreeMap<DeviceId, DeviceUse>,
    counters: BTreeMap<CounterKey, DeviceQuantity>,
}

impl Overlay {
    /// Adds what `other` counts.
    fn merge(&mut self, other: Overlay) {
        for (id, usage) in other.held {
            let mine = self.held.entry(id).or_default();
            mine.holders = mine.holders.saturating_add(usage.holders);
            for (name, amount) in usage.consumed {
                let q = mine.consumed.entry(name).or_default();
                *q = q
                    .checked_add(&amount)
                    .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
            }
        }
        for (key, amount) in other.counters {
            let q = self.counters.entry(key).or_default();
            *q = q
                .checked_add(&amount)
                .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
        }
    }
}

/// The devices taken by the members accepted so far in one reservation batch on one
/// node, beyond what the node holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceBatch {
    /// Allocations added without the node at hand, counted when checking.
    pending: Vec<DeviceAllocation>,
    /// Allocations counted against the node.
    counted: Overlay,
}

impl DeviceBatch {
    /// Adds allocations to count when the next pod is checked.
    pub fn push(&mut self, allocations: &[DeviceAllocation]) {
        self.pending.extend(allocations.iter().cloned());
    }
}

impl NodeDevices {
    /// Shares the published devices' repeated strings through `symbols`.
    pub fn intern(&mut self, symbols: &mut SymbolTable) {
        for pool in self.pools.values_mut() {
            pool.intern(symbols);
        }
    }

    /// The stamp of the current definitions (pools, health, rule taints, agent link):
    /// equal stamps mean the same devices qualify for the same requests.
    pub fn definition_stamp(&self) -> u64 {
        self.stamp.0
    }

    /// Sets the agent link.
    pub fn set_agent(&mut self, link: AgentLink) {
        if self.agent != link {
            self.agent = link;
            self.touch();
        }
    }

    fn touch(&mut self) {
        self.stamp = DefinitionStamp::default();
    }

    /// Whether there is nothing: no pool, no health, no holdings.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
            && self.unhealthy.is_empty()
            && self.rule_taints.is_empty()
            && self.agent.is_connected()
            && self.held.is_empty()
            && self.counters.is_empty()
            && self.detached.is_empty()
    }

    /// The device named by `id`, if published.
    pub fn device(&self, id: &DeviceId) -> Option<&Device> {
        self.pools
            .get(&PoolKey {
                driver: id.driver.clone(),
                pool: id.pool.clone(),
            })?
            .devices
            .get(id.device.as_str())
    }

    /// The device named by `id`, if published in a pool that offers it (see
    /// [`PoolStanding::Withdrawn`]).
    pub fn offered(&self, id: &DeviceId) -> Option<&Device> {
        let pool = self.pools.get(&PoolKey {
            driver: id.driver.clone(),
            pool: id.pool.clone(),
        })?;
        if !pool.standing.is_offered() {
            return None;
        }
        pool.devices.get(id.device.as_str())
    }

    /// The device's health at `at_ms` (`None`: ignore a pending agent expiry).
    pub fn health(&self, id: &DeviceId, at_ms: Option<u64>) -> DeviceHealth {
        if self.unhealthy.contains(id) || self.agent.expired_at(at_ms) {
            DeviceHealth::Unhealthy
        } else {
            DeviceHealth::Healthy
        }
    }

    /// The device's taints: its driver's, then the rules'.
    pub fn taints<'a>(
        &'a self,
        id: &DeviceId,
        device: &'a Device,
    ) -> impl Iterator<Item = &'a DeviceTaint> + 'a {
        device
            .taints
            .iter()
            .chain(self.rule_taints.get(id).into_iter().flatten())
    }

    /// What the counted allocations take of a device.
    pub fn use_of(&self, id: &DeviceId) -> Option<&DeviceUse> {
        self.held.get(id)
    }

    /// What the devices in use consume of a counter.
    pub fn counter_used(&self, key: &CounterKey) -> DeviceQuantity {
        self.counters.get(key).copied().unwrap_or_default()
    }

    /// Why `allocations` cannot be added beside the counted ones and `batch` (accepted
    /// earlier in the same command), if so. Health counts at `at_ms`.
    pub fn refusal_for(
        &self,
        batch: &DeviceBatch,
        allocations: &[DeviceAllocation],
        at_ms: Option<u64>,
    ) -> Option<RefusalCause> {
        if allocations.is_empty() {
            return None;
        }
        let mut scratch = Overlay::default();
        for a in &batch.pending {
            if let Err(refusal) = self.admit(&batch.counted, &mut scratch, a) {
                // The batch was accepted; it cannot be refused now. Report it anyway.
                return Some(refusal);
            }
        }
        for a in allocations {
            if let Some(refusal) = self.usable(a, at_ms) {
                return Some(refusal);
            }
            if let Err(refusal) = self.admit(&batch.counted, &mut scratch, a) {
                return Some(refusal);
            }
        }
        None
    }

    /// Counts an accepted pod's allocations into `batch` (checked by
    /// [`NodeDevices::refusal_for`] against the same batch first).
    pub fn count_into(&self, batch: &mut DeviceBatch, allocations: &[DeviceAllocation]) {
        let mut scratch = Overlay::default();
        let pending = std::mem::take(&mut batch.pending);
        for a in pending.iter().chain(allocations) {
            // Accepted allocations fit; one that does not is not counted.
            let _ = self.admit(&batch.counted, &mut scratch, a);
        }
        batch.counted.merge(scratch);
    }

    /// Why the device of a new allocation may not be used at all (gone, sick, tainted).
    fn usable(&self, a: &DeviceAllocation, at_ms: Option<u64>) -> Option<RefusalCause> {
        let refuse = |reason| {
            Some(RefusalCause::DeviceUnavailable {
                device: a.device.clone(),
                reason,
            })
        };
        let Some(device) = self.offered(&a.device) else {
            return refuse(DeviceRefusal::NotPublished);
        };
        if self.health(&a.device, at_ms) == DeviceHealth::Unhealthy {
            return refuse(DeviceRefusal::Unhealthy);
        }
        if let Some(taint) = self
            .taints(&a.device, device)
            .find(|t| !a.tolerations.iter().any(|tol| tol.tolerates(t)))
        {
            return refuse(DeviceRefusal::Tainted {
                key: taint.key.clone(),
                effect: taint.effect,
            });
        }
        None
    }

    /// Counts `a` in `scratch` if the device has room for it beside the counted
    /// allocations, `batch` and `scratch` (I1); otherwise says why not.
    fn admit(
        &self,
        batch: &Overlay,
        scratch: &mut Overlay,
        a: &DeviceAllocation,
    ) -> Result<(), RefusalCause> {
        let refuse = |reason| RefusalCause::DeviceUnavailable {
            device: a.device.clone(),
            reason,
        };
        let Some(device) = self.device(&a.device) else {
            return Err(refuse(DeviceRefusal::NotPublished));
        };
        if a.admin_access == AdminAccess::Enabled {
            return Ok(());
        }
        let layers = [
            self.held.get(&a.device),
            batch.held.get(&a.device),
            scratch.held.get(&a.device),
        ];
        let holders: u32 = layers.iter().flatten().map(|u| u.holders).sum();
        match device.sharing {
            AllocationSharing::Exclusive => {
                if holders > 0 {
                    return Err(refuse(DeviceRefusal::InUse));
                }
                if a.share_id.is_some() || !a.consumed_capacity.is_empty() {
                    return Err(refuse(DeviceRefusal::NotShared));
                }
            }
            AllocationSharing::Shared => {
                if a.share_id.is_none() {
                    return Err(refuse(DeviceRefusal::ShareIdMissing));
                }
                for name in device.capacity.keys() {
                    if !a.consumed_capacity.contains_key(name.as_str()) {
                        return Err(refuse(DeviceRefusal::CapacityNotConsumed {
                            capacity: name.to_string(),
                        }));
                    }
                }
                for (name, amount) in &a.consumed_capacity {
                    let Some(capacity) = device.capacity.get(name.as_str()) else {
                        return Err(refuse(DeviceRefusal::CapacityNotConsumed {
                            capacity: name.clone(),
                        }));
                    };
                    if capacity.consumed_by(Some(*amount)) != Some(*amount) {
                        return Err(refuse(DeviceRefusal::PolicyViolated {
                            capacity: name.clone(),
                        }));
                    }
                    let used = layers
                        .iter()
                        .flatten()
                        .filter_map(|u| u.consumed.get(name))
                        .try_fold(*amount, |acc, q| acc.checked_add(q));
                    if used.is_none_or(|total| total > capacity.value) {
                        return Err(refuse(DeviceRefusal::CapacityExceeded {
                            capacity: name.clone(),
                        }));
                    }
                }
            }
        }
        if holders == 0 {
            for (key, amount) in counter_uses(&a.device, device) {
                let Some(total) = self.counter_total(&key) else {
                    return Err(refuse(DeviceRefusal::CountersExceeded {
                        counter_set: key.counter_set,
                        counter: key.counter,
                    }));
                };
                let used = self
                    .counter_used(&key)
                    .checked_add(&batch.counters.get(&key).copied().unwrap_or_default())
                    .and_then(|u| {
                        u.checked_add(&scratch.counters.get(&key).copied().unwrap_or_default())
                    })
                    .and_then(|u| u.checked_add(&amount));
                if used.is_none_or(|u| u > total) {
                    return Err(refuse(DeviceRefusal::CountersExceeded {
                        counter_set: key.counter_set,
                        counter: key.counter,
                    }));
                }
            }
        }
        add_use(
            &mut scratch.held,
            &mut scratch.counters,
            a,
            device,
            holders == 0,
        );
        Ok(())
    }

    /// The total of a counter, as its pool declares it.
    fn counter_total(&self, key: &CounterKey) -> Option<DeviceQuantity> {
        self.pools
            .get(&PoolKey {
                driver: key.driver.clone(),
                pool: key.pool.clone(),
            })?
            .counter_sets
            .get(&key.counter_set)?
            .get(&key.counter)
            .copied()
    }

    /// Counts a pod's allocations (callers check [`NodeDevices::refusal_for`] first).
    pub fn hold(&mut self, allocations: &[DeviceAllocation]) {
        for a in allocations {
            self.count(a);
        }
    }

    fn count(&mut self, a: &DeviceAllocation) {
        if a.admin_access == AdminAccess::Enabled {
            return;
        }
        let Some(device) = self.device(&a.device).cloned() else {
            return;
        };
        let first = self.held.get(&a.device).is_none_or(|u| u.holders == 0);
        add_use(&mut self.held, &mut self.counters, a, &device, first);
    }

    /// Counts an observed pod's allocations (a fact, not checked beforehand): each
    /// that does not fit beside the counted ones is detached instead; returns their devices.
    pub fn observe(
        &mut self,
        member: &MemberKey,
        allocations: &[DeviceAllocation],
    ) -> Vec<DeviceId> {
        self.adopt(member, 0, allocations)
    }

    /// Counts allocations handed to `member`'s slot (a shared claim's, from its departed
    /// carrier), which holds them from position `offset` on: as for an observed pod,
    /// each that does not fit is detached; returns their devices.
    pub fn adopt(
        &mut self,
        member: &MemberKey,
        offset: usize,
        allocations: &[DeviceAllocation],
    ) -> Vec<DeviceId> {
        let mut left_out = Vec::new();
        for (i, a) in allocations.iter().enumerate() {
            let index = u32::try_from(offset + i).unwrap_or(u32::MAX);
            let mut scratch = Overlay::default();
            if self.admit(&Overlay::default(), &mut scratch, a).is_ok() {
                self.count(a);
            } else {
                self.detached.insert((member.clone(), index));
                left_out.push(a.device.clone());
            }
        }
        left_out
    }

    /// Gives back a released pod's allocations (detached ones counted nothing).
    pub fn release(&mut self, member: &MemberKey, allocations: &[DeviceAllocation]) {
        for (i, a) in allocations.iter().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            if self.detached.remove(&(member.clone(), index)) {
                continue;
            }
            if a.admin_access == AdminAccess::Enabled {
                continue;
            }
            let device = self.device(&a.device).cloned();
            let Some(usage) = self.held.get_mut(&a.device) else {
                continue;
            };
            usage.holders = usage.holders.saturating_sub(1);
            for (name, amount) in &a.consumed_capacity {
                if let Some(q) = usage.consumed.get_mut(name) {
                    *q = q.saturating_sub(amount);
                    if *q == DeviceQuantity::ZERO {
                        usage.consumed.remove(name);
                    }
                }
            }
            if usage.holders == 0 {
                self.held.remove(&a.device);
                if let Some(device) = device {
                    for (key, amount) in counter_uses(&a.device, &device) {
                        if let Some(q) = self.counters.get_mut(&key) {
                            *q = q.saturating_sub(&amount);
                            if *q == DeviceQuantity::ZERO {
                                self.counters.remove(&key);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Recounts every slot's allocations against the current pools, detaching (in
    /// member order) those that no longer fit; returns the newly detached ones.
    fn recount(&mut self, pods: &BTreeMap<MemberKey, PodSlot>) -> Vec<(MemberKey, DeviceId)> {
        self.held.clear();
        self.counters.clear();
        let mut newly = Vec::new();
        for (member, slot) in pods {
            for (i, a) in slot.pod.devices.iter().enumerate() {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                if self.detached.contains(&(member.clone(), index)) {
                    continue;
                }
                let mut scratch = Overlay::default();
                if self.admit(&Overlay::default(), &mut scratch, a).is_ok() {
                    self.count(a);
                } else {
                    self.detached.insert((member.clone(), index));
                    newly.push((member.clone(), a.device.clone()));
                }
            }
        }
        newly
    }

    /// Publishes a validated pool: a newer generation replaces the old one and every
    /// holding is recounted; holders that lost their device, or whose device now taints
    /// them out, are returned as evictions.
    pub fn publish(
        &mut self,
        node: &str,
        pool: PoolParts<'_>,
        pods: &BTreeMap<MemberKey, PodSlot>,
        at_ms: u64,
    ) -> Result<(PoolChange, Vec<DeviceEviction>), u64> {
        let key = PoolKey {
            driver: pool.driver.to_string(),
            pool: pool.name.to_string(),
        };
        let change = match self.pools.get(&key) {
            // A withdrawn pool comes back whatever its generation: a restarted driver
            // may count again from the start.
            Some(old) if !old.standing.is_offered() => PoolChange::Replaced,
            Some(old) if pool.generation < old.generation => {
                return Ok((
                    PoolChange::Stale {
                        current: old.generation,
                    },
                    Vec::new(),
                ))
            }
            Some(old) if pool.generation == old.generation => {
                let same = old.devices.len() == pool.devices.len()
                    && pool
                        .devices
                        .iter()
                        .all(|d| old.devices.get(&d.name) == Some(d))
                    && old.counter_sets.len() == pool.counter_sets.len()
                    && pool
                        .counter_sets
                        .iter()
                        .all(|c| old.counter_sets.get(&c.name) == Some(&c.counters));
                return if same {
                    Ok((PoolChange::Unchanged, Vec::new()))
                } else {
                    Err(old.generation)
                };
            }
            Some(_) => PoolChange::Replaced,
            None => PoolChange::Added,
        };
        let fresh = PublishedPool::of(pool.generation, pool.devices, pool.counter_sets);
        self.pools.insert(key.clone(), fresh);
        self.touch();
        // Health and rule taints of devices that are gone are forgotten.
        let in_pool = |id: &DeviceId| id.driver == key.driver && id.pool == key.pool;
        let published = |id: &DeviceId| pool.devices.iter().any(|d| d.name == id.device);
        self.unhealthy.retain(|id| !in_pool(id) || published(id));
        self.rule_taints
            .retain(|id, _| !in_pool(id) || published(id));
        let removed: Vec<DeviceEviction> = self
            .recount(pods)
            .into_iter()
            .filter(|(member, _)| pods.get(member).is_some_and(|s| s.state.is_gangway()))
            .map(|(member, device)| DeviceEviction {
                member,
                node: node.to_string(),
                device,
                cause: EvictionCause::DeviceRemoved,
                evict_at_ms: at_ms,
            })
            .collect();
        let mut evictions = with_followers(removed, pods);
        evictions.extend(self.evictions(node, pods, at_ms, |id| in_pool(id)));
        evictions.sort();
        evictions.dedup();
        Ok((change, evictions))
    }

    /// Withdraws a pool whose slices are gone: its devices are no longer offered, and
    /// nothing else changes (holders keep them; see [`PoolStanding::Withdrawn`]).
    pub fn withdraw(&mut self, key: &PoolKey) -> PoolWithdrawal {
        let Some(pool) = self.pools.get_mut(key) else {
            return PoolWithdrawal::Absent;
        };
        if !pool.standing.is_offered() {
            return PoolWithdrawal::AlreadyWithdrawn;
        }
        pool.standing = PoolStanding::Withdrawn;
        self.touch();
        PoolWithdrawal::Withdrawn
    }

    /// Records a health report; returns the holders of devices now unhealthy, or the
    /// first device the node does not publish.
    pub fn set_health(
        &mut self,
        node: &str,
        reports: &[DeviceHealthReport],
        pods: &BTreeMap<MemberKey, PodSlot>,
        at_ms: u64,
    ) -> Result<Vec<DeviceEviction>, DeviceId> {
        if let Some(unknown) = reports.iter().find(|r| self.device(&r.device).is_none()) {
            return Err(unknown.device.clone());
        }
        self.touch();
        for report in reports {
            match report.health {
                DeviceHealth::Healthy => {
                    self.unhealthy.remove(&report.device);
                }
                DeviceHealth::Unhealthy => {
                    self.unhealthy.insert(report.device.clone());
                }
            }
        }
        let named: BTreeSet<&DeviceId> = reports.iter().map(|r| &r.device).collect();
        Ok(self.evictions(node, pods, at_ms, |id| named.contains(id)))
    }

    /// Replaces the rule taints of a published device; returns the holders its NoExecute
    /// taints now evict, or the device if it is not published.
    pub fn set_rule_taints(
        &mut self,
        node: &str,
        device: &DeviceId,
        taints: &[DeviceTaint],
        pods: &BTreeMap<MemberKey, PodSlot>,
        at_ms: u64,
    ) -> Result<Vec<DeviceEviction>, DeviceId> {
        if self.device(device).is_none() {
            return Err(device.clone());
        }
        self.touch();
        if taints.is_empty() {
            self.rule_taints.remove(device);
        } else {
            self.rule_taints.insert(device.clone(), taints.to_vec());
        }
        Ok(self.evictions(node, pods, at_ms, |id| id == device))
    }

    /// Marks every device unhealthy if the agent's grace period has passed at `at_ms`;
    /// returns the holders to evict (empty if nothing expired).
    pub fn expire_agent(
        &mut self,
        node: &str,
        pods: &BTreeMap<MemberKey, PodSlot>,
        at_ms: u64,
    ) -> Vec<DeviceEviction> {
        let AgentLink::Disconnected { since_ms, grace_ms } = self.agent else {
            return Vec::new();
        };
        if at_ms < since_ms.saturating_add(grace_ms) {
            return Vec::new();
        }
        self.set_agent(AgentLink::Lost { since_ms });
        let all: Vec<DeviceId> = self
            .pools
            .iter()
            .flat_map(|(key, pool)| {
                pool.devices
                    .keys()
                    .map(move |name| DeviceId::new(&key.driver, &key.pool, name))
            })
            .collect();
        self.unhealthy.extend(all);
        self.evictions(node, pods, at_ms, |_| true)
    }

    /// Holders placed by gangway (counted, not detached) of devices chosen by `which`
    /// that are unhealthy or carry a NoExecute taint they do not tolerate. Observed pods
    /// are left to the cluster's own eviction controller.
    pub fn evictions(
        &self,
        node: &str,
        pods: &BTreeMap<MemberKey, PodSlot>,
        at_ms: u64,
        which: impl Fn(&DeviceId) -> bool,
    ) -> Vec<DeviceEviction> {
        let mut out = Vec::new();
        for (member, slot) in pods.iter().filter(|(_, s)| s.state.is_gangway()) {
            for (i, a) in slot.pod.devices.iter().enumerate() {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                if !which(&a.device) || self.detached.contains(&(member.clone(), index)) {
                    continue;
                }
                let Some(device) = self.device(&a.device) else {
                    continue;
                };
                let evict = |cause, evict_at_ms| DeviceEviction {
                    member: member.clone(),
                    node: node.to_string(),
                    device: a.device.clone(),
                    cause,
                    evict_at_ms,
                };
                if self.health(&a.device, Some(at_ms)) == DeviceHealth::Unhealthy {
                    out.push(evict(EvictionCause::Unhealthy, at_ms));
                    continue;
                }
                let earliest = self
                    .taints(&a.device, device)
                    .filter(|t| t.effect == DeviceTaintEffect::NoExecute)
                    .filter_map(|t| taint_deadline(t, a, at_ms).map(|when| (when, t)))
                    .min_by(|x, y| x.0.cmp(&y.0).then(x.1.key.cmp(&y.1.key)));
                if let Some((when, taint)) = earliest {
                    out.push(evict(
                        EvictionCause::NoExecuteTaint {
                            key: taint.key.clone(),
                            value: taint.value.clone(),
                        },
                        when,
                    ));
                }
            }
        }
        with_followers(out, pods)
    }

    /// Checks I1 and the accounting against `pods`; the error says what is wrong.
    pub fn check(&self, pods: &BTreeMap<MemberKey, PodSlot>) -> Result<(), String> {
        let mut fresh = self.clone();
        fresh.held.clear();
        fresh.counters.clear();
        for (member, slot) in pods {
            for (i, a) in slot.pod.devices.iter().enumerate() {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                if self.detached.contains(&(member.clone(), index)) {
                    continue;
                }
                if a.admin_access == AdminAccess::Disabled && self.device(&a.device).is_none() {
                    return Err(format!(
                        "{member} holds {}, which is not published",
                        a.device
                    ));
                }
                fresh.count(a);
            }
        }
        if fresh.held != self.held || fresh.counters != self.counters {
            return Err("device accounting differs from the slots".to_string());
        }
        for (member, index) in &self.detached {
            let known = pods
                .get(member)
                .is_some_and(|slot| (*index as usize) < slot.pod.devices.len());
            if !known {
                return Err(format!("detached allocation {member}#{index} is not held"));
            }
        }
        for (id, usage) in &self.held {
            let Some(device) = self.device(id) else {
                return Err(format!("{id} is held but not published"));
            };
            match device.sharing {
                AllocationSharing::Exclusive if usage.holders > 1 => {
                    return Err(format!("I1: exclusive {id} held {} times", usage.holders));
                }
                AllocationSharing::Exclusive => {}
                AllocationSharing::Shared => {
                    for (name, amount) in &usage.consumed {
                        let fits = device
                            .capacity
                            .get(name.as_str())
                            .is_some_and(|c| *amount <= c.value);
                        if !fits {
                            return Err(format!("I1: {id} capacity {name} over-consumed"));
                        }
                    }
                }
            }
        }
        for (key, used) in &self.counters {
            if self.counter_total(key).is_none_or(|total| *used > total) {
                return Err(format!(
                    "I1: counter {}/{} of {}/{} over-consumed",
                    key.counter_set, key.counter, key.driver, key.pool
                ));
            }
        }
        Ok(())
    }
}

/// When a NoExecute taint evicts an allocation: `None` if tolerated forever, the
/// taint's time plus the shortest matching toleration's seconds if tolerated for a
/// while, `at_ms` if not tolerated.
fn taint_deadline(taint: &DeviceTaint, a: &DeviceAllocation, at_ms: u64) -> Option<u64> {
    let matching: Vec<_> = a
        .tolerations
        .iter()
        .filter(|t| t.tolerates(taint))
        .collect();
    if matching.is_empty() {
        return Some(at_ms);
    }
    if matching.iter().any(|t| t.toleration_seconds.is_none()) {
        return None;
    }
    let added = taint.time_added_ms.unwrap_or(at_ms);
    matching
        .iter()
        .filter_map(|t| t.toleration_seconds)
        .map(|s| added.saturating_add(u64::try_from(s.max(0)).unwrap_or(0).saturating_mul(1000)))
        .min()
}

/// The counters a device consumes while in use.
fn counter_uses(id: &DeviceId, device: &Device) -> Vec<(CounterKey, DeviceQuantity)> {
    device
        .consumes_counters
        .iter()
        .flat_map(|c| {
            c.counters.iter().map(|(counter, amount)| {
                (
                    CounterKey {
                        driver: id.driver.clone(),
                        pool: id.pool.clone(),
                        counter_set: c.counter_set.clone(),
                        counter: counter.clone(),
                    },
                    *amount,
                )
            })
        })
        .collect()
}

fn add_use(
    held: &mut BTreeMap<DeviceId, DeviceUse>,
    counters: &mut BTreeMap<CounterKey, DeviceQuantity>,
    a: &DeviceAllocation,
    device: &Device,
    first: bool,
) {
    let usage = held.entry(a.device.clone()).or_default();
    usage.holders = usage.holders.saturating_add(1);
    for (name, amount) in &a.consumed_capacity {
        if *amount == DeviceQuantity::ZERO {
            continue;
        }
        let q = usage.consumed.entry(name.clone()).or_default();
        *q = q
            .checked_add(amount)
            .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
    }
    if first {
        for (key, amount) in counter_uses(&a.device, device) {
            if amount == DeviceQuantity::ZERO {
                continue;
            }
            let q = counters.entry(key).or_default();
            *q = q
                .checked_add(&amount)
                .unwrap_or(DeviceQuantity::from_nano(u128::MAX));
        }
    }
}

/// `evictions` (of carriers) and the same for every pod on the node that follows the
/// shared claim an evicted allocation belongs to: its pods use the device too.
pub fn with_followers(
    mut evictions: Vec<DeviceEviction>,
    pods: &BTreeMap<MemberKey, PodSlot>,
) -> Vec<DeviceEviction> {
    let mut more = Vec::new();
    for e in &evictions {
        let Some(carrier) = pods.get(&e.member) else {
            continue;
        };
        let claims = carrier.pod.carried().filter(|s| {
            carrier
                .pod
                .devices
                .iter()
                .any(|d| d.claim == s.pod_claim && d.device == e.device)
        });
        for share in claims {
            for (member, slot) in pods.iter().filter(|(_, s)| s.state.is_gangway()) {
                if slot.pod.followed().any(|s| s.claim == share.claim) {
                    more.push(DeviceEviction {
                        member: member.clone(),
                        ..e.clone()
                    });
                }
            }
        }
    }
    evictions.extend(more);
    evictions
}
