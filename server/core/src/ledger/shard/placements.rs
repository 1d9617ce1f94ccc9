//! Placements: releasing, binding and evicting what committed transactions placed.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    pub(super) fn release(
        &mut self,
        at_ms: u64,
        target: &ReleaseTarget,
    ) -> Result<LedgerReply, LedgerError> {
        match target {
            ReleaseTarget::Txn(txn_id) => Ok(self.release_txn(at_ms, *txn_id)),
            ReleaseTarget::Members(keys) => self.release_members(keys),
        }
    }

    pub(super) fn release_txn(&mut self, at_ms: u64, txn_id: TxnId) -> LedgerReply {
        if self.state.open.contains_key(&txn_id) {
            let released = self.drop_open(at_ms, txn_id);
            return LedgerReply::Released {
                released,
                absent: Vec::new(),
            };
        }
        let members: Vec<MemberKey> = self
            .index
            .by_txn
            .get(&txn_id)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        for member in &members {
            self.take_member(member);
        }
        let mut members = members;
        for member in self.state.network.held_by(txn_id) {
            self.state.network.take(&member);
            if !members.contains(&member) {
                members.push(member);
            }
        }
        for member in self.state.network.leave_txn(txn_id) {
            if !members.contains(&member) {
                members.push(member);
            }
        }
        // Placeholders still holding evicting victims' room go with the transaction.
        let mut released: Vec<MemberKey> = members
            .into_iter()
            .filter(|m| !displace::is_placeholder(m))
            .collect();
        released.extend(self.forget_displaced(|_, slot| slot.state.txn_id() == Some(txn_id)));
        LedgerReply::Released {
            released,
            absent: Vec::new(),
        }
    }

    pub(super) fn release_members(
        &mut self,
        keys: &[MemberKey],
    ) -> Result<LedgerReply, LedgerError> {
        let keys: BTreeSet<&MemberKey> = keys.iter().collect();
        for key in &keys {
            self.refuse_moved_member(key)?;
            if self.slot(key).is_some_and(|s| !s.state.is_gangway()) {
                return Err(LedgerError::ObservedMember {
                    member: (*key).clone(),
                });
            }
            if let Some(txn_id) = self.reserved_txn_of(key) {
                return Err(LedgerError::MemberReserved {
                    member: (*key).clone(),
                    txn_id,
                });
            }
        }
        let mut released = Vec::new();
        let mut absent = Vec::new();
        for key in &keys {
            let slot = self.take_member(key);
            let hold = self.state.network.take(key);
            let used = match self.hand_over {
                HandOver::ToFollower => self.state.network.leave(key),
                HandOver::Freed => self.state.network.leave_freeing(key),
            };
            match slot.or(hold) {
                Some(_) => released.push((*key).clone()),
                None if used => released.push((*key).clone()),
                None => absent.push((*key).clone()),
            }
        }
        let displaced = self.forget_displaced(|key, _| keys.contains(key));
        absent.retain(|key| !displaced.contains(key));
        released.extend(displaced);
        // A moved member whose last hold here (network devices) went holds nothing here
        // any more: a retried release finds it absent, not moved.
        if !self.state.moved_members.is_empty() {
            for key in &released {
                self.state.moved_members.remove(key);
            }
        }
        Ok(LedgerReply::Released { released, absent })
    }

    pub(super) fn reserved_txn_of(&self, key: &MemberKey) -> Option<TxnId> {
        let using = || {
            let open = |t: &TxnId| self.state.open.contains_key(t);
            self.state
                .network
                .consumers()
                .find(|(m, t)| *m == key && open(t))
                .map(|(_, t)| t)
        };
        self.slot(key)
            .or_else(|| self.state.network.hold_of(key))
            .filter(|slot| slot.state.is_reserved())
            .and_then(|slot| slot.state.txn_id())
            .or_else(using)
    }

    /// Removes a member's slot wherever it is, keeping the indexes in step.
    pub(super) fn take_member(&mut self, key: &MemberKey) -> Option<PodSlot> {
        let hand_over = self.hand_over;
        let node = self.index.locations.remove(key)?;
        let slot = self
            .state
            .nodes
            .update(&node, |entry| entry.usage.take_as(key, hand_over))
            .flatten()?;
        if let Some(txn_id) = slot.state.txn_id() {
            if let Some(set) = self.index.by_txn.get_mut(&txn_id) {
                set.remove(key);
                if set.is_empty() {
                    self.index.by_txn.remove(&txn_id);
                }
            }
        }
        Some(slot)
    }

    pub(super) fn bind_confirmed(
        &mut self,
        at_ms: u64,
        member: &MemberKey,
        uid: Option<&str>,
    ) -> Result<LedgerReply, LedgerError> {
        let unknown = || LedgerError::UnknownMember {
            member: member.clone(),
        };
        self.refuse_moved_member(member)?;
        let node = self.index.locations.get(member).ok_or_else(unknown)?;
        let state = self
            .state
            .nodes
            .update(node, |entry| {
                let slot = entry.usage.pods.get_mut(member)?;
                let before = slot.state;
                if let SlotState::Committed { txn_id, .. } = before {
                    slot.state = SlotState::Bound { txn_id, at_ms };
                    // Only a member that named its pod learns a uid here; an
                    // ingested pod's uid was given at submission and never changes.
                    if slot.pod.uid.is_none() && slot.pod.binding == PodBinding::Named {
                        slot.pod.uid = uid.map(str::to_string);
                    }
                }
                Some(before)
            })
            .flatten()
            .ok_or_else(unknown)?;
        match state {
            SlotState::Reserved { txn_id } => Err(LedgerError::NotCommitted {
                member: member.clone(),
                txn_id,
            }),
            SlotState::Committed { .. } | SlotState::Bound { .. } => {
                Ok(LedgerReply::BindRecorded {
                    member: member.clone(),
                })
            }
            SlotState::Observed => Err(LedgerError::ObservedMember {
                member: member.clone(),
            }),
        }
    }

    pub(super) fn tick(&mut self, at_ms: u64) -> LedgerReply {
        let txn_ids = self
            .state
            .open
            .iter()
            .filter(|(_, open)| open.deadline_ms <= at_ms)
            .map(|(txn_id, _)| *txn_id)
            .collect();
        let mut evictions = Vec::new();
        let waiting: Vec<String> = self.index.disconnected.iter().cloned().collect();
        for name in waiting {
            let lost = self.state.nodes.update(&name, |entry| {
                let usage = &mut entry.usage;
                let out = usage.devices.expire_agent(&name, &usage.pods, at_ms);
                let lost = matches!(usage.devices.agent, AgentLink::Lost { .. });
                (out, lost)
            });
            match lost {
                Some((out, lost)) => {
                    evictions.extend(out);
                    if lost {
                        self.index.disconnected.remove(&name);
                    }
                }
                None => {
                    self.index.disconnected.remove(&name);
                }
            }
        }
        let lapsed = self.lapse_leases(at_ms);
        LedgerReply::Expired {
            txn_ids,
            evictions,
            lapsed,
        }
    }

    /// Makes every node whose lease ran out at or before `at_ms` not ready.
    pub(super) fn lapse_leases(&mut self, at_ms: u64) -> Vec<String> {
        let mut lapsed = Vec::new();
        while let Some((until_ms, name)) = self.index.leases.first().cloned() {
            if until_ms > at_ms {
                break;
            }
            self.index.leases.remove(&(until_ms, name.clone()));
            self.state.nodes.update(&name, |entry| {
                entry.node.readiness = Readiness::NotReady;
                if let Some(lease) = entry.lease.as_mut() {
                    lease.state = LeaseState::Lapsed;
                }
            });
            lapsed.push(name);
        }
        lapsed
    }

    pub(super) fn heartbeat(
        &mut self,
        at_ms: u64,
        node: &str,
        ready: bool,
        lease_ms: u64,
    ) -> Result<LedgerReply, LedgerError> {
        if !(NODE_LEASE_MS_MIN..=NODE_LEASE_MS_MAX).contains(&lease_ms) {
            return Err(LedgerError::InvalidLease { lease_ms });
        }
        let readiness = if ready {
            Readiness::Ready
        } else {
            Readiness::NotReady
        };
        let lease = NodeLease {
            renewed_at_ms: at_ms,
            lease_ms,
            state: LeaseState::Live,
        };
        let previous = self.update_known(node, |entry| {
            entry.node.readiness = readiness;
            entry.lease.replace(lease)
        })?;
        if let Some(old) = previous.filter(|l| l.state == LeaseState::Live) {
            self.index
                .leases
                .remove(&(old.until_ms(), node.to_string()));
        }
        self.index
            .leases
            .insert((lease.until_ms(), node.to_string()));
        Ok(LedgerReply::HeartbeatRecorded {
            node: node.to_string(),
            readiness,
            lease_until_ms: lease.until_ms(),
        })
    }
}
