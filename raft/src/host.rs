//! The multi-raft host: one openraft `Raft` per group in this process, a
//! shared peer pool, group commit, and the operations the rest of gangway
//! uses: routed writes and linearizable reads, bootstrap, membership changes,
//! leadership transfer and balancing, compaction and status.
//!
//! Invariants: every group has exactly one `Raft` here; every background task
//! is owned by the host and stops at `shutdown`; a request that must run on a
//! leader is forwarded there at most once per attempt, and attempts are
//! bounded by `ROUTE_TIMEOUT_MS`. Built by the server's entry points; served
//! over gRPC by `service` and `admin`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_proto::admin::{self as pb, GroupStatus};
use gangway_proto::raft::{self as pb_raft, PrepareElectionRequest, ReadRequest};
use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::balance;
use crate::error::HostError;
use crate::forwarder::Forwarder;
use crate::log_store::{LastLog, LogStore};
use crate::members_seen::{participants, GroupParticipation, MembersSeen, MEMBERS_SEEN_PERIOD_MS};
use crate::network::{admin_client, transport_client, NetworkFactory, Origin, PeerPool};
use crate::proposer::Proposer;
use crate::reachability::{
    decide, GateInput, GateReason, GateState, GateTiming, PeerGroupView, Role, REACH_PING_MS,
    REACH_WINDOW_MS,
};
use crate::read_gate::{CheckFailed, ReadGate};
use crate::sm_store::{SmShared, SmStore};
use crate::state_machine::{Admission, StateMachineFactory};
use crate::storage::{KvStore, SyncHandle};
use crate::types::{GroupId, LogId, NodeId, Raft};

/// Total time a routed request keeps retrying through elections.
pub const ROUTE_TIMEOUT_MS: u64 = 8_000;
/// Time one write or read attempt may wait for its quorum.
pub const ATTEMPT_TIMEOUT_MS: u64 = 3_000;
const ROUTE_BACKOFF_MIN_MS: u64 = 20;
const ROUTE_BACKOFF_MAX_MS: u64 = 250;
/// Time a group waits for its designated initializer before bootstrapping itself.
pub const BOOTSTRAP_FALLBACK_MS: u64 = 3_000;
/// Time a leadership transfer may take before it is given up.
pub const TRANSFER_TIMEOUT_MS: u64 = 5_000;
/// Silence after which a peer that does not answer pings is logged (WARN, once).
pub const PEER_SILENT_WARN_MS: u64 = 5_000;
/// Time a membership change may take (a new learner may need a snapshot).
pub const MEMBERSHIP_TIMEOUT_MS: u64 = 60_000;
/// Time to wait for a peer's status when probing liveness.
pub const PROBE_TIMEOUT_MS: u64 = 1_000;
/// Time a compaction waits for its snapshot.
pub const COMPACT_TIMEOUT_MS: u64 = 30_000;

/// Raft timing and log-retention settings of a host.
#[derive(Debug, Clone)]
pub struct RaftTiming {
    /// Leader heartbeat period.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_min_ms: u64,
    /// Upper bound of the election timeout; also the leader lease.
    pub election_max_ms: u64,
    /// Entries applied since the last snapshot that trigger a new one.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log after a snapshot, for slow followers.
    pub keep_after_snapshot_entries: u64,
    /// Period of automatic leader balancing on the meta leader (0: off).
    pub balance_interval_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        Self {
            heartbeat_ms: 100,
            election_min_ms: 300,
            election_max_ms: 600,
            snapshot_every_entries: 10_000,
            keep_after_snapshot_entries: 1_000,
            balance_interval_ms: 30_000,
        }
    }
}

/// Identity and groups of one host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The cluster this replica belongs to; peers of another cluster are refused.
    pub cluster_id: String,
    /// This replica's node id (>= 1).
    pub node_id: NodeId,
    /// The address peers reach this replica's gRPC server at.
    pub advertise_addr: String,
    /// Every group id hosted (0 = meta, 1..=S shards).
    pub groups: Vec<GroupId>,
    /// Raft timing.
    pub timing: RaftTiming,
    /// How this replica authenticates to its peers (TLS identity, bearer token).
    pub peer_security: PeerSecurity,
    /// Fault tests only: peers whose advertised address is a key are dialled at its
    /// value instead (a proxy that can cut or delay that one link). Empty in production.
    pub peer_routes: BTreeMap<String, String>,
    /// Whether the Raft transport serves peers from the start.
    pub transport: TransportStart,
}

/// Whether a host's Raft transport serves peers as soon as it starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TransportStart {
    /// Serve votes, entries and snapshots at once (a replica with its data).
    #[default]
    Open,
    /// Refuse them (UNAVAILABLE) until `RaftHost::open_transport`: a blank replica
    /// that must first learn from its peers whether it may bootstrap, and must not
    /// vote or store entries before it knows.
    Held,
}

/// How a replica authenticates to its peers: mutual TLS (a peer certificate) and a
/// proof, on every call, that it holds the peer secret only replicas hold
/// ([`crate::peer_proof`]; the secret itself is never sent). Peers check each when
/// configured; the Raft transport serves only callers with a proof.
#[derive(Clone, Default)]
pub struct PeerSecurity {
    /// The client side of mutual TLS (CA and this replica's identity); `None`: plaintext.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The peer secret that keys the proofs (shared: the owner swaps it when its file
    /// changes, and the next call proves with the new one).
    pub peer_secret: Option<SharedToken>,
    /// First rollout of an upgrade only: also send the secret itself, as replicas of the
    /// release before expect it.
    pub send_legacy_secret: bool,
}

/// A bearer token that its owner may replace while connections use it.
pub type SharedToken = Arc<std::sync::RwLock<String>>;

impl std::fmt::Debug for PeerSecurity {
    // The secret stays out of logs and panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSecurity")
            .field("tls", &self.tls.is_some())
            .field(
                "peer_secret",
                &self.peer_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// What every group of a host is opened with.
#[derive(Clone, Copy)]
struct GroupDeps<'a> {
    cfg: &'a HostConfig,
    cluster_id: &'a Arc<str>,
    store: &'a Arc<dyn KvStore>,
    sync: &'a SyncHandle,
    pool: &'a Arc<PeerPool>,
    factory: &'a StateMachineFactory,
}

/// openraft's answer to a leadership check.
type LeaderCheckError = RaftError<NodeId, CheckIsLeaderError<NodeId, BasicNode>>;

/// One group's replica in this process.
pub(crate) struct Group {
    pub(crate) id: GroupId,
    pub(crate) raft: Raft,
    pub(crate) sm: Arc<SmShared>,
    proposer: Proposer,
    /// Writes this replica forwards to the leader go through it.
    forwarder: Forwarder,
    /// Linearizable reads share leadership checks through it.
    read_gate: ReadGate<LeaderCheckError>,
    committed_next: Arc<AtomicU64>,
    transferring: AtomicBool,
    membership: tokio::sync::Mutex<()>,
    /// A leader transfer asked this voter not to campaign until then.
    election_hold_until: std::sync::Mutex<Option<Instant>>,
    /// The last log id held here, which pings tell peers.
    last_log: LastLog,
    /// The state machine's check of commands before they are proposed.
    admission: Option<Admission>,
}

/// Fires when a group applies entries on this replica (see [`RaftHost::changes`]).
pub struct GroupChanges {
    rx: tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, openraft::BasicNode>>,
    seen: Option<u64>,
}

impl GroupChanges {
    /// Waits until entries past the last seen ones are applied here; `false` once the
    /// group has stopped. Metrics that change without an apply (heartbeat acks, say)
    /// do not wake it.
    pub async fn changed(&mut self) -> bool {
        loop {
            let applied = self.rx.borrow_and_update().last_applied.map(|l| l.index);
            if applied != self.seen {
                self.seen = applied;
                return true;
            }
            if self.rx.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Whether entries past the last seen ones were applied here, without waiting
    /// (marks them seen).
    pub fn applied_since(&mut self) -> bool {
        let applied = self.rx.borrow_and_update().last_applied.map(|l| l.index);
        let changed = applied != self.seen;
        self.seen = applied;
        changed
    }
}

/// The answer to a routed request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The state machine's reply (empty for membership operations).
    pub reply: Vec<u8>,
    /// Log index of the entry (write, membership) or applied index (read).
    pub index: u64,
}

/// A request that must run on a group's leader.
#[derive(Debug, Clone)]
pub(crate) enum Routed {
    Write(Vec<u8>),
    Read(Vec<u8>),
    AddLearner(NodeId, String),
    ChangeVoters(BTreeSet<NodeId>),
    Transfer(NodeId),
}

/// The groups a host runs. A group can be added while the host runs (a new shard) and
/// is never removed; readers take the set as it is now and keep it as long as they like.
pub(crate) struct GroupSet(std::sync::RwLock<Arc<BTreeMap<GroupId, Arc<Group>>>>);

impl GroupSet {
    fn new(groups: BTreeMap<GroupId, Arc<Group>>) -> Self {
        Self(std::sync::RwLock::new(Arc::new(groups)))
    }

    /// The groups now; a group added later is not in the returned map.
    pub(crate) fn now(&self) -> Arc<BTreeMap<GroupId, Arc<Group>>> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Adds `group` unless one with its id is there; whether it was added.
    fn insert(&self, group: Arc<Group>) -> bool {
        let mut set = match self.0.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if set.contains_key(&group.id) {
            return false;
        }
        let mut grown = (**set).clone();
        grown.insert(group.id, group);
        *set = Arc::new(grown);
        true
    }
}

pub(crate) struct HostShared {
    pub(crate) cfg: HostConfig,
    pub(crate) cluster_id: Arc<str>,
    pub(crate) groups: GroupSet,
    /// What a group added at run time is opened with.
    store: Arc<dyn KvStore>,
    sync: SyncHandle,
    factory: Arc<StateMachineFactory>,
    /// Held while a group is being added, so two callers never open the same one.
    adding: tokio::sync::Mutex<()>,
    pub(crate) pool: Arc<PeerPool>,
    reach: crate::reachability::Reachability,
    members_seen: MembersSeen,
    transport_open: AtomicBool,
    shutdown: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// The multi-raft host of one gangway process. Cheap to clone.
#[derive(Clone)]
pub struct RaftHost {
    pub(crate) shared: Arc<HostShared>,
}

/// A peer's ping answer for one group, as the gate reads it.
fn peer_group_view(v: &pb_raft::GroupView) -> PeerGroupView {
    let last_log = v.has_last_log.then(|| {
        LogId::new(
            openraft::CommittedLeaderId::new(v.last_log_term, v.last_log_node),
            v.last_log_index,
        )
    });
    PeerGroupView {
        last_log,
        leader: (v.leader != 0).then_some(v.leader),
    }
}

/// Logs a change of the gate (a leader heard again is the normal state, logged at debug).
fn log_gate_change(group: GroupId, reason: GateReason) {
    let (enabled, why) = match reason {
        GateReason::MayCampaign => ("enabled", "this replica may campaign".to_string()),
        GateReason::OutOfReach => (
            "disabled",
            "a majority of voters is out of reach".to_string(),
        ),
        GateReason::TransferHold => ("disabled", "a leader transfer holds this voter".to_string()),
        GateReason::LeaderHeard(l) => ("disabled", format!("voters in reach hear leader {l}")),
        GateReason::DefersTo(p) => (
            "disabled",
            format!("the leader is silent and replica {p} holds a longer log"),
        ),
    };
    match reason {
        GateReason::LeaderHeard(_) | GateReason::TransferHold => {
            tracing::debug!(group, elections = enabled, "election gate: {why}")
        }
        _ => tracing::info!(group, elections = enabled, "election gate: {why}"),
    }
}

fn openraft_config(
    cluster: &str,
    group: GroupId,
    t: &RaftTiming,
) -> Result<openraft::Config, HostError> {
    let cfg = openraft::Config {
        cluster_name: format!("{cluster}/g{group}"),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_min_ms,
        election_timeout_max: t.election_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(t.snapshot_every_entries),
        max_in_snapshot_log_to_keep: t.keep_after_snapshot_entries,
        install_snapshot_timeout: 10_000,
        ..Default::default()
    };
    cfg.validate()
        .map_err(|e| HostError::InvalidArgument(format!("raft timing: {e}")))
}

impl RaftHost {
    /// Opens every group's storage and starts its Raft replica.
    pub async fn start(
        cfg: HostConfig,
        store: Arc<dyn KvStore>,
        factory: Arc<StateMachineFactory>,
    ) -> Result<Self, HostError> {
        if cfg.node_id == 0 {
            return Err(HostError::InvalidArgument("node id must be >= 1".into()));
        }
        let sync = SyncHandle::start(store.clone())?;
        let pool = Arc::new(PeerPool::new(
            cfg.peer_security.clone(),
            cfg.peer_routes.clone(),
            &cfg.cluster_id,
        ));
        let cluster_id: Arc<str> = Arc::from(cfg.cluster_id.as_str());
        let (shutdown, _) = watch::channel(false);
        let mut groups = BTreeMap::new();
        let mut proposer_tasks = Vec::new();
        let deps = GroupDeps {
            cfg: &cfg,
            cluster_id: &cluster_id,
            store: &store,
            sync: &sync,
            pool: &pool,
            factory: &*factory,
        };
        for &gid in &cfg.groups {
            let stop = shutdown.subscribe();
            let (group, task) = Self::open_group(&deps, gid, stop).await?;
            groups.insert(gid, Arc::new(group));
            proposer_tasks.push(task);
        }
        let members_seen = MembersSeen::open(store.clone())?;
        let transport_open = AtomicBool::new(cfg.transport == TransportStart::Open);
        let host = RaftHost {
            shared: Arc::new(HostShared {
                cfg,
                cluster_id,
                groups: GroupSet::new(groups),
                store,
                sync,
                factory,
                adding: tokio::sync::Mutex::new(()),
                pool,
                reach: Default::default(),
                members_seen,
                transport_open,
                shutdown,
                tasks: Mutex::new(Vec::new()),
            }),
        };
        host.own(tokio::spawn(host.clone().ping_peers()));
        host.own(tokio::spawn(host.clone().gate_elections()));
        host.own(tokio::spawn(host.clone().record_members_seen()));
        for task in proposer_tasks {
            host.own(tokio::spawn(task));
        }
        for group in host.shared.groups.now().values() {
            host.watch_metrics(group);
        }
        if host.shared.cfg.timing.balance_interval_ms > 0 {
            host.own(tokio::spawn(host.clone().auto_balance()));
        }
        Ok(host)
    }

    async fn open_group(
        deps: &GroupDeps<'_>,
        gid: GroupId,
        stop: watch::Receiver<bool>,
    ) -> Result<(Group, impl std::future::Future<Output = ()>), HostError> {
        let GroupDeps {
            cfg,
            cluster_id,
            store,
            sync,
            pool,
            factory,
        } = *deps;
        let committed_next = Arc::new(AtomicU64::new(0));
        let last_log = LastLog::default();
        let log = LogStore::new(
            gid,
            store.tree(&format!("g{gid}/log"))?,
            store.tree(&format!("g{gid}/meta"))?,
            sync.clone(),
            committed_next.clone(),
            last_log.clone(),
        );
        let machine = factory(gid);
        let admission = machine.admission();
        let sm_store = SmStore::open(
            machine,
            store.tree(&format!("g{gid}/snapshot"))?,
            sync.clone(),
        )
        .map_err(|e| HostError::Fatal {
            group: gid,
            detail: e.to_string(),
        })?;
        let sm = sm_store.shared();
        let origin = Origin {
            cluster_id: cluster_id.clone(),
            group: gid,
            node: cfg.node_id,
        };
        let network = NetworkFactory {
            origin: origin.clone(),
            pool: pool.clone(),
        };
        let config = Arc::new(openraft_config(&cfg.cluster_id, gid, &cfg.timing)?);
        let raft = Raft::new(cfg.node_id, config, network, log, sm_store)
            .await
            .map_err(|e| HostError::Fatal {
                group: gid,
                detail: e.to_string(),
            })?;
        let (proposer, proposer_task) = Proposer::start(raft.clone(), stop.clone());
        let checked = raft.clone();
        let (read_gate, gate_task) = ReadGate::start(
            move || {
                let raft = checked.clone();
                async move { raft.ensure_linearizable().await.map(|_| ()) }
            },
            Duration::from_millis(ATTEMPT_TIMEOUT_MS),
            stop.clone(),
        );
        let (forwarder, forwarder_task) = Forwarder::start(origin, pool.clone(), stop);
        let task = async move {
            tokio::join!(proposer_task, gate_task, forwarder_task);
        };
        let group = Group {
            id: gid,
            raft,
            sm,
            proposer,
            forwarder,
            read_gate,
            committed_next,
            transferring: AtomicBool::new(false),
            membership: tokio::sync::Mutex::new(()),
            election_hold_until: std::sync::Mutex::new(None),
            last_log,
            admission,
        };
        Ok((group, task))
    }

    fn watch_metrics(&self, group: &Arc<Group>) {
        let task =
            crate::metrics::watch_group(group.clone(), self.node_id(), self.shutdown_signal());
        self.own(tokio::spawn(task));
    }

    /// Opens group `gid` on this running host (a shard added to a live cluster) and,
    /// when its storage holds no Raft state and this replica is one of `voters`,
    /// initializes it with them the way [`Self::bootstrap`] does: at once on the
    /// designated voter, after `BOOTSTRAP_FALLBACK_MS` without a leader on the others.
    /// A replica outside `voters` (one that joined later) only opens the group and
    /// waits to be added to it. Answers whether the group was new to this host;
    /// adding a group the host has is a no-op.
    pub async fn add_group(
        &self,
        gid: GroupId,
        voters: &BTreeMap<NodeId, String>,
    ) -> Result<bool, HostError> {
        let _adding = self.shared.adding.lock().await;
        if self.shared.groups.now().contains_key(&gid) {
            return Ok(false);
        }
        if *self.shared.shutdown.borrow() {
            return Err(HostError::Unavailable {
                group: gid,
                detail: "the host is shutting down".into(),
            });
        }
        let deps = GroupDeps {
            cfg: &self.shared.cfg,
            cluster_id: &self.shared.cluster_id,
            store: &self.shared.store,
            sync: &self.shared.sync,
            pool: &self.shared.pool,
            factory: &*self.shared.factory,
        };
        let pristine = !crate::members_seen::holds_raft_state(&*self.shared.store, &[gid])?;
        let (group, task) = Self::open_group(&deps, gid, self.shutdown_signal()).await?;
        let group = Arc::new(group);
        self.shared.groups.insert(group.clone());
        self.own(tokio::spawn(task));
        self.watch_metrics(&group);
        tracing::info!(group = gid, pristine, "group added while running");
        if pristine && voters.contains_key(&self.node_id()) {
            self.bootstrap_group(&group, voters).await?;
        }
        Ok(true)
    }

    fn own(&self, task: JoinHandle<()>) {
        if let Ok(mut tasks) = self.shared.tasks.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shared.shutdown.subscribe()
    }

    /// This replica's node id.
    pub fn node_id(&self) -> NodeId {
        self.shared.cfg.node_id
    }

    /// The cluster id this host belongs to.
    pub fn cluster_id(&self) -> &str {
        &self.shared.cluster_id
    }

    /// The address peers reach this host at.
    pub fn advertise_addr(&self) -> &str {
        &self.shared.cfg.advertise_addr
    }

    /// The ids of every hosted group.
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.shared.groups.now().keys().copied().collect()
    }

    pub(crate) fn group(&self, id: GroupId) -> Result<Arc<Group>, HostError> {
        self.shared
            .groups
            .now()
            .get(&id)
            .cloned()
            .ok_or_else(|| HostError::UnknownGroup {
                group: id,
                known: self.known_groups(),
            })
    }

    fn known_groups(&self) -> String {
        let ids: Vec<_> = self.shared.groups.now().keys().copied().collect();
        match (ids.first(), ids.last()) {
            (Some(a), Some(b)) => format!("{a}..={b}"),
            _ => "none".into(),
        }
    }

    /// The leader of `group` as this replica knows it.
    pub fn leader_of(&self, group: GroupId) -> Option<NodeId> {
        self.shared
            .groups
            .now()
            .get(&group)
            .and_then(|g| g.raft.metrics().borrow().current_leader)
    }

    /// Groups whose Raft replica stopped here on its own (a storage failure such as a
    /// full disk), with the reason; empty while every group runs. A stopped group never
    /// restarts in this process.
    pub fn stopped_groups(&self) -> Vec<(GroupId, String)> {
        if *self.shared.shutdown.borrow() {
            return Vec::new();
        }
        self.shared
            .groups
            .now()
            .values()
            .filter_map(|g| {
                let m = g.raft.metrics().borrow().clone();
                match (&m.running_state, m.state) {
                    (Err(fatal), _) => Some((g.id, fatal.to_string())),
                    (Ok(()), ServerState::Shutdown) => Some((g.id, "shut down".into())),
                    (Ok(()), _) => None,
                }
            })
            .collect()
    }

    /// A feed that fires whenever `group` applies entries here. Waiters use it instead
    /// of polling the state machine.
    pub fn changes(&self, group: GroupId) -> Result<GroupChanges, HostError> {
        let g = self.group(group)?;
        let rx = g.raft.metrics();
        let seen = rx.borrow().last_applied.map(|l| l.index);
        Ok(GroupChanges { rx, seen })
    }

    /// Whether this replica knows a leader for every group (readiness).
    pub fn knows_every_leader(&self) -> bool {
        self.shared
            .groups
            .now()
            .values()
            .all(|g| g.raft.metrics().borrow().current_leader.is_some())
    }

    /// Waits until `group` has a leader known here, up to `timeout`.
    pub async fn wait_for_leader(
        &self,
        group: GroupId,
        timeout: Duration,
    ) -> Result<NodeId, HostError> {
        let g = self.group(group)?;
        let mut rx = g.raft.metrics();
        let wait = async {
            loop {
                if let Some(l) = rx.borrow_and_update().current_leader {
                    return Ok(l);
                }
                if rx.changed().await.is_err() {
                    return Err(HostError::Fatal {
                        group,
                        detail: "raft stopped".into(),
                    });
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| HostError::Unavailable {
                group,
                detail: format!("no leader elected within {} ms", timeout.as_millis()),
            })?
    }

    /// Commits `command` in `group` (on its leader, wherever it is) and returns the reply.
    ///
    /// A retried attempt whose first reply was lost may apply the command
    /// twice: commands must be idempotent (carry their own ids).
    pub async fn write(&self, group: GroupId, command: Vec<u8>) -> Result<Outcome, HostError> {
        self.routed(group, Routed::Write(command)).await
    }

    /// Answers `query` from `group`'s state machine, linearizably.
    pub async fn read(&self, group: GroupId, query: Vec<u8>) -> Result<Outcome, HostError> {
        self.routed(group, Routed::Read(query)).await
    }

    /// Answers `query` from this replica's copy of `group`, possibly stale.
    pub fn read_local(&self, group: GroupId, query: &[u8]) -> Result<Outcome, HostError> {
        let g = self.group(group)?;
        let inner = g.sm.lock();
        Ok(Outcome {
            reply: inner.sm.query(query),
            index: inner.last_applied.map(|l| l.index).unwrap_or(0),
        })
    }

    /// Runs `f` on this replica's copy of `group`'s state machine (possibly stale), as
    /// `read_local` answers a query but without encoding one or its answer.
    pub fn inspect_local<R>(
        &self,
        group: GroupId,
        f: impl FnOnce(&dyn std::any::Any) -> R,
    ) -> Result<R, HostError> {
        let g = self.group(group)?;
        let inner = g.sm.lock();
        Ok(f(inner.sm.as_any()))
    }

    /// Runs `f` on `group`'s state machine linearizably, when this replica leads the
    /// group: the typed form of `read` for a server reading its own state machines on
    /// the leader. Anywhere else it answers `NotLeader` (with the leader, if known)
    /// and the caller reads through `read`. `f` runs on the blocking pool, as queries do.
    pub async fn inspect<R, F>(&self, group: GroupId, f: F) -> Result<R, HostError>
    where
        R: Send + 'static,
        F: FnOnce(&dyn std::any::Any) -> R + Send + 'static,
    {
        let g = self.group(group)?;
        let leader = g.raft.metrics().borrow().current_leader;
        if leader != Some(self.node_id()) {
            return Err(self.not_leader(group, leader, None));
        }
        self.confirm_leader(&g).await?;
        self.on_blocking_pool(group, move |host| host.inspect_local(group, f))
            .await
    }

    /// Runs a read of `group` on tokio's blocking pool: a query may be long (a plan over
    /// a large shard), and the async workers keep serving streams and heartbeats meanwhile.
    async fn on_blocking_pool<R: Send + 'static>(
        &self,
        group: GroupId,
        read: impl FnOnce(&RaftHost) -> Result<R, HostError> + Send + 'static,
    ) -> Result<R, HostError> {
        let host = self.clone();
        tokio::task::spawn_blocking(move || read(&host))
            .await
            .map_err(|e| Self::fatal(group, format!("query task failed: {e}")))?
    }

    pub(crate) async fn routed(&self, group: GroupId, op: Routed) -> Result<Outcome, HostError> {
        self.group(group)?;
        let deadline = Instant::now() + Duration::from_millis(ROUTE_TIMEOUT_MS);
        let mut delay = ROUTE_BACKOFF_MIN_MS;
        loop {
            let result = match self.run_local(group, &op).await {
                Err(HostError::NotLeader {
                    leader: Some((id, addr)),
                    ..
                }) if id != self.node_id() => match op {
                    // A transfer or membership change moves leadership itself: it must
                    // not be abandoned when the leader changes under it.
                    Routed::Write(_) | Routed::Read(_) => {
                        self.run_remote_while_leader(group, id, &addr, &op).await
                    }
                    _ => self.run_remote(group, id, &addr, &op).await,
                },
                other => other,
            };
            match result {
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tracing::debug!(group, error = %e, "retrying routed request");
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    delay = (delay * 2).min(ROUTE_BACKOFF_MAX_MS);
                }
                other => return other,
            }
        }
    }

    /// Runs `op` on `leader`, giving up as soon as this replica stops believing in
    /// that leader: a paused or cut-off leader answers nothing until the attempt
    /// times out, while the rest of the group has already elected another one.
    async fn run_remote_while_leader(
        &self,
        group: GroupId,
        leader: NodeId,
        addr: &str,
        op: &Routed,
    ) -> Result<Outcome, HostError> {
        let mut metrics = self.group(group)?.raft.metrics();
        let replaced = async move {
            loop {
                if metrics.borrow_and_update().current_leader != Some(leader) {
                    return;
                }
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            result = self.run_remote(group, leader, addr, op) => result,
            () = replaced => Err(HostError::Unavailable {
                group,
                detail: format!("leader {leader} was replaced while the request was in flight"),
            }),
        }
    }

    /// Runs `op` on this replica, which must lead `group`.
    pub(crate) async fn run_local(
        &self,
        group: GroupId,
        op: &Routed,
    ) -> Result<Outcome, HostError> {
        let g = self.group(group)?;
        match op {
            Routed::Write(cmd) => self.write_local(&g, cmd.clone()).await,
            Routed::Read(q) => self.read_leader(&g, q).await,
            Routed::AddLearner(node, addr) => self.add_learner_local(&g, *node, addr).await,
            Routed::ChangeVoters(voters) => self.change_voters_local(&g, voters).await,
            Routed::Transfer(to) => self.transfer_local(&g, *to).await,
        }
    }

    /// A not-leader error with the leader's address, taken from the
    /// membership when openraft did not supply it.
    fn not_leader(
        &self,
        group: GroupId,
        leader: Option<NodeId>,
        node: Option<BasicNode>,
    ) -> HostError {
        let addr = node.map(|n| n.addr).or_else(|| {
            let id = leader?;
            let g = self.shared.groups.now().get(&group).cloned()?;
            let m = g.raft.metrics().borrow().membership_config.clone();
            m.membership().get_node(&id).map(|n| n.addr.clone())
        });
        HostError::NotLeader {
            group,
            node: self.node_id(),
            leader: leader.zip(addr),
        }
    }

    fn fatal(group: GroupId, e: impl std::fmt::Display) -> HostError {
        HostError::Fatal {
            group,
            detail: e.to_string(),
        }
    }

    async fn write_local(&self, g: &Group, cmd: Vec<u8>) -> Result<Outcome, HostError> {
        if g.transferring.load(Ordering::Acquire) {
            return Err(HostError::Transferring { group: g.id });
        }
        if let Some(admit) = &g.admission {
            admit(&cmd).map_err(|reason| {
                HostError::InvalidArgument(format!(
                    "group {} refused the command before proposing it: {reason}",
                    g.id
                ))
            })?;
        }
        let waiting = g
            .proposer
            .propose(cmd)
            .await
            .map_err(|_| Self::fatal(g.id, "the group's write queue is closed"))?;
        let res = tokio::time::timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS), waiting)
            .await
            .map_err(|_| HostError::Unavailable {
                group: g.id,
                detail: format!("no commit within {ATTEMPT_TIMEOUT_MS} ms"),
            })?
            .map_err(|_| Self::fatal(g.id, "the write was dropped by a stopping group"))?;
        match res {
            Ok((reply, index)) => Ok(Outcome { reply, index }),
            Err(e) => Err(self.write_error(g, e)),
        }
    }

    async fn read_leader(&self, g: &Group, query: &[u8]) -> Result<Outcome, HostError> {
        self.confirm_leader(g).await?;
        let group = g.id;
        let query = query.to_vec();
        self.on_blocking_pool(group, move |host| host.read_local(group, &query))
            .await
    }

    /// Confirms that this replica still leads `g` after the caller's read arrived (a
    /// quorum answered a check begun after it), so its state holds every write
    /// acknowledged before.
    async fn confirm_leader(&self, g: &Group) -> Result<(), HostError> {
        let closed = || HostError::Unavailable {
            group: g.id,
            detail: "the host is shutting down".to_string(),
        };
        // A read may wait for the check under way when it arrived, then its own.
        let wait = Duration::from_millis(2 * ATTEMPT_TIMEOUT_MS);
        let confirmed = async {
            let rx = g.read_gate.confirm().await.map_err(|_| closed())?;
            Ok::<_, HostError>(rx.await)
        };
        let res = tokio::time::timeout(wait, confirmed)
            .await
            .map_err(|_| HostError::Unavailable {
                group: g.id,
                detail: format!(
                    "no quorum confirmed the leader within {} ms",
                    2 * ATTEMPT_TIMEOUT_MS
                ),
            })??
            .map_err(|_| closed())?;
        match res {
            Ok(()) => Ok(()),
            Err(CheckFailed::TimedOut) => Err(HostError::Unavailable {
                group: g.id,
                detail: format!("no quorum confirmed the leader within {ATTEMPT_TIMEOUT_MS} ms"),
            }),
            Err(CheckFailed::Refused(RaftError::APIError(
                CheckIsLeaderError::ForwardToLeader(f),
            ))) => Err(self.not_leader(g.id, f.leader_id, f.leader_node)),
            Err(CheckFailed::Refused(RaftError::APIError(
                CheckIsLeaderError::QuorumNotEnough(e),
            ))) => Err(HostError::Unavailable {
                group: g.id,
                detail: e.to_string(),
            }),
            Err(CheckFailed::Refused(RaftError::Fatal(e))) => Err(Self::fatal(g.id, e)),
        }
    }

    /// Maps openraft's write error, for commands and membership changes alike.
    fn write_error(
        &self,
        g: &Group,
        e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
    ) -> HostError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                self.not_leader(g.id, f.leader_id, f.leader_node)
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                HostError::Membership {
                    group: g.id,
                    detail: e.to_string(),
                }
            }
            RaftError::Fatal(e) => Self::fatal(g.id, e),
        }
    }

    async fn add_learner_local(
        &self,
        g: &Group,
        node: NodeId,
        addr: &str,
    ) -> Result<Outcome, HostError> {
        if addr.is_empty() {
            return Err(HostError::InvalidArgument(
                "addr: a new learner needs an address".into(),
            ));
        }
        let _one_at_a_time = g.membership.lock().await;
        let change = g.raft.add_learner(node, BasicNode::new(addr), true);
        let resp = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_TIMEOUT_MS), change)
            .await
            .map_err(|_| HostError::Unavailable {
                group: g.id,
                detail: format!(
                    "learner {node} did not catch up within {MEMBERSHIP_TIMEOUT_MS} ms"
                ),
            })?
            .map_err(|e| self.write_error(g, e))?;
        Ok(Outcome {
            reply: Vec::new(),
            index: resp.log_id.index,
        })
    }

    async fn change_voters_local(
        &self,
        g: &Group,
        voters: &BTreeSet<NodeId>,
    ) -> Result<Outcome, HostError> {
        if voters.is_empty() {
            return Err(HostError::InvalidArgument(
                "voters: the new voter set is empty".into(),
            ));
        }
        let _one_at_a_time = g.membership.lock().await;
        let timed_out = || HostError::Unavailable {
            group: g.id,
            detail: format!("membership change did not commit within {MEMBERSHIP_TIMEOUT_MS} ms"),
        };
        let change = g.raft.change_membership(voters.clone(), false);
        let mut resp = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_TIMEOUT_MS), change)
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| self.write_error(g, e))?;
        // The members are exactly the voters named: a learner left in place would keep
        // receiving the log (replacing voters alone keeps every learner).
        let learners: BTreeSet<NodeId> = g
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .learner_ids()
            .filter(|l| !voters.contains(l))
            .collect();
        if !learners.is_empty() {
            let drop = g
                .raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(learners), false);
            resp = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_TIMEOUT_MS), drop)
                .await
                .map_err(|_| timed_out())?
                .map_err(|e| self.write_error(g, e))?;
        }
        Ok(Outcome {
            reply: Vec::new(),
            index: resp.log_id.index,
        })
    }

    async fn run_remote(
        &self,
        group: GroupId,
        leader: NodeId,
        addr: &str,
        op: &Routed,
    ) -> Result<Outcome, HostError> {
        // Writes go through the group's forwarder, which owns its calls' channels.
        let channel = || {
            self.shared
                .pool
                .channel(addr)
                .map_err(|e| HostError::Unavailable { group, detail: e })
        };
        let origin = Origin {
            cluster_id: self.shared.cluster_id.clone(),
            group,
            node: self.node_id(),
        };
        let envelope = Some(origin.envelope(leader));
        let peer_err =
            |s: tonic::Status| HostError::from_peer_status(group, self.node_id(), addr, &s);
        let timeout = Duration::from_millis(ATTEMPT_TIMEOUT_MS + 500);
        match op {
            Routed::Write(cmd) => {
                let g = self.group(group)?;
                g.forwarder.forward(leader, addr, cmd.clone()).await
            }
            Routed::Read(q) => {
                let mut req = tonic::Request::new(ReadRequest {
                    envelope,
                    query: q.clone(),
                });
                req.set_timeout(timeout);
                let reply = transport_client(&self.shared.pool, channel()?, leader)
                    .read(req)
                    .await
                    .map_err(peer_err)?;
                let r = reply.into_inner();
                Ok(Outcome {
                    reply: r.reply,
                    index: r.applied_index,
                })
            }
            Routed::AddLearner(node, node_addr) => {
                let req = pb::AddLearnerRequest {
                    group_id: Some(group),
                    node_id: *node,
                    addr: node_addr.clone(),
                };
                admin_client(&self.shared.pool, channel()?, leader)
                    .add_learner(req)
                    .await
                    .map_err(peer_err)?;
                Ok(Outcome {
                    reply: Vec::new(),
                    index: 0,
                })
            }
            Routed::ChangeVoters(voters) => {
                let req = pb::ChangeMembershipRequest {
                    group_id: Some(group),
                    voters: voters.iter().copied().collect(),
                };
                admin_client(&self.shared.pool, channel()?, leader)
                    .change_membership(req)
                    .await
                    .map_err(peer_err)?;
                Ok(Outcome {
                    reply: Vec::new(),
                    index: 0,
                })
            }
            Routed::Transfer(to) => {
                let req = pb::TransferLeaderRequest {
                    group_id: group,
                    to_node: *to,
                };
                let r = admin_client(&self.shared.pool, channel()?, leader)
                    .transfer_leader(req)
                    .await
                    .map_err(peer_err)?;
                Ok(Outcome {
                    reply: Vec::new(),
                    index: r.into_inner().leader,
                })
            }
        }
    }

    /// Initializes every group with `members` (id -> address) on a new cluster.
    ///
    /// Group g is initialized first by the (g mod n)-th member, so initial
    /// leaderships spread; the others step in after `BOOTSTRAP_FALLBACK_MS` if
    /// the group still has no leader (its designated member is down).
    pub async fn bootstrap(&self, members: &BTreeMap<NodeId, String>) -> Result<(), HostError> {
        if !members.contains_key(&self.node_id()) {
            return Err(HostError::InvalidArgument(format!(
                "bootstrap members must include this node ({})",
                self.node_id()
            )));
        }
        for group in self.shared.groups.now().values() {
            self.bootstrap_group(group, members).await?;
        }
        Ok(())
    }

    /// Initializes one group with `members`: at once on its designated member (group g:
    /// the (g mod n)-th), after `BOOTSTRAP_FALLBACK_MS` without a leader on the others.
    async fn bootstrap_group(
        &self,
        group: &Arc<Group>,
        members: &BTreeMap<NodeId, String>,
    ) -> Result<(), HostError> {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        let ids: Vec<NodeId> = members.keys().copied().collect();
        if ids.is_empty() {
            return Err(HostError::InvalidArgument(
                "a group needs at least one member".into(),
            ));
        }
        let designated = ids[(group.id as usize) % ids.len()];
        if designated == self.node_id() {
            return initialize(group, nodes).await;
        }
        let group = group.clone();
        let mut stop = self.shutdown_signal();
        self.own(tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(BOOTSTRAP_FALLBACK_MS)) => {}
                _ = stop.changed() => return,
            }
            if group.raft.metrics().borrow().current_leader.is_none() {
                if let Err(e) = initialize(&group, nodes).await {
                    tracing::warn!(group = group.id, error = %e, "fallback bootstrap failed");
                }
            }
        }));
        Ok(())
    }

    /// Adds `node` at `addr` as a learner of `group` (every group when `None`); waits for it to catch up.
    pub async fn add_learner(
        &self,
        group: Option<GroupId>,
        node: NodeId,
        addr: &str,
    ) -> Result<(), HostError> {
        for gid in self.targets(group)? {
            self.routed(gid, Routed::AddLearner(node, addr.to_string()))
                .await?;
        }
        Ok(())
    }

    /// Makes `voters` the complete voter set of `group` (every group when `None`).
    pub async fn change_membership(
        &self,
        group: Option<GroupId>,
        voters: BTreeSet<NodeId>,
    ) -> Result<(), HostError> {
        for gid in self.targets(group)? {
            self.routed(gid, Routed::ChangeVoters(voters.clone()))
                .await?;
        }
        Ok(())
    }

    fn targets(&self, group: Option<GroupId>) -> Result<Vec<GroupId>, HostError> {
        match group {
            Some(g) => {
                self.group(g)?;
                Ok(vec![g])
            }
            None => Ok(self.group_ids()),
        }
    }

    /// Hands the leadership of `group` to voter `to`; returns the leader afterwards.
    pub async fn transfer_leader(&self, group: GroupId, to: NodeId) -> Result<NodeId, HostError> {
        let outcome = self.routed(group, Routed::Transfer(to)).await?;
        Ok(outcome.index)
    }

    /// openraft 0.9 has no leader transfer: the leader stops its heartbeats
    /// and writes, tells the other voters to hold their campaigns and the
    /// target to campaign once the lease has run out, then waits to see the
    /// target lead. See raft/README.md.
    async fn transfer_local(&self, g: &Arc<Group>, to: NodeId) -> Result<Outcome, HostError> {
        let m = g.raft.metrics().borrow().clone();
        if m.current_leader != Some(self.node_id()) {
            return Err(self.not_leader(g.id, m.current_leader, None));
        }
        if to == self.node_id() {
            return Ok(Outcome {
                reply: Vec::new(),
                index: to,
            });
        }
        let membership = m.membership_config.membership().clone();
        if !membership.voter_ids().any(|v| v == to) {
            return Err(HostError::InvalidArgument(format!(
                "to_node: node {to} is not a voter of group {}",
                g.id
            )));
        }
        if g.transferring.swap(true, Ordering::AcqRel) {
            return Err(HostError::Transferring { group: g.id });
        }
        g.raft.runtime_config().heartbeat(false);
        let result = self.hand_over(g, to, &membership).await;
        g.raft.runtime_config().heartbeat(true);
        g.transferring.store(false, Ordering::Release);
        result.map(|leader| Outcome {
            reply: Vec::new(),
            index: leader,
        })
    }

    async fn hand_over(
        &self,
        g: &Arc<Group>,
        to: NodeId,
        membership: &openraft::Membership<NodeId, BasicNode>,
    ) -> Result<NodeId, HostError> {
        let timing = &self.shared.cfg.timing;
        let hold_ms = timing.election_max_ms * 3 + timing.election_min_ms;
        let origin = Origin {
            cluster_id: self.shared.cluster_id.clone(),
            group: g.id,
            node: self.node_id(),
        };
        for voter in membership.voter_ids().filter(|v| *v != self.node_id()) {
            let Some(node) = membership.get_node(&voter) else {
                continue;
            };
            let req = PrepareElectionRequest {
                envelope: Some(origin.envelope(voter)),
                candidate: to,
                hold_ms,
            };
            let sent = match self.shared.pool.channel(&node.addr) {
                Ok(ch) => transport_client(&self.shared.pool, ch, voter)
                    .prepare_election(req)
                    .await
                    .map_err(|s| s.to_string()),
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                if voter == to {
                    return Err(HostError::Unavailable {
                        group: g.id,
                        detail: format!("transfer target {to}: {e}"),
                    });
                }
                tracing::warn!(group = g.id, voter, error = %e, "voter missed the transfer notice");
            }
        }
        let mut rx = g.raft.metrics();
        let wait = async {
            loop {
                let leader = rx.borrow_and_update().current_leader;
                if leader.is_some() && leader != Some(self.node_id()) {
                    return leader;
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(Duration::from_millis(TRANSFER_TIMEOUT_MS), wait).await {
            Ok(Some(leader)) => Ok(leader),
            Ok(None) => Err(Self::fatal(g.id, "raft stopped during a transfer")),
            Err(_) => Err(HostError::Unavailable {
                group: g.id,
                detail: format!("node {to} did not take over within {TRANSFER_TIMEOUT_MS} ms"),
            }),
        }
    }

    /// Called on every voter but the leader during a transfer.
    pub(crate) fn prepare_election(
        &self,
        group: GroupId,
        candidate: NodeId,
        hold_ms: u64,
    ) -> Result<(), HostError> {
        let g = self.group(group)?;
        let lease_ms = self.shared.cfg.timing.election_max_ms;
        let mut stop = self.shutdown_signal();
        if candidate == self.node_id() {
            self.own(tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(lease_ms + 50)) => {}
                    _ = stop.changed() => return,
                }
                if let Err(e) = g.raft.trigger().elect().await {
                    tracing::warn!(group = g.id, error = %e, "could not start the handed-over election");
                }
            }));
        } else {
            // The election gate lifts the hold once it has passed.
            if let Ok(mut hold) = g.election_hold_until.lock() {
                *hold = Some(Instant::now() + Duration::from_millis(hold_ms));
            }
            g.raft.runtime_config().elect(false);
        }
        Ok(())
    }

    /// Pings every peer every [`REACH_PING_MS`] (one ping in flight per peer, each
    /// bounded by [`REACH_WINDOW_MS`]) and records who answered, with what.
    async fn ping_peers(self) {
        let mut stop = self.shutdown_signal();
        let mut tick = tokio::time::interval(Duration::from_millis(REACH_PING_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let started = Instant::now();
        let mut silent = BTreeSet::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            self.log_silent_peers(started, &mut silent);
            for (peer, addr) in self.members() {
                if peer == self.node_id() || !self.shared.reach.start_ping(peer) {
                    continue;
                }
                let host = self.clone();
                // Not owned: each ping ends within REACH_WINDOW_MS on its own.
                tokio::spawn(async move {
                    if let Some(views) = host.ping(peer, &addr).await {
                        host.shared.reach.answered(peer, views);
                    }
                    host.shared.reach.end_ping(peer);
                });
            }
        }
    }

    /// Logs a peer that stopped answering pings for `PEER_SILENT_WARN_MS` (once, at
    /// WARN) and its return (INFO). Short silences are normal (a restart, an election)
    /// and are not logged; openraft's own replication errors are off by default.
    fn log_silent_peers(&self, started: Instant, silent: &mut BTreeSet<NodeId>) {
        let bound = Duration::from_millis(PEER_SILENT_WARN_MS);
        for (peer, addr) in self.members() {
            if peer == self.node_id() {
                continue;
            }
            let since = self.shared.reach.last_answer(peer).unwrap_or(started);
            let quiet = since.elapsed();
            if quiet >= bound && silent.insert(peer) {
                tracing::warn!(peer, %addr, silent_ms = quiet.as_millis() as u64, "peer does not answer");
            } else if quiet < bound && silent.remove(&peer) {
                tracing::info!(peer, %addr, "peer answers again");
            }
        }
    }

    /// `peer`'s view of each group if it answers a ping in time (a peer too old to
    /// know the call answers Unimplemented: it is reachable, with no views).
    async fn ping(&self, peer: NodeId, addr: &str) -> Option<BTreeMap<GroupId, PeerGroupView>> {
        let group = self.shared.groups.now().keys().next().copied()?;
        let channel = self.shared.pool.channel(addr).ok()?;
        let origin = Origin {
            cluster_id: self.shared.cluster_id.clone(),
            group,
            node: self.node_id(),
        };
        let window = Duration::from_millis(REACH_WINDOW_MS);
        let mut req = tonic::Request::new(pb_raft::PingRequest {
            envelope: Some(origin.envelope(peer)),
        });
        req.set_timeout(window);
        let mut client = transport_client(&self.shared.pool, channel, peer);
        match tokio::time::timeout(window, client.ping(req)).await {
            Ok(Ok(reply)) => Some(
                reply
                    .into_inner()
                    .groups
                    .iter()
                    .map(|v| (v.group, peer_group_view(v)))
                    .collect(),
            ),
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Some(BTreeMap::new()),
            _ => None,
        }
    }

    /// What this replica tells a pinging peer about each group.
    pub(crate) fn group_views(&self) -> Vec<pb_raft::GroupView> {
        let now = Instant::now();
        self.shared
            .groups
            .now()
            .values()
            .map(|g| {
                let last = g.last_log.get();
                let (state, leader) = {
                    let m = g.raft.metrics();
                    let m = m.borrow();
                    (m.state, m.current_leader)
                };
                pb_raft::GroupView {
                    group: g.id,
                    has_last_log: last.is_some(),
                    last_log_term: last.map_or(0, |l| l.leader_id.term),
                    last_log_node: last.map_or(0, |l| l.leader_id.node_id),
                    last_log_index: last.map_or(0, |l| l.index),
                    leader: self.heard_leader(g.id, state, leader, now).unwrap_or(0),
                }
            })
            .collect()
    }

    /// The leader this replica hears in `group`, given its `state` and
    /// `current_leader` there: itself if it leads, else its leader if that one
    /// answered a ping within the window and said it leads.
    fn heard_leader(
        &self,
        group: GroupId,
        state: openraft::ServerState,
        current_leader: Option<NodeId>,
        now: Instant,
    ) -> Option<NodeId> {
        if state == openraft::ServerState::Leader {
            return Some(self.node_id());
        }
        current_leader.filter(|l| *l != self.node_id() && self.shared.reach.leads(*l, group, now))
    }

    /// Decides, every [`REACH_PING_MS`], who may campaign in each group and starts
    /// an election ahead of openraft's timer when this replica should lead next
    /// (see the `reachability` module).
    async fn gate_elections(self) {
        let mut stop = self.shutdown_signal();
        let mut state = GateState::default();
        let timing = GateTiming::for_election_max(self.shared.cfg.timing.election_max_ms);
        let mut tick = tokio::time::interval(Duration::from_millis(REACH_PING_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            for (gid, g) in self.shared.groups.now().iter() {
                let input = self.gate_input(g, now, &mut state);
                let decision = decide(&input, timing);
                if state.enabled.get(gid) != Some(&decision.enable) {
                    g.raft.runtime_config().elect(decision.enable);
                    let was = state.enabled.insert(*gid, decision.enable);
                    if was.is_some() {
                        log_gate_change(*gid, decision.reason);
                    }
                }
                if decision.campaign_now && state.may_campaign_again(*gid, now, timing) {
                    state.campaigned_at.insert(*gid, now);
                    tracing::info!(
                        group = gid,
                        silent_ms = input.leader_silent_ms.unwrap_or(0),
                        "election gate: the leader is silent and this replica holds the longest log in reach; campaigning"
                    );
                    let trigger = g.raft.trigger();
                    let elect = trigger.elect();
                    match tokio::time::timeout(Duration::from_millis(REACH_WINDOW_MS), elect).await
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!(group = gid, error = %e, "could not campaign"),
                        Err(_) => {
                            tracing::warn!(group = gid, "raft did not take the campaign in time")
                        }
                    }
                }
            }
        }
    }

    /// Gathers the gate's input for `g`, tracking when it last heard its leader.
    fn gate_input(&self, g: &Group, now: Instant, state: &mut GateState) -> GateInput {
        let (state_now, current_leader, vote, voters) = {
            let m = g.raft.metrics();
            let m = m.borrow();
            let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
            (m.state, m.current_leader, m.vote, voters)
        };
        let me = self.node_id();
        let role = match state_now {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Candidate => Role::Candidate,
            _ => Role::Follower,
        };
        // A vote given or taken restarts the wait, as it restarts openraft's timer: an
        // election is under way, and campaigning over it would depose the winner.
        let voted = state.vote_changed_at(g.id, vote, now);
        let leader_silent_ms = match self.heard_leader(g.id, state_now, current_leader, now) {
            Some(l) => {
                // Heard as of the leader's last ping answer (now, for itself).
                let at = if l == me {
                    now
                } else {
                    self.shared.reach.last_answer(l).unwrap_or(now)
                };
                state.heard_at.insert(g.id, at);
                None
            }
            None => {
                let heard = *state.heard_at.entry(g.id).or_insert(now);
                let since = heard.max(voted);
                Some(now.saturating_duration_since(since).as_millis() as u64)
            }
        };
        let held = g
            .election_hold_until
            .lock()
            .ok()
            .and_then(|h| *h)
            .is_some_and(|until| until > now);
        GateInput {
            me,
            voters,
            last_log: g.last_log.get(),
            role,
            peers: self.shared.reach.views(g.id, now),
            held,
            leader_silent_ms,
        }
    }

    /// Moves group leaderships so no live replica leads more than ceil(groups / live).
    pub async fn balance(&self) -> Result<pb::BalanceReply, HostError> {
        let live = self.live_nodes().await;
        let mut leaders = BTreeMap::new();
        let mut voters = BTreeMap::new();
        for (gid, g) in self.shared.groups.now().iter() {
            let m = g.raft.metrics().borrow().clone();
            leaders.insert(*gid, m.current_leader);
            voters.insert(
                *gid,
                m.membership_config
                    .membership()
                    .voter_ids()
                    .collect::<BTreeSet<_>>(),
            );
        }
        let moves = balance::plan(&leaders, &voters, &live);
        let runs = moves.iter().map(|m| async move {
            let res = self.transfer_leader(m.group, m.to).await;
            if let Err(e) = &res {
                tracing::warn!(group = m.group, to = m.to, error = %e, "leadership transfer failed");
            }
            pb::Transfer { group_id: m.group, from_node: m.from, to_node: m.to, done: matches!(res, Ok(l) if l == m.to) }
        });
        let transfers = futures::future::join_all(runs).await;
        let mut leaders_per_node = BTreeMap::<u64, u32>::new();
        for g in self.shared.groups.now().values() {
            if let Some(l) = g.raft.metrics().borrow().current_leader {
                *leaders_per_node.entry(l).or_default() += 1;
            }
        }
        Ok(pb::BalanceReply {
            transfers,
            leaders_per_node: leaders_per_node.into_iter().collect(),
        })
    }

    /// The status member `id` at `addr` reports of itself, asked as a peer (this
    /// replica's certificate and a proof made for that member: never a client's token).
    pub async fn member_status(
        &self,
        id: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<pb::StatusReply, String> {
        let ch = self.shared.pool.channel(addr)?;
        let mut req = tonic::Request::new(pb::StatusRequest {
            include_state_hash: false,
        });
        req.set_timeout(timeout);
        let mut client = admin_client(&self.shared.pool, ch, id);
        match tokio::time::timeout(timeout, client.status(req)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        }
    }

    /// Members (from every group's membership) that answer a status probe.
    async fn live_nodes(&self) -> BTreeSet<NodeId> {
        let members = self.members();
        let probes = members.into_iter().map(|(id, addr)| async move {
            if id == self.node_id() {
                return Some(id);
            }
            let ch = self.shared.pool.channel(&addr).ok()?;
            let mut req = tonic::Request::new(pb::StatusRequest {
                include_state_hash: false,
            });
            req.set_timeout(Duration::from_millis(PROBE_TIMEOUT_MS));
            admin_client(&self.shared.pool, ch, id)
                .status(req)
                .await
                .ok()
                .map(|_| id)
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn auto_balance(self) {
        let period = Duration::from_millis(self.shared.cfg.timing.balance_interval_ms);
        let mut stop = self.shutdown_signal();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.changed() => return,
            }
            if self.leader_of(crate::META_GROUP) != Some(self.node_id()) || !self.needs_balance() {
                continue;
            }
            match self.balance().await {
                Ok(r) => tracing::info!(transfers = r.transfers.len(), "leaderships balanced"),
                Err(e) => tracing::warn!(error = %e, "leader balancing failed"),
            }
        }
    }

    fn needs_balance(&self) -> bool {
        let mut count = BTreeMap::<NodeId, usize>::new();
        let mut voters = BTreeSet::new();
        for g in self.shared.groups.now().values() {
            let m = g.raft.metrics().borrow().clone();
            voters.extend(m.membership_config.membership().voter_ids());
            if let Some(l) = m.current_leader {
                *count.entry(l).or_default() += 1;
            }
        }
        let max = balance::leaders_max(self.shared.groups.now().len(), voters.len());
        count.values().any(|c| *c > max)
    }

    /// Builds a snapshot of `group` (every group when `None`) on this replica and purges the log it covers.
    pub async fn compact(&self, group: Option<GroupId>) -> Result<(), HostError> {
        for gid in self.targets(group)? {
            let g = self.group(gid)?;
            let applied = g.raft.metrics().borrow().last_applied;
            g.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| Self::fatal(gid, e))?;
            let mut rx = g.raft.metrics();
            let wait = async {
                loop {
                    let snap = rx.borrow_and_update().snapshot;
                    if snap >= applied {
                        return snap;
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            };
            let snap = tokio::time::timeout(Duration::from_millis(COMPACT_TIMEOUT_MS), wait)
                .await
                .map_err(|_| HostError::Unavailable {
                    group: gid,
                    detail: "snapshot did not complete".into(),
                })?;
            if let Some(snap) = snap {
                g.raft
                    .trigger()
                    .purge_log(snap.index)
                    .await
                    .map_err(|e| Self::fatal(gid, e))?;
            }
        }
        Ok(())
    }

    /// Every member known from the groups' memberships: id -> address.
    pub fn members(&self) -> BTreeMap<NodeId, String> {
        let mut out = BTreeMap::new();
        for g in self.shared.groups.now().values() {
            let m = g.raft.metrics().borrow().membership_config.clone();
            for (id, node) in m.membership().nodes() {
                out.insert(*id, node.addr.clone());
            }
        }
        out
    }

    /// Whether `group`'s membership, as this replica sees it, is a joint one (a change
    /// of voters under way).
    pub fn membership_changing(&self, group: GroupId) -> Result<bool, HostError> {
        let g = self.group(group)?;
        let m = g.raft.metrics().borrow().membership_config.clone();
        Ok(m.membership().get_joint_config().len() > 1)
    }

    /// The voters of `group` (id -> address) as this replica's membership shows them.
    pub fn voters_of(&self, group: GroupId) -> Result<BTreeMap<NodeId, String>, HostError> {
        let g = self.group(group)?;
        let m = g.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        Ok(membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
            .collect())
    }

    /// The status of every group on this replica.
    pub fn status(&self, with_hash: bool) -> Vec<GroupStatus> {
        self.shared
            .groups
            .now()
            .values()
            .map(|g| group_status(g, with_hash))
            .collect()
    }

    /// The members this replica has seen store Raft state (see `members_seen`).
    pub fn members_seen(&self) -> BTreeSet<NodeId> {
        self.shared.members_seen.get()
    }

    /// Starts serving peers' votes, entries and snapshots (see [`TransportStart::Held`]).
    pub fn open_transport(&self) {
        self.shared.transport_open.store(true, Ordering::SeqCst);
    }

    /// Refuses a Raft call while the transport is held.
    pub(crate) fn check_transport_open(&self) -> Result<(), tonic::Status> {
        if self.shared.transport_open.load(Ordering::SeqCst) {
            return Ok(());
        }
        Err(tonic::Status::unavailable(format!(
            "replica {} is blank and still asking its peers whether it may bootstrap",
            self.node_id()
        )))
    }

    /// Records, every `MEMBERS_SEEN_PERIOD_MS`, the members this replica saw store Raft state.
    async fn record_members_seen(self) {
        let mut stop = self.shutdown_signal();
        let mut tick = tokio::time::interval(Duration::from_millis(MEMBERS_SEEN_PERIOD_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let me = self.node_id();
            let groups: Vec<GroupParticipation> = self
                .shared
                .groups
                .now()
                .values()
                .map(|g| {
                    let m = g.raft.metrics().borrow().clone();
                    GroupParticipation {
                        leading: m.current_leader == Some(me),
                        acknowledged: m
                            .replication
                            .iter()
                            .flatten()
                            .filter(|(_, matched)| matched.is_some())
                            .map(|(id, _)| *id)
                            .collect(),
                        applied_from: m.current_leader.filter(|_| m.last_applied.is_some()),
                    }
                })
                .collect();
            let seen = participants(me, &groups);
            let host = self.clone();
            let recorded =
                tokio::task::spawn_blocking(move || host.shared.members_seen.record(&seen)).await;
            match recorded {
                Ok(Ok(new)) if !new.is_empty() => {
                    tracing::info!(members = ?new, "recorded members that stored Raft state")
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot record the members seen"),
                Err(e) => tracing::warn!(error = %e, "members-seen task failed"),
            }
        }
    }

    /// Stops every group and background task.
    pub async fn shutdown(&self) {
        let _ = self.shared.shutdown.send(true);
        // A group being added finishes first (adding checks the signal under this lock),
        // so its Raft replica and tasks are among those stopped below.
        let _adding = self.shared.adding.lock().await;
        for g in self.shared.groups.now().values() {
            if let Err(e) = g.raft.shutdown().await {
                tracing::warn!(group = g.id, error = %e, "raft shutdown");
            }
        }
        let tasks = match self.shared.tasks.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(_) => Vec::new(),
        };
        for t in tasks {
            t.abort();
        }
    }
}

async fn initialize(group: &Group, nodes: BTreeMap<NodeId, BasicNode>) -> Result<(), HostError> {
    match group.raft.initialize(nodes).await {
        Ok(()) => Ok(()),
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(HostError::Fatal {
            group: group.id,
            detail: format!("initialize: {e}"),
        }),
    }
}

pub(crate) fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

pub(crate) fn committed_index(g: &Group) -> u64 {
    g.committed_next.load(Ordering::Relaxed).saturating_sub(1)
}

fn group_status(g: &Group, with_hash: bool) -> GroupStatus {
    let m = g.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let (applied_index, state_hash) = if with_hash {
        g.sm.state_hash()
    } else {
        (m.last_applied.map(|l| l.index).unwrap_or(0), String::new())
    };
    let matched = m
        .replication
        .as_ref()
        .map(|r| {
            r.iter()
                .map(|(id, log)| (*id, log.map(|l| l.index + 1).unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    GroupStatus {
        group_id: g.id,
        role: role_name(m.state).to_string(),
        leader: m.current_leader.unwrap_or(0),
        term: m.current_term,
        last_log_index: m.last_log_index.unwrap_or(0),
        committed_index: committed_index(g),
        applied_index,
        snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
        purged_index: m.purged.map(|l| l.index).unwrap_or(0),
        voters: membership.voter_ids().collect(),
        learners: membership.learner_ids().collect(),
        initialized: m.last_log_index.is_some() || m.vote.leader_id().term > 0,
        state_hash,
        matched,
    }
}
