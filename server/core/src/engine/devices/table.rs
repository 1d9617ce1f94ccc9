//! The node's device table: every device of a node as the search reads it (its slot,
//! counters and what holds it), and which devices qualify for each request's
//! alternatives. Part of `engine/devices.rs`.

use super::*;

/// One device of a node as the search reads it.
#[derive(Debug)]
pub(super) struct Slot<'a> {
    pub(super) driver: &'a str,
    pub(super) pool: &'a str,
    pub(super) device: &'a Device,
    pub(super) source: DeviceSource,
    pub(super) healthy: bool,
    pub(super) rule_taints: &'a [DeviceTaint],
    pub(super) base_holders: u32,
    /// What held allocations consume, parallel to `device.capacity`.
    pub(super) base_consumed: Vec<DeviceQuantity>,
    /// Counters it consumes while in use: (counter position, amount).
    pub(super) counters: Vec<(usize, DeviceQuantity)>,
}

/// One shared counter of a node.
#[derive(Debug, Clone, Copy)]
pub(super) struct CounterSlot {
    pub(super) total: DeviceQuantity,
    pub(super) used: DeviceQuantity,
}

/// A node's devices in (driver, pool, name) order, with what is held of them.
#[derive(Debug)]
pub(super) struct Table<'a> {
    pub(super) slots: Vec<Slot<'a>>,
    pub(super) counters: Vec<CounterSlot>,
}

/// Advances a sorted `(key, value)` iterator to `key`; the value there, if any.
pub(super) fn seek<K: Ord, V>(
    it: &mut std::iter::Peekable<impl Iterator<Item = (K, V)>>,
    key: &K,
) -> Option<V> {
    while let Some((k, _)) = it.peek() {
        match k.cmp(key) {
            std::cmp::Ordering::Less => {
                it.next();
            }
            std::cmp::Ordering::Equal => return it.next().map(|(_, v)| v),
            std::cmp::Ordering::Greater => return None,
        }
    }
    None
}

impl<'a> Table<'a> {
    /// The table of `node`'s own devices and of the network-attached pools that reach
    /// it, with what the table depends on.
    pub(super) fn for_node(
        node: &Node,
        devices: &'a NodeDevices,
        network: Option<&'a NetworkPools>,
    ) -> (Self, Stamps) {
        let mut table = Self::of(devices, |_, _| true);
        let mut stamps = Stamps {
            node: devices.definition_stamp(),
            network: 0,
            reached: Vec::new(),
        };
        if let Some(network) = network {
            stamps.network = network.devices().definition_stamp();
            for (key, reach) in network.pools() {
                match reach {
                    PoolReach::PerDevice => stamps.reached.extend(
                        (network.devices().pools.get(key).into_iter())
                            .flat_map(|pool| pool.devices.values())
                            .map(|d| reach.admits_device(d, node)),
                    ),
                    _ => stamps.reached.push(reach.admits(node)),
                }
            }
            let reached = |key: &PoolKey, device: &Device| {
                network
                    .reach(key)
                    .is_some_and(|r| r.admits_device(device, node))
            };
            if stamps.reached.iter().any(|r| *r) {
                table.append(Self::of(network.devices(), reached));
            }
        }
        (table, stamps)
    }

    /// Adds another table's devices (of other pools), keeping (driver, pool, name) order.
    pub(super) fn append(&mut self, other: Self) {
        let shift = self.counters.len();
        self.counters.extend(other.counters);
        self.slots.extend(other.slots.into_iter().map(|mut slot| {
            for (pos, _) in &mut slot.counters {
                *pos += shift;
            }
            slot.source = DeviceSource::Network;
            slot
        }));
        self.slots.sort_by(|a, b| {
            (a.driver, a.pool, &a.device.name).cmp(&(b.driver, b.pool, &b.device.name))
        });
    }

    /// The table of the pools of `devices` that `keep` keeps; the health, taint,
    /// holding and counter maps (all in (driver, pool, …) order, as the pools are) are
    /// read in one merged pass.
    pub(super) fn of(devices: &'a NodeDevices, keep: impl Fn(&PoolKey, &Device) -> bool) -> Self {
        let mut slots = Vec::new();
        let mut counters = Vec::new();
        let lost = matches!(devices.agent, AgentLink::Lost { .. });
        let id_of = |id: &'a DeviceId| (id.driver.as_str(), id.pool.as_str(), id.device.as_str());
        let mut unhealthy = devices
            .unhealthy
            .iter()
            .map(|id| (id_of(id), ()))
            .peekable();
        let mut taints = devices
            .rule_taints
            .iter()
            .map(|(id, t)| (id_of(id), t))
            .peekable();
        let mut held = devices.held.iter().map(|(id, u)| (id_of(id), u)).peekable();
        let mut used = devices
            .counters
            .iter()
            .map(|(k, q)| {
                (
                    (
                        k.driver.as_str(),
                        k.pool.as_str(),
                        k.counter_set.as_str(),
                        k.counter.as_str(),
                    ),
                    *q,
                )
            })
            .peekable();
        // A pool none of whose devices is kept (a network pool that does not reach the
        // node) adds neither counters nor devices.
        let offered = (devices.pools.iter()).filter(|(key, pool)| {
            pool.standing.is_offered() && pool.devices.values().any(|d| keep(key, d))
        });
        for (key, pool) in offered {
            let (driver, pool_name) = (key.driver.as_str(), key.pool.as_str());
            let mut counter_pos: BTreeMap<(&str, &str), usize> = BTreeMap::new();
            for (set, values) in &pool.counter_sets {
                for (counter, total) in values {
                    let used = seek(
                        &mut used,
                        &(driver, pool_name, set.as_str(), counter.as_str()),
                    )
                    .unwrap_or_default();
                    counter_pos.insert((set.as_str(), counter.as_str()), counters.len());
                    counters.push(CounterSlot {
                        total: *total,
                        used,
                    });
                }
            }
            for (name, device) in pool.devices.iter().filter(|(_, d)| keep(key, d)) {
                let id = (driver, pool_name, name.as_str());
                let use_ = seek(&mut held, &id);
                let base_consumed = device
                    .capacity
                    .keys()
                    .map(|c| {
                        use_.and_then(|u| u.consumed.get(c.as_str()))
                            .copied()
                            .unwrap_or_default()
                    })
                    .collect();
                let device_counters = device
                    .consumes_counters
                    .iter()
                    .flat_map(|c| {
                        let counter_pos = &counter_pos;
                        c.counters.iter().filter_map(move |(counter, amount)| {
                            counter_pos
                                .get(&(c.counter_set.as_str(), counter.as_str()))
                                .map(|pos| (*pos, *amount))
                        })
                    })
                    .collect();
                slots.push(Slot {
                    driver,
                    pool: pool_name,
                    device,
                    source: DeviceSource::Node,
                    healthy: !lost && seek(&mut unhealthy, &id).is_none(),
                    rule_taints: seek(&mut taints, &id).map_or(&[], Vec::as_slice),
                    base_holders: use_.map_or(0, |u| u.holders),
                    base_consumed,
                    counters: device_counters,
                });
            }
        }
        Self { slots, counters }
    }

    /// The position of a device, if the node publishes it.
    pub(super) fn position(&self, id: &DeviceId) -> Option<usize> {
        let wanted = (id.driver.as_str(), id.pool.as_str(), id.device.as_str());
        self.slots
            .binary_search_by(|s| (s.driver, s.pool, s.device.name.as_str()).cmp(&wanted))
            .ok()
    }
}

/// The capacity a request asks of `device` under its capacity name `name`, if any.
pub(super) fn requested_of(
    driver: &str,
    name: &str,
    capacity: &BTreeMap<String, DeviceQuantity>,
) -> Option<DeviceQuantity> {
    let wanted = split_qualified(driver, name);
    capacity
        .iter()
        .find(|(n, _)| split_qualified(driver, n) == wanted)
        .map(|(_, q)| *q)
}

/// Whether `slot` can serve `alternative` whatever is allocated: healthy, taints
/// tolerated, capacity requirements servable, selectors matching.
pub(super) fn qualifies(slot: &Slot<'_>, alternative: &Alternative) -> Result<bool, FilterReason> {
    if !slot.healthy {
        return Ok(false);
    }
    let tolerated = |t: &DeviceTaint| {
        !matches!(
            t.effect,
            DeviceTaintEffect::NoSchedule | DeviceTaintEffect::NoExecute
        ) || alternative.tolerations.iter().any(|tol| tol.tolerates(t))
    };
    if !slot.device.taints.iter().all(tolerated) || !slot.rule_taints.iter().all(tolerated) {
        return Ok(false);
    }
    for (name, amount) in &alternative.capacity {
        let Some(capacity) = slot.device.capacity_of(slot.driver, name) else {
            return Ok(false);
        };
        let servable = match slot.device.sharing {
            AllocationSharing::Exclusive => *amount <= capacity.value,
            AllocationSharing::Shared => capacity
                .consumed_by(Some(*amount))
                .is_some_and(|c| c <= capacity.value),
        };
        if !servable {
            return Ok(false);
        }
    }
    for selector in &alternative.selectors {
        match selector.matches(slot.driver, slot.device) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => return Err(FilterReason::DeviceSelectorError(e.to_string())),
        }
    }
    Ok(true)
}

pub(super) fn compute_candidates(
    table: &Table<'_>,
    claims: &[ClaimRef<'_>],
) -> Result<NodeCandidates, FilterReason> {
    let mut lists = Vec::new();
    for claim in claims {
        for request in &claim.requests {
            let mut per_alternative = Vec::with_capacity(request.alternatives.len());
            for alternative in &request.alternatives {
                let mut list = Vec::new();
                for (pos, slot) in table.slots.iter().enumerate() {
                    if qualifies(slot, alternative)? {
                        list.push(pos);
                    }
                }
                per_alternative.push(list);
            }
            lists.push(per_alternative);
        }
    }
    Ok(NodeCandidates { lists })
}
