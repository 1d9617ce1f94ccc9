//! Glue between gangway's ledgers and gangway-raft: each Raft group's
//! `StateMachine` decodes commands and queries (either format of `wire`), applies
//! them to its ledger, and encodes the reply in the replica's write format. A
//! malformed command gets a `Malformed` / `Rejected` reply and changes nothing.
//! Group 0 is the meta group, 1..=S are shards.

pub mod growth;
pub mod moves;
pub mod release;
pub mod wake;
pub mod warmer;

use std::time::{SystemTime, UNIX_EPOCH};

use gangway_raft::{
    Admission, GroupId, HostError, RaftHost, RestoreError, SnapshotWriter, StateMachine, META_GROUP,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::failpoints::{self, Failpoints};
use crate::replicated::warmer::SelectorWarmer;
use gangway_core::engine::placement::Unplaced;
use gangway_core::engine::{Diagnosis, FilterReason, MemberLabels, Placer};
use gangway_core::ledger::meta::{MetaCommand, MetaQuery, MetaReply, MetaState, RejectionKind};
use gangway_core::ledger::usage::HandOver;
use gangway_core::ledger::{LedgerCommand, LedgerError, LedgerOp, LedgerReply, ShardLedger};
use gangway_core::model::{Device, MemberKey, PodSpec};
use gangway_core::query::{answer, unbound, ShardAnswer, ShardQuery, Victims};
use gangway_core::wire::{decode, WireError, WireFormat};

/// Encodes a command, query or reply in the default (binary) format.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    WireFormat::Binary.encode(value)
}

/// Encodes a state machine's reply; if the reply cannot be encoded, the
/// error reply `on_error` builds is sent instead, so the caller learns why.
fn reply<T: Serialize>(
    format: WireFormat,
    value: &T,
    on_error: impl FnOnce(String) -> T,
) -> Vec<u8> {
    match format.encode(value) {
        Ok(bytes) => bytes,
        Err(e) => format
            .encode(&on_error(format!("reply could not be encoded: {e}")))
            .unwrap_or_default(),
    }
}

/// Encodes a state for a snapshot. The states hold only data with string or
/// integer map keys, so a failure means the state itself is corrupt.
fn snapshot_bytes<T: Serialize>(format: WireFormat, what: &str, state: &T) -> Vec<u8> {
    match format.encode(state) {
        Ok(bytes) => bytes,
        Err(e) => panic!("{what} state cannot be encoded, it is corrupt: {e}"),
    }
}

fn meta_rejected(reason: String) -> MetaReply {
    MetaReply::Rejected {
        reason,
        kind: RejectionKind::Refused,
    }
}

fn shard_malformed(reason: String) -> ShardOutcome {
    ShardOutcome::Malformed { reason }
}

fn answer_malformed(reason: String) -> ShardAnswer {
    ShardAnswer::Malformed { reason }
}

/// A shard's answer to one command: the ledger's reply, or why the command
/// could not be decoded (it reached no ledger).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardOutcome {
    /// The ledger applied (or refused) the command.
    Applied(LedgerReply),
    /// The command was not a ledger command.
    Malformed {
        /// The decoding error.
        reason: String,
    },
}

/// The meta group's state machine.
pub struct MetaMachine {
    state: MetaState,
    /// Not state: the format replies and snapshots are written in.
    format: WireFormat,
    /// Not state: test bug switches (none in production). Every replica of a test
    /// cluster is armed alike, so applies stay deterministic.
    failpoints: Failpoints,
}

/// A shard group's state machine: the shard ledger, and the placer its plans use.
pub struct ShardMachine {
    ledger: ShardLedger,
    /// Not state: the format replies and snapshots are written in.
    format: WireFormat,
    /// Not state: what the engine keeps between plans on this replica.
    placer: std::sync::Mutex<Placer>,
    /// Not state: test crash points (none in production). Crashing changes no state.
    failpoints: Failpoints,
    /// Not state: where costly selectors are evaluated before the gangs that need them
    /// are planned (changes when a gang is planned, never where).
    warmer: SelectorWarmer,
    /// This shard's group id.
    shard: u32,
    /// Not state: where applied operations that may help parked groups are counted.
    wake: wake::WakeBoard,
}

/// Builds the state machine of `group` in a cluster of `shards` shards, writing
/// replies and snapshots in `format`.
pub fn machine_for(
    group: GroupId,
    shards: u32,
    format: WireFormat,
    failpoints: &Failpoints,
    warmer: &SelectorWarmer,
    wake: &wake::WakeBoard,
) -> Box<dyn StateMachine> {
    if group == META_GROUP {
        Box::new(MetaMachine {
            state: MetaState::new(shards),
            format,
            failpoints: failpoints.clone(),
        })
    } else {
        Box::new(ShardMachine {
            ledger: ShardLedger::new(),
            format,
            placer: std::sync::Mutex::new(Placer::new()),
            failpoints: failpoints.clone(),
            warmer: warmer.clone(),
            // Shard groups are numbered from 1 up to SHARDS_MAX, so this never saturates.
            shard: u32::try_from(group).unwrap_or(u32::MAX),
            wake: wake.clone(),
        })
    }
}

fn restore<T: DeserializeOwned>(snapshot: &[u8]) -> Result<T, RestoreError> {
    decode(snapshot).map_err(|e| RestoreError(e.to_string()))
}

/// Meta admits what decodes as a meta command.
fn admit_meta(command: &[u8]) -> Result<(), String> {
    decode::<MetaCommand>(command)
        .map(|_| ())
        .map_err(|e| format!("malformed meta command: {e}"))
}

/// A shard admits what decodes as a ledger command that no state could accept
/// only if it is well formed (see [`gangway_core::ledger::shard::admit`]).
fn admit_shard(command: &[u8]) -> Result<(), String> {
    let cmd =
        decode::<LedgerCommand>(command).map_err(|e| format!("malformed shard command: {e}"))?;
    gangway_core::ledger::shard::admit(&cmd).map_err(|e| e.to_string())
}

impl StateMachine for MetaMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        self.state
            .set_quota_unchecked(self.failpoints.armed(failpoints::META_ADMITS_OVER_QUOTA));
        self.state
            .set_seal_unchecked(self.failpoints.armed(failpoints::MOVE_SEALS_IN_FLIGHT));
        self.state.set_twins_of_placed_admitted(
            self.failpoints
                .armed(failpoints::META_ADMITS_TWINS_OF_PLACED),
        );
        let answer = match decode(command) {
            Ok(cmd) => reply(self.format, &self.state.apply(&cmd), meta_rejected),
            Err(e) => reply(
                self.format,
                &meta_rejected(format!("malformed meta command: {e}")),
                meta_rejected,
            ),
        };
        if self.failpoints.armed(failpoints::META_FORGETS_UNACKED) {
            self.state.forget_decisions_unacknowledged();
        }
        if self
            .failpoints
            .armed(failpoints::META_RETURNS_VICTIMS_AT_ABORT)
        {
            self.state.settle_aborted_preemptions_early();
        }
        answer
    }
    fn snapshot(&self) -> Vec<u8> {
        snapshot_bytes(self.format, "meta", &self.state)
    }
    fn snapshot_writer(&self) -> SnapshotWriter {
        // Records are shared copy-on-write, so the copy costs the maps, not the groups.
        let frozen = self.state.clone();
        let format = self.format;
        Box::new(move || snapshot_bytes(format, "meta", &frozen))
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.state = restore(snapshot)?;
        self.state.index_groups();
        Ok(())
    }
    fn admission(&self) -> Option<Admission> {
        Some(std::sync::Arc::new(admit_meta))
    }
    fn query(&self, query: &[u8]) -> Vec<u8> {
        match decode(query) {
            Ok(q) => reply(self.format, &self.state.query(&q), meta_rejected),
            Err(e) => reply(
                self.format,
                &meta_rejected(format!("malformed meta query: {e}")),
                meta_rejected,
            ),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl ShardMachine {
    /// Answers one query: what `query` answers encoded, and typed reads directly.
    fn answer(&self, q: ShardQuery) -> ShardAnswer {
        if let ShardQuery::Unbound { limit } = q {
            if self.failpoints.armed(failpoints::BIND_BEFORE_VICTIMS_LEAVE) {
                return unbound(&self.ledger, limit, Victims::Ignore);
            }
        }
        let (q, cold) = self.without_cold_gangs(q);
        // A panic while planning leaves no broken invariant in a placer (its
        // caches are checked against node stamps), so a poisoned lock is reused.
        let mut placer = self
            .placer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut answered = answer(&self.ledger, &q, &mut placer);
        if let ShardAnswer::Plan { placement } = &mut answered {
            if self.failpoints.armed(failpoints::PLANS_READ_EVERY_LABEL) {
                placement.member_labels = MemberLabels::Read;
            }
            placement
                .unplaced
                .extend(cold.into_iter().map(|member| Unplaced {
                    member,
                    diagnosis: Diagnosis {
                        nodes: 0,
                        reasons: [(FilterReason::SelectorsWarming, 1)].into(),
                    },
                }));
        }
        answered
    }

    /// A plan query without the gangs whose selectors are still being warmed (see
    /// `shard::warmer`), and the members left out; other queries as they are.
    fn without_cold_gangs(&self, q: ShardQuery) -> (ShardQuery, Vec<MemberKey>) {
        let ShardQuery::Plan {
            members,
            profile,
            carried,
            topologies,
            kept,
        } = q
        else {
            return (q, Vec::new());
        };
        let classes = self.ledger.device_classes();
        let mut devices: Option<Vec<(&str, &Device)>> = None;
        let mut cold: std::collections::BTreeSet<(String, String)> = Default::default();
        // Members of one template share a spec, and gangs share selectors: each spec is
        // resolved once and each selector asked once per plan (every ask reads every device).
        let mut ready_by_selector: std::collections::HashMap<String, bool> = Default::default();
        let mut last_spec: Option<(&PodSpec, bool)> = None;
        for (key, spec) in &members {
            let gang = (key.namespace.clone(), key.gang.clone());
            if cold.contains(&gang) {
                continue;
            }
            let ready = match last_spec {
                Some((prev, ready)) if prev == spec => ready,
                _ => {
                    let selectors = gangway_core::engine::devices::selectors_of(spec, classes);
                    // Every selector is asked (not stopping at the first cold one), so all
                    // the costly ones start warming at once.
                    let answers: Vec<bool> = selectors
                        .iter()
                        .map(|selector| {
                            *ready_by_selector
                                .entry(selector.source().to_string())
                                .or_insert_with(|| {
                                    let devices = devices.get_or_insert_with(|| self.devices());
                                    self.warmer.ready(std::slice::from_ref(selector), devices)
                                })
                        })
                        .collect();
                    let ready = answers.iter().all(|ready| *ready);
                    last_spec = Some((spec, ready));
                    ready
                }
            };
            if !ready {
                cold.insert(gang);
            }
        }
        if cold.is_empty() {
            let plan = ShardQuery::Plan {
                members,
                profile,
                carried,
                topologies,
                kept,
            };
            return (plan, Vec::new());
        }
        tracing::debug!(gangs = ?cold, "gangs sit out this plan while their selectors are evaluated");
        let (left_out, members): (Vec<_>, Vec<_>) = members
            .into_iter()
            .partition(|(key, _)| cold.contains(&(key.namespace.clone(), key.gang.clone())));
        let left_out = left_out.into_iter().map(|(key, _)| key).collect();
        let plan = ShardQuery::Plan {
            members,
            profile,
            carried,
            topologies,
            kept,
        };
        (plan, left_out)
    }

    /// Every published device of the shard, with its driver.
    fn devices(&self) -> Vec<(&str, &Device)> {
        self.ledger
            .nodes()
            .flat_map(|n| n.usage.devices.pools.iter())
            .flat_map(|(key, pool)| pool.devices.values().map(move |d| (key.driver.as_str(), d)))
            .collect()
    }
}

impl StateMachine for ShardMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        match decode::<LedgerCommand>(command) {
            Ok(cmd) => {
                if self
                    .failpoints
                    .armed(failpoints::SHARED_CLAIMS_FREED_WITH_CARRIER)
                {
                    self.ledger.set_hand_over(HandOver::Freed);
                }
                let (applied, wake) = self.ledger.apply_noting_wake(&cmd);
                self.wake.note(self.shard, wake);
                let outcome = ShardOutcome::Applied(applied);
                if matches!(cmd.op, LedgerOp::Reserve { .. }) {
                    self.failpoints.hit(failpoints::PARTICIPANT_AFTER_RESERVE);
                }
                reply(self.format, &outcome, shard_malformed)
            }
            Err(e) => reply(
                self.format,
                &shard_malformed(format!("malformed shard command: {e}")),
                shard_malformed,
            ),
        }
    }
    fn snapshot(&self) -> Vec<u8> {
        self.ledger.snapshot_as(self.format)
    }
    fn admission(&self) -> Option<Admission> {
        Some(std::sync::Arc::new(admit_shard))
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.ledger = ShardLedger::restore(snapshot).map_err(|e| RestoreError(e.to_string()))?;
        // A restore may jump over any change.
        self.wake
            .note(self.shard, gangway_core::ledger::Wake::EVERYTHING);
        Ok(())
    }
    fn query(&self, query: &[u8]) -> Vec<u8> {
        match decode(query) {
            Ok(q) => reply(self.format, &self.answer(q), answer_malformed),
            Err(e) => reply(
                self.format,
                &answer_malformed(e.to_string()),
                answer_malformed,
            ),
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A failure talking to a replicated group.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// Routing, quorum or storage failure.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A command or query that cannot be encoded.
    #[error("cannot encode a request for group {group}: {reason}")]
    Encode {
        /// The group.
        group: GroupId,
        /// Why.
        reason: String,
    },
    /// A reply that is not what the group's state machine sends.
    #[error("group {group} sent an undecodable reply: {reason}")]
    Decode {
        /// The group.
        group: GroupId,
        /// Why.
        reason: String,
    },
    /// A shard refused a step of a recorded release or decision; the coordinator
    /// finishes it (meta holds what is left to do), so a retry converges.
    #[error("shard {shard}: {reason}")]
    StepRefused {
        /// The shard.
        shard: u32,
        /// Why.
        reason: String,
    },
}

impl GroupError {
    /// The gRPC status for this failure.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            GroupError::Host(e) => e.to_status(),
            GroupError::Decode { .. } | GroupError::Encode { .. } => {
                tonic::Status::internal(self.to_string())
            }
            GroupError::StepRefused { .. } => tonic::Status::aborted(format!(
                "{self}; the release is recorded and will complete, retry to wait for it"
            )),
        }
    }
}

/// Why a ledger operation did not apply ([`Groups::apply_ledger_op`]).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The group could not be reached, or the request or reply not encoded.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// The ledger refused the operation.
    #[error(transparent)]
    Refused(LedgerError),
    /// The shard's state machine did not take the command for a ledger command.
    #[error("malformed ledger command: {0}")]
    Malformed(String),
}

/// The proposer's wall clock in ms, stamped on commands (apply never reads a clock).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Typed access to the meta group and the shards through a replica's host.
#[derive(Clone)]
pub struct Groups {
    host: RaftHost,
    /// The format commands and queries are written in.
    format: WireFormat,
}

impl Groups {
    /// Wraps `host`; commands and queries are written in `format`.
    pub fn new(host: RaftHost, format: WireFormat) -> Self {
        Self { host, format }
    }

    /// The format this replica writes.
    pub fn format(&self) -> WireFormat {
        self.format
    }

    /// Whether this replica writes only what a release before shard moves reads: the
    /// JSON format, set for the first rollout of an upgrade (docs/ARCHITECTURE.md §3).
    /// Nodes then get their shard by the hash rule and no shard move is begun.
    pub fn legacy_writer(&self) -> bool {
        self.format == WireFormat::Json
    }

    /// The underlying host.
    pub fn host(&self) -> &RaftHost {
        &self.host
    }

    fn encode<T: Serialize>(&self, group: GroupId, value: &T) -> Result<Vec<u8>, GroupError> {
        self.format.encode(value).map_err(|e| GroupError::Encode {
            group,
            reason: e.to_string(),
        })
    }

    fn decode<T: DeserializeOwned>(group: GroupId, bytes: &[u8]) -> Result<T, GroupError> {
        decode(bytes).map_err(|e| GroupError::Decode {
            group,
            reason: e.to_string(),
        })
    }

    /// Commits a meta command on the meta leader.
    pub async fn meta(&self, cmd: &MetaCommand) -> Result<MetaReply, GroupError> {
        let out = self
            .host
            .write(META_GROUP, self.encode(META_GROUP, cmd)?)
            .await?;
        Self::decode(META_GROUP, &out.reply)
    }

    /// Reads the meta group linearizably: on its leader by typed access, elsewhere
    /// through the leader.
    pub async fn meta_query(&self, q: &MetaQuery) -> Result<MetaReply, GroupError> {
        let owned = q.clone();
        let typed = self
            .read_on_leader(META_GROUP, move |m: &MetaMachine| m.state.query(&owned))
            .await?;
        if let Some(answer) = typed {
            return Ok(answer);
        }
        let out = self
            .host
            .read(META_GROUP, self.encode(META_GROUP, q)?)
            .await?;
        Self::decode(META_GROUP, &out.reply)
    }

    /// Asks this replica's copy of the meta group (possibly stale, never ahead of the
    /// log), by typed access.
    pub fn meta_query_local(&self, q: &MetaQuery) -> Result<MetaReply, GroupError> {
        self.read_here(META_GROUP, |m: &MetaMachine| m.state.query(q))
    }

    /// Runs `f` on `group`'s state machine, of type `M`, when this replica leads the
    /// group (a confirmed, typed read). `None` when it does not, or leadership is in
    /// question for now: the caller then reads through the leader, which retries.
    async fn read_on_leader<M: 'static, R: Send + 'static>(
        &self,
        group: GroupId,
        f: impl FnOnce(&M) -> R + Send + 'static,
    ) -> Result<Option<R>, GroupError> {
        if self.host.leader_of(group) != Some(self.host.node_id()) {
            return Ok(None);
        }
        let typed = self
            .host
            .inspect(group, move |sm| sm.downcast_ref::<M>().map(f))
            .await;
        match typed {
            Ok(answer) => answer.map(Some).ok_or_else(|| not_the_machine(group)),
            Err(e) if e.is_retryable() => Ok(None),
            Err(e) => Err(not_open_yet(e).into()),
        }
    }

    /// Runs `f` on this replica's copy of `group`'s state machine, of type `M`.
    fn read_here<M: 'static, R>(
        &self,
        group: GroupId,
        f: impl FnOnce(&M) -> R,
    ) -> Result<R, GroupError> {
        self.host
            .inspect_local(group, |sm| sm.downcast_ref::<M>().map(f))
            .map_err(not_open_yet)?
            .ok_or_else(|| not_the_machine(group))
    }

    /// Commits a ledger operation on shard `shard`, stamped with this clock.
    pub async fn shard(&self, shard: u32, op: LedgerOp) -> Result<ShardOutcome, GroupError> {
        let group = u64::from(shard);
        let cmd = LedgerCommand {
            at_ms: now_ms(),
            op,
        };
        let out = self
            .host
            .write(group, self.encode(group, &cmd)?)
            .await
            .map_err(not_open_yet)?;
        Self::decode(group, &out.reply)
    }

    /// Commits a ledger operation on shard `shard` and returns the ledger's reply; a
    /// refusal is the ledger's error, so every service reads it the same way.
    pub async fn apply_ledger_op(
        &self,
        shard: u32,
        op: LedgerOp,
    ) -> Result<LedgerReply, ApplyError> {
        match self.shard(shard, op).await? {
            ShardOutcome::Applied(LedgerReply::Rejected { error }) => {
                Err(ApplyError::Refused(error))
            }
            ShardOutcome::Applied(reply) => Ok(reply),
            ShardOutcome::Malformed { reason } => Err(ApplyError::Malformed(reason)),
        }
    }

    /// The shard that owns `node` in meta's shard map (`None`: no shard owns it yet).
    pub async fn shard_of_node(&self, node: &str) -> Result<Option<u32>, GroupError> {
        let q = MetaQuery::ShardOf {
            node: node.to_string(),
        };
        match self.meta_query(&q).await? {
            MetaReply::Shard { shard } => Ok(Some(shard)),
            _ => Ok(None),
        }
    }

    /// Reads shard `shard` linearizably: on its leader by typed access, elsewhere
    /// through the leader.
    pub async fn shard_query(&self, shard: u32, q: &ShardQuery) -> Result<ShardAnswer, GroupError> {
        let group = u64::from(shard);
        let owned = q.clone();
        let typed = self
            .read_on_leader(group, move |m: &ShardMachine| m.answer(owned))
            .await?;
        if let Some(answer) = typed {
            return Ok(answer);
        }
        let out = self
            .host
            .read(group, self.encode(group, q)?)
            .await
            .map_err(not_open_yet)?;
        Self::decode(group, &out.reply)
    }

    /// Reads this replica's copy of shard `shard` (possibly stale; for a local leader's
    /// own state), by typed access.
    pub fn shard_query_local(&self, shard: u32, q: &ShardQuery) -> Result<ShardAnswer, GroupError> {
        self.read_here(u64::from(shard), |m: &ShardMachine| m.answer(q.clone()))
    }
}

/// A shard this replica has not opened is one the cluster added a moment ago (services
/// only name shards meta recorded): unavailable for now, which callers retry, rather
/// than unknown.
fn not_open_yet(e: HostError) -> HostError {
    match e {
        HostError::UnknownGroup { group, .. } if group != META_GROUP => HostError::Unavailable {
            group,
            detail: format!(
                "shard {group} is not open on this replica yet (the cluster grew); retry"
            ),
        },
        other => other,
    }
}

/// A group whose state machine is not the type its id says (a host built with another
/// factory): a bug, reported rather than guessed around.
fn not_the_machine(group: GroupId) -> GroupError {
    GroupError::Decode {
        group,
        reason: "its state machine is not the one gangway builds for this group".into(),
    }
}

#[cfg(test)]
mod tests;
