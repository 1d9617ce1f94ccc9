//! The meta group's state: the shard map (node -> shard), the durable queue of
//! gang groups with their states, and the 2PC decision log.
//!
//! Invariants: deterministic (ordered maps, times only from commands); a node's
//! shard changes only by a shard move's commit (`shard_map.rs`); an idempotency key names one group and one
//! body; a gang (namespace/name) belongs to at most one live group; a
//! transaction's decision never changes once written and is kept until every
//! participant acknowledged it; a COMMIT never places a member the group already
//! holds (it is recorded as ABORT instead); members leave a group's placements
//! only through meta first (ReleaseMembers, then MembersReleased once the shards
//! freed them); a terminal group holds nothing. Every command is idempotent, so a
//! retried proposal that applies twice changes nothing the second time. Called
//! through `replicated::MetaMachine`; the coordinator, the resolvers, the front
//! door and the kube adapter write its commands.

pub mod decisions;
pub mod groups;
pub mod queues;
pub mod shard_map;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use decisions::{Decision, TxnRecord, Undelivered};
pub use groups::{
    GroupRecord, GroupSeq, GroupState, GroupSummary, PlacedDevice, Placement, SubmittedPods,
    Terminal,
};
pub use queues::{QueueStatus, Queues};
pub use shard_map::{
    domain_of, hashed_shard, shard_command, MappedNode, MovePhase, MoveTarget, ShardMove,
    ShardShare, MOVES_ACTIVE_MAX, MOVES_KEPT_MAX,
};

use crate::ledger::TxnId;
use crate::model::{GangGroup, QueueSpec, Resources};

/// Terminal groups kept (with their idempotency keys); older ones are forgotten.
pub const FINISHED_GROUPS_MAX: usize = 10_000;
/// Decided transactions kept once every participant acknowledged them; older ones
/// are forgotten (unacknowledged ones never are).
pub const DECIDED_TXNS_MAX: usize = 50_000;
/// First retry delay after an aborted attempt.
pub const RETRY_BACKOFF_BASE_MS: u64 = 100;
/// Longest retry delay.
pub const RETRY_BACKOFF_MAX_MS: u64 = 5_000;

/// A command of the meta group; `at_ms` is the proposer's clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaCommand {
    /// Assigns `node` to `shard` unless it already has a shard.
    AssignNode {
        /// Node name.
        node: String,
        /// Proposed shard.
        shard: u32,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Accepts a gang group (or finds the one already accepted under `key`).
    Submit {
        /// Idempotency key (the owner's own: keys of different owners never meet).
        key: String,
        /// The validated group.
        group: GangGroup,
        /// Proposer's clock.
        at_ms: u64,
        /// The most live groups its owner may have (none: no bound).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        live_max: Option<u32>,
    },
    /// Starts a placement transaction for a queued group.
    BeginTxn {
        /// The group.
        seq: GroupSeq,
        /// Shards that will be asked to reserve.
        participants: Vec<u32>,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Starts a preemption: a transaction that places queued group `seq` on room the
    /// placed `victims` hold. The victims become `Preempting`; the decision settles
    /// them with the preemptor's (docs/ARCHITECTURE.md §5, rule 14).
    BeginPreemption {
        /// The preemptor group.
        seq: GroupSeq,
        /// The groups it displaces, each whole.
        victims: Vec<GroupSeq>,
        /// Shards that will be asked to reserve: every shard of the preemptor's
        /// members and of the victims' placements.
        participants: Vec<u32>,
        /// Proposer's clock.
        at_ms: u64,
        /// On what grounds: a higher priority (false), or the preemptor's queue taking
        /// back its guarantee from queues above theirs (true, [`MetaQuery::Reclaimable`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reclaim: bool,
    },
    /// Records the coordinator's decision (the commit point of 2PC).
    Decide {
        /// The transaction.
        txn: TxnId,
        /// Commit or abort.
        decision: Decision,
        /// Member key -> placement, for a commit.
        placements: BTreeMap<String, Placement>,
        /// Why, for an abort.
        reason: String,
        /// Proposer's clock.
        at_ms: u64,
        /// Participants that already hold the outcome (a one-shard reserve-and-commit
        /// answered): they need not be told. Ignored when meta records another decision.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        delivered: Vec<u32>,
    },
    /// A participant's question at its reservation deadline: the decision, or an ABORT tombstone.
    AbortIfUndecided {
        /// The transaction.
        txn: TxnId,
        /// Proposer's clock.
        at_ms: u64,
        /// The asking shard (a tombstone lists it as the participant to acknowledge).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shard: Option<u32>,
    },
    /// Participants applied a transaction's decision; once all have, it may be forgotten.
    Delivered {
        /// The transaction.
        txn: TxnId,
        /// The participants that applied it.
        shards: Vec<u32>,
    },
    /// A placement attempt failed before any reservation: retry later (or time out).
    Requeue {
        /// The group.
        seq: GroupSeq,
        /// Why, for people.
        reason: String,
        /// Proposer's clock.
        at_ms: u64,
        /// The attempts the proposer saw; a requeue already counted (a retried
        /// proposal) is ignored. None: always counted (older entries).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempts: Option<u32>,
    },
    /// Times out a queued group whose waitTime has passed.
    Expire {
        /// The group.
        seq: GroupSeq,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Cancels a group in any state; placed members get released.
    Cancel {
        /// The group.
        seq: GroupSeq,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Releases a placed group whose work finished.
    Release {
        /// The group.
        seq: GroupSeq,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Some members of a placed group finished: meta takes them out of the group's
    /// placements first (into `releasing`), before any shard frees them.
    ReleaseMembers {
        /// The group.
        seq: GroupSeq,
        /// Member keys (`ns/gang/member`).
        members: Vec<String>,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// The shards freed members that `ReleaseMembers` took out; they leave `releasing`.
    MembersReleased {
        /// The group.
        seq: GroupSeq,
        /// Member keys (`ns/gang/member`).
        members: Vec<String>,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// The coordinator released a group's members on every shard.
    ReleaseDone {
        /// The group.
        seq: GroupSeq,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Several commands applied in order as one entry, each as if alone (the
    /// coordinator's batched rounds); at most [`META_BATCH_MAX`], none a batch.
    Batch {
        /// The commands.
        commands: Vec<MetaCommand>,
    },
    /// Records why a queued group waits without counting an attempt (its queue has no
    /// room: it is tried again as soon as there is, with no backoff).
    NoteWaiting {
        /// The group.
        seq: GroupSeq,
        /// Why, for people.
        reason: String,
    },
    /// Creates or changes a queue ([`Queues::put`]).
    PutQueue {
        /// The queue.
        queue: QueueSpec,
    },
    /// Deletes a queue with no children and no live group ([`Queues::delete`]).
    DeleteQueue {
        /// Its name.
        name: String,
        /// Who asks: the queue's keeper ([`QueueSpec::managed_by`]; empty: the admin API).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        managed_by: String,
    },
    /// Records what a node's device plugin answered for a placed member's devices (its
    /// node agent reports it); replaces the member's allocation for that resource.
    NoteNodeAllocation {
        /// The member, `namespace/gang/member`.
        member: String,
        /// The node reporting; the member must be placed there.
        node: String,
        /// The plugin's answer.
        allocation: crate::model::node_allocation::NodeAllocation,
    },
    /// Records the cluster's allocatable resources, the pool top-level queues lend in
    /// (the coordinator sums the shards' and writes it when it changes).
    NoteCapacity {
        /// The sum over every shard's nodes.
        capacity: Resources,
    },
    /// Gives `node` its shard unless it has one: its domain's home, or for the first
    /// node of a domain (or a node without one) the shard with the fewest nodes.
    PlaceNode {
        /// Node name.
        node: String,
        /// The value of its topology label (zone, rack), if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        domain: Option<String>,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Records a shard move (docs/ARCHITECTURE.md §3a); refused while another runs.
    BeginMove {
        /// What moves.
        target: MoveTarget,
        /// The target shard.
        to: u32,
        /// Why, for people (an operator's move, a rebalance).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Seals a move: refused while a transaction on its sources or target is in flight.
    SealMove {
        /// The move.
        id: u64,
    },
    /// The target adopted every source's parcel: the map and the placements name it.
    CommitMove {
        /// The move.
        id: u64,
    },
    /// The sources dropped their parcels: the move is done.
    EndMove {
        /// The move.
        id: u64,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Gives a move up before any node left its source.
    CancelMove {
        /// The move.
        id: u64,
        /// Why.
        reason: String,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Raises the shard count of a live cluster to `shards` (it never falls). Every
    /// replica then opens the added shards' groups, created with `voters` (id ->
    /// address) so that every replica creates them alike.
    GrowShards {
        /// The new count.
        shards: u32,
        /// The voters the added shards' groups start with.
        voters: BTreeMap<u64, String>,
    },
}

/// The meta group's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaReply {
    /// Why a move cannot be sealed now (None: it can).
    SealBlocker {
        /// The reason.
        reason: Option<String>,
    },
    /// A move was recorded.
    MoveBegun {
        /// The move.
        shard_move: Box<ShardMove>,
        /// Nodes of the domain left for later moves (a move takes at most
        /// `MOVE_NODES_MAX`).
        left: u64,
    },
    /// A move as it is now.
    Move {
        /// The move.
        shard_move: Box<ShardMove>,
    },
    /// The moves kept, running ones included.
    Moves {
        /// In id order.
        moves: Vec<ShardMove>,
    },
    /// Each shard's share of the map.
    ShardShares {
        /// In shard order.
        shares: Vec<ShardShare>,
    },
    /// Every node with its shard and domain.
    MappedNodes {
        /// In name order.
        nodes: Vec<MappedNode>,
    },
    /// The node's shard.
    Shard {
        /// Shard id.
        shard: u32,
    },
    /// The node has no shard yet.
    NotAssigned,
    /// The whole shard map.
    ShardMap {
        /// node -> shard.
        map: BTreeMap<String, u32>,
    },
    /// The shard set ([`MetaQuery::ShardSet`], `GrowShards`).
    ShardSet {
        /// Shards 1..=shards exist.
        shards: u32,
        /// Each shard added on a live cluster -> the voters its group was created with.
        #[serde(default)]
        added: BTreeMap<u32, BTreeMap<u64, String>>,
    },
    /// A submission was accepted (`created`) or found under its key.
    Submitted {
        /// The group.
        seq: GroupSeq,
        /// Whether this call created it.
        created: bool,
        /// Its status right after this command, so the front door answers the
        /// submitter without a second (linearizable) read. Absent from replies
        /// written by replicas that predate it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<Box<GroupSummary>>,
    },
    /// A transaction began.
    TxnBegun {
        /// The transaction.
        txn: TxnId,
    },
    /// A transaction's decision (new or already recorded).
    Decided {
        /// The transaction.
        txn: TxnId,
        /// The decision.
        decision: Decision,
    },
    /// One group, as callers outside the coordinator see it.
    Group {
        /// Its summary.
        group: Box<GroupSummary>,
    },
    /// Several groups, in queue order.
    Groups {
        /// Their records.
        records: Vec<GroupRecord>,
    },
    /// Every group's version (bumped on every change of its summary), in seq order.
    Versions {
        /// (seq, version) pairs.
        groups: Vec<(GroupSeq, u64)>,
    },
    /// Several groups as callers outside the coordinator see them, in queue order.
    Summaries {
        /// Their summaries.
        groups: Vec<GroupSummary>,
    },
    /// The pods groups were submitted for ([`MetaQuery::SubmittedPods`]).
    SubmittedPods {
        /// In seq order.
        groups: Vec<SubmittedPods>,
        /// More groups after the last one listed: ask again from its seq.
        more: bool,
    },
    /// The groups changed since a stamp ([`MetaQuery::ChangedSince`]).
    Changed {
        /// Their summaries, oldest change first.
        groups: Vec<GroupSummary>,
        /// The stamp to ask from next: every change up to it is in `groups`.
        stamp: u64,
        /// More changes than the limit: ask again from `stamp`.
        more: bool,
        /// Groups forgotten so far (a reader that kept summaries drops the ones gone
        /// when this moved).
        forgotten: u64,
    },
    /// One transaction, if known.
    Txn {
        /// Its record.
        record: Option<TxnRecord>,
    },
    /// The lowest priority of a Placed group, if any group is Placed.
    LowestPriority {
        /// That priority.
        priority: Option<i32>,
    },
    /// Groups per state name (every state named, zero included).
    StateCounts {
        /// State name → groups.
        counts: BTreeMap<String, u64>,
    },
    /// An owner's live groups, and whether a key is already its.
    Owned {
        /// Groups that have not ended.
        live: u64,
        /// Whether the key asked about names one of its groups.
        has_key: bool,
    },
    /// Decided transactions some participant has not acknowledged.
    Undelivered {
        /// In id order.
        txns: Vec<Undelivered>,
    },
    /// Transaction records ([`MetaQuery::RecentTxns`]), newest first.
    Txns {
        /// The records.
        txns: Vec<TxnRecord>,
    },
    /// The replies to a batch, in its order.
    Batch {
        /// One per command.
        replies: Vec<MetaReply>,
    },
    /// Queues with their usage, in name order.
    Queues {
        /// Their states.
        queues: Vec<QueueStatus>,
    },
    /// What a group may reclaim, youngest first ([`MetaQuery::Reclaimable`]).
    Reclaimable {
        /// Placed groups of other queues above their min.
        victims: Vec<GroupSeq>,
    },
    /// Why queued groups cannot be charged to their queues now ([`MetaQuery::QuotaRefusals`]).
    QuotaRefusals {
        /// (group, why), in the order asked; groups that fit are left out.
        refusals: Vec<(GroupSeq, String)>,
    },
    /// The cluster's allocatable resources as recorded ([`MetaQuery::Capacity`]).
    Capacity {
        /// `None` until the coordinator first recorded it.
        capacity: Option<Resources>,
    },
    /// Refused; the state is unchanged.
    Rejected {
        /// Why, naming the field.
        reason: String,
        /// What kind of refusal, so callers choose a status code without reading words.
        #[serde(default, skip_serializing_if = "RejectionKind::is_refused")]
        kind: RejectionKind,
    },
}

/// What kind of refusal a [`MetaReply::Rejected`] is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    /// The command does not fit the state, or its input is malformed.
    #[default]
    Refused,
    /// The gang group it names does not exist (or was forgotten).
    NotFound,
    /// It conflicts with what is stored: a key used with another body, or a gang a
    /// live group declares.
    Conflict,
    /// The group's queue (or an ancestor) has no room for it now (I8): it waits.
    NoRoom,
    /// It must wait for something that ends by itself (a shard move of the members'
    /// nodes): the same command succeeds once it did (UNAVAILABLE at the front door).
    Busy,
    /// Its owner holds as many live groups as it may (RESOURCE_EXHAUSTED at the front
    /// door): it succeeds once some of them ended.
    Exhausted,
}

impl RejectionKind {
    fn is_refused(&self) -> bool {
        *self == Self::Refused
    }
}

/// A read-only question to the meta group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaQuery {
    /// The moves kept, running ones included.
    Moves,
    /// Why a move cannot be sealed now, if it cannot (the coordinator asks before it
    /// writes the fence and the seal, so a move that waits costs no log entry).
    SealBlocker {
        /// The move.
        id: u64,
    },
    /// Each shard's nodes, domains and homes.
    ShardShares,
    /// Every node with its shard and domain (rebalancing reads it).
    MappedNodes,
    /// The shard of one node.
    ShardOf {
        /// Node name.
        node: String,
    },
    /// The whole shard map.
    ShardMap,
    /// How many shards there are, and the voters of those added on a live cluster.
    ShardSet,
    /// One group.
    Group {
        /// The group.
        seq: GroupSeq,
    },
    /// Groups, in queue order (all, or only those not terminal).
    Groups {
        /// Leave out terminal groups.
        active_only: bool,
    },
    /// The summaries of groups, in queue order (all, or only those not terminal).
    Summaries {
        /// Leave out terminal groups.
        active_only: bool,
    },
    /// Every group's (seq, version), in seq order: a caller that keeps summaries asks
    /// for those whose version moved ([`MetaQuery::SummariesOf`]) instead of all.
    Versions,
    /// The pods of the groups after seq `after` whose members carry uids (Kubernetes
    /// pods), at most `limit` groups, without their specs.
    SubmittedPods {
        /// The last seq the reader has.
        after: GroupSeq,
        /// At most this many groups.
        limit: u32,
    },
    /// The groups whose version (a change stamp) is above `after`, at most `limit`,
    /// oldest change first: what a reader that keeps summaries needs each time.
    ChangedSince {
        /// The stamp the reader has seen.
        after: u64,
        /// At most this many summaries.
        limit: u32,
    },
    /// The summaries of these groups, in seq order (unknown ones left out).
    SummariesOf {
        /// The groups.
        seqs: Vec<GroupSeq>,
    },
    /// One transaction.
    Txn {
        /// The transaction.
        txn: TxnId,
    },
    /// The lowest priority of a Placed group (whether any group could be preempted).
    LowestPlacedPriority,
    /// The lowest priority of a placed group charged to queue `root` or a queue under
    /// it (a preemptor's boundary: `GangGroup::preempts_within`).
    LowestPlacedPriorityWithin {
        /// The boundary's queue (empty: no group is within it).
        root: String,
    },
    /// The live groups that declare these gangs (`namespace/name`), in seq order, each
    /// once: the groups a preemption would displace.
    OwnersOf {
        /// The gangs.
        gangs: Vec<String>,
    },
    /// Groups the coordinator must act on (queued, placing, releasing), in queue order.
    Pending {
        /// At most this many.
        limit: u32,
        /// When set, queued groups still waiting out their backoff at this time (and
        /// not past their deadline) are left out: a group that fits nowhere must not
        /// hold a place in the window while it waits, or enough of them at the head of
        /// the queue stop every group behind them from being read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        due_at_ms: Option<u64>,
    },
    /// How many groups the log holds in each state (the queue-depth metric).
    StateCounts,
    /// How many groups of `owner` have not ended, and whether `key` is already one of
    /// its keys (the front door refuses a new submission past the owner's bound before
    /// it writes anything; `Submit` checks again).
    Owned {
        /// The owner.
        owner: String,
        /// The submission's idempotency key.
        key: String,
    },
    /// Decided transactions some participant has not acknowledged, in id order.
    Undelivered {
        /// At most this many.
        limit: u32,
    },
    /// Every queue with its usage and group counts, in name order.
    Queues,
    /// What queued group `seq` may reclaim ([`MetaState::reclaimable`]).
    Reclaimable {
        /// The group.
        seq: GroupSeq,
    },
    /// For each of these queued groups whose queue has no room for it now, why: the
    /// coordinator leaves them out of a round instead of planning them in vain.
    QuotaRefusals {
        /// The groups.
        seqs: Vec<GroupSeq>,
    },
    /// The cluster's allocatable resources as recorded (`MetaCommand::NoteCapacity`).
    Capacity,
    /// The newest transactions of the decision log (open and decided), newest first:
    /// what the web view lists as recent decisions.
    RecentTxns {
        /// At most this many.
        limit: u32,
    },
}

/// The meta group's replicated state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaState {
    shards: u32,
    shard_map: BTreeMap<String, u32>,
    groups: BTreeMap<GroupSeq, GroupRecord>,
    keys: BTreeMap<String, GroupSeq>,
    txns: BTreeMap<TxnId, TxnRecord>,
    next_seq: GroupSeq,
    next_txn: u64,
    /// Decided transactions with participants still to acknowledge (an index of `txns`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    undelivered: BTreeSet<TxnId>,
    /// `namespace/gang` -> the group that declared it last; the claim lapses when that
    /// group ends or is forgotten (checked at admission, so no transition updates it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    gang_owners: BTreeMap<String, GroupSeq>,
    /// The last change stamp given to a group ([`GroupRecord::bump`]).
    #[serde(default)]
    last_version: u64,
    /// Groups forgotten so far: a reader that keeps summaries compares it to learn
    /// that some of them are gone.
    #[serde(default)]
    forgotten: u64,
    /// The queues, with what their groups are charged (I8).
    #[serde(default, skip_serializing_if = "Queues::is_empty")]
    queues: Queues,
    /// Bug switch `meta-admits-over-quota` only: charges without asking the queue.
    #[serde(skip)]
    quota_unchecked: bool,
    /// Bug switch `meta-seals-moves-in-flight` only: seals moves without looking.
    #[serde(skip)]
    seal_unchecked: bool,
    /// Bug switch `meta-admits-twins-of-placed-groups` only: a Placed group's gangs
    /// may be declared again.
    #[serde(skip)]
    twins_of_placed_admitted: bool,
    /// Topology domain → its home shard (where its new nodes go).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    domains: BTreeMap<String, u32>,
    /// Node → its topology domain (nodes registered with one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    node_domains: BTreeMap<String, String>,
    /// Shard moves: the running one and the last finished ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    moves: BTreeMap<u64, ShardMove>,
    /// The last move id given.
    #[serde(default, skip_serializing_if = "is_zero")]
    next_move: u64,
    /// Shards added on a live cluster (`GrowShards`) -> the voters their groups were
    /// created with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    added_shards: BTreeMap<u32, BTreeMap<u64, String>>,
    /// Nodes per shard (derived, never encoded).
    #[serde(skip)]
    node_counts: shard_map::NodeCounts,
    /// Owner -> its groups that may be live (derived, never encoded).
    #[serde(skip)]
    owned: OwnedGroups,
}

/// Owner -> the groups it submitted that may not have ended: built from the groups on
/// first use (so a snapshot restores it without encoding it), added to at every
/// submission, pruned of ended groups when its owner's live groups are counted and of
/// forgotten ones when they are forgotten, so it holds at most the groups meta keeps.
/// Compared equal always, being a cache.
#[derive(Debug, Clone, Default)]
struct OwnedGroups(Option<BTreeMap<String, BTreeSet<GroupSeq>>>);

impl PartialEq for OwnedGroups {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The key a submission is stored under: the owner's own key space (the Kubernetes
/// ingest's and unauthenticated callers' keys, owner empty, are stored as given).
fn owned_key(owner: &str, key: &str) -> String {
    if owner.is_empty() {
        key.to_string()
    } else {
        // A unit separator: neither an owner nor a key written by a person holds one
        // (owners are checked free of control characters).
        format!("{owner}\u{1f}{key}")
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn rejected(reason: impl Into<String>) -> MetaReply {
    MetaReply::Rejected {
        reason: reason.into(),
        kind: RejectionKind::Refused,
    }
}

fn missing(seq: GroupSeq) -> MetaReply {
    MetaReply::Rejected {
        reason: format!("id: no gang group {seq}"),
        kind: RejectionKind::NotFound,
    }
}

fn conflict(reason: String) -> MetaReply {
    MetaReply::Rejected {
        reason,
        kind: RejectionKind::Conflict,
    }
}

/// Most commands in one meta batch.
pub const META_BATCH_MAX: usize = 1_024;

/// Delay before retry number `attempts` (1-based), doubling up to the cap.
pub fn retry_backoff_ms(attempts: u32) -> u64 {
    let shift = attempts.saturating_sub(1).min(16);
    (RETRY_BACKOFF_BASE_MS << shift).min(RETRY_BACKOFF_MAX_MS)
}

impl MetaState {
    /// Groups in queue order (all, or only those not terminal).
    fn in_queue_order(&self, active_only: bool) -> impl Iterator<Item = &GroupRecord> {
        let mut records: Vec<&GroupRecord> = self
            .groups
            .values()
            .filter(|r| !active_only || !r.state.is_terminal())
            .collect();
        records.sort_by_key(|r| r.order_key());
        records.into_iter()
    }

    /// The full record of one group.
    pub fn record(&self, seq: GroupSeq) -> Option<&GroupRecord> {
        self.groups.get(&seq)
    }

    /// An empty state over `shards` shards.
    pub fn new(shards: u32) -> Self {
        Self {
            shards,
            next_seq: 1,
            next_txn: 1,
            ..Self::default()
        }
    }

    /// Applies one command, then brings the charges of the groups it touched up to date.
    pub fn apply(&mut self, cmd: &MetaCommand) -> MetaReply {
        let touched = self.touched_by(cmd);
        let reply = self.apply_one(cmd);
        for seq in touched {
            self.recharge(seq);
        }
        reply
    }

    /// The groups whose charge `cmd` may change (read before it applies, while its
    /// transaction is still on record).
    fn touched_by(&self, cmd: &MetaCommand) -> Vec<GroupSeq> {
        let of_txn = |txn: &TxnId| -> Vec<GroupSeq> {
            self.txns
                .get(txn)
                .map(|t| {
                    t.group
                        .into_iter()
                        .chain(t.victims.iter().copied())
                        .collect()
                })
                .unwrap_or_default()
        };
        match cmd {
            MetaCommand::BeginTxn { seq, .. }
            | MetaCommand::Requeue { seq, .. }
            | MetaCommand::Expire { seq, .. }
            | MetaCommand::Cancel { seq, .. }
            | MetaCommand::Release { seq, .. }
            | MetaCommand::ReleaseMembers { seq, .. }
            | MetaCommand::MembersReleased { seq, .. }
            | MetaCommand::ReleaseDone { seq, .. } => vec![*seq],
            MetaCommand::BeginPreemption { seq, victims, .. } => std::iter::once(*seq)
                .chain(victims.iter().copied())
                .collect(),
            MetaCommand::Decide { txn, .. }
            | MetaCommand::AbortIfUndecided { txn, .. }
            | MetaCommand::Delivered { txn, .. } => of_txn(txn),
            MetaCommand::AssignNode { .. }
            | MetaCommand::PlaceNode { .. }
            | MetaCommand::BeginMove { .. }
            | MetaCommand::SealMove { .. }
            | MetaCommand::CommitMove { .. }
            | MetaCommand::EndMove { .. }
            | MetaCommand::CancelMove { .. }
            | MetaCommand::GrowShards { .. }
            | MetaCommand::Submit { .. }
            | MetaCommand::Batch { .. }
            | MetaCommand::NoteWaiting { .. }
            | MetaCommand::PutQueue { .. }
            | MetaCommand::DeleteQueue { .. }
            | MetaCommand::NoteCapacity { .. }
            | MetaCommand::NoteNodeAllocation { .. } => Vec::new(),
        }
    }

    /// Sets group `seq`'s charge to what its state is due, moving the difference on
    /// its queue's chain.
    fn recharge(&mut self, seq: GroupSeq) {
        let Some(g) = self.groups.get_mut(&seq) else {
            return;
        };
        let due = g.charge_due();
        if due == g.charge {
            return;
        }
        let old = std::mem::replace(&mut g.charge, due.clone());
        let queue = g.group.queue.clone();
        self.queues.refund(&queue, &old);
        self.queues.charge(&queue, &due);
    }

    /// Bug switch `meta-admits-over-quota` (and the tests' checker) only: charges
    /// groups without asking their queues, as a scheduler with no quota check would.
    pub fn set_quota_unchecked(&mut self, unchecked: bool) {
        self.quota_unchecked = unchecked;
    }

    /// Bug switch `meta-seals-moves-in-flight` (and the tests' checker) only: seals a
    /// shard move without asking whether a transaction on its shards is in flight.
    pub fn set_seal_unchecked(&mut self, unchecked: bool) {
        self.seal_unchecked = unchecked;
    }

    /// Bug switch `meta-admits-twins-of-placed-groups` (and its tests) only: a gang a
    /// Placed group declares is taken as free, so a second live group may declare it.
    pub fn set_twins_of_placed_admitted(&mut self, admitted: bool) {
        self.twins_of_placed_admitted = admitted;
    }

    /// Why queue accounting is inconsistent, if it is: a group's charge differs from
    /// what its state is due, a queue's usage from the sum of its subtree's charges, or
    /// some usage passes its queue's `max` (I8). The tests' checker calls it after
    /// every command.
    pub fn quota_violation(&self) -> Option<String> {
        for g in self.groups.values() {
            if g.charge != g.charge_due() {
                return Some(format!(
                    "group {} is charged {:?} but due {:?}",
                    g.seq,
                    g.charge,
                    g.charge_due()
                ));
            }
        }
        let fresh = self.queues.recomputed(
            self.groups
                .values()
                .filter(|g| !g.charge.is_zero())
                .map(|g| (g.group.queue.as_str(), &g.charge)),
        );
        if &fresh != self.queues.all_usage() {
            return Some(format!(
                "kept usage {:?} differs from the groups' charges {fresh:?}",
                self.queues.all_usage()
            ));
        }
        self.queues.specs().find_map(|q| {
            let used = self.queues.usage(&q.name);
            q.max.first_exceeded(&used).map(|(resource, used, max)| {
                format!(
                    "I8: queue {} uses {resource} {used} above its max {max}",
                    q.name
                )
            })
        })
    }

    fn apply_one(&mut self, cmd: &MetaCommand) -> MetaReply {
        match cmd {
            MetaCommand::AssignNode { node, shard, .. } => self.assign_node(node, *shard),
            MetaCommand::PlaceNode { node, domain, .. } => self.place_node(node, domain.as_deref()),
            MetaCommand::BeginMove {
                target,
                to,
                reason,
                at_ms,
            } => self.begin_move(target, *to, reason, *at_ms),
            MetaCommand::SealMove { id } => self.seal_move(*id),
            MetaCommand::CommitMove { id } => self.commit_move(*id),
            MetaCommand::EndMove { id, at_ms } => self.end_move(*id, *at_ms),
            MetaCommand::CancelMove { id, reason, at_ms } => self.cancel_move(*id, reason, *at_ms),
            MetaCommand::GrowShards { shards, voters } => self.grow_shards(*shards, voters),
            MetaCommand::Submit {
                key,
                group,
                at_ms,
                live_max,
            } => self.submit(key, group, *at_ms, *live_max),
            MetaCommand::BeginTxn {
                seq,
                participants,
                at_ms,
            } => self.begin_txn(*seq, participants, *at_ms),
            MetaCommand::BeginPreemption {
                seq,
                victims,
                participants,
                at_ms,
                reclaim,
            } => self.begin_preemption(*seq, victims, participants, *at_ms, *reclaim),
            MetaCommand::Decide {
                txn,
                decision,
                placements,
                reason,
                at_ms,
                delivered,
            } => self.decide(*txn, *decision, placements, reason, *at_ms, delivered),
            MetaCommand::AbortIfUndecided { txn, at_ms, shard } => {
                self.abort_if_undecided(*txn, *at_ms, *shard)
            }
            MetaCommand::Delivered { txn, shards } => self.delivered(*txn, shards),
            MetaCommand::Requeue {
                seq,
                reason,
                at_ms,
                attempts,
            } => self.requeue(*seq, reason, *at_ms, *attempts),
            MetaCommand::Expire { seq, at_ms } => self.expire(*seq, *at_ms),
            MetaCommand::Cancel { seq, at_ms } => self.cancel(*seq, *at_ms),
            MetaCommand::Release { seq, .. } => self.release(*seq),
            MetaCommand::ReleaseMembers { seq, members, .. } => self.release_members(*seq, members),
            MetaCommand::MembersReleased { seq, members, .. } => {
                self.members_released(*seq, members)
            }
            MetaCommand::ReleaseDone { seq, .. } => self.release_done(*seq),
            MetaCommand::Batch { commands } => self.batch(commands),
            MetaCommand::NoteWaiting { seq, reason } => self.note_waiting(*seq, reason),
            MetaCommand::NoteNodeAllocation {
                member,
                node,
                allocation,
            } => self.note_node_allocation(member, node, allocation),
            MetaCommand::NoteCapacity { capacity } => {
                self.queues.set_capacity(capacity.clone());
                MetaReply::Capacity {
                    capacity: Some(capacity.clone()),
                }
            }
            MetaCommand::PutQueue { queue }
                if self.kept_by_another(&queue.name, &queue.managed_by) =>
            {
                conflict(self.keeper_refusal(&queue.name))
            }
            MetaCommand::DeleteQueue { name, managed_by }
                if self.kept_by_another(name, managed_by) =>
            {
                conflict(self.keeper_refusal(name))
            }
            MetaCommand::PutQueue { queue } => match self.queues.put(queue) {
                Ok(()) => MetaReply::Queues {
                    queues: self.queue_statuses(Some(&queue.name)),
                },
                Err(reason) => rejected(reason),
            },
            MetaCommand::DeleteQueue { name, .. } => {
                let live = self.live_groups_of(name);
                match self.queues.delete(name, live) {
                    Ok(()) => MetaReply::Queues { queues: Vec::new() },
                    Err(reason) if self.queues.spec(name).is_none() => MetaReply::Rejected {
                        reason,
                        kind: RejectionKind::NotFound,
                    },
                    Err(reason) => conflict(reason),
                }
            }
        }
    }

    fn note_waiting(&mut self, seq: GroupSeq, reason: &str) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if g.state != GroupState::Queued {
            return rejected(format!(
                "gang group {seq} is {}, not Queued",
                g.state.name()
            ));
        }
        if g.reason != reason {
            g.reason = reason.to_string();
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    fn note_node_allocation(
        &mut self,
        member: &str,
        node: &str,
        allocation: &crate::model::node_allocation::NodeAllocation,
    ) -> MetaReply {
        use crate::model::node_allocation::ALLOCATIONS_PER_MEMBER_MAX;
        if let Err(e) = allocation.validate(&crate::model::FieldPath::new("allocation")) {
            return rejected(e.to_string());
        }
        let not_found = |why: String| MetaReply::Rejected {
            reason: why,
            kind: RejectionKind::NotFound,
        };
        let Some((gang, _)) = member.rsplit_once('/') else {
            return rejected(format!("member: {member:?} is not namespace/gang/member"));
        };
        let Some(seq) = self.gang_owners.get(gang).copied() else {
            return not_found(format!("member: no gang group holds gang {gang}"));
        };
        let Some(g) = self.groups.get_mut(&seq) else {
            return not_found(format!("member: no gang group holds gang {gang}"));
        };
        if let GroupState::Done { how } = g.state {
            return conflict(format!(
                "member: gang group {seq} of {member} has ended ({})",
                GroupState::Done { how }.name()
            ));
        }
        let Some(p) = g.placements.get_mut(member) else {
            return not_found(format!("member: {member} is not placed"));
        };
        if p.node != node {
            return conflict(format!(
                "node: member {member} is placed on node {}, not {node}",
                p.node
            ));
        }
        // The devices must be those gangway gave the member (a placement recovered
        // after a failover lists none here: the shard keeps them).
        if !p.devices.is_empty() {
            use crate::model::node_allocation::{device_name, driver_for};
            let driver = driver_for(&allocation.resource).unwrap_or_default();
            if let Some(stranger) = allocation.device_ids.iter().find(|id| {
                let name = device_name(id);
                !p.devices
                    .iter()
                    .any(|d| d.device.driver == driver && d.device.device == name)
            }) {
                return conflict(format!(
                    "allocation.device_ids: {stranger} is not among the {} devices gangway placed {member} on",
                    allocation.resource
                ));
            }
        }
        let kept = p.allocations.len();
        let changed = match p
            .allocations
            .iter_mut()
            .find(|a| a.resource == allocation.resource)
        {
            Some(same) if same == allocation => false,
            Some(other) => {
                *other = allocation.clone();
                true
            }
            None if kept >= ALLOCATIONS_PER_MEMBER_MAX => {
                return rejected(format!(
                    "allocation.resource: member {member} has allocations for {ALLOCATIONS_PER_MEMBER_MAX} resources, the most kept"
                ))
            }
            None => {
                p.allocations.push(allocation.clone());
                p.allocations.sort_by(|a, b| a.resource.cmp(&b.resource));
                true
            }
        };
        if changed {
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    /// Whether queue `name` exists and is kept by someone other than `by`.
    fn kept_by_another(&self, name: &str, by: &str) -> bool {
        self.queues.spec(name).is_some_and(|q| q.managed_by != by)
    }

    fn keeper_refusal(&self, name: &str) -> String {
        match self.queues.spec(name).map(|q| q.managed_by.as_str()) {
            Some("") | None => format!(
                "queue.name: queue {name} was made through the admin API; delete it there before an ElasticQuota can keep it"
            ),
            Some(by) => format!(
                "queue.name: queue {name} is kept by {by}; change or delete that object instead"
            ),
        }
    }

    /// How many groups of queue `name` have not ended.
    fn live_groups_of(&self, name: &str) -> u64 {
        self.groups
            .values()
            .filter(|g| g.group.queue == name && !g.state.is_terminal())
            .count() as u64
    }

    /// The status of one queue (`only`) or of all, in name order.
    fn queue_statuses(&self, only: Option<&str>) -> Vec<QueueStatus> {
        let mut counts: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for g in self.groups.values().filter(|g| !g.group.queue.is_empty()) {
            let entry = counts.entry(g.group.queue.as_str()).or_default();
            match g.state {
                GroupState::Queued if g.holds_nothing() => entry.0 += 1,
                GroupState::Done { .. } => {}
                _ => entry.1 += 1,
            }
        }
        self.queues
            .specs()
            .filter(|q| only.is_none_or(|n| n == q.name))
            .map(|q| {
                let (queued, admitted) = counts.get(q.name.as_str()).copied().unwrap_or_default();
                QueueStatus {
                    spec: q.clone(),
                    usage: self.queues.usage(&q.name),
                    queued,
                    admitted,
                }
            })
            .collect()
    }

    /// The pending groups in queue order, `limit` of them that the coordinator can act
    /// on, plus at most `limit` queued groups whose queues have no room (listed so their
    /// reason and deadline are kept): a full queue's backlog never hides the groups of
    /// other queues behind it.
    fn pending_past_full_queues(&self, limit: usize, due_at_ms: Option<u64>) -> Vec<GroupRecord> {
        let (mut queued, mut rest): (Vec<&GroupRecord>, Vec<&GroupRecord>) = self
            .groups
            .values()
            .filter(|r| r.is_pending() && r.is_due(due_at_ms))
            .partition(|r| r.state == GroupState::Queued);
        rest.sort_by_key(|r| r.order_key());
        queued.sort_by_key(|r| r.order_key());
        // Lazy: only the groups this read takes are charged and ordered.
        let fair = self.queues.fair_order(
            queued
                .into_iter()
                .map(|r| (r.group.queue.clone(), r))
                .collect(),
            |r| r.charge_to_place(),
        );
        let (mut actionable, mut waiting) = (0usize, 0usize);
        let mut out = Vec::new();
        for r in rest.into_iter().chain(fair) {
            if actionable >= limit {
                break;
            }
            let no_room = r.state == GroupState::Queued
                && !r.group.queue.is_empty()
                && self.quota_refusal(r.seq).is_some();
            if no_room {
                if waiting >= limit {
                    continue;
                }
                waiting += 1;
            } else {
                actionable += 1;
            }
            out.push(r.clone());
        }
        out
    }

    /// What queued group `seq` may reclaim: placed groups of other queues, youngest
    /// first, each taken only while its queue keeps at least its `min` of every resource
    /// the min names (what the queue borrowed, and nothing of its guarantee). Refused
    /// unless `seq` is a queued group of a queue whose `min` covers it: its queue's usage
    /// plus its charge stays within `min` on every resource `min` names (a queue without
    /// a `min` reclaims nothing).
    pub fn reclaimable(&self, seq: GroupSeq) -> Result<Vec<GroupSeq>, String> {
        let g = self
            .groups
            .get(&seq)
            .ok_or_else(|| format!("seq: no gang group {seq}"))?;
        if g.state != GroupState::Queued || !g.holds_nothing() {
            return Err(format!(
                "seq: gang group {seq} is {} and holds {} members; only a queued group that holds nothing reclaims",
                g.state.name(),
                g.placements.len() + g.releasing.len()
            ));
        }
        let queue = self
            .queues
            .spec(&g.group.queue)
            .ok_or_else(|| format!("seq: gang group {seq} has no queue to reclaim for"))?;
        if queue.min.is_empty() {
            return Ok(Vec::new());
        }
        let after = self
            .queues
            .usage(&queue.name)
            .saturating_add(&g.charge_to_place());
        if let Some((resource, used, min)) = queue.min.first_exceeded(&after) {
            return Err(format!(
                "queue {}: {resource} would be {} of min {}; reclaim takes back only what min guarantees",
                queue.name,
                crate::model::queue::Amount(&resource, used),
                crate::model::queue::Amount(&resource, min)
            ));
        }
        let mut taken: BTreeMap<&str, Resources> = BTreeMap::new();
        let mut out = Vec::new();
        for v in self.groups.values().rev() {
            let other = !v.group.queue.is_empty() && v.group.queue != queue.name;
            if !other || v.state != GroupState::Placed || !v.releasing.is_empty() {
                continue;
            }
            let Some(vq) = self.queues.spec(&v.group.queue) else {
                continue;
            };
            let gone = taken
                .get(vq.name.as_str())
                .cloned()
                .unwrap_or_default()
                .saturating_add(&v.charge);
            let left = self.queues.usage(&vq.name).saturating_sub(&gone);
            // A guarantee is kept when the queue stays at its min, or loses none of it.
            let keeps_min = vq
                .min
                .iter()
                .all(|(r, min)| gone.get(&r) == 0 || left.get(&r) >= min);
            if keeps_min {
                taken.insert(vq.name.as_str(), gone);
                out.push(v.seq);
            }
        }
        Ok(out)
    }

    /// Why group `seq`'s queue cannot take the charge of placing it now, if it cannot.
    fn quota_refusal(&self, seq: GroupSeq) -> Option<String> {
        if self.quota_unchecked {
            return None;
        }
        let g = self.groups.get(&seq)?;
        if g.group.queue.is_empty() {
            return None;
        }
        self.queues.refusal(&g.group.queue, &g.charge_to_place())
    }

    fn batch(&mut self, commands: &[MetaCommand]) -> MetaReply {
        if commands.len() > META_BATCH_MAX {
            return rejected(format!(
                "commands: {} in one batch, at most {META_BATCH_MAX}",
                commands.len()
            ));
        }
        let replies = commands
            .iter()
            .map(|cmd| match cmd {
                MetaCommand::Batch { .. } => rejected("commands: a batch cannot hold a batch"),
                one => self.apply(one),
            })
            .collect();
        MetaReply::Batch { replies }
    }

    /// Answers a query.
    pub fn query(&self, q: &MetaQuery) -> MetaReply {
        match q {
            MetaQuery::Moves => MetaReply::Moves {
                moves: self.moves(),
            },
            MetaQuery::SealBlocker { id } => MetaReply::SealBlocker {
                reason: self.seal_blocker(*id),
            },
            MetaQuery::ShardShares => MetaReply::ShardShares {
                shares: self.shares(),
            },
            MetaQuery::MappedNodes => MetaReply::MappedNodes {
                nodes: self.mapped_nodes(),
            },
            MetaQuery::ShardOf { node } => match self.shard_map.get(node) {
                Some(shard) => MetaReply::Shard { shard: *shard },
                None => MetaReply::NotAssigned,
            },
            MetaQuery::ShardSet => self.shard_set(),
            MetaQuery::ShardMap => MetaReply::ShardMap {
                map: self.shard_map.clone(),
            },
            MetaQuery::Group { seq } => match self.groups.get(seq) {
                Some(r) => MetaReply::Group {
                    group: Box::new(GroupSummary::of(r)),
                },
                None => missing(*seq),
            },
            MetaQuery::Groups { active_only } => MetaReply::Groups {
                records: self.in_queue_order(*active_only).cloned().collect(),
            },
            MetaQuery::Summaries { active_only } => MetaReply::Summaries {
                groups: self
                    .in_queue_order(*active_only)
                    .map(GroupSummary::of)
                    .collect(),
            },
            MetaQuery::Versions => MetaReply::Versions {
                groups: self.groups.values().map(|r| (r.seq, r.version)).collect(),
            },
            MetaQuery::ChangedSince { after, limit } => self.changed_since(*after, *limit),
            MetaQuery::SubmittedPods { after, limit } => {
                let mut groups = Vec::new();
                let mut more = false;
                let later = self.groups.range((
                    std::ops::Bound::Excluded(*after),
                    std::ops::Bound::Unbounded,
                ));
                for (_, record) in later {
                    if groups.len() >= (*limit).max(1) as usize {
                        more = true;
                        break;
                    }
                    groups.extend(SubmittedPods::of(record));
                }
                MetaReply::SubmittedPods { groups, more }
            }
            MetaQuery::SummariesOf { seqs } => MetaReply::Summaries {
                groups: seqs
                    .iter()
                    .filter_map(|seq| self.groups.get(seq))
                    .map(GroupSummary::of)
                    .collect(),
            },
            MetaQuery::Pending { limit, due_at_ms } if !self.queues.is_empty() => {
                MetaReply::Groups {
                    records: self.pending_past_full_queues(*limit as usize, *due_at_ms),
                }
            }
            MetaQuery::Pending { limit, due_at_ms } => {
                // Ordered by reference and cut before cloning: the queue may hold
                // thousands of groups while a round takes a few hundred.
                let mut records: Vec<&GroupRecord> = self
                    .groups
                    .values()
                    .filter(|r| r.is_pending() && r.is_due(*due_at_ms))
                    .collect();
                let limit = (*limit as usize).min(records.len());
                if limit < records.len() {
                    records.select_nth_unstable_by_key(limit, |r| r.order_key());
                    records.truncate(limit);
                }
                records.sort_by_key(|r| r.order_key());
                MetaReply::Groups {
                    records: records.into_iter().cloned().collect(),
                }
            }
            MetaQuery::LowestPlacedPriority => MetaReply::LowestPriority {
                priority: self
                    .groups
                    .values()
                    .filter(|g| g.state == GroupState::Placed)
                    .map(GroupRecord::highest_priority)
                    .min(),
            },
            MetaQuery::LowestPlacedPriorityWithin { root } => MetaReply::LowestPriority {
                priority: self
                    .groups
                    .values()
                    .filter(|g| g.state == GroupState::Placed)
                    .filter(|g| !root.is_empty() && self.queues.within(&g.group.queue, root))
                    .map(GroupRecord::highest_priority)
                    .min(),
            },
            MetaQuery::OwnersOf { gangs } => {
                let seqs: BTreeSet<GroupSeq> =
                    gangs.iter().filter_map(|g| self.live_owner(g)).collect();
                MetaReply::Groups {
                    records: seqs
                        .iter()
                        .filter_map(|seq| self.groups.get(seq))
                        .cloned()
                        .collect(),
                }
            }
            MetaQuery::Txn { txn } => MetaReply::Txn {
                record: self.txns.get(txn).cloned(),
            },
            MetaQuery::Undelivered { limit } => MetaReply::Undelivered {
                txns: self
                    .undelivered
                    .iter()
                    .filter_map(|t| self.txns.get(t))
                    .filter_map(|t| {
                        Some(Undelivered {
                            txn: t.txn,
                            decision: t.decision?,
                            shards: t.unacked.clone(),
                            alone: t.participants.len() == 1,
                        })
                    })
                    .take(*limit as usize)
                    .collect(),
            },
            MetaQuery::Queues => MetaReply::Queues {
                queues: self.queue_statuses(None),
            },
            MetaQuery::Reclaimable { seq } => match self.reclaimable(*seq) {
                Ok(victims) => MetaReply::Reclaimable { victims },
                Err(reason) => rejected(reason),
            },
            MetaQuery::QuotaRefusals { seqs } => MetaReply::QuotaRefusals {
                refusals: seqs
                    .iter()
                    .filter_map(|seq| Some((*seq, self.quota_refusal(*seq)?)))
                    .collect(),
            },
            MetaQuery::Capacity => MetaReply::Capacity {
                capacity: self.queues.capacity().cloned(),
            },
            MetaQuery::RecentTxns { limit } => MetaReply::Txns {
                txns: self
                    .txns
                    .values()
                    .rev()
                    .take(*limit as usize)
                    .cloned()
                    .collect(),
            },
            MetaQuery::StateCounts => {
                let mut counts: BTreeMap<String, u64> = GroupState::NAMES
                    .iter()
                    .map(|n| (n.to_string(), 0))
                    .collect();
                for r in self.groups.values() {
                    *counts.entry(r.state.name().to_string()).or_default() += 1;
                }
                MetaReply::StateCounts { counts }
            }
            MetaQuery::Owned { owner, key } => {
                let live =
                    |seq: &GroupSeq| self.groups.get(seq).is_some_and(|g| !g.state.is_terminal());
                let n = match self.owned.0.as_ref() {
                    Some(owned) => owned
                        .get(owner)
                        .map_or(0, |s| s.iter().filter(|q| live(q)).count()),
                    // Not built yet on this replica: count the hard way once.
                    None => self
                        .groups
                        .values()
                        .filter(|g| g.group.owner == *owner && !g.state.is_terminal())
                        .count(),
                };
                MetaReply::Owned {
                    live: n as u64,
                    has_key: self.keys.contains_key(&owned_key(owner, key)),
                }
            }
        }
    }

    fn submit(
        &mut self,
        key: &str,
        group: &GangGroup,
        at_ms: u64,
        live_max: Option<u32>,
    ) -> MetaReply {
        if key.is_empty() {
            return rejected("idempotency_key: must not be empty");
        }
        let scoped = owned_key(&group.owner, key);
        if let Some(seq) = self.keys.get(&scoped) {
            if let Some(existing) = self.groups.get(seq) {
                if !same_body(&existing.group, group) {
                    return conflict(format!(
                        "idempotency_key: {} was used for gang group {seq} with another body; use a new key for a new group",
                        short(key)
                    ));
                }
            }
            return MetaReply::Submitted {
                seq: *seq,
                created: false,
                summary: self.groups.get(seq).map(|r| Box::new(GroupSummary::of(r))),
            };
        }
        if let Err(e) = group.validate(&crate::model::FieldPath::root()) {
            return rejected(e.to_string());
        }
        if !group.queue.is_empty() && self.queues.spec(&group.queue).is_none() {
            return MetaReply::Rejected {
                reason: format!(
                    "queue: no queue {}; create it first (gangctl queues put)",
                    short(&group.queue)
                ),
                kind: RejectionKind::NotFound,
            };
        }
        if let Some(max) = live_max {
            let live = self.live_count(&group.owner);
            if live >= max as usize {
                return MetaReply::Rejected {
                    reason: format!(
                        "owner: {} has {live} gang groups that have not ended, its most; release or cancel some first",
                        short(&group.owner)
                    ),
                    kind: RejectionKind::Exhausted,
                };
            }
        }
        for (i, gang) in group.gangs.iter().enumerate() {
            let name = gang_name(gang);
            if let Some(owner) = self.live_owner(&name) {
                return conflict(format!(
                    "gangs[{i}]: gang {} is already declared by gang group {owner}, which has not ended; release or cancel it first",
                    short(&name)
                ));
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut group = group.clone();
        for gang in &mut group.gangs {
            gang.creation_order = seq;
            self.gang_owners.insert(gang_name(gang), seq);
        }
        let deadline_ms = group
            .gangs
            .iter()
            .filter(|g| g.wait_time_ms > 0)
            .map(|g| at_ms.saturating_add(g.wait_time_ms))
            .min();
        let priority = group.gangs.iter().map(|g| g.priority).max().unwrap_or(0);
        let mut record = GroupRecord {
            seq,
            key: key.to_string(),
            group,
            state: GroupState::Queued,
            submitted_at_ms: at_ms,
            deadline_ms,
            attempts: 0,
            not_before_ms: at_ms,
            reason: String::new(),
            placements: BTreeMap::new(),
            version: 0,
            priority,
            txn: None,
            releasing: BTreeMap::new(),
            charge: Resources::zero(),
        };
        record.bump(&mut self.last_version);
        if !record.group.owner.is_empty() {
            let owner = record.group.owner.clone();
            self.owned_groups().entry(owner).or_default().insert(seq);
        }
        self.groups.insert(seq, record);
        self.keys.insert(scoped, seq);
        self.forget_old_groups();
        MetaReply::Submitted {
            seq,
            created: true,
            summary: self.groups.get(&seq).map(|r| Box::new(GroupSummary::of(r))),
        }
    }

    fn changed_since(&self, after: u64, limit: u32) -> MetaReply {
        let mut changed: Vec<&GroupRecord> =
            self.groups.values().filter(|g| g.version > after).collect();
        changed.sort_unstable_by_key(|g| g.version);
        let more = changed.len() > limit as usize;
        changed.truncate(limit as usize);
        let newest = changed.last().map_or(after, |g| g.version);
        // Without `more` everything is listed: the next stamp is the log's (or, for
        // data from before stamps were global, the newest version listed).
        let stamp = if more {
            newest
        } else {
            newest.max(self.last_version)
        };
        MetaReply::Changed {
            groups: changed.into_iter().map(GroupSummary::of).collect(),
            stamp,
            more,
            forgotten: self.forgotten,
        }
    }

    fn owned_groups(&mut self) -> &mut BTreeMap<String, BTreeSet<GroupSeq>> {
        let groups = &self.groups;
        self.owned.0.get_or_insert_with(|| {
            let mut owned: BTreeMap<String, BTreeSet<GroupSeq>> = BTreeMap::new();
            for g in groups.values() {
                if !g.group.owner.is_empty() && !g.state.is_terminal() {
                    owned
                        .entry(g.group.owner.clone())
                        .or_default()
                        .insert(g.seq);
                }
            }
            owned
        })
    }

    /// How many of `owner`'s groups have not ended (pruning those that have).
    fn live_count(&mut self, owner: &str) -> usize {
        self.owned_groups();
        let groups = &self.groups;
        match self.owned.0.as_mut().and_then(|o| o.get_mut(owner)) {
            Some(seqs) => {
                seqs.retain(|s| groups.get(s).is_some_and(|g| !g.state.is_terminal()));
                seqs.len()
            }
            None => 0,
        }
    }

    /// The live group that declared gang `name`, if any.
    fn live_owner(&self, name: &str) -> Option<GroupSeq> {
        let seq = self.gang_owners.get(name)?;
        self.groups
            .get(seq)
            .filter(|g| !g.state.is_terminal())
            .filter(|g| !(self.twins_of_placed_admitted && g.state == GroupState::Placed))
            .map(|g| g.seq)
    }

    fn begin_txn(&mut self, seq: GroupSeq, participants: &[u32], at_ms: u64) -> MetaReply {
        let Some(record) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        if record.state != GroupState::Queued {
            return rejected(format!(
                "gang group {seq} is {}, not Queued",
                record.state.name()
            ));
        }
        if participants.is_empty() {
            return rejected("participants: a transaction needs at least one shard");
        }
        if let Some(bad) = participants.iter().find(|s| **s == 0 || **s > self.shards) {
            return rejected(format!(
                "participants: shard {bad} is not in 1..={}",
                self.shards
            ));
        }
        // I8: the queue is charged here, in the entry that lets reservations begin.
        if let Some(why) = self.quota_refusal(seq) {
            return MetaReply::Rejected {
                reason: why,
                kind: RejectionKind::NoRoom,
            };
        }
        let Some(record) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        // Never reuse an id that already has a record (e.g. a tombstone).
        while self.txns.contains_key(&TxnId(self.next_txn)) {
            self.next_txn += 1;
        }
        let txn = TxnId(self.next_txn);
        self.next_txn += 1;
        record.state = GroupState::Placing { txn };
        record.txn = Some(txn);
        record.bump(&mut self.last_version);
        let mut participants = participants.to_vec();
        participants.sort_unstable();
        participants.dedup();
        self.txns.insert(
            txn,
            TxnRecord {
                txn,
                group: Some(seq),
                participants,
                decision: None,
                began_at_ms: at_ms,
                unacked: Vec::new(),
                victims: Vec::new(),
            },
        );
        MetaReply::TxnBegun { txn }
    }

    /// Refuses, naming the field, a preemption whose preemptor or victims are not in
    /// the states rule 14 needs; otherwise begins it like [`Self::begin_txn`] and marks
    /// the victims `Preempting`.
    fn begin_preemption(
        &mut self,
        seq: GroupSeq,
        victims: &[GroupSeq],
        participants: &[u32],
        at_ms: u64,
        reclaim: bool,
    ) -> MetaReply {
        if let Err(reason) = self.preemption_refusal(seq, victims, participants, reclaim) {
            return rejected(reason);
        }
        let reply = self.begin_txn(seq, participants, at_ms);
        let MetaReply::TxnBegun { txn } = reply else {
            return reply;
        };
        let mut victims = victims.to_vec();
        victims.sort_unstable();
        if let Some(t) = self.txns.get_mut(&txn) {
            t.victims = victims.clone();
        }
        for v in victims {
            if let Some(g) = self.groups.get_mut(&v) {
                g.state = GroupState::Preempting { txn, by: seq };
                g.reason = format!("being preempted by gang group {seq} ({txn})");
                g.bump(&mut self.last_version);
            }
        }
        MetaReply::TxnBegun { txn }
    }

    fn preemption_refusal(
        &self,
        seq: GroupSeq,
        victims: &[GroupSeq],
        participants: &[u32],
        reclaim: bool,
    ) -> Result<(), String> {
        let Some(preemptor) = self.groups.get(&seq) else {
            return Err(format!("seq: no gang group {seq}"));
        };
        if preemptor.state != GroupState::Queued || !preemptor.holds_nothing() {
            return Err(format!(
                "seq: gang group {seq} is {} and holds {} members; only a queued group that holds nothing preempts",
                preemptor.state.name(),
                preemptor.placements.len() + preemptor.releasing.len()
            ));
        }
        if let Some((i, _)) = preemptor
            .group
            .gangs
            .iter()
            .enumerate()
            .find(|(_, g)| g.members.iter().any(|m| m.spec.preemption_policy.never()))
        {
            return Err(format!(
                "seq: gang group {seq}: gangs[{i}] has a member with preemptionPolicy Never"
            ));
        }
        if victims.is_empty() {
            return Err("victims: a preemption names at least one victim group".into());
        }
        let priority = preemptor.highest_priority();
        let reclaimable: BTreeSet<GroupSeq> = match reclaim {
            true => self.reclaimable(seq)?.into_iter().collect(),
            false => BTreeSet::new(),
        };
        let mut seen = BTreeSet::new();
        for (i, v) in victims.iter().enumerate() {
            if !seen.insert(*v) {
                return Err(format!("victims[{i}]: gang group {v} is named twice"));
            }
            if *v == seq {
                return Err(format!("victims[{i}]: a group cannot preempt itself"));
            }
            let Some(victim) = self.groups.get(v) else {
                return Err(format!("victims[{i}]: no gang group {v}"));
            };
            if victim.state != GroupState::Placed || !victim.releasing.is_empty() {
                return Err(format!(
                    "victims[{i}]: gang group {v} is {}{}, not Placed",
                    victim.state.name(),
                    if victim.releasing.is_empty() {
                        ""
                    } else {
                        " with members being released"
                    }
                ));
            }
            if reclaim && !reclaimable.contains(v) {
                return Err(format!(
                    "victims[{i}]: gang group {v} is not among what queue {} may reclaim (groups of other queues above their min, youngest first, none taking its queue below min)",
                    preemptor.group.queue
                ));
            }
            // A queue's reclaim of its own `min` takes from borrowers wherever they are:
            // the boundary bounds preemption by priority only.
            if let (Some(root), false) = (&preemptor.group.preempts_within, reclaim) {
                if root.is_empty() || !self.queues.within(&victim.group.queue, root) {
                    return Err(format!(
                        "victims[{i}]: gang group {v} is charged to queue {:?}, outside the preemptor's boundary (queue {root} and the queues under it)",
                        victim.group.queue
                    ));
                }
            }
            if !reclaim && victim.highest_priority() >= priority {
                return Err(format!(
                    "victims[{i}]: gang group {v} has priority {}, not below the preemptor's {priority}",
                    victim.highest_priority()
                ));
            }
            if let Some(p) = victim
                .placements
                .values()
                .find(|p| !participants.contains(&p.shard))
            {
                return Err(format!(
                    "participants: shard {} holds members of victim gang group {v} and must take part",
                    p.shard
                ));
            }
        }
        Ok(())
    }

    /// Settles the victims of preemption `txn` once its decision allows: COMMIT ends
    /// them `Preempted` at once (the participants free their members as they commit);
    /// ABORT returns them to `Placed` only when every participant applied it, since
    /// until then a participant still holds their room displaced, and a release that
    /// reached it first would find nothing to free. Victims no longer `Preempting` for
    /// `txn` are left as they are.
    fn settle_victims(&mut self, txn: TxnId) {
        let Some(t) = self.txns.get(&txn) else {
            return;
        };
        let decision = match t.decision {
            Some(Decision::Commit) => Decision::Commit,
            Some(Decision::Abort) if t.unacked.is_empty() => Decision::Abort,
            _ => return,
        };
        let victims = t.victims.clone();
        let by = t.group.unwrap_or_default();
        if victims.is_empty() {
            return;
        }
        if decision == Decision::Commit {
            if let Some(g) = self.groups.get_mut(&by) {
                if g.state == GroupState::Placed && g.txn == Some(txn) {
                    let names: Vec<String> = victims.iter().map(u64::to_string).collect();
                    g.reason = format!(
                        "placed by preempting gang groups {} ({txn})",
                        names.join(", ")
                    );
                }
            }
        }
        for v in victims {
            let Some(g) = self.groups.get_mut(&v) else {
                continue;
            };
            if !matches!(g.state, GroupState::Preempting { txn: t, .. } if t == txn) {
                continue;
            }
            match decision {
                Decision::Commit => {
                    g.state = GroupState::Done {
                        how: Terminal::Preempted,
                    };
                    g.placements.clear();
                    g.reason = format!("preempted by gang group {by} ({txn})");
                }
                Decision::Abort => {
                    g.state = GroupState::Placed;
                    g.reason = format!("preemption by gang group {by} ({txn}) was aborted");
                }
            }
            g.bump(&mut self.last_version);
        }
    }

    fn abort_if_undecided(&mut self, txn: TxnId, at_ms: u64, shard: Option<u32>) -> MetaReply {
        if !self.txns.contains_key(&txn) {
            // A tombstone: no record means no coordinator will ever commit it. The
            // asking shard is its one participant, and must acknowledge it.
            let participants: Vec<u32> = shard.into_iter().collect();
            self.record_decision_of_unknown(txn, participants, at_ms);
            return MetaReply::Decided {
                txn,
                decision: Decision::Abort,
            };
        }
        self.decide(
            txn,
            Decision::Abort,
            &BTreeMap::new(),
            "reservation deadline passed",
            at_ms,
            &[],
        )
    }

    fn record_decision_of_unknown(&mut self, txn: TxnId, participants: Vec<u32>, at_ms: u64) {
        let unacked = participants.clone();
        self.txns.insert(
            txn,
            TxnRecord {
                txn,
                group: None,
                participants,
                decision: Some(Decision::Abort),
                began_at_ms: at_ms,
                unacked,
                victims: Vec::new(),
            },
        );
        self.note_delivery(txn);
        self.forget_old_txns();
    }

    fn decide(
        &mut self,
        txn: TxnId,
        decision: Decision,
        placements: &BTreeMap<String, Placement>,
        reason: &str,
        at_ms: u64,
        delivered: &[u32],
    ) -> MetaReply {
        let Some(record) = self.txns.get(&txn) else {
            if decision == Decision::Abort {
                self.record_decision_of_unknown(txn, Vec::new(), at_ms);
                return MetaReply::Decided { txn, decision };
            }
            return rejected(format!(
                "txn: {txn} is unknown; only an abort can be recorded for it"
            ));
        };
        if let Some(existing) = record.decision {
            return MetaReply::Decided {
                txn,
                decision: existing,
            };
        }
        let group = record.group;
        let placing = group
            .and_then(|seq| self.groups.get(&seq))
            .filter(|g| g.state == (GroupState::Placing { txn }));
        // The commit point refuses a second hold of a member the group already holds
        // (I3): recorded as ABORT, every participant is told and frees what it took.
        let twice = match (decision, placing) {
            (Decision::Commit, Some(g)) => placements.keys().find(|m| g.holds(m)).cloned(),
            _ => None,
        };
        let (decision, reason, delivered) = match &twice {
            Some(member) => (
                Decision::Abort,
                format!("member {member} is already placed; a commit may not place it twice"),
                &[][..],
            ),
            None => (decision, reason.to_string(), delivered),
        };
        let Some(record) = self.txns.get_mut(&txn) else {
            return rejected(format!("txn: {txn} is unknown"));
        };
        record.decision = Some(decision);
        record.unacked = record
            .participants
            .iter()
            .copied()
            .filter(|s| !delivered.contains(s))
            .collect();
        self.note_delivery(txn);
        if let Some(g) = group.and_then(|seq| self.groups.get_mut(&seq)) {
            if g.state == (GroupState::Placing { txn }) {
                apply_decision(
                    g,
                    &mut self.last_version,
                    txn,
                    decision,
                    placements,
                    &reason,
                    at_ms,
                );
            }
        }
        self.settle_victims(txn);
        self.forget_old_txns();
        MetaReply::Decided { txn, decision }
    }

    fn delivered(&mut self, txn: TxnId, shards: &[u32]) -> MetaReply {
        let Some(record) = self.txns.get_mut(&txn) else {
            return rejected(format!("txn: {txn} is unknown"));
        };
        let Some(decision) = record.decision else {
            return rejected(format!("txn: {txn} is undecided; nothing was delivered"));
        };
        record.unacked.retain(|s| !shards.contains(s));
        self.note_delivery(txn);
        self.settle_victims(txn);
        self.forget_old_txns();
        MetaReply::Decided { txn, decision }
    }

    /// Keeps the undelivered index in step with one record's `unacked`.
    fn note_delivery(&mut self, txn: TxnId) {
        let pending = self
            .txns
            .get(&txn)
            .is_some_and(|t| t.decision.is_some() && !t.unacked.is_empty());
        if pending {
            self.undelivered.insert(txn);
        } else {
            self.undelivered.remove(&txn);
        }
    }

    fn requeue(
        &mut self,
        seq: GroupSeq,
        reason: &str,
        at_ms: u64,
        attempts: Option<u32>,
    ) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        if g.state != GroupState::Queued {
            return rejected(format!(
                "gang group {seq} is {}, not Queued",
                g.state.name()
            ));
        }
        if attempts.is_none_or(|seen| seen == g.attempts) {
            g.attempts += 1;
            g.reason = reason.to_string();
            g.bump(&mut self.last_version);
            if g.deadline_ms.is_some_and(|d| d <= at_ms) {
                g.state = g.timed_out();
            } else {
                g.not_before_ms = at_ms.saturating_add(retry_backoff_ms(g.attempts));
            }
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    fn expire(&mut self, seq: GroupSeq, at_ms: u64) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        let due = g.deadline_ms.is_some_and(|d| d <= at_ms);
        if g.state == GroupState::Queued && due {
            g.state = g.timed_out();
            g.reason = format!(
                "waitTime passed before the group could be placed ({})",
                g.reason
            );
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    fn cancel(&mut self, seq: GroupSeq, at_ms: u64) -> MetaReply {
        let Some(g) = self.groups.get(&seq) else {
            return missing(seq);
        };
        let cancelled = GroupState::Releasing {
            then: Terminal::Cancelled,
        };
        let next = match g.state {
            GroupState::Queued if g.holds_nothing() => GroupState::Done {
                how: Terminal::Cancelled,
            },
            GroupState::Queued | GroupState::Placed => cancelled,
            GroupState::Placing { txn } => {
                // Abort the undecided transaction first, so a late commit cannot land;
                // every participant must then be told (and acknowledge).
                if let Some(t) = self.txns.get_mut(&txn) {
                    if t.decision.is_none() {
                        t.decision = Some(Decision::Abort);
                        t.unacked = t.participants.clone();
                    }
                }
                self.note_delivery(txn);
                cancelled
            }
            GroupState::Preempting { txn, by } => {
                return rejected(format!(
                    "gang group {seq} is being preempted by gang group {by} ({txn}); it ends Preempted, or returns to Placed once every shard applied the decision; cancel it then"
                ))
            }
            state @ (GroupState::Releasing { .. } | GroupState::Done { .. }) => state,
        };
        let _ = at_ms;
        self.set_state(seq, next)
    }

    fn release(&mut self, seq: GroupSeq) -> MetaReply {
        let Some(state) = self.groups.get(&seq).map(|g| g.state) else {
            return missing(seq);
        };
        match state {
            GroupState::Placed => self.set_state(
                seq,
                GroupState::Releasing {
                    then: Terminal::Released,
                },
            ),
            GroupState::Releasing { .. } | GroupState::Done { .. } => self.set_state(seq, state),
            GroupState::Preempting { txn, by } => rejected(format!(
                "gang group {seq} is being preempted by gang group {by} ({txn}); it ends Preempted, or returns to Placed once every shard applied the decision"
            )),
            other => rejected(format!(
                "gang group {seq} is {}, not Placed; cancel it instead",
                other.name()
            )),
        }
    }

    /// ReleaseMembers' first phase: the members leave `placements` for `releasing`
    /// here, before any shard frees them, so a refusal changes nothing anywhere and a
    /// placed member is never freed behind meta's back. A retry finds them releasing.
    fn release_members(&mut self, seq: GroupSeq, members: &[String]) -> MetaReply {
        if let Some(refusal) = self.release_waits_for_move(seq, members) {
            return refusal;
        }
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if members.is_empty() {
            return rejected("members: name at least one member");
        }
        let retried = members.iter().all(|m| g.releasing.contains_key(m));
        if let GroupState::Preempting { txn, by } = g.state {
            return rejected(format!(
                "gang group {seq} is being preempted by gang group {by} ({txn}): its members leave with it, or stay placed if the preemption is aborted"
            ));
        }
        if g.state != GroupState::Placed && !retried {
            return rejected(format!(
                "gang group {seq} is {}, not Placed: only a placed group's members can be released (cancel the group instead)",
                g.state.name()
            ));
        }
        if let Some((i, unknown)) = members.iter().enumerate().find(|(_, m)| !g.holds(m)) {
            return rejected(format!(
                "members[{i}]: {} is not a placed member of gang group {seq}",
                short(unknown)
            ));
        }
        let group_txn = g.txn.filter(|t| {
            self.txns
                .get(t)
                .is_some_and(|r| r.decision == Some(Decision::Commit))
        });
        let mut changed = false;
        for m in members {
            if let Some(mut p) = g.placements.remove(m) {
                p.txn = p.txn.or(group_txn);
                g.releasing.insert(m.clone(), p);
                changed = true;
            }
        }
        if changed {
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    /// ReleaseMembers' second phase: the shards freed these members. Members no longer
    /// releasing are passed over (a retried entry); a placed group that holds nothing
    /// any more ends Released. Entries logged before the first phase existed named
    /// placed members directly: those are taken out of `placements`.
    fn members_released(&mut self, seq: GroupSeq, members: &[String]) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        let mut changed = false;
        for m in members {
            let legacy = g.state == GroupState::Placed && g.placements.contains_key(m);
            if g.releasing.remove(m).is_some() || (legacy && g.placements.remove(m).is_some()) {
                changed = true;
            }
        }
        if changed {
            g.bump(&mut self.last_version);
            if g.state == GroupState::Placed && g.holds_nothing() {
                g.state = GroupState::Done {
                    how: Terminal::Released,
                };
            }
        }
        self.answer_with_group(seq)
    }

    fn release_done(&mut self, seq: GroupSeq) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if let GroupState::Releasing { then } = g.state {
            // The coordinator freed placements and releasing members alike.
            g.releasing.clear();
            g.state = GroupState::Done { how: then };
            g.bump(&mut self.last_version);
        }
        self.answer_with_group(seq)
    }

    fn set_state(&mut self, seq: GroupSeq, state: GroupState) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if g.state != state {
            g.state = state;
            g.bump(&mut self.last_version);
        }
        self.answer_with_group(seq)
    }

    /// Group `seq`'s summary as the reply, taken before old terminal groups are
    /// forgotten (it may be one of them).
    fn answer_with_group(&mut self, seq: GroupSeq) -> MetaReply {
        let reply = match self.groups.get(&seq) {
            Some(g) => MetaReply::Group {
                group: Box::new(GroupSummary::of(g)),
            },
            None => missing(seq),
        };
        self.forget_old_groups();
        reply
    }

    /// Forgets the oldest terminal groups once more than [`FINISHED_GROUPS_MAX`] are kept,
    /// down to nine tenths of it, so the scan runs once per many finished groups rather
    /// than on every command.
    fn forget_old_groups(&mut self) {
        if self.groups.len() <= FINISHED_GROUPS_MAX {
            return;
        }
        let terminal: Vec<GroupSeq> = self
            .groups
            .values()
            .filter(|g| g.state.is_terminal())
            .map(|g| g.seq)
            .collect();
        if terminal.len() <= FINISHED_GROUPS_MAX {
            return;
        }
        let excess = terminal.len() - FINISHED_GROUPS_MAX * 9 / 10;
        for seq in terminal.into_iter().take(excess) {
            if let Some(g) = self.groups.remove(&seq) {
                assert!(
                    g.charge.is_zero(),
                    "ended group {seq} forgotten while charged {:?}",
                    g.charge
                );
                self.keys.remove(&owned_key(&g.group.owner, &g.key));
                if let Some(owned) = self.owned.0.as_mut() {
                    if let Some(seqs) = owned.get_mut(&g.group.owner) {
                        seqs.remove(&seq);
                        if seqs.is_empty() {
                            owned.remove(&g.group.owner);
                        }
                    }
                }
                self.forgotten += 1;
            }
        }
        let groups = &self.groups;
        self.gang_owners.retain(|_, seq| groups.contains_key(seq));
    }

    /// Forgets the oldest decided transactions that every participant acknowledged,
    /// once more than [`DECIDED_TXNS_MAX`] are kept, down to nine tenths of it (as
    /// [`Self::forget_old_groups`]). An unacknowledged decision is never forgotten: its
    /// participant may still ask, and "no record" would make it abort a commit.
    fn forget_old_txns(&mut self) {
        if self.txns.len() <= DECIDED_TXNS_MAX {
            return;
        }
        let done: Vec<TxnId> = self
            .txns
            .values()
            .filter(|t| t.decision.is_some() && t.unacked.is_empty())
            .map(|t| t.txn)
            .collect();
        if done.len() <= DECIDED_TXNS_MAX {
            return;
        }
        let excess = done.len() - DECIDED_TXNS_MAX * 9 / 10;
        for txn in done.into_iter().take(excess) {
            self.txns.remove(&txn);
        }
    }

    /// Bug switch `meta-returns-victims-at-abort` (and the two-phase model's) only:
    /// returns every victim of an aborted preemption to `Placed` at once, before every
    /// participant put it back, as a first version of rule 14 did. Never called in
    /// production.
    pub fn settle_aborted_preemptions_early(&mut self) {
        let aborted: Vec<TxnId> = self
            .txns
            .values()
            .filter(|t| t.decision == Some(Decision::Abort) && !t.victims.is_empty())
            .map(|t| t.txn)
            .collect();
        for txn in aborted {
            if let Some(t) = self.txns.get_mut(&txn) {
                let unacked = std::mem::take(&mut t.unacked);
                self.settle_victims(txn);
                if let Some(t) = self.txns.get_mut(&txn) {
                    t.unacked = unacked;
                }
            }
        }
    }

    /// Bug switch `meta-forgets-unacknowledged-decisions` only: forgets every decided
    /// transaction, acknowledged or not, which rule 5 forbids. Never called in production.
    pub fn forget_decisions_unacknowledged(&mut self) {
        self.txns.retain(|_, t| t.decision.is_none());
        self.undelivered.clear();
    }
}

/// Most characters of client input echoed in a refusal.
pub const ECHO_CHARS_MAX: usize = 128;

/// `text`, cut to [`ECHO_CHARS_MAX`] characters for a message.
fn short(text: &str) -> String {
    match text.char_indices().nth(ECHO_CHARS_MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

fn gang_name(gang: &crate::model::Gang) -> String {
    format!("{}/{}", gang.namespace, gang.name)
}

/// Whether a resubmission carries the body first stored under its key (the stored
/// gangs' `creation_order` is the group's seq, set at admission).
fn same_body(stored: &GangGroup, offered: &GangGroup) -> bool {
    stored.id == offered.id
        && stored.queue == offered.queue
        && stored.gangs.len() == offered.gangs.len()
        && stored.gangs.iter().zip(&offered.gangs).all(|(a, b)| {
            let mut b = b.clone();
            b.creation_order = a.creation_order;
            *a == b
        })
}

fn apply_decision(
    g: &mut GroupRecord,
    last_version: &mut u64,
    txn: TxnId,
    decision: Decision,
    placements: &BTreeMap<String, Placement>,
    reason: &str,
    at_ms: u64,
) {
    g.bump(last_version);
    match decision {
        Decision::Commit => {
            g.placements.extend(placements.iter().map(|(k, p)| {
                let mut p = p.clone();
                p.txn = Some(txn);
                (k.clone(), p)
            }));
            if g.every_gang_at_min() {
                g.state = GroupState::Placed;
                g.reason.clear();
            } else {
                // NonStrict: placed members accumulate until every gang reaches minMember.
                g.state = GroupState::Queued;
                g.reason = format!(
                    "{} members placed, accumulating toward minMember",
                    g.placements.len()
                );
                g.not_before_ms = at_ms.saturating_add(RETRY_BACKOFF_BASE_MS);
            }
        }
        Decision::Abort => {
            g.attempts += 1;
            g.reason = reason.to_string();
            if g.deadline_ms.is_some_and(|d| d <= at_ms) {
                g.state = g.timed_out();
            } else {
                g.state = GroupState::Queued;
                g.not_before_ms = at_ms.saturating_add(retry_backoff_ms(g.attempts));
            }
        }
    }
}

#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod queue_tests;
#[cfg(test)]
mod shard_map_tests;
#[cfg(test)]
mod tests;
