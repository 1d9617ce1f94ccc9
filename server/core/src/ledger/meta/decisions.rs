//! The 2PC decision log: one record per transaction, written by the
//! coordinator before it tells any participant, or by a participant's
//! `AbortIfUndecided` (a tombstone) when its reservation outlived its
//! deadline. Invariants: a decision, once written, never changes, so a late
//! COMMIT cannot land after an ABORT tombstone; a decided record is kept until
//! every participant has acknowledged applying it (`unacked` empty), so a
//! participant that asks late never finds "no record" for a decided transaction.

use serde::{Deserialize, Serialize};

use crate::ledger::TxnId;

use super::groups::GroupSeq;

/// The outcome of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Every participant reserved: commit everywhere.
    Commit,
    /// Release everywhere.
    Abort,
}

/// One transaction of the decision log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRecord {
    /// The transaction.
    pub txn: TxnId,
    /// The group it places (None for a tombstone of an unknown transaction).
    pub group: Option<GroupSeq>,
    /// Shards that hold (or may hold) a reservation for it.
    pub participants: Vec<u32>,
    /// The decision, once made.
    pub decision: Option<Decision>,
    /// When it began (leader's clock).
    pub began_at_ms: u64,
    /// Participants that have not acknowledged applying the decision (empty while
    /// undecided, and once every participant has it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unacked: Vec<u32>,
    /// The groups a preemption transaction displaces (empty for a plain placement):
    /// `Preempting` until the decision, then `Preempted` (COMMIT) or `Placed` (ABORT).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub victims: Vec<GroupSeq>,
}

/// A decided transaction some participant has not acknowledged yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undelivered {
    /// The transaction.
    pub txn: TxnId,
    /// Its decision.
    pub decision: Decision,
    /// Participants still to be told.
    pub shards: Vec<u32>,
    /// Whether it has one participant: a one-shard reserve-and-commit may have
    /// committed there on its own, so an ABORT must also free what it holds.
    #[serde(default)]
    pub alone: bool,
}
