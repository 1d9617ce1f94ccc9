//! A shard's side of a shard move (docs/ARCHITECTURE.md §3a): fencing nodes, handing
//! them off with everything they hold, adopting another shard's parcel, and the
//! tombstones that keep a moved node or member from being recreated or answered
//! "absent" here.
//!
//! Invariants: a node is in at most one of this shard's node table and its moved
//! tombstones; a handoff takes nodes only when no open reservation holds anything on
//! them (so the parcel holds committed, bound and observed slots only, and no
//! transaction is split between a reservation here and slots there); a parcel is kept
//! until `DropParcel`, so a retried handoff answers the same parcel; an adoption takes
//! every node of the parcel or none. Called by [`super::ShardLedger::apply`].

use std::collections::{BTreeMap, BTreeSet};

use super::{Indexes, LedgerError, LedgerReply, MemberKey, NodeEntry, Parcel, Presence};
use super::{ShardLedger, MOVED_MEMBERS_MAX, MOVE_NODES_MAX};

/// Most adopted moves remembered for idempotent retries of `Adopt`.
pub const ADOPTED_MOVES_MAX: usize = 1_024;

impl ShardLedger {
    /// Refuses an operation that would recreate a node that moved away.
    pub(super) fn refuse_moved_node(&self, name: &str) -> Result<(), LedgerError> {
        match self.state.moved_nodes.get(name) {
            Some(to) => Err(LedgerError::NodeMoved {
                name: name.to_string(),
                to: *to,
            }),
            None => Ok(()),
        }
    }

    /// Refuses an operation on a member that moved away with its node and holds nothing
    /// here (never "absent": a releaser routed by an old placement must not confirm a
    /// release here).
    pub(super) fn refuse_moved_member(&self, member: &MemberKey) -> Result<(), LedgerError> {
        // Held here (a slot, or network devices every shard holds): this shard answers.
        let network = &self.state.network;
        let held = self.index.locations.contains_key(member)
            || network.hold_of(member).is_some()
            || network.consumers().any(|(m, _)| m == member);
        if held {
            return Ok(());
        }
        match self.state.moved_members.get(member) {
            Some((_, to)) => Err(LedgerError::MemberMoved {
                member: member.clone(),
                to: *to,
            }),
            None => Ok(()),
        }
    }

    /// Nodes fenced by `move_id` (registered here or not), in name order.
    fn fenced_by(&self, move_id: u64) -> Vec<String> {
        self.state
            .fences
            .iter()
            .filter(|(_, m)| **m == move_id)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The move fencing a node `name` registered now, if any (a node registered, or
    /// removed and registered again, after the fence is fenced as well).
    pub(super) fn fence_of(&self, name: &str) -> Option<u64> {
        self.state.fences.get(name).copied()
    }

    pub(super) fn fence_nodes(
        &mut self,
        move_id: u64,
        nodes: &[String],
    ) -> Result<LedgerReply, LedgerError> {
        if nodes.len() > MOVE_NODES_MAX {
            return Err(LedgerError::MoveTooLarge { nodes: nodes.len() });
        }
        if self.state.parcels.contains_key(&move_id) {
            return Ok(LedgerReply::Fenced {
                move_id,
                nodes: Vec::new(),
            });
        }
        if self.state.lifted.contains(&move_id) {
            return Err(LedgerError::MoveEnded { move_id });
        }
        // Fenced by name, whether the node is registered here yet or not: one registered
        // (or removed and registered again) before the handoff is fenced too, and moves.
        for name in nodes {
            self.refuse_moved_node(name)?;
            if let Some(other) = self.state.fences.get(name).filter(|m| **m != move_id) {
                return Err(LedgerError::NodeMoving {
                    name: name.clone(),
                    move_id: *other,
                });
            }
        }
        for name in nodes {
            self.state.fences.insert(name.clone(), move_id);
            self.state
                .nodes
                .update(name, |entry| entry.moving = Some(move_id));
        }
        Ok(LedgerReply::Fenced {
            move_id,
            nodes: self.fenced_by(move_id),
        })
    }

    pub(super) fn unfence_nodes(&mut self, move_id: u64) -> LedgerReply {
        let nodes = self.fenced_by(move_id);
        for name in &nodes {
            self.state.fences.remove(name);
            self.state.nodes.update(name, |entry| entry.moving = None);
        }
        self.state.lifted.insert(move_id);
        while self.state.lifted.len() > ADOPTED_MOVES_MAX {
            self.state.lifted.pop_first();
        }
        LedgerReply::Unfenced { move_id, nodes }
    }

    pub(super) fn hand_off(&mut self, move_id: u64, to: u32) -> Result<LedgerReply, LedgerError> {
        if let Some(parcel) = self.state.parcels.get(&move_id) {
            return Ok(LedgerReply::HandedOff {
                parcel: parcel.clone(),
            });
        }
        // Every name fenced leaves (tombstoned); the ones registered here carry their
        // entries (none at all: an empty parcel).
        let names = self.fenced_by(move_id);
        let set: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        if let Some((txn_id, node)) = self.open_on(&set) {
            return Err(LedgerError::NodesBusy {
                move_id,
                node,
                txn_id,
            });
        }
        let mut parcel = Parcel {
            move_id,
            to,
            nodes: Vec::with_capacity(names.len()),
            evicting: BTreeMap::new(),
            names: names.clone(),
        };
        for name in &names {
            if let Some(mut entry) = self.state.nodes.remove(name) {
                entry.moving = None;
                parcel.nodes.push(entry);
            }
            self.state.fences.remove(name);
            self.state.moved_nodes.insert(name.clone(), to);
        }
        let evicting: Vec<MemberKey> = self
            .state
            .evicting
            .iter()
            .filter(|(_, v)| set.contains(v.node.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        for key in evicting {
            if let Some(v) = self.state.evicting.remove(&key) {
                parcel.evicting.insert(key, v);
            }
        }
        for entry in &parcel.nodes {
            for member in entry.usage.pods.keys() {
                self.state
                    .moved_members
                    .insert(member.clone(), (move_id, to));
            }
        }
        self.forget_oldest_moved_members();
        self.index = Indexes::build(&self.state);
        self.state.parcels.insert(move_id, parcel.clone());
        Ok(LedgerReply::HandedOff { parcel })
    }

    /// An open transaction holding anything on these nodes (a member reserved there,
    /// or a victim it displaced from there), with the node.
    fn open_on(&self, nodes: &BTreeSet<&str>) -> Option<(super::TxnId, String)> {
        self.state.open.iter().find_map(|(txn_id, open)| {
            open.members
                .values()
                .chain(open.displaced.values().map(|d| &d.node))
                .find(|node| nodes.contains(node.as_str()))
                .map(|node| (*txn_id, node.clone()))
        })
    }

    fn forget_oldest_moved_members(&mut self) {
        while self.state.moved_members.len() > MOVED_MEMBERS_MAX {
            let Some(oldest) = self.state.moved_members.values().map(|(m, _)| *m).min() else {
                return;
            };
            self.state.moved_members.retain(|_, (m, _)| *m != oldest);
        }
    }

    pub(super) fn adopt(&mut self, parcel: &Parcel) -> Result<LedgerReply, LedgerError> {
        let move_id = parcel.move_id;
        if self.state.adopted.contains(&move_id) {
            return Ok(LedgerReply::Adopted {
                move_id,
                nodes: parcel.nodes.len(),
            });
        }
        self.check_parcel(parcel)?;
        for name in &parcel.names {
            self.state.moved_nodes.remove(name);
        }
        for entry in &parcel.nodes {
            let name = entry.node.name.clone();
            self.state.moved_nodes.remove(&name);
            let mut entry: NodeEntry = entry.clone();
            entry.moving = None;
            self.state.nodes.insert(entry);
        }
        if !self.state.moved_members.is_empty() {
            for entry in &parcel.nodes {
                for member in entry.usage.pods.keys() {
                    self.state.moved_members.remove(member);
                }
            }
        }
        for (key, victim) in &parcel.evicting {
            self.state.evicting.insert(key.clone(), victim.clone());
        }
        self.state.adopted.insert(move_id);
        while self.state.adopted.len() > ADOPTED_MOVES_MAX {
            self.state.adopted.pop_first();
        }
        self.index = Indexes::build(&self.state);
        Ok(LedgerReply::Adopted {
            move_id,
            nodes: parcel.nodes.len(),
        })
    }

    /// Refuses a parcel that names a node or member this shard holds, holds an open
    /// reservation, or is larger than a move may be.
    fn check_parcel(&self, parcel: &Parcel) -> Result<(), LedgerError> {
        let refused = |message: String| LedgerError::ParcelRefused {
            move_id: parcel.move_id,
            message,
        };
        if parcel.nodes.len() > MOVE_NODES_MAX {
            return Err(LedgerError::MoveTooLarge {
                nodes: parcel.nodes.len(),
            });
        }
        let mut names = BTreeSet::new();
        for entry in &parcel.nodes {
            let name = &entry.node.name;
            if !names.insert(name.as_str()) {
                return Err(refused(format!("nodes: {name} appears twice")));
            }
            if self.state.nodes.get(name).is_some() {
                return Err(refused(format!("nodes: {name} is already on this shard")));
            }
            for (member, slot) in &entry.usage.pods {
                if slot.state.is_reserved() {
                    return Err(refused(format!(
                        "nodes: {name}: member {member} is reserved, not committed"
                    )));
                }
                if let Some(txn_id) = slot.state.txn_id() {
                    if self.state.open.contains_key(&txn_id) {
                        return Err(refused(format!(
                            "nodes: {name}: member {member} belongs to {txn_id}, open here"
                        )));
                    }
                }
                if let Some(node) = self.index.locations.get(member) {
                    return Err(refused(format!(
                        "nodes: {name}: member {member} is held here on node {node}"
                    )));
                }
            }
            let sums = entry.usage.recomputed();
            if sums != entry.usage.sums() {
                return Err(refused(format!(
                    "nodes: {name}: usage sums differ from its slots"
                )));
            }
        }
        if let Some((key, v)) = parcel
            .evicting
            .iter()
            .find(|(_, v)| !names.contains(v.node.as_str()))
        {
            return Err(refused(format!(
                "evicting: {key} runs on {}, not in the parcel",
                v.node
            )));
        }
        Ok(())
    }

    pub(super) fn drop_parcel(&mut self, move_id: u64) -> LedgerReply {
        let presence = match self.state.parcels.remove(&move_id) {
            Some(_) => Presence::Removed,
            None => Presence::Absent,
        };
        LedgerReply::ParcelDropped { move_id, presence }
    }

    /// The parcels handed off and not yet dropped.
    pub fn parcels(&self) -> &BTreeMap<u64, Parcel> {
        &self.state.parcels
    }

    /// Where nodes that moved away went.
    pub fn moved_nodes(&self) -> &BTreeMap<String, u32> {
        &self.state.moved_nodes
    }
}
