//! Per-node usage: what the pods reserved or placed on one node hold.
//!
//! Owns [`NodeUsage`] and [`PodSlot`]. Invariants: `reserved` is the sum of the
//! footprints of the node's `Reserved` slots, `committed` the sum of its `Committed`
//! and `Bound` slots and `observed` the sum of its `Observed` slots (pods other
//! schedulers bound: facts, counted against free but never refused, so only
//! `reserved + committed` is held to I2); no two slots hold the same host port; `devices` (the node's device
//! ledger, see [`crate::ledger::devices`]) counts exactly the device allocations of the
//! slots. The ledger keeps I2 (`reserved + committed <= allocatable`) and I1 (devices)
//! by checking [`NodeUsage::refusal_at`] before every [`NodeUsage::hold`]; `take` gives
//! a pod's devices back at once, except a shared claim's, which pass to a pod still
//! following it here. A shared claim followed on the node is carried by exactly one
//! slot there ([`NodeUsage::check_shares`]). Called by the ledger only; the engine
//! reads it through [`crate::ledger::view`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ledger::command::{RefusalCause, TxnId};
use crate::ledger::devices::{DeviceBatch, NodeDevices};
use crate::model::claim::ClaimShare;
use crate::model::gang::MemberKey;
use crate::model::pod::{HostPort, PodSummary};
use crate::model::resources::Resources;

/// Where a pod is in its life on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotState {
    /// Held by an open transaction.
    Reserved {
        /// The transaction.
        txn_id: TxnId,
    },
    /// Placed by a committed transaction, not yet bound.
    Committed {
        /// The transaction.
        txn_id: TxnId,
        /// When the commit was applied.
        at_ms: u64,
    },
    /// Placed and bound through the Kubernetes API.
    Bound {
        /// The transaction.
        txn_id: TxnId,
        /// When the bind was recorded.
        at_ms: u64,
    },
    /// Bound by another scheduler (or created with a node name), as the API server shows
    /// it: gangway counts what it takes but did not place it and never releases it.
    Observed,
}

impl SlotState {
    /// The transaction that holds the slot (none for an observed pod).
    pub fn txn_id(&self) -> Option<TxnId> {
        match self {
            Self::Reserved { txn_id }
            | Self::Committed { txn_id, .. }
            | Self::Bound { txn_id, .. } => Some(*txn_id),
            Self::Observed => None,
        }
    }

    /// Whether gangway placed the pod (reserved, committed or bound), rather than observed it.
    pub fn is_gangway(&self) -> bool {
        !matches!(self, Self::Observed)
    }

    /// Whether the slot is only reserved (not yet committed).
    pub fn is_reserved(&self) -> bool {
        matches!(self, Self::Reserved { .. })
    }
}

/// One pod held on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSlot {
    /// What the ledger keeps of the pod.
    pub pod: PodSummary,
    /// Its state.
    pub state: SlotState,
}

/// What the members of one reservation batch already take on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchLoad {
    /// Sum of their footprints.
    pub footprint: Resources,
    /// Host ports they use.
    pub ports: Vec<HostPort>,
    /// Devices allocated to them.
    pub devices: DeviceBatch,
    /// Shared claims (`namespace/name`) the batch carries on the node, counted for the
    /// whole batch before any member is checked: a follower may come before its carrier.
    pub carried: BTreeMap<String, u32>,
}

impl BatchLoad {
    /// Counts the shared claims `pod` (a member about to be checked) carries.
    pub fn expect_carrier(&mut self, pod: &PodSummary) {
        for share in pod.carried() {
            *self.carried.entry(share.claim.clone()).or_default() += 1;
        }
    }

    /// Adds an accepted member.
    pub fn add(&mut self, pod: &PodSummary) {
        self.footprint = self.footprint.saturating_add(&pod.footprint());
        self.ports.extend(pod.host_ports.iter().copied());
        self.devices.push(&pod.devices);
    }

    /// Adds an accepted member, counting its devices against `devices` (the node's)
    /// at once, so that later checks of the batch do not count them again.
    pub fn add_counted(&mut self, pod: &PodSummary, devices: &NodeDevices) {
        self.footprint = self.footprint.saturating_add(&pod.footprint());
        self.ports.extend(pod.host_ports.iter().copied());
        devices.count_into(&mut self.devices, &pod.devices);
    }
}

/// What becomes of a departing carrier's shared-claim devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HandOver {
    /// They pass to a follower left on the node (always, in production).
    #[default]
    ToFollower,
    /// They are freed with the carrier: a wrong design kept for the test-only switch
    /// `ledger-frees-shared-claims-with-their-carrier` (followers run on devices the
    /// ledger counts free), so the checks show they catch it.
    Freed,
}

/// What the pods on one node hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredNodeUsage")]
pub struct NodeUsage {
    /// Sum of reserved footprints.
    pub reserved: Resources,
    /// Sum of committed and bound footprints.
    pub committed: Resources,
    /// Sum of the footprints of pods other schedulers bound here.
    #[serde(default, skip_serializing_if = "Resources::is_zero")]
    pub observed: Resources,
    /// The pods, by member key.
    pub pods: BTreeMap<MemberKey, PodSlot>,
    /// The node's devices and who holds them.
    #[serde(default, skip_serializing_if = "NodeDevices::is_empty")]
    pub devices: NodeDevices,
    /// How many of `pods` hold host ports or required anti-affinity terms (derived,
    /// never encoded, counted again when decoded): the node's summary needs only
    /// whether any does, and reading every pod per change made each command cost the
    /// node's pod count.
    #[serde(skip)]
    marks: PodMarks,
}

/// Pods of a node with host ports, and with required anti-affinity terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodMarks {
    host_ports: u32,
    anti_affinity: u32,
}

impl PodMarks {
    fn of<'a>(pods: impl IntoIterator<Item = &'a PodSlot>) -> Self {
        let mut marks = PodMarks::default();
        for slot in pods {
            marks.add(&slot.pod);
        }
        marks
    }

    /// The counters `pod` is marked in.
    fn counters_of<'a>(&'a mut self, pod: &PodSummary) -> impl Iterator<Item = &'a mut u32> {
        let ports = (!pod.host_ports.is_empty()).then_some(&mut self.host_ports);
        let apart = (!pod.anti_affinity.is_empty()).then_some(&mut self.anti_affinity);
        ports.into_iter().chain(apart)
    }

    fn add(&mut self, pod: &PodSummary) {
        for n in self.counters_of(pod) {
            *n += 1;
        }
    }

    fn remove(&mut self, pod: &PodSummary) {
        for n in self.counters_of(pod) {
            *n = n
                .checked_sub(1)
                .unwrap_or_else(|| panic!("pod marks of a node went below zero"));
        }
    }

    /// Whether a pod on the node holds a host port.
    pub fn any_host_ports(&self) -> bool {
        self.host_ports > 0
    }

    /// Whether a pod on the node has required anti-affinity terms.
    pub fn any_anti_affinity(&self) -> bool {
        self.anti_affinity > 0
    }
}

/// [`NodeUsage`] as encoded: its marks are counted from its pods when it is decoded.
#[derive(Deserialize)]
struct StoredNodeUsage {
    reserved: Resources,
    committed: Resources,
    #[serde(default)]
    observed: Resources,
    pods: BTreeMap<MemberKey, PodSlot>,
    #[serde(default)]
    devices: NodeDevices,
}

impl From<StoredNodeUsage> for NodeUsage {
    fn from(s: StoredNodeUsage) -> Self {
        let marks = PodMarks::of(s.pods.values());
        NodeUsage {
            reserved: s.reserved,
            committed: s.committed,
            observed: s.observed,
            pods: s.pods,
            devices: s.devices,
            marks,
        }
    }
}

impl NodeUsage {
    /// Which kinds of pods the node holds (host ports, anti-affinity).
    pub fn marks(&self) -> PodMarks {
        self.marks
    }

    /// The marks counted afresh from the pods (the invariant check compares them).
    pub fn marks_counted(&self) -> PodMarks {
        PodMarks::of(self.pods.values())
    }

    /// Everything taken: reserved, committed and observed.
    pub fn requested(&self) -> Resources {
        self.held().saturating_add(&self.observed)
    }

    /// What gangway's own pods hold: reserved plus committed (the part I2 bounds).
    pub fn held(&self) -> Resources {
        self.reserved.saturating_add(&self.committed)
    }

    /// What is left of `allocatable`.
    pub fn free(&self, allocatable: &Resources) -> Resources {
        allocatable.saturating_sub(&self.requested())
    }

    /// Whether a held pod uses `port`.
    pub fn port_in_use(&self, port: &HostPort) -> bool {
        self.pods
            .values()
            .any(|slot| slot.pod.host_ports.contains(port))
    }

    /// Why `pod` cannot be held beside the pods held and the `batch` accepted so far, if
    /// so (device health as recorded, ignoring a pending agent expiry).
    pub fn refusal_for(
        &self,
        allocatable: &Resources,
        batch: &BatchLoad,
        pod: &PodSummary,
    ) -> Option<RefusalCause> {
        self.refusal_at(allocatable, batch, pod, None)
    }

    /// [`NodeUsage::refusal_for`] with device health as of `at_ms`.
    pub fn refusal_at(
        &self,
        allocatable: &Resources,
        batch: &BatchLoad,
        pod: &PodSummary,
        at_ms: Option<u64>,
    ) -> Option<RefusalCause> {
        let taken = |p: &HostPort| self.port_in_use(p) || batch.ports.contains(p);
        if let Some(port) = pod.host_ports.iter().find(|p| taken(p)) {
            return Some(RefusalCause::HostPortInUse { port: *port });
        }
        let free = self.free(allocatable);
        let footprint = pod.footprint();
        if let Some(resource) = batch.footprint.first_overflow(&footprint) {
            return Some(RefusalCause::Insufficient {
                requested: u64::MAX,
                free: free.get(&resource),
                resource,
            });
        }
        let wanted = batch.footprint.saturating_add(&footprint);
        if let Some(resource) = wanted.shortfall(&free) {
            return Some(RefusalCause::Insufficient {
                requested: wanted.get(&resource),
                free: free.get(&resource),
                resource,
            });
        }
        if let Some(cause) = self.share_refusal(batch, pod) {
            return Some(cause);
        }
        self.devices
            .refusal_for(&batch.devices, &pod.devices, at_ms)
    }

    /// Whether `pod` breaks the shared-claim rule: each shared claim carried by exactly
    /// one pod on the node, and followed only where it is carried.
    fn share_refusal(&self, batch: &BatchLoad, pod: &PodSummary) -> Option<RefusalCause> {
        for share in &pod.shares {
            let held = self.carrier_of(&share.claim).is_some();
            let in_batch = batch.carried.get(&share.claim).copied().unwrap_or(0);
            let cause = if pod.carries(&share.claim) {
                (held || in_batch > 1).then(|| RefusalCause::SharedClaimCarried {
                    claim: share.claim.clone(),
                })
            } else {
                (!held && in_batch == 0).then(|| RefusalCause::SharedClaimNotHere {
                    claim: share.claim.clone(),
                })
            };
            if cause.is_some() {
                return cause;
            }
        }
        None
    }

    /// The slot carrying shared claim `claim` (`namespace/name`) on this node, if any.
    pub fn carrier_of(&self, claim: &str) -> Option<&MemberKey> {
        self.pods
            .iter()
            .find(|(_, slot)| slot.pod.carries(claim))
            .map(|(key, _)| key)
    }

    /// Takes the pod's footprint and records its slot; callers check `refusal_for` first.
    ///
    /// A slot carrying a shared claim that another slot here already carries (a
    /// displaced victim put back after its follower took the devices over) keeps
    /// following it instead, so the devices are never counted twice.
    pub fn hold(&mut self, member: MemberKey, mut slot: PodSlot) {
        let carried_here: Vec<String> = slot
            .pod
            .carried()
            .filter(|s| self.carrier_of(&s.claim).is_some())
            .map(|s| s.pod_claim.clone())
            .collect();
        slot.pod
            .devices
            .retain(|d| !carried_here.contains(&d.claim));
        let footprint = slot.pod.footprint();
        let sum = self.sum_of(&slot.state);
        *sum = sum.saturating_add(&footprint);
        self.devices.hold(&slot.pod.devices);
        self.insert_slot(member, slot);
    }

    /// Keeps `slot` under `member`, counting its marks (a slot it replaces uncounted).
    fn insert_slot(&mut self, member: MemberKey, slot: PodSlot) {
        self.marks.add(&slot.pod);
        if let Some(old) = self.pods.insert(member, slot) {
            self.marks.remove(&old.pod);
        }
    }

    /// Records a pod another scheduler bound here, unchecked (it is a fact): host ports
    /// already held are left out of its slot and allocations that do not fit are
    /// detached; returns what was left out.
    pub fn observe(&mut self, member: MemberKey, mut pod: PodSummary) -> ObservedConflicts {
        let (ports, kept): (Vec<HostPort>, Vec<HostPort>) =
            pod.host_ports.iter().partition(|p| self.port_in_use(p));
        pod.host_ports = kept;
        let devices = self.devices.observe(&member, &pod.devices);
        self.insert_slot(
            member,
            PodSlot {
                pod,
                state: SlotState::Observed,
            },
        );
        self.recount_observed();
        ObservedConflicts { ports, devices }
    }

    /// Recomputes the observed sum from the slots: observed requests are unchecked and
    /// may saturate, and a saturated sum cannot be taken apart by subtraction.
    fn recount_observed(&mut self) {
        self.observed = self
            .pods
            .values()
            .filter(|slot| slot.state == SlotState::Observed)
            .fold(Resources::zero(), |sum, slot| {
                sum.saturating_add(&slot.pod.footprint())
            });
    }

    /// The usage sum a slot in `state` counts into.
    fn sum_of(&mut self, state: &SlotState) -> &mut Resources {
        match state {
            SlotState::Reserved { .. } => &mut self.reserved,
            SlotState::Committed { .. } | SlotState::Bound { .. } => &mut self.committed,
            SlotState::Observed => &mut self.observed,
        }
    }

    /// Moves a reserved slot to committed; returns whether it was reserved.
    pub fn promote(&mut self, member: &MemberKey, at_ms: u64) -> bool {
        let Some(slot) = self.pods.get_mut(member) else {
            return false;
        };
        let SlotState::Reserved { txn_id } = slot.state else {
            return false;
        };
        slot.state = SlotState::Committed { txn_id, at_ms };
        let footprint = slot.pod.footprint();
        self.reserved = self.reserved.saturating_sub(&footprint);
        self.committed = self.committed.saturating_add(&footprint);
        true
    }

    /// Removes a slot and gives its footprint and devices back. The devices of a shared
    /// claim it carried pass to the claim's first follower left on the node, if any
    /// (the pods still use them): returns the slot as it was.
    pub fn take(&mut self, member: &MemberKey) -> Option<PodSlot> {
        self.take_as(member, HandOver::ToFollower)
    }

    /// [`NodeUsage::take`], handing shared claims over as `hand_over` says.
    pub fn take_as(&mut self, member: &MemberKey, hand_over: HandOver) -> Option<PodSlot> {
        let slot = self.pods.remove(member)?;
        self.marks.remove(&slot.pod);
        self.devices.release(member, &slot.pod.devices);
        if slot.state == SlotState::Observed {
            self.recount_observed();
        } else {
            let footprint = slot.pod.footprint();
            let sum = self.sum_of(&slot.state);
            *sum = sum.saturating_sub(&footprint);
        }
        if hand_over == HandOver::ToFollower {
            for share in slot.pod.carried() {
                self.hand_over(share, &slot.pod);
            }
        }
        Some(slot)
    }

    /// Gives the allocations of shared claim `share` (of `departed`, its carrier) to the
    /// lowest-keyed slot that follows the claim here.
    fn hand_over(&mut self, share: &ClaimShare, departed: &PodSummary) {
        let Some((heir, moved)) = self.pods.iter().find_map(|(key, slot)| {
            let follows = slot.pod.followed().any(|s| s.claim == share.claim);
            follows
                .then(|| departed.handed_to(share, &slot.pod))
                .flatten()
                .map(|moved| (key.clone(), moved))
        }) else {
            return;
        };
        let Some(slot) = self.pods.get_mut(&heir) else {
            return;
        };
        let offset = slot.pod.devices.len();
        slot.pod.devices.extend(moved.iter().cloned());
        self.devices.adopt(&heir, offset, &moved);
    }

    /// I1 for shared claims: a claim followed on this node is carried here (or used
    /// through a network hold: `uses_network(member, claim)`), and no claim is carried
    /// by two slots.
    pub fn check_shares(
        &self,
        uses_network: impl Fn(&MemberKey, &str) -> bool,
    ) -> Result<(), String> {
        let mut carriers: BTreeMap<&str, Vec<&MemberKey>> = BTreeMap::new();
        for (member, slot) in &self.pods {
            for share in slot.pod.carried() {
                carriers
                    .entry(share.claim.as_str())
                    .or_default()
                    .push(member);
            }
        }
        if let Some((claim, slots)) = carriers.iter().find(|(_, slots)| slots.len() > 1) {
            return Err(format!(
                "I1: shared claim {claim} carried by {} slots ({})",
                slots.len(),
                slots
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (member, slot) in &self.pods {
            if let Some(share) = slot.pod.followed().find(|s| {
                !carriers.contains_key(s.claim.as_str()) && !uses_network(member, &s.claim)
            }) {
                return Err(format!(
                    "I1: {member} follows shared claim {}, which no slot on the node carries",
                    share.claim
                ));
            }
        }
        Ok(())
    }

    /// Recomputes the usage sums from the slots, for invariant checks.
    pub fn recomputed(&self) -> UsageSums {
        let mut sums = UsageSums::default();
        for slot in self.pods.values() {
            let footprint = slot.pod.footprint();
            let sum = match slot.state {
                SlotState::Reserved { .. } => &mut sums.reserved,
                SlotState::Committed { .. } | SlotState::Bound { .. } => &mut sums.committed,
                SlotState::Observed => &mut sums.observed,
            };
            *sum = sum.saturating_add(&footprint);
        }
        sums
    }

    /// The usage sums as recorded.
    pub fn sums(&self) -> UsageSums {
        UsageSums {
            reserved: self.reserved.clone(),
            committed: self.committed.clone(),
            observed: self.observed.clone(),
        }
    }
}

/// The three usage sums of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageSums {
    /// Reserved slots.
    pub reserved: Resources,
    /// Committed and bound slots.
    pub committed: Resources,
    /// Observed slots.
    pub observed: Resources,
}

/// What an observed pod could not be given because gangway's pods already hold it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedConflicts {
    /// Host ports already held.
    pub ports: Vec<HostPort>,
    /// Devices whose allocation did not fit (detached).
    pub devices: Vec<crate::model::device::DeviceId>,
}

impl ObservedConflicts {
    /// Whether nothing was left out.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.devices.is_empty()
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
