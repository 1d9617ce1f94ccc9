//! The shard map: which shard owns each node, each topology domain's home shard, and
//! the shard moves that change them (docs/ARCHITECTURE.md §3a).
//!
//! A node's shard is decided once, in apply, from the log: a node of a known domain
//! goes to its domain's home; the first node of a new domain (or a node without one)
//! goes to the shard with the fewest nodes, ties to the lowest id. It changes only
//! through a move, whose meta steps are `BeginMove` (the nodes and their source
//! shards are fixed), `SealMove` (refused while a transaction involving a source or
//! the target is undecided or unacknowledged: after it, every slot on the fenced
//! nodes is committed, so nothing of a move's nodes is in flight), `CommitMove` (the
//! map and every placement on the nodes name the target; the domain's home follows
//! when all its nodes are there) and `EndMove`. At most [`MOVES_ACTIVE_MAX`] move runs at a
//! time. The coordinator drives the shards' side (fence, handoff, adopt, drop) between
//! these steps. Called by [`super::MetaState::apply`] and `query`.

use crate::model::node::Labels;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{rejected, MetaCommand, MetaReply, MetaState, RejectionKind};
use crate::ledger::command::MOVE_NODES_MAX;
use crate::ledger::TxnId;

/// Most shards a cluster may have: the shard map, `--shards`, `gangway dev` and
/// `GrowShards` all hold to it.
pub const SHARDS_MAX: u32 = 256;

/// Moves running at once: one, so that a move's seal never waits on another's.
pub const MOVES_ACTIVE_MAX: usize = 1;
/// Finished moves kept for `gangctl shards` (the oldest forgotten first).
pub const MOVES_KEPT_MAX: usize = 32;

/// Where a move is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MovePhase {
    /// Recorded: the sources fence the nodes; the coordinator seals once nothing on the
    /// sources or the target is in flight.
    Begun,
    /// No transaction on the sources or the target is in flight: the sources hand the
    /// nodes off and the target adopts them.
    Sealed,
    /// The map names the target; the sources drop their parcels.
    Committed,
    /// Finished: the nodes are the target's.
    Done,
    /// Given up before the seal: the sources lift the fence.
    Cancelling,
    /// Given up; every fence was lifted.
    Cancelled,
}

/// One shard move: nodes leaving their sources for one target shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMove {
    /// Its id (the shards' `move_id`).
    pub id: u64,
    /// The target shard.
    pub to: u32,
    /// Source shard → the nodes leaving it, in name order.
    pub sources: BTreeMap<u32, Vec<String>>,
    /// Where it is.
    pub phase: MovePhase,
    /// When it was begun (proposer's clock).
    pub begun_at_ms: u64,
    /// When it ended (proposer's clock; 0 while running).
    #[serde(default)]
    pub ended_at_ms: u64,
    /// Why it was begun or given up, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl ShardMove {
    /// Every node it moves.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.sources.values().flatten()
    }

    /// Whether it still runs.
    pub fn is_active(&self) -> bool {
        matches!(
            self.phase,
            MovePhase::Begun | MovePhase::Sealed | MovePhase::Committed | MovePhase::Cancelling
        )
    }
}

/// What a move takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveTarget {
    /// The nodes of a topology domain not on the target yet (at most
    /// [`MOVE_NODES_MAX`] of them, in name order: the reply says how many are left).
    Domain(String),
    /// These nodes.
    Nodes(Vec<String>),
}

/// One shard's share of the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardShare {
    /// The shard.
    pub shard: u32,
    /// Its nodes.
    pub nodes: u64,
    /// Domain → its nodes on this shard.
    pub domains: BTreeMap<String, u64>,
    /// Domains whose home it is (their new nodes come here).
    pub homes: Vec<String>,
}

/// One node of the map, for rebalancing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedNode {
    /// Node name.
    pub name: String,
    /// Its shard.
    pub shard: u32,
    /// Its topology domain, if it was registered with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// Nodes per shard, derived from the map (never encoded: a snapshot written before it
/// existed restores the same counts). Compared equal always, being a cache.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeCounts(Option<Vec<u64>>);

impl PartialEq for NodeCounts {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The shard a release before the recorded map gave a new node (FNV-1a of its topology
/// domain, or of its name without one): what a replica writing for the first rollout
/// of an upgrade proposes (`AssignNode`), so that replicas of that release agree.
pub fn hashed_shard(name: &str, domain: Option<&str>, shards: u32) -> u32 {
    let key = domain.unwrap_or(name);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards.max(1))) as u32 + 1
}

/// The command that gives `node` its shard: `PlaceNode`, or for a replica writing for
/// the first rollout of an upgrade (`legacy`), `AssignNode` with the hash rule's shard,
/// which a release before the recorded map applies alike.
pub fn shard_command(
    node: &str,
    domain: Option<String>,
    legacy: bool,
    shards: u32,
    at_ms: u64,
) -> MetaCommand {
    if legacy {
        return MetaCommand::AssignNode {
            node: node.to_string(),
            shard: hashed_shard(node, domain.as_deref(), shards),
            at_ms,
        };
    }
    MetaCommand::PlaceNode {
        node: node.to_string(),
        domain,
        at_ms,
    }
}

/// A node's topology domain: the value of its `topology_label`, if set and present.
pub fn domain_of(labels: &Labels, topology_label: Option<&str>) -> Option<String> {
    topology_label
        .and_then(|l| labels.get(l))
        .filter(|v| !v.is_empty())
        .map(|v| v.to_string())
}

impl MetaState {
    /// Nodes per shard (index = shard id), counted once and kept up to date.
    fn counts(&mut self) -> &mut Vec<u64> {
        let shards = self.shards as usize;
        let map = &self.shard_map;
        self.node_counts.0.get_or_insert_with(|| {
            let mut counts = vec![0; shards + 1];
            for shard in map.values() {
                if let Some(c) = counts.get_mut(*shard as usize) {
                    *c += 1;
                }
            }
            counts
        })
    }

    fn count_move(&mut self, from: u32, to: u32, n: u64) {
        let counts = self.counts();
        if let Some(c) = counts.get_mut(from as usize) {
            *c = c.saturating_sub(n);
        }
        if let Some(c) = counts.get_mut(to as usize) {
            *c += n;
        }
    }

    /// The shard with the fewest nodes, ties to the lowest id.
    fn least_loaded(&mut self) -> u32 {
        let shards = self.shards.max(1);
        let counts = self.counts();
        (1..=shards)
            .min_by_key(|s| (counts.get(*s as usize).copied().unwrap_or(0), *s))
            .unwrap_or(1)
    }

    /// `GrowShards`: the count only rises. The count it already has answers as it is,
    /// so a retried grow is harmless.
    pub(super) fn grow_shards(&mut self, shards: u32, voters: &BTreeMap<u64, String>) -> MetaReply {
        if shards < self.shards {
            return rejected(format!(
                "shards: {shards} is below the current count {}; the count only grows \
                 (move a shard's nodes to others instead)",
                self.shards
            ));
        }
        if shards > SHARDS_MAX {
            return rejected(format!(
                "shards: {shards} is above the most a cluster may have ({})",
                SHARDS_MAX
            ));
        }
        if shards == self.shards {
            return self.shard_set();
        }
        if voters.is_empty() || voters.iter().any(|(id, addr)| *id == 0 || addr.is_empty()) {
            return rejected(
                "voters: the added shards need at least one voter, each with an id >= 1 and an address",
            );
        }
        // Counted over the old shards first, then widened, so no node is counted twice.
        self.counts();
        for shard in self.shards + 1..=shards {
            self.added_shards.insert(shard, voters.clone());
        }
        self.shards = shards;
        self.counts().resize(shards as usize + 1, 0);
        self.shard_set()
    }

    /// The shard count and the voters of the shards added on a live cluster.
    pub(super) fn shard_set(&self) -> MetaReply {
        MetaReply::ShardSet {
            shards: self.shards,
            added: self.added_shards.clone(),
        }
    }

    /// `AssignNode` (entries written before domains were recorded): the proposer chose.
    pub(super) fn assign_node(&mut self, node: &str, shard: u32) -> MetaReply {
        // Counted before the map changes, so a count built now does not see the node twice.
        self.counts();
        if node.is_empty() {
            return rejected("node: must not be empty");
        }
        if shard == 0 || shard > self.shards {
            return rejected(format!("shard: {shard} is not in 1..={}", self.shards));
        }
        if let Some(shard) = self.shard_map.get(node) {
            return MetaReply::Shard { shard: *shard };
        }
        self.shard_map.insert(node.to_string(), shard);
        self.count_move(0, shard, 1);
        MetaReply::Shard { shard }
    }

    /// `PlaceNode`: the node's shard, chosen here once.
    pub(super) fn place_node(&mut self, node: &str, domain: Option<&str>) -> MetaReply {
        self.counts();
        if node.is_empty() {
            return rejected("node: must not be empty");
        }
        let domain = domain.filter(|d| !d.is_empty());
        if let Some(shard) = self.shard_map.get(node).copied() {
            // A node assigned before domains were recorded learns its domain now; a domain
            // first seen so takes the node's shard as its home, keeping its nodes together.
            if let Some(d) = domain.filter(|_| !self.node_domains.contains_key(node)) {
                self.node_domains.insert(node.to_string(), d.to_string());
                self.domains.entry(d.to_string()).or_insert(shard);
            }
            return MetaReply::Shard { shard };
        }
        let shard = match domain.and_then(|d| self.domains.get(d)) {
            Some(home) => *home,
            None => self.least_loaded(),
        };
        if let Some(d) = domain {
            self.domains.entry(d.to_string()).or_insert(shard);
            self.node_domains.insert(node.to_string(), d.to_string());
        }
        self.shard_map.insert(node.to_string(), shard);
        self.count_move(0, shard, 1);
        MetaReply::Shard { shard }
    }

    /// The nodes a move of `target` to `to` takes, with the nodes still left after it.
    fn move_nodes(&self, target: &MoveTarget, to: u32) -> Result<(Vec<String>, u64), String> {
        match target {
            MoveTarget::Domain(domain) => {
                if !self.domains.contains_key(domain) {
                    return Err(format!("domain: no node was registered in domain {domain}"));
                }
                let mut nodes: Vec<String> = self
                    .node_domains
                    .iter()
                    .filter(|(n, d)| *d == domain && self.shard_map.get(*n) != Some(&to))
                    .map(|(n, _)| n.clone())
                    .collect();
                let left = nodes.len().saturating_sub(MOVE_NODES_MAX) as u64;
                nodes.truncate(MOVE_NODES_MAX);
                Ok((nodes, left))
            }
            MoveTarget::Nodes(nodes) => {
                if nodes.len() > MOVE_NODES_MAX {
                    return Err(format!(
                        "nodes: {} in one move, at most {MOVE_NODES_MAX}",
                        nodes.len()
                    ));
                }
                let mut seen = BTreeSet::new();
                for n in nodes {
                    if !seen.insert(n) {
                        return Err(format!("nodes: {n} appears twice"));
                    }
                    match self.shard_map.get(n) {
                        None => return Err(format!("nodes: {n} has no shard")),
                        Some(s) if *s == to => {
                            return Err(format!("nodes: {n} is on shard {to} already"))
                        }
                        Some(_) => {}
                    }
                }
                Ok((nodes.clone(), 0))
            }
        }
    }

    /// `BeginMove`: records a move of `target` to shard `to`.
    pub(super) fn begin_move(
        &mut self,
        target: &MoveTarget,
        to: u32,
        reason: &str,
        at_ms: u64,
    ) -> MetaReply {
        if to == 0 || to > self.shards {
            return rejected(format!("to: shard {to} is not in 1..={}", self.shards));
        }
        if let Some(running) = self.moves.values().find(|m| m.is_active()) {
            return MetaReply::Rejected {
                reason: format!(
                    "move {} (to shard {}) is still running; at most {MOVES_ACTIVE_MAX} at a time",
                    running.id, running.to
                ),
                kind: RejectionKind::Conflict,
            };
        }
        let (nodes, left) = match self.move_nodes(target, to) {
            Ok(found) => found,
            Err(reason) => return rejected(reason),
        };
        if nodes.is_empty() {
            return rejected(format!("nodes: every node named is on shard {to} already"));
        }
        let mut sources: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for n in nodes {
            if let Some(s) = self.shard_map.get(&n) {
                sources.entry(*s).or_default().push(n);
            }
        }
        for list in sources.values_mut() {
            list.sort();
        }
        self.next_move += 1;
        let m = ShardMove {
            id: self.next_move,
            to,
            sources,
            phase: MovePhase::Begun,
            begun_at_ms: at_ms,
            ended_at_ms: 0,
            reason: reason.to_string(),
        };
        self.moves.insert(m.id, m.clone());
        self.forget_old_moves();
        MetaReply::MoveBegun {
            shard_move: Box::new(m),
            left,
        }
    }

    fn forget_old_moves(&mut self) {
        while self.moves.values().filter(|m| !m.is_active()).count() > MOVES_KEPT_MAX {
            let Some(oldest) = self.moves.values().find(|m| !m.is_active()).map(|m| m.id) else {
                return;
            };
            self.moves.remove(&oldest);
        }
    }

    fn move_in(&mut self, id: u64, phases: &[MovePhase]) -> Result<&mut ShardMove, MetaReply> {
        let Some(m) = self.moves.get_mut(&id) else {
            return Err(MetaReply::Rejected {
                reason: format!("move: no shard move {id}"),
                kind: RejectionKind::NotFound,
            });
        };
        if !phases.contains(&m.phase) {
            return Err(rejected(format!(
                "move: shard move {id} is {:?}, not {phases:?}",
                m.phase
            )));
        }
        Ok(m)
    }

    /// A transaction involving one of `shards` that is undecided or not yet applied
    /// by every participant.
    fn in_flight_on(&self, shards: &BTreeSet<u32>) -> Option<TxnId> {
        self.txns
            .values()
            .find(|t| {
                let involved = || t.participants.iter().any(|p| shards.contains(p));
                (t.decision.is_none() || !t.unacked.is_empty()) && involved()
            })
            .map(|t| t.txn)
    }

    /// The sealed move whose nodes include `node`: between its seal and its commit a
    /// member there can be released nowhere (its source may have handed it off, its
    /// target not yet be named), so releases wait.
    pub fn sealed_move_of(&self, node: &str) -> Option<&ShardMove> {
        self.moves
            .values()
            .find(|m| m.phase == MovePhase::Sealed && m.nodes().any(|n| n == node))
    }

    /// `ReleaseMembers` of members on a sealed move's nodes: refused (the caller retries
    /// once the move committed), naming the member and the move.
    pub(super) fn release_waits_for_move(
        &self,
        seq: super::GroupSeq,
        members: &[String],
    ) -> Option<MetaReply> {
        if !self.moves.values().any(|m| m.phase == MovePhase::Sealed) {
            return None;
        }
        let g = self.groups.get(&seq)?;
        members.iter().enumerate().find_map(|(i, name)| {
            let p = g.placements.get(name).filter(|_| !g.releasing.contains_key(name))?;
            let m = self.sealed_move_of(&p.node)?;
            Some(MetaReply::Rejected {
                reason: format!(
                    "members[{i}]: {name}'s node {} is moving to shard {} (shard move {}); retry once it is done",
                    p.node, m.to, m.id
                ),
                kind: RejectionKind::Busy,
            })
        })
    }

    /// A release under way on the move's nodes (a group `Releasing` with placements
    /// there, or members being released there), which must end before the seal.
    fn release_on(&self, m: &ShardMove) -> Option<super::GroupSeq> {
        let nodes: BTreeSet<&String> = m.nodes().collect();
        self.groups
            .values()
            .find(|g| {
                let releasing = matches!(g.state, super::GroupState::Releasing { .. });
                let on_nodes =
                    |ps: &super::MemberPlacements| ps.values().any(|p| nodes.contains(&p.node));
                (releasing && on_nodes(&g.placements)) || on_nodes(&g.releasing)
            })
            .map(|g| g.seq)
    }

    /// Why move `id` cannot be sealed now (a transaction on a source or the target in
    /// flight, a release on its nodes under way), if it cannot.
    pub fn seal_blocker(&self, id: u64) -> Option<String> {
        let m = self.moves.get(&id)?;
        let shards: BTreeSet<u32> = m.sources.keys().copied().chain([m.to]).collect();
        if let Some(txn) = self.in_flight_on(&shards).filter(|_| !self.seal_unchecked) {
            return Some(format!(
                "move: {txn} on shards {shards:?} is still in flight; seal again once it is settled"
            ));
        }
        self.release_on(m).map(|seq| {
            format!("move: gang group {seq} is releasing members on its nodes; seal again once it is done")
        })
    }

    /// `SealMove`: refused while a transaction on a source or the target is in flight.
    pub(super) fn seal_move(&mut self, id: u64) -> MetaReply {
        match self.move_in(id, &[MovePhase::Begun, MovePhase::Sealed]) {
            Ok(m) if m.phase == MovePhase::Sealed => {
                return MetaReply::Move {
                    shard_move: Box::new(m.clone()),
                }
            }
            Ok(_) => {}
            Err(reply) => return reply,
        }
        if let Some(why) = self.seal_blocker(id) {
            return rejected(why);
        }
        match self.move_in(id, &[MovePhase::Begun]) {
            Ok(m) => {
                m.phase = MovePhase::Sealed;
                MetaReply::Move {
                    shard_move: Box::new(m.clone()),
                }
            }
            Err(reply) => reply,
        }
    }

    /// `CommitMove`: the nodes are the target's; so are their placements.
    pub(super) fn commit_move(&mut self, id: u64) -> MetaReply {
        let m = match self.move_in(id, &[MovePhase::Sealed, MovePhase::Committed]) {
            Ok(m) if m.phase == MovePhase::Committed => {
                return MetaReply::Move {
                    shard_move: Box::new(m.clone()),
                }
            }
            Ok(m) => {
                m.phase = MovePhase::Committed;
                m.clone()
            }
            Err(reply) => return reply,
        };
        self.counts();
        let mut moved: BTreeMap<&str, u32> = BTreeMap::new();
        for (from, nodes) in &m.sources {
            for n in nodes {
                moved.insert(n.as_str(), *from);
            }
        }
        for (from, nodes) in &m.sources {
            for n in nodes {
                self.shard_map.insert(n.clone(), m.to);
            }
            self.count_move(*from, m.to, nodes.len() as u64);
        }
        self.rehome_domains(&m);
        for g in self.groups.values_mut() {
            let mut changed = false;
            for p in g.placements.values_mut().chain(g.releasing.values_mut()) {
                let Some(from) = moved.get(p.node.as_str()) else {
                    continue;
                };
                p.shard = m.to;
                if !p.network_shards.is_empty() {
                    let mut others: BTreeSet<u32> = p.network_shards.iter().copied().collect();
                    others.insert(*from);
                    others.remove(&m.to);
                    p.network_shards = others.into_iter().collect();
                }
                changed = true;
            }
            if changed {
                g.bump(&mut self.last_version);
            }
        }
        MetaReply::Move {
            shard_move: Box::new(m),
        }
    }

    /// A domain all of whose nodes are on the move's target now gets it as its home.
    fn rehome_domains(&mut self, m: &ShardMove) {
        let domains: BTreeSet<&String> =
            m.nodes().filter_map(|n| self.node_domains.get(n)).collect();
        let mut homes = Vec::new();
        for d in domains {
            let all_there = self
                .node_domains
                .iter()
                .filter(|(_, nd)| *nd == d)
                .all(|(n, _)| self.shard_map.get(n) == Some(&m.to));
            if all_there {
                homes.push(d.clone());
            }
        }
        for d in homes {
            self.domains.insert(d, m.to);
        }
    }

    /// `EndMove`: the sources dropped their parcels (a committed move is done), or lifted
    /// their fences (a cancelling one is cancelled).
    pub(super) fn end_move(&mut self, id: u64, at_ms: u64) -> MetaReply {
        let phases = [
            MovePhase::Committed,
            MovePhase::Done,
            MovePhase::Cancelling,
            MovePhase::Cancelled,
        ];
        match self.move_in(id, &phases) {
            Ok(m) => {
                let ended = match m.phase {
                    MovePhase::Committed => Some(MovePhase::Done),
                    MovePhase::Cancelling => Some(MovePhase::Cancelled),
                    _ => None,
                };
                if let Some(phase) = ended {
                    m.phase = phase;
                    m.ended_at_ms = at_ms;
                }
                let reply = MetaReply::Move {
                    shard_move: Box::new(m.clone()),
                };
                self.forget_old_moves();
                reply
            }
            Err(reply) => reply,
        }
    }

    /// `CancelMove`: given up before the seal (after it, a source may have handed its
    /// nodes off: only forward). The move stays running (`Cancelling`) until the sources
    /// lifted its fence (`EndMove`), so no fence outlives it.
    pub(super) fn cancel_move(&mut self, id: u64, reason: &str, _at_ms: u64) -> MetaReply {
        let phases = [
            MovePhase::Begun,
            MovePhase::Cancelling,
            MovePhase::Cancelled,
        ];
        match self.move_in(id, &phases) {
            Ok(m) => {
                if m.phase == MovePhase::Begun {
                    m.phase = MovePhase::Cancelling;
                    m.reason = reason.to_string();
                }
                MetaReply::Move {
                    shard_move: Box::new(m.clone()),
                }
            }
            Err(reply) => reply,
        }
    }

    /// The moves kept, running ones included, in id order.
    pub fn moves(&self) -> Vec<ShardMove> {
        self.moves.values().cloned().collect()
    }

    /// Each shard's share of the map.
    pub fn shares(&self) -> Vec<ShardShare> {
        let mut shares: Vec<ShardShare> = (1..=self.shards)
            .map(|shard| ShardShare {
                shard,
                nodes: 0,
                domains: BTreeMap::new(),
                homes: Vec::new(),
            })
            .collect();
        for (node, shard) in &self.shard_map {
            let Some(share) = shares.get_mut((*shard as usize).wrapping_sub(1)) else {
                continue;
            };
            share.nodes += 1;
            if let Some(d) = self.node_domains.get(node) {
                *share.domains.entry(d.clone()).or_default() += 1;
            }
        }
        for (d, home) in &self.domains {
            if let Some(share) = shares.get_mut((*home as usize).wrapping_sub(1)) {
                share.homes.push(d.clone());
            }
        }
        shares
    }

    /// Every node with its shard and domain, in name order.
    pub fn mapped_nodes(&self) -> Vec<MappedNode> {
        self.shard_map
            .iter()
            .map(|(name, shard)| MappedNode {
                name: name.clone(),
                shard: *shard,
                domain: self.node_domains.get(name).cloned(),
            })
            .collect()
    }
}
