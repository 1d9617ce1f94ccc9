//! Pods that other schedulers placed: recorded on their nodes' shards (and their
//! network-attached claims), so gangway counts what it does not place. Part of
//! [`Ingest`]'s `impl`.

use super::*;

impl Ingest {
    /// Records in each node's shard the pods other schedulers bound there (and pods of
    /// ours gangway did not place), so placements count what they take; only the nodes
    /// whose pods changed are looked at, and only those whose list changed are written.
    pub(super) async fn sync_observed(&mut self) {
        let dirty = std::mem::take(&mut self.memory.observed_dirty);
        let nodes: Vec<String> = dirty
            .into_iter()
            .filter(|n| self.memory.shard_of.contains_key(n))
            .collect();
        if nodes.is_empty() {
            return;
        }
        let claims: ClaimIndex = self.cache.read(Slot::ResourceClaims, |o| o.clone());
        let network = self.network_pools();
        let mut per_shard: BTreeMap<u32, Vec<(String, Vec<ObservedPod>)>> = BTreeMap::new();
        let mut unreadable = Vec::new();
        let mut framework_held = Vec::new();
        for node in nodes {
            let mut list = Vec::new();
            // A framework's pod bound for the group that holds its member is that
            // member's; once the group lets it go, a pod still running counts here.
            let held: HashMap<String, (GroupSeq, String)> = self
                .memory
                .pods
                .on_node(&node)
                .filter(|f| !f.finished)
                .filter_map(|f| Some((f.pod.uid.clone(), self.framework_holder(f)?)))
                .collect();
            let mut on_node: Vec<&PodFacts> = self
                .memory
                .pods
                .on_node(&node)
                .filter(|f| {
                    let placed_by_us = self.memory.submitted.contains_key(&f.pod.uid)
                        || held.contains_key(&f.pod.uid);
                    !(f.finished || (f.ours && placed_by_us))
                })
                .collect();
            framework_held.extend(held);
            // By uid, so a shared claim's devices stay with the same pod while it runs.
            on_node.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
            let mut counted = BTreeSet::new();
            for facts in on_node {
                if self
                    .opts
                    .failpoints
                    .armed(failpoints::OBSERVED_CLAIMS_PER_POD)
                {
                    counted.clear();
                }
                match objects::observed_pod(&facts.object, &claims, &mut counted) {
                    Ok(mut observed) if list.len() < OBSERVED_PODS_PER_NODE_MAX => {
                        // Network-attached devices are held shard-wide, per claim.
                        observed.pod.devices.retain(|d| {
                            !network.contains(&(d.device.driver.clone(), d.device.pool.clone()))
                        });
                        list.push(observed)
                    }
                    Ok(_) => {}
                    Err(
                        PodProblem::Invalid(why)
                        | PodProblem::Waiting(why)
                        | PodProblem::Missing(why),
                    ) => unreadable.push((facts.pod.clone(), why)),
                }
            }
            list.sort_by(|a, b| a.uid.cmp(&b.uid));
            if self.memory.observed.get(&node) == Some(&list) {
                continue;
            }
            if let Some(shard) = self.memory.shard_of.get(&node) {
                per_shard.entry(*shard).or_default().push((node, list));
            }
        }
        self.memory.framework_bound.extend(framework_held);
        for (pod, why) in unreadable {
            self.warn_once(
                &pod.uid,
                &format!("pod {pod} on a gangway node is not counted: {why}"),
            );
        }
        for (shard, lists) in per_shard {
            for chunk in lists.chunks(OBSERVED_NODES_PER_ENTRY) {
                self.record_observed(shard, chunk).await;
            }
        }
    }

    /// The network-attached pools gangway published (withdrawn ones too: their devices
    /// may still be held), as (driver, pool).
    pub(super) fn network_pools(&self) -> BTreeSet<(String, String)> {
        let memory = &self.memory;
        (memory.pools.keys())
            .chain(&memory.withdrawn)
            .chain(&memory.offered_before)
            .filter(|(node, _, _)| node.is_empty())
            .map(|(_, driver, pool)| (driver.clone(), pool.clone()))
            .collect()
    }

    /// Records on every shard the network-attached devices other schedulers' claims
    /// hold (rule 15: a shard plans with every hold of the cluster), when claims or
    /// network pools changed: one hold per allocated claim with devices in a network
    /// pool, unless a pod gangway placed consumes it. Written only when the list
    /// changed; a shard that failed is tried again next pass.
    pub(super) async fn sync_observed_network(&mut self) {
        if !std::mem::take(&mut self.memory.observed_network_dirty) {
            return;
        }
        let network = self.network_pools();
        let submitted = &self.memory.submitted;
        let is_network = |d: &DeviceId| network.contains(&(d.driver.clone(), d.pool.clone()));
        let ours = |uid: &str| submitted.contains_key(uid);
        let ignored = self
            .opts
            .failpoints
            .armed(failpoints::OTHER_SCHEDULERS_NETWORK_CLAIMS_IGNORED);
        let holds: Vec<NetworkHold> = if network.is_empty() || ignored {
            Vec::new()
        } else {
            self.cache.read(Slot::ResourceClaims, |claims| {
                claims
                    .iter()
                    .filter_map(|(key, claim)| {
                        objects::observed_network_hold(key, claim, &is_network, &ours)
                    })
                    .take(OBSERVED_NETWORK_HOLDS_MAX)
                    .collect()
            })
        };
        if self.memory.observed_network.as_ref() == Some(&holds) {
            return;
        }
        for shard in self.shards.ids() {
            let op = LedgerOp::SetObservedNetworkHolds {
                holds: holds.clone(),
            };
            match self.groups.apply_ledger_op(shard, op).await {
                Ok(LedgerReply::ObservedNetworkHoldsSet { conflicts, .. }) => {
                    for (claim, devices) in conflicts {
                        tracing::warn!(shard, claim = %claim, ?devices,
                            "another scheduler's claim holds network-attached devices gangway's pods hold");
                    }
                }
                Ok(other) => {
                    tracing::warn!(shard, reply = ?other, "unexpected reply recording observed network holds")
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "recording observed network holds failed; retrying next pass");
                    self.memory.observed_network_dirty = true;
                    return;
                }
            }
        }
        self.memory.observed_network = Some(holds);
    }

    pub(super) async fn record_observed(
        &mut self,
        shard: u32,
        lists: &[(String, Vec<ObservedPod>)],
    ) {
        let ops = lists
            .iter()
            .map(|(node, pods)| LedgerOp::SetObservedPods {
                node: node.clone(),
                pods: pods.clone(),
            })
            .collect();
        let replies = match self.groups.shard(shard, LedgerOp::Batch { ops }).await {
            Ok(ShardOutcome::Applied(LedgerReply::Batch { replies })) => replies,
            Ok(other) => {
                tracing::warn!(shard, reply = ?other, "unexpected reply recording observed pods");
                self.retry_observed(lists);
                return;
            }
            Err(e) => {
                tracing::warn!(shard, error = %e, "recording observed pods failed; retrying next pass");
                self.retry_observed(lists);
                return;
            }
        };
        for ((node, pods), reply) in lists.iter().zip(replies) {
            match reply {
                LedgerReply::ObservedPodsSet { conflicts, .. } => {
                    for (uid, left_out) in conflicts {
                        tracing::warn!(node = %node, pod_uid = %uid, ports = ?left_out.ports, devices = ?left_out.devices,
                            "a pod bound by another scheduler takes ports or devices gangway's pods hold");
                    }
                    self.memory.observed.insert(node.clone(), pods.clone());
                }
                other => {
                    self.warn_once(
                        &format!("node/{node}"),
                        &format!("observed pods of node {node} not recorded: {other:?}"),
                    );
                    self.memory.observed_dirty.insert(node.clone());
                }
            }
        }
    }

    pub(super) fn retry_observed(&mut self, lists: &[(String, Vec<ObservedPod>)]) {
        self.memory
            .observed_dirty
            .extend(lists.iter().map(|(node, _)| node.clone()));
    }
}
