//! The Shards admin service: move nodes between shards, rebalance, list moves
//! (docs/ARCHITECTURE.md §3a).
//!
//! A move is recorded in meta here (which checks it and refuses it naming the field)
//! and carried out by the coordinator on the meta leader; `wait` polls meta until it
//! ends, for at most [`MOVE_WAIT_MS_MAX`]. A rebalance plans from meta's map and the
//! shards' node weights, then begins each planned move after the one before ended.
//! A grow records the higher shard count in meta; every replica's growth task then
//! opens the added shards' groups, and the call waits (at most [`GROW_WAIT_MS`]) until
//! this replica has them and each has a leader.
//! Served by every replica; called by `gangctl shards`.

use std::time::Duration;

use gangway_proto::admin::shards_server::{Shards, ShardsServer};
use gangway_proto::admin::{
    GrowShardsReply, GrowShardsRequest, ListMovesReply, ListMovesRequest, ListReservationsReply,
    ListReservationsRequest, MoveNodesReply, MoveNodesRequest, MoveSource,
    PlannedMove as ApiPlannedMove, RebalanceReply, RebalanceRequest, ShardMove as ApiShardMove,
};
use tonic::{Request, Response, Status};

use crate::replicated::growth::ShardCount;
use crate::replicated::moves;
use crate::replicated::{now_ms, Groups};
use gangway_core::ledger::meta::shard_map::SHARDS_MAX;
use gangway_core::ledger::meta::{
    MetaCommand, MetaQuery, MetaReply, MovePhase, MoveTarget, RejectionKind, ShardMove,
};
use gangway_core::plan::rebalance::RebalancePolicy;
use gangway_core::plan::rebalance::{self, PlannedMove};
use gangway_raft::META_GROUP;

/// Longest a call waits for one move to end, in ms.
pub const MOVE_WAIT_MS_MAX: u64 = 120_000;
/// Period of a waiting call's reads of meta, in ms.
pub const MOVE_POLL_MS: u64 = 50;
/// Most moves one rebalance call makes (each of at most `MOVE_NODES_MAX` nodes).
pub const REBALANCE_MOVES_MAX: usize = 256;
/// Longest a grow call waits for the added shards to be open here and led, in ms.
pub const GROW_WAIT_MS: u64 = 10_000;

/// The Shards gRPC service over one replica's groups.
pub struct ShardsService {
    groups: Groups,
    shards: ShardCount,
    policy: RebalancePolicy,
    access: crate::auth::Access,
}

impl ShardsService {
    /// A service over `groups` with `shards` shards, rebalancing by `policy`'s bound,
    /// authorizing with `access` (changes: `update cluster`; listing: `get cluster`).
    pub fn new(
        groups: Groups,
        shards: ShardCount,
        policy: RebalancePolicy,
        access: crate::auth::Access,
    ) -> ShardsServer<Self> {
        ShardsServer::new(Self {
            groups,
            shards,
            policy,
            access,
        })
    }

    /// The shard count meta records (a linearizable read).
    async fn recorded_shards(&self) -> Result<u32, Status> {
        match self
            .groups
            .meta_query(&MetaQuery::ShardSet)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::ShardSet { shards, .. } => Ok(shards),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    /// Waits up to [`GROW_WAIT_MS`] for shards `added` to be open on this replica and
    /// led; the ready ones and the others.
    async fn wait_until_led(&self, added: std::ops::RangeInclusive<u32>) -> (Vec<u32>, Vec<u32>) {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(GROW_WAIT_MS);
        loop {
            // The replica's growth task opens them (within `GROWTH_CHECK_MS`), never this
            // call: a caller that gives up must not cut an initialization short.
            let host = self.groups.host();
            let (ready, not_ready): (Vec<u32>, Vec<u32>) = added
                .clone()
                .partition(|s| *s <= self.shards.get() && host.leader_of(u64::from(*s)).is_some());
            if not_ready.is_empty() || tokio::time::Instant::now() >= deadline {
                return (ready, not_ready);
            }
            tokio::time::sleep(Duration::from_millis(MOVE_POLL_MS)).await;
        }
    }

    /// Polls meta until move `id` ended; it as it ended.
    async fn wait_for(&self, id: u64) -> Result<ShardMove, Status> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(MOVE_WAIT_MS_MAX);
        loop {
            let found = self
                .list()
                .await?
                .into_iter()
                .find(|m| m.id == id)
                .ok_or_else(|| Status::not_found(format!("move: shard move {id} is forgotten")))?;
            if !found.is_active() {
                return Ok(found);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Status::deadline_exceeded(format!(
                    "shard move {id} is still {} after {MOVE_WAIT_MS_MAX} ms; it goes on (gangctl shards moves)",
                    phase_name(found.phase)
                )));
            }
            tokio::time::sleep(Duration::from_millis(MOVE_POLL_MS)).await;
        }
    }

    async fn plan_now(&self, bound: u64) -> Result<Vec<PlannedMove>, Status> {
        let nodes = moves::weighted_nodes(&self.groups, self.shards.get())
            .await
            .map_err(unavailable)?;
        Ok(rebalance::plan(&nodes, self.shards.get(), bound))
    }

    async fn list(&self) -> Result<Vec<ShardMove>, Status> {
        match self
            .groups
            .meta_query(&MetaQuery::Moves)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::Moves { moves } => Ok(moves),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    /// Begins one move; the meta reply's refusal becomes the status naming the field.
    async fn begin(
        &self,
        target: MoveTarget,
        to: u32,
        reason: String,
    ) -> Result<(ShardMove, u64), Status> {
        self.refuse_if_legacy()?;
        let cmd = MetaCommand::BeginMove {
            target,
            to,
            reason,
            at_ms: now_ms(),
        };
        match self.groups.meta(&cmd).await.map_err(|e| e.to_status())? {
            MetaReply::MoveBegun { shard_move, left } => Ok((*shard_move, left)),
            MetaReply::Rejected { reason, kind } => Err(match kind {
                RejectionKind::Conflict => Status::failed_precondition(reason),
                _ => Status::invalid_argument(reason),
            }),
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    /// A replica writing for the first rollout of an upgrade moves nothing.
    fn refuse_if_legacy(&self) -> Result<(), Status> {
        if self.groups.legacy_writer() {
            return Err(Status::failed_precondition(
                "this replica writes the JSON format for the first rollout of an upgrade: \
                 replicas of the release before cannot read a shard move; move nodes after \
                 the second rollout (docs/ARCHITECTURE.md §3)",
            ));
        }
        Ok(())
    }
}

/// A failed read of the map or the shards' weights: a routing or quorum failure keeps
/// its own code; anything else is UNAVAILABLE (a shard that did not answer in time).
fn unavailable(e: crate::replicated::GroupError) -> Status {
    match e {
        crate::replicated::GroupError::Host(e) => e.to_status(),
        other => Status::unavailable(format!("cannot read the shards' nodes: {other}")),
    }
}

/// The meta group's voters, which the added shards are created with, when every group
/// has those same voters and none is changing them; FAILED_PRECONDITION otherwise, so
/// an added group never starts with a voter a change is removing.
fn settled_voters(
    host: &gangway_raft::RaftHost,
) -> Result<std::collections::BTreeMap<u64, String>, Status> {
    let to_status = |e: gangway_raft::HostError| e.to_status();
    let voters = host.voters_of(META_GROUP).map_err(to_status)?;
    for group in host.group_ids() {
        let changing = host.membership_changing(group).map_err(to_status)?;
        let theirs = host.voters_of(group).map_err(to_status)?;
        if changing || !theirs.keys().eq(voters.keys()) {
            return Err(Status::failed_precondition(format!(
                "shards: a membership change is under way (group {group} has voters {:?}, \
                 meta {:?}); grow once `gangctl cluster status` shows one voter set",
                theirs.keys().collect::<Vec<_>>(),
                voters.keys().collect::<Vec<_>>()
            )));
        }
    }
    Ok(voters)
}

/// The API's name of a phase.
pub fn phase_name(phase: MovePhase) -> &'static str {
    match phase {
        MovePhase::Begun => "begun",
        MovePhase::Sealed => "sealed",
        MovePhase::Committed => "committed",
        MovePhase::Done => "done",
        MovePhase::Cancelling => "cancelling",
        MovePhase::Cancelled => "cancelled",
    }
}

/// The API's move.
pub fn api_move(m: &ShardMove) -> ApiShardMove {
    ApiShardMove {
        id: m.id,
        to: m.to,
        sources: m
            .sources
            .iter()
            .map(|(shard, nodes)| MoveSource {
                shard: *shard,
                nodes: nodes.clone(),
            })
            .collect(),
        phase: phase_name(m.phase).to_string(),
        reason: m.reason.clone(),
        begun_at_ms: m.begun_at_ms,
        ended_at_ms: m.ended_at_ms,
    }
}

fn api_planned(p: &PlannedMove) -> ApiPlannedMove {
    ApiPlannedMove {
        from: p.from,
        to: p.to,
        nodes: p.nodes.clone(),
        weight: p.weight,
    }
}

#[tonic::async_trait]
impl Shards for ShardsService {
    async fn move_nodes(
        &self,
        request: Request<MoveNodesRequest>,
    ) -> Result<Response<MoveNodesReply>, Status> {
        self.access
            .begin(&request, crate::auth::access::MOVE_NODES)
            .await?;
        let req = request.into_inner();
        let target = match (req.domain.is_empty(), req.nodes.is_empty()) {
            (false, true) => MoveTarget::Domain(req.domain.clone()),
            (true, false) => MoveTarget::Nodes(req.nodes.clone()),
            _ => {
                return Err(Status::invalid_argument(
                    "domain, nodes: name exactly one of a domain and a list of nodes",
                ))
            }
        };
        // The upper bound is meta's (its count may be ahead of this replica's for a moment
        // after a grow); BeginMove refuses a shard above it, naming `to`.
        if req.to == 0 {
            return Err(Status::invalid_argument(format!(
                "to: shard 0 is not in 1..={}",
                self.shards.get()
            )));
        }
        let (mut m, left) = self
            .begin(target, req.to, "an operator's move".into())
            .await?;
        if req.wait {
            m = self.wait_for(m.id).await?;
        }
        Ok(Response::new(MoveNodesReply {
            shard_move: Some(api_move(&m)),
            left,
        }))
    }

    async fn rebalance(
        &self,
        request: Request<RebalanceRequest>,
    ) -> Result<Response<RebalanceReply>, Status> {
        self.access
            .begin(&request, crate::auth::access::REBALANCE)
            .await?;
        let req = request.into_inner();
        let bound = match u64::from(req.bound_percent) {
            0 => self.policy.bound_percent,
            b if (101..=1_000).contains(&b) => b,
            b => {
                return Err(Status::invalid_argument(format!(
                    "bound_percent: {b} is not in 101..=1000 (0: the replica's)"
                )))
            }
        };
        let status = unavailable;
        let nodes = moves::weighted_nodes(&self.groups, self.shards.get())
            .await
            .map_err(status)?;
        let before = rebalance::peak_percent(&rebalance::loads(&nodes, self.shards.get()));
        let plan = rebalance::plan(&nodes, self.shards.get(), bound);
        if req.dry_run {
            let mut after = nodes;
            for p in &plan {
                for n in after.iter_mut().filter(|n| p.nodes.contains(&n.name)) {
                    n.shard = p.to;
                }
            }
            return Ok(Response::new(RebalanceReply {
                peak_percent_before: before,
                peak_percent_after: rebalance::peak_percent(&rebalance::loads(
                    &after,
                    self.shards.get(),
                )),
                plan: plan.iter().map(api_planned).collect(),
                moves: Vec::new(),
            }));
        }
        self.refuse_if_legacy()?;
        let mut made = Vec::new();
        let mut attempts = 0usize;
        // Plan again after each move: the map (and what the shards hold) may change.
        let mut plan = plan;
        while let Some(first) = plan.first() {
            if made.len() >= REBALANCE_MOVES_MAX {
                break;
            }
            if let Some(running) = self.list().await?.into_iter().find(|m| m.is_active()) {
                self.wait_for(running.id).await?;
            }
            let reason = format!("gangctl shards rebalance (bound {bound}%)");
            let begun = self
                .begin(MoveTarget::Nodes(first.nodes.clone()), first.to, reason)
                .await;
            let m = match begun {
                Ok((m, _)) => m,
                // The coordinator began a move of its own meanwhile: wait for it, plan again.
                Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                    attempts += 1;
                    if attempts > REBALANCE_MOVES_MAX {
                        return Err(e);
                    }
                    plan = self.plan_now(bound).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let ended = self.wait_for(m.id).await?;
            if ended.phase != MovePhase::Done {
                return Err(Status::aborted(format!(
                    "shard move {} was given up: {}",
                    ended.id, ended.reason
                )));
            }
            made.push(api_move(&ended));
            plan = self.plan_now(bound).await?;
        }
        let nodes = moves::weighted_nodes(&self.groups, self.shards.get())
            .await
            .map_err(status)?;
        Ok(Response::new(RebalanceReply {
            peak_percent_before: before,
            peak_percent_after: rebalance::peak_percent(&rebalance::loads(
                &nodes,
                self.shards.get(),
            )),
            plan: Vec::new(),
            moves: made,
        }))
    }

    async fn grow_shards(
        &self,
        request: Request<GrowShardsRequest>,
    ) -> Result<Response<GrowShardsReply>, Status> {
        self.access
            .begin(&request, crate::auth::access::GROW_SHARDS)
            .await?;
        let wanted = request.into_inner().shards;
        if wanted == 0 || wanted > SHARDS_MAX {
            return Err(Status::invalid_argument(format!(
                "shards: {wanted} is not in 1..={SHARDS_MAX}"
            )));
        }
        // A replica of the release before could not read the command.
        self.refuse_if_legacy()?;
        let before = self.recorded_shards().await?;
        if wanted < before {
            return Err(Status::failed_precondition(format!(
                "shards: {wanted} is below the current count {before}; the count only grows \
                 (move a shard's nodes to others instead)"
            )));
        }
        let voters = settled_voters(self.groups.host())?;
        let cmd = MetaCommand::GrowShards {
            shards: wanted,
            voters,
        };
        let after = match self.groups.meta(&cmd).await.map_err(|e| e.to_status())? {
            MetaReply::ShardSet { shards, .. } => shards,
            MetaReply::Rejected { reason, .. } => return Err(Status::failed_precondition(reason)),
            other => return Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        };
        tracing::info!(before, after, "shard count grown");
        let (ready, not_ready) = self.wait_until_led(before + 1..=after).await;
        Ok(Response::new(GrowShardsReply {
            shards_before: before,
            shards: after,
            ready,
            not_ready,
        }))
    }

    async fn list_reservations(
        &self,
        request: Request<ListReservationsRequest>,
    ) -> Result<Response<ListReservationsReply>, Status> {
        self.access
            .begin(&request, crate::auth::access::LIST_RESERVATIONS)
            .await?;
        let query = MetaQuery::HeadReservations {
            at_ms: crate::replicated::now_ms(),
        };
        match self
            .groups
            .meta_query(&query)
            .await
            .map_err(|e| e.to_status())?
        {
            MetaReply::HeadReservations { reservations } => {
                Ok(Response::new(ListReservationsReply {
                    reservations: reservations.iter().map(api_reservation).collect(),
                }))
            }
            other => Err(Status::internal(format!("unexpected meta reply {other:?}"))),
        }
    }

    async fn list_moves(
        &self,
        request: Request<ListMovesRequest>,
    ) -> Result<Response<ListMovesReply>, Status> {
        self.access
            .begin(&request, crate::auth::access::LIST_MOVES)
            .await?;
        Ok(Response::new(ListMovesReply {
            moves: self.list().await?.iter().map(api_move).collect(),
        }))
    }
}

/// A reservation as the admin API shows it.
fn api_reservation(
    r: &gangway_core::ledger::meta::HeadReservation,
) -> gangway_proto::admin::HeadReservation {
    gangway_proto::admin::HeadReservation {
        group: r.seq,
        priority: r.priority,
        nodes: r
            .nodes
            .iter()
            .map(|(shard, nodes)| MoveSource {
                shard: *shard,
                nodes: nodes.clone(),
            })
            .collect(),
        starts_by_ms: r.starts_by_ms.unwrap_or(0),
        made_at_ms: r.made_at_ms,
        expires_at_ms: r.expires_at_ms,
    }
}
