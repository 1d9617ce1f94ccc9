//! Driving shard moves (docs/ARCHITECTURE.md §3a): the shards' side of a move that meta
//! records, as far as it can go per call, and rebalancing that begins moves.
//!
//! A move goes: meta `BeginMove` → every source fences the nodes → meta `SealMove`
//! (refused, and tried again next round, while a transaction on a source or the target
//! is in flight) → every source hands its nodes off (refused while one of their
//! reservations is open) → the target adopts each parcel → meta `CommitMove` (map and
//! placements name the target) → every source drops its parcel → meta `EndMove`. Every
//! step is idempotent, so a coordinator that takes over after a failover resumes from
//! meta's phase. Before its seal a move may be given up (`CancelMove`; it stays
//! `Cancelling` until every source lifted the fence); after it, only forward. Called by
//! the coordinator's rounds and by the admin service's move and rebalance calls.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::future::join_all;

use crate::failpoints::{self, Failpoints};
use crate::replicated::{now_ms, GroupError, Groups, ShardOutcome};
use gangway_core::ledger::command::Parcel;
use gangway_core::ledger::meta::{
    MetaCommand, MetaQuery, MetaReply, MovePhase, MoveTarget, ShardMove,
};
use gangway_core::ledger::{LedgerError, LedgerOp, LedgerReply};
use gangway_core::plan::rebalance::{self, PlannedMove, WeightedNode};
use gangway_core::query::{ShardAnswer, ShardQuery};

/// Longest a rebalance read of one shard's node weights waits, in ms.
pub const WEIGHTS_READ_TIMEOUT_MS: u64 = 2_000;

/// How far one call took a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveProgress {
    /// It waits for something in flight (a transaction, a reservation); next round.
    Waiting(String),
    /// It is done or was given up.
    Ended(MovePhase),
}

/// The running move, if any: a local read of meta, or a linearizable one (a new leader's
/// first round, whose applied state may lag what its predecessor wrote).
pub async fn running(groups: &Groups, linearizable: bool) -> Result<Option<ShardMove>, GroupError> {
    let reply = if linearizable {
        groups.meta_query(&MetaQuery::Moves).await?
    } else {
        groups.meta_query_local(&MetaQuery::Moves)?
    };
    match reply {
        MetaReply::Moves { moves } => Ok(moves.into_iter().find(|m| m.is_active())),
        _ => Ok(None),
    }
}

/// The nodes of a sealed move (a local read): a group releasing placements there waits
/// until the move committed and its placements name the target.
pub fn sealed_nodes(groups: &Groups) -> Result<BTreeSet<String>, GroupError> {
    match groups.meta_query_local(&MetaQuery::Moves)? {
        MetaReply::Moves { moves } => Ok(moves
            .iter()
            .filter(|m| m.phase == MovePhase::Sealed)
            .flat_map(|m| m.nodes().cloned())
            .collect()),
        _ => Ok(BTreeSet::new()),
    }
}

/// Takes move `m` as far as it can go now.
pub async fn advance(
    groups: &Groups,
    failpoints: &Failpoints,
    m: &ShardMove,
) -> Result<MoveProgress, GroupError> {
    let mut phase = m.phase;
    loop {
        phase = match phase {
            MovePhase::Begun => {
                if let Some(why) = seal_blocker(groups, m.id)? {
                    return Ok(MoveProgress::Waiting(why));
                }
                if let Some(why) = fence(groups, m).await? {
                    cancel(groups, m, &why).await?;
                    let cancelling = ShardMove {
                        phase: MovePhase::Cancelling,
                        reason: why,
                        ..m.clone()
                    };
                    return Box::pin(advance(groups, failpoints, &cancelling)).await;
                }
                match meta_step(groups, MetaCommand::SealMove { id: m.id }).await? {
                    Ok(_) => MovePhase::Sealed,
                    Err(why) => return Ok(MoveProgress::Waiting(why)),
                }
            }
            MovePhase::Sealed => {
                let parcels = match hand_off(groups, m).await? {
                    Ok(parcels) => parcels,
                    Err(why) => return Ok(MoveProgress::Waiting(why)),
                };
                failpoints.hit(failpoints::MOVE_AFTER_HANDOFF);
                if let Err(e) = adopt(groups, m, parcels).await {
                    // Retried every round; a refusal here needs an operator (the nodes are in
                    // their sources' parcels, safe, but no shard schedules them).
                    tracing::error!(shard_move = m.id, to = m.to, error = %e, "the target refused a shard move's parcel");
                    return Err(e);
                }
                if let Err(why) = meta_step(groups, MetaCommand::CommitMove { id: m.id }).await? {
                    return Err(refused(m.to, why));
                }
                MovePhase::Committed
            }
            MovePhase::Committed => {
                end(groups, m, LedgerOp::DropParcel { move_id: m.id }).await?;
                tracing::info!(
                    shard_move = m.id,
                    to = m.to,
                    nodes = m.nodes().count(),
                    "shard move done"
                );
                return Ok(MoveProgress::Ended(MovePhase::Done));
            }
            MovePhase::Cancelling => {
                end(groups, m, LedgerOp::UnfenceNodes { move_id: m.id }).await?;
                tracing::warn!(shard_move = m.id, why = m.reason, "shard move given up");
                return Ok(MoveProgress::Ended(MovePhase::Cancelled));
            }
            MovePhase::Done | MovePhase::Cancelled => return Ok(MoveProgress::Ended(phase)),
        };
    }
}

/// A move's last step: `last` on every source (dropping its parcel, or lifting its
/// fence), then `EndMove` in meta.
async fn end(groups: &Groups, m: &ShardMove, last: LedgerOp) -> Result<(), GroupError> {
    for source in m.sources.keys() {
        expect_applied(groups, *source, last.clone()).await?;
    }
    let end = MetaCommand::EndMove {
        id: m.id,
        at_ms: now_ms(),
    };
    match meta_step(groups, end).await? {
        Ok(_) => Ok(()),
        Err(why) => Err(refused(0, why)),
    }
}

/// Why meta would refuse to seal move `id` now (a local read), if it would.
fn seal_blocker(groups: &Groups, id: u64) -> Result<Option<String>, GroupError> {
    match groups.meta_query_local(&MetaQuery::SealBlocker { id })? {
        MetaReply::SealBlocker { reason } => Ok(reason),
        other => Err(refused(0, format!("unexpected meta reply {other:?}"))),
    }
}

/// Fences the nodes on every source; why the move must be given up, if it must.
async fn fence(groups: &Groups, m: &ShardMove) -> Result<Option<String>, GroupError> {
    for (source, nodes) in &m.sources {
        let op = LedgerOp::FenceNodes {
            move_id: m.id,
            nodes: nodes.clone(),
        };
        match groups.shard(*source, op).await? {
            ShardOutcome::Applied(LedgerReply::Fenced { .. }) => {}
            ShardOutcome::Applied(LedgerReply::Rejected { error }) => {
                return Ok(Some(format!("shard {source} refused the fence: {error}")))
            }
            other => return Err(unexpected(*source, &other)),
        }
    }
    Ok(None)
}

/// Gives the move up: meta first (so no coordinator seals it after); the fences go in
/// the `Cancelling` phase, retried until every source lifted them.
async fn cancel(groups: &Groups, m: &ShardMove, why: &str) -> Result<(), GroupError> {
    let cmd = MetaCommand::CancelMove {
        id: m.id,
        reason: why.to_string(),
        at_ms: now_ms(),
    };
    match meta_step(groups, cmd).await? {
        Ok(_) => Ok(()),
        Err(reason) => Err(refused(0, reason)),
    }
}

/// Every source's parcel, or why one cannot hand off yet.
async fn hand_off(
    groups: &Groups,
    m: &ShardMove,
) -> Result<Result<Vec<Parcel>, String>, GroupError> {
    let mut parcels = Vec::new();
    for source in m.sources.keys() {
        let op = LedgerOp::HandOff {
            move_id: m.id,
            to: m.to,
        };
        match groups.shard(*source, op).await? {
            ShardOutcome::Applied(LedgerReply::HandedOff { parcel }) => parcels.push(parcel),
            ShardOutcome::Applied(LedgerReply::Rejected {
                error: error @ LedgerError::NodesBusy { .. },
            }) => return Ok(Err(error.to_string())),
            other => return Err(unexpected(*source, &other)),
        }
    }
    Ok(Ok(parcels))
}

async fn adopt(groups: &Groups, m: &ShardMove, parcels: Vec<Parcel>) -> Result<(), GroupError> {
    for parcel in parcels {
        expect_applied(groups, m.to, LedgerOp::Adopt { parcel }).await?;
    }
    Ok(())
}

/// Applies `op` on `shard`; a refusal is an error (the step is retried next round).
async fn expect_applied(groups: &Groups, shard: u32, op: LedgerOp) -> Result<(), GroupError> {
    match groups.shard(shard, op).await? {
        ShardOutcome::Applied(LedgerReply::Rejected { error }) => {
            Err(refused(shard, error.to_string()))
        }
        ShardOutcome::Applied(_) => Ok(()),
        other => Err(unexpected(shard, &other)),
    }
}

/// Writes a move step to meta: its reply, or why meta refused it.
async fn meta_step(
    groups: &Groups,
    cmd: MetaCommand,
) -> Result<Result<MetaReply, String>, GroupError> {
    match groups.meta(&cmd).await? {
        MetaReply::Rejected { reason, .. } => Ok(Err(reason)),
        reply => Ok(Ok(reply)),
    }
}

fn refused(shard: u32, reason: String) -> GroupError {
    GroupError::StepRefused { shard, reason }
}

fn unexpected(shard: u32, outcome: &ShardOutcome) -> GroupError {
    refused(
        shard,
        format!("unexpected reply to a move step: {outcome:?}"),
    )
}

/// Every node with its shard, domain and weight: meta's map (read linearizably) and
/// each shard's weights. A node a shard no longer lists (removed) is left out.
pub async fn weighted_nodes(groups: &Groups, shards: u32) -> Result<Vec<WeightedNode>, GroupError> {
    let mapped = match groups.meta_query(&MetaQuery::MappedNodes).await? {
        MetaReply::MappedNodes { nodes } => nodes,
        other => return Err(refused(0, format!("unexpected meta reply {other:?}"))),
    };
    let reads = (1..=shards).map(|shard| async move {
        let read = groups.shard_query(shard, &ShardQuery::NodeWeights);
        match tokio::time::timeout(Duration::from_millis(WEIGHTS_READ_TIMEOUT_MS), read).await {
            Ok(Ok(ShardAnswer::NodeWeights { weights })) => Ok(weights),
            Ok(Ok(other)) => Err(refused(shard, format!("unexpected answer {other:?}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(refused(shard, "no answer to the node weights read".into())),
        }
    });
    let mut weights = std::collections::BTreeMap::new();
    for read in join_all(reads).await {
        weights.extend(read?);
    }
    Ok(mapped
        .into_iter()
        .filter_map(|n| {
            let weight = *weights.get(&n.name)?;
            Some(WeightedNode {
                name: n.name,
                shard: n.shard,
                domain: n.domain,
                weight,
            })
        })
        .collect())
}

/// Plans a rebalance now: the moves, and the peak over the mean in percent before them.
pub async fn plan_rebalance(
    groups: &Groups,
    shards: u32,
    bound_percent: u64,
) -> Result<(Vec<PlannedMove>, u64), GroupError> {
    let nodes = weighted_nodes(groups, shards).await?;
    let peak = rebalance::peak_percent(&rebalance::loads(&nodes, shards));
    Ok((rebalance::plan(&nodes, shards, bound_percent), peak))
}

/// Begins the first move of a rebalance plan; the move begun, if any.
pub async fn begin_planned(
    groups: &Groups,
    planned: &PlannedMove,
    reason: String,
) -> Result<Result<ShardMove, String>, GroupError> {
    let cmd = MetaCommand::BeginMove {
        target: MoveTarget::Nodes(planned.nodes.clone()),
        to: planned.to,
        reason,
        at_ms: now_ms(),
    };
    match meta_step(groups, cmd).await? {
        Ok(MetaReply::MoveBegun { shard_move, .. }) => Ok(Ok(*shard_move)),
        Ok(other) => Err(refused(0, format!("unexpected meta reply {other:?}"))),
        Err(why) => Ok(Err(why)),
    }
}
