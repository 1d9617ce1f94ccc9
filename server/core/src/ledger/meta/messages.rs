//! The meta group's messages: the commands it applies ([`MetaCommand`]), its replies
//! ([`MetaReply`], with [`RejectionKind`] for refusals) and the read-only questions it
//! answers ([`MetaQuery`]), all encoded in log entries by `wire`.

use super::*;

/// How a requeued group is tried again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    /// After its backoff ([`retry_backoff_ms`]).
    #[default]
    Backoff,
    /// It fit nowhere: parked until a change could help it ([`MetaCommand::Wake`]), at
    /// the latest after [`PARKED_RECHECK_MS`] (or its backoff, if longer).
    Parked,
    /// It holds a reservation: tried again after [`RESERVED_RETRY_MS`], whatever its
    /// attempts (a group that holds none backs off instead).
    Reserved,
}

impl Retry {
    fn is_backoff(&self) -> bool {
        *self == Retry::Backoff
    }
}

/// The groups a [`MetaCommand::Wake`] wakes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Woken {
    /// These (at most [`WAKE_GROUPS_MAX`]).
    Groups(Vec<GroupSeq>),
    /// Every parked group.
    AllParked,
}

/// Most groups one [`MetaCommand::Wake`] names.
pub const WAKE_GROUPS_MAX: usize = 4_096;

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
        /// Whether it retries on its backoff or is parked until woken.
        #[serde(default, skip_serializing_if = "Retry::is_backoff")]
        retry: Retry,
    },
    /// Parked groups may be tried again now (a change that could help them happened,
    /// or a new coordinator wakes them all): each still Queued and parked is due at
    /// `at_ms` and no longer parked; others are left as they are.
    Wake {
        /// Which groups.
        which: Woken,
        /// Proposer's clock.
        at_ms: u64,
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
    /// Records why a placed group's named Kubernetes pods are not bound yet (a pod
    /// whose spec differs from its member's, say), or clears it (empty): the binder's
    /// word, so a framework watching the group sees it.
    NoteBinding {
        /// The group.
        seq: GroupSeq,
        /// Why, for people (empty: nothing stands in the way).
        reason: String,
    },
    /// Records which pods members that select theirs by labels stand for: each a pod of
    /// its gang's namespace that no live group names yet. All or nothing; a member
    /// already given one keeps it (a second proposal, from another shard's binder, is
    /// refused).
    ChoosePods {
        /// The group.
        seq: GroupSeq,
        /// (member key, pod name), at most [`super::CHOICES_PER_COMMAND_MAX`].
        choices: Vec<(String, String)>,
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
    /// Reserves nodes for a queued group that lacked room ([`Reservations::make`]),
    /// replacing the group's own reservation; refused when the group is not queued or
    /// holds members, [`RESERVATIONS_MAX`] are held, or a node is held for another.
    ReserveForHead {
        /// The reservation; `made_at_ms` is the proposer's clock.
        reservation: HeadReservation,
    },
    /// Ends group `seq`'s reservation (a better place freed, or it is no longer wanted).
    EndHeadReservation {
        /// The group.
        seq: GroupSeq,
        /// Proposer's clock.
        at_ms: u64,
    },
    /// Advances every queue's usage over time to `at_ms` (fair sharing over time,
    /// docs/ARCHITECTURE.md §5a): the coordinator writes one every
    /// `FAIR_SHARE_SAMPLE_MS` while a half-life is configured, and one with
    /// `half_life_ms` 0 to forget the history once it is not.
    SampleUsage {
        /// Proposer's clock.
        at_ms: u64,
        /// The half-life, in ms (`FAIR_SHARE_HALF_LIFE_MS_MIN..=…_MAX`), or 0: off.
        half_life_ms: u64,
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
    /// How many parked groups a [`MetaCommand::Wake`] made due.
    Woken {
        /// Groups woken.
        groups: u64,
    },
    /// Fair sharing over time as recorded ([`MetaQuery::UsageHistory`]).
    UsageHistory {
        /// The last sample's half-life, in ms; 0: off.
        half_life_ms: u64,
        /// The last sample's time (the proposer's clock); 0: never sampled.
        sampled_at_ms: u64,
        /// Queues defined (none: nothing to sample).
        queues: u64,
    },
    /// Reservations for the head of the line ([`MetaQuery::HeadReservations`], and
    /// [`MetaCommand::ReserveForHead`]'s answer: the one recorded).
    HeadReservations {
        /// By group.
        reservations: Vec<HeadReservation>,
    },
    /// Placed groups and when each is expected to end ([`MetaQuery::PlacedEnds`]).
    PlacedEnds {
        /// In seq order.
        groups: Vec<PlacedEnd>,
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

/// A placed group and when it is expected to end ([`MetaQuery::PlacedEnds`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedEnd {
    /// The group.
    pub seq: GroupSeq,
    /// Its gangs.
    pub gangs: Vec<crate::model::GangId>,
    /// When it was placed plus its run-time limit (None: it declared none).
    pub ends_at_ms: Option<u64>,
    /// Whether its members are Kubernetes pods (kubelets end them; gangway releases
    /// only the others at their limit).
    pub kubernetes: bool,
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
    /// The live group whose members name Kubernetes pod `pod` (`namespace/name`), as a
    /// record (answered as [`MetaReply::Groups`], empty when no live group names it):
    /// what the binder and the ingest ask of a framework's pod.
    NamedPod {
        /// `namespace/name`.
        pod: String,
    },
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
    /// Whether fair sharing over time is on, with what half-life, and its last sample.
    UsageHistory,
    /// The reservations holding at `at_ms`, by group.
    HeadReservations {
        /// The reader's clock.
        at_ms: u64,
    },
    /// Every placed group with when it is expected to end (placed time plus declared
    /// run-time limit): what a reservation is chosen from.
    PlacedEnds,
    /// The placed groups gangway releases at their run-time limit (not Kubernetes pods)
    /// whose end is at or before `at_ms`, earliest first, at most `limit` (read from an
    /// index: the coordinator asks several times a second).
    Overrun {
        /// The reader's clock.
        at_ms: u64,
        /// At most this many.
        limit: u32,
    },
    /// The newest transactions of the decision log (open and decided), newest first:
    /// what the web view lists as recent decisions.
    RecentTxns {
        /// At most this many.
        limit: u32,
    },
}

impl MetaCommand {
    /// The proposer's clock, for commands that carry it.
    pub fn at_ms(&self) -> Option<u64> {
        match self {
            MetaCommand::AssignNode { at_ms, .. }
            | MetaCommand::Submit { at_ms, .. }
            | MetaCommand::BeginTxn { at_ms, .. }
            | MetaCommand::BeginPreemption { at_ms, .. }
            | MetaCommand::Decide { at_ms, .. }
            | MetaCommand::AbortIfUndecided { at_ms, .. }
            | MetaCommand::Requeue { at_ms, .. }
            | MetaCommand::Wake { at_ms, .. }
            | MetaCommand::Expire { at_ms, .. }
            | MetaCommand::Cancel { at_ms, .. }
            | MetaCommand::Release { at_ms, .. }
            | MetaCommand::ReleaseMembers { at_ms, .. }
            | MetaCommand::MembersReleased { at_ms, .. }
            | MetaCommand::ReleaseDone { at_ms, .. }
            | MetaCommand::EndHeadReservation { at_ms, .. }
            | MetaCommand::SampleUsage { at_ms, .. }
            | MetaCommand::PlaceNode { at_ms, .. }
            | MetaCommand::BeginMove { at_ms, .. }
            | MetaCommand::EndMove { at_ms, .. }
            | MetaCommand::CancelMove { at_ms, .. } => Some(*at_ms),
            MetaCommand::ReserveForHead { reservation } => Some(reservation.made_at_ms),
            MetaCommand::Delivered { .. }
            | MetaCommand::Batch { .. }
            | MetaCommand::NoteWaiting { .. }
            | MetaCommand::NoteBinding { .. }
            | MetaCommand::ChoosePods { .. }
            | MetaCommand::PutQueue { .. }
            | MetaCommand::DeleteQueue { .. }
            | MetaCommand::NoteNodeAllocation { .. }
            | MetaCommand::NoteCapacity { .. }
            | MetaCommand::SealMove { .. }
            | MetaCommand::CommitMove { .. }
            | MetaCommand::GrowShards { .. } => None,
        }
    }
}
