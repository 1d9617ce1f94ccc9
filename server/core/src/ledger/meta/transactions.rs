//! Transactions and their decisions: beginning a placement or a preemption (and the
//! refusals that keep preemption inside its rules), deciding, recording delivery, and
//! settling a preemption's victims. Part of [`MetaState`]'s `impl`.

use super::*;

impl MetaState {
    pub(super) fn begin_txn(
        &mut self,
        seq: GroupSeq,
        participants: &[u32],
        at_ms: u64,
    ) -> MetaReply {
        let Some(record) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        if record.state != GroupState::Queued {
            return rejected(format!(
                "gang group {seq} is {}, not Queued",
                record.state.name()
            ));
        }
        if participants.is_empty() {
            return rejected("participants: a transaction needs at least one shard");
        }
        if let Some(bad) = participants.iter().find(|s| **s == 0 || **s > self.shards) {
            return rejected(format!(
                "participants: shard {bad} is not in 1..={}",
                self.shards
            ));
        }
        // I8: the queue is charged here, in the entry that lets reservations begin.
        if let Some(why) = self.quota_refusal(seq) {
            return MetaReply::Rejected {
                reason: why,
                kind: RejectionKind::NoRoom,
            };
        }
        let Some(record) = self.groups.get_mut(&seq) else {
            return rejected(format!("seq: no gang group {seq}"));
        };
        // Never reuse an id that already has a record (e.g. a tombstone).
        while self.txns.contains_key(&TxnId(self.next_txn)) {
            self.next_txn += 1;
        }
        let txn = TxnId(self.next_txn);
        self.next_txn += 1;
        record.state = GroupState::Placing { txn };
        record.txn = Some(txn);
        record.parked_at_ms = None;
        record.bump(&mut self.last_version);
        let mut participants = participants.to_vec();
        participants.sort_unstable();
        participants.dedup();
        self.txns.insert(
            txn,
            TxnRecord {
                txn,
                group: Some(seq),
                participants,
                decision: None,
                began_at_ms: at_ms,
                unacked: Vec::new(),
                victims: Vec::new(),
            },
        );
        MetaReply::TxnBegun { txn }
    }

    /// Refuses, naming the field, a preemption whose preemptor or victims are not in
    /// the states rule 14 needs; otherwise begins it like [`Self::begin_txn`] and marks
    /// the victims `Preempting`.
    pub(super) fn begin_preemption(
        &mut self,
        seq: GroupSeq,
        victims: &[GroupSeq],
        participants: &[u32],
        at_ms: u64,
        reclaim: bool,
    ) -> MetaReply {
        if let Err(reason) = self.preemption_refusal(seq, victims, participants, reclaim) {
            return rejected(reason);
        }
        let reply = self.begin_txn(seq, participants, at_ms);
        let MetaReply::TxnBegun { txn } = reply else {
            return reply;
        };
        let mut victims = victims.to_vec();
        victims.sort_unstable();
        if let Some(t) = self.txns.get_mut(&txn) {
            t.victims = victims.clone();
        }
        for v in victims {
            if let Some(g) = self.groups.get_mut(&v) {
                g.state = GroupState::Preempting { txn, by: seq };
                g.reason = format!("being preempted by gang group {seq} ({txn})");
                g.bump(&mut self.last_version);
            }
        }
        MetaReply::TxnBegun { txn }
    }

    pub(super) fn preemption_refusal(
        &self,
        seq: GroupSeq,
        victims: &[GroupSeq],
        participants: &[u32],
        reclaim: bool,
    ) -> Result<(), String> {
        let Some(preemptor) = self.groups.get(&seq) else {
            return Err(format!("seq: no gang group {seq}"));
        };
        if preemptor.state != GroupState::Queued || !preemptor.holds_nothing() {
            return Err(format!(
                "seq: gang group {seq} is {} and holds {} members; only a queued group that holds nothing preempts",
                preemptor.state.name(),
                preemptor.placements.len() + preemptor.releasing.len()
            ));
        }
        if let Some((i, _)) = preemptor
            .group
            .gangs
            .iter()
            .enumerate()
            .find(|(_, g)| g.members.iter().any(|m| m.spec.preemption_policy.never()))
        {
            return Err(format!(
                "seq: gang group {seq}: gangs[{i}] has a member with preemptionPolicy Never"
            ));
        }
        if victims.is_empty() {
            return Err("victims: a preemption names at least one victim group".into());
        }
        let priority = preemptor.highest_priority();
        let reclaimable: BTreeSet<GroupSeq> = match reclaim {
            true => self.reclaimable(seq)?.into_iter().collect(),
            false => BTreeSet::new(),
        };
        let mut seen = BTreeSet::new();
        for (i, v) in victims.iter().enumerate() {
            if !seen.insert(*v) {
                return Err(format!("victims[{i}]: gang group {v} is named twice"));
            }
            if *v == seq {
                return Err(format!("victims[{i}]: a group cannot preempt itself"));
            }
            let Some(victim) = self.groups.get(v) else {
                return Err(format!("victims[{i}]: no gang group {v}"));
            };
            if victim.state != GroupState::Placed || !victim.releasing.is_empty() {
                return Err(format!(
                    "victims[{i}]: gang group {v} is {}{}, not Placed",
                    victim.state.name(),
                    if victim.releasing.is_empty() {
                        ""
                    } else {
                        " with members being released"
                    }
                ));
            }
            if reclaim && !reclaimable.contains(v) {
                return Err(format!(
                    "victims[{i}]: gang group {v} is not among what queue {} may reclaim (groups of other queues above their min, youngest first, none taking its queue below min)",
                    preemptor.group.queue
                ));
            }
            // A queue's reclaim of its own `min` takes from borrowers wherever they are:
            // the boundary bounds preemption by priority only.
            if let (Some(root), false) = (&preemptor.group.preempts_within, reclaim) {
                if root.is_empty() || !self.queues.within(&victim.group.queue, root) {
                    return Err(format!(
                        "victims[{i}]: gang group {v} is charged to queue {:?}, outside the preemptor's boundary (queue {root} and the queues under it)",
                        victim.group.queue
                    ));
                }
            }
            if !reclaim && victim.highest_priority() >= priority {
                return Err(format!(
                    "victims[{i}]: gang group {v} has priority {}, not below the preemptor's {priority}",
                    victim.highest_priority()
                ));
            }
            if let Some(p) = victim
                .placements
                .values()
                .find(|p| !participants.contains(&p.shard))
            {
                return Err(format!(
                    "participants: shard {} holds members of victim gang group {v} and must take part",
                    p.shard
                ));
            }
        }
        Ok(())
    }

    /// Settles the victims of preemption `txn` once its decision allows: COMMIT ends
    /// them `Preempted` at once (the participants free their members as they commit);
    /// ABORT returns them to `Placed` only when every participant applied it, since
    /// until then a participant still holds their room displaced, and a release that
    /// reached it first would find nothing to free. Victims no longer `Preempting` for
    /// `txn` are left as they are.
    /// `at_ms` is the decision's time, when the caller is the decision (a victim's
    /// notice says when it was preempted; else the transaction's start).
    pub(super) fn settle_victims(&mut self, txn: TxnId, at_ms: Option<u64>) {
        let Some(t) = self.txns.get(&txn) else {
            return;
        };
        let at_ms = at_ms.unwrap_or(t.began_at_ms);
        let decision = match t.decision {
            Some(Decision::Commit) => Decision::Commit,
            Some(Decision::Abort) if t.unacked.is_empty() => Decision::Abort,
            _ => return,
        };
        let victims = t.victims.clone();
        let by = t.group.unwrap_or_default();
        if victims.is_empty() {
            return;
        }
        if decision == Decision::Commit {
            if let Some(g) = self.groups.get_mut(&by) {
                if g.state == GroupState::Placed && g.txn == Some(txn) {
                    let names: Vec<String> = victims.iter().map(u64::to_string).collect();
                    g.reason = format!(
                        "placed by preempting gang groups {} ({txn})",
                        names.join(", ")
                    );
                }
            }
        }
        for v in victims {
            let Some(g) = self.groups.get_mut(&v) else {
                continue;
            };
            if !matches!(g.state, GroupState::Preempting { txn: t, .. } if t == txn) {
                continue;
            }
            match decision {
                Decision::Commit => {
                    g.state = GroupState::Done {
                        how: Terminal::Preempted,
                    };
                    g.preempted = Some(PreemptionNotice {
                        by,
                        txn,
                        members: g.placements.to_map().into_keys().collect(),
                        at_ms,
                    });
                    g.placements.clear();
                    g.reason = format!("preempted by gang group {by} ({txn})");
                }
                Decision::Abort => {
                    g.state = GroupState::Placed;
                    g.reason = format!("preemption by gang group {by} ({txn}) was aborted");
                }
            }
            g.bump(&mut self.last_version);
        }
    }

    pub(super) fn abort_if_undecided(
        &mut self,
        txn: TxnId,
        at_ms: u64,
        shard: Option<u32>,
    ) -> MetaReply {
        if !self.txns.contains_key(&txn) {
            // A tombstone: no record means no coordinator will ever commit it. The
            // asking shard is its one participant, and must acknowledge it.
            let participants: Vec<u32> = shard.into_iter().collect();
            self.record_decision_of_unknown(txn, participants, at_ms);
            return MetaReply::Decided {
                txn,
                decision: Decision::Abort,
            };
        }
        self.decide(
            txn,
            Decision::Abort,
            &BTreeMap::new(),
            "reservation deadline passed",
            at_ms,
            &[],
        )
    }

    pub(super) fn record_decision_of_unknown(
        &mut self,
        txn: TxnId,
        participants: Vec<u32>,
        at_ms: u64,
    ) {
        let unacked = participants.clone();
        self.txns.insert(
            txn,
            TxnRecord {
                txn,
                group: None,
                participants,
                decision: Some(Decision::Abort),
                began_at_ms: at_ms,
                unacked,
                victims: Vec::new(),
            },
        );
        self.note_delivery(txn);
        self.forget_old_txns();
    }

    pub(super) fn decide(
        &mut self,
        txn: TxnId,
        decision: Decision,
        placements: &BTreeMap<String, Placement>,
        reason: &str,
        at_ms: u64,
        delivered: &[u32],
    ) -> MetaReply {
        let Some(record) = self.txns.get(&txn) else {
            if decision == Decision::Abort {
                self.record_decision_of_unknown(txn, Vec::new(), at_ms);
                return MetaReply::Decided { txn, decision };
            }
            return rejected(format!(
                "txn: {txn} is unknown; only an abort can be recorded for it"
            ));
        };
        if let Some(existing) = record.decision {
            return MetaReply::Decided {
                txn,
                decision: existing,
            };
        }
        let group = record.group;
        let placing = group
            .and_then(|seq| self.groups.get(&seq))
            .filter(|g| g.state == (GroupState::Placing { txn }));
        // The commit point refuses a second hold of a member the group already holds
        // (I3): recorded as ABORT, every participant is told and frees what it took.
        let twice = match (decision, placing) {
            (Decision::Commit, Some(g)) => placements.keys().find(|m| g.holds(m)).cloned(),
            _ => None,
        };
        let (decision, reason, delivered) = match &twice {
            Some(member) => (
                Decision::Abort,
                format!("member {member} is already placed; a commit may not place it twice"),
                &[][..],
            ),
            None => (decision, reason.to_string(), delivered),
        };
        let Some(record) = self.txns.get_mut(&txn) else {
            return rejected(format!("txn: {txn} is unknown"));
        };
        record.decision = Some(decision);
        record.unacked = record
            .participants
            .iter()
            .copied()
            .filter(|s| !delivered.contains(s))
            .collect();
        self.note_delivery(txn);
        if let Some(g) = group.and_then(|seq| self.groups.get_mut(&seq)) {
            if g.state == (GroupState::Placing { txn }) {
                apply_decision(
                    g,
                    &mut self.last_version,
                    txn,
                    decision,
                    placements,
                    &reason,
                    at_ms,
                );
            }
        }
        self.settle_victims(txn, Some(at_ms));
        self.forget_old_txns();
        MetaReply::Decided { txn, decision }
    }

    pub(super) fn delivered(&mut self, txn: TxnId, shards: &[u32]) -> MetaReply {
        let Some(record) = self.txns.get_mut(&txn) else {
            return rejected(format!("txn: {txn} is unknown"));
        };
        let Some(decision) = record.decision else {
            return rejected(format!("txn: {txn} is undecided; nothing was delivered"));
        };
        record.unacked.retain(|s| !shards.contains(s));
        self.note_delivery(txn);
        self.settle_victims(txn, None);
        self.forget_old_txns();
        MetaReply::Decided { txn, decision }
    }

    /// Keeps the undelivered index in step with one record's `unacked`.
    pub(super) fn note_delivery(&mut self, txn: TxnId) {
        let pending = self
            .txns
            .get(&txn)
            .is_some_and(|t| t.decision.is_some() && !t.unacked.is_empty());
        if pending {
            self.undelivered.insert(txn);
        } else {
            self.undelivered.remove(&txn);
        }
    }
}
