//! The participant side of 2PC: on every shard this replica leads, a
//! reservation that outlived its deadline is resolved by asking the decision
//! log: COMMIT commits it, ABORT releases it, and no record makes the meta
//! group write an ABORT tombstone first (so a late COMMIT cannot land), then
//! releases. Nothing is dropped without a recorded decision.
//! It also proposes the ledger's `Tick` every [`LEDGER_TICK_MS`], which lapses node
//! leases and ends disconnected device agents' grace periods (the ledger reads no
//! clock, so time reaches it only through commands).
//! One task per replica, owned by the `Replica`.

use std::time::Duration;

use tokio::sync::watch;

use crate::replicated::growth::ShardCount;
use crate::replicated::release;
use crate::replicated::{now_ms, GroupError, Groups, ShardOutcome};
use gangway_core::ledger::meta::{Decision, MetaCommand, MetaQuery, MetaReply, Undelivered};
use gangway_core::ledger::{LedgerOp, LedgerReply, TxnId};
use gangway_core::query::{ShardAnswer, ShardQuery};

/// Period of the resolver's checks.
pub const RESOLVE_TICK_MS: u64 = 250;
/// Period of the ledger ticks on the shards this replica leads.
pub const LEDGER_TICK_MS: u64 = 1_000;
/// Most reservations resolved per shard per check.
pub const RESOLVE_PER_TICK_MAX: usize = 256;

/// Resolves expired reservations on the shards this replica leads until `stop` fires.
pub async fn run(groups: Groups, shards: ShardCount, mut stop: watch::Receiver<bool>) {
    let checks_per_tick = LEDGER_TICK_MS.div_ceil(RESOLVE_TICK_MS).max(1);
    let mut check: u64 = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(RESOLVE_TICK_MS)) => {}
            _ = stop.changed() => return,
        }
        check += 1;
        let me = groups.host().node_id();
        for shard in shards.ids() {
            if groups.host().leader_of(u64::from(shard)) != Some(me) {
                continue;
            }
            if check.is_multiple_of(checks_per_tick) {
                if let Err(e) = tick_shard(&groups, shard).await {
                    tracing::warn!(shard, error = %e, "ledger tick failed");
                }
            }
            if let Err(e) = resolve_shard(&groups, shard).await {
                tracing::warn!(shard, error = %e, "resolving expired reservations failed");
            }
        }
    }
}

/// Proposes one `Tick` and reports what it changed.
async fn tick_shard(groups: &Groups, shard: u32) -> Result<(), GroupError> {
    if let ShardOutcome::Applied(LedgerReply::Expired {
        evictions, lapsed, ..
    }) = groups.shard(shard, LedgerOp::Tick).await?
    {
        for node in lapsed {
            tracing::warn!(shard, node, "node lease lapsed; the node is not ready");
        }
        for e in evictions {
            tracing::warn!(shard, member = %e.member, node = e.node, device = ?e.device, cause = ?e.cause,
                "a pod holds a device that turned unhealthy");
        }
    }
    Ok(())
}

async fn resolve_shard(groups: &Groups, shard: u32) -> Result<(), GroupError> {
    let ShardAnswer::OpenTxns { txns } = groups.shard_query_local(shard, &ShardQuery::OpenTxns)?
    else {
        return Ok(());
    };
    let now = now_ms();
    let expired = txns
        .into_iter()
        .filter(|(_, deadline)| *deadline <= now)
        .take(RESOLVE_PER_TICK_MAX);
    let mut decided = Vec::new();
    for (txn, _) in expired {
        let decision = decision_of(groups, txn, shard).await?;
        tracing::info!(shard, %txn, ?decision, "resolved an expired reservation");
        decided.push(Undelivered {
            txn,
            decision,
            shards: vec![shard],
            // An open reservation is a multi-shard one: it never committed on its own.
            alone: false,
        });
    }
    if decided.is_empty() {
        return Ok(());
    }
    // Applied here, acknowledged in meta: the decisions may be forgotten once every
    // participant has them.
    let acked = release::deliver(groups, &decided).await;
    release::record_delivered(groups, &acked).await
}

/// The recorded decision, or an ABORT tombstone written now.
async fn decision_of(groups: &Groups, txn: TxnId, shard: u32) -> Result<Decision, GroupError> {
    if let MetaReply::Txn { record: Some(t) } = groups.meta_query(&MetaQuery::Txn { txn }).await? {
        if let Some(d) = t.decision {
            return Ok(d);
        }
    }
    match groups
        .meta(&MetaCommand::AbortIfUndecided {
            txn,
            at_ms: now_ms(),
            shard: Some(shard),
        })
        .await?
    {
        MetaReply::Decided { decision, .. } => Ok(decision),
        _ => Ok(Decision::Abort),
    }
}
