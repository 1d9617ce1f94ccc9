//! Nodes: Kubernetes nodes registered with and removed from their shards, and the
//! ingest's map of node to shard kept in step with shard moves. Part of [`Ingest`]'s
//! `impl`.

use super::*;

impl Ingest {
    /// Points the nodes of shard moves finished since the last pass at their new shard,
    /// and writes their observed pods and rule taints there again (the old shard no longer
    /// has them). With moves forgotten in between, every known node is looked up again.
    pub(super) fn follow_moves(&mut self) {
        let moves = match self.groups.meta_query_local(&MetaQuery::Moves) {
            Ok(MetaReply::Moves { moves }) => moves,
            _ => return,
        };
        let seen = self.memory.moves_seen;
        let newest = moves.iter().map(|m| m.id).max().unwrap_or(seen);
        if newest <= seen {
            return;
        }
        // Moves forgotten since the last pass: the map as it is now says where every node
        // is (a move it names the target of has committed).
        let forgotten = moves.first().is_some_and(|m| m.id > seen + 1) && seen > 0;
        if forgotten {
            if let Ok(MetaReply::ShardMap { map }) =
                self.groups.meta_query_local(&MetaQuery::ShardMap)
            {
                self.memory.moves_seen = newest;
                self.point_nodes(map.into_iter().collect());
            }
            return;
        }
        let mut moved: Vec<(String, u32)> = Vec::new();
        for m in moves.iter().filter(|m| m.id > seen) {
            if m.is_active() {
                // Still running: looked at again next pass.
                self.memory.moves_seen = m.id.saturating_sub(1).max(seen);
                return self.point_nodes(moved);
            }
            // A cancelled move moved nothing.
            if m.phase == gangway_core::ledger::meta::MovePhase::Done {
                moved.extend(m.nodes().map(|n| (n.clone(), m.to)));
            }
        }
        self.memory.moves_seen = newest;
        self.point_nodes(moved);
    }

    pub(super) fn point_nodes(&mut self, nodes: Vec<(String, u32)>) {
        for (node, shard) in nodes {
            let Some(known) = self.memory.shard_of.get_mut(&node) else {
                continue;
            };
            if *known != shard {
                *known = shard;
                self.memory.observed.remove(&node);
                self.memory.observed_dirty.insert(node);
                self.memory.rule_taints = None;
                self.memory.taint_rules_dirty = true;
            }
        }
    }

    /// The nodes to look at this pass: every node after a re-list or on the first pass
    /// as leader, else the ones whose objects changed (and those a failed write left).
    pub(super) fn nodes_to_sync(&mut self) -> Vec<(String, Option<Arc<Value>>)> {
        let changes = self.cache.take_changes(Slot::Nodes);
        let everything = std::mem::take(&mut self.memory.resync_nodes);
        let mut names: BTreeSet<String> = std::mem::take(&mut self.memory.nodes_retry);
        match changes {
            Changes::Keys(keys) if !everything => names.extend(keys.into_iter().map(|(_, n)| n)),
            _ => {
                names.extend(self.cache.read(Slot::Nodes, |o| {
                    o.keys().map(|(_, n)| n.clone()).collect::<Vec<_>>()
                }));
                names.extend(self.memory.nodes.keys().cloned());
            }
        }
        names
            .into_iter()
            .map(|name| {
                let object = self.cache.get(Slot::Nodes, "", &name);
                (name, object)
            })
            .collect()
    }

    pub(super) async fn sync_nodes(&mut self) {
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        for (name, object) in self.nodes_to_sync() {
            let Some(object) = object else {
                if self.memory.nodes.contains_key(&name) {
                    gone.push(name);
                }
                continue;
            };
            match objects::node(&object) {
                Ok(node) if self.memory.nodes.get(&name) != Some(&node) => changed.push(node),
                Ok(_) => {}
                Err(e) => self.warn_once(
                    &format!("node/{name}"),
                    &format!("node {name} not usable: {e}"),
                ),
            }
        }
        for chunk in changed.chunks(REGISTER_BATCH_MAX) {
            if let Err(e) = self.register_nodes(chunk).await {
                tracing::warn!(error = %e, "registering nodes failed; retrying next pass");
                self.memory
                    .nodes_retry
                    .extend(chunk.iter().map(|n| n.name.clone()));
            }
        }
        for name in gone {
            let Ok(Some(shard)) = self.groups.shard_of_node(&name).await else {
                self.memory.nodes_retry.insert(name);
                continue;
            };
            match self
                .groups
                .apply_ledger_op(shard, LedgerOp::RemoveNode { name: name.clone() })
                .await
            {
                Ok(_) => {
                    self.memory.nodes.remove(&name);
                    self.memory.shard_of.remove(&name);
                    self.memory.rule_taints = None;
                    self.memory.observed.remove(&name);
                }
                Err(e) => {
                    self.warn_once(
                        &format!("node/{name}"),
                        &format!("node {name} not removed yet: {}", e),
                    );
                    self.memory.nodes_retry.insert(name);
                }
            }
        }
    }

    /// The objects of `slot` with their names (a copy: the passes write while iterating).
    pub(super) fn named(&self, slot: Slot) -> Vec<(String, Arc<Value>)> {
        self.cache.read(slot, |o| {
            o.iter()
                .map(|((_, name), object)| (name.clone(), object.clone()))
                .collect()
        })
    }

    /// Assigns shards to `nodes` in one meta entry and registers them with one entry per shard.
    pub(super) async fn register_nodes(&mut self, nodes: &[Node]) -> Result<(), String> {
        let at_ms = now_ms();
        let commands = nodes
            .iter()
            .map(|n| {
                shard_command(
                    &n.name,
                    domain_of(&n.labels, self.topology_label.as_deref()),
                    self.groups.legacy_writer(),
                    self.shards.get(),
                    at_ms,
                )
            })
            .collect();
        let replies = match self.groups.meta(&MetaCommand::Batch { commands }).await {
            Ok(MetaReply::Batch { replies }) => replies,
            Ok(other) => return Err(format!("unexpected meta reply {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let mut per_shard: BTreeMap<u32, Vec<&Node>> = BTreeMap::new();
        for (node, reply) in nodes.iter().zip(replies) {
            match reply {
                MetaReply::Shard { shard } => per_shard.entry(shard).or_default().push(node),
                other => {
                    self.warn_once(
                        &format!("node/{}", node.name),
                        &format!("node {} not assigned a shard: {other:?}", node.name),
                    );
                    self.memory.nodes_retry.insert(node.name.clone());
                }
            }
        }
        for (shard, list) in per_shard {
            let ops = list
                .iter()
                .map(|n| LedgerOp::RegisterNode { node: (*n).clone() })
                .collect();
            let replies = match self.groups.shard(shard, LedgerOp::Batch { ops }).await {
                Ok(ShardOutcome::Applied(LedgerReply::Batch { replies })) => replies,
                Ok(other) => return Err(format!("unexpected shard reply {other:?}")),
                Err(e) => return Err(e.to_string()),
            };
            for (node, reply) in list.into_iter().zip(replies) {
                match reply {
                    LedgerReply::NodeRegistered { .. } => {
                        self.memory.nodes.insert(node.name.clone(), node.clone());
                        self.memory.shard_of.insert(node.name.clone(), shard);
                        self.memory.observed_dirty.insert(node.name.clone());
                    }
                    other => {
                        self.warn_once(
                            &format!("node/{}", node.name),
                            &format!("node {} not registered: {other:?}", node.name),
                        );
                        self.memory.nodes_retry.insert(node.name.clone());
                    }
                }
            }
        }
        Ok(())
    }
}
