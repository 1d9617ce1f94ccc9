//! Giving capacity back and delivering decisions, shared by the coordinator, the
//! front door (ReleaseMembers), the kube adapter and the resolvers.
//!
//! Rules (docs/ARCHITECTURE.md, "Two-phase rules"): a member leaves a group through
//! meta first (`ReleaseMembers` moves it to `releasing`), then its shard commits the
//! transaction that placed it (a participant whose leader died as COMMIT was sent
//! still holds it reserved) and frees it, then `MembersReleased` confirms. A decision
//! reaches a participant as one batched entry (COMMIT; or ABORT followed by a release
//! of whatever that transaction still holds there, for a one-shard path that committed
//! on its own) and is acknowledged in meta with `Delivered` once applied, so it is
//! never forgotten while a participant may still ask. Every step is idempotent: a
//! retry after any crash converges.

use std::collections::{BTreeMap, BTreeSet};

use crate::replicated::{now_ms, GroupError, Groups, ShardOutcome};
use gangway_core::ledger::command::LEDGER_BATCH_MAX;
use gangway_core::ledger::meta::{
    Decision, GroupSeq, MemberPlacements, MetaCommand, MetaReply, Undelivered, META_BATCH_MAX,
};
use gangway_core::ledger::{LedgerOp, LedgerReply, ReleaseTarget, TxnId};
use gangway_core::model::MemberKey;
use gangway_core::plan::decision::{acknowledgement, decision_ops, Acknowledgement};

/// Whether a participant's replies to [`decision_ops`] show it applied the decision,
/// logging the replies that need an operator's eye.
fn applied(txn: TxnId, decision: Decision, replies: &[LedgerReply]) -> bool {
    let ack = acknowledgement(decision, replies);
    match &ack {
        Acknowledgement::Applied => {}
        Acknowledgement::CommittedLongAgo => {
            tracing::warn!(%txn, "a participant no longer knows a committed transaction; taking it as applied");
        }
        Acknowledgement::FreedCommitted { members } => {
            if *members > 0 {
                tracing::info!(%txn, members, "freed what a participant committed under a transaction meta aborted");
            }
        }
        Acknowledgement::CommittedDespiteAbort => {
            // Retrying cannot change it; acknowledged so the log is not flooded.
            tracing::error!(%txn, "a participant of a multi-shard transaction committed although meta decided ABORT (I3/I5 violated)");
        }
        Acknowledgement::Refused => {
            tracing::error!(%txn, ?decision, ?replies, "a participant refused a recorded decision");
        }
    }
    ack.is_delivered()
}

/// Delivers each decision to its listed participants, one batched entry per shard (at
/// most [`LEDGER_BATCH_MAX`] operations each, concurrently over shards); returns the
/// (transaction, shard) pairs that applied it. A shard that cannot be reached is left
/// out: the caller records what was delivered and retries the rest.
pub async fn deliver(groups: &Groups, decisions: &[Undelivered]) -> Vec<(TxnId, u32)> {
    let mut per_shard: BTreeMap<u32, Vec<&Undelivered>> = BTreeMap::new();
    for d in decisions {
        for shard in &d.shards {
            per_shard.entry(*shard).or_default().push(d);
        }
    }
    let writes = per_shard.into_iter().map(|(shard, list)| async move {
        let mut acked = Vec::new();
        for chunk in list.chunks(LEDGER_BATCH_MAX / 2) {
            let per_decision: Vec<Vec<LedgerOp>> = chunk
                .iter()
                .map(|d| decision_ops(d.txn, d.decision, d.alone))
                .collect();
            let counts: Vec<usize> = per_decision.iter().map(Vec::len).collect();
            let ops: Vec<LedgerOp> = per_decision.into_iter().flatten().collect();
            let replies = match groups.shard(shard, LedgerOp::Batch { ops }).await {
                Ok(ShardOutcome::Applied(LedgerReply::Batch { replies })) => replies,
                Ok(other) => {
                    tracing::warn!(shard, ?other, "a decision batch was not applied");
                    break;
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "participant not told; it will ask at its deadline, and the decision is delivered again");
                    break;
                }
            };
            let mut replies = replies.as_slice();
            for (d, n) in chunk.iter().zip(counts) {
                let (mine, rest) = replies.split_at(n.min(replies.len()));
                replies = rest;
                if applied(d.txn, d.decision, mine) {
                    acked.push((d.txn, shard));
                }
            }
        }
        acked
    });
    futures::future::join_all(writes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Records in meta which participants applied which decisions (batched).
pub async fn record_delivered(groups: &Groups, acked: &[(TxnId, u32)]) -> Result<(), GroupError> {
    let mut per_txn: BTreeMap<TxnId, Vec<u32>> = BTreeMap::new();
    for (txn, shard) in acked {
        per_txn.entry(*txn).or_default().push(*shard);
    }
    let commands: Vec<MetaCommand> = per_txn
        .into_iter()
        .map(|(txn, shards)| MetaCommand::Delivered { txn, shards })
        .collect();
    for chunk in commands.chunks(META_BATCH_MAX) {
        groups
            .meta(&MetaCommand::Batch {
                commands: chunk.to_vec(),
            })
            .await?;
    }
    Ok(())
}

/// Delivers `decision` of `txn` to `shards` and records who applied it; returns whether
/// every one did. `alone`: the transaction has a single participant.
pub async fn tell(
    groups: &Groups,
    txn: TxnId,
    decision: Decision,
    shards: &[u32],
    alone: bool,
) -> bool {
    let one = [Undelivered {
        txn,
        decision,
        shards: shards.to_vec(),
        alone,
    }];
    let acked = deliver(groups, &one).await;
    if let Err(e) = record_delivered(groups, &acked).await {
        tracing::warn!(%txn, error = %e, "acknowledgements not recorded; the decision is delivered again");
    }
    acked.len() == shards.len()
}

/// Frees held members on their shards: per shard, one entry commits every transaction
/// that placed them (a no-op where already committed) and releases them.
pub async fn free_members(groups: &Groups, held: &MemberPlacements) -> Result<(), GroupError> {
    let mut per_shard: BTreeMap<u32, (BTreeSet<TxnId>, Vec<MemberKey>)> = BTreeMap::new();
    for (key, p) in held {
        let Ok(member) = MemberKey::try_from(key.clone()) else {
            tracing::error!(
                member = key,
                "a placed member key does not parse; left held"
            );
            continue;
        };
        for shard in std::iter::once(p.shard).chain(p.network_shards.iter().copied()) {
            let entry = per_shard.entry(shard).or_default();
            entry.0.extend(p.txn);
            entry.1.push(member.clone());
        }
    }
    for (shard, (txns, members)) in per_shard {
        for chunk in members.chunks(LEDGER_BATCH_MAX / 2) {
            let mut ops: Vec<LedgerOp> = txns
                .iter()
                .take(LEDGER_BATCH_MAX / 2)
                .map(|t| LedgerOp::Commit { txn_id: *t })
                .collect();
            ops.push(LedgerOp::Release {
                target: ReleaseTarget::Members(chunk.to_vec()),
            });
            let outcome = groups.shard(shard, LedgerOp::Batch { ops }).await?;
            let ShardOutcome::Applied(LedgerReply::Batch { replies }) = outcome else {
                return Err(GroupError::StepRefused {
                    shard,
                    reason: format!("a release was answered {outcome:?}"),
                });
            };
            match replies.last() {
                Some(LedgerReply::Released { .. }) => {}
                other => {
                    return Err(GroupError::StepRefused {
                        shard,
                        reason: format!("refused to release members: {other:?}"),
                    })
                }
            }
        }
    }
    Ok(())
}

/// Releases placed members of group `seq` (ReleaseMembers and the kube adapter when
/// pods go away): meta first, then the shards, then the confirmation. A refusal by
/// meta changes nothing anywhere and is returned as the reply.
pub async fn release_members(
    groups: &Groups,
    seq: GroupSeq,
    names: Vec<String>,
) -> Result<MetaReply, GroupError> {
    let first = MetaCommand::ReleaseMembers {
        seq,
        members: names.clone(),
        at_ms: now_ms(),
    };
    let reply = groups.meta(&first).await?;
    let MetaReply::Group { group } = &reply else {
        return Ok(reply);
    };
    let held: MemberPlacements = names
        .iter()
        .filter_map(|n| group.releasing.get(n).map(|p| (n.clone(), p.clone())))
        .collect();
    free_members(groups, &held).await?;
    let confirm = MetaCommand::MembersReleased {
        seq,
        members: names,
        at_ms: now_ms(),
    };
    groups.meta(&confirm).await
}
