//! Placing many groups in one round: one batched plan, one batched reservation per
//! shard, one batched decision in meta. Part of [`Coordinator`]'s `impl`.

use super::*;

impl Coordinator {
    /// Places, in one pass, every ready group that one shard can hold whole.
    /// Shards are asked in turn (starting at a shard that rotates per round):
    /// each plans only the groups no earlier shard could hold, in one query
    /// (the engine accounts the capacity each takes), so a group that fits
    /// the first shard costs one plan, not one per shard. Then all chosen
    /// groups commit concurrently (their Raft writes batch). Groups past the
    /// batch's member budget wait for the next round's batch, if this one began a
    /// transaction (placed one at a time, each costs a plan and three writes: a burst
    /// of 512-member gangs reached 16k pods/s instead of 25k). The rest of the ready
    /// groups take the one-at-a-time path, which can split a group over shards: those
    /// larger than the budget and those holding members already go this round, ahead
    /// of deferred ones.
    pub(super) async fn place_batch(&self, ready: &[&GroupRecord]) -> BatchOutcome {
        let mut batch: Vec<(&GroupRecord, Vec<(MemberKey, PodSpec)>)> = Vec::new();
        let mut deferred = BTreeSet::new();
        let mut total = 0usize;
        for r in ready.iter().filter(|r| r.placements.is_empty()) {
            let members = Self::members(r);
            // Too large for any batch, or holding a reservation (planned on its own
            // nodes, which a batch leaves out): one at a time.
            if members.len() > BATCH_MEMBERS_MAX || self.head_of_line.of(r.seq).is_some() {
                continue;
            }
            // Order is kept: once one waits, every later one waits too.
            if !deferred.is_empty() || total + members.len() > BATCH_MEMBERS_MAX {
                deferred.insert(r.seq);
                continue;
            }
            total += members.len();
            batch.push((r, members));
        }
        if batch.is_empty() {
            return BatchOutcome {
                handled: BTreeSet::new(),
                deferred,
                parked: BTreeSet::new(),
            };
        }
        // Taken before the plans: a change while they are made wakes what is parked.
        let counts = self.parking.counts();
        let mut misses: BTreeMap<u32, Vec<Unplaced>> = BTreeMap::new();
        let mut assigned: BTreeSet<MemberKey> = BTreeSet::new();
        let mut chosen = Vec::new();
        let mut left: Vec<&(&GroupRecord, Vec<(MemberKey, PodSpec)>)> = batch.iter().collect();
        // One count for the whole pass: a shard added meanwhile joins the next round.
        let shard_count = self.shards.get();
        let start = self.rounds.fetch_add(1, Ordering::Relaxed) % shard_count;
        let kept = self.head_of_line.batch_kept();
        for k in 0..shard_count {
            if left.is_empty() {
                break;
            }
            let shard = 1 + (start + k) % shard_count;
            let members: Vec<(MemberKey, PodSpec)> =
                left.iter().flat_map(|(_, m)| m.iter().cloned()).collect();
            let timer = PhaseTimer::start(Phase::Quote);
            let topologies = listed_topologies(left.iter().flat_map(|(r, _)| &r.group.gangs));
            let shard_kept = kept.get(&shard).cloned().unwrap_or_default();
            let Some(mut plan) = self.plan(shard, &members, &topologies, shard_kept).await else {
                continue;
            };
            drop(timer);
            misses.insert(shard, std::mem::take(&mut plan.unplaced));
            assigned.extend(plan.assignments.iter().map(|a| a.member.clone()));
            let placed: BTreeMap<MemberKey, ReserveMember> = plan
                .assignments
                .into_iter()
                .map(|a| (a.member.clone(), a))
                .collect();
            let holds: BTreeMap<MemberKey, NetworkHold> = plan
                .network
                .into_iter()
                .map(|h| (h.member.clone(), h))
                .collect();
            let shards = self.shards.get();
            left.retain(|(r, members)| {
                let mine: Option<Vec<ReserveMember>> = members
                    .iter()
                    .map(|(k, _)| placed.get(k).cloned())
                    .collect();
                let network: Vec<NetworkHold> = members
                    .iter()
                    .filter_map(|(k, _)| holds.get(k).cloned())
                    .collect();
                match mine {
                    // Network-attached devices are held on every shard: such a group
                    // is placed on its own, as a multi-shard transaction (no other shard
                    // plans it here).
                    Some(_) if !network.is_empty() && shards > 1 => false,
                    Some(mut m) => {
                        assign::stamp_uids(&r.group, m.iter_mut());
                        let a = Assignment {
                            per_shard: BTreeMap::from([(shard, m)]),
                            network,
                        };
                        chosen.push((*r, shard, a));
                        false
                    }
                    None => true,
                }
            });
        }
        let begun = match self.commit_batch(&chosen).await {
            Ok(begun) => begun,
            Err(e) => {
                tracing::warn!(error = %e, "batched placement interrupted; recovering next round");
                0
            }
        };
        // Waiting is only worth it behind a batch that moved: a batch that began
        // nothing (groups meta refused, or none fit one shard) would stand in front
        // of the deferred ones again next round.
        if begun == 0 {
            deferred.clear();
        }
        // With no node reserved, every shard planned the groups left on its whole view.
        let parked = match kept.values().all(Vec::is_empty) {
            true => {
                let failed: Vec<(&GroupRecord, &[(MemberKey, PodSpec)])> =
                    left.iter().map(|(r, m)| (*r, m.as_slice())).collect();
                self.park_from_batch(&failed, &misses, &assigned, &counts)
                    .await
            }
            false => BTreeSet::new(),
        };
        BatchOutcome {
            handled: chosen.iter().map(|(r, _, _)| r.seq).collect(),
            deferred,
            parked,
        }
    }

    /// Places groups that each fit one shard with three batched writes in all: one meta
    /// entry begins every transaction, one entry per shard reserves and commits its
    /// groups, one meta entry records every decision. Each operation in a batch is
    /// applied as if alone, so the protocol is the one-shard path's; a write that fails
    /// leaves its groups Placing, and the next round recovers them. Returns how many
    /// transactions meta began.
    pub(super) async fn commit_batch(
        &self,
        chosen: &[(&GroupRecord, u32, Assignment)],
    ) -> Result<usize, GroupError> {
        if chosen.is_empty() {
            return Ok(0);
        }
        let at_ms = now_ms();
        let begins = chosen
            .iter()
            .map(|(r, shard, _)| MetaCommand::BeginTxn {
                seq: r.seq,
                participants: vec![*shard],
                at_ms,
            })
            .collect();
        let timer = PhaseTimer::start(Phase::Begin);
        let begun = self.meta_batch(begins).await?;
        drop(timer);
        let mut per_shard: BTreeMap<u32, Vec<(TxnId, &Assignment)>> = BTreeMap::new();
        let mut began = 0;
        for ((_, shard, assignment), reply) in chosen.iter().zip(begun) {
            if let MetaReply::TxnBegun { txn } = reply {
                per_shard.entry(*shard).or_default().push((txn, assignment));
                began += 1;
            }
        }
        let timer = PhaseTimer::start(Phase::Reserve);
        let writes = per_shard.iter().map(|(shard, txns)| async move {
            let ops = txns
                .iter()
                .map(|(txn, a)| LedgerOp::ReserveAndCommit {
                    txn_id: *txn,
                    members: a.per_shard.get(shard).cloned().unwrap_or_default(),
                    network: a.network.clone(),
                })
                .collect();
            (
                *shard,
                self.groups.shard(*shard, LedgerOp::Batch { ops }).await,
            )
        });
        let outcomes = join_all(writes).await;
        drop(timer);
        let mut decides = Vec::new();
        let mut counts = Vec::new();
        for (shard, outcome) in outcomes {
            let txns = per_shard.get(&shard).map(Vec::as_slice).unwrap_or_default();
            let replies = match outcome {
                Ok(ShardOutcome::Applied(LedgerReply::Batch { replies })) => replies,
                Ok(other) => {
                    tracing::warn!(shard, ?other, "a batched reserve was not applied");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "a batched reserve failed");
                    continue;
                }
            };
            for ((txn, a), reply) in txns.iter().zip(replies) {
                // The shard applied the entry: it holds the outcome already.
                let (decision, reason) = one_shard_vote(shard, reply);
                counts.push(a.members());
                decides.push(MetaCommand::Decide {
                    txn: *txn,
                    decision,
                    placements: placements(a, self.shards.get()),
                    reason,
                    at_ms: now_ms(),
                    delivered: vec![shard],
                });
            }
        }
        if decides.is_empty() {
            return Ok(began);
        }
        let timer = PhaseTimer::start(Phase::Decide);
        let decided = self.meta_batch(decides).await?;
        drop(timer);
        for (reply, pods) in decided.into_iter().zip(counts) {
            if let MetaReply::Decided { decision, .. } = reply {
                transaction_ended(decision, pods);
            }
        }
        // A decision meta changed (a member held twice) is delivered at the next round.
        Ok(began)
    }

    /// Applies `commands` as one meta entry; one reply per command.
    pub(super) async fn meta_batch(
        &self,
        commands: Vec<MetaCommand>,
    ) -> Result<Vec<MetaReply>, GroupError> {
        let n = commands.len();
        match self.groups.meta(&MetaCommand::Batch { commands }).await? {
            MetaReply::Batch { replies } if replies.len() == n => Ok(replies),
            other => Err(GroupError::Decode {
                group: META_GROUP,
                reason: format!("a batch of {n} was answered with {other:?}"),
            }),
        }
    }
}
