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
//!
//! The host, its groups and their lifecycle live here; the `impl` continues by
//! responsibility in `host/routing.rs`, `membership.rs` and `liveness.rs`.

mod liveness;
mod membership;
mod routing;

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
/// A group (or all groups together) that took at least this long to open is logged at
/// info, with where the time went; a quicker open is routine and logged at debug.
pub const SLOW_OPEN_LOG_MS: u64 = 1_000;

/// Raft timing and log-retention settings of a host.
#[derive(Debug, Clone)]
pub struct RaftTiming {
    /// Leader heartbeat period.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_min_ms: u64,
    /// Upper bound of the election timeout; also the leader lease.
    pub election_max_ms: u64,
    /// Entries applied since the last snapshot before a new one is built (and at least
    /// a quarter of the last snapshot's size in command bytes: `snapshot_cadence.rs`).
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

/// Logs a change of the gate. Only deferring to a longer log, once the group has formed,
/// is at info; the rest is at debug: anything while the group forms (no leader heard yet
/// since this replica started: a healthy start logs nothing a person must read), a leader
/// heard again (the normal state), a transfer hold, and reach (reported by `report_reach`
/// only once a majority has been out of reach for a while).
fn log_gate_change(group: GroupId, reason: GateReason, forming: bool) {
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
        GateReason::DefersTo(_) if !forming => {
            tracing::info!(group, elections = enabled, "election gate: {why}")
        }
        _ => tracing::debug!(group, elections = enabled, "election gate: {why}"),
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
        // Snapshots are triggered by `snapshot_cadence` (entries and bytes).
        snapshot_policy: SnapshotPolicy::Never,
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
        // Opened together: each restores its state from its snapshot on the blocking
        // pool, so a restart with a large state decodes its groups in parallel.
        let opening_started = std::time::Instant::now();
        let opening = cfg
            .groups
            .iter()
            .map(|&gid| Self::open_group(&deps, gid, shutdown.subscribe()));
        for (&gid, opened) in cfg
            .groups
            .iter()
            .zip(futures::future::join_all(opening).await)
        {
            let (group, task) = opened?;
            groups.insert(gid, Arc::new(group));
            proposer_tasks.push(task);
        }
        let ms = opening_started.elapsed().as_millis() as u64;
        if ms >= SLOW_OPEN_LOG_MS {
            tracing::info!(groups = groups.len(), ms, "every group opened");
        } else {
            tracing::debug!(groups = groups.len(), ms, "every group opened");
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
        let slot = store.snapshot_slot(&format!("g{gid}"))?;
        let legacy_snapshots = store.tree(&format!("g{gid}/snapshot"))?;
        let fatal = |detail: String| HostError::Fatal { group: gid, detail };
        let (sm_store, restored) = tokio::task::spawn_blocking(move || {
            SmStore::open(gid, machine, slot, legacy_snapshots)
        })
        .await
        .map_err(|e| fatal(format!("restoring the state machine stopped: {e}")))?
        .map_err(|e| fatal(e.to_string()))?;
        let raft_started = std::time::Instant::now();
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
        // No campaign on openraft's own timer before the election gate has looked: the
        // other groups may take seconds to restore, and meanwhile this replica serves
        // nothing, hears no leader, and would campaign in a higher term that deposes
        // the live leaders once it answers them.
        raft.runtime_config().elect(false);
        // Where a restart's time goes: the snapshot, then the log re-applied over it.
        let replay_ms = raft_started.elapsed().as_millis() as u64;
        let applied = sm.lock().last_applied.map(|l| l.index).unwrap_or(0);
        // tracing's levels are fixed per call site: one event, written at either level.
        macro_rules! opened {
            ($level:ident) => {
                tracing::$level!(
                    group = gid,
                    snapshot_bytes = restored.bytes,
                    read_ms = restored.read_ms,
                    restore_ms = restored.restore_ms,
                    replay_ms,
                    applied,
                    "group opened"
                )
            };
        }
        if restored.read_ms + restored.restore_ms + replay_ms >= SLOW_OPEN_LOG_MS {
            opened!(info);
        } else {
            opened!(debug);
        }
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
        let cadence_task = crate::snapshot_cadence::run(
            gid,
            raft.clone(),
            sm.clone(),
            cfg.timing.snapshot_every_entries,
            stop.clone(),
        );
        let (forwarder, forwarder_task) = Forwarder::start(origin, pool.clone(), stop);
        let task = async move {
            tokio::join!(proposer_task, gate_task, forwarder_task, cadence_task);
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
