//! What a recorded decision (COMMIT or ABORT) asks of one participant shard, and what
//! its replies say. Pure: the coordinator's release delivery sends [`decision_ops`] as
//! one entry, reads the replies through [`acknowledgement`], and logs what needs a log.

use crate::ledger::meta::Decision;
use crate::ledger::{LedgerError, LedgerOp, LedgerReply, ReleaseTarget, TxnId};

/// Ledger operations that carry `decision` for `txn` to one participant; `alone`: the
/// transaction has that one participant.
pub fn decision_ops(txn: TxnId, decision: Decision, alone: bool) -> Vec<LedgerOp> {
    match (decision, alone) {
        (Decision::Commit, _) => vec![LedgerOp::Commit { txn_id: txn }],
        // A one-shard reserve-and-commit may have committed before meta recorded ABORT
        // (a cancel, a failover, a refused second placement): then the abort is refused
        // and the release frees what the aborted transaction holds.
        (Decision::Abort, true) => vec![
            LedgerOp::Abort { txn_id: txn },
            LedgerOp::Release {
                target: ReleaseTarget::Txn(txn),
            },
        ],
        // A participant of a multi-shard transaction commits only when told COMMIT: one
        // that refuses an ABORT as committed is a protocol violation, left visible.
        (Decision::Abort, false) => vec![LedgerOp::Abort { txn_id: txn }],
    }
}

/// What a participant's replies to [`decision_ops`] say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acknowledgement {
    /// The participant applied the decision.
    Applied,
    /// A COMMIT the participant no longer knows: every participant of a COMMIT voted
    /// yes, so it knew the transaction, finished it long ago and forgot its record.
    CommittedLongAgo,
    /// An ABORT of a one-shard transaction that had committed on its own: the release
    /// freed `members` members.
    FreedCommitted {
        /// Members the release freed.
        members: usize,
    },
    /// A participant of a multi-shard transaction committed although meta decided ABORT
    /// (I3/I5 violated). Retrying cannot change it, so it counts as delivered.
    CommittedDespiteAbort,
    /// The participant refused the decision: deliver it again.
    Refused,
}

impl Acknowledgement {
    /// Whether the decision counts as delivered to this participant.
    pub fn is_delivered(&self) -> bool {
        !matches!(self, Acknowledgement::Refused)
    }
}

/// Reads a participant's replies to [`decision_ops`] for `decision`.
pub fn acknowledgement(decision: Decision, replies: &[LedgerReply]) -> Acknowledgement {
    match (decision, replies) {
        (Decision::Commit, [LedgerReply::Committed { .. }, ..]) => Acknowledgement::Applied,
        (
            Decision::Commit,
            [LedgerReply::Rejected {
                error: LedgerError::UnknownTxn { .. },
            }, ..],
        ) => Acknowledgement::CommittedLongAgo,
        (Decision::Abort, [LedgerReply::Aborted { .. }, ..]) => Acknowledgement::Applied,
        (
            Decision::Abort,
            [LedgerReply::Rejected {
                error: LedgerError::TxnCommitted { .. },
            }, LedgerReply::Released { released, .. }],
        ) => Acknowledgement::FreedCommitted {
            members: released.len(),
        },
        (
            Decision::Abort,
            [LedgerReply::Rejected {
                error: LedgerError::TxnCommitted { .. },
            }],
        ) => Acknowledgement::CommittedDespiteAbort,
        _ => Acknowledgement::Refused,
    }
}
