//! DRA devices: DeviceClasses, and ResourceSlices published to (and withdrawn from)
//! the shards as node-local or network-attached pools. Part of [`Ingest`]'s `impl`.

use super::*;

impl Ingest {
    pub(super) async fn sync_classes(&mut self) {
        for (name, object) in self.named(Slot::DeviceClasses) {
            let class = match objects::device_class(&object) {
                Ok(c) => c,
                Err(e) => {
                    self.warn_once(
                        &format!("deviceclass/{name}"),
                        &format!("DeviceClass {name}: {e}"),
                    );
                    continue;
                }
            };
            if self.memory.classes.get(&name) == Some(&class) {
                continue;
            }
            let mut ok = true;
            for shard in self.shards.ids() {
                let op = LedgerOp::PutDeviceClass {
                    class: class.clone(),
                };
                if let Err(e) = self.groups.apply_ledger_op(shard, op).await {
                    self.warn_once(
                        &format!("deviceclass/{name}"),
                        &format!("DeviceClass {name}: {}", e),
                    );
                    ok = false;
                }
            }
            if ok {
                self.memory.classes.insert(name, class);
            }
        }
    }

    /// Marks the pools whose slices changed (every pool on the first pass as leader or
    /// after a re-list), keeping which slices make up which pool.
    pub(super) fn take_slice_changes(&mut self) {
        let changed: Vec<(String, Option<Arc<Value>>)> =
            match self.cache.take_changes(Slot::ResourceSlices) {
                Changes::Keys(keys) if self.memory.slices_indexed => keys
                    .into_iter()
                    .map(|(_, name)| {
                        let object = self.cache.get(Slot::ResourceSlices, "", &name);
                        (name, object)
                    })
                    .collect(),
                // Everything: forget the old grouping, and look at every slice there is.
                _ => {
                    let memory = &mut self.memory;
                    memory.slices_indexed = true;
                    memory
                        .pools_dirty
                        .extend(memory.pool_slices.keys().cloned());
                    memory.slice_pool.clear();
                    memory.pool_slices.clear();
                    self.named(Slot::ResourceSlices)
                        .into_iter()
                        .map(|(name, object)| (name, Some(object)))
                        .collect()
                }
            };
        let memory = &mut self.memory;
        for (name, object) in changed {
            if let Some(old) = memory.slice_pool.remove(&name) {
                if let Some(names) = memory.pool_slices.get_mut(&old) {
                    names.remove(&name);
                    if names.is_empty() {
                        memory.pool_slices.remove(&old);
                    }
                }
                memory.pools_dirty.insert(old);
            }
            if let Some(key) = object.as_deref().and_then(objects::pool_key) {
                memory
                    .pool_slices
                    .entry(key.clone())
                    .or_default()
                    .insert(name.clone());
                memory.slice_pool.insert(name, key.clone());
                memory.pools_dirty.insert(key);
            }
        }
    }

    /// Publishes the marked pools whose newest generation is complete and not the one
    /// registered; a pool whose node is not registered yet, or whose write failed,
    /// stays marked.
    pub(super) async fn sync_slices(&mut self) {
        self.read_offered_pools().await;
        let dirty = std::mem::take(&mut self.memory.pools_dirty);
        self.withdraw_pools(&dirty).await;
        let mut slices = Vec::new();
        for pool in &dirty {
            for name in self.memory.pool_slices.get(pool).into_iter().flatten() {
                if let Some(object) = self.cache.get(Slot::ResourceSlices, "", name) {
                    slices.push((name.clone(), object));
                }
            }
        }
        let known = &self.memory.pools;
        let pools = objects::node_pools(slices, |key, generation| {
            known.get(key) == Some(&generation)
        });
        for pool in pools {
            let (names, object) = match pool {
                PoolSlices::Complete { names, merged } => (names.join(","), merged),
                PoolSlices::Incomplete { names, want } => {
                    let name = names.join(",");
                    self.warn_once(
                        &format!("slice/{name}"),
                        &format!(
                            "ResourceSlices {name}: {} of the pool's {want} slices so far; waiting for the rest",
                            names.len()
                        ),
                    );
                    continue;
                }
            };
            let name = names;
            let (scope, pool) = match objects::slice(&object) {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(e) => {
                    self.warn_once(
                        &format!("slice/{name}"),
                        &format!("ResourceSlice {name}: {e}"),
                    );
                    continue;
                }
            };
            match scope {
                SliceScope::Node(node) => self.publish_node_pool(&name, node, pool).await,
                SliceScope::Network(reach) => self.publish_network_pool(&name, reach, pool).await,
            }
        }
    }

    /// Once per leadership, reads the pools the shards offer; those no slice names are
    /// marked, to be withdrawn (their slices went while no leader watched). A failed
    /// read is tried again next pass.
    pub(super) async fn read_offered_pools(&mut self) {
        if self.memory.offered_read {
            return;
        }
        let mut offered = BTreeSet::new();
        let read = self
            .ask_every_shard(&ShardQuery::OfferedPools, |_, answer| match answer {
                ShardAnswer::OfferedPools { pools } => {
                    offered.extend(pools);
                    Ok(())
                }
                other => Err(other),
            })
            .await;
        if let Err(e) = read {
            tracing::debug!(error = %e, "listing pools failed; next pass");
            return;
        }
        let memory = &mut self.memory;
        memory.offered_read = true;
        for key in offered {
            if !memory.pool_slices.contains_key(&key) {
                memory.pools_dirty.insert(key.clone());
                memory.offered_before.insert(key);
            }
        }
    }

    /// Withdraws the marked pools that no slice names any more and that are offered
    /// (`LedgerOp::WithdrawPool`: nobody is evicted; a driver restart deletes and
    /// republishes its slices); a failed write leaves the pool marked.
    pub(super) async fn withdraw_pools(&mut self, dirty: &BTreeSet<PoolKey>) {
        if self
            .opts
            .failpoints
            .armed(failpoints::SLICELESS_POOLS_OFFERED)
        {
            return;
        }
        let gone: Vec<PoolKey> = dirty
            .iter()
            .filter(|key| !self.memory.pool_slices.contains_key(*key))
            .filter(|key| {
                self.memory.pools.contains_key(*key) || self.memory.offered_before.contains(*key)
            })
            .cloned()
            .collect();
        for key in gone {
            let (node, driver, pool) = key.clone();
            let shards = if node.is_empty() {
                self.shards.ids().collect()
            } else {
                match self.groups.shard_of_node(&node).await {
                    Ok(Some(shard)) => vec![shard],
                    // The node is gone, and its pools with it.
                    Ok(None) => Vec::new(),
                    Err(_) => {
                        self.memory.pools_dirty.insert(key);
                        continue;
                    }
                }
            };
            let op = LedgerOp::WithdrawPool { node, driver, pool };
            let mut failed = None;
            for shard in shards {
                if let Err(e) = self.groups.apply_ledger_op(shard, op.clone()).await {
                    failed = Some(format!("shard {shard}: {}", e));
                }
            }
            let memory = &mut self.memory;
            match failed {
                None => {
                    memory.pools.remove(&key);
                    memory.offered_before.remove(&key);
                    memory.withdrawn.insert(key);
                    memory.rule_taints = None;
                }
                Some(why) => {
                    tracing::warn!(pool = ?key, error = %why, "withdrawing a pool failed; next pass");
                    memory.pools_dirty.insert(key);
                }
            }
        }
    }

    /// Publishes a node's pool on the node's shard, once the node is registered.
    pub(super) async fn publish_node_pool(&mut self, name: &str, node: String, pool: ResourcePool) {
        let key = (node.clone(), pool.driver.clone(), pool.name.clone());
        if self.memory.pools.get(&key) == Some(&pool.generation) {
            return;
        }
        if !self.memory.nodes.contains_key(&node) {
            self.memory.pools_dirty.insert(key);
            return;
        }
        let Ok(Some(shard)) = self.groups.shard_of_node(&node).await else {
            self.memory.pools_dirty.insert(key);
            return;
        };
        let generation = pool.generation;
        let op = LedgerOp::PublishPool {
            node: node.clone(),
            driver: pool.driver,
            pool: pool.name,
            generation,
            devices: pool.devices,
            counter_sets: pool.counter_sets,
        };
        match self.groups.apply_ledger_op(shard, op).await {
            Ok(_) => {
                self.memory.withdrawn.remove(&key);
                self.memory.offered_before.remove(&key);
                self.memory.pools.insert(key, generation);
                // Its devices may be new to the rules, or gone with their taints.
                self.memory.rule_taints = None;
            }
            Err(e) => {
                self.warn_once(
                    &format!("slice/{name}"),
                    &format!("ResourceSlice {name}: {}", e),
                );
                self.memory.pools_dirty.insert(key);
            }
        }
    }

    /// Publishes a network-attached pool on every shard (rule 15); it counts as
    /// published only once every shard took it (a shard that already has this
    /// generation answers unchanged, so a retry is harmless).
    pub(super) async fn publish_network_pool(
        &mut self,
        name: &str,
        reach: PoolReach,
        pool: ResourcePool,
    ) {
        let key = (String::new(), pool.driver.clone(), pool.name.clone());
        if self.memory.pools.get(&key) == Some(&pool.generation) {
            return;
        }
        let op = LedgerOp::PublishNetworkPool {
            driver: pool.driver.clone(),
            pool: pool.name.clone(),
            generation: pool.generation,
            reach,
            devices: pool.devices,
            counter_sets: pool.counter_sets,
        };
        let mut failed = None;
        for shard in self.shards.ids() {
            if let Err(e) = self.groups.apply_ledger_op(shard, op.clone()).await {
                failed = Some(format!("shard {shard}: {}", e));
            }
        }
        match failed {
            None => {
                self.memory.withdrawn.remove(&key);
                self.memory.offered_before.remove(&key);
                self.memory.pools.insert(key, pool.generation);
                self.memory.observed_network_dirty = true;
                // Its devices may be new to the rules, or gone with their taints.
                self.memory.rule_taints = None;
            }
            Some(why) => {
                self.warn_once(
                    &format!("slice/{name}"),
                    &format!("ResourceSlice {name} (network-attached): {why}"),
                );
                self.memory.pools_dirty.insert(key);
            }
        }
    }
}
