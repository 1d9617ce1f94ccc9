//! Nodes: registration, removal, leases, heartbeats and the pods the kubelet reports.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    /// The entry of `node`, or `UnknownNode`.
    pub(super) fn known_node(&self, node: &str) -> Result<&NodeEntry, LedgerError> {
        self.state
            .nodes
            .get(node)
            .ok_or_else(|| LedgerError::UnknownNode {
                name: node.to_string(),
            })
    }

    /// Changes the entry of `node` (keeping the indexes in step), or `UnknownNode`.
    pub(super) fn update_known<R>(
        &mut self,
        node: &str,
        change: impl FnOnce(&mut NodeEntry) -> R,
    ) -> Result<R, LedgerError> {
        self.state
            .nodes
            .update(node, change)
            .ok_or_else(|| LedgerError::UnknownNode {
                name: node.to_string(),
            })
    }

    pub(super) fn register_node(&mut self, node: &Node) -> Result<LedgerReply, LedgerError> {
        self.refuse_moved_node(&node.name)?;
        node.validate(&FieldPath::new("node"))
            .map_err(|e| LedgerError::InvalidNode {
                message: e.to_string(),
            })?;
        let change = match self.state.nodes.get(&node.name) {
            Some(entry) => {
                if let Some(resource) = entry.usage.held().shortfall(&node.allocatable) {
                    return Err(LedgerError::AllocatableBelowUsage {
                        name: node.name.clone(),
                        resource,
                    });
                }
                self.state.nodes.replace_node(node);
                NodeChange::Updated
            }
            None => {
                let moving = self.fence_of(&node.name);
                self.state.nodes.insert(NodeEntry {
                    node: node.clone(),
                    usage: NodeUsage::default(),
                    lease: None,
                    moving,
                });
                NodeChange::Added
            }
        };
        Ok(LedgerReply::NodeRegistered {
            name: node.name.clone(),
            change,
        })
    }

    pub(super) fn add_node(&mut self, node: &Node) -> Result<LedgerReply, LedgerError> {
        self.refuse_moved_node(&node.name)?;
        let Some(entry) = self.state.nodes.get(&node.name) else {
            return self.register_node(node);
        };
        let differences = entry.node.differences(node);
        if differences.is_empty() {
            // The same node again: nothing changes (its readiness stays the lease's).
            node.validate(&FieldPath::new("node"))
                .map_err(|e| LedgerError::InvalidNode {
                    message: e.to_string(),
                })?;
            return Ok(LedgerReply::NodeRegistered {
                name: node.name.clone(),
                change: NodeChange::Unchanged,
            });
        }
        Err(LedgerError::NodeDiffers {
            name: node.name.clone(),
            differences: differences.join(", "),
        })
    }

    pub(super) fn remove_node(&mut self, name: &str) -> Result<LedgerReply, LedgerError> {
        let presence = match self.state.nodes.get(name) {
            None => Presence::Absent,
            Some(entry) if entry.usage.pods.values().any(|s| s.state.is_gangway()) => {
                let pods = entry
                    .usage
                    .pods
                    .values()
                    .filter(|s| s.state.is_gangway())
                    .count();
                return Err(LedgerError::NodeInUse {
                    name: name.to_string(),
                    pods: pods as u64,
                });
            }
            Some(entry) => {
                let observed: Vec<MemberKey> = entry.usage.pods.keys().cloned().collect();
                for key in &observed {
                    self.index.locations.remove(key);
                }
                if let Some(lease) = self.state.nodes.remove(name).and_then(|e| e.lease) {
                    self.index
                        .leases
                        .remove(&(lease.until_ms(), name.to_string()));
                }
                self.index.disconnected.remove(name);
                Presence::Removed
            }
        };
        Ok(LedgerReply::NodeRemoved {
            name: name.to_string(),
            presence,
        })
    }

    /// Replaces the node's observed pods: gone or changed ones are taken out first, then
    /// new or changed ones recorded (unchecked, see [`NodeUsage::observe`]).
    pub(super) fn set_observed_pods(
        &mut self,
        node: &str,
        pods: &[ObservedPod],
    ) -> Result<LedgerReply, LedgerError> {
        let entry = self.known_node(node)?;
        validate_observed(node, pods)?;
        let wanted: BTreeMap<MemberKey, &ObservedPod> =
            pods.iter().map(|p| (p.member_key(), p)).collect();
        let stale: Vec<MemberKey> = entry
            .usage
            .pods
            .iter()
            .filter(|(_, slot)| !slot.state.is_gangway())
            .filter(|(key, slot)| wanted.get(*key).is_none_or(|p| p.pod != slot.pod))
            .map(|(key, _)| key.clone())
            .collect();
        let fresh: Vec<(MemberKey, &ObservedPod)> = wanted
            .into_iter()
            .filter(|(key, _)| !entry.usage.pods.contains_key(key) || stale.contains(key))
            .collect();
        for key in &stale {
            self.take_member(key);
        }
        let mut conflicts = Vec::new();
        for (key, observed) in &fresh {
            // A uid is on one node at a time: a report from its new node moves it.
            if self.index.locations.get(key).is_some_and(|n| n != node) {
                self.take_member(key);
            }
            let left_out = self.state.nodes.update(node, |entry| {
                entry.usage.observe(key.clone(), observed.pod.clone())
            });
            self.index.locations.insert(key.clone(), node.to_string());
            if let Some(left_out) = left_out.filter(|c| !c.is_empty()) {
                conflicts.push((observed.uid.clone(), left_out));
            }
        }
        Ok(LedgerReply::ObservedPodsSet {
            node: node.to_string(),
            added: fresh.len() as u32,
            removed: stale.len() as u32,
            conflicts,
        })
    }
}
