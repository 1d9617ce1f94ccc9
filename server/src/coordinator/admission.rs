//! Whether a group may be tried now: capacity read from the shards, queue quotas,
//! waiting for room, its chances to preempt or reclaim, and its wait time. Part of
//! [`Coordinator`]'s `impl`.

use super::*;

impl Coordinator {
    /// Every [`CAPACITY_REFRESH_MS`], sums the shards' allocatable resources and records
    /// the total in meta if it changed. A shard that cannot answer within
    /// [`CAPACITY_READ_TIMEOUT_MS`] leaves the old record.
    pub(super) async fn refresh_capacity(&self) -> Result<(), GroupError> {
        if !take_if_due(&self.capacity_read_at, CAPACITY_REFRESH_MS) {
            return Ok(());
        }
        let reads = self.shards.ids().map(|shard| async move {
            let read = self.groups.shard_query(shard, &ShardQuery::Capacity);
            match tokio::time::timeout(Duration::from_millis(CAPACITY_READ_TIMEOUT_MS), read).await
            {
                Ok(Ok(ShardAnswer::Capacity { allocatable })) => Some(allocatable),
                _ => None,
            }
        });
        let mut total = gangway_core::model::Resources::zero();
        for read in join_all(reads).await {
            // A shard that cannot answer now (an election, say) leaves the old record.
            let Some(allocatable) = read else {
                return Ok(());
            };
            total = total.saturating_add(&allocatable);
        }
        let recorded = match self.groups.meta_query_local(&MetaQuery::Capacity)? {
            MetaReply::Capacity { capacity } => capacity,
            _ => None,
        };
        if recorded.as_ref() != Some(&total) {
            self.groups
                .meta(&MetaCommand::NoteCapacity { capacity: total })
                .await?;
        }
        Ok(())
    }

    /// Fair sharing over time: every sixteenth of the half-life (within
    /// [`FAIR_SHARE_SAMPLE_MS_MIN`]..=[`FAIR_SHARE_SAMPLE_MS_MAX`]), while queues exist,
    /// writes `SampleUsage` so meta advances each queue's decayed usage by its clock;
    /// with no half-life configured, forgets a history meta still keeps (one entry).
    pub(super) async fn sample_usage(&self) -> Result<(), GroupError> {
        let half_life_ms = self.fair_share_half_life_ms;
        let period_ms =
            (half_life_ms / 16).clamp(FAIR_SHARE_SAMPLE_MS_MIN, FAIR_SHARE_SAMPLE_MS_MAX);
        if !take_if_due(&self.usage_sampled_at, period_ms) {
            return Ok(());
        }
        let (recorded, queues) = match self.groups.meta_query_local(&MetaQuery::UsageHistory)? {
            MetaReply::UsageHistory {
                half_life_ms,
                queues,
                ..
            } => (half_life_ms, queues),
            _ => (0, 0),
        };
        let needed = match half_life_ms {
            0 => recorded != 0,
            _ => queues > 0,
        };
        if !needed {
            return Ok(());
        }
        self.groups
            .meta(&MetaCommand::SampleUsage {
                at_ms: now_ms(),
                half_life_ms,
            })
            .await?;
        Ok(())
    }

    /// The queued groups among `records` whose queues have no room for them now, with
    /// why (a local read: meta checks again when the transaction begins, I8).
    pub(super) fn quota_refusals(
        &self,
        records: &[GroupRecord],
    ) -> Result<BTreeMap<GroupSeq, String>, GroupError> {
        let seqs: Vec<GroupSeq> = records
            .iter()
            .filter(|r| r.state == GroupState::Queued && !r.group.queue.is_empty())
            .map(|r| r.seq)
            .collect();
        if seqs.is_empty() {
            return Ok(BTreeMap::new());
        }
        match self
            .groups
            .meta_query_local(&MetaQuery::QuotaRefusals { seqs })?
        {
            MetaReply::QuotaRefusals { refusals } => Ok(refusals.into_iter().collect()),
            _ => Ok(BTreeMap::new()),
        }
    }

    /// A group whose queue has no room: it times out at its deadline, else says why it
    /// waits (once) and is looked at again next round, with no backoff.
    pub(super) async fn wait_for_room(&self, r: &GroupRecord, why: &str) -> Result<(), GroupError> {
        if self.expire_if_due(r).await? {
            return Ok(());
        }
        if r.reason != why {
            self.groups
                .meta(&MetaCommand::NoteWaiting {
                    seq: r.seq,
                    reason: why.to_string(),
                })
                .await?;
        }
        Ok(())
    }

    /// Whether `r`, which did not fit, tries to preempt: only if it may, and some placed
    /// group has a lower priority (a local read), and the round has an attempt left.
    pub(super) fn preemption_chance(
        &self,
        r: &GroupRecord,
    ) -> Result<PreemptionChance, GroupError> {
        if !preempt::may_preempt(r) {
            return Ok(PreemptionChance::None);
        }
        let query = match &r.group.preempts_within {
            Some(root) => MetaQuery::LowestPlacedPriorityWithin { root: root.clone() },
            None => MetaQuery::LowestPlacedPriority,
        };
        let lowest = match self.groups.meta_query_local(&query)? {
            MetaReply::LowestPriority { priority } => priority,
            _ => None,
        };
        if lowest.is_none_or(|p| p >= r.highest_priority()) {
            return Ok(PreemptionChance::None);
        }
        let taken = self
            .preemptions_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        Ok(if taken {
            PreemptionChance::Try
        } else {
            PreemptionChance::Deferred
        })
    }

    /// Whether `r` tries to reclaim its queue's guarantee, and from which groups (a
    /// local read; meta checks again): when its queue is below its `min` with room for
    /// it there, some group of another queue is above theirs, and the round has a
    /// preemption attempt left.
    pub(super) fn reclaim_chance(&self, r: &GroupRecord) -> Result<Reclaim, GroupError> {
        if r.group.queue.is_empty() || !preempt::may_preempt(r) {
            return Ok(Reclaim::None);
        }
        let victims = match self
            .groups
            .meta_query_local(&MetaQuery::Reclaimable { seq: r.seq })?
        {
            MetaReply::Reclaimable { victims } if !victims.is_empty() => victims,
            MetaReply::Rejected { reason, .. } => return Ok(Reclaim::Refused(reason)),
            _ => return Ok(Reclaim::None),
        };
        let taken = self
            .preemptions_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        Ok(match taken {
            true => Reclaim::Try(victims),
            false => Reclaim::Deferred,
        })
    }

    /// Times `r` out when its waitTime has passed; whether it did.
    pub(super) async fn expire_if_due(&self, r: &GroupRecord) -> Result<bool, GroupError> {
        let now = now_ms();
        if r.deadline_ms.is_none_or(|d| d > now) {
            return Ok(false);
        }
        self.groups
            .meta(&MetaCommand::Expire {
                seq: r.seq,
                at_ms: now,
            })
            .await?;
        Ok(true)
    }

    pub(super) async fn queued(&self, r: &GroupRecord) -> Result<(), GroupError> {
        if self.expire_if_due(r).await? {
            return Ok(());
        }
        if r.not_before_ms > now_ms() {
            return Ok(());
        }
        // Due (woken, or by the safety net): planned again, parked again if need be.
        self.parking.forget(r.seq);
        self.place(r).await
    }
}
