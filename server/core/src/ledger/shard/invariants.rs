//! Invariants checked where state changes (I1, I2 and the index agreements).
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    /// Checks every ledger invariant (I2 and the bookkeeping that I5 rests on).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        if !self.state.nodes.in_step() {
            return Err(InvariantViolation("node summaries out of step".to_string()));
        }
        for entry in self.state.nodes.iter() {
            self.check_node(&entry.node.name, entry)?;
            if entry.moving != self.state.fences.get(&entry.node.name).copied() {
                return Err(InvariantViolation(format!(
                    "node {}: fenced by {:?}, the fences say {:?}",
                    entry.node.name,
                    entry.moving,
                    self.state.fences.get(&entry.node.name)
                )));
            }
            if self.state.moved_nodes.contains_key(&entry.node.name) {
                return Err(InvariantViolation(format!(
                    "node {} is here and tombstoned as moved",
                    entry.node.name
                )));
            }
        }
        for (txn_id, open) in &self.state.open {
            self.check_open(*txn_id, open)?;
        }
        self.check_network()?;
        self.check_evicting()?;
        self.check_records()
    }

    pub(super) fn check_node(
        &self,
        name: &str,
        entry: &NodeEntry,
    ) -> Result<(), InvariantViolation> {
        let fail = |what: String| Err(InvariantViolation(format!("node {name}: {what}")));
        if entry.node.name != name {
            return fail(format!("keyed under the wrong name {}", entry.node.name));
        }
        let sums = entry.usage.recomputed();
        if sums != entry.usage.sums() {
            return fail("usage sums differ from its slots".to_string());
        }
        if entry.usage.marks() != entry.usage.marks_counted() {
            return fail(format!(
                "pod marks {:?} differ from its slots' {:?}",
                entry.usage.marks(),
                entry.usage.marks_counted()
            ));
        }
        let Some(total) = sums.reserved.checked_add(&sums.committed) else {
            return fail("usage overflows".to_string());
        };
        if let Some(resource) = total.shortfall(&entry.node.allocatable) {
            return fail(format!("I2: {resource} held exceeds allocatable"));
        }
        if let Err(what) = entry.usage.devices.check(&entry.usage.pods) {
            return fail(what);
        }
        let network = &self.state.network;
        if let Err(what) = entry.usage.check_shares(|m, c| network.uses(m, c)) {
            return fail(what);
        }
        let mut ports = BTreeSet::new();
        for (member, slot) in &entry.usage.pods {
            if slot.pod.host_ports.iter().any(|p| !ports.insert(*p)) {
                return fail(format!("host port of {member} held twice"));
            }
            self.check_slot(name, member, slot)?;
        }
        Ok(())
    }

    pub(super) fn check_slot(
        &self,
        node: &str,
        member: &MemberKey,
        slot: &PodSlot,
    ) -> Result<(), InvariantViolation> {
        let Some(txn_id) = slot.state.txn_id() else {
            return if member.gang == OBSERVED_GANG {
                Ok(())
            } else {
                Err(InvariantViolation(format!(
                    "observed pod {member} on {node} is not keyed as one"
                )))
            };
        };
        let open_node = self
            .state
            .open
            .get(&txn_id)
            .and_then(|open| open.members.get(member));
        let consistent = match slot.state {
            SlotState::Reserved { .. } => open_node.map(String::as_str) == Some(node),
            SlotState::Committed { .. } | SlotState::Bound { .. } | SlotState::Observed => {
                !self.state.open.contains_key(&txn_id)
            }
        };
        if consistent {
            Ok(())
        } else {
            Err(InvariantViolation(format!(
                "member {member} on {node} disagrees with {txn_id}"
            )))
        }
    }

    pub(super) fn check_open(
        &self,
        txn_id: TxnId,
        open: &OpenTxn,
    ) -> Result<(), InvariantViolation> {
        if self.state.finished.contains_key(&txn_id) {
            return Err(InvariantViolation(format!(
                "{txn_id} is both open and finished"
            )));
        }
        for (member, node) in &open.members {
            let held = self
                .state
                .nodes
                .get(node)
                .and_then(|entry| entry.usage.pods.get(member))
                .is_some_and(|slot| slot.state == SlotState::Reserved { txn_id });
            if !held {
                return Err(InvariantViolation(format!(
                    "{txn_id} lists {member} on {node}, which does not hold it"
                )));
            }
        }
        for (victim, displaced) in &open.displaced {
            if self.index.locations.contains_key(victim) {
                return Err(InvariantViolation(format!(
                    "{txn_id} displaced {victim}, which is also held"
                )));
            }
            let room_held = open.members.values().any(|node| *node == displaced.node);
            if !room_held {
                return Err(InvariantViolation(format!(
                    "{txn_id} displaced {victim} from {}, where it holds nothing",
                    displaced.node
                )));
            }
        }
        Ok(())
    }

    /// I1 for network-attached devices, and every hold in step with its transaction.
    pub(super) fn check_network(&self) -> Result<(), InvariantViolation> {
        let network = &self.state.network;
        network.check().map_err(InvariantViolation)?;
        for (member, slot) in network.holds() {
            let Some(txn_id) = slot.state.txn_id() else {
                continue;
            };
            let listed = self
                .state
                .open
                .get(&txn_id)
                .is_some_and(|open| open.network.contains(member));
            if slot.state.is_reserved() != listed {
                return Err(InvariantViolation(format!(
                    "network hold of {member} disagrees with {txn_id}"
                )));
            }
        }
        for (txn_id, open) in &self.state.open {
            if let Some(member) = open.network.iter().find(|m| {
                network.hold_of(m).map(|s| s.state) != Some(SlotState::Reserved { txn_id: *txn_id })
            }) {
                return Err(InvariantViolation(format!(
                    "{txn_id} lists network devices of {member}, which are not held for it"
                )));
            }
        }
        Ok(())
    }

    pub(super) fn check_evicting(&self) -> Result<(), InvariantViolation> {
        match self
            .state
            .evicting
            .iter()
            .find(|(_, v)| self.state.open.contains_key(&v.txn_id))
        {
            Some((victim, v)) => Err(InvariantViolation(format!(
                "{victim} is evicting for {}, which is still open",
                v.txn_id
            ))),
            None => Ok(()),
        }
    }

    pub(super) fn check_records(&self) -> Result<(), InvariantViolation> {
        if self.state.finished.len() > FINISHED_TXNS_MAX {
            return Err(InvariantViolation("too many finished records".to_string()));
        }
        if self
            .state
            .finished
            .values()
            .any(|done| done.seq >= self.state.next_seq)
        {
            return Err(InvariantViolation(
                "finished record from the future".to_string(),
            ));
        }
        if self.index.finish_order.len() != self.state.finished.len() {
            return Err(InvariantViolation(
                "two finished records share a sequence number".to_string(),
            ));
        }
        let slots: usize = self.state.nodes.iter().map(|e| e.usage.pods.len()).sum();
        if self.index.locations.len() != slots {
            return Err(InvariantViolation(
                "a member is held on two nodes".to_string(),
            ));
        }
        if Indexes::build(&self.state) != self.index {
            return Err(InvariantViolation(
                "derived indexes out of step".to_string(),
            ));
        }
        Ok(())
    }
}
