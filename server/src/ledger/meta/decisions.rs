//! The 2PC decision log: one record per transaction, written by the
//! coordinator before it tells any participant, or by a participant's
//! `AbortIfUndecided` (a tombstone) when its reservation outlived its
//! deadline. Invariant: a decision, once written, never changes, so a late
//! COMMIT cannot land after an ABORT tombstone.

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
}
