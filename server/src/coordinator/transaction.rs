//! One group's two-phase transaction: begin, reserve on every participant (or
//! reserve-and-commit on one shard), decide, tell; delivering decisions left
//! undelivered and recovering transactions a failed coordinator left open; and releases
//! meta recorded. Part of [`Coordinator`]'s `impl`.

use super::*;

impl Coordinator {
    pub(super) async fn place(&self, r: &GroupRecord) -> Result<(), GroupError> {
        tracing::debug!(
            group = r.seq,
            waited_ms = now_ms().saturating_sub(r.submitted_at_ms),
            "placing"
        );
        let members = self.members_to_plan(r);
        // Taken before the plans: a change while they are made wakes the group.
        let counts = self.parking.counts();
        let kept = self.head_of_line.kept_for(r);
        let timer = PhaseTimer::start(Phase::Quote);
        let plans = self
            .plans(&members, &listed_topologies(&r.group.gangs), &kept)
            .await;
        drop(timer);
        let placed_before: BTreeSet<String> = r.placements.keys().cloned().collect();
        let mut outcome = assign(&r.group, &plans, &placed_before);
        if let AssignOutcome::Short { reason, partial } = &outcome {
            let second = self.beside_carriers(r, &members, &placed_before, partial, reason);
            if let Some(second) = second.await {
                outcome = second;
            }
        }
        let assignment = match outcome {
            AssignOutcome::Ready(a) => a,
            AssignOutcome::Short { partial, .. }
                if r.accumulates() && !partial.per_shard.is_empty() =>
            {
                partial
            }
            AssignOutcome::Short { reason, .. } => {
                let tried = std::time::Instant::now();
                // A preemption or reclaim put off to a later round must not wait parked.
                let mut deferred = false;
                let reason = match self.preemption_chance(r)? {
                    PreemptionChance::None => reason,
                    PreemptionChance::Deferred => {
                        deferred = true;
                        format!(
                            "{reason}; preemption deferred: {PREEMPTION_ATTEMPTS_PER_ROUND_MAX} attempts per round"
                        )
                    }
                    PreemptionChance::Try => {
                        match self.preempt(r, &preempt::Grounds::Priority).await? {
                            preempt::Preemption::Ran => return Ok(()),
                            preempt::Preemption::NotBegun(why) => {
                                let ms = tried.elapsed().as_millis() as u64;
                                tracing::debug!(group = r.seq, %why, ms, "no preemption");
                                format!("{reason}; no preemption: {why}")
                            }
                        }
                    }
                };
                let reason = match self.reclaim_chance(r)? {
                    Reclaim::None => reason,
                    Reclaim::Refused(why) => format!("{reason}; no reclaim: {why}"),
                    Reclaim::Deferred => {
                        deferred = true;
                        format!(
                            "{reason}; reclaim deferred: {PREEMPTION_ATTEMPTS_PER_ROUND_MAX} attempts per round"
                        )
                    }
                    Reclaim::Try(victims) => {
                        match self.preempt(r, &preempt::Grounds::Reclaim(victims)).await? {
                            preempt::Preemption::Ran => return Ok(()),
                            preempt::Preemption::NotBegun(why) => {
                                tracing::debug!(group = r.seq, %why, "no reclaim");
                                format!("{reason}; no reclaim: {why}")
                            }
                        }
                    }
                };
                let reserved = match deferred {
                    true => self.head_of_line.of(r.seq),
                    false => self.reserve_for(r, &plans).await,
                };
                let retry = match (&reserved, deferred) {
                    (Some(_), _) => Retry::Reserved,
                    (None, true) => Retry::Backoff,
                    (None, false) => self.retry_of(r, &plans, counts),
                };
                let reason = with_reservations(reason, &kept, reserved.as_ref());
                let reason = match retry {
                    Retry::Parked => parking::parked_reason(&reason),
                    Retry::Backoff | Retry::Reserved => reason,
                };
                let requeued = self
                    .groups
                    .meta(&MetaCommand::Requeue {
                        seq: r.seq,
                        reason,
                        at_ms: now_ms(),
                        attempts: Some(r.attempts),
                        retry,
                    })
                    .await;
                if !matches!(requeued, Ok(MetaReply::Group { .. })) {
                    self.parking.forget(r.seq);
                }
                requeued?;
                return Ok(());
            }
        };
        let participants = assignment.participants(self.shards.get());
        let begin = MetaCommand::BeginTxn {
            seq: r.seq,
            participants: participants.clone(),
            at_ms: now_ms(),
        };
        let timer = PhaseTimer::start(Phase::Begin);
        let MetaReply::TxnBegun { txn } = self.groups.meta(&begin).await? else {
            return Ok(());
        };
        drop(timer);
        let span =
            tracing::info_span!("transaction", group = r.seq, %txn, shards = participants.len());
        self.run_txn(txn, &participants, &assignment)
            .instrument(span)
            .await
    }

    /// Reserves, decides and commits (or aborts) transaction `txn`.
    pub(super) async fn run_txn(
        &self,
        txn: TxnId,
        participants: &[u32],
        assignment: &Assignment,
    ) -> Result<(), GroupError> {
        if participants.len() == 1 {
            return self
                .place_in_one_shard(txn, participants[0], assignment)
                .await;
        }
        let timer = PhaseTimer::start(Phase::Reserve);
        let votes = self.reserve_all(txn, participants, assignment).await;
        drop(timer);
        let no = votes.iter().find_map(|v| match v {
            Vote::No(why) => Some(why.clone()),
            Vote::Yes => None,
        });
        let (decision, reason) = match no {
            None => {
                self.failpoints.hit(failpoints::AFTER_RESERVE);
                (Decision::Commit, String::new())
            }
            Some(why) => (Decision::Abort, why),
        };
        if decision == Decision::Commit
            && self
                .failpoints
                .armed(failpoints::COORDINATOR_SKIPS_DECISION)
        {
            tracing::error!(%txn, "bug switch {}: telling COMMIT with no recorded decision", failpoints::COORDINATOR_SKIPS_DECISION);
            let ops = gangway_core::plan::decision::decision_ops(txn, Decision::Commit, false);
            for shard in participants {
                let _ = self
                    .groups
                    .shard(*shard, LedgerOp::Batch { ops: ops.clone() })
                    .await;
            }
            return Ok(());
        }
        let decided = self
            .decide(
                txn,
                decision,
                placements(assignment, self.shards.get()),
                reason,
                Vec::new(),
            )
            .await?;
        if decided == Decision::Commit {
            self.failpoints.hit(failpoints::AFTER_DECIDE);
        }
        let timer = PhaseTimer::start(Phase::Commit);
        release::tell(
            &self.groups,
            txn,
            decided,
            participants,
            participants.len() == 1,
        )
        .await;
        drop(timer);
        transaction_ended(decided, assignment.members());
        Ok(())
    }

    pub(super) async fn place_in_one_shard(
        &self,
        txn: TxnId,
        shard: u32,
        a: &Assignment,
    ) -> Result<(), GroupError> {
        let members = a.per_shard.get(&shard).cloned().unwrap_or_default();
        let timer = PhaseTimer::start(Phase::Reserve);
        let outcome = self
            .groups
            .shard(
                shard,
                LedgerOp::ReserveAndCommit {
                    txn_id: txn,
                    members,
                    network: a.network.clone(),
                },
            )
            .await?;
        drop(timer);
        let (decision, reason, delivered) = match outcome {
            ShardOutcome::Applied(reply) => {
                let (decision, reason) = one_shard_vote(shard, reply);
                (decision, reason, vec![shard])
            }
            other => (Decision::Abort, refusal_reason(shard, &other), Vec::new()),
        };
        let decided = self
            .decide(
                txn,
                decision,
                placements(a, self.shards.get()),
                reason,
                delivered,
            )
            .await?;
        if decided != decision {
            release::tell(&self.groups, txn, decided, &[shard], true).await;
        }
        tracing::debug!(%txn, ?decided, "one-shard placement decided");
        transaction_ended(decided, a.members());
        Ok(())
    }

    pub(super) async fn reserve_all(
        &self,
        txn: TxnId,
        participants: &[u32],
        a: &Assignment,
    ) -> Vec<Vote> {
        let deadline_ms = now_ms() + RESERVE_TTL_MS;
        let asks = participants.iter().map(|shard| {
            let op = LedgerOp::Reserve {
                txn_id: txn,
                members: a.per_shard.get(shard).cloned().unwrap_or_default(),
                deadline_ms,
                network: a.network.clone(),
            };
            async move {
                match self.groups.shard(*shard, op).await {
                    Ok(ShardOutcome::Applied(LedgerReply::Reserved { .. })) => Vote::Yes,
                    Ok(other) => Vote::No(refusal_reason(*shard, &other)),
                    Err(e) => Vote::No(format!("shard {shard}: {e}")),
                }
            }
        });
        join_all(asks).await
    }

    /// Writes the decision; returns the one recorded (a tombstone may have won).
    pub(super) async fn decide(
        &self,
        txn: TxnId,
        decision: Decision,
        placements: BTreeMap<String, Placement>,
        reason: String,
        delivered: Vec<u32>,
    ) -> Result<Decision, GroupError> {
        let _timer = PhaseTimer::start(Phase::Decide);
        let cmd = MetaCommand::Decide {
            txn,
            decision,
            placements,
            reason,
            at_ms: now_ms(),
            delivered,
        };
        match self.groups.meta(&cmd).await? {
            MetaReply::Decided { decision, .. } => Ok(decision),
            other => {
                tracing::warn!(%txn, ?other, "decision not recorded");
                Ok(Decision::Abort)
            }
        }
    }

    /// Delivers, in bulk, decisions some participant has not acknowledged (a tell that
    /// failed, a coordinator that died between deciding and telling): a cheap local
    /// read when there are none, so it runs every round; after a failover it reads
    /// linearizably. Work grows with undelivered decisions, not with placed groups.
    /// Delivers decisions participants have not acknowledged; answers how many there were.
    pub(super) async fn deliver_undelivered(&self, first_round: bool) -> Result<usize, GroupError> {
        let query = MetaQuery::Undelivered {
            limit: UNDELIVERED_PER_ROUND_MAX,
        };
        let reply = if first_round {
            self.groups.meta_query(&query).await?
        } else {
            self.groups.meta_query_local(&query)?
        };
        let MetaReply::Undelivered { txns } = reply else {
            return Ok(0);
        };
        if txns.is_empty() {
            return Ok(0);
        }
        tracing::info!(
            decisions = txns.len(),
            "delivering decisions participants have not acknowledged"
        );
        let acked = release::deliver(&self.groups, &txns).await;
        release::record_delivered(&self.groups, &acked).await?;
        Ok(txns.len())
    }

    /// A group left in Placing by an earlier coordinator: its transaction is undecided.
    pub(super) async fn recover(&self, txn: TxnId) -> Result<(), GroupError> {
        let MetaReply::Txn { record: Some(t) } =
            self.groups.meta_query(&MetaQuery::Txn { txn }).await?
        else {
            return Ok(());
        };
        if let Some(decision) = t.decision {
            release::tell(
                &self.groups,
                txn,
                decision,
                &t.participants,
                t.participants.len() == 1,
            )
            .await;
            return Ok(());
        }
        if let [shard] = t.participants[..] {
            return self.recover_one_shard(txn, shard).await;
        }
        let decided = self
            .decide(
                txn,
                Decision::Abort,
                BTreeMap::new(),
                "coordinator failover".into(),
                Vec::new(),
            )
            .await?;
        release::tell(&self.groups, txn, decided, &t.participants, false).await;
        Ok(())
    }

    /// In the one-shard path the shard is authoritative: abort there first (a
    /// tombstone if it never saw the entry); if it had committed, record that, with
    /// the devices the shard allocated.
    pub(super) async fn recover_one_shard(&self, txn: TxnId, shard: u32) -> Result<(), GroupError> {
        let outcome = self
            .groups
            .shard(shard, LedgerOp::Abort { txn_id: txn })
            .await?;
        let committed = matches!(
            outcome,
            ShardOutcome::Applied(LedgerReply::Rejected {
                error: LedgerError::TxnCommitted { .. },
            })
        );
        if !committed {
            self.decide(
                txn,
                Decision::Abort,
                BTreeMap::new(),
                "coordinator failover".into(),
                vec![shard],
            )
            .await?;
            return Ok(());
        }
        let ShardAnswer::Txn {
            members, devices, ..
        } = self
            .groups
            .shard_query(shard, &ShardQuery::Txn { txn })
            .await?
        else {
            return Ok(());
        };
        let mut devices: BTreeMap<MemberKey, Vec<PlacedDevice>> = devices
            .into_iter()
            .map(|(m, list)| (m, list.iter().map(PlacedDevice::of).collect()))
            .collect();
        let placements = members
            .into_iter()
            .map(|(m, node)| {
                let placement = Placement {
                    node,
                    shard,
                    devices: devices.remove(&m).unwrap_or_default(),
                    txn: Some(txn),
                    network_shards: Vec::new(),
                    allocations: Vec::new(),
                };
                (m.to_string(), placement)
            })
            .collect();
        let decided = self
            .decide(
                txn,
                Decision::Commit,
                placements,
                String::new(),
                vec![shard],
            )
            .await?;
        if decided != Decision::Commit {
            release::tell(&self.groups, txn, decided, &[shard], true).await;
        }
        Ok(())
    }

    /// A placed group whose member release (ReleaseMembers) recorded in meta did not
    /// reach its shards (the caller died): finish it.
    pub(super) async fn finish_member_release(&self, r: &GroupRecord) -> Result<(), GroupError> {
        if r.releasing.is_empty() {
            return Ok(());
        }
        release::free_members(&self.groups, &r.releasing).await?;
        self.groups
            .meta(&MetaCommand::MembersReleased {
                seq: r.seq,
                members: r.releasing.keys().cloned().collect(),
                at_ms: now_ms(),
            })
            .await?;
        Ok(())
    }

    /// Gives back everything a releasing group holds: an aborted transaction on its
    /// participants (a cancel while placing), then every member it holds, placed or
    /// releasing, each with the transaction that placed it committed first.
    pub(super) async fn release(&self, r: &GroupRecord) -> Result<(), GroupError> {
        let mut latest_committed = None;
        if let Some(txn) = r.txn {
            if let MetaReply::Txn { record: Some(t) } =
                self.groups.meta_query(&MetaQuery::Txn { txn }).await?
            {
                if t.decision == Some(Decision::Commit) {
                    latest_committed = Some(txn);
                }
                if t.decision == Some(Decision::Abort) && !t.unacked.is_empty() {
                    let alone = t.participants.len() == 1;
                    let all =
                        release::tell(&self.groups, txn, Decision::Abort, &t.unacked, alone).await;
                    if !all {
                        return Err(GroupError::StepRefused {
                            shard: t.unacked.first().copied().unwrap_or(0),
                            reason: format!("{txn}: ABORT not delivered yet"),
                        });
                    }
                }
            }
        }
        let mut held = r.placements.clone();
        held.extend(r.releasing.iter().map(|(k, p)| (k.clone(), p.clone())));
        // Placements recorded before each kept its transaction were placed by the
        // group's latest one, if that one committed.
        for p in held.values_mut() {
            p.txn = p.txn.or(latest_committed);
        }
        release::free_members(&self.groups, &held).await?;
        self.groups
            .meta(&MetaCommand::ReleaseDone {
                seq: r.seq,
                at_ms: now_ms(),
            })
            .await?;
        Ok(())
    }
}

/// `reason`, saying how many nodes were kept from the group (reserved for groups ahead
/// of it) and which it holds reserved itself.
fn with_reservations(
    reason: String,
    kept: &KeptNodes,
    reserved: Option<&gangway_core::ledger::meta::HeadReservation>,
) -> String {
    let kept_count: usize = kept.values().map(Vec::len).sum();
    let reason = match kept_count {
        0 => reason,
        n => format!("{reason}; {n} nodes are reserved for groups ahead of it"),
    };
    match reserved {
        None => reason,
        Some(r) => match r.starts_by_ms {
            Some(start) => format!(
                "{reason}; {} nodes reserved for it, free in about {} s",
                r.node_count(),
                start.saturating_sub(now_ms()).div_ceil(1_000)
            ),
            None => format!(
                "{reason}; {} nodes reserved for it, free when what runs there ends",
                r.node_count()
            ),
        },
    }
}
