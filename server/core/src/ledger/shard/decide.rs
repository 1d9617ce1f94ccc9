//! Phase 2: a recorded decision (COMMIT or ABORT) applied to an open reservation.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    pub(super) fn commit(&mut self, at_ms: u64, txn_id: TxnId) -> Result<LedgerReply, LedgerError> {
        if let Some(open) = self.state.open.remove(&txn_id) {
            // A preemption's victims go; the placeholders holding their room go too,
            // except on nodes where a victim's pod may still run (Kubernetes pods).
            let still_running = self.keep_evicting(at_ms, txn_id, &open);
            for (member, node) in &open.members {
                if displace::is_placeholder(member) && !still_running.contains(node) {
                    self.take_member(member);
                    continue;
                }
                self.state
                    .nodes
                    .update(node, |entry| entry.usage.promote(member, at_ms));
            }
            for member in &open.network {
                self.state.network.promote(member, at_ms);
            }
            self.finish(txn_id, TxnOutcome::Committed, at_ms, Vec::new());
            return Ok(LedgerReply::Committed { txn_id });
        }
        match self.state.finished.get(&txn_id).map(|done| done.outcome) {
            Some(TxnOutcome::Committed) => Ok(LedgerReply::Committed { txn_id }),
            Some(outcome) => Err(LedgerError::TxnNotCommittable { txn_id, outcome }),
            None if self.holds_committed(txn_id) => Ok(LedgerReply::Committed { txn_id }),
            None => Err(LedgerError::UnknownTxn { txn_id }),
        }
    }

    /// Records the Kubernetes victims of committed preemption `txn_id` as evicting;
    /// returns the nodes they run on (where its placeholders stay).
    pub(super) fn keep_evicting(
        &mut self,
        at_ms: u64,
        txn_id: TxnId,
        open: &OpenTxn,
    ) -> BTreeSet<String> {
        let preemptor = open
            .members
            .keys()
            .find(|k| !displace::is_placeholder(k))
            .map(|k| format!("{}/{}", k.namespace, k.gang))
            .unwrap_or_default();
        let mut nodes = BTreeSet::new();
        for (key, d) in &open.displaced {
            let Some(uid) = d.slot.pod.uid.clone() else {
                continue;
            };
            nodes.insert(d.node.clone());
            let victim = EvictingVictim {
                txn_id,
                node: d.node.clone(),
                uid,
                preemptor: preemptor.clone(),
                since_ms: at_ms,
            };
            // The same name evicting for an earlier preemption was another pod, which
            // is gone (Kubernetes has one pod of a name at a time): its room is free.
            if let Some(earlier) = self.state.evicting.insert(key.clone(), victim) {
                self.victim_left(earlier.txn_id, &earlier.node);
            }
        }
        nodes
    }

    /// Forgets victims whose pods are gone; frees a transaction's placeholders on a
    /// node once none of its victims there is left.
    pub(super) fn victims_gone(&mut self, keys: &[MemberKey]) -> LedgerReply {
        let mut released = Vec::new();
        let mut absent = Vec::new();
        let mut left: BTreeSet<(TxnId, String)> = BTreeSet::new();
        for key in keys {
            match self.state.evicting.remove(key) {
                Some(v) => {
                    released.push(key.clone());
                    left.insert((v.txn_id, v.node));
                }
                None => absent.push(key.clone()),
            }
        }
        for (txn_id, node) in left {
            self.victim_left(txn_id, &node);
        }
        LedgerReply::Released { released, absent }
    }

    /// A victim of `txn_id` left `node`: frees the transaction's placeholders there if
    /// none of its victims is left on it.
    pub(super) fn victim_left(&mut self, txn_id: TxnId, node: &str) {
        let still = self
            .state
            .evicting
            .values()
            .any(|v| v.txn_id == txn_id && v.node == node);
        if !still {
            self.free_placeholders(txn_id, node);
        }
    }

    /// Takes committed transaction `txn_id`'s placeholders off `node`.
    pub(super) fn free_placeholders(&mut self, txn_id: TxnId, node: &str) {
        let holders: Vec<MemberKey> = self
            .index
            .by_txn
            .get(&txn_id)
            .into_iter()
            .flatten()
            .filter(|k| displace::is_placeholder(k))
            .filter(|k| self.index.locations.get(*k).map(String::as_str) == Some(node))
            .cloned()
            .collect();
        for key in holders {
            self.take_member(&key);
        }
    }

    pub(super) fn abort(&mut self, at_ms: u64, txn_id: TxnId) -> Result<LedgerReply, LedgerError> {
        if self.state.open.contains_key(&txn_id) {
            self.drop_open(at_ms, txn_id);
            return Ok(LedgerReply::Aborted { txn_id });
        }
        match self.state.finished.get(&txn_id).map(|done| done.outcome) {
            Some(TxnOutcome::Committed) => Err(LedgerError::TxnCommitted { txn_id }),
            Some(_) => Ok(LedgerReply::Aborted { txn_id }),
            None if self.holds_committed(txn_id) => Err(LedgerError::TxnCommitted { txn_id }),
            None => {
                // Tombstone: a reserve for this id arriving later must not land.
                self.finish(txn_id, TxnOutcome::Aborted, at_ms, Vec::new());
                Ok(LedgerReply::Aborted { txn_id })
            }
        }
    }

    /// Drops an open transaction's reservations and records it aborted; returns its members.
    pub(super) fn drop_open(&mut self, at_ms: u64, txn_id: TxnId) -> Vec<MemberKey> {
        let Some(open) = self.state.open.remove(&txn_id) else {
            return Vec::new();
        };
        let mut members: Vec<MemberKey> = open.members.into_keys().collect();
        for member in &members {
            self.take_member(member);
        }
        for (key, displaced) in open.displaced {
            self.put_back(&key, displaced);
        }
        for key in open.network {
            if key.gang == CLAIM_GANG {
                continue;
            }
            self.state.network.take(&key);
            if !members.contains(&key) {
                members.push(key);
            }
        }
        // Its shared claims' users go, and the claims it carried with them.
        for member in self.state.network.leave_txn(txn_id) {
            if !members.contains(&member) {
                members.push(member);
            }
        }
        members.retain(|m| !displace::is_placeholder(m));
        self.finish(txn_id, TxnOutcome::Aborted, at_ms, Vec::new());
        members
    }
}
