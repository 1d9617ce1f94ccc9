//! How a group leaves: requeued after an abort, expired, cancelled, released whole or
//! member by member; and the bounded memory of ended groups and decided transactions.
//! Part of [`MetaState`]'s `impl`.

use super::*;

impl MetaState {
    pub(super) fn requeue(
        &mut self,
        seq: GroupSeq,
        reason: &str,
        at_ms: u64,
        attempts: Option<u32>,
        retry: Retry,
    ) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        if g.state != GroupState::Queued {
            return rejected(format!(
                "gang group {seq} is {}, not Queued",
                g.state.name()
            ));
        }
        if retry == Retry::Parked && !g.holds_nothing() {
            return rejected(format!(
                "retry: gang group {seq} holds members; only a group that holds nothing is parked"
            ));
        }
        if attempts.is_none_or(|seen| seen == g.attempts) {
            g.attempts += 1;
            g.reason = reason.to_string();
            g.bump(&mut self.last_version);
            if g.deadline_ms.is_some_and(|d| d <= at_ms) {
                g.state = g.timed_out();
                g.parked_at_ms = None;
            } else {
                let backoff = retry_backoff_ms(g.attempts);
                let (wait, parked) = match retry {
                    Retry::Backoff => (backoff, None),
                    Retry::Reserved if self.reservations.holds(seq) => (RESERVED_RETRY_MS, None),
                    Retry::Reserved => (backoff, None),
                    Retry::Parked => {
                        let net = backoff.max(parked_recheck_ms(seq, g.attempts));
                        let due = on_recheck_grid(at_ms.saturating_add(net));
                        (due - at_ms, Some(at_ms))
                    }
                };
                g.not_before_ms = at_ms.saturating_add(wait);
                g.parked_at_ms = parked;
            }
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    /// Makes the parked groups `which` names due at `at_ms` ([`MetaCommand::Wake`]).
    /// Neither their state nor anything a reader sees changes, so no group is stamped.
    pub(super) fn wake(&mut self, which: &Woken, at_ms: u64) -> MetaReply {
        let seqs: Vec<GroupSeq> = match which {
            Woken::Groups(seqs) if seqs.len() > WAKE_GROUPS_MAX => {
                return rejected(format!(
                    "which: {} groups in one wake, at most {WAKE_GROUPS_MAX}",
                    seqs.len()
                ))
            }
            Woken::Groups(seqs) => seqs.clone(),
            Woken::AllParked => {
                let index = self.index.read(&self.groups);
                index
                    .pending()
                    .filter(|seq| {
                        self.groups
                            .get(seq)
                            .is_some_and(|g| g.parked_at_ms.is_some())
                    })
                    .collect()
            }
        };
        let mut woken = 0u64;
        for seq in seqs {
            let Some(g) = self.groups.get_mut(&seq) else {
                continue;
            };
            if g.state != GroupState::Queued || g.parked_at_ms.is_none() {
                continue;
            }
            g.parked_at_ms = None;
            g.not_before_ms = g.not_before_ms.min(at_ms);
            woken += 1;
        }
        MetaReply::Woken { groups: woken }
    }

    pub(super) fn expire(&mut self, seq: GroupSeq, at_ms: u64) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        let due = g.deadline_ms.is_some_and(|d| d <= at_ms);
        if g.state == GroupState::Queued && due {
            g.state = g.timed_out();
            g.reason = format!(
                "waitTime passed before the group could be placed ({})",
                g.reason
            );
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    pub(super) fn cancel(&mut self, seq: GroupSeq, at_ms: u64) -> MetaReply {
        let Some(g) = self.groups.get(&seq) else {
            return missing(seq);
        };
        let cancelled = GroupState::Releasing {
            then: Terminal::Cancelled,
        };
        let next = match g.state {
            GroupState::Queued if g.holds_nothing() => GroupState::Done {
                how: Terminal::Cancelled,
            },
            GroupState::Queued | GroupState::Placed => cancelled,
            GroupState::Placing { txn } => {
                // Abort the undecided transaction first, so a late commit cannot land;
                // every participant must then be told (and acknowledge).
                if let Some(t) = self.txns.get_mut(&txn) {
                    if t.decision.is_none() {
                        t.decision = Some(Decision::Abort);
                        t.unacked = t.participants.clone();
                    }
                }
                self.note_delivery(txn);
                cancelled
            }
            GroupState::Preempting { txn, by } => {
                return rejected(format!(
                    "gang group {seq} is being preempted by gang group {by} ({txn}); it ends Preempted, or returns to Placed once every shard applied the decision; cancel it then"
                ))
            }
            state @ (GroupState::Releasing { .. } | GroupState::Done { .. }) => state,
        };
        let _ = at_ms;
        self.set_state(seq, next)
    }

    pub(super) fn release(&mut self, seq: GroupSeq, at_ms: u64) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        let state = g.state;
        if state == GroupState::Placed {
            if let (Some(end), Some(limit)) = (g.ends_at_ms(), g.group.run_limit_ms) {
                if end <= at_ms {
                    g.reason =
                        format!("released: its run-time limit of {} s passed", limit / 1_000);
                }
            }
        }
        match state {
            GroupState::Placed => self.set_state(
                seq,
                GroupState::Releasing {
                    then: Terminal::Released,
                },
            ),
            GroupState::Releasing { .. } | GroupState::Done { .. } => self.set_state(seq, state),
            GroupState::Preempting { txn, by } => rejected(format!(
                "gang group {seq} is being preempted by gang group {by} ({txn}); it ends Preempted, or returns to Placed once every shard applied the decision"
            )),
            other => rejected(format!(
                "gang group {seq} is {}, not Placed; cancel it instead",
                other.name()
            )),
        }
    }

    /// ReleaseMembers' first phase: the members leave `placements` for `releasing`
    /// here, before any shard frees them, so a refusal changes nothing anywhere and a
    /// placed member is never freed behind meta's back. A retry finds them releasing.
    pub(super) fn release_members(&mut self, seq: GroupSeq, members: &[String]) -> MetaReply {
        if let Some(refusal) = self.release_waits_for_move(seq, members) {
            return refusal;
        }
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if members.is_empty() {
            return rejected("members: name at least one member");
        }
        let retried = members.iter().all(|m| g.releasing.contains_key(m));
        if let GroupState::Preempting { txn, by } = g.state {
            return rejected(format!(
                "gang group {seq} is being preempted by gang group {by} ({txn}): its members leave with it, or stay placed if the preemption is aborted"
            ));
        }
        if g.state != GroupState::Placed && !retried {
            return rejected(format!(
                "gang group {seq} is {}, not Placed: only a placed group's members can be released (cancel the group instead)",
                g.state.name()
            ));
        }
        if let Some((i, unknown)) = members.iter().enumerate().find(|(_, m)| !g.holds(m)) {
            return rejected(format!(
                "members[{i}]: {} is not a placed member of gang group {seq}",
                short(unknown)
            ));
        }
        let group_txn = g.txn.filter(|t| {
            self.txns
                .get(t)
                .is_some_and(|r| r.decision == Some(Decision::Commit))
        });
        let mut changed = false;
        for m in members {
            if let Some(mut p) = g.placements.remove(m) {
                p.txn = p.txn.or(group_txn);
                g.releasing.insert(m.clone(), p);
                changed = true;
            }
        }
        if changed {
            g.bump(&mut self.last_version);
        }
        MetaReply::Group {
            group: Box::new(GroupSummary::of(g)),
        }
    }

    /// ReleaseMembers' second phase: the shards freed these members. Members no longer
    /// releasing are passed over (a retried entry); a placed group that holds nothing
    /// any more ends Released. Entries logged before the first phase existed named
    /// placed members directly: those are taken out of `placements`.
    pub(super) fn members_released(&mut self, seq: GroupSeq, members: &[String]) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        let mut changed = false;
        for m in members {
            let legacy = g.state == GroupState::Placed && g.placements.contains_key(m);
            if g.releasing.remove(m).is_some() || (legacy && g.placements.remove(m).is_some()) {
                changed = true;
            }
        }
        if changed {
            g.bump(&mut self.last_version);
            if g.state == GroupState::Placed && g.holds_nothing() {
                g.state = GroupState::Done {
                    how: Terminal::Released,
                };
            }
        }
        self.answer_with_group(seq)
    }

    pub(super) fn release_done(&mut self, seq: GroupSeq) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if let GroupState::Releasing { then } = g.state {
            // The coordinator freed placements and releasing members alike.
            g.releasing.clear();
            g.state = GroupState::Done { how: then };
            g.bump(&mut self.last_version);
        }
        self.answer_with_group(seq)
    }

    pub(super) fn set_state(&mut self, seq: GroupSeq, state: GroupState) -> MetaReply {
        let Some(g) = self.groups.get_mut(&seq) else {
            return missing(seq);
        };
        if g.state != state {
            g.state = state;
            g.bump(&mut self.last_version);
        }
        self.answer_with_group(seq)
    }

    /// Group `seq`'s summary as the reply, taken before old terminal groups are
    /// forgotten (it may be one of them).
    pub(super) fn answer_with_group(&mut self, seq: GroupSeq) -> MetaReply {
        let reply = match self.groups.get(&seq) {
            Some(g) => MetaReply::Group {
                group: Box::new(GroupSummary::of(g)),
            },
            None => missing(seq),
        };
        self.forget_old_groups();
        reply
    }

    /// Forgets the oldest terminal groups once more than [`FINISHED_GROUPS_MAX`] are kept,
    /// down to nine tenths of it, so the scan runs once per many finished groups rather
    /// than on every command.
    pub(super) fn forget_old_groups(&mut self) {
        if self.groups.len() <= FINISHED_GROUPS_MAX {
            return;
        }
        self.catch_up_index();
        let oldest: Vec<GroupSeq> = {
            let index = self.index.read(&self.groups);
            if index.ended_count() <= FINISHED_GROUPS_MAX {
                return;
            }
            let excess = index.ended_count() - FINISHED_GROUPS_MAX * 9 / 10;
            index.ended().take(excess).collect()
        };
        for &seq in &oldest {
            if let Some(g) = self.groups.remove(&seq) {
                assert!(
                    g.charge.is_zero(),
                    "ended group {seq} forgotten while charged {:?}",
                    g.charge
                );
                self.keys.remove(&owned_key(&g.group.owner, &g.key));
                if let Some(owned) = self.owned.0.as_mut() {
                    if let Some(seqs) = owned.get_mut(&g.group.owner) {
                        seqs.remove(&seq);
                        if seqs.is_empty() {
                            owned.remove(&g.group.owner);
                        }
                    }
                }
                for gang in &g.group.gangs {
                    let name = super::gang_name(gang);
                    if self.gang_owners.get(&name) == Some(&seq) {
                        self.gang_owners.remove(&name);
                    }
                }
                for (_, pod) in g.named_pods() {
                    if self.named_pods.get(&pod) == Some(&seq) {
                        self.named_pods.remove(&pod);
                    }
                }
                self.forgotten += 1;
            }
        }
        self.index.reindex(&self.groups, oldest);
    }

    /// Forgets the oldest decided transactions that every participant acknowledged,
    /// once more than [`DECIDED_TXNS_MAX`] are kept, down to nine tenths of it (as
    /// [`Self::forget_old_groups`]). An unacknowledged decision is never forgotten: its
    /// participant may still ask, and "no record" would make it abort a commit.
    pub(super) fn forget_old_txns(&mut self) {
        if self.txns.len() <= DECIDED_TXNS_MAX {
            return;
        }
        let done: Vec<TxnId> = self
            .txns
            .values()
            .filter(|t| t.decision.is_some() && t.unacked.is_empty())
            .map(|t| t.txn)
            .collect();
        if done.len() <= DECIDED_TXNS_MAX {
            return;
        }
        let excess = done.len() - DECIDED_TXNS_MAX * 9 / 10;
        for txn in done.into_iter().take(excess) {
            self.txns.remove(&txn);
        }
    }

    /// Bug switch `meta-returns-victims-at-abort` (and the two-phase model's) only:
    /// returns every victim of an aborted preemption to `Placed` at once, before every
    /// participant put it back, as a first version of rule 14 did. Never called in
    /// production.
    pub fn settle_aborted_preemptions_early(&mut self) {
        let aborted: Vec<TxnId> = self
            .txns
            .values()
            .filter(|t| t.decision == Some(Decision::Abort) && !t.victims.is_empty())
            .map(|t| t.txn)
            .collect();
        for txn in aborted {
            if let Some(t) = self.txns.get_mut(&txn) {
                let unacked = std::mem::take(&mut t.unacked);
                self.settle_victims(txn, None);
                if let Some(t) = self.txns.get_mut(&txn) {
                    t.unacked = unacked;
                }
            }
        }
        // Outside `apply`: the group index is built again from the groups.
        self.index.invalidate();
    }

    /// Bug switch `meta-forgets-unacknowledged-decisions` only: forgets every decided
    /// transaction, acknowledged or not, which rule 5 forbids. Never called in production.
    pub fn forget_decisions_unacknowledged(&mut self) {
        self.txns.retain(|_, t| t.decision.is_none());
        self.undelivered.clear();
    }
}
