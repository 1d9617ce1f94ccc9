//! Devices: pools, health, taints, device agents and network-attached holds.
//! Part of [`ShardLedger`]'s `impl`, split by responsibility; the state and its
//! invariants are documented in `ledger/shard.rs`.

use super::*;

impl ShardLedger {
    #[allow(
        clippy::too_many_arguments,
        reason = "the fields of one PublishPool command"
    )]
    pub(super) fn publish_pool(
        &mut self,
        at_ms: u64,
        node: &str,
        driver: &str,
        pool: &str,
        generation: u64,
        devices: &[Device],
        counter_sets: &[CounterSet],
    ) -> Result<LedgerReply, LedgerError> {
        validate_pool(&FieldPath::root(), driver, pool, devices, counter_sets)
            .and_then(|()| validate_device_reach(&FieldPath::root(), None, devices))
            .map_err(|e| LedgerError::InvalidPool {
                message: e.to_string(),
            })?;
        let published = PoolParts {
            driver,
            name: pool,
            generation,
            devices,
            counter_sets,
        };
        let key = PoolKey {
            driver: driver.to_string(),
            pool: pool.to_string(),
        };
        if self.state.network.reach(&key).is_some() {
            return Err(LedgerError::InvalidPool {
                message: format!(
                    "pool {driver}/{pool} is network-attached already; a node's pool needs its own name"
                ),
            });
        }
        let outcome = self.update_known(node, |entry| {
            let usage = &mut entry.usage;
            usage.devices.publish(node, published, &usage.pods, at_ms)
        })?;
        self.state.nodes.intern_devices_of(node);
        match outcome {
            Ok((change, evictions)) => Ok(LedgerReply::PoolPublished {
                node: node.to_string(),
                driver: driver.to_string(),
                pool: pool.to_string(),
                generation,
                change,
                evictions,
            }),
            Err(generation) => Err(LedgerError::PoolGenerationReused {
                node: node.to_string(),
                driver: driver.to_string(),
                pool: pool.to_string(),
                generation,
            }),
        }
    }

    pub(super) fn publish_network_pool(
        &mut self,
        at_ms: u64,
        pool: PoolParts<'_>,
        reach: &PoolReach,
    ) -> Result<LedgerReply, LedgerError> {
        let invalid = |message: String| LedgerError::InvalidPool { message };
        validate_pool(
            &FieldPath::root(),
            pool.driver,
            pool.name,
            pool.devices,
            pool.counter_sets,
        )
        .map_err(|e| invalid(e.to_string()))?;
        reach
            .validate(&FieldPath::root())
            .and_then(|()| validate_device_reach(&FieldPath::root(), Some(reach), pool.devices))
            .map_err(|e| invalid(e.to_string()))?;
        let on_a_node = self.state.nodes.iter().find(|entry| {
            entry.usage.devices.pools.contains_key(&PoolKey {
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
            })
        });
        if let Some(entry) = on_a_node {
            return Err(invalid(format!(
                "pool {}/{} is published by node {} already; a network-attached pool needs its own name",
                pool.driver, pool.name, entry.node.name
            )));
        }
        match self.state.network.publish(pool, reach, at_ms) {
            Ok((change, evictions)) => Ok(LedgerReply::PoolPublished {
                node: String::new(),
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
                generation: pool.generation,
                change,
                evictions: self.placed_here(evictions),
            }),
            Err(generation) => Err(LedgerError::PoolGenerationReused {
                node: String::new(),
                driver: pool.driver.to_string(),
                pool: pool.name.to_string(),
                generation,
            }),
        }
    }

    /// Withdraws a node's pool, or (empty node) a network-attached one.
    pub(super) fn withdraw_pool(&mut self, node: &str, driver: &str, pool: &str) -> LedgerReply {
        let key = PoolKey {
            driver: driver.to_string(),
            pool: pool.to_string(),
        };
        // A node that is gone took its pools with it.
        let outcome = if node.is_empty() {
            self.state.network.withdraw(&key)
        } else {
            (self.state.nodes)
                .update(node, |entry| entry.usage.devices.withdraw(&key))
                .unwrap_or(PoolWithdrawal::Absent)
        };
        LedgerReply::PoolWithdrawn {
            node: node.to_string(),
            driver: driver.to_string(),
            pool: pool.to_string(),
            outcome,
        }
    }

    pub(super) fn set_observed_network_holds(
        &mut self,
        holds: &[NetworkHold],
    ) -> Result<LedgerReply, LedgerError> {
        validate_observed_network_holds(holds)?;
        let conflicts = self.state.network.set_observed(holds);
        Ok(LedgerReply::ObservedNetworkHoldsSet {
            held: holds.len() as u32,
            conflicts,
        })
    }

    /// The evictions of network devices' holders placed on this shard, naming their
    /// nodes (the other holders' own shards evict them).
    pub fn placed_here(&self, evictions: Vec<DeviceEviction>) -> Vec<DeviceEviction> {
        evictions
            .into_iter()
            .filter_map(|mut e| {
                e.node = self.index.locations.get(&e.member)?.clone();
                Some(e)
            })
            .collect()
    }

    pub(super) fn set_device_health(
        &mut self,
        at_ms: u64,
        node: &str,
        reports: &[DeviceHealthReport],
    ) -> Result<LedgerReply, LedgerError> {
        let entry = self.known_node(node)?;
        if let Some(unknown) = reports
            .iter()
            .find(|r| entry.usage.devices.device(&r.device).is_none())
        {
            return Err(LedgerError::UnknownDevice {
                node: node.to_string(),
                device: unknown.device.clone(),
            });
        }
        let outcome = self.state.nodes.update(node, |entry| {
            let usage = &mut entry.usage;
            usage.devices.set_health(node, reports, &usage.pods, at_ms)
        });
        match outcome {
            Some(Ok(evictions)) => Ok(LedgerReply::DeviceHealthRecorded {
                node: node.to_string(),
                evictions,
            }),
            Some(Err(device)) => Err(LedgerError::UnknownDevice {
                node: node.to_string(),
                device,
            }),
            None => Err(LedgerError::UnknownNode {
                name: node.to_string(),
            }),
        }
    }

    pub(super) fn set_device_taints(
        &mut self,
        at_ms: u64,
        node: &str,
        device: &DeviceId,
        taints: &[DeviceTaint],
    ) -> Result<LedgerReply, LedgerError> {
        let path = FieldPath::new("taints");
        let invalid = |message: String| LedgerError::InvalidTaints { message };
        if taints.len() > DEVICE_TAINTS_MAX {
            return Err(invalid(format!(
                "{path}: at most {DEVICE_TAINTS_MAX} taints per device, got {}",
                taints.len()
            )));
        }
        for (i, taint) in taints.iter().enumerate() {
            validate_device_taint(&path.index(i), taint).map_err(|e| invalid(e.to_string()))?;
        }
        if node.is_empty() {
            // A device of a network-attached pool, kept by every shard.
            let evictions = self
                .state
                .network
                .set_rule_taints(device, taints, at_ms)
                .map_err(|device| LedgerError::UnknownDevice {
                    node: String::new(),
                    device,
                })?;
            return Ok(LedgerReply::DeviceTaintsSet {
                node: String::new(),
                device: device.clone(),
                evictions: self.placed_here(evictions),
            });
        }
        let entry = self.known_node(node)?;
        if entry.usage.devices.device(device).is_none() {
            return Err(LedgerError::UnknownDevice {
                node: node.to_string(),
                device: device.clone(),
            });
        }
        let evictions = self
            .state
            .nodes
            .update(node, |entry| {
                let usage = &mut entry.usage;
                usage
                    .devices
                    .set_rule_taints(node, device, taints, &usage.pods, at_ms)
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        Ok(LedgerReply::DeviceTaintsSet {
            node: node.to_string(),
            device: device.clone(),
            evictions,
        })
    }

    pub(super) fn agent_disconnected(
        &mut self,
        node: &str,
        since_ms: u64,
        grace_ms: Option<u64>,
    ) -> Result<LedgerReply, LedgerError> {
        let grace_ms = grace_ms.unwrap_or(AGENT_GRACE_MS_DEFAULT);
        let link = self.update_known(node, |entry| {
            let devices = &mut entry.usage.devices;
            if devices.agent == AgentLink::Connected {
                devices.set_agent(AgentLink::Disconnected { since_ms, grace_ms });
            }
            devices.agent
        })?;
        if let AgentLink::Disconnected { .. } = link {
            self.index.disconnected.insert(node.to_string());
        }
        Ok(LedgerReply::AgentLinkRecorded {
            node: node.to_string(),
            link,
        })
    }

    pub(super) fn agent_connected(&mut self, node: &str) -> Result<LedgerReply, LedgerError> {
        let link = self.update_known(node, |entry| {
            entry.usage.devices.set_agent(AgentLink::Connected);
            entry.usage.devices.agent
        })?;
        self.index.disconnected.remove(node);
        Ok(LedgerReply::AgentLinkRecorded {
            node: node.to_string(),
            link,
        })
    }

    pub(super) fn put_device_class(
        &mut self,
        class: &DeviceClass,
    ) -> Result<LedgerReply, LedgerError> {
        class
            .validate(&FieldPath::root())
            .map_err(|e| LedgerError::InvalidDeviceClass {
                message: e.to_string(),
            })?;
        let change = match self
            .state
            .device_classes
            .insert(class.name.clone(), class.clone())
        {
            Some(_) => NodeChange::Updated,
            None => NodeChange::Added,
        };
        Ok(LedgerReply::DeviceClassStored {
            name: class.name.clone(),
            change,
        })
    }

    pub(super) fn remove_device_class(&mut self, name: &str) -> LedgerReply {
        let presence = match self.state.device_classes.remove(name) {
            Some(_) => Presence::Removed,
            None => Presence::Absent,
        };
        LedgerReply::DeviceClassRemoved {
            name: name.to_string(),
            presence,
        }
    }

    /// Records how a transaction ended, forgetting the oldest record beyond the bound.
    pub(super) fn finish(
        &mut self,
        txn_id: TxnId,
        outcome: TxnOutcome,
        at_ms: u64,
        refusals: Vec<Refusal>,
    ) {
        let seq = self.state.next_seq;
        self.state.next_seq = seq.saturating_add(1);
        let record = FinishedTxn {
            seq,
            outcome,
            at_ms,
            refusals,
        };
        if let Some(old) = self.state.finished.insert(txn_id, record) {
            self.index.finish_order.remove(&old.seq);
        }
        self.index.finish_order.insert(seq, txn_id);
        while self.state.finished.len() > FINISHED_TXNS_MAX {
            let Some((_, oldest)) = self.index.finish_order.pop_first() else {
                break;
            };
            self.state.finished.remove(&oldest);
        }
    }
}
