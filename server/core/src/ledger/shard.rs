//! The shard ledger: the deterministic state machine of one shard group.
//!
//! Owns [`ShardLedger`]: the shard's nodes and their usage, their devices (the only
//! writable record of them: published pools, health, agent links, and who holds what),
//! the device classes, open reservations (phase 1 of the two-phase protocol),
//! placements, bind status, and a bounded record of finished transactions that makes
//! every step idempotent by transaction id. Invariants, checked by
//! [`ShardLedger::check_invariants`] and debug-asserted after every command:
//! - I1: on every node, an exclusive device is held by at most one allocation, shared
//!   devices and shared counters are never consumed beyond their amounts, and the device
//!   accounting is that of the slots (see [`crate::ledger::devices`]); a shared
//!   ResourceClaim followed on a node is carried by exactly one slot there, and a
//!   preemption takes all of a claim's pods on a node or none;
//! - I2: for every node, reserved + committed <= allocatable;
//! - usage sums equal the sums of the node's slots; a host port is held once per node;
//! - every `Reserved` slot belongs to exactly one open transaction and vice versa, and
//!   no committed slot names an open transaction (so I5: aborting or committing every
//!   open transaction leaves nothing reserved);
//! - at most [`FINISHED_TXNS_MAX`] finished records are kept, none for an open id;
//! - no Kubernetes victim is evicting for an open transaction; a committed preemption's
//!   placeholders stay on a node only while one of its victims there is evicting (the
//!   preemptor's members there are not bindable meanwhile, see `query`);
//! - every node's [`NodeFit`] summary (what the engine's hot loop reads, see
//!   [`LedgerView::indexed`]) is that of its node and usage: every command that
//!   changes a node refreshes it, so the engine never rebuilds per call.
//!
//! Debug builds assert I1 and I2 after every command on each node the command touched
//! (other nodes cannot change); tests call the full check. Device effects that need the
//! caller (evicting pods from unhealthy, NoExecute-tainted or removed devices) are
//! returned in the replies of the commands that cause them; a disconnected agent's grace
//! period is applied by the first `Tick` at or after its end, and Reserve already treats
//! those devices as unhealthy from then on.
//!
//! `apply` never reads a clock (the command carries the leader's time), never does I/O
//! and only iterates `BTreeMap`s and the name-ordered node table, so the same commands
//! give byte-identical snapshots on every replica (I6); the nodes encode exactly as a
//! map from name to [`NodeEntry`]. Node stamps (see [`IndexedView`]) are drawn from a
//! process-wide counter and are no part of the state: snapshots and equality ignore
//! them. Bad input is answered with [`LedgerReply::Rejected`] and changes
//! nothing. Expired reservations are reported by `Tick`, never dropped here: the caller
//! asks the coordinator for the decision (docs/ARCHITECTURE.md §5). Called by the shard service on
//! every replica, and read by the engine through [`LedgerView`].

use std::collections::{BTreeMap, BTreeSet};

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::ledger::command::{
    HoldKind, LedgerCommand, LedgerError, LedgerOp, LedgerReply, NetworkHold, NodeChange,
    ObservedPod, Presence, Refusal, RefusalCause, ReleaseTarget, ReserveMember, TxnId, TxnOutcome,
    CLAIM_GANG, LEDGER_BATCH_MAX, NODE_LEASE_MS_MAX, NODE_LEASE_MS_MIN, OBSERVED_GANG,
    OBSERVED_NETWORK_HOLDS_MAX, OBSERVED_PODS_PER_NODE_MAX, RESERVE_HOLD_MS_MAX,
};
use crate::ledger::command::{Parcel, MOVED_MEMBERS_MAX, MOVE_NODES_MAX};
use crate::ledger::devices::{
    AgentLink, DeviceEviction, DeviceHealthReport, PoolKey, PoolParts, PoolWithdrawal,
    AGENT_GRACE_MS_DEFAULT,
};
use crate::ledger::displace;
use crate::ledger::network::NetworkPools;
use crate::ledger::usage::{BatchLoad, HandOver, NodeUsage, PodSlot, SlotState};
use crate::ledger::view::{next_stamp, IndexedView, LedgerView, NodeFit, NodeView};
use crate::model::claim::{validate_allocations, validate_shares};
use crate::model::device::{
    validate_device_reach, validate_device_taint, validate_pool, CounterSet, Device, DeviceClass,
    DeviceId, DeviceTaint, DEVICE_TAINTS_MAX,
};
use crate::model::error::FieldPath;
use crate::model::gang::MemberKey;
use crate::model::node::{Node, Readiness};
use crate::model::pod::PodSummary;
use crate::model::reach::PoolReach;
use crate::model::resources::Resources;
use crate::wire::{self, WireFormat};

/// Most finished transactions remembered for idempotent retries; the oldest finished is
/// forgotten first. A retry of a transaction forgotten this way is answered as unknown
/// (commit) or by its live placements (abort of a committed one is still refused).
pub const FINISHED_TXNS_MAX: usize = 10_000;
mod handoff;
#[cfg(test)]
mod handoff_tests;
pub use handoff::ADOPTED_MOVES_MAX;

/// Most refusals kept in a refused reservation's reply and record.
pub const REFUSALS_KEPT_MAX: usize = 32;
/// Version of the snapshot encoding.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// A node and what is held on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The node.
    pub node: Node,
    /// Its usage.
    pub usage: NodeUsage,
    /// The agent's lease, once it has sent a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<NodeLease>,
    /// The shard move that fences the node: it takes no new reservation until the
    /// move hands it over (or is given up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<u64>,
}

impl NodeEntry {
    /// The summary the engine reads: the node's and its usage's, and whether a move
    /// fences it.
    pub fn fit(&self) -> NodeFit {
        let mut fit = NodeFit::of(&self.node, &self.usage);
        if self.moving.is_some() {
            fit.flags |= NodeFit::MOVING;
        }
        fit
    }
}

/// A node agent's lease: renewed by heartbeats, it lapses `lease_ms` after the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    /// When the last heartbeat was applied, in ms.
    pub renewed_at_ms: u64,
    /// Its length, in ms.
    pub lease_ms: u64,
    /// Whether it is running or has lapsed.
    pub state: LeaseState,
}

impl NodeLease {
    /// When it lapses unless renewed, in ms.
    pub fn until_ms(&self) -> u64 {
        self.renewed_at_ms.saturating_add(self.lease_ms)
    }
}

/// Whether a node lease runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseState {
    /// Renewed in time.
    Live,
    /// Not renewed in time: the node was made not ready.
    Lapsed,
}

/// An open (reserved, undecided) transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenTxn {
    /// Member → node it is reserved on.
    pub members: BTreeMap<MemberKey, String>,
    /// When the holder should ask the coordinator.
    pub deadline_ms: u64,
    /// When the reservation was applied.
    pub reserved_at_ms: u64,
    /// The victims a preemption took out of their nodes (the members' list then also
    /// names the placeholders holding their room): put back on ABORT, dropped on COMMIT.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub displaced: BTreeMap<MemberKey, DisplacedSlot>,
    /// Members whose network-attached devices the transaction holds here.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub network: BTreeSet<MemberKey>,
}

/// A victim's slot taken out of its node by an open preemption.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplacedSlot {
    /// The node it was on (and returns to on ABORT).
    pub node: String,
    /// The slot as it was.
    pub slot: PodSlot,
}

/// A Kubernetes victim of a committed preemption whose pod may still run on its node.
/// The transaction's placeholders on that node keep holding the victims' room, and its
/// members there wait to be bound, until every such victim there is gone
/// (`LedgerOp::VictimsGone`, proposed by the evictor once the API server shows the pod
/// gone or finished).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictingVictim {
    /// The preemption's transaction.
    pub txn_id: TxnId,
    /// The node the pod runs on.
    pub node: String,
    /// The pod's uid (the eviction's precondition).
    pub uid: String,
    /// The preemptor's gang (`namespace/name`) that took its room, for the pod's event.
    pub preemptor: String,
    /// When the preemption committed here (leader's clock, ms).
    #[serde(default)]
    pub since_ms: u64,
}

/// The remembered end of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedTxn {
    /// Finish order (eviction order).
    pub seq: u64,
    /// How it ended.
    pub outcome: TxnOutcome,
    /// When it ended.
    pub at_ms: u64,
    /// Why it was refused (refused transactions only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<Refusal>,
}

/// A broken ledger invariant (a bug, or a corrupt snapshot).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ledger invariant violated: {0}")]
pub struct InvariantViolation(pub String);

/// A snapshot that cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Not a ledger snapshot.
    #[error("cannot decode ledger snapshot: {0}")]
    Decode(String),
    /// Written by an unknown format version.
    #[error("unsupported ledger snapshot format {found}, expected {SNAPSHOT_FORMAT}")]
    Format {
        /// The version found.
        found: u32,
    },
    /// Decoded, but inconsistent.
    #[error(transparent)]
    Invariant(#[from] InvariantViolation),
}

/// The shard's nodes in name order, each with the summary the engine reads.
///
/// Encodes exactly like a `BTreeMap<String, NodeEntry>` keyed by node name. Invariants:
/// entries are sorted by name without duplicates; `fits[i]` is `NodeFit::of` entry `i`;
/// `stamps[i]` was drawn from [`next_stamp`] after entry `i` last changed (stamps are
/// not state: equality and snapshots ignore them); `anti_affinity_nodes` counts the
/// summaries with the anti-affinity flag. Every change goes through
/// [`NodeTable::update`], `insert` or `remove`, which keep them in step.
#[derive(Debug, Clone, Default)]
struct NodeTable {
    #[allow(
        clippy::vec_box,
        reason = "a node added in name order shifts pointers, not entries, and spare capacity costs a pointer per node"
    )]
    entries: Vec<Box<NodeEntry>>,
    fits: Vec<NodeFit>,
    stamps: Vec<u64>,
    anti_affinity_nodes: usize,
}

impl NodeTable {
    fn position(&self, name: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|entry| entry.node.name.as_str().cmp(name))
    }

    fn get(&self, name: &str) -> Option<&NodeEntry> {
        let i = self.position(name).ok()?;
        self.entries.get(i).map(|entry| &**entry)
    }

    fn iter(&self) -> impl Iterator<Item = &NodeEntry> {
        self.entries.iter().map(|entry| &**entry)
    }

    /// Changes the entry named `name` (if any) and brings its summary up to date.
    fn update<R>(&mut self, name: &str, change: impl FnOnce(&mut NodeEntry) -> R) -> Option<R> {
        let i = self.position(name).ok()?;
        let out = change(self.entries.get_mut(i)?);
        self.refresh(i);
        Some(out)
    }

    fn refresh(&mut self, i: usize) {
        let (Some(entry), Some(fit)) = (self.entries.get(i), self.fits.get_mut(i)) else {
            return;
        };
        let fresh = entry.fit();
        match (
            fit.has(NodeFit::ANTI_AFFINITY),
            fresh.has(NodeFit::ANTI_AFFINITY),
        ) {
            (false, true) => self.anti_affinity_nodes += 1,
            (true, false) => self.anti_affinity_nodes -= 1,
            _ => {}
        }
        *fit = fresh;
        if let Some(stamp) = self.stamps.get_mut(i) {
            *stamp = next_stamp();
        }
    }

    /// Adds a node that is not in the table yet.
    fn insert(&mut self, entry: NodeEntry) {
        let Err(i) = self.position(&entry.node.name) else {
            return;
        };
        self.entries.insert(i, Box::new(entry));
        self.fits.insert(i, NodeFit::default());
        self.stamps.insert(i, 0);
        self.refresh(i);
    }

    fn remove(&mut self, name: &str) -> Option<NodeEntry> {
        let i = self.position(name).ok()?;
        if self.fits.remove(i).has(NodeFit::ANTI_AFFINITY) {
            self.anti_affinity_nodes -= 1;
        }
        self.stamps.remove(i);
        Some(*self.entries.remove(i))
    }

    fn view(&self) -> IndexedView<'_> {
        IndexedView::new(
            &self.entries,
            &self.fits,
            &self.stamps,
            self.anti_affinity_nodes,
        )
    }

    /// Whether the summaries and the count are those of the entries.
    fn in_step(&self) -> bool {
        self.fits.len() == self.entries.len()
            && self.stamps.len() == self.entries.len()
            && self
                .iter()
                .zip(&self.fits)
                .all(|(entry, fit)| *fit == entry.fit())
            && self.anti_affinity_nodes
                == self
                    .fits
                    .iter()
                    .filter(|fit| fit.has(NodeFit::ANTI_AFFINITY))
                    .count()
            && self
                .entries
                .windows(2)
                .all(|pair| pair[0].node.name < pair[1].node.name)
    }
}

impl PartialEq for NodeTable {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Eq for NodeTable {}

impl Serialize for NodeTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for entry in &self.entries {
            map.serialize_entry(&entry.node.name, &**entry)?;
        }
        map.end()
    }
}

/// The replicated part of the ledger: exactly what a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct LedgerState {
    format: u32,
    nodes: NodeTable,
    open: BTreeMap<TxnId, OpenTxn>,
    finished: BTreeMap<TxnId, FinishedTxn>,
    next_seq: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    device_classes: BTreeMap<String, DeviceClass>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    evicting: BTreeMap<MemberKey, EvictingVictim>,
    #[serde(skip_serializing_if = "NetworkPools::is_empty")]
    network: NetworkPools,
    /// Parcels handed off and not yet dropped, by move.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    parcels: BTreeMap<u64, Parcel>,
    /// Nodes that moved away → their shard now (refused here, never recreated).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    moved_nodes: BTreeMap<String, u32>,
    /// Members that moved away with their nodes → (move, their shard now): a late
    /// release is refused as moved, never answered "absent" (at most
    /// [`MOVED_MEMBERS_MAX`], the oldest move's forgotten first).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    moved_members: BTreeMap<MemberKey, (u64, u32)>,
    /// Moves whose parcel this shard adopted (at most [`ADOPTED_MOVES_MAX`]).
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    adopted: BTreeSet<u64>,
    /// Node name → the move fencing it (registered here or not); a registered node's
    /// entry carries the same in `moving`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    fences: BTreeMap<String, u64>,
    /// Moves whose fence was lifted here (given up): fenced again by no one (at most
    /// [`ADOPTED_MOVES_MAX`]).
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    lifted: BTreeSet<u64>,
}

impl Default for LedgerState {
    fn default() -> Self {
        Self {
            format: SNAPSHOT_FORMAT,
            nodes: NodeTable::default(),
            open: BTreeMap::new(),
            finished: BTreeMap::new(),
            next_seq: 0,
            device_classes: BTreeMap::new(),
            evicting: BTreeMap::new(),
            network: NetworkPools::default(),
            parcels: BTreeMap::new(),
            moved_nodes: BTreeMap::new(),
            moved_members: BTreeMap::new(),
            adopted: BTreeSet::new(),
            fences: BTreeMap::new(),
            lifted: BTreeSet::new(),
        }
    }
}

/// A snapshot as decoded, before its nodes are indexed.
#[derive(Deserialize)]
struct StoredState {
    format: u32,
    nodes: BTreeMap<String, NodeEntry>,
    open: BTreeMap<TxnId, OpenTxn>,
    finished: BTreeMap<TxnId, FinishedTxn>,
    next_seq: u64,
    #[serde(default)]
    device_classes: BTreeMap<String, DeviceClass>,
    #[serde(default)]
    evicting: BTreeMap<MemberKey, EvictingVictim>,
    #[serde(default)]
    network: NetworkPools,
    #[serde(default)]
    parcels: BTreeMap<u64, Parcel>,
    #[serde(default)]
    moved_nodes: BTreeMap<String, u32>,
    #[serde(default)]
    moved_members: BTreeMap<MemberKey, (u64, u32)>,
    #[serde(default)]
    adopted: BTreeSet<u64>,
    #[serde(default)]
    fences: BTreeMap<String, u64>,
    #[serde(default)]
    lifted: BTreeSet<u64>,
}

impl StoredState {
    /// The ledger state, refusing a node stored under another node's name.
    fn into_state(self) -> Result<LedgerState, InvariantViolation> {
        let mut nodes = NodeTable::default();
        for (name, entry) in self.nodes {
            if entry.node.name != name {
                return Err(InvariantViolation(format!(
                    "node {name}: keyed under the wrong name {}",
                    entry.node.name
                )));
            }
            nodes.insert(entry);
        }
        Ok(LedgerState {
            format: self.format,
            nodes,
            open: self.open,
            finished: self.finished,
            next_seq: self.next_seq,
            device_classes: self.device_classes,
            evicting: self.evicting,
            network: self.network,
            parcels: self.parcels,
            moved_nodes: self.moved_nodes,
            moved_members: self.moved_members,
            adopted: self.adopted,
            fences: self.fences,
            lifted: self.lifted,
        })
    }
}

/// Indexes derived from the state, rebuilt on restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Indexes {
    /// Member → node holding it.
    locations: BTreeMap<MemberKey, String>,
    /// Transaction → members it holds (open or committed).
    by_txn: BTreeMap<TxnId, BTreeSet<MemberKey>>,
    /// Finish sequence → transaction.
    finish_order: BTreeMap<u64, TxnId>,
    /// Nodes whose agent is disconnected within its grace period.
    disconnected: BTreeSet<String>,
    /// Live leases by (lapse time in ms, node).
    leases: BTreeSet<(u64, String)>,
}

impl Indexes {
    fn build(state: &LedgerState) -> Self {
        let mut out = Self::default();
        for entry in state.nodes.iter() {
            if let AgentLink::Disconnected { .. } = entry.usage.devices.agent {
                out.disconnected.insert(entry.node.name.clone());
            }
            if let Some(lease) = entry.lease.filter(|l| l.state == LeaseState::Live) {
                out.leases
                    .insert((lease.until_ms(), entry.node.name.clone()));
            }
            for (member, slot) in &entry.usage.pods {
                out.locations
                    .insert(member.clone(), entry.node.name.clone());
                if let Some(txn_id) = slot.state.txn_id() {
                    out.by_txn.entry(txn_id).or_default().insert(member.clone());
                }
            }
        }
        for (txn_id, done) in &state.finished {
            out.finish_order.insert(done.seq, *txn_id);
        }
        out
    }
}

/// How long a reservation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Until the coordinator decides (deadline in ms).
    Until(u64),
    /// Committed in the same entry.
    CommitNow,
}

/// The state machine of one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardLedger {
    state: LedgerState,
    index: Indexes,
    /// What a departing carrier's shared claims become (not state: a test-only bug
    /// switch sets it on every replica alike).
    hand_over: HandOver,
}

impl ShardLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets what a departing carrier's shared-claim devices become ([`HandOver::Freed`]
    /// only for the test-only bug switch).
    pub fn set_hand_over(&mut self, hand_over: HandOver) {
        self.hand_over = hand_over;
    }

    /// Applies one command; bad input is answered with `Rejected` and changes nothing.
    pub fn apply(&mut self, cmd: &LedgerCommand) -> LedgerReply {
        match &cmd.op {
            LedgerOp::Batch { ops } => self.batch(cmd.at_ms, ops),
            op => self.apply_op(cmd.at_ms, op),
        }
    }

    /// Applies each operation of a batch in order, as if alone.
    fn batch(&mut self, at_ms: u64, ops: &[LedgerOp]) -> LedgerReply {
        if ops.len() > LEDGER_BATCH_MAX {
            return LedgerReply::Rejected {
                error: LedgerError::BatchTooLarge { ops: ops.len() },
            };
        }
        let replies = ops
            .iter()
            .map(|op| match op {
                LedgerOp::Batch { .. } => LedgerReply::Rejected {
                    error: LedgerError::NestedBatch,
                },
                op => self.apply_op(at_ms, op),
            })
            .collect();
        LedgerReply::Batch { replies }
    }

    fn apply_op(&mut self, at_ms: u64, op: &LedgerOp) -> LedgerReply {
        // A node that moved away is answered as moved by every operation naming it, never
        // as unknown or absent: its writer asks meta again and finds the new shard.
        if let Some(name) = node_named(op) {
            if self.state.nodes.get(name).is_none() {
                if let Err(error) = self.refuse_moved_node(name) {
                    return LedgerReply::Rejected { error };
                }
            }
        }
        #[cfg(debug_assertions)]
        let touched = self.nodes_touched_by(op);
        let result = match op {
            LedgerOp::RegisterNode { node } => self.register_node(node),
            LedgerOp::AddNode { node } => self.add_node(node),
            LedgerOp::NodeHeartbeat {
                node,
                ready,
                lease_ms,
            } => self.heartbeat(at_ms, node, *ready, *lease_ms),
            LedgerOp::RemoveNode { name } => self.remove_node(name),
            LedgerOp::SetObservedPods { node, pods } => self.set_observed_pods(node, pods),
            LedgerOp::Reserve {
                txn_id,
                members,
                deadline_ms,
                network,
            } => self.reserve(at_ms, *txn_id, members, network, Hold::Until(*deadline_ms)),
            LedgerOp::ReserveAndCommit {
                txn_id,
                members,
                network,
            } => self.reserve(at_ms, *txn_id, members, network, Hold::CommitNow),
            LedgerOp::ReserveDisplacing {
                txn_id,
                members,
                victims,
                deadline_ms,
            } => self.reserve_displacing(at_ms, *txn_id, members, victims, *deadline_ms),
            LedgerOp::Commit { txn_id } => self.commit(at_ms, *txn_id),
            LedgerOp::Abort { txn_id } => self.abort(at_ms, *txn_id),
            LedgerOp::Release { target } => self.release(at_ms, target),
            LedgerOp::BindConfirmed { member } => self.bind_confirmed(at_ms, member),
            LedgerOp::VictimsGone { members } if members.len() > LEDGER_BATCH_MAX => {
                Err(LedgerError::BatchTooLarge { ops: members.len() })
            }
            LedgerOp::VictimsGone { members } => Ok(self.victims_gone(members)),
            LedgerOp::Tick => Ok(self.tick(at_ms)),
            LedgerOp::PublishPool {
                node,
                driver,
                pool,
                generation,
                devices,
                counter_sets,
            } => self.publish_pool(
                at_ms,
                node,
                driver,
                pool,
                *generation,
                devices,
                counter_sets,
            ),
            LedgerOp::PublishNetworkPool {
                driver,
                pool,
                generation,
                reach,
                devices,
                counter_sets,
            } => self.publish_network_pool(
                at_ms,
                PoolParts {
                    driver,
                    name: pool,
                    generation: *generation,
                    devices,
                    counter_sets,
                },
                reach,
            ),
            LedgerOp::WithdrawPool { node, driver, pool } => {
                Ok(self.withdraw_pool(node, driver, pool))
            }
            LedgerOp::SetObservedNetworkHolds { holds } => self.set_observed_network_holds(holds),
            LedgerOp::SetDeviceHealth { node, devices } => {
                self.set_device_health(at_ms, node, devices)
            }
            LedgerOp::SetDeviceTaints {
                node,
                device,
                taints,
            } => self.set_device_taints(at_ms, node, device, taints),
            LedgerOp::AgentDisconnected {
                node,
                since_ms,
                grace_ms,
            } => self.agent_disconnected(node, *since_ms, *grace_ms),
            LedgerOp::AgentConnected { node } => self.agent_connected(node),
            LedgerOp::PutDeviceClass { class } => self.put_device_class(class),
            LedgerOp::RemoveDeviceClass { name } => Ok(self.remove_device_class(name)),
            LedgerOp::FenceNodes { move_id, nodes } => self.fence_nodes(*move_id, nodes),
            LedgerOp::UnfenceNodes { move_id } => Ok(self.unfence_nodes(*move_id)),
            LedgerOp::HandOff { move_id, to } => self.hand_off(*move_id, *to),
            LedgerOp::Adopt { parcel } => self.adopt(parcel),
            LedgerOp::DropParcel { move_id } => Ok(self.drop_parcel(*move_id)),
            LedgerOp::Batch { .. } => Err(LedgerError::NestedBatch),
        };
        #[cfg(debug_assertions)]
        self.assert_i2(&touched);
        result.unwrap_or_else(|error| LedgerReply::Rejected { error })
    }

    /// Nodes whose usage `op` may change (computed before applying it).
    #[cfg(debug_assertions)]
    fn nodes_touched_by(&self, op: &LedgerOp) -> BTreeSet<String> {
        let of_members = |keys: &mut dyn Iterator<Item = &MemberKey>| -> BTreeSet<String> {
            keys.filter_map(|k| self.index.locations.get(k).cloned())
                .collect()
        };
        match op {
            LedgerOp::RegisterNode { node } | LedgerOp::AddNode { node } => {
                BTreeSet::from([node.name.clone()])
            }
            LedgerOp::NodeHeartbeat { node, .. } | LedgerOp::SetObservedPods { node, .. } => {
                BTreeSet::from([node.clone()])
            }
            LedgerOp::Reserve { members, .. } | LedgerOp::ReserveAndCommit { members, .. } => {
                members.iter().map(|m| m.node.clone()).collect()
            }
            LedgerOp::ReserveDisplacing {
                members, victims, ..
            } => {
                let mut nodes = of_members(&mut victims.iter());
                nodes.extend(members.iter().map(|m| m.node.clone()));
                nodes
            }
            LedgerOp::Commit { txn_id }
            | LedgerOp::Abort { txn_id }
            | LedgerOp::Release {
                target: ReleaseTarget::Txn(txn_id),
            } => {
                let mut nodes =
                    of_members(&mut self.index.by_txn.get(txn_id).into_iter().flatten());
                let displaced = self.state.open.values().flat_map(|o| o.displaced.values());
                nodes.extend(displaced.map(|d| d.node.clone()));
                nodes
            }
            LedgerOp::Release {
                target: ReleaseTarget::Members(keys),
            } => of_members(&mut keys.iter()),
            LedgerOp::BindConfirmed { member } => of_members(&mut std::iter::once(member)),
            LedgerOp::VictimsGone { members } => members
                .iter()
                .filter_map(|k| self.state.evicting.get(k).map(|v| v.node.clone()))
                .collect(),
            LedgerOp::WithdrawPool { node, .. } if node.is_empty() => BTreeSet::new(),
            LedgerOp::PublishPool { node, .. }
            | LedgerOp::WithdrawPool { node, .. }
            | LedgerOp::SetDeviceHealth { node, .. }
            | LedgerOp::SetDeviceTaints { node, .. }
            | LedgerOp::AgentDisconnected { node, .. }
            | LedgerOp::AgentConnected { node } => BTreeSet::from([node.clone()]),
            LedgerOp::Tick => {
                let mut nodes = self.index.disconnected.clone();
                nodes.extend(self.index.leases.iter().map(|(_, node)| node.clone()));
                nodes
            }
            LedgerOp::FenceNodes { nodes, .. } => nodes.iter().cloned().collect(),
            LedgerOp::Adopt { parcel } => {
                parcel.nodes.iter().map(|n| n.node.name.clone()).collect()
            }
            LedgerOp::UnfenceNodes { .. }
            | LedgerOp::HandOff { .. }
            | LedgerOp::DropParcel { .. }
            | LedgerOp::RemoveNode { .. }
            | LedgerOp::PublishNetworkPool { .. }
            | LedgerOp::SetObservedNetworkHolds { .. }
            | LedgerOp::PutDeviceClass { .. }
            | LedgerOp::RemoveDeviceClass { .. }
            | LedgerOp::Batch { .. } => BTreeSet::new(),
        }
    }

    /// Debug check after every command: I2 and usage sums on every node it touched.
    #[cfg(debug_assertions)]
    fn assert_i2(&self, touched: &BTreeSet<String>) {
        for name in touched {
            if let Some(entry) = self.state.nodes.get(name) {
                let sums = entry.usage.recomputed();
                debug_assert_eq!(sums, entry.usage.sums());
                let total = sums.reserved.checked_add(&sums.committed);
                debug_assert!(
                    total.is_some_and(|t| t.fits(&entry.node.allocatable)),
                    "I2 violated on node {name}"
                );
                let devices = entry.usage.devices.check(&entry.usage.pods);
                debug_assert!(devices.is_ok(), "node {name}: {devices:?}");
                // The bug switch breaks this on purpose, for the outside checks to find.
                if self.hand_over == HandOver::ToFollower {
                    let network = &self.state.network;
                    let shares = entry.usage.check_shares(|m, c| network.uses(m, c));
                    debug_assert!(shares.is_ok(), "node {name}: {shares:?}");
                }
            }
        }
        debug_assert!(self.state.finished.len() <= FINISHED_TXNS_MAX);
        if !self.state.network.is_empty() {
            let network = self.check_network();
            debug_assert!(network.is_ok(), "{network:?}");
        }
    }

    // ---- nodes -------------------------------------------------------------------------

    /// The entry of `node`, or `UnknownNode`.
    fn known_node(&self, node: &str) -> Result<&NodeEntry, LedgerError> {
        self.state
            .nodes
            .get(node)
            .ok_or_else(|| LedgerError::UnknownNode {
                name: node.to_string(),
            })
    }

    /// Changes the entry of `node` (keeping the indexes in step), or `UnknownNode`.
    fn update_known<R>(
        &mut self,
        node: &str,
        change: impl FnOnce(&mut NodeEntry) -> R,
    ) -> Result<R, LedgerError> {
        self.state
            .nodes
            .update(node, change)
            .ok_or_else(|| LedgerError::UnknownNode {
                name: node.to_string(),
            })
    }

    fn register_node(&mut self, node: &Node) -> Result<LedgerReply, LedgerError> {
        self.refuse_moved_node(&node.name)?;
        node.validate(&FieldPath::new("node"))
            .map_err(|e| LedgerError::InvalidNode {
                message: e.to_string(),
            })?;
        let change = match self.state.nodes.get(&node.name) {
            Some(entry) => {
                if let Some(resource) = entry.usage.held().shortfall(&node.allocatable) {
                    return Err(LedgerError::AllocatableBelowUsage {
                        name: node.name.clone(),
                        resource,
                    });
                }
                self.state
                    .nodes
                    .update(&node.name, |entry| entry.node = node.clone());
                NodeChange::Updated
            }
            None => {
                let moving = self.fence_of(&node.name);
                self.state.nodes.insert(NodeEntry {
                    node: node.clone(),
                    usage: NodeUsage::default(),
                    lease: None,
                    moving,
                });
                NodeChange::Added
            }
        };
        Ok(LedgerReply::NodeRegistered {
            name: node.name.clone(),
            change,
        })
    }

    fn add_node(&mut self, node: &Node) -> Result<LedgerReply, LedgerError> {
        self.refuse_moved_node(&node.name)?;
        let Some(entry) = self.state.nodes.get(&node.name) else {
            return self.register_node(node);
        };
        let differences = entry.node.differences(node);
        if differences.is_empty() {
            // The same node again: nothing changes (its readiness stays the lease's).
            node.validate(&FieldPath::new("node"))
                .map_err(|e| LedgerError::InvalidNode {
                    message: e.to_string(),
                })?;
            return Ok(LedgerReply::NodeRegistered {
                name: node.name.clone(),
                change: NodeChange::Unchanged,
            });
        }
        Err(LedgerError::NodeDiffers {
            name: node.name.clone(),
            differences: differences.join(", "),
        })
    }

    fn remove_node(&mut self, name: &str) -> Result<LedgerReply, LedgerError> {
        let presence = match self.state.nodes.get(name) {
            None => Presence::Absent,
            Some(entry) if entry.usage.pods.values().any(|s| s.state.is_gangway()) => {
                let pods = entry
                    .usage
                    .pods
                    .values()
                    .filter(|s| s.state.is_gangway())
                    .count();
                return Err(LedgerError::NodeInUse {
                    name: name.to_string(),
                    pods: pods as u64,
                });
            }
            Some(entry) => {
                let observed: Vec<MemberKey> = entry.usage.pods.keys().cloned().collect();
                for key in &observed {
                    self.index.locations.remove(key);
                }
                if let Some(lease) = self.state.nodes.remove(name).and_then(|e| e.lease) {
                    self.index
                        .leases
                        .remove(&(lease.until_ms(), name.to_string()));
                }
                self.index.disconnected.remove(name);
                Presence::Removed
            }
        };
        Ok(LedgerReply::NodeRemoved {
            name: name.to_string(),
            presence,
        })
    }

    /// Replaces the node's observed pods: gone or changed ones are taken out first, then
    /// new or changed ones recorded (unchecked, see [`NodeUsage::observe`]).
    fn set_observed_pods(
        &mut self,
        node: &str,
        pods: &[ObservedPod],
    ) -> Result<LedgerReply, LedgerError> {
        let entry = self.known_node(node)?;
        validate_observed(node, pods)?;
        let wanted: BTreeMap<MemberKey, &ObservedPod> =
            pods.iter().map(|p| (p.member_key(), p)).collect();
        let stale: Vec<MemberKey> = entry
            .usage
            .pods
            .iter()
            .filter(|(_, slot)| !slot.state.is_gangway())
            .filter(|(key, slot)| wanted.get(*key).is_none_or(|p| p.pod != slot.pod))
            .map(|(key, _)| key.clone())
            .collect();
        let fresh: Vec<(MemberKey, &ObservedPod)> = wanted
            .into_iter()
            .filter(|(key, _)| !entry.usage.pods.contains_key(key) || stale.contains(key))
            .collect();
        for key in &stale {
            self.take_member(key);
        }
        let mut conflicts = Vec::new();
        for (key, observed) in &fresh {
            // A uid is on one node at a time: a report from its new node moves it.
            if self.index.locations.get(key).is_some_and(|n| n != node) {
                self.take_member(key);
            }
            let left_out = self.state.nodes.update(node, |entry| {
                entry.usage.observe(key.clone(), observed.pod.clone())
            });
            self.index.locations.insert(key.clone(), node.to_string());
            if let Some(left_out) = left_out.filter(|c| !c.is_empty()) {
                conflicts.push((observed.uid.clone(), left_out));
            }
        }
        Ok(LedgerReply::ObservedPodsSet {
            node: node.to_string(),
            added: fresh.len() as u32,
            removed: stale.len() as u32,
            conflicts,
        })
    }

    // ---- phase 1 -----------------------------------------------------------------------

    fn reserve(
        &mut self,
        at_ms: u64,
        txn_id: TxnId,
        members: &[ReserveMember],
        network: &[NetworkHold],
        hold: Hold,
    ) -> Result<LedgerReply, LedgerError> {
        if let Some(open) = self.state.open.get(&txn_id) {
            return match hold {
                Hold::Until(_) if self.is_same_reservation(open, members, network) => {
                    Ok(LedgerReply::Reserved {
                        txn_id,
                        deadline_ms: open.deadline_ms,
                    })
                }
                _ => Err(LedgerError::TxnConflict { txn_id }),
            };
        }
        if let Some(done) = self.state.finished.get(&txn_id) {
            return Ok(finished_answer(txn_id, done, hold));
        }
        if self.holds_committed(txn_id) {
            return Ok(LedgerReply::AlreadyFinished {
                txn_id,
                outcome: TxnOutcome::Committed,
            });
        }
        validate_reservation(at_ms, txn_id, members, network, hold)?;
        let mut refusals = self.refusals(members, network, at_ms);
        refusals.extend(self.network_refusals(members, network, at_ms));
        if !refusals.is_empty() {
            refusals.truncate(REFUSALS_KEPT_MAX);
            self.finish(txn_id, TxnOutcome::Refused, at_ms, refusals.clone());
            return Ok(LedgerReply::ReserveRefused { txn_id, refusals });
        }
        let state = match hold {
            Hold::Until(_) => SlotState::Reserved { txn_id },
            Hold::CommitNow => SlotState::Committed { txn_id, at_ms },
        };
        for member in members {
            self.hold_member(member, state);
        }
        for h in network {
            self.state.network.hold(h, state);
        }
        match hold {
            Hold::Until(deadline_ms) => {
                let mut held = BTreeMap::new();
                for m in members {
                    held.insert(m.member.clone(), m.node.clone());
                }
                let open = OpenTxn {
                    members: held,
                    deadline_ms,
                    reserved_at_ms: at_ms,
                    displaced: BTreeMap::new(),
                    network: network
                        .iter()
                        .filter(|h| !matches!(h.kind(), HoldKind::Use(_)))
                        .map(NetworkHold::key)
                        .collect(),
                };
                self.state.open.insert(txn_id, open);
                Ok(LedgerReply::Reserved {
                    txn_id,
                    deadline_ms,
                })
            }
            Hold::CommitNow => {
                self.finish(txn_id, TxnOutcome::Committed, at_ms, Vec::new());
                Ok(LedgerReply::Committed { txn_id })
            }
        }
    }

    fn is_same_reservation(
        &self,
        open: &OpenTxn,
        members: &[ReserveMember],
        network: &[NetworkHold],
    ) -> bool {
        let held = network
            .iter()
            .filter(|h| !matches!(h.kind(), HoldKind::Use(_)))
            .count();
        let same_network = held == open.network.len()
            && network.iter().all(|h| match h.kind() {
                HoldKind::Use(claim) => self.state.network.uses(&h.member, claim),
                HoldKind::Own | HoldKind::Carry(_) => {
                    open.network.contains(&h.key())
                        && self
                            .state
                            .network
                            .hold_of(&h.key())
                            .is_some_and(|slot| slot.pod.devices == h.devices)
                }
            });
        same_network
            && members.len() == open.members.len()
            && members.iter().all(|m| {
                open.members.get(&m.member) == Some(&m.node)
                    && self
                        .state
                        .nodes
                        .get(&m.node)
                        .and_then(|entry| entry.usage.pods.get(&m.member))
                        .is_some_and(|slot| same_pod_but_handed_over(&slot.pod, &m.pod))
            })
    }

    /// A preemption's first phase (rule 14): all or nothing, the victims leave their
    /// nodes, the members are reserved on the room they leave, and placeholders hold
    /// the rest of that room for the victims until the decision
    /// ([`crate::ledger::displace`]). Checked on copies of the touched nodes as they
    /// would be after, so what it holds always fits, and an ABORT always can put the
    /// victims back.
    fn reserve_displacing(
        &mut self,
        at_ms: u64,
        txn_id: TxnId,
        members: &[ReserveMember],
        victims: &[MemberKey],
        deadline_ms: u64,
    ) -> Result<LedgerReply, LedgerError> {
        if let Some(open) = self.state.open.get(&txn_id) {
            return if self.is_same_displacing(open, members, victims) {
                Ok(LedgerReply::Reserved {
                    txn_id,
                    deadline_ms: open.deadline_ms,
                })
            } else {
                Err(LedgerError::TxnConflict { txn_id })
            };
        }
        if let Some(done) = self.state.finished.get(&txn_id) {
            return Ok(finished_answer(txn_id, done, Hold::Until(deadline_ms)));
        }
        if self.index.by_txn.contains_key(&txn_id) {
            return Ok(LedgerReply::AlreadyFinished {
                txn_id,
                outcome: TxnOutcome::Committed,
            });
        }
        validate_displacing(at_ms, txn_id, members, victims, deadline_ms)?;
        let placeholders = match self.displacing_plan(txn_id, members, victims, at_ms) {
            Ok(placeholders) => placeholders,
            Err(mut refusals) => {
                refusals.truncate(REFUSALS_KEPT_MAX);
                self.finish(txn_id, TxnOutcome::Refused, at_ms, refusals.clone());
                return Ok(LedgerReply::ReserveRefused { txn_id, refusals });
            }
        };
        let mut displaced = BTreeMap::new();
        for key in victims {
            let Some(node) = self.index.locations.get(key).cloned() else {
                continue;
            };
            if let Some(slot) = self.take_member(key) {
                displaced.insert(key.clone(), DisplacedSlot { node, slot });
            }
        }
        let mut held = BTreeMap::new();
        for m in members.iter().chain(&placeholders) {
            self.hold_member(m, SlotState::Reserved { txn_id });
            held.insert(m.member.clone(), m.node.clone());
        }
        let open = OpenTxn {
            members: held,
            deadline_ms,
            reserved_at_ms: at_ms,
            displaced,
            network: BTreeSet::new(),
        };
        self.state.open.insert(txn_id, open);
        Ok(LedgerReply::Reserved {
            txn_id,
            deadline_ms,
        })
    }

    /// The placeholders a preemption needs, or why it cannot be held: the victims must
    /// be committed or bound here, and the members, then the placeholders, must fit the
    /// touched nodes without the victims.
    fn displacing_plan(
        &self,
        txn_id: TxnId,
        members: &[ReserveMember],
        victims: &[MemberKey],
        at_ms: u64,
    ) -> Result<Vec<ReserveMember>, Vec<Refusal>> {
        let refusal = |member: &MemberKey, node: &str, cause| Refusal {
            member: member.clone(),
            node: node.to_string(),
            cause,
        };
        let mut refusals = Vec::new();
        let mut victims_by_node: BTreeMap<&str, Vec<(&MemberKey, &PodSlot)>> = BTreeMap::new();
        for key in victims {
            let node = self.index.locations.get(key);
            let slot = node.and_then(|n| self.state.nodes.get(n)?.usage.pods.get(key));
            match (node, slot) {
                (Some(node), Some(slot))
                    if matches!(
                        slot.state,
                        SlotState::Committed { .. } | SlotState::Bound { .. }
                    ) =>
                {
                    victims_by_node.entry(node).or_default().push((key, slot));
                }
                (node, _) => refusals.push(refusal(
                    key,
                    node.map_or("", String::as_str),
                    RefusalCause::VictimNotPlaced,
                )),
            }
        }
        for (node, slots) in &victims_by_node {
            if let Some(entry) = self.state.nodes.get(node) {
                if let Some((key, claim)) = split_claim(slots, &entry.usage) {
                    let cause = RefusalCause::SharedClaimSplit { claim };
                    refusals.push(refusal(key, node, cause));
                }
            }
        }
        if !refusals.is_empty() {
            return Err(refusals);
        }
        let mut after: BTreeMap<&str, NodeUsage> = BTreeMap::new();
        for (node, slots) in &victims_by_node {
            if let Some(entry) = self.state.nodes.get(node) {
                let mut usage = entry.usage.clone();
                for (key, _) in slots {
                    usage.take(key);
                }
                after.insert(node, usage);
            }
        }
        let reserved = SlotState::Reserved { txn_id };
        for m in members {
            if let Some(node) = self.index.locations.get(&m.member) {
                let cause = RefusalCause::MemberHeld { node: node.clone() };
                refusals.push(refusal(&m.member, &m.node, cause));
                continue;
            }
            let Some(entry) = self.state.nodes.get(&m.node) else {
                refusals.push(refusal(&m.member, &m.node, RefusalCause::UnknownNode));
                continue;
            };
            if entry.node.readiness == Readiness::NotReady {
                refusals.push(refusal(&m.member, &m.node, RefusalCause::NodeNotReady));
                continue;
            }
            if entry.moving.is_some() {
                refusals.push(refusal(&m.member, &m.node, RefusalCause::NodeMoving));
                continue;
            }
            let usage = after
                .entry(m.node.as_str())
                .or_insert_with(|| entry.usage.clone());
            let nothing = BatchLoad::default();
            match usage.refusal_at(&entry.node.allocatable, &nothing, &m.pod, Some(at_ms)) {
                Some(cause) => refusals.push(refusal(&m.member, &m.node, cause)),
                None => usage.hold(
                    m.member.clone(),
                    PodSlot {
                        pod: m.pod.clone(),
                        state: reserved,
                    },
                ),
            }
        }
        if !refusals.is_empty() {
            return Err(refusals);
        }
        let mut placeholders = Vec::new();
        for (node, slots) in &victims_by_node {
            let (Some(entry), Some(usage)) = (self.state.nodes.get(node), after.get_mut(node))
            else {
                continue;
            };
            let victim_pods: Vec<&PodSummary> = slots.iter().map(|(_, s)| &s.pod).collect();
            let member_pods: Vec<&PodSummary> = members
                .iter()
                .filter(|m| m.node == *node)
                .map(|m| &m.pod)
                .collect();
            for (key, pod) in displace::victim_room(txn_id, node, &victim_pods, &member_pods) {
                let nothing = BatchLoad::default();
                if usage
                    .refusal_at(&entry.node.allocatable, &nothing, &pod, None)
                    .is_some()
                {
                    refusals.push(refusal(&key, node, RefusalCause::VictimRoomNotHeld));
                    continue;
                }
                let slot = PodSlot {
                    pod: pod.clone(),
                    state: reserved,
                };
                usage.hold(key.clone(), slot);
                placeholders.push(ReserveMember {
                    member: key,
                    node: node.to_string(),
                    pod,
                });
            }
        }
        if refusals.is_empty() {
            Ok(placeholders)
        } else {
            Err(refusals)
        }
    }

    fn is_same_displacing(
        &self,
        open: &OpenTxn,
        members: &[ReserveMember],
        victims: &[MemberKey],
    ) -> bool {
        let own = open
            .members
            .keys()
            .filter(|k| !displace::is_placeholder(k))
            .count();
        own == members.len()
            && victims.len() == open.displaced.len()
            && victims.iter().all(|v| open.displaced.contains_key(v))
            && members.iter().all(|m| {
                open.members.get(&m.member) == Some(&m.node)
                    && self.slot(&m.member).is_some_and(|slot| slot.pod == m.pod)
            })
    }

    /// Puts a displaced victim back on its node, as it was.
    fn put_back(&mut self, key: &MemberKey, displaced: DisplacedSlot) {
        let txn_id = displaced.slot.state.txn_id();
        let node = displaced.node;
        let slot = displaced.slot;
        let held = self
            .state
            .nodes
            .update(&node, |entry| entry.usage.hold(key.clone(), slot));
        if held.is_none() {
            // Corrupted state: a node with a preemption's slots cannot be removed.
            panic!("displaced victim {key} belongs to node {node}, which is gone");
        }
        self.index.locations.insert(key.clone(), node);
        if let Some(txn_id) = txn_id {
            self.index
                .by_txn
                .entry(txn_id)
                .or_default()
                .insert(key.clone());
        }
    }

    /// Forgets displaced victims that `gone` names (a release that reached this shard
    /// while they were displaced), so that an ABORT does not put them back; returns them.
    fn forget_displaced(&mut self, gone: impl Fn(&MemberKey, &PodSlot) -> bool) -> Vec<MemberKey> {
        let mut forgotten = Vec::new();
        for open in self.state.open.values_mut() {
            let mut gone_slots = Vec::new();
            open.displaced.retain(|key, d| {
                let keep = !gone(key, &d.slot);
                if !keep {
                    forgotten.push(key.clone());
                    gone_slots.push(d.clone());
                }
                keep
            });
            for d in gone_slots {
                hand_over_displaced(&mut open.displaced, &d);
            }
        }
        forgotten
    }

    /// Every member that cannot be held, checking the batch cumulatively per node. A
    /// shared claim a member uses through the reservation's network holds is not looked
    /// for on its node ([`ShardLedger::network_refusals`] checks it), and the member may
    /// not allocate it with its node's devices as well.
    fn refusals(
        &self,
        members: &[ReserveMember],
        network: &[NetworkHold],
        at_ms: u64,
    ) -> Vec<Refusal> {
        let mut network_claims: BTreeMap<&MemberKey, BTreeSet<&str>> = BTreeMap::new();
        for h in network {
            if let HoldKind::Carry(claim) | HoldKind::Use(claim) = h.kind() {
                network_claims.entry(&h.member).or_default().insert(claim);
            }
        }
        let mut batches: BTreeMap<&str, BatchLoad> = BTreeMap::new();
        for m in members.iter().filter(|m| !m.pod.shares.is_empty()) {
            batches
                .entry(m.node.as_str())
                .or_default()
                .expect_carrier(&m.pod);
        }
        let nothing_yet = BatchLoad::default();
        let mut out = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let batch = batches.get(m.node.as_str()).unwrap_or(&nothing_yet);
            let cause = match network_claims.get(&m.member) {
                None => self.refusal_cause(m, batch, at_ms),
                Some(claims) => match m.pod.carried().find(|s| claims.contains(s.claim.as_str())) {
                    Some(share) => Some(RefusalCause::SharedClaimCarried {
                        claim: share.claim.clone(),
                    }),
                    None => {
                        let mut on_node = m.clone();
                        on_node
                            .pod
                            .shares
                            .retain(|s| !claims.contains(s.claim.as_str()));
                        self.refusal_cause(&on_node, batch, at_ms)
                    }
                },
            };
            match cause {
                Some(cause) => out.push(Refusal {
                    member: m.member.clone(),
                    node: m.node.clone(),
                    cause,
                }),
                // Only later members see what this one takes.
                None if i + 1 < members.len() => {
                    let batch = batches.entry(m.node.as_str()).or_default();
                    match self.state.nodes.get(&m.node) {
                        Some(entry) => batch.add_counted(&m.pod, &entry.usage.devices),
                        None => batch.add(&m.pod),
                    }
                }
                None => {}
            }
        }
        out
    }

    /// Why the network holds of a reservation cannot be taken: devices taken, sick or
    /// unknown here, or (for members placed on this shard) not reachable from their node.
    fn network_refusals(
        &self,
        members: &[ReserveMember],
        network: &[NetworkHold],
        at_ms: u64,
    ) -> Vec<Refusal> {
        let node_of = |member: &MemberKey| {
            members
                .iter()
                .find(|m| m.member == *member)
                .map(|m| m.node.as_str())
        };
        let mut out: Vec<Refusal> = self
            .state
            .network
            .refusals(network, at_ms)
            .into_iter()
            .map(|(member, cause)| Refusal {
                node: node_of(&member).unwrap_or_default().to_string(),
                member,
                cause,
            })
            .collect();
        for hold in network {
            let Some(node) = node_of(&hold.member) else {
                continue;
            };
            let Some(entry) = self.state.nodes.get(node) else {
                continue;
            };
            // A shared claim's user reaches the devices its carrier holds.
            let devices = match hold.kind() {
                HoldKind::Use(claim) => network
                    .iter()
                    .find(|h| h.kind() == HoldKind::Carry(claim))
                    .map(|h| h.devices.as_slice())
                    .or_else(|| {
                        let slot = self.state.network.claim_hold(claim)?;
                        Some(slot.pod.devices.as_slice())
                    })
                    .unwrap_or_default(),
                HoldKind::Own | HoldKind::Carry(_) => &hold.devices,
            };
            let network = &self.state.network;
            let unreachable =
                (devices.iter()).find(|a| network.out_of_reach(&a.device, &entry.node));
            if let Some(a) = unreachable {
                out.push(Refusal {
                    member: hold.member.clone(),
                    node: node.to_string(),
                    cause: RefusalCause::DeviceUnreachable {
                        device: a.device.clone(),
                    },
                });
            }
        }
        out
    }

    /// Whether a transaction that is not open holds anything here (so it committed).
    fn holds_committed(&self, txn_id: TxnId) -> bool {
        self.index.by_txn.contains_key(&txn_id) || self.state.network.holds_any(txn_id)
    }

    fn refusal_cause(
        &self,
        m: &ReserveMember,
        batch: &BatchLoad,
        at_ms: u64,
    ) -> Option<RefusalCause> {
        if let Some(node) = self.index.locations.get(&m.member) {
            return Some(RefusalCause::MemberHeld { node: node.clone() });
        }
        let Some(entry) = self.state.nodes.get(&m.node) else {
            return Some(RefusalCause::UnknownNode);
        };
        if entry.node.readiness == Readiness::NotReady {
            return Some(RefusalCause::NodeNotReady);
        }
        if entry.moving.is_some() {
            return Some(RefusalCause::NodeMoving);
        }
        entry
            .usage
            .refusal_at(&entry.node.allocatable, batch, &m.pod, Some(at_ms))
    }

    fn hold_member(&mut self, m: &ReserveMember, state: SlotState) {
        let slot = PodSlot {
            pod: m.pod.clone(),
            state,
        };
        let held = self
            .state
            .nodes
            .update(&m.node, |entry| entry.usage.hold(m.member.clone(), slot));
        if held.is_none() {
            return;
        }
        self.index
            .locations
            .insert(m.member.clone(), m.node.clone());
        if !self.state.moved_members.is_empty() {
            self.state.moved_members.remove(&m.member);
        }
        if let Some(txn_id) = state.txn_id() {
            self.index
                .by_txn
                .entry(txn_id)
                .or_default()
                .insert(m.member.clone());
        }
    }

    // ---- phase 2 -----------------------------------------------------------------------

    fn commit(&mut self, at_ms: u64, txn_id: TxnId) -> Result<LedgerReply, LedgerError> {
        if let Some(open) = self.state.open.remove(&txn_id) {
            // A preemption's victims go; the placeholders holding their room go too,
            // except on nodes where a victim's pod may still run (Kubernetes pods).
            let still_running = self.keep_evicting(at_ms, txn_id, &open);
            for (member, node) in &open.members {
                if displace::is_placeholder(member) && !still_running.contains(node) {
                    self.take_member(member);
                    continue;
                }
                self.state
                    .nodes
                    .update(node, |entry| entry.usage.promote(member, at_ms));
            }
            for member in &open.network {
                self.state.network.promote(member, at_ms);
            }
            self.finish(txn_id, TxnOutcome::Committed, at_ms, Vec::new());
            return Ok(LedgerReply::Committed { txn_id });
        }
        match self.state.finished.get(&txn_id).map(|done| done.outcome) {
            Some(TxnOutcome::Committed) => Ok(LedgerReply::Committed { txn_id }),
            Some(outcome) => Err(LedgerError::TxnNotCommittable { txn_id, outcome }),
            None if self.holds_committed(txn_id) => Ok(LedgerReply::Committed { txn_id }),
            None => Err(LedgerError::UnknownTxn { txn_id }),
        }
    }

    /// Records the Kubernetes victims of committed preemption `txn_id` as evicting;
    /// returns the nodes they run on (where its placeholders stay).
    fn keep_evicting(&mut self, at_ms: u64, txn_id: TxnId, open: &OpenTxn) -> BTreeSet<String> {
        let preemptor = open
            .members
            .keys()
            .find(|k| !displace::is_placeholder(k))
            .map(|k| format!("{}/{}", k.namespace, k.gang))
            .unwrap_or_default();
        let mut nodes = BTreeSet::new();
        for (key, d) in &open.displaced {
            let Some(uid) = d.slot.pod.uid.clone() else {
                continue;
            };
            nodes.insert(d.node.clone());
            let victim = EvictingVictim {
                txn_id,
                node: d.node.clone(),
                uid,
                preemptor: preemptor.clone(),
                since_ms: at_ms,
            };
            // The same name evicting for an earlier preemption was another pod, which
            // is gone (Kubernetes has one pod of a name at a time): its room is free.
            if let Some(earlier) = self.state.evicting.insert(key.clone(), victim) {
                self.victim_left(earlier.txn_id, &earlier.node);
            }
        }
        nodes
    }

    /// Forgets victims whose pods are gone; frees a transaction's placeholders on a
    /// node once none of its victims there is left.
    fn victims_gone(&mut self, keys: &[MemberKey]) -> LedgerReply {
        let mut released = Vec::new();
        let mut absent = Vec::new();
        let mut left: BTreeSet<(TxnId, String)> = BTreeSet::new();
        for key in keys {
            match self.state.evicting.remove(key) {
                Some(v) => {
                    released.push(key.clone());
                    left.insert((v.txn_id, v.node));
                }
                None => absent.push(key.clone()),
            }
        }
        for (txn_id, node) in left {
            self.victim_left(txn_id, &node);
        }
        LedgerReply::Released { released, absent }
    }

    /// A victim of `txn_id` left `node`: frees the transaction's placeholders there if
    /// none of its victims is left on it.
    fn victim_left(&mut self, txn_id: TxnId, node: &str) {
        let still = self
            .state
            .evicting
            .values()
            .any(|v| v.txn_id == txn_id && v.node == node);
        if !still {
            self.free_placeholders(txn_id, node);
        }
    }

    /// Takes committed transaction `txn_id`'s placeholders off `node`.
    fn free_placeholders(&mut self, txn_id: TxnId, node: &str) {
        let holders: Vec<MemberKey> = self
            .index
            .by_txn
            .get(&txn_id)
            .into_iter()
            .flatten()
            .filter(|k| displace::is_placeholder(k))
            .filter(|k| self.index.locations.get(*k).map(String::as_str) == Some(node))
            .cloned()
            .collect();
        for key in holders {
            self.take_member(&key);
        }
    }

    fn abort(&mut self, at_ms: u64, txn_id: TxnId) -> Result<LedgerReply, LedgerError> {
        if self.state.open.contains_key(&txn_id) {
            self.drop_open(at_ms, txn_id);
            return Ok(LedgerReply::Aborted { txn_id });
        }
        match self.state.finished.get(&txn_id).map(|done| done.outcome) {
            Some(TxnOutcome::Committed) => Err(LedgerError::TxnCommitted { txn_id }),
            Some(_) => Ok(LedgerReply::Aborted { txn_id }),
            None if self.holds_committed(txn_id) => Err(LedgerError::TxnCommitted { txn_id }),
            None => {
                // Tombstone: a reserve for this id arriving later must not land.
                self.finish(txn_id, TxnOutcome::Aborted, at_ms, Vec::new());
                Ok(LedgerReply::Aborted { txn_id })
            }
        }
    }

    /// Drops an open transaction's reservations and records it aborted; returns its members.
    fn drop_open(&mut self, at_ms: u64, txn_id: TxnId) -> Vec<MemberKey> {
        let Some(open) = self.state.open.remove(&txn_id) else {
            return Vec::new();
        };
        let mut members: Vec<MemberKey> = open.members.into_keys().collect();
        for member in &members {
            self.take_member(member);
        }
        for (key, displaced) in open.displaced {
            self.put_back(&key, displaced);
        }
        for key in open.network {
            if key.gang == CLAIM_GANG {
                continue;
            }
            self.state.network.take(&key);
            if !members.contains(&key) {
                members.push(key);
            }
        }
        // Its shared claims' users go, and the claims it carried with them.
        for member in self.state.network.leave_txn(txn_id) {
            if !members.contains(&member) {
                members.push(member);
            }
        }
        members.retain(|m| !displace::is_placeholder(m));
        self.finish(txn_id, TxnOutcome::Aborted, at_ms, Vec::new());
        members
    }

    // ---- placements --------------------------------------------------------------------

    fn release(&mut self, at_ms: u64, target: &ReleaseTarget) -> Result<LedgerReply, LedgerError> {
        match target {
            ReleaseTarget::Txn(txn_id) => Ok(self.release_txn(at_ms, *txn_id)),
            ReleaseTarget::Members(keys) => self.release_members(keys),
        }
    }

    fn release_txn(&mut self, at_ms: u64, txn_id: TxnId) -> LedgerReply {
        if self.state.open.contains_key(&txn_id) {
            let released = self.drop_open(at_ms, txn_id);
            return LedgerReply::Released {
                released,
                absent: Vec::new(),
            };
        }
        let members: Vec<MemberKey> = self
            .index
            .by_txn
            .get(&txn_id)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        for member in &members {
            self.take_member(member);
        }
        let mut members = members;
        for member in self.state.network.held_by(txn_id) {
            self.state.network.take(&member);
            if !members.contains(&member) {
                members.push(member);
            }
        }
        for member in self.state.network.leave_txn(txn_id) {
            if !members.contains(&member) {
                members.push(member);
            }
        }
        // Placeholders still holding evicting victims' room go with the transaction.
        let mut released: Vec<MemberKey> = members
            .into_iter()
            .filter(|m| !displace::is_placeholder(m))
            .collect();
        released.extend(self.forget_displaced(|_, slot| slot.state.txn_id() == Some(txn_id)));
        LedgerReply::Released {
            released,
            absent: Vec::new(),
        }
    }

    fn release_members(&mut self, keys: &[MemberKey]) -> Result<LedgerReply, LedgerError> {
        let keys: BTreeSet<&MemberKey> = keys.iter().collect();
        for key in &keys {
            self.refuse_moved_member(key)?;
            if self.slot(key).is_some_and(|s| !s.state.is_gangway()) {
                return Err(LedgerError::ObservedMember {
                    member: (*key).clone(),
                });
            }
            if let Some(txn_id) = self.reserved_txn_of(key) {
                return Err(LedgerError::MemberReserved {
                    member: (*key).clone(),
                    txn_id,
                });
            }
        }
        let mut released = Vec::new();
        let mut absent = Vec::new();
        for key in &keys {
            let slot = self.take_member(key);
            let hold = self.state.network.take(key);
            let used = match self.hand_over {
                HandOver::ToFollower => self.state.network.leave(key),
                HandOver::Freed => self.state.network.leave_freeing(key),
            };
            match slot.or(hold) {
                Some(_) => released.push((*key).clone()),
                None if used => released.push((*key).clone()),
                None => absent.push((*key).clone()),
            }
        }
        let displaced = self.forget_displaced(|key, _| keys.contains(key));
        absent.retain(|key| !displaced.contains(key));
        released.extend(displaced);
        // A moved member whose last hold here (network devices) went holds nothing here
        // any more: a retried release finds it absent, not moved.
        if !self.state.moved_members.is_empty() {
            for key in &released {
                self.state.moved_members.remove(key);
            }
        }
        Ok(LedgerReply::Released { released, absent })
    }

    fn reserved_txn_of(&self, key: &MemberKey) -> Option<TxnId> {
        let using = || {
            let open = |t: &TxnId| self.state.open.contains_key(t);
            self.state
                .network
                .consumers()
                .find(|(m, t)| *m == key && open(t))
                .map(|(_, t)| t)
        };
        self.slot(key)
            .or_else(|| self.state.network.hold_of(key))
            .filter(|slot| slot.state.is_reserved())
            .and_then(|slot| slot.state.txn_id())
            .or_else(using)
    }

    /// Removes a member's slot wherever it is, keeping the indexes in step.
    fn take_member(&mut self, key: &MemberKey) -> Option<PodSlot> {
        let hand_over = self.hand_over;
        let node = self.index.locations.remove(key)?;
        let slot = self
            .state
            .nodes
            .update(&node, |entry| entry.usage.take_as(key, hand_over))
            .flatten()?;
        if let Some(txn_id) = slot.state.txn_id() {
            if let Some(set) = self.index.by_txn.get_mut(&txn_id) {
                set.remove(key);
                if set.is_empty() {
                    self.index.by_txn.remove(&txn_id);
                }
            }
        }
        Some(slot)
    }

    fn bind_confirmed(
        &mut self,
        at_ms: u64,
        member: &MemberKey,
    ) -> Result<LedgerReply, LedgerError> {
        let unknown = || LedgerError::UnknownMember {
            member: member.clone(),
        };
        self.refuse_moved_member(member)?;
        let node = self.index.locations.get(member).ok_or_else(unknown)?;
        let state = self
            .state
            .nodes
            .update(node, |entry| {
                let slot = entry.usage.pods.get_mut(member)?;
                let before = slot.state;
                if let SlotState::Committed { txn_id, .. } = before {
                    slot.state = SlotState::Bound { txn_id, at_ms };
                }
                Some(before)
            })
            .flatten()
            .ok_or_else(unknown)?;
        match state {
            SlotState::Reserved { txn_id } => Err(LedgerError::NotCommitted {
                member: member.clone(),
                txn_id,
            }),
            SlotState::Committed { .. } | SlotState::Bound { .. } => {
                Ok(LedgerReply::BindRecorded {
                    member: member.clone(),
                })
            }
            SlotState::Observed => Err(LedgerError::ObservedMember {
                member: member.clone(),
            }),
        }
    }

    fn tick(&mut self, at_ms: u64) -> LedgerReply {
        let txn_ids = self
            .state
            .open
            .iter()
            .filter(|(_, open)| open.deadline_ms <= at_ms)
            .map(|(txn_id, _)| *txn_id)
            .collect();
        let mut evictions = Vec::new();
        let waiting: Vec<String> = self.index.disconnected.iter().cloned().collect();
        for name in waiting {
            let lost = self.state.nodes.update(&name, |entry| {
                let usage = &mut entry.usage;
                let out = usage.devices.expire_agent(&name, &usage.pods, at_ms);
                let lost = matches!(usage.devices.agent, AgentLink::Lost { .. });
                (out, lost)
            });
            match lost {
                Some((out, lost)) => {
                    evictions.extend(out);
                    if lost {
                        self.index.disconnected.remove(&name);
                    }
                }
                None => {
                    self.index.disconnected.remove(&name);
                }
            }
        }
        let lapsed = self.lapse_leases(at_ms);
        LedgerReply::Expired {
            txn_ids,
            evictions,
            lapsed,
        }
    }

    /// Makes every node whose lease ran out at or before `at_ms` not ready.
    fn lapse_leases(&mut self, at_ms: u64) -> Vec<String> {
        let mut lapsed = Vec::new();
        while let Some((until_ms, name)) = self.index.leases.first().cloned() {
            if until_ms > at_ms {
                break;
            }
            self.index.leases.remove(&(until_ms, name.clone()));
            self.state.nodes.update(&name, |entry| {
                entry.node.readiness = Readiness::NotReady;
                if let Some(lease) = entry.lease.as_mut() {
                    lease.state = LeaseState::Lapsed;
                }
            });
            lapsed.push(name);
        }
        lapsed
    }

    fn heartbeat(
        &mut self,
        at_ms: u64,
        node: &str,
        ready: bool,
        lease_ms: u64,
    ) -> Result<LedgerReply, LedgerError> {
        if !(NODE_LEASE_MS_MIN..=NODE_LEASE_MS_MAX).contains(&lease_ms) {
            return Err(LedgerError::InvalidLease { lease_ms });
        }
        let readiness = if ready {
            Readiness::Ready
        } else {
            Readiness::NotReady
        };
        let lease = NodeLease {
            renewed_at_ms: at_ms,
            lease_ms,
            state: LeaseState::Live,
        };
        let previous = self.update_known(node, |entry| {
            entry.node.readiness = readiness;
            entry.lease.replace(lease)
        })?;
        if let Some(old) = previous.filter(|l| l.state == LeaseState::Live) {
            self.index
                .leases
                .remove(&(old.until_ms(), node.to_string()));
        }
        self.index
            .leases
            .insert((lease.until_ms(), node.to_string()));
        Ok(LedgerReply::HeartbeatRecorded {
            node: node.to_string(),
            readiness,
            lease_until_ms: lease.until_ms(),
        })
    }

    // ---- devices -----------------------------------------------------------------------

    #[allow(
        clippy::too_many_arguments,
        reason = "the fields of one PublishPool command"
    )]
    fn publish_pool(
        &mut self,
        at_ms: u64,
        node: &str,
        driver: &str,
        pool: &str,
        generation: u64,
        devices: &[Device],
        counter_sets: &[CounterSet],
    ) -> Result<LedgerReply, LedgerError> {
        validate_pool(&FieldPath::root(), driver, pool, devices, counter_sets)
            .and_then(|()| validate_device_reach(&FieldPath::root(), None, devices))
            .map_err(|e| LedgerError::InvalidPool {
                message: e.to_string(),
            })?;
        let published = PoolParts {
            driver,
            name: pool,
            generation,
            devices,
            counter_sets,
        };
        let key = PoolKey {
            driver: driver.to_string(),
            pool: pool.to_string(),
        };
        if self.state.network.reach(&key).is_some() {
            return Err(LedgerError::InvalidPool {
                message: format!(
                    "pool {driver}/{pool} is network-attached already; a node's pool needs its own name"
                ),
            });
        }
        let outcome = self.update_known(node, |entry| {
            let usage = &mut entry.usage;
            usage.devices.publish(node, published, &usage.pods, at_ms)
        })?;
        match outcome {
            Ok((change, evictions)) => Ok(LedgerReply::PoolPublished {
                node: node.to_string(),
                driver: driver.to_string(),
                pool: pool.to_string(),
                generation,
                change,
                evictions,
            }),
            Err(generation) => Err(LedgerError::PoolGenerationReused {
                node: node.to_string(),
                driver: driver.to_string(),
                pool: pool.to_string(),
                generation,
            }),
        }
    }

    fn publish_network_pool(
        &mut self,
        at_ms: u64,
        pool: PoolParts<'_>,
        reach: &PoolReach,
    ) -> Result<LedgerReply, LedgerError> {
        let invalid = |message: String| LedgerError::InvalidPool { message };
        validate_pool(
            &FieldPath::root(),
            pool.driver,
            pool.name,
            pool.devices,
            pool.counter_sets,
        )
        .map_err(|e| invalid(e.to_string()))?;
        reach
            .validate(&FieldPath::root())
            .and_then(|()| validate_device_reach(&FieldPath::root(), Some(reach), pool.devices))
            .map_err(|e| invalid(e.to_string()))?;
        let on_a_node = self.state.nodes.iter().find(|entry| {
            entry.usage.devices.pools.contains_key(&PoolKey {
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
            })
        });
        if let Some(entry) = on_a_node {
            return Err(invalid(format!(
                "pool {}/{} is published by node {} already; a network-attached pool needs its own name",
                pool.driver, pool.name, entry.node.name
            )));
        }
        match self.state.network.publish(pool, reach, at_ms) {
            Ok((change, evictions)) => Ok(LedgerReply::PoolPublished {
                node: String::new(),
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
                generation: pool.generation,
                change,
                evictions: self.placed_here(evictions),
            }),
            Err(generation) => Err(LedgerError::PoolGenerationReused {
                node: String::new(),
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
                generation,
            }),
        }
    }

    /// Withdraws a node's pool, or (empty node) a network-attached one.
    fn withdraw_pool(&mut self, node: &str, driver: &str, pool: &str) -> LedgerReply {
        let key = PoolKey {
            driver: driver.to_string(),
            pool: pool.to_string(),
        };
        // A node that is gone took its pools with it.
        let outcome = if node.is_empty() {
            self.state.network.withdraw(&key)
        } else {
            (self.state.nodes)
                .update(node, |entry| entry.usage.devices.withdraw(&key))
                .unwrap_or(PoolWithdrawal::Absent)
        };
        LedgerReply::PoolWithdrawn {
            node: node.to_string(),
            driver: driver.to_string(),
            pool: pool.to_string(),
            outcome,
        }
    }

    fn set_observed_network_holds(
        &mut self,
        holds: &[NetworkHold],
    ) -> Result<LedgerReply, LedgerError> {
        validate_observed_network_holds(holds)?;
        let conflicts = self.state.network.set_observed(holds);
        Ok(LedgerReply::ObservedNetworkHoldsSet {
            held: holds.len() as u32,
            conflicts,
        })
    }

    /// The evictions of network devices' holders placed on this shard, naming their
    /// nodes (the other holders' own shards evict them).
    pub fn placed_here(&self, evictions: Vec<DeviceEviction>) -> Vec<DeviceEviction> {
        evictions
            .into_iter()
            .filter_map(|mut e| {
                e.node = self.index.locations.get(&e.member)?.clone();
                Some(e)
            })
            .collect()
    }

    fn set_device_health(
        &mut self,
        at_ms: u64,
        node: &str,
        reports: &[DeviceHealthReport],
    ) -> Result<LedgerReply, LedgerError> {
        let entry = self.known_node(node)?;
        if let Some(unknown) = reports
            .iter()
            .find(|r| entry.usage.devices.device(&r.device).is_none())
        {
            return Err(LedgerError::UnknownDevice {
                node: node.to_string(),
                device: unknown.device.clone(),
            });
        }
        let outcome = self.state.nodes.update(node, |entry| {
            let usage = &mut entry.usage;
            usage.devices.set_health(node, reports, &usage.pods, at_ms)
        });
        match outcome {
            Some(Ok(evictions)) => Ok(LedgerReply::DeviceHealthRecorded {
                node: node.to_string(),
                evictions,
            }),
            Some(Err(device)) => Err(LedgerError::UnknownDevice {
                node: node.to_string(),
                device,
            }),
            None => Err(LedgerError::UnknownNode {
                name: node.to_string(),
            }),
        }
    }

    fn set_device_taints(
        &mut self,
        at_ms: u64,
        node: &str,
        device: &DeviceId,
        taints: &[DeviceTaint],
    ) -> Result<LedgerReply, LedgerError> {
        let path = FieldPath::new("taints");
        let invalid = |message: String| LedgerError::InvalidTaints { message };
        if taints.len() > DEVICE_TAINTS_MAX {
            return Err(invalid(format!(
                "{path}: at most {DEVICE_TAINTS_MAX} taints per device, got {}",
                taints.len()
            )));
        }
        for (i, taint) in taints.iter().enumerate() {
            validate_device_taint(&path.index(i), taint).map_err(|e| invalid(e.to_string()))?;
        }
        if node.is_empty() {
            // A device of a network-attached pool, kept by every shard.
            let evictions = self
                .state
                .network
                .set_rule_taints(device, taints, at_ms)
                .map_err(|device| LedgerError::UnknownDevice {
                    node: String::new(),
                    device,
                })?;
            return Ok(LedgerReply::DeviceTaintsSet {
                node: String::new(),
                device: device.clone(),
                evictions: self.placed_here(evictions),
            });
        }
        let entry = self.known_node(node)?;
        if entry.usage.devices.device(device).is_none() {
            return Err(LedgerError::UnknownDevice {
                node: node.to_string(),
                device: device.clone(),
            });
        }
        let evictions = self
            .state
            .nodes
            .update(node, |entry| {
                let usage = &mut entry.usage;
                usage
                    .devices
                    .set_rule_taints(node, device, taints, &usage.pods, at_ms)
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        Ok(LedgerReply::DeviceTaintsSet {
            node: node.to_string(),
            device: device.clone(),
            evictions,
        })
    }

    fn agent_disconnected(
        &mut self,
        node: &str,
        since_ms: u64,
        grace_ms: Option<u64>,
    ) -> Result<LedgerReply, LedgerError> {
        let grace_ms = grace_ms.unwrap_or(AGENT_GRACE_MS_DEFAULT);
        let link = self.update_known(node, |entry| {
            let devices = &mut entry.usage.devices;
            if devices.agent == AgentLink::Connected {
                devices.set_agent(AgentLink::Disconnected { since_ms, grace_ms });
            }
            devices.agent
        })?;
        if let AgentLink::Disconnected { .. } = link {
            self.index.disconnected.insert(node.to_string());
        }
        Ok(LedgerReply::AgentLinkRecorded {
            node: node.to_string(),
            link,
        })
    }

    fn agent_connected(&mut self, node: &str) -> Result<LedgerReply, LedgerError> {
        let link = self.update_known(node, |entry| {
            entry.usage.devices.set_agent(AgentLink::Connected);
            entry.usage.devices.agent
        })?;
        self.index.disconnected.remove(node);
        Ok(LedgerReply::AgentLinkRecorded {
            node: node.to_string(),
            link,
        })
    }

    fn put_device_class(&mut self, class: &DeviceClass) -> Result<LedgerReply, LedgerError> {
        class
            .validate(&FieldPath::root())
            .map_err(|e| LedgerError::InvalidDeviceClass {
                message: e.to_string(),
            })?;
        let change = match self
            .state
            .device_classes
            .insert(class.name.clone(), class.clone())
        {
            Some(_) => NodeChange::Updated,
            None => NodeChange::Added,
        };
        Ok(LedgerReply::DeviceClassStored {
            name: class.name.clone(),
            change,
        })
    }

    fn remove_device_class(&mut self, name: &str) -> LedgerReply {
        let presence = match self.state.device_classes.remove(name) {
            Some(_) => Presence::Removed,
            None => Presence::Absent,
        };
        LedgerReply::DeviceClassRemoved {
            name: name.to_string(),
            presence,
        }
    }

    /// Records how a transaction ended, forgetting the oldest record beyond the bound.
    fn finish(&mut self, txn_id: TxnId, outcome: TxnOutcome, at_ms: u64, refusals: Vec<Refusal>) {
        let seq = self.state.next_seq;
        self.state.next_seq = seq.saturating_add(1);
        let record = FinishedTxn {
            seq,
            outcome,
            at_ms,
            refusals,
        };
        if let Some(old) = self.state.finished.insert(txn_id, record) {
            self.index.finish_order.remove(&old.seq);
        }
        self.index.finish_order.insert(seq, txn_id);
        while self.state.finished.len() > FINISHED_TXNS_MAX {
            let Some((_, oldest)) = self.index.finish_order.pop_first() else {
                break;
            };
            self.state.finished.remove(&oldest);
        }
    }

    // ---- reads -------------------------------------------------------------------------

    /// A node and its usage.
    pub fn node(&self, name: &str) -> Option<&NodeEntry> {
        self.state.nodes.get(name)
    }

    /// All nodes with usage, in name order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeEntry> {
        self.state.nodes.iter()
    }

    /// The network-attached pools and their holds.
    pub fn network_pools(&self) -> &NetworkPools {
        &self.state.network
    }

    /// Open transactions, by id.
    pub fn open_txns(&self) -> &BTreeMap<TxnId, OpenTxn> {
        &self.state.open
    }

    /// Victims of committed preemptions whose pods may still run, by member.
    pub fn evicting(&self) -> &BTreeMap<MemberKey, EvictingVictim> {
        &self.state.evicting
    }

    /// The (transaction, node) pairs where a committed preemption's victims may still
    /// run: that transaction's members there wait to be bound until they are gone.
    pub fn victims_running(&self) -> BTreeSet<(TxnId, &str)> {
        self.state
            .evicting
            .values()
            .map(|v| (v.txn_id, v.node.as_str()))
            .collect()
    }

    /// How a remembered transaction ended.
    pub fn outcome(&self, txn_id: TxnId) -> Option<TxnOutcome> {
        self.state.finished.get(&txn_id).map(|done| done.outcome)
    }

    /// The device classes, by name.
    pub fn device_classes(&self) -> &BTreeMap<String, DeviceClass> {
        &self.state.device_classes
    }

    /// Who holds `device` on `node`: each reserved, committed or bound member with the
    /// allocation that names it (admin access and detached allocations included).
    pub fn holders_of(
        &self,
        node: &str,
        device: &DeviceId,
    ) -> Vec<(&MemberKey, &crate::model::claim::DeviceAllocation)> {
        let Some(entry) = self.state.nodes.get(node) else {
            return Vec::new();
        };
        entry
            .usage
            .pods
            .iter()
            .flat_map(|(member, slot)| {
                slot.pod
                    .devices
                    .iter()
                    .filter(|a| a.device == *device)
                    .map(move |a| (member, a))
            })
            .collect()
    }

    /// Number of remembered finished transactions.
    pub fn finished_count(&self) -> usize {
        self.state.finished.len()
    }

    /// The node holding a member, if any.
    pub fn member_node(&self, member: &MemberKey) -> Option<&str> {
        self.index.locations.get(member).map(String::as_str)
    }

    /// A member's slot, if held.
    pub fn slot(&self, member: &MemberKey) -> Option<&PodSlot> {
        let node = self.index.locations.get(member)?;
        self.state.nodes.get(node)?.usage.pods.get(member)
    }

    /// Sum of reserved footprints over all nodes.
    pub fn total_reserved(&self) -> Resources {
        self.state
            .nodes
            .iter()
            .fold(Resources::zero(), |acc, entry| {
                acc.saturating_add(&entry.usage.reserved)
            })
    }

    // ---- snapshots ---------------------------------------------------------------------

    /// The replicated state in the default (binary) format; identical states give
    /// identical bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_as(WireFormat::Binary)
    }

    /// The replicated state in `format`; identical states give identical bytes.
    pub fn snapshot_as(&self, format: WireFormat) -> Vec<u8> {
        // Every map key is a string or an integer, so encoding cannot fail.
        format
            .encode(&self.state)
            .expect("ledger state always encodes")
    }

    /// Rebuilds a ledger from [`ShardLedger::snapshot`] bytes (either format of
    /// `wire`), checking every invariant.
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let stored: StoredState =
            wire::decode(bytes).map_err(|e| SnapshotError::Decode(e.to_string()))?;
        if stored.format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format {
                found: stored.format,
            });
        }
        let state = stored.into_state()?;
        let index = Indexes::build(&state);
        let ledger = Self {
            state,
            index,
            hand_over: HandOver::default(),
        };
        ledger.check_invariants()?;
        Ok(ledger)
    }

    // ---- invariants --------------------------------------------------------------------

    /// Checks every ledger invariant (I2 and the bookkeeping that I5 rests on).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        if !self.state.nodes.in_step() {
            return Err(InvariantViolation("node summaries out of step".to_string()));
        }
        for entry in self.state.nodes.iter() {
            self.check_node(&entry.node.name, entry)?;
            if entry.moving != self.state.fences.get(&entry.node.name).copied() {
                return Err(InvariantViolation(format!(
                    "node {}: fenced by {:?}, the fences say {:?}",
                    entry.node.name,
                    entry.moving,
                    self.state.fences.get(&entry.node.name)
                )));
            }
            if self.state.moved_nodes.contains_key(&entry.node.name) {
                return Err(InvariantViolation(format!(
                    "node {} is here and tombstoned as moved",
                    entry.node.name
                )));
            }
        }
        for (txn_id, open) in &self.state.open {
            self.check_open(*txn_id, open)?;
        }
        self.check_network()?;
        self.check_evicting()?;
        self.check_records()
    }

    fn check_node(&self, name: &str, entry: &NodeEntry) -> Result<(), InvariantViolation> {
        let fail = |what: String| Err(InvariantViolation(format!("node {name}: {what}")));
        if entry.node.name != name {
            return fail(format!("keyed under the wrong name {}", entry.node.name));
        }
        let sums = entry.usage.recomputed();
        if sums != entry.usage.sums() {
            return fail("usage sums differ from its slots".to_string());
        }
        let Some(total) = sums.reserved.checked_add(&sums.committed) else {
            return fail("usage overflows".to_string());
        };
        if let Some(resource) = total.shortfall(&entry.node.allocatable) {
            return fail(format!("I2: {resource} held exceeds allocatable"));
        }
        if let Err(what) = entry.usage.devices.check(&entry.usage.pods) {
            return fail(what);
        }
        let network = &self.state.network;
        if let Err(what) = entry.usage.check_shares(|m, c| network.uses(m, c)) {
            return fail(what);
        }
        let mut ports = BTreeSet::new();
        for (member, slot) in &entry.usage.pods {
            if slot.pod.host_ports.iter().any(|p| !ports.insert(*p)) {
                return fail(format!("host port of {member} held twice"));
            }
            self.check_slot(name, member, slot)?;
        }
        Ok(())
    }

    fn check_slot(
        &self,
        node: &str,
        member: &MemberKey,
        slot: &PodSlot,
    ) -> Result<(), InvariantViolation> {
        let Some(txn_id) = slot.state.txn_id() else {
            return if member.gang == OBSERVED_GANG {
                Ok(())
            } else {
                Err(InvariantViolation(format!(
                    "observed pod {member} on {node} is not keyed as one"
                )))
            };
        };
        let open_node = self
            .state
            .open
            .get(&txn_id)
            .and_then(|open| open.members.get(member));
        let consistent = match slot.state {
            SlotState::Reserved { .. } => open_node.map(String::as_str) == Some(node),
            SlotState::Committed { .. } | SlotState::Bound { .. } | SlotState::Observed => {
                !self.state.open.contains_key(&txn_id)
            }
        };
        if consistent {
            Ok(())
        } else {
            Err(InvariantViolation(format!(
                "member {member} on {node} disagrees with {txn_id}"
            )))
        }
    }

    fn check_open(&self, txn_id: TxnId, open: &OpenTxn) -> Result<(), InvariantViolation> {
        if self.state.finished.contains_key(&txn_id) {
            return Err(InvariantViolation(format!(
                "{txn_id} is both open and finished"
            )));
        }
        for (member, node) in &open.members {
            let held = self
                .state
                .nodes
                .get(node)
                .and_then(|entry| entry.usage.pods.get(member))
                .is_some_and(|slot| slot.state == SlotState::Reserved { txn_id });
            if !held {
                return Err(InvariantViolation(format!(
                    "{txn_id} lists {member} on {node}, which does not hold it"
                )));
            }
        }
        for (victim, displaced) in &open.displaced {
            if self.index.locations.contains_key(victim) {
                return Err(InvariantViolation(format!(
                    "{txn_id} displaced {victim}, which is also held"
                )));
            }
            let room_held = open.members.values().any(|node| *node == displaced.node);
            if !room_held {
                return Err(InvariantViolation(format!(
                    "{txn_id} displaced {victim} from {}, where it holds nothing",
                    displaced.node
                )));
            }
        }
        Ok(())
    }

    /// I1 for network-attached devices, and every hold in step with its transaction.
    fn check_network(&self) -> Result<(), InvariantViolation> {
        let network = &self.state.network;
        network.check().map_err(InvariantViolation)?;
        for (member, slot) in network.holds() {
            let Some(txn_id) = slot.state.txn_id() else {
                continue;
            };
            let listed = self
                .state
                .open
                .get(&txn_id)
                .is_some_and(|open| open.network.contains(member));
            if slot.state.is_reserved() != listed {
                return Err(InvariantViolation(format!(
                    "network hold of {member} disagrees with {txn_id}"
                )));
            }
        }
        for (txn_id, open) in &self.state.open {
            if let Some(member) = open.network.iter().find(|m| {
                network.hold_of(m).map(|s| s.state) != Some(SlotState::Reserved { txn_id: *txn_id })
            }) {
                return Err(InvariantViolation(format!(
                    "{txn_id} lists network devices of {member}, which are not held for it"
                )));
            }
        }
        Ok(())
    }

    fn check_evicting(&self) -> Result<(), InvariantViolation> {
        match self
            .state
            .evicting
            .iter()
            .find(|(_, v)| self.state.open.contains_key(&v.txn_id))
        {
            Some((victim, v)) => Err(InvariantViolation(format!(
                "{victim} is evicting for {}, which is still open",
                v.txn_id
            ))),
            None => Ok(()),
        }
    }

    fn check_records(&self) -> Result<(), InvariantViolation> {
        if self.state.finished.len() > FINISHED_TXNS_MAX {
            return Err(InvariantViolation("too many finished records".to_string()));
        }
        if self
            .state
            .finished
            .values()
            .any(|done| done.seq >= self.state.next_seq)
        {
            return Err(InvariantViolation(
                "finished record from the future".to_string(),
            ));
        }
        if self.index.finish_order.len() != self.state.finished.len() {
            return Err(InvariantViolation(
                "two finished records share a sequence number".to_string(),
            ));
        }
        let slots: usize = self.state.nodes.iter().map(|e| e.usage.pods.len()).sum();
        if self.index.locations.len() != slots {
            return Err(InvariantViolation(
                "a member is held on two nodes".to_string(),
            ));
        }
        if Indexes::build(&self.state) != self.index {
            return Err(InvariantViolation(
                "derived indexes out of step".to_string(),
            ));
        }
        Ok(())
    }
}

/// Whether `held` is the reserved `asked` pod, but for shared-claim allocations a
/// departed carrier handed to it since (a retried reservation is still the same one).
fn same_pod_but_handed_over(held: &PodSummary, asked: &PodSummary) -> bool {
    if held == asked {
        return true;
    }
    if asked.shares.is_empty() || held.devices.len() <= asked.devices.len() {
        return false;
    }
    let followed: BTreeSet<&str> = asked.followed().map(|s| s.pod_claim.as_str()).collect();
    let mut trimmed = held.clone();
    trimmed
        .devices
        .retain(|d| !followed.contains(d.claim.as_str()));
    trimmed == *asked
}

/// Gives the shared-claim allocations a forgotten displaced victim (`gone`) carried to
/// the first displaced victim of its node that follows the claim, so that an ABORT
/// puts the claim back with its devices (as `NodeUsage::take` does on a node).
fn hand_over_displaced(displaced: &mut BTreeMap<MemberKey, DisplacedSlot>, gone: &DisplacedSlot) {
    for share in gone.slot.pod.carried() {
        let heir = displaced
            .values_mut()
            .find(|d| d.node == gone.node && d.slot.pod.followed().any(|s| s.claim == share.claim));
        let Some(d) = heir else {
            continue;
        };
        if let Some(moved) = gone.slot.pod.handed_to(share, &d.slot.pod) {
            d.slot.pod.devices.extend(moved);
        }
    }
}

/// A shared claim some of `victims` use on their node while another pod there (no
/// victim) uses it too, with one such victim: its devices would stay in use, so the
/// victims' room could not be what they leave.
fn split_claim<'v>(
    victims: &[(&'v MemberKey, &PodSlot)],
    usage: &NodeUsage,
) -> Option<(&'v MemberKey, String)> {
    let is_victim = |key: &MemberKey| victims.iter().any(|(v, _)| *v == key);
    let kept: BTreeSet<&str> = usage
        .pods
        .iter()
        .filter(|(key, _)| !is_victim(key))
        .flat_map(|(_, slot)| slot.pod.shares.iter().map(|s| s.claim.as_str()))
        .collect();
    victims.iter().find_map(|(key, slot)| {
        slot.pod
            .shares
            .iter()
            .find(|s| kept.contains(s.claim.as_str()))
            .map(|s| (*key, s.claim.clone()))
    })
}

fn finished_answer(txn_id: TxnId, done: &FinishedTxn, hold: Hold) -> LedgerReply {
    match (done.outcome, hold) {
        (TxnOutcome::Refused, _) => LedgerReply::ReserveRefused {
            txn_id,
            refusals: done.refusals.clone(),
        },
        (TxnOutcome::Committed, Hold::CommitNow) => LedgerReply::Committed { txn_id },
        (outcome, _) => LedgerReply::AlreadyFinished { txn_id, outcome },
    }
}

/// The checks of `cmd` that need no state: a batch within bounds and not nested,
/// a reservation that is well formed. What passes may still be refused by `apply`.
/// The one node an operation names, for those that act on a single node.
fn node_named(op: &LedgerOp) -> Option<&str> {
    match op {
        LedgerOp::RegisterNode { node } | LedgerOp::AddNode { node } => Some(&node.name),
        LedgerOp::RemoveNode { name } => Some(name),
        LedgerOp::WithdrawPool { node, .. } if node.is_empty() => None,
        LedgerOp::NodeHeartbeat { node, .. }
        | LedgerOp::SetObservedPods { node, .. }
        | LedgerOp::PublishPool { node, .. }
        | LedgerOp::WithdrawPool { node, .. }
        | LedgerOp::SetDeviceHealth { node, .. }
        | LedgerOp::SetDeviceTaints { node, .. }
        | LedgerOp::AgentDisconnected { node, .. }
        | LedgerOp::AgentConnected { node } => Some(node),
        _ => None,
    }
}

pub fn admit(cmd: &LedgerCommand) -> Result<(), LedgerError> {
    match &cmd.op {
        LedgerOp::Batch { ops } if ops.len() > LEDGER_BATCH_MAX => {
            Err(LedgerError::BatchTooLarge { ops: ops.len() })
        }
        LedgerOp::Batch { ops } if ops.iter().any(|op| matches!(op, LedgerOp::Batch { .. })) => {
            Err(LedgerError::NestedBatch)
        }
        LedgerOp::VictimsGone { members } if members.len() > LEDGER_BATCH_MAX => {
            Err(LedgerError::BatchTooLarge { ops: members.len() })
        }
        LedgerOp::Reserve {
            txn_id,
            members,
            deadline_ms,
            network,
        } => validate_reservation(
            cmd.at_ms,
            *txn_id,
            members,
            network,
            Hold::Until(*deadline_ms),
        ),
        LedgerOp::ReserveAndCommit {
            txn_id,
            members,
            network,
        } => validate_reservation(cmd.at_ms, *txn_id, members, network, Hold::CommitNow),
        LedgerOp::ReserveDisplacing {
            txn_id,
            members,
            victims,
            deadline_ms,
        } => validate_displacing(cmd.at_ms, *txn_id, members, victims, *deadline_ms),
        LedgerOp::FenceNodes { nodes, .. } if nodes.len() > MOVE_NODES_MAX => {
            Err(LedgerError::MoveTooLarge { nodes: nodes.len() })
        }
        LedgerOp::Adopt { parcel } if parcel.nodes.len() > MOVE_NODES_MAX => {
            Err(LedgerError::MoveTooLarge {
                nodes: parcel.nodes.len(),
            })
        }
        _ => Ok(()),
    }
}

fn validate_reservation(
    at_ms: u64,
    txn_id: TxnId,
    members: &[ReserveMember],
    network: &[NetworkHold],
    hold: Hold,
) -> Result<(), LedgerError> {
    if members.is_empty() && network.is_empty() {
        return Err(LedgerError::EmptyReservation { txn_id });
    }
    validate_network_holds(txn_id, network)?;
    validate_claim_users(txn_id, members, network)?;
    if let Hold::Until(deadline_ms) = hold {
        validate_deadline(at_ms, txn_id, deadline_ms)?;
    }
    let mut seen = BTreeSet::new();
    for m in members {
        if members.len() > 1 && !seen.insert(&m.member) {
            return Err(LedgerError::DuplicateMember {
                txn_id,
                member: m.member.clone(),
            });
        }
        validate_summary(txn_id, m)?;
    }
    Ok(())
}

/// Checks a reservation's network holds: bounded, members valid and distinct, each
/// holding at least one valid allocation.
fn validate_network_holds(txn_id: TxnId, network: &[NetworkHold]) -> Result<(), LedgerError> {
    if network.len() > LEDGER_BATCH_MAX {
        return Err(LedgerError::BatchTooLarge { ops: network.len() });
    }
    let mut seen = BTreeSet::new();
    for hold in network {
        let invalid = |message: String| LedgerError::InvalidMember {
            txn_id,
            member: hold.member.clone(),
            message,
        };
        hold.member.validate().map_err(|e| invalid(e.to_string()))?;
        if hold.member.gang == CLAIM_GANG || hold.member.gang == OBSERVED_GANG {
            return Err(invalid(format!(
                "gang {} is reserved for gangway's own keys",
                hold.member.gang
            )));
        }
        if !seen.insert((&hold.member, &hold.claim)) {
            return Err(LedgerError::DuplicateMember {
                txn_id,
                member: hold.member.clone(),
            });
        }
        if let Some(claim) = &hold.claim {
            if let Err(e) = validate_shares(
                &FieldPath::new("network").child("claim"),
                &[crate::model::claim::ClaimShare {
                    pod_claim: "claim".into(),
                    claim: claim.clone(),
                }],
            ) {
                return Err(invalid(e.to_string()));
            }
        } else if hold.devices.is_empty() {
            return Err(invalid("its network hold names no device".into()));
        }
        validate_allocations(&FieldPath::new("network").child("devices"), &hold.devices)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(())
}

/// Checks that each shared claim a reservation's network holds carry or use is shared
/// by the member's pod, for the members placed on this shard (the others' own shards
/// check theirs).
fn validate_claim_users(
    txn_id: TxnId,
    members: &[ReserveMember],
    network: &[NetworkHold],
) -> Result<(), LedgerError> {
    for hold in network {
        let (HoldKind::Carry(claim) | HoldKind::Use(claim)) = hold.kind() else {
            continue;
        };
        let Some(m) = members.iter().find(|m| m.member == hold.member) else {
            continue;
        };
        if !m.pod.shares.iter().any(|s| s.claim == claim) {
            return Err(LedgerError::InvalidMember {
                txn_id,
                member: hold.member.clone(),
                message: format!(
                    "network.claim: its pod does not share ResourceClaim {claim} (pod.shares)"
                ),
            });
        }
    }
    Ok(())
}

/// Checks other schedulers' network holds: bounded, keyed as observed, distinct, each
/// with valid allocations.
fn validate_observed_network_holds(holds: &[NetworkHold]) -> Result<(), LedgerError> {
    if holds.len() > OBSERVED_NETWORK_HOLDS_MAX {
        return Err(LedgerError::BatchTooLarge { ops: holds.len() });
    }
    let mut seen = BTreeSet::new();
    for hold in holds {
        let invalid = |message: String| LedgerError::InvalidObservedPod {
            node: String::new(),
            message: format!("network hold {}: {message}", hold.member),
        };
        hold.member.validate().map_err(|e| invalid(e.to_string()))?;
        if hold.member.gang != OBSERVED_GANG {
            return Err(invalid(format!("must be keyed in gang {OBSERVED_GANG}")));
        }
        if !seen.insert(&hold.member) {
            return Err(invalid("listed twice".into()));
        }
        if hold.devices.is_empty() {
            return Err(invalid("names no device".into()));
        }
        validate_allocations(&FieldPath::new("devices"), &hold.devices)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(())
}

/// A deadline after the command's time and at most [`RESERVE_HOLD_MS_MAX`] after it.
fn validate_deadline(at_ms: u64, txn_id: TxnId, deadline_ms: u64) -> Result<(), LedgerError> {
    if deadline_ms <= at_ms {
        return Err(LedgerError::DeadlinePassed {
            txn_id,
            deadline_ms,
            at_ms,
        });
    }
    if deadline_ms - at_ms > RESERVE_HOLD_MS_MAX {
        return Err(LedgerError::HoldTooLong {
            txn_id,
            deadline_ms,
            at_ms,
        });
    }
    Ok(())
}

/// Checks a preemption's reservation: what a reservation needs (members may be empty
/// when victims are not), victims distinct, valid, not placeholders and not members.
fn validate_displacing(
    at_ms: u64,
    txn_id: TxnId,
    members: &[ReserveMember],
    victims: &[MemberKey],
    deadline_ms: u64,
) -> Result<(), LedgerError> {
    if victims.is_empty() && members.is_empty() {
        return Err(LedgerError::EmptyReservation { txn_id });
    }
    validate_deadline(at_ms, txn_id, deadline_ms)?;
    for m in members {
        if displace::is_placeholder(&m.member) {
            return Err(LedgerError::InvalidMember {
                txn_id,
                member: m.member.clone(),
                message: "a member may not be keyed as a placeholder".into(),
            });
        }
    }
    if !members.is_empty() {
        validate_reservation(at_ms, txn_id, members, &[], Hold::Until(deadline_ms))?;
    }
    let mut seen = BTreeSet::new();
    for v in victims {
        let bad = v.validate().is_err()
            || displace::is_placeholder(v)
            || members.iter().any(|m| m.member == *v);
        if bad || !seen.insert(v) {
            return Err(LedgerError::DuplicateMember {
                txn_id,
                member: v.clone(),
            });
        }
    }
    Ok(())
}

/// Checks an observed pod list: bounded, keys valid and distinct, summaries sane.
fn validate_observed(node: &str, pods: &[ObservedPod]) -> Result<(), LedgerError> {
    let invalid = |message: String| LedgerError::InvalidObservedPod {
        node: node.to_string(),
        message,
    };
    if pods.len() > OBSERVED_PODS_PER_NODE_MAX {
        return Err(invalid(format!(
            "pods: {} on one node, at most {OBSERVED_PODS_PER_NODE_MAX}",
            pods.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for (i, p) in pods.iter().enumerate() {
        let key = p.member_key();
        key.validate()
            .map_err(|e| invalid(format!("pods[{i}]: {e}")))?;
        if !seen.insert(key) {
            return Err(invalid(format!("pods[{i}].uid: {} listed twice", p.uid)));
        }
        let at = FieldPath::new("pods").index(i).child("pod");
        validate_allocations(&at.child("devices"), &p.pod.devices)
            .map_err(|e| invalid(e.to_string()))?;
        // Another scheduler's pods carry what their claims hold (a shared claim's once,
        // by the caller's choice); carrying and following is for gangway's own pods.
        if !p.pod.shares.is_empty() {
            return Err(invalid(format!(
                "{}: an observed pod lists no shared claims",
                at.child("shares")
            )));
        }
        p.pod
            .requests
            .validate(&at.child("requests"))
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(())
}

fn validate_summary(txn_id: TxnId, m: &ReserveMember) -> Result<(), LedgerError> {
    let invalid = |message: String| LedgerError::InvalidMember {
        txn_id,
        member: m.member.clone(),
        message,
    };
    m.member.validate().map_err(|e| invalid(e.to_string()))?;
    if !m.pod.devices.is_empty() {
        validate_allocations(&FieldPath::new("pod").child("devices"), &m.pod.devices)
            .map_err(|e| invalid(e.to_string()))?;
    }
    if !m.pod.shares.is_empty() {
        validate_shares(&FieldPath::new("pod").child("shares"), &m.pod.shares)
            .map_err(|e| invalid(e.to_string()))?;
    }
    // Only extended resources can be invalid, and only errors need the path.
    if m.pod.requests.extended.is_empty() && m.pod.requests.pods == 0 {
        return Ok(());
    }
    let path = FieldPath::new("pod").child("requests");
    m.pod
        .requests
        .validate(&path)
        .map_err(|e| invalid(e.to_string()))?;
    if m.pod.requests.pods != 0 {
        return Err(invalid(format!(
            "{path}.pods: every pod counts as one; leave it zero"
        )));
    }
    Ok(())
}

impl LedgerView for ShardLedger {
    fn node_views(&self) -> Vec<NodeView<'_>> {
        self.state
            .nodes
            .iter()
            .map(|entry| NodeView {
                node: &entry.node,
                usage: &entry.usage,
            })
            .collect()
    }

    fn node_view(&self, name: &str) -> Option<NodeView<'_>> {
        self.state.nodes.get(name).map(|entry| NodeView {
            node: &entry.node,
            usage: &entry.usage,
        })
    }

    fn indexed(&self) -> Option<IndexedView<'_>> {
        Some(self.state.nodes.view())
    }

    fn device_classes(&self) -> &BTreeMap<String, DeviceClass> {
        &self.state.device_classes
    }

    fn network(&self) -> Option<&NetworkPools> {
        let network = &self.state.network;
        network.pools().next().is_some().then_some(network)
    }
}
