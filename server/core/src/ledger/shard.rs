//! The shard ledger: the deterministic state machine of one shard group.
//!
//! This file holds the state, the command dispatch and the helpers every part shares;
//! the `impl` is split by responsibility into `shard/nodes.rs`, `reserve.rs` (phase 1),
//! `decide.rs` (phase 2), `placements.rs`, `devices.rs`, `reads.rs`, `snapshot.rs`,
//! `invariants.rs`, `handoff.rs` (shard moves) and `validate.rs` (checks that need no
//! state).
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
use crate::model::compact::SymbolTable;
use crate::model::device::{
    validate_device_reach, validate_device_taint, validate_pool, CounterSet, Device, DeviceClass,
    DeviceId, DeviceTaint, DEVICE_TAINTS_MAX,
};
use crate::model::error::FieldPath;
use crate::model::gang::MemberKey;
use crate::model::node::{Node, Readiness};
use crate::model::pod::{PodBinding, PodSummary};
use crate::model::reach::PoolReach;
use crate::model::resources::Resources;
use crate::wire::{self, WireFormat};

/// Most finished transactions remembered for idempotent retries; the oldest finished is
/// forgotten first. A retry of a transaction forgotten this way is answered as unknown
/// (commit) or by its live placements (abort of a committed one is still refused).
pub const FINISHED_TXNS_MAX: usize = 10_000;
mod decide;
mod devices;
mod handoff;
#[cfg(test)]
mod handoff_tests;
mod invariants;
mod member_set;
mod nodes;
mod placements;
mod reads;
mod reserve;
mod snapshot;
mod validate;
mod wake;
pub use handoff::ADOPTED_MOVES_MAX;
pub use validate::admit;
use validate::{
    validate_displacing, validate_observed, validate_observed_network_holds, validate_reservation,
};
pub use wake::Wake;

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
/// [`NodeTable::update`], `insert`, `replace_node` or `remove`, which keep them in step.
/// Nodes come in through `insert` and `replace_node` only, which intern their labels and
/// devices in `symbols` (as does `intern_devices_of`, after a pool is published): a label,
/// attribute or device name the fleet repeats is kept once (not state either).
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
    symbols: SymbolTable,
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

    /// Replaces the node of the entry with the same name (if any), labels interned.
    fn replace_node(&mut self, node: &Node) {
        let mut node = node.clone();
        self.symbols.intern_map(&mut node.labels);
        self.update(&node.name.clone(), |entry| entry.node = node);
    }

    /// Shares the repeated strings of the devices of `name` (if registered) with the
    /// table's other devices; what they encode does not change, so the summary and
    /// stamp stay.
    fn intern_devices_of(&mut self, name: &str) {
        let Ok(i) = self.position(name) else {
            return;
        };
        if let Some(entry) = self.entries.get_mut(i) {
            entry.usage.devices.intern(&mut self.symbols);
        }
    }

    /// Adds a node that is not in the table yet, labels and devices interned.
    fn insert(&mut self, mut entry: NodeEntry) {
        let Err(i) = self.position(&entry.node.name) else {
            return;
        };
        self.symbols.intern_map(&mut entry.node.labels);
        entry.usage.devices.intern(&mut self.symbols);
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
    by_txn: BTreeMap<TxnId, member_set::MemberSet>,
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
            LedgerOp::BindConfirmed { member, uid } => {
                self.bind_confirmed(at_ms, member, uid.as_deref())
            }
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
            LedgerOp::BindConfirmed { member, .. } => of_members(&mut std::iter::once(member)),
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
