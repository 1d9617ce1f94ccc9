//! Commands a shard ledger applies and the replies it gives.
//!
//! Owns the replicated vocabulary of a shard group: [`LedgerCommand`] (a leader timestamp
//! plus one [`LedgerOp`]), [`LedgerReply`], refusals (a reserve's "no" vote) and
//! [`LedgerError`] (bad input, answered without changing state). Invariant: everything
//! here is plain serde data with deterministic encoding, so a command logged on one
//! replica applies identically on all of them. Called by the shard service (which logs
//! commands) and by [`crate::ledger::ShardLedger::apply`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ledger::devices::{
    AgentLink, DeviceEviction, DeviceHealthReport, PoolChange, PoolWithdrawal,
};
use crate::ledger::usage::ObservedConflicts;
use crate::model::claim::DeviceAllocation;
use crate::model::device::{
    CounterSet, Device, DeviceClass, DeviceId, DeviceTaint, DeviceTaintEffect,
};
use crate::model::gang::MemberKey;
use crate::model::node::{Node, Readiness};
use crate::model::pod::{HostPort, PodSummary};
use crate::model::reach::PoolReach;
use crate::model::resources::ResourceName;

/// Most operations in one ledger batch.
pub const LEDGER_BATCH_MAX: usize = 1_024;
/// Shortest node lease a heartbeat may ask for, in ms.
pub const NODE_LEASE_MS_MIN: u64 = 1_000;
/// Longest node lease a heartbeat may ask for, in ms.
pub const NODE_LEASE_MS_MAX: u64 = 10 * 60 * 1_000;
/// Longest a reservation may be held before its deadline, in ms: a coordinator holds
/// one for `RESERVE_TTL_MS`; anything far longer was never sent by one.
pub const RESERVE_HOLD_MS_MAX: u64 = 10 * 60 * 1_000;
/// Most observed pods one node may carry (kubelet's maxPods is at most a few hundred).
pub const OBSERVED_PODS_PER_NODE_MAX: usize = 1_024;
/// Most ResourceClaims of other schedulers holding network-attached devices one
/// `SetObservedNetworkHolds` may carry.
pub const OBSERVED_NETWORK_HOLDS_MAX: usize = 4_096;
/// Most nodes one shard move carries: its parcel is one log entry on the receiving
/// shard, so a zone larger than this moves in several moves.
pub const MOVE_NODES_MAX: usize = 256;
/// Most members a shard remembers as moved away (answered "moved" to a late release
/// instead of "absent"); the oldest move's are forgotten first.
pub const MOVED_MEMBERS_MAX: usize = 100_000;
/// The gang part of an observed pod's key; not a DNS name, so no submitted gang can take it.
pub const OBSERVED_GANG: &str = "~observed";
/// The namespace of the placeholder slots that hold the victims' room during a
/// preemption (`crate::ledger::displace`); no gang namespace can contain `~`.
pub const VICTIM_ROOM_NS: &str = "~victim-room";

/// Transaction id: unique, and the idempotency key of every two-phase step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TxnId(pub u64);

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "txn-{}", self.0)
    }
}

/// One replicated ledger command: the leader's timestamp and the operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCommand {
    /// Leader's wall-clock time in milliseconds when the command was proposed.
    pub at_ms: u64,
    /// The operation.
    pub op: LedgerOp,
}

impl LedgerCommand {
    /// Builds a command.
    pub fn new(at_ms: u64, op: LedgerOp) -> Self {
        Self { at_ms, op }
    }
}

/// One member of a reservation: which pod goes to which node, and what it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveMember {
    /// The member.
    pub member: MemberKey,
    /// Target node.
    pub node: String,
    /// What the ledger keeps of the pod.
    pub pod: PodSummary,
}

/// The network-attached devices one member of a reservation takes (held on every
/// participant of the transaction, docs/ARCHITECTURE.md §5, rule 15), or its use of a
/// shared claim whose devices are network-attached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkHold {
    /// The member.
    pub member: MemberKey,
    /// Its allocations of network-attached devices (of `claim` when that is set; none
    /// when the member uses a shared claim another member carries).
    pub devices: Vec<DeviceAllocation>,
    /// The shared ResourceClaim (`namespace/name`) the devices are allocated to: held
    /// under the claim's key for every pod that uses it, wherever it runs, until the
    /// last one goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// What a [`NetworkHold`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind<'a> {
    /// Network devices of the member's own.
    Own,
    /// The member allocates shared claim `claim` with network devices.
    Carry(&'a str),
    /// The member uses shared claim `claim`, which another member carries.
    Use(&'a str),
}

impl NetworkHold {
    /// What the hold asks.
    pub fn kind(&self) -> HoldKind<'_> {
        match (&self.claim, self.devices.is_empty()) {
            (None, _) => HoldKind::Own,
            (Some(claim), false) => HoldKind::Carry(claim),
            (Some(claim), true) => HoldKind::Use(claim),
        }
    }

    /// The key the devices are held under: the member's own, or the claim's.
    pub fn key(&self) -> MemberKey {
        match self.kind() {
            HoldKind::Own => self.member.clone(),
            HoldKind::Carry(claim) | HoldKind::Use(claim) => claim_key(claim),
        }
    }
}

/// The gang part of a shared claim's key among network holds: not a DNS name, so no
/// submitted gang can take it.
pub const CLAIM_GANG: &str = "~claim";

/// The key a shared claim (`namespace/name`) is held under: `namespace/~claim/name`.
pub fn claim_key(claim: &str) -> MemberKey {
    let (namespace, name) = claim.split_once('/').unwrap_or(("", claim));
    MemberKey::new(namespace, CLAIM_GANG, name)
}

/// A pod another scheduler bound to a node, as the API server shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedPod {
    /// Namespace.
    pub namespace: String,
    /// The pod's uid (unique for all time, so a pod recreated under its name is another pod).
    pub uid: String,
    /// What it takes (its allocated devices from its claims' status).
    pub pod: PodSummary,
}

impl ObservedPod {
    /// Its key in the node's slots: `namespace/~observed/uid`.
    pub fn member_key(&self) -> MemberKey {
        MemberKey::new(self.namespace.clone(), OBSERVED_GANG, self.uid.clone())
    }
}

/// What a release gives back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseTarget {
    /// These committed or bound members (pods deleted or finished).
    Members(Vec<MemberKey>),
    /// Everything a transaction holds: an open one is aborted, a committed one freed.
    Txn(TxnId),
}

/// Nodes a shard hands to another in a move, with everything held on them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parcel {
    /// The move (meta's id).
    pub move_id: u64,
    /// The adopting shard.
    pub to: u32,
    /// The nodes with their usage (pod slots, devices) and leases, in name order.
    pub nodes: Vec<crate::ledger::shard::NodeEntry>,
    /// Kubernetes victims of committed preemptions still evicting from these nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub evicting: BTreeMap<MemberKey, crate::ledger::shard::EvictingVictim>,
    /// Every name the move fenced here, registered or not (the target clears its own
    /// moved tombstones of them: they are its nodes now).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

impl Parcel {
    /// Whether the parcel holds `member` on one of its nodes.
    pub fn holds(&self, member: &MemberKey) -> bool {
        self.nodes.iter().any(|n| n.usage.pods.contains_key(member))
    }
}

/// The operations of a shard ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerOp {
    /// Inserts or updates a node (an update may not shrink allocatable below usage).
    RegisterNode {
        /// The node.
        node: Node,
    },
    /// Inserts a node, or accepts the same node again (an agent that restarted); refuses
    /// one registered with other labels, taints, allocatable or cordon state, naming the
    /// difference (`RegisterNode` is the explicit update).
    AddNode {
        /// The node.
        node: Node,
    },
    /// Renews the node agent's lease and records the node's Ready condition; a lease not
    /// renewed within `lease_ms` makes the node not ready at the first `Tick` after it
    /// (the node lifecycle controller's rule, without its taints).
    NodeHeartbeat {
        /// Node name.
        node: String,
        /// Whether the agent reports the node ready.
        ready: bool,
        /// How long the lease lasts, in ms ([`NODE_LEASE_MS_MIN`]..=[`NODE_LEASE_MS_MAX`]).
        lease_ms: u64,
    },
    /// Replaces the set of pods other schedulers bound to `node` (its observed pods):
    /// they count against the node's free resources, ports and devices, never refused.
    SetObservedPods {
        /// The node.
        node: String,
        /// Every such pod on it now (at most [`OBSERVED_PODS_PER_NODE_MAX`]).
        pods: Vec<ObservedPod>,
    },
    /// Removes a node (and its observed pods); refused while it holds any reservation or
    /// placement.
    RemoveNode {
        /// Node name.
        name: String,
    },
    /// Phase 1: holds every member on its node, all or nothing, until `deadline_ms`.
    Reserve {
        /// Transaction id.
        txn_id: TxnId,
        /// Members and their nodes.
        members: Vec<ReserveMember>,
        /// The network-attached devices of the transaction's members (of every shard).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        network: Vec<NetworkHold>,
        /// When the holder should ask the coordinator for the decision.
        deadline_ms: u64,
    },
    /// Phase 1 of a preemption: takes the `victims` (committed or bound members
    /// here) out of their nodes, holds `members` on the room they leave, and holds
    /// what the members do not take of it for the victims (placeholders), until
    /// `deadline_ms`. COMMIT frees the victims' room; ABORT puts the victims back.
    /// All or nothing (docs/ARCHITECTURE.md §5, rule 14).
    ReserveDisplacing {
        /// Transaction id.
        txn_id: TxnId,
        /// The preemptor's members here and their nodes (may be empty: a shard that
        /// only holds victims).
        members: Vec<ReserveMember>,
        /// The victims' members here.
        victims: Vec<MemberKey>,
        /// When the holder should ask the coordinator for the decision.
        deadline_ms: u64,
    },
    /// Reserve and commit in one entry (a gang group that fits in one shard).
    ReserveAndCommit {
        /// Transaction id.
        txn_id: TxnId,
        /// Members and their nodes.
        members: Vec<ReserveMember>,
        /// The network-attached devices of the transaction's members.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        network: Vec<NetworkHold>,
    },
    /// Phase 2: turns a reservation into placements.
    Commit {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// Phase 2: drops a reservation; on an unknown id, records a tombstone so a late reserve cannot land.
    Abort {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// Gives back placements (or aborts an open transaction).
    Release {
        /// What to release.
        target: ReleaseTarget,
    },
    /// Records that these victims of committed preemptions (Kubernetes pods) are gone
    /// from their nodes: the room the placeholders held for them there is freed once
    /// every victim of that transaction on that node is gone, and the preemptor's
    /// members there may bind. Victims not evicting are answered as absent.
    VictimsGone {
        /// The victims (at most `LEDGER_BATCH_MAX`).
        members: Vec<MemberKey>,
    },
    /// Records that the pod was bound through the Kubernetes API.
    BindConfirmed {
        /// The member.
        member: MemberKey,
        /// The uid of the pod bound, for a member that named its pod and had none
        /// (kept from then on, as an ingested pod's: evictions and releases need it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<String>,
    },
    /// Reports open reservations whose deadline is at or before `at_ms` (it never drops
    /// them), and marks the devices of nodes whose agent's grace period has passed unhealthy.
    Tick,
    /// Publishes one network-attached pool (ResourceSlices with `allNodes` or a
    /// `nodeSelector`), which every shard keeps: generations as for `PublishPool`. The
    /// reply is `PoolPublished` with an empty node, its evictions naming the nodes of the
    /// members placed on this shard.
    PublishNetworkPool {
        /// Driver.
        driver: String,
        /// Pool name.
        pool: String,
        /// Generation.
        generation: u64,
        /// The nodes it serves.
        reach: PoolReach,
        /// Every device of the pool.
        devices: Vec<Device>,
        /// Shared counter sets of the pool.
        counter_sets: Vec<CounterSet>,
    },
    /// Replaces the network-attached devices other schedulers allocated: one hold per
    /// ResourceClaim, keyed `namespace/~observed/claim`, the same list on every shard.
    /// Each is counted as it fits beside gangway's holds and the ones before it; what
    /// does not fit is recorded detached (and answered), and tried again by the next
    /// command.
    SetObservedNetworkHolds {
        /// The holds.
        holds: Vec<NetworkHold>,
    },
    /// Publishes one pool of a node's devices (a ResourceSlice generation): a newer
    /// generation replaces the pool, an older one is ignored, the same one must be identical.
    PublishPool {
        /// The node.
        node: String,
        /// Driver.
        driver: String,
        /// Pool name.
        pool: String,
        /// Generation.
        generation: u64,
        /// Every device of the pool.
        devices: Vec<Device>,
        /// Shared counter sets of the pool.
        counter_sets: Vec<CounterSet>,
    },
    /// Withdraws a pool whose slices are all gone: no new allocation takes its devices,
    /// while their holders keep them (a driver restart deletes and republishes its
    /// slices, so this evicts nobody); the next publication, of any generation, offers
    /// the pool again. An empty node names a network-attached pool (sent to every shard).
    WithdrawPool {
        /// The node (empty: a network-attached pool).
        node: String,
        /// Driver.
        driver: String,
        /// Pool name.
        pool: String,
    },
    /// Records device health, as a device plugin's ListAndWatch reports it.
    SetDeviceHealth {
        /// The node.
        node: String,
        /// Health per device.
        devices: Vec<DeviceHealthReport>,
    },
    /// Replaces the taints rules put on one device (on top of its driver's); empty removes
    /// them. An empty node names a device of a network-attached pool.
    SetDeviceTaints {
        /// The node.
        node: String,
        /// The device.
        device: DeviceId,
        /// The taints.
        taints: Vec<DeviceTaint>,
    },
    /// The node agent stopped reporting at `since_ms`; its devices turn unhealthy once
    /// `grace_ms` (default [`crate::ledger::devices::AGENT_GRACE_MS_DEFAULT`]) has passed,
    /// applied by the first `Tick` at or after that time.
    AgentDisconnected {
        /// The node.
        node: String,
        /// When the link dropped, in ms.
        since_ms: u64,
        /// Grace period, in ms.
        grace_ms: Option<u64>,
    },
    /// The node agent reports again (it then re-sends device health).
    AgentConnected {
        /// The node.
        node: String,
    },
    /// Inserts or replaces a device class.
    PutDeviceClass {
        /// The class.
        class: DeviceClass,
    },
    /// Removes a device class (allocations made through it stay).
    RemoveDeviceClass {
        /// Class name.
        name: String,
    },
    /// A shard move's first step on a source shard (docs/ARCHITECTURE.md §3a): these
    /// nodes take no new reservation (plans skip them, `Reserve` refuses them); what
    /// they hold stays. Idempotent; refused for a node another move fences.
    FenceNodes {
        /// The move (meta's id).
        move_id: u64,
        /// The nodes (at most [`MOVE_NODES_MAX`]).
        nodes: Vec<String>,
    },
    /// Lifts move `move_id`'s fence (a move given up before its seal); the shard then
    /// refuses to fence for that move again (a stale coordinator's late fence).
    UnfenceNodes {
        /// The move.
        move_id: u64,
    },
    /// Hands move `move_id`'s fenced nodes over: once no open reservation holds anything
    /// on them, they leave this shard with everything they hold (the reply's parcel,
    /// kept here until `DropParcel`, so a retry answers the same parcel), and any later
    /// operation naming them or their members is refused as moved.
    HandOff {
        /// The move.
        move_id: u64,
        /// The shard that adopts them.
        to: u32,
    },
    /// Takes in a parcel another shard handed off (idempotent by move).
    Adopt {
        /// What the source shard handed off.
        parcel: Parcel,
    },
    /// Forgets a handed-off parcel once meta recorded the move (the moved tombstones stay).
    DropParcel {
        /// The move.
        move_id: u64,
    },
    /// Several operations applied in order as one entry, each as if alone (the
    /// coordinator's batched rounds); at most [`LEDGER_BATCH_MAX`], none a batch.
    Batch {
        /// The operations.
        ops: Vec<LedgerOp>,
    },
}

/// Final state of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOutcome {
    /// Committed: its members became placements.
    Committed,
    /// Aborted by the coordinator (or released while open).
    Aborted,
    /// Refused at reserve time: the shard voted no.
    Refused,
}

/// Whether an entry (a node, a device class) was new or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeChange {
    /// The node was not known.
    Added,
    /// The node replaced a known one.
    Updated,
    /// The same node was registered again (`AddNode`); nothing changed.
    Unchanged,
}

/// Whether a removed entry (a node, a device class) existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Presence {
    /// It existed and is gone now.
    Removed,
    /// It did not exist (a repeated removal).
    Absent,
}

/// Why one member of a reservation cannot be held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalCause {
    /// The node is not in this shard.
    UnknownNode,
    /// The node is not ready.
    NodeNotReady,
    /// The node is being moved to another shard: it takes no new reservation.
    NodeMoving,
    /// Not enough of one resource, counting earlier members of the same batch on the node.
    Insufficient {
        /// The resource.
        resource: ResourceName,
        /// Requested by the batch on this node up to and including this member.
        requested: u64,
        /// Free on the node before the batch.
        free: u64,
    },
    /// A host port is taken (by a placed pod or an earlier member of the batch).
    HostPortInUse {
        /// The port.
        port: HostPort,
    },
    /// The member is already reserved or placed (on the named node).
    MemberHeld {
        /// Node holding it.
        node: String,
    },
    /// The member already holds network-attached devices here.
    NetworkDevicesHeld,
    /// A network-attached device's pool does not serve the member's node.
    DeviceUnreachable {
        /// The device.
        device: DeviceId,
    },
    /// A victim of a preemption is not a committed or bound member here.
    VictimNotPlaced,
    /// What the victims' room keeps after the preemptor's members took theirs
    /// cannot be held for the victims (a shared device or counter both would use).
    VictimRoomNotHeld,
    /// A device the member was allocated cannot take it.
    DeviceUnavailable {
        /// The device.
        device: DeviceId,
        /// Why.
        reason: DeviceRefusal,
    },
    /// The member would carry a shared claim's devices, but the claim is already
    /// carried on the node (by a held pod or another member of the batch).
    SharedClaimCarried {
        /// The claim, `namespace/name`.
        claim: String,
    },
    /// The member follows a shared claim that nothing carries on the node, nor with
    /// network-attached devices that reach it.
    SharedClaimNotHere {
        /// The claim, `namespace/name`.
        claim: String,
    },
    /// A preemption's victims include some of the pods sharing a claim on the node
    /// but not all: the claim's devices would stay in use by the others.
    SharedClaimSplit {
        /// The claim, `namespace/name`.
        claim: String,
    },
}

/// Why a device cannot take an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceRefusal {
    /// No published pool of the node has it.
    NotPublished,
    /// It is unhealthy (reported, or its agent is gone past the grace period).
    Unhealthy,
    /// It has a NoSchedule or NoExecute taint the allocation does not tolerate.
    Tainted {
        /// Taint key.
        key: String,
        /// Taint effect.
        effect: DeviceTaintEffect,
    },
    /// It is exclusive and already held.
    InUse,
    /// It is exclusive, but the allocation consumes capacity or names a share.
    NotShared,
    /// It is shared, but the allocation names no share id.
    ShareIdMissing,
    /// It is shared, but the allocation does not consume (or names an unknown) capacity.
    CapacityNotConsumed {
        /// Capacity name.
        capacity: String,
    },
    /// The amount consumed is not one the capacity's request policy allows.
    PolicyViolated {
        /// Capacity name.
        capacity: String,
    },
    /// Its holders would consume more than its capacity.
    CapacityExceeded {
        /// Capacity name.
        capacity: String,
    },
    /// Taking it would consume more of a shared counter than its set holds.
    CountersExceeded {
        /// Counter set.
        counter_set: String,
        /// Counter.
        counter: String,
    },
}

/// A refused member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The member.
    pub member: MemberKey,
    /// The node it was meant for.
    pub node: String,
    /// Why.
    pub cause: RefusalCause,
}

/// Bad input: the command is answered with this and changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum LedgerError {
    /// The node failed validation.
    #[error("invalid node: {message}")]
    InvalidNode {
        /// The validation error.
        message: String,
    },
    /// The node still holds reservations or placements.
    #[error("node {name} still holds {pods} pod(s)")]
    NodeInUse {
        /// Node name.
        name: String,
        /// Pods it holds.
        pods: u64,
    },
    /// `AddNode` for a node registered with another spec.
    #[error(
        "node {name} is registered with other {differences}; send it as an update to change it"
    )]
    NodeDiffers {
        /// Node name.
        name: String,
        /// What differs, registered value first.
        differences: String,
    },
    /// A node update would leave usage above the new allocatable.
    #[error("node {name}: new allocatable {resource} is below what its pods hold")]
    AllocatableBelowUsage {
        /// Node name.
        name: String,
        /// The resource.
        resource: ResourceName,
    },
    /// A reservation without members.
    #[error("{txn_id}: a reservation needs at least one member")]
    EmptyReservation {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// A member listed twice in one reservation.
    #[error("{txn_id}: member {member} listed twice")]
    DuplicateMember {
        /// Transaction id.
        txn_id: TxnId,
        /// The member.
        member: MemberKey,
    },
    /// A member summary failed validation.
    #[error("{txn_id}: member {member}: {message}")]
    InvalidMember {
        /// Transaction id.
        txn_id: TxnId,
        /// The member.
        member: MemberKey,
        /// The validation error.
        message: String,
    },
    /// The deadline is not after the command's timestamp.
    #[error("{txn_id}: deadline {deadline_ms} ms is not after {at_ms} ms")]
    DeadlinePassed {
        /// Transaction id.
        txn_id: TxnId,
        /// The deadline given.
        deadline_ms: u64,
        /// The command time.
        at_ms: u64,
    },
    /// The deadline is further after the command's timestamp than any coordinator holds.
    #[error("{txn_id}: deadline {deadline_ms} ms is more than {RESERVE_HOLD_MS_MAX} ms after {at_ms} ms")]
    HoldTooLong {
        /// Transaction id.
        txn_id: TxnId,
        /// The deadline given.
        deadline_ms: u64,
        /// The command time.
        at_ms: u64,
    },
    /// The id is already used for a different reservation.
    #[error("{txn_id} is already used for a different reservation")]
    TxnConflict {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// No open or recently finished transaction has this id.
    #[error("{txn_id} is unknown")]
    UnknownTxn {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// Commit of a transaction that was aborted or refused.
    #[error("{txn_id} cannot commit: it ended {outcome:?}")]
    TxnNotCommittable {
        /// Transaction id.
        txn_id: TxnId,
        /// How it ended.
        outcome: TxnOutcome,
    },
    /// Abort of a transaction that was committed.
    #[error("{txn_id} cannot abort: it was committed")]
    TxnCommitted {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// Release of a member that is only reserved (abort its transaction instead).
    #[error("member {member} is reserved by open {txn_id}; abort the transaction instead")]
    MemberReserved {
        /// The member.
        member: MemberKey,
        /// Its open transaction.
        txn_id: TxnId,
    },
    /// Bind of a member whose transaction is not committed yet.
    #[error("member {member} is only reserved by open {txn_id}; commit it first")]
    NotCommitted {
        /// The member.
        member: MemberKey,
        /// Its open transaction.
        txn_id: TxnId,
    },
    /// The member is not held by this shard.
    #[error("member {member} is unknown")]
    UnknownMember {
        /// The member.
        member: MemberKey,
    },
    /// The node is not in this shard.
    #[error("node {name} is unknown")]
    UnknownNode {
        /// Node name.
        name: String,
    },
    /// A batch holds too many operations.
    #[error("ops: {ops} in one batch, at most {LEDGER_BATCH_MAX}")]
    BatchTooLarge {
        /// How many it held.
        ops: usize,
    },
    /// A batch holds a batch.
    #[error("ops: a batch cannot hold a batch")]
    NestedBatch,
    /// A heartbeat's lease is out of range.
    #[error("lease_ms: {lease_ms} is not in {NODE_LEASE_MS_MIN}..={NODE_LEASE_MS_MAX}")]
    InvalidLease {
        /// The lease asked for.
        lease_ms: u64,
    },
    /// A published pool failed validation (the message names the field).
    #[error("invalid pool: {message}")]
    InvalidPool {
        /// The validation error.
        message: String,
    },
    /// A pool was published again under its current generation with other content.
    #[error("node {node}: pool {driver}/{pool} generation {generation} was published with other content; bump the generation")]
    PoolGenerationReused {
        /// Node name.
        node: String,
        /// Driver.
        driver: String,
        /// Pool.
        pool: String,
        /// The generation.
        generation: u64,
    },
    /// A device the node does not publish.
    #[error("node {node} publishes no device {device}")]
    UnknownDevice {
        /// Node name.
        node: String,
        /// The device.
        device: DeviceId,
    },
    /// Device taints failed validation (the message names the field).
    #[error("invalid device taints: {message}")]
    InvalidTaints {
        /// The validation error.
        message: String,
    },
    /// A device class failed validation (the message names the field).
    #[error("invalid device class: {message}")]
    InvalidDeviceClass {
        /// The validation error.
        message: String,
    },
    /// An observed pod failed validation (the message names the field).
    #[error("node {node}: invalid observed pod: {message}")]
    InvalidObservedPod {
        /// Node name.
        node: String,
        /// The validation error.
        message: String,
    },
    /// The node moved to another shard (a writer that routed here by an old shard map
    /// asks meta again).
    #[error("node {name} moved to shard {to}")]
    NodeMoved {
        /// Node name.
        name: String,
        /// Its shard now.
        to: u32,
    },
    /// The member's node moved to another shard.
    #[error("member {member} moved to shard {to} with its node")]
    MemberMoved {
        /// The member.
        member: MemberKey,
        /// Its shard now.
        to: u32,
    },
    /// The move was given up here (its fence lifted): it fences nothing any more.
    #[error("move {move_id} was given up; it fences nothing")]
    MoveEnded {
        /// The move.
        move_id: u64,
    },
    /// Another move fences the node.
    #[error("node {name} is being moved by move {move_id}")]
    NodeMoving {
        /// Node name.
        name: String,
        /// That move.
        move_id: u64,
    },
    /// A handoff before the move's open reservations on its nodes ended.
    #[error("move {move_id}: node {node} still holds reservations of open {txn_id}")]
    NodesBusy {
        /// The move.
        move_id: u64,
        /// A node with an open reservation.
        node: String,
        /// The open transaction.
        txn_id: TxnId,
    },
    /// A parcel names a node this shard has (or is malformed).
    #[error("move {move_id}: {message}")]
    ParcelRefused {
        /// The move.
        move_id: u64,
        /// Why, naming the node or member.
        message: String,
    },
    /// Too many nodes in one move.
    #[error("nodes: {nodes} in one move, at most {MOVE_NODES_MAX}")]
    MoveTooLarge {
        /// How many it named.
        nodes: usize,
    },
    /// A member key names an observed pod, which gangway neither releases nor binds.
    #[error("member {member} is a pod another scheduler bound")]
    ObservedMember {
        /// The member.
        member: MemberKey,
    },
}

/// The answer to one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerReply {
    /// The node is registered.
    NodeRegistered {
        /// Node name.
        name: String,
        /// Added or updated.
        change: NodeChange,
    },
    /// The lease is renewed until `lease_until_ms`.
    HeartbeatRecorded {
        /// Node name.
        node: String,
        /// The node's readiness now.
        readiness: Readiness,
        /// When the lease lapses unless renewed, in ms.
        lease_until_ms: u64,
    },
    /// The node's observed pods are replaced.
    ObservedPodsSet {
        /// Node name.
        node: String,
        /// Pods newly recorded.
        added: u32,
        /// Pods no longer there.
        removed: u32,
        /// Observed pods that asked for ports or devices gangway's pods hold (they are
        /// recorded without them), by uid.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        conflicts: Vec<(String, ObservedConflicts)>,
    },
    /// The node is gone.
    NodeRemoved {
        /// Node name.
        name: String,
        /// Whether it existed.
        presence: Presence,
    },
    /// Phase 1 yes vote: every member is held.
    Reserved {
        /// Transaction id.
        txn_id: TxnId,
        /// Deadline of the hold.
        deadline_ms: u64,
    },
    /// Phase 1 no vote: nothing is held (some refusals may be left out, see `REFUSALS_KEPT_MAX`).
    ReserveRefused {
        /// Transaction id.
        txn_id: TxnId,
        /// Why.
        refusals: Vec<Refusal>,
    },
    /// The transaction's members are placements now.
    Committed {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// The transaction holds nothing and never will.
    Aborted {
        /// Transaction id.
        txn_id: TxnId,
    },
    /// Placements given back.
    Released {
        /// Members released by this command.
        released: Vec<MemberKey>,
        /// Members named that held nothing (already released).
        absent: Vec<MemberKey>,
    },
    /// The nodes take no new reservation.
    Fenced {
        /// The move.
        move_id: u64,
        /// The nodes fenced (already handed off: none).
        nodes: Vec<String>,
    },
    /// The move's fence is lifted.
    Unfenced {
        /// The move.
        move_id: u64,
        /// The nodes it had fenced.
        nodes: Vec<String>,
    },
    /// The nodes left this shard.
    HandedOff {
        /// What they held.
        parcel: Parcel,
    },
    /// The parcel's nodes are this shard's now.
    Adopted {
        /// The move.
        move_id: u64,
        /// How many nodes it brought.
        nodes: usize,
    },
    /// The handed-off parcel is forgotten.
    ParcelDropped {
        /// The move.
        move_id: u64,
        /// Whether it was kept.
        presence: Presence,
    },
    /// The bind is recorded.
    BindRecorded {
        /// The member.
        member: MemberKey,
    },
    /// Open reservations past their deadline, for the caller to resolve with the
    /// coordinator, and pods to evict from devices whose agent's grace period passed.
    Expired {
        /// Their ids, ascending.
        txn_ids: Vec<TxnId>,
        /// Pods holding devices that turned unhealthy, for the caller to evict.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        evictions: Vec<DeviceEviction>,
        /// Nodes whose lease lapsed at this tick (now not ready).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        lapsed: Vec<String>,
    },
    /// A reserve retried after its transaction ended.
    AlreadyFinished {
        /// Transaction id.
        txn_id: TxnId,
        /// How it ended.
        outcome: TxnOutcome,
    },
    /// A pool was withdrawn (or found withdrawn, or never published here).
    PoolWithdrawn {
        /// Node name (empty for a network-attached pool).
        node: String,
        /// Driver.
        driver: String,
        /// Pool.
        pool: String,
        /// What the withdrawal found.
        outcome: PoolWithdrawal,
    },
    /// A pool was published (or ignored as stale, or found unchanged).
    PoolPublished {
        /// Node name (empty for a network-attached pool).
        node: String,
        /// Driver.
        driver: String,
        /// Pool.
        pool: String,
        /// The generation offered.
        generation: u64,
        /// What happened.
        change: PoolChange,
        /// Pods whose devices are gone or now tainted out, for the caller to evict.
        evictions: Vec<DeviceEviction>,
    },
    /// Other schedulers' network holds are recorded.
    ObservedNetworkHoldsSet {
        /// Holds recorded.
        held: u32,
        /// Holds with devices gangway's holds (or earlier observed ones) have, which
        /// are recorded without them.
        conflicts: Vec<(MemberKey, Vec<DeviceId>)>,
    },
    /// Device health is recorded.
    DeviceHealthRecorded {
        /// Node name.
        node: String,
        /// Pods holding devices reported unhealthy, for the caller to evict.
        evictions: Vec<DeviceEviction>,
    },
    /// A device's rule taints are replaced.
    DeviceTaintsSet {
        /// Node name.
        node: String,
        /// The device.
        device: DeviceId,
        /// Pods its NoExecute taints evict, for the caller to act on.
        evictions: Vec<DeviceEviction>,
    },
    /// The agent link is recorded.
    AgentLinkRecorded {
        /// Node name.
        node: String,
        /// The link now.
        link: AgentLink,
    },
    /// A device class is stored.
    DeviceClassStored {
        /// Class name.
        name: String,
        /// Added or updated.
        change: NodeChange,
    },
    /// A device class is gone.
    DeviceClassRemoved {
        /// Class name.
        name: String,
        /// Whether it existed.
        presence: Presence,
    },
    /// The replies to a batch, in its order.
    Batch {
        /// One per operation.
        replies: Vec<LedgerReply>,
    },
    /// Bad input: nothing changed.
    Rejected {
        /// Why.
        error: LedgerError,
    },
}

impl fmt::Display for DeviceRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRefusal::NotPublished => write!(f, "no published pool has it"),
            DeviceRefusal::Unhealthy => write!(f, "it is unhealthy"),
            DeviceRefusal::Tainted { key, effect } => {
                write!(
                    f,
                    "it has taint {key} ({effect:?}) the claim does not tolerate"
                )
            }
            DeviceRefusal::InUse => write!(f, "it is exclusive and already held"),
            DeviceRefusal::NotShared => write!(f, "it is exclusive, but the allocation shares it"),
            DeviceRefusal::ShareIdMissing => {
                write!(f, "it is shared, but the allocation names no share")
            }
            DeviceRefusal::CapacityNotConsumed { capacity } => {
                write!(
                    f,
                    "it is shared, but the allocation does not consume capacity {capacity}"
                )
            }
            DeviceRefusal::PolicyViolated { capacity } => {
                write!(
                    f,
                    "the amount of {capacity} asked for is not one its policy allows"
                )
            }
            DeviceRefusal::CapacityExceeded { capacity } => {
                write!(f, "its holders would use more {capacity} than it has")
            }
            DeviceRefusal::CountersExceeded {
                counter_set,
                counter,
            } => write!(
                f,
                "it would use more of counter {counter_set}/{counter} than the set holds"
            ),
        }
    }
}

impl fmt::Display for RefusalCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefusalCause::UnknownNode => write!(f, "the node is not in this shard"),
            RefusalCause::NodeNotReady => write!(f, "the node is not ready"),
            RefusalCause::NodeMoving => write!(f, "the node is moving to another shard"),
            RefusalCause::Insufficient {
                resource,
                requested,
                free,
            } => write!(
                f,
                "not enough {resource}: {requested} requested, {free} free"
            ),
            RefusalCause::HostPortInUse { port } => write!(f, "host port {port} is taken"),
            RefusalCause::MemberHeld { node } => write!(f, "it is already held on node {node}"),
            RefusalCause::NetworkDevicesHeld => {
                write!(f, "it already holds network-attached devices here")
            }
            RefusalCause::DeviceUnreachable { device } => {
                write!(f, "device {device}'s pool does not serve the node")
            }
            RefusalCause::VictimNotPlaced => {
                write!(f, "it is a victim, but not a committed or bound member here")
            }
            RefusalCause::VictimRoomNotHeld => write!(
                f,
                "the victims' room left after the preemptor's members cannot be held for the victims"
            ),
            RefusalCause::DeviceUnavailable { device, reason } => {
                write!(f, "device {device} cannot take it: {reason}")
            }
            RefusalCause::SharedClaimCarried { claim } => {
                write!(f, "shared claim {claim} is already allocated (on the node, or with network-attached devices)")
            }
            RefusalCause::SharedClaimNotHere { claim } => write!(
                f,
                "shared claim {claim} is not allocated where the pod can use it (on its node, or with network-attached devices that reach it)"
            ),
            RefusalCause::SharedClaimSplit { claim } => write!(
                f,
                "the victims include some of the pods sharing claim {claim} on the node, not all"
            ),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "member {} on node {}: {}",
            self.member, self.node, self.cause
        )
    }
}
