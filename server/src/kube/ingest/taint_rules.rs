//! DeviceTaintRules: the taints they put on devices, computed from the rules and
//! written to every shard that holds a tainted device. Part of [`Ingest`]'s `impl`.

use super::*;

impl Ingest {
    /// Puts the DeviceTaintRules' taints on the devices they pick, in the devices'
    /// shards (`SetDeviceTaints`, batched), once the rules have been listed: each
    /// published device gets the taints of every rule that picks it (in rule name order,
    /// each once), and a device no rule picks any more loses them. Works from what the
    /// ledgers hold (read at the start of leading and after pools or nodes changed) and
    /// writes only the differences; runs when a rule, pool or node changed.
    pub(super) async fn sync_taint_rules(&mut self) {
        let changed = match self.cache.take_changes(Slot::DeviceTaintRules) {
            Changes::All => true,
            Changes::Keys(keys) => !keys.is_empty(),
        };
        if changed || self.memory.rule_taints.is_none() {
            self.memory.taint_rules_dirty = true;
        }
        if !self.memory.taint_rules_dirty || !self.cache.listed(Slot::DeviceTaintRules) {
            return;
        }
        if self.memory.rule_taints.is_none() {
            match self.read_rule_taints().await {
                Ok(held) => self.memory.rule_taints = Some(held),
                Err(e) => {
                    tracing::debug!(error = %e, "reading rule taints failed; next pass");
                    return;
                }
            }
        }
        let wanted = self.wanted_rule_taints();
        let empty = HashMap::new();
        let held = self.memory.rule_taints.as_ref().unwrap_or(&empty);
        let mut per_shard: BTreeMap<u32, Vec<(String, DeviceId, Vec<DeviceTaint>)>> =
            BTreeMap::new();
        let keys: BTreeSet<&(String, DeviceId)> = wanted.keys().chain(held.keys()).collect();
        for key in keys {
            let want = wanted.get(key).cloned().unwrap_or_default();
            if held.get(key).map_or(want.is_empty(), |h| *h == want) {
                continue;
            }
            // A network device's taints go to each shard under its own key.
            let (node, shard) = match network_shard(&key.0) {
                Some(shard) => (String::new(), shard),
                None => match self.memory.shard_of.get(&key.0) {
                    Some(shard) => (key.0.clone(), *shard),
                    None => continue,
                },
            };
            per_shard
                .entry(shard)
                .or_default()
                .push((node, key.1.clone(), want));
        }
        self.memory.taint_rules_dirty = false;
        for (shard, writes) in per_shard {
            for chunk in writes.chunks(LEDGER_BATCH_MAX) {
                self.write_rule_taints(shard, chunk).await;
            }
        }
    }

    /// The rule taints of every device of a published pool, from the informer's rules
    /// and slices.
    pub(super) fn wanted_rule_taints(&mut self) -> HashMap<(String, DeviceId), Vec<DeviceTaint>> {
        let mut rules = Vec::new();
        for (name, object) in self.named(Slot::DeviceTaintRules) {
            match objects::taint_rule(&object) {
                Ok(rule) => rules.push(rule),
                Err(e) => self.warn_once(
                    &format!("devicetaintrule/{name}"),
                    &format!("DeviceTaintRule {name}: {e}"),
                ),
            }
        }
        let mut wanted = HashMap::new();
        if rules.is_empty() {
            return wanted;
        }
        for ((node, driver, pool), generation) in &self.memory.pools {
            let key = (node.clone(), driver.clone(), pool.clone());
            for slice in self.memory.pool_slices.get(&key).into_iter().flatten() {
                let Some(object) = self.cache.get(Slot::ResourceSlices, "", slice) else {
                    continue;
                };
                if object["spec"]["pool"]["generation"].as_u64() != Some(*generation) {
                    continue;
                }
                for device in object["spec"]["devices"].as_array().into_iter().flatten() {
                    let id = DeviceId {
                        driver: driver.clone(),
                        pool: pool.clone(),
                        device: device["name"].as_str().unwrap_or_default().to_string(),
                    };
                    let mut taints: Vec<DeviceTaint> = Vec::new();
                    for taint in rules.iter().filter_map(|r| r.taint_for(&id)) {
                        if !taints.contains(taint) {
                            taints.push(taint.clone());
                        }
                    }
                    if taints.is_empty() {
                        continue;
                    }
                    if node.is_empty() {
                        // Every shard keeps a network-attached device.
                        for shard in self.shards.ids() {
                            wanted.insert((network_key(shard), id.clone()), taints.clone());
                        }
                    } else {
                        wanted.insert((node.clone(), id), taints);
                    }
                }
            }
        }
        wanted
    }

    /// The rule taints every shard ledger holds now.
    pub(super) async fn read_rule_taints(
        &self,
    ) -> Result<HashMap<(String, DeviceId), Vec<DeviceTaint>>, String> {
        let mut held = HashMap::new();
        self.ask_every_shard(&ShardQuery::RuleTaints, |shard, answer| match answer {
            ShardAnswer::RuleTaints { taints } => {
                for (node, device, list) in taints {
                    let key = if node.is_empty() {
                        network_key(shard)
                    } else {
                        node
                    };
                    held.insert((key, device), list);
                }
                Ok(())
            }
            other => Err(other),
        })
        .await?;
        Ok(held)
    }

    /// Asks every shard `query` (linearizably) and hands each answer, with its shard, to
    /// `take`, which gives back an answer of the wrong kind; stops at the first shard
    /// that fails or answers wrongly, naming it.
    pub(super) async fn ask_every_shard(
        &self,
        query: &ShardQuery,
        mut take: impl FnMut(u32, ShardAnswer) -> Result<(), ShardAnswer>,
    ) -> Result<(), String> {
        for shard in self.shards.ids() {
            let answer = (self.groups.shard_query(shard, query).await)
                .map_err(|e| format!("shard {shard}: {e}"))?;
            take(shard, answer)
                .map_err(|other| format!("shard {shard}: unexpected answer {other:?}"))?;
        }
        Ok(())
    }

    /// Writes one batch of rule taints to `shard`; a refused or failed write makes the
    /// next pass read the ledgers again.
    pub(super) async fn write_rule_taints(
        &mut self,
        shard: u32,
        writes: &[(String, DeviceId, Vec<DeviceTaint>)],
    ) {
        let ops = writes
            .iter()
            .map(|(node, device, taints)| LedgerOp::SetDeviceTaints {
                node: node.clone(),
                device: device.clone(),
                taints: taints.clone(),
            })
            .collect();
        let replies = match self
            .groups
            .apply_ledger_op(shard, LedgerOp::Batch { ops })
            .await
        {
            Ok(LedgerReply::Batch { replies }) => replies,
            Ok(other) => {
                tracing::warn!(shard, reply = ?other, "unexpected reply setting rule taints");
                self.memory.rule_taints = None;
                return;
            }
            Err(e) => {
                tracing::warn!(shard, error = %e, "setting rule taints failed; retrying next pass");
                self.memory.rule_taints = None;
                return;
            }
        };
        for ((node, device, taints), reply) in writes.iter().zip(replies) {
            if let LedgerReply::Rejected { error } = reply {
                tracing::warn!(node = %node, device = %device, error = %error, "rule taints not set; reading the ledger again next pass");
                self.memory.rule_taints = None;
                continue;
            }
            let key = if node.is_empty() {
                network_key(shard)
            } else {
                node.clone()
            };
            if let Some(held) = self.memory.rule_taints.as_mut() {
                if taints.is_empty() {
                    held.remove(&(key, device.clone()));
                } else {
                    held.insert((key, device.clone()), taints.clone());
                }
            }
        }
    }
}
