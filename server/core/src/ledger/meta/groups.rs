//! Gang groups as the meta group records them: the durable queue of every
//! accepted submission and its state, from `Queued` to a terminal state.
//!
//! Invariants: a group holds capacity on shards only in `Placing` (reserved,
//! undecided), `Placed` and `Releasing`; a terminal group holds nothing. The
//! idempotency key maps to exactly one group.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::placements::MemberPlacements;

use crate::ledger::TxnId;
use crate::model::claim::DeviceAllocation;
use crate::model::device::DeviceId;
use crate::model::queue::queue_footprint;
use crate::model::{GangGroup, GangMode, MemberKey, Resources};

/// Sequence number the meta group gives each accepted gang group.
pub type GroupSeq = u64;

/// Where a gang group is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum GroupState {
    /// Waiting to be placed (again after `not_before_ms` when retried).
    Queued,
    /// Transaction `txn` is reserving its members on shards.
    Placing {
        /// The transaction.
        txn: TxnId,
    },
    /// Every gang reached its minMember in one committed decision.
    Placed,
    /// Placed, and named a victim of transaction `txn`, which places group `by` on the
    /// room it holds: COMMIT ends it `Preempted` (the shards free its members as
    /// they commit `txn`), ABORT returns it to `Placed`. Nothing else may change it.
    Preempting {
        /// The preemptor's transaction.
        txn: TxnId,
        /// The preemptor group.
        by: GroupSeq,
    },
    /// Its members are being released on their shards; then it ends as `then`.
    Releasing {
        /// The terminal state after the release.
        then: Terminal,
    },
    /// Finished; holds nothing.
    Done {
        /// How it ended.
        how: Terminal,
    },
}

/// How a gang group ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Terminal {
    /// Its work finished and it was released.
    Released,
    /// Cancelled by a user.
    Cancelled,
    /// waitTime passed before it could be placed.
    TimedOut,
    /// A higher-priority group took its room (the reason names it).
    Preempted,
}

impl GroupState {
    /// Every state name [`GroupState::name`] gives.
    pub const NAMES: [&'static str; 9] = [
        "Queued",
        "Placing",
        "Placed",
        "Preempting",
        "Releasing",
        "Released",
        "Cancelled",
        "TimedOut",
        "Preempted",
    ];

    /// The state's name as the API shows it.
    pub fn name(&self) -> &'static str {
        match self {
            GroupState::Queued => "Queued",
            GroupState::Placing { .. } => "Placing",
            GroupState::Placed => "Placed",
            GroupState::Preempting { .. } => "Preempting",
            GroupState::Releasing { .. } => "Releasing",
            GroupState::Done {
                how: Terminal::Released,
            } => "Released",
            GroupState::Done {
                how: Terminal::Cancelled,
            } => "Cancelled",
            GroupState::Done {
                how: Terminal::TimedOut,
            } => "TimedOut",
            GroupState::Done {
                how: Terminal::Preempted,
            } => "Preempted",
        }
    }

    /// Whether the group has ended.
    pub fn is_terminal(&self) -> bool {
        matches!(self, GroupState::Done { .. })
    }
}

/// Where one member was placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Node name.
    pub node: String,
    /// The node's shard.
    pub shard: u32,
    /// Devices allocated to the member there (empty when recovered after a failover:
    /// the shard ledger keeps them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<PlacedDevice>,
    /// The committed transaction that holds the member on its shard (None in records
    /// written before it was kept: the group's own `txn` then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<TxnId>,
    /// The other shards that hold the member's network-attached devices under that
    /// transaction (a release frees them there too; rule 15).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_shards: Vec<u32>,
    /// What the node's device plugins answered for the member's devices, one per
    /// resource, as its node agent reported them (`MetaCommand::NoteNodeAllocation`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<crate::model::node_allocation::NodeAllocation>,
}

/// One device allocated to a placed member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedDevice {
    /// The pod claim it serves.
    pub claim: String,
    /// The request (`request/sub-request` for a firstAvailable choice).
    pub request: String,
    /// The device.
    pub device: DeviceId,
}

impl PlacedDevice {
    /// The record of a device a shard allocated to a member.
    pub fn of(d: &DeviceAllocation) -> Self {
        Self {
            claim: d.claim.clone(),
            request: d.request.clone(),
            device: d.device.clone(),
        }
    }
}

/// What callers outside the coordinator see of a group: its record without the member
/// specs (which can be large and never change), so status reads and command replies
/// stay small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// Sequence number (the group's id in the API).
    pub seq: GroupSeq,
    /// The submitter's idempotency key.
    pub key: String,
    /// The group's name.
    pub name: String,
    /// Where it is.
    pub state: GroupState,
    /// Why the last attempt failed, for people.
    pub reason: String,
    /// Placement attempts that ended in an abort.
    pub attempts: u32,
    /// Member key (`ns/gang/member`) → placement, once placed.
    pub placements: BTreeMap<String, Placement>,
    /// Bumped on every change.
    pub version: u64,
    /// When it was accepted (leader's clock).
    pub submitted_at_ms: u64,
    /// Its gangs as `namespace/name`.
    pub gangs: Vec<String>,
    /// Members over every gang.
    pub members: u32,
    /// The transaction that placed it (or is placing it).
    #[serde(default)]
    pub txn: Option<TxnId>,
    /// Members whose release meta has recorded and the shards have not confirmed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub releasing: BTreeMap<String, Placement>,
    /// The queue it is charged to (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub queue: String,
    /// Who submitted it (empty: the Kubernetes ingest, or an unauthenticated caller).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// For a group that ended `Preempted`: by whom, which members, when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted: Option<PreemptionNotice>,
}

impl GroupSummary {
    /// The summary of `r`.
    pub fn of(r: &GroupRecord) -> Self {
        Self {
            seq: r.seq,
            key: r.key.clone(),
            name: r.group.id.clone(),
            state: r.state,
            reason: r.reason.clone(),
            attempts: r.attempts,
            placements: r.placements.to_map(),
            version: r.version,
            submitted_at_ms: r.submitted_at_ms,
            txn: r.txn,
            releasing: r.releasing.to_map(),
            gangs: r
                .group
                .gangs
                .iter()
                .map(|g| format!("{}/{}", g.namespace, g.name))
                .collect(),
            members: r.group.gangs.iter().map(|g| g.members.len() as u32).sum(),
            queue: r.group.queue.clone(),
            owner: r.group.owner.clone(),
            preempted: r.preempted.clone(),
        }
    }
}

/// A gang group and everything the meta group knows of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// Sequence number (the group's id in the API).
    pub seq: GroupSeq,
    /// The submitter's idempotency key.
    pub key: String,
    /// The validated group; each gang's `creation_order` is `seq`.
    pub group: GangGroup,
    /// Where it is.
    pub state: GroupState,
    /// When it was accepted (leader's clock).
    pub submitted_at_ms: u64,
    /// When it times out if still unplaced (None: never).
    pub deadline_ms: Option<u64>,
    /// Placement attempts that ended in an abort.
    pub attempts: u32,
    /// Not retried before this time.
    pub not_before_ms: u64,
    /// Why the last attempt failed, for people.
    pub reason: String,
    /// Member key (`ns/gang/member`) → placement, once placed.
    pub placements: MemberPlacements,
    /// Bumped on every change, so watchers see each one: the meta log's change
    /// stamp at its last change, so "changed since stamp N" is a comparison.
    pub version: u64,
    /// Highest priority over its gangs (queue order).
    pub priority: i32,
    /// Its latest placement transaction.
    pub txn: Option<TxnId>,
    /// Members taken out of `placements` by a release that the shards have not
    /// confirmed yet (ReleaseMembers' first phase); they still hold capacity.
    #[serde(default, skip_serializing_if = "MemberPlacements::is_empty")]
    pub releasing: MemberPlacements,
    /// What its queue is charged for it now ([`GroupRecord::charge_due`]); zero without
    /// a queue.
    #[serde(default, skip_serializing_if = "Resources::is_zero")]
    pub charge: Resources,
    /// Since when it is parked: it fit nowhere, and waits for a change that could help
    /// it ([`MetaCommand::Wake`]) or for [`super::PARKED_RECHECK_MS`] (docs/ARCHITECTURE.md
    /// §4, "Parking"); `None` while it retries on its backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_at_ms: Option<u64>,
    /// When its first members were placed (the decision's time): with its run-time
    /// limit, when it is expected to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_at_ms: Option<u64>,
    /// For a group that ended `Preempted`: by whom, which members, when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted: Option<PreemptionNotice>,
    /// Member key → the pod (`namespace/name`) chosen for a member that selects its pod
    /// by labels ([`MetaCommand::ChoosePods`](super::MetaCommand::ChoosePods)); kept for
    /// the group's life.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chosen_pods: BTreeMap<String, String>,
}

/// What a preemption took from a group: the framework watching it learns which of its
/// members were evicted, by whom and when, whenever it reads the group after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionNotice {
    /// The preemptor.
    pub by: GroupSeq,
    /// The preemption's transaction.
    pub txn: TxnId,
    /// The members evicted (`namespace/gang/member`), in key order.
    pub members: Vec<String>,
    /// When the preemption was decided (the leader's clock).
    pub at_ms: u64,
}

impl GroupRecord {
    /// The Kubernetes pods its members stand for (`namespace/name`): those named, and
    /// those chosen for members that select theirs by labels.
    pub fn named_pods(&self) -> Vec<(MemberKey, String)> {
        let mut out: Vec<(MemberKey, String)> = self.group.named_pods().collect();
        out.extend(
            self.chosen_pods
                .iter()
                .filter_map(|(m, pod)| Some((MemberKey::try_from(m.clone()).ok()?, pod.clone()))),
        );
        out
    }

    /// The pod (`namespace/name`) member `key` stands for, if it names one (or had one
    /// chosen).
    pub fn pod_of(&self, key: &MemberKey) -> Option<String> {
        let gang = self
            .group
            .gangs
            .iter()
            .find(|g| g.namespace == key.namespace && g.name == key.gang)?;
        let member = gang.members.iter().find(|m| m.name == key.member)?;
        if !member.binding.is_named() {
            return None;
        }
        if member.pod_selector.is_empty() {
            return Some(format!("{}/{}", gang.namespace, member.name));
        }
        self.chosen_pods.get(&key.to_string()).cloned()
    }

    /// Marks a change: the next stamp after both the log's last and its own version
    /// (data from before stamps were global had versions counted per group), recorded
    /// in `stamps` with the group, so meta's index catches up with it.
    pub fn bump(&mut self, stamps: &mut super::ChangeStamps) {
        self.version = stamps.next(self.seq, self.version);
    }

    /// Whether every gang has at least minMember placed members.
    pub fn every_gang_at_min(&self) -> bool {
        self.group.gangs.iter().all(|gang| {
            let placed = gang
                .members
                .iter()
                .filter(|m| {
                    self.placements
                        .contains_key(&gang.member_key(m).to_string())
                })
                .count();
            placed as u32 >= gang.min_member
        })
    }

    /// When it is expected to end: placed, with a run-time limit.
    pub fn ends_at_ms(&self) -> Option<u64> {
        Some(self.placed_at_ms?.saturating_add(self.group.run_limit_ms?))
    }

    /// Whether its members are Kubernetes pods (they carry uids).
    pub fn is_kubernetes(&self) -> bool {
        self.group
            .gangs
            .iter()
            .flat_map(|g| &g.members)
            .any(|m| m.uid.is_some())
    }

    /// Whether it is queued and parked (docs/ARCHITECTURE.md §4, "Parking").
    pub fn is_parked(&self) -> bool {
        self.state == GroupState::Queued && self.parked_at_ms.is_some()
    }

    /// Whether the group holds nothing on any shard as far as meta knows.
    pub fn holds_nothing(&self) -> bool {
        self.placements.is_empty() && self.releasing.is_empty()
    }

    /// What its queue must be charged in its current state: nothing without a queue or
    /// once ended; every member's footprint ([`queue_footprint`]: requests, one pod,
    /// devices by class) while a transaction places it (members it
    /// holds and members being reserved alike); otherwise the footprints of the members
    /// it holds (placed or being released).
    pub fn charge_due(&self) -> Resources {
        if self.group.queue.is_empty() || self.state.is_terminal() {
            return Resources::zero();
        }
        let placing = matches!(self.state, GroupState::Placing { .. });
        let mut due = Resources::zero();
        for gang in &self.group.gangs {
            for m in &gang.members {
                if placing || self.holds(&gang.member_key(m).to_string()) {
                    due = due.saturating_add(&queue_footprint(&m.spec));
                }
            }
        }
        due
    }

    /// What a transaction placing it would add to its queue's charge: the footprints of
    /// the members it does not hold (nothing without a queue).
    pub fn charge_to_place(&self) -> Resources {
        if self.group.queue.is_empty() {
            return Resources::zero();
        }
        let mut more = Resources::zero();
        for gang in &self.group.gangs {
            for m in &gang.members {
                if !self.holds(&gang.member_key(m).to_string()) {
                    more = more.saturating_add(&queue_footprint(&m.spec));
                }
            }
        }
        more
    }

    /// Whether `member` is placed or being released (it holds a slot on its shard).
    pub fn holds(&self, member: &str) -> bool {
        self.placements.contains_key(member) || self.releasing.contains_key(member)
    }

    /// Whether the coordinator has work on it: placing, releasing, or a member release
    /// the shards have not confirmed.
    pub fn is_pending(&self) -> bool {
        match self.state {
            GroupState::Done { .. } | GroupState::Preempting { .. } => false,
            GroupState::Placed => !self.releasing.is_empty(),
            GroupState::Queued | GroupState::Placing { .. } | GroupState::Releasing { .. } => true,
        }
    }

    /// Whether the coordinator may act on it at `at_ms` (always when `None`): every
    /// group but a queued one still waiting out its backoff before its deadline.
    pub fn is_due(&self, at_ms: Option<u64>) -> bool {
        match at_ms {
            None => true,
            Some(now) => {
                self.state != GroupState::Queued
                    || self.not_before_ms <= now
                    || self.deadline_ms.is_some_and(|d| d <= now)
            }
        }
    }

    /// The priority preemption compares: the highest of its gangs' and its pods'.
    pub fn highest_priority(&self) -> i32 {
        let pods = self
            .group
            .gangs
            .iter()
            .flat_map(|g| g.members.iter().map(|m| m.spec.priority));
        pods.fold(self.priority, i32::max)
    }

    /// The state a group times out into: releasing what it accumulated, or done.
    pub fn timed_out(&self) -> GroupState {
        if self.holds_nothing() {
            GroupState::Done {
                how: Terminal::TimedOut,
            }
        } else {
            GroupState::Releasing {
                then: Terminal::TimedOut,
            }
        }
    }

    /// Whether every gang of the group is NonStrict (placed members accumulate).
    pub fn accumulates(&self) -> bool {
        self.group
            .gangs
            .iter()
            .all(|g| g.mode == GangMode::NonStrict)
    }

    /// Queue order: higher priority first, then earlier submission, then lower seq.
    pub fn order_key(&self) -> (i64, GroupSeq) {
        (-i64::from(self.priority), self.seq)
    }
}

/// The pods a group was submitted for (members that carry a uid: Kubernetes pods),
/// without their specs: what a new Kubernetes ingest leader needs to know which pods
/// are already submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmittedPods {
    /// The group.
    pub seq: GroupSeq,
    /// Its idempotency key.
    pub key: String,
    /// Whether it was cancelled (its pods may be submitted again).
    pub cancelled: bool,
    /// (namespace, name, uid) of each member with a uid.
    pub pods: Vec<(String, String, String)>,
}

impl SubmittedPods {
    /// The pods of `r`, if any of its members carries a uid.
    pub fn of(r: &GroupRecord) -> Option<Self> {
        let pods: Vec<(String, String, String)> = r
            .group
            .gangs
            .iter()
            .flat_map(|g| {
                g.members.iter().filter_map(|m| {
                    let uid = m.uid.as_ref()?;
                    Some((g.namespace.clone(), m.name.clone(), uid.clone()))
                })
            })
            .collect();
        if pods.is_empty() {
            return None;
        }
        Some(Self {
            seq: r.seq,
            key: r.key.clone(),
            cancelled: matches!(
                r.state,
                GroupState::Done {
                    how: Terminal::Cancelled
                }
            ),
            pods,
        })
    }
}
