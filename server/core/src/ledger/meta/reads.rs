//! Reads of the meta state that change nothing: [`MetaQuery`] answers, changes since a
//! revision, queue statuses and the groups waiting past full queues. Part of
//! [`MetaState`]'s `impl`.

use super::*;

impl MetaState {
    /// What the coordinator reads of these placed groups about their ends.
    fn placed_ends(&self, seqs: Vec<GroupSeq>) -> Vec<PlacedEnd> {
        seqs.into_iter()
            .filter_map(|seq| self.groups.get(&seq))
            .map(|g| PlacedEnd {
                seq: g.seq,
                gangs: g.group.gangs.iter().map(crate::model::Gang::id).collect(),
                ends_at_ms: g.ends_at_ms(),
                kubernetes: g.is_kubernetes(),
            })
            .collect()
    }

    /// Answers a query.
    pub fn query(&self, q: &MetaQuery) -> MetaReply {
        match q {
            MetaQuery::Moves => MetaReply::Moves {
                moves: self.moves(),
            },
            MetaQuery::SealBlocker { id } => MetaReply::SealBlocker {
                reason: self.seal_blocker(*id),
            },
            MetaQuery::ShardShares => MetaReply::ShardShares {
                shares: self.shares(),
            },
            MetaQuery::MappedNodes => MetaReply::MappedNodes {
                nodes: self.mapped_nodes(),
            },
            MetaQuery::ShardOf { node } => match self.shard_map.get(node) {
                Some(shard) => MetaReply::Shard { shard: *shard },
                None => MetaReply::NotAssigned,
            },
            MetaQuery::ShardSet => self.shard_set(),
            MetaQuery::ShardMap => MetaReply::ShardMap {
                map: self.shard_map.clone(),
            },
            MetaQuery::Group { seq } => match self.groups.get(seq) {
                Some(r) => MetaReply::Group {
                    group: Box::new(GroupSummary::of(r)),
                },
                None => missing(*seq),
            },
            MetaQuery::Groups { active_only } => MetaReply::Groups {
                records: self.in_queue_order(*active_only).cloned().collect(),
            },
            MetaQuery::Summaries { active_only } => MetaReply::Summaries {
                groups: self
                    .in_queue_order(*active_only)
                    .map(GroupSummary::of)
                    .collect(),
            },
            MetaQuery::Versions => MetaReply::Versions {
                groups: self.groups.values().map(|r| (r.seq, r.version)).collect(),
            },
            MetaQuery::ChangedSince { after, limit } => self.changed_since(*after, *limit),
            MetaQuery::SubmittedPods { after, limit } => {
                let mut groups = Vec::new();
                let mut more = false;
                let later = self.groups.range((
                    std::ops::Bound::Excluded(*after),
                    std::ops::Bound::Unbounded,
                ));
                for (_, record) in later {
                    if groups.len() >= (*limit).max(1) as usize {
                        more = true;
                        break;
                    }
                    groups.extend(SubmittedPods::of(record));
                }
                MetaReply::SubmittedPods { groups, more }
            }
            MetaQuery::SummariesOf { seqs } => MetaReply::Summaries {
                groups: seqs
                    .iter()
                    .filter_map(|seq| self.groups.get(seq))
                    .map(GroupSummary::of)
                    .collect(),
            },
            MetaQuery::Pending { limit, due_at_ms } if !self.queues.is_empty() => {
                MetaReply::Groups {
                    records: self.pending_past_full_queues(*limit as usize, *due_at_ms),
                }
            }
            MetaQuery::Pending { limit, due_at_ms } => {
                let index = self.index.read(&self.groups);
                let (mut taken, mut rechecked) = (0usize, 0usize);
                let mut records = Vec::new();
                let due = index
                    .pending()
                    .filter_map(|seq| self.groups.get(&seq))
                    .filter(|r| r.is_due(*due_at_ms));
                for r in due {
                    // Due by its safety net: a few per read, beside the others.
                    if r.is_parked() {
                        if rechecked < PARKED_RECHECKS_PER_READ_MAX {
                            rechecked += 1;
                            records.push(r.clone());
                        }
                        continue;
                    }
                    if taken >= *limit as usize {
                        break;
                    }
                    taken += 1;
                    records.push(r.clone());
                }
                MetaReply::Groups { records }
            }
            MetaQuery::LowestPlacedPriority => MetaReply::LowestPriority {
                priority: self
                    .index
                    .read(&self.groups)
                    .placed_by_priority()
                    .next()
                    .map(|(priority, _)| priority),
            },
            MetaQuery::LowestPlacedPriorityWithin { root } => MetaReply::LowestPriority {
                priority: if root.is_empty() {
                    None
                } else {
                    self.index
                        .read(&self.groups)
                        .placed_by_priority()
                        .filter_map(|(priority, seq)| Some((priority, self.groups.get(&seq)?)))
                        .find(|(_, g)| self.queues.within(&g.group.queue, root))
                        .map(|(priority, _)| priority)
                },
            },
            MetaQuery::OwnersOf { gangs } => {
                let seqs: BTreeSet<GroupSeq> =
                    gangs.iter().filter_map(|g| self.live_owner(g)).collect();
                MetaReply::Groups {
                    records: seqs
                        .iter()
                        .filter_map(|seq| self.groups.get(seq))
                        .cloned()
                        .collect(),
                }
            }
            MetaQuery::Txn { txn } => MetaReply::Txn {
                record: self.txns.get(txn).cloned(),
            },
            MetaQuery::Undelivered { limit } => MetaReply::Undelivered {
                txns: self
                    .undelivered
                    .iter()
                    .filter_map(|t| self.txns.get(t))
                    .filter_map(|t| {
                        Some(Undelivered {
                            txn: t.txn,
                            decision: t.decision?,
                            shards: t.unacked.clone(),
                            alone: t.participants.len() == 1,
                        })
                    })
                    .take(*limit as usize)
                    .collect(),
            },
            MetaQuery::Queues => MetaReply::Queues {
                queues: self.queue_statuses(None),
            },
            MetaQuery::NamedPod { pod } => MetaReply::Groups {
                records: self
                    .live_namer(pod)
                    .and_then(|seq| self.groups.get(&seq))
                    .cloned()
                    .into_iter()
                    .collect(),
            },
            MetaQuery::UsageHistory => MetaReply::UsageHistory {
                half_life_ms: self.queues.history().map_or(0, |h| h.half_life_ms()),
                sampled_at_ms: self.queues.history().map_or(0, |h| h.sampled_at_ms()),
                queues: self.queues.specs().count() as u64,
            },
            MetaQuery::Reclaimable { seq } => match self.reclaimable(*seq) {
                Ok(victims) => MetaReply::Reclaimable { victims },
                Err(reason) => rejected(reason),
            },
            MetaQuery::QuotaRefusals { seqs } => MetaReply::QuotaRefusals {
                refusals: seqs
                    .iter()
                    .filter_map(|seq| Some((*seq, self.quota_refusal(*seq)?)))
                    .collect(),
            },
            MetaQuery::HeadReservations { at_ms } => MetaReply::HeadReservations {
                reservations: self.reservations.active(*at_ms),
            },
            MetaQuery::PlacedEnds => {
                let index = self.index.read(&self.groups);
                let mut seqs: Vec<GroupSeq> =
                    index.placed_by_priority().map(|(_, seq)| seq).collect();
                seqs.sort_unstable();
                MetaReply::PlacedEnds {
                    groups: self.placed_ends(seqs),
                }
            }
            MetaQuery::Overrun { at_ms, limit } => {
                let index = self.index.read(&self.groups);
                let seqs: Vec<GroupSeq> = index.ended_by(*at_ms).take(*limit as usize).collect();
                MetaReply::PlacedEnds {
                    groups: self.placed_ends(seqs),
                }
            }
            MetaQuery::Capacity => MetaReply::Capacity {
                capacity: self.queues.capacity().cloned(),
            },
            MetaQuery::RecentTxns { limit } => MetaReply::Txns {
                txns: self
                    .txns
                    .values()
                    .rev()
                    .take(*limit as usize)
                    .cloned()
                    .collect(),
            },
            MetaQuery::StateCounts => MetaReply::StateCounts {
                counts: self
                    .index
                    .read(&self.groups)
                    .counts()
                    .map(|(name, n)| (name.to_string(), n))
                    .collect(),
            },
            MetaQuery::Owned { owner, key } => {
                let live =
                    |seq: &GroupSeq| self.groups.get(seq).is_some_and(|g| !g.state.is_terminal());
                let n = match self.owned.0.as_ref() {
                    Some(owned) => owned
                        .get(owner)
                        .map_or(0, |s| s.iter().filter(|q| live(q)).count()),
                    // Not built yet on this replica: count the hard way once.
                    None => self
                        .groups
                        .values()
                        .filter(|g| g.group.owner == *owner && !g.state.is_terminal())
                        .count(),
                };
                MetaReply::Owned {
                    live: n as u64,
                    has_key: self.keys.contains_key(&owned_key(owner, key)),
                }
            }
        }
    }

    pub(super) fn changed_since(&self, after: u64, limit: u32) -> MetaReply {
        let index = self.index.read(&self.groups);
        let mut changed: Vec<&GroupRecord> = index
            .changed_after(after)
            .take(limit as usize + 1)
            .filter_map(|seq| self.groups.get(&seq))
            .collect();
        let more = changed.len() > limit as usize;
        changed.truncate(limit as usize);
        let newest = changed.last().map_or(after, |g| g.version);
        // Without `more` everything is listed: the next stamp is the log's (or, for
        // data from before stamps were global, the newest version listed).
        let stamp = if more {
            newest
        } else {
            newest.max(self.last_version.last())
        };
        MetaReply::Changed {
            groups: changed.into_iter().map(GroupSummary::of).collect(),
            stamp,
            more,
            forgotten: self.forgotten,
        }
    }

    /// The status of one queue (`only`) or of all, in name order.
    pub(super) fn queue_statuses(&self, only: Option<&str>) -> Vec<QueueStatus> {
        let index = self.index.read(&self.groups);
        self.queues
            .specs()
            .filter(|q| only.is_none_or(|n| n == q.name))
            .map(|q| {
                let (queued, admitted) = index.queue_groups(&q.name);
                QueueStatus {
                    spec: q.clone(),
                    usage: self.queues.usage(&q.name),
                    decayed_usage: self.queues.history().map(|h| h.decayed(&q.name)),
                    queued,
                    admitted,
                }
            })
            .collect()
    }

    /// The pending groups in queue order, `limit` of them that the coordinator can act
    /// on, plus at most `limit` queued groups whose queues have no room (listed so their
    /// reason and deadline are kept): a full queue's backlog never hides the groups of
    /// other queues behind it; and at most [`PARKED_RECHECKS_PER_READ_MAX`] parked groups
    /// due by their safety net, which count against neither.
    pub(super) fn pending_past_full_queues(
        &self,
        limit: usize,
        due_at_ms: Option<u64>,
    ) -> Vec<GroupRecord> {
        let index = self.index.read(&self.groups);
        let (queued, rest): (Vec<&GroupRecord>, Vec<&GroupRecord>) = index
            .pending()
            .filter_map(|seq| self.groups.get(&seq))
            .filter(|r| r.is_due(due_at_ms))
            .partition(|r| r.state == GroupState::Queued);
        // Both in queue order already: the pending index is ordered by `order_key`.
        // Lazy: only the groups this read takes are charged and ordered.
        let fair = self.queues.fair_order(
            queued
                .into_iter()
                .map(|r| (r.group.queue.clone(), r))
                .collect(),
            |r| r.charge_to_place(),
        );
        let (mut actionable, mut waiting, mut rechecked) = (0usize, 0usize, 0usize);
        let mut out = Vec::new();
        for r in rest.into_iter().chain(fair) {
            if actionable >= limit {
                break;
            }
            // Due by its safety net (a woken group is no longer parked).
            if r.is_parked() {
                if rechecked < PARKED_RECHECKS_PER_READ_MAX {
                    rechecked += 1;
                    out.push(r.clone());
                }
                continue;
            }
            let no_room = r.state == GroupState::Queued
                && !r.group.queue.is_empty()
                && self.quota_refusal(r.seq).is_some();
            if no_room {
                if waiting >= limit {
                    continue;
                }
                waiting += 1;
            } else {
                actionable += 1;
            }
            out.push(r.clone());
        }
        out
    }
}
