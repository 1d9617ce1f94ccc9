//! Reads of the ledger that change nothing.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    /// A node and its usage.
    pub fn node(&self, name: &str) -> Option<&NodeEntry> {
        self.state.nodes.get(name)
    }

    /// All nodes with usage, in name order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeEntry> {
        self.state.nodes.iter()
    }

    /// The network-attached pools and their holds.
    pub fn network_pools(&self) -> &NetworkPools {
        &self.state.network
    }

    /// Open transactions, by id.
    pub fn open_txns(&self) -> &BTreeMap<TxnId, OpenTxn> {
        &self.state.open
    }

    /// Victims of committed preemptions whose pods may still run, by member.
    pub fn evicting(&self) -> &BTreeMap<MemberKey, EvictingVictim> {
        &self.state.evicting
    }

    /// The (transaction, node) pairs where a committed preemption's victims may still
    /// run: that transaction's members there wait to be bound until they are gone.
    pub fn victims_running(&self) -> BTreeSet<(TxnId, &str)> {
        self.state
            .evicting
            .values()
            .map(|v| (v.txn_id, v.node.as_str()))
            .collect()
    }

    /// How a remembered transaction ended.
    pub fn outcome(&self, txn_id: TxnId) -> Option<TxnOutcome> {
        self.state.finished.get(&txn_id).map(|done| done.outcome)
    }

    /// The device classes, by name.
    pub fn device_classes(&self) -> &BTreeMap<String, DeviceClass> {
        &self.state.device_classes
    }

    /// Who holds `device` on `node`: each reserved, committed or bound member with the
    /// allocation that names it (admin access and detached allocations included).
    pub fn holders_of(
        &self,
        node: &str,
        device: &DeviceId,
    ) -> Vec<(&MemberKey, &crate::model::claim::DeviceAllocation)> {
        let Some(entry) = self.state.nodes.get(node) else {
            return Vec::new();
        };
        entry
            .usage
            .pods
            .iter()
            .flat_map(|(member, slot)| {
                slot.pod
                    .devices
                    .iter()
                    .filter(|a| a.device == *device)
                    .map(move |a| (member, a))
            })
            .collect()
    }

    /// Number of remembered finished transactions.
    pub fn finished_count(&self) -> usize {
        self.state.finished.len()
    }

    /// The node holding a member, if any.
    pub fn member_node(&self, member: &MemberKey) -> Option<&str> {
        self.index.locations.get(member).map(String::as_str)
    }

    /// A member's slot, if held.
    pub fn slot(&self, member: &MemberKey) -> Option<&PodSlot> {
        let node = self.index.locations.get(member)?;
        self.state.nodes.get(node)?.usage.pods.get(member)
    }

    /// Sum of reserved footprints over all nodes.
    pub fn total_reserved(&self) -> Resources {
        self.state
            .nodes
            .iter()
            .fold(Resources::zero(), |acc, entry| {
                acc.saturating_add(&entry.usage.reserved)
            })
    }
}
