//! The ingest loop: on the replica that leads the meta group, turns what the
//! informers see into gangway's replicated state and reports back. Each pass:
//! Nodes → the shard map and shard ledgers; DeviceClasses → every shard;
//! ResourceSlices → their node's shard (a pool spanning several slices once all
//! are there); DeviceTaintRules → rule taints on the devices they pick; pods bound
//! by other schedulers → their node's observed pods (what they take counts; a claim
//! several share counted once); pods that are gone or finished → their placements released
//! (a queued group losing a member is cancelled, its other pods submitted again; a
//! placed group with a Strict gang below minMember before any binding is released
//! whole); pending pods of our scheduler → gang groups in the meta queue (batched; a
//! ResourceClaim the pods of one gang share is carried by the first and followed by
//! the others);
//! timed-out gangs → the Koordinator timeout annotation; invalid pods and
//! unplaceable groups → FailedScheduling events with the reason; PodGroups → their
//! status (phase, scheduled, running, succeeded, failed).
//!
//! Work follows change: the informers' change sets update a [`PodIndex`], and each
//! step looks only at what changed since the last pass (the nodes, groups and
//! PodGroups of changed pods, the groups whose summary moved, the pods still waiting
//! to be submitted); a failed write leaves its subject marked for the next pass.
//!
//! Invariants: only the meta leader writes; submissions carry keys derived from pod
//! uids, so a new leader that rebuilds its memory from the meta log re-proposes
//! nothing new; an event is written once per pod and reason. Owned by `kube::run`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;

use crate::failpoints;
use crate::kube::api::{self, EventType};
use crate::kube::gangs::{
    self, BoundPods, GangParams, Identity, PodGroupIndex, ReadyPod, ANNOTATION_TIMEOUT,
};
use crate::kube::informer::{Cache, Changes, Key, Slot};
use crate::kube::objects::{
    self, ClaimIndex, PodProblem, PodRef, PoolKey, PoolSlices, ShareRole, SliceScope,
};
use crate::kube::pod_index::{PodFacts, PodIndex, Touched};
use crate::kube::queues;
use crate::kube::KubeOptions;
use crate::replicated::growth::ShardCount;
use crate::replicated::release::release_members;
use crate::replicated::{now_ms, Groups, ShardOutcome};
use gangway_core::ledger::command::{NetworkHold, LEDGER_BATCH_MAX, OBSERVED_NETWORK_HOLDS_MAX};
use gangway_core::ledger::meta::{
    domain_of, shard_command, GroupSeq, GroupState, GroupSummary, MetaCommand, MetaQuery,
    MetaReply, RejectionKind, Terminal,
};
use gangway_core::ledger::{LedgerOp, LedgerReply, ObservedPod, OBSERVED_PODS_PER_NODE_MAX};
use gangway_core::model::claim::ClaimShare;
use gangway_core::model::device::{DeviceTaint, ResourcePool};
use gangway_core::model::pod::PodSpec;
use gangway_core::model::reach::PoolReach;
use gangway_core::model::{DeviceClass, DeviceId, GangId, GangMode, MemberKey, Node, QueueSpec};
use gangway_core::plan::budgets::DisruptionBudgets;
use gangway_core::query::{ShardAnswer, ShardQuery};

/// Longest gap between passes, in ms, when neither the informers nor the meta group
/// change (a pass starts at once when either does).
pub const INGEST_IDLE_PASS_MS: u64 = 2_000;
/// Shortest gap between passes, in ms (bounds the work under a stream of changes).
pub const INGEST_GAP_MS: u64 = 20;
/// Submissions per meta entry.
pub const SUBMIT_BATCH_MAX: usize = 256;
/// Nodes registered per meta entry (and per shard entry).
pub const REGISTER_BATCH_MAX: usize = 512;
/// Nodes whose observed pods one shard entry carries (bounds the entry's size: a node
/// may list up to `OBSERVED_PODS_PER_NODE_MAX` pods).
pub const OBSERVED_NODES_PER_ENTRY: usize = 64;

/// Group summaries by seq.
type Summaries = BTreeMap<GroupSeq, GroupSummary>;

/// Summaries read per meta query (bounds one read's answer).
pub const SUMMARIES_PER_READ_MAX: usize = 1_024;

/// The kinds whose change sets the ingest reads (drained while it does not lead).
const CHANGE_SLOTS: [Slot; 7] = [
    Slot::Nodes,
    Slot::ResourceSlices,
    Slot::DeviceTaintRules,
    Slot::Pods,
    Slot::ResourceClaims,
    Slot::PodGroupsSigs,
    Slot::PodGroupsX,
];

/// What the leader remembers between passes; rebuilt when it becomes leader.
#[derive(Default)]
struct Memory {
    leading: bool,
    /// The shard count when leading started: what was written to "every shard" (device
    /// classes, network pools and holds, rule taints) reached only those.
    shards: u32,
    /// Queues the ElasticQuotas keep, as last synced (pods of their namespaces are
    /// charged to them).
    kept_queues: BTreeSet<String>,
    /// Every queue's spec as meta held it at the last sync (for the queue label's rule).
    queue_specs: BTreeMap<String, QueueSpec>,
    nodes: HashMap<String, Node>,
    /// Node → its shard, as registered (and as finished shard moves left it).
    shard_of: HashMap<String, u32>,
    /// The last shard move id whose nodes `shard_of` follows.
    moves_seen: u64,
    /// Node → the observed pods last recorded in its shard (sorted by uid).
    observed: HashMap<String, Vec<ObservedPod>>,
    classes: BTreeMap<String, DeviceClass>,
    pools: HashMap<PoolKey, u64>,
    /// ResourceSlice name → its pool (node-local slices).
    slice_pool: HashMap<String, PoolKey>,
    /// Pool → the names of its slices.
    pool_slices: HashMap<PoolKey, BTreeSet<String>>,
    /// Pools whose slices changed, or whose publication is still to do.
    pools_dirty: BTreeSet<PoolKey>,
    /// Whether `slice_pool` was built since leading started.
    slices_indexed: bool,
    /// Whether the pools the shards offer were read since leading started (those
    /// without slices are withdrawn, whoever published them).
    offered_read: bool,
    /// Pools the shards offered when leading started and not published since.
    offered_before: BTreeSet<PoolKey>,
    /// Pools withdrawn since leading started (their devices may still be held).
    withdrawn: BTreeSet<PoolKey>,
    /// Pod uid → key of the group it was submitted in.
    submitted: HashMap<String, String>,
    /// Group key → its pods.
    pods_of: HashMap<String, Vec<PodRef>>,
    /// Pod uid (or node name) → the last reason reported.
    reported: HashMap<String, String>,
    /// Pods marked timed out.
    timed_out: HashSet<String>,
    /// PodGroup (slot, namespace, name) → the status last written.
    pod_group_status: HashMap<(Slot, String, String), Value>,
    /// The meta log's groups as last read (refreshed by change stamp each pass).
    summaries: Summaries,
    /// The meta log's change stamp the summaries are up to.
    stamp: u64,
    /// The meta log's count of forgotten groups when last read.
    forgotten: u64,
    /// Group key → its seq, for the summaries kept.
    seq_of: HashMap<String, GroupSeq>,
    /// The pods, kept from the informer's change sets (built whole when leading starts).
    pods: PodIndex,
    /// Whether `pods` was built since leading started.
    pods_indexed: bool,
    /// Registered nodes whose observed pods may have changed.
    observed_dirty: BTreeSet<String>,
    /// Other schedulers' claims on network-attached devices as last recorded on every
    /// shard (`None`: not recorded since leading started).
    observed_network: Option<Vec<NetworkHold>>,
    /// Whether claims or network-attached pools changed since they were recorded.
    observed_network_dirty: bool,
    /// Groups (keys) to look at: a pod of theirs changed, or their summary moved.
    groups_dirty: BTreeSet<String>,
    /// PodGroups (namespace, name) whose status may have changed.
    pod_groups_dirty: BTreeSet<Key>,
    /// Our pending pods not submitted yet.
    waiting: BTreeSet<Key>,
    /// Whether anything that decides a waiting pod's fate changed since they were last
    /// looked at (a pod, a PodGroup, a claim, a submission given up).
    waiting_dirty: bool,
    /// Look at every node next pass (set when leadership starts).
    resync_nodes: bool,
    /// Nodes whose registration or removal failed: looked at again next pass.
    nodes_retry: BTreeSet<String>,
    /// The rule taints the shard ledgers hold, by node and device (`None`: to be read
    /// from them, at the start of leading and after pools or nodes changed).
    rule_taints: Option<HashMap<(String, DeviceId), Vec<DeviceTaint>>>,
    /// Whether the rule taints are to be worked out again.
    taint_rules_dirty: bool,
}

/// The ingest loop's dependencies.
pub struct Ingest {
    groups: Groups,
    shards: ShardCount,
    topology_label: Option<String>,
    client: kube::Client,
    cache: Arc<Cache>,
    budgets: Arc<DisruptionBudgets>,
    opts: KubeOptions,
    memory: Memory,
}

impl Ingest {
    /// An ingest loop over `cache` writing through `groups` and `client`.
    pub fn new(
        groups: Groups,
        shards: ShardCount,
        topology_label: Option<String>,
        client: kube::Client,
        cache: Arc<Cache>,
        budgets: Arc<DisruptionBudgets>,
        opts: KubeOptions,
    ) -> Self {
        Self {
            groups,
            shards,
            topology_label,
            client,
            cache,
            budgets,
            opts,
            memory: Memory::default(),
        }
    }

    /// Runs passes until `stop` fires: when an informer's copy changes, when the meta
    /// group applies entries (placements, timeouts), and at least every
    /// `INGEST_IDLE_PASS_MS`; never closer than the last pass took (so the loop spends
    /// at most half a core however fast changes come) nor than `INGEST_GAP_MS`.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut changes = self.cache.subscribe();
        let mut meta = self.groups.host().changes(0).ok();
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = changes.changed() => {}
                _ = meta_applied(&mut meta) => {}
                _ = tokio::time::sleep(Duration::from_millis(INGEST_IDLE_PASS_MS)) => {}
            }
            let started = std::time::Instant::now();
            if let Err(e) = self.pass().await {
                tracing::warn!(error = %e, "kube ingest pass failed; retrying");
            }
            let gap = started.elapsed().max(Duration::from_millis(INGEST_GAP_MS));
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(gap) => {}
            }
        }
    }

    async fn pass(&mut self) -> Result<(), String> {
        if !self.cache.synced() {
            tracing::debug!("kube informers not synced yet");
            return Ok(());
        }
        // Every replica keeps them, so a new meta leader's coordinator has them at once.
        self.sync_budgets();
        let me = self.groups.host().node_id();
        if self.groups.host().leader_of(0) != Some(me) {
            self.memory = Memory::default();
            // Keeps the change sets empty: a new leader looks at everything anyway.
            for slot in CHANGE_SLOTS {
                let _ = self.cache.take_changes(slot);
            }
            return Ok(());
        }
        if self.memory.leading && self.memory.shards != self.shards.get() {
            // Shards added to the live cluster hold none of the cluster-wide state yet:
            // everything is looked at again, as by a new leader.
            tracing::info!(
                shards = self.shards.get(),
                "the shard count grew; the ingest writes its cluster-wide state to every shard again"
            );
            self.memory = Memory::default();
        }
        if !self.memory.leading {
            self.recover().await?;
        }
        self.follow_moves();
        self.sync_nodes().await;
        self.sync_classes().await;
        self.take_slice_changes();
        self.sync_slices().await;
        self.sync_taint_rules().await;
        self.sync_queues().await;
        self.refresh_summaries()?;
        self.take_pod_changes();
        self.take_claim_changes();
        self.take_pod_group_changes();
        self.sync_observed().await;
        self.sync_observed_network().await;
        self.check_groups().await;
        self.submit_pending().await;
        self.write_pod_group_status().await;
        Ok(())
    }

    /// Points the nodes of shard moves finished since the last pass at their new shard,
    /// and writes their observed pods and rule taints there again (the old shard no longer
    /// has them). With moves forgotten in between, every known node is looked up again.
    fn follow_moves(&mut self) {
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

    fn point_nodes(&mut self, nodes: Vec<(String, u32)>) {
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

    /// Hands the PodDisruptionBudgets to the coordinator when any changed (a handful
    /// per namespace: all are parsed again).
    fn sync_budgets(&mut self) {
        if matches!(
            self.cache.take_changes(Slot::PodDisruptionBudgets),
            Changes::Keys(keys) if keys.is_empty()
        ) {
            return;
        }
        let budgets = self.cache.read(Slot::PodDisruptionBudgets, |objects| {
            objects
                .values()
                .filter_map(|o| match objects::disruption_budget(o) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::debug!(error = %e, "PodDisruptionBudget skipped");
                        None
                    }
                })
                .collect()
        });
        self.budgets.replace(budgets);
    }

    /// Brings the kept group summaries up to the meta log's: reads the groups changed
    /// since the last stamp seen (all of them on the first pass as leader), and, when
    /// the log forgot groups since, drops those it no longer has.
    fn refresh_summaries(&mut self) -> Result<(), String> {
        loop {
            let query = MetaQuery::ChangedSince {
                after: self.memory.stamp,
                limit: SUMMARIES_PER_READ_MAX as u32,
            };
            let (groups, stamp, more, forgotten) = match self.groups.meta_query_local(&query) {
                Ok(MetaReply::Changed {
                    groups,
                    stamp,
                    more,
                    forgotten,
                }) => (groups, stamp, more, forgotten),
                Ok(other) => return Err(format!("unexpected meta reply {other:?}")),
                Err(e) => return Err(e.to_string()),
            };
            if forgotten != self.memory.forgotten {
                self.drop_forgotten()?;
                self.memory.forgotten = forgotten;
            }
            for g in groups {
                self.memory.groups_dirty.insert(g.key.clone());
                self.memory.seq_of.insert(g.key.clone(), g.seq);
                self.memory.summaries.insert(g.seq, g);
            }
            self.memory.stamp = stamp;
            if !more {
                return Ok(());
            }
        }
    }

    /// Drops the kept groups the meta log no longer has.
    fn drop_forgotten(&mut self) -> Result<(), String> {
        let versions = match self.groups.meta_query_local(&MetaQuery::Versions) {
            Ok(MetaReply::Versions { groups }) => groups,
            Ok(other) => return Err(format!("unexpected meta reply {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let live: HashSet<GroupSeq> = versions.iter().map(|(seq, _)| *seq).collect();
        let forgotten: Vec<GroupSeq> = self
            .memory
            .summaries
            .keys()
            .filter(|seq| !live.contains(seq))
            .copied()
            .collect();
        for seq in forgotten {
            self.forget_group(seq);
        }
        Ok(())
    }

    /// Rebuilds which pods were submitted from the meta log (after a failover), a
    /// page of groups at a time and without their specs.
    async fn recover(&mut self) -> Result<(), String> {
        let started = std::time::Instant::now();
        let mut memory = Memory {
            leading: true,
            shards: self.shards.get(),
            resync_nodes: true,
            ..Memory::default()
        };
        let mut after = 0;
        loop {
            let query = MetaQuery::SubmittedPods {
                after,
                limit: SUMMARIES_PER_READ_MAX as u32,
            };
            let (groups, more) = match self.groups.meta_query(&query).await {
                Ok(MetaReply::SubmittedPods { groups, more }) => (groups, more),
                Ok(other) => return Err(format!("unexpected meta reply {other:?}")),
                Err(e) => return Err(e.to_string()),
            };
            for g in groups {
                after = after.max(g.seq);
                let pods: Vec<PodRef> = g
                    .pods
                    .into_iter()
                    .map(|(namespace, name, uid)| PodRef {
                        namespace,
                        name,
                        uid,
                    })
                    .collect();
                if !g.cancelled {
                    for p in &pods {
                        memory.submitted.insert(p.uid.clone(), g.key.clone());
                    }
                }
                memory.pods_of.insert(g.key, pods);
            }
            if !more {
                break;
            }
        }
        tracing::info!(
            groups = memory.pods_of.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "kube ingest leading; submitted pods read from the meta log"
        );
        self.memory = memory;
        Ok(())
    }

    /// The nodes to look at this pass: every node after a re-list or on the first pass
    /// as leader, else the ones whose objects changed (and those a failed write left).
    fn nodes_to_sync(&mut self) -> Vec<(String, Option<Arc<Value>>)> {
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

    async fn sync_nodes(&mut self) {
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
    fn named(&self, slot: Slot) -> Vec<(String, Arc<Value>)> {
        self.cache.read(slot, |o| {
            o.iter()
                .map(|((_, name), object)| (name.clone(), object.clone()))
                .collect()
        })
    }

    /// Assigns shards to `nodes` in one meta entry and registers them with one entry per shard.
    async fn register_nodes(&mut self, nodes: &[Node]) -> Result<(), String> {
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

    async fn sync_classes(&mut self) {
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
    fn take_slice_changes(&mut self) {
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
    async fn sync_slices(&mut self) {
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
    async fn read_offered_pools(&mut self) {
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
    async fn withdraw_pools(&mut self, dirty: &BTreeSet<PoolKey>) {
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
    async fn publish_node_pool(&mut self, name: &str, node: String, pool: ResourcePool) {
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
    async fn publish_network_pool(&mut self, name: &str, reach: PoolReach, pool: ResourcePool) {
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

    /// Puts the DeviceTaintRules' taints on the devices they pick, in the devices'
    /// shards (`SetDeviceTaints`, batched), once the rules have been listed: each
    /// published device gets the taints of every rule that picks it (in rule name order,
    /// each once), and a device no rule picks any more loses them. Works from what the
    /// ledgers hold (read at the start of leading and after pools or nodes changed) and
    /// writes only the differences; runs when a rule, pool or node changed.
    async fn sync_taint_rules(&mut self) {
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
    fn wanted_rule_taints(&mut self) -> HashMap<(String, DeviceId), Vec<DeviceTaint>> {
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
    async fn read_rule_taints(
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
    async fn ask_every_shard(
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
    async fn write_rule_taints(
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

    /// Records in each node's shard the pods other schedulers bound there (and pods of
    /// ours gangway did not place), so placements count what they take; only the nodes
    /// whose pods changed are looked at, and only those whose list changed are written.
    async fn sync_observed(&mut self) {
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
        for node in nodes {
            let mut list = Vec::new();
            let mut on_node: Vec<&PodFacts> = self
                .memory
                .pods
                .on_node(&node)
                .filter(|f| {
                    let placed_by_us = self.memory.submitted.contains_key(&f.pod.uid);
                    !(f.finished || (f.ours && placed_by_us))
                })
                .collect();
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
                    Err(PodProblem::Invalid(why) | PodProblem::Waiting(why)) => {
                        unreadable.push((facts.pod.clone(), why))
                    }
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
    fn network_pools(&self) -> BTreeSet<(String, String)> {
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
    async fn sync_observed_network(&mut self) {
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

    async fn record_observed(&mut self, shard: u32, lists: &[(String, Vec<ObservedPod>)]) {
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

    fn retry_observed(&mut self, lists: &[(String, Vec<ObservedPod>)]) {
        self.memory
            .observed_dirty
            .extend(lists.iter().map(|(node, _)| node.clone()));
    }

    /// Drops a group the meta log forgot, and which pods were submitted in it.
    fn forget_group(&mut self, seq: GroupSeq) {
        let Some(summary) = self.memory.summaries.remove(&seq) else {
            return;
        };
        self.memory.seq_of.remove(&summary.key);
        self.memory.groups_dirty.remove(&summary.key);
        for pod in self.memory.pods_of.remove(&summary.key).unwrap_or_default() {
            if self.memory.submitted.get(&pod.uid) == Some(&summary.key) {
                self.unmark_submitted(&pod);
            }
        }
    }

    /// Records that `pod` was submitted in group `key`.
    fn mark_submitted(&mut self, pod: &PodRef, key: &str) {
        self.memory
            .submitted
            .insert(pod.uid.clone(), key.to_string());
        self.memory
            .waiting
            .remove(&(pod.namespace.clone(), pod.name.clone()));
    }

    /// Forgets that `pod` was submitted: it waits to be submitted again if still
    /// pending, and counts as observed on its node if bound.
    fn unmark_submitted(&mut self, pod: &PodRef) {
        self.memory.submitted.remove(&pod.uid);
        self.memory.waiting_dirty = true;
        if let Some(facts) = self.memory.pods.same(pod) {
            if let Some(node) = &facts.node {
                self.memory.observed_dirty.insert(node.clone());
            }
            if facts.pending_ours() {
                self.memory
                    .waiting
                    .insert((pod.namespace.clone(), pod.name.clone()));
            }
        }
    }

    /// Brings the pod index up to the informer's copy (whole on the first pass as
    /// leader or after a re-list, else the changed pods) and marks what changed.
    fn take_pod_changes(&mut self) {
        let scheduler = self.opts.scheduler_name.clone();
        let changes = self.cache.take_changes(Slot::Pods);
        let touched = match changes {
            Changes::Keys(keys) if self.memory.pods_indexed => {
                let objects: Vec<(Key, Option<Arc<Value>>)> = self.cache.read(Slot::Pods, |o| {
                    keys.into_iter()
                        .map(|k| {
                            let object = o.get(&k).cloned();
                            (k, object)
                        })
                        .collect()
                });
                let mut touched = Touched::default();
                for (key, object) in objects {
                    self.memory
                        .pods
                        .update(key, object, &scheduler, &mut touched);
                }
                touched
            }
            _ => {
                self.memory.pods_indexed = true;
                let index = &mut self.memory.pods;
                self.cache
                    .read(Slot::Pods, |o| index.rebuild(o.iter(), &scheduler))
            }
        };
        self.absorb(touched);
    }

    /// Marks the nodes, groups, PodGroups and waiting pods `touched` concerns.
    fn absorb(&mut self, touched: Touched) {
        let memory = &mut self.memory;
        if !touched.pods.is_empty() {
            memory.waiting_dirty = true;
        }
        memory.observed_dirty.extend(touched.nodes);
        memory.pod_groups_dirty.extend(touched.pod_groups);
        for uid in &touched.uids {
            if let Some(key) = memory.submitted.get(uid) {
                memory.groups_dirty.insert(key.clone());
            }
        }
        for pod in &touched.deleted {
            memory.reported.remove(&pod.uid);
            memory.timed_out.remove(&pod.uid);
        }
        for key in touched.pods {
            let waits = memory
                .pods
                .get(&key)
                .is_some_and(|f| f.pending_ours() && !memory.submitted.contains_key(&f.pod.uid));
            if waits {
                memory.waiting.insert(key);
            } else {
                memory.waiting.remove(&key);
            }
        }
    }

    /// A claim changed: the devices of the bound pods naming it may have (every bound
    /// pod with claims after a re-list), and waiting pods may have their claims now.
    fn take_claim_changes(&mut self) {
        let nodes = match self.cache.take_changes(Slot::ResourceClaims) {
            Changes::All => self.memory.pods.nodes_with_claims(),
            Changes::Keys(keys) if keys.is_empty() => return,
            Changes::Keys(keys) => self.memory.pods.nodes_using_claims(&keys),
        };
        self.memory.observed_dirty.extend(nodes);
        self.memory.observed_network_dirty = true;
        self.memory.waiting_dirty = true;
    }

    /// A PodGroup changed: its status may need writing, and waiting pods may now be
    /// able to name their gang.
    fn take_pod_group_changes(&mut self) {
        for slot in [Slot::PodGroupsSigs, Slot::PodGroupsX] {
            let keys: BTreeSet<Key> = match self.cache.take_changes(slot) {
                Changes::All => {
                    let mut keys: BTreeSet<Key> =
                        self.cache.read(slot, |o| o.keys().cloned().collect());
                    // Those the re-list no longer has, so their memory goes too.
                    keys.extend(
                        self.memory
                            .pod_group_status
                            .keys()
                            .filter(|(s, _, _)| *s == slot)
                            .map(|(_, ns, name)| (ns.clone(), name.clone())),
                    );
                    keys
                }
                Changes::Keys(keys) => keys,
            };
            if !keys.is_empty() {
                self.memory.waiting_dirty = true;
            }
            self.memory.pod_groups_dirty.extend(keys);
        }
    }

    /// Looks at the groups marked since the last pass (a pod of theirs changed, or
    /// their summary moved): releases or cancels what lost pods, reports why a group
    /// waits, marks timed-out pods. A group whose write failed stays marked.
    async fn check_groups(&mut self) {
        let dirty = std::mem::take(&mut self.memory.groups_dirty);
        for key in dirty {
            let summary = self
                .memory
                .seq_of
                .get(&key)
                .and_then(|seq| self.memory.summaries.get(seq))
                .cloned();
            let (Some(s), Some(pods)) = (summary, self.memory.pods_of.get(&key).cloned()) else {
                continue;
            };
            let released = self.release_gone(&s, &pods).await;
            let reported = self.report(&s, &pods).await;
            if !(released && reported) {
                self.memory.groups_dirty.insert(key);
            }
        }
    }

    /// Releases placed members of `s` whose pods are gone or finished; cancels it if
    /// queued and it lost a pod (its other pods are submitted again); forgets its
    /// pods' submission once cancelled. False when a write failed.
    async fn release_gone(&mut self, s: &GroupSummary, pods: &[PodRef]) -> bool {
        let gone: Vec<&PodRef> = pods.iter().filter(|p| !self.memory.pods.alive(p)).collect();
        match s.state {
            GroupState::Placed if !gone.is_empty() => {
                if let Some(why) = self.strict_gang_broken(s, pods) {
                    return self.release_whole(s, pods, &why).await;
                }
                let names = placed_members(s, |key| {
                    gone.iter()
                        .any(|p| p.namespace == key.namespace && p.name == key.member)
                });
                if names.is_empty() {
                    return true;
                }
                if !self.release(s.seq, names, "members of gone pods").await {
                    return false;
                }
            }
            GroupState::Queued | GroupState::Placing { .. } if !gone.is_empty() => {
                let cmd = MetaCommand::Cancel {
                    seq: s.seq,
                    at_ms: now_ms(),
                };
                if let Err(e) = self.groups.meta(&cmd).await {
                    tracing::warn!(group = s.seq, error = %e, "cancelling a group that lost a pod failed");
                    return false;
                }
            }
            GroupState::Done {
                how: Terminal::Cancelled,
            } => {
                for p in pods {
                    if self.memory.submitted.get(&p.uid) == Some(&s.key) {
                        self.unmark_submitted(p);
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// Why a placed group must be released whole: one of its Strict gangs has fewer
    /// live pods than its minMember and none of the group's pods is bound yet (a bound
    /// pod cannot be taken back, so after the first binding the group stays).
    fn strict_gang_broken(&self, s: &GroupSummary, pods: &[PodRef]) -> Option<String> {
        let pod_groups = self.pod_groups();
        let mut live: BTreeMap<GangId, (u32, GangParams)> = BTreeMap::new();
        for p in pods {
            let Some(facts) = self.memory.pods.same(p).filter(|f| !f.finished) else {
                continue;
            };
            if facts.bound() {
                return None;
            }
            if let Ok(Identity::Gang(g)) = gangs::identify(&facts.object, &pod_groups) {
                live.entry(g.id.clone()).or_insert((0, g)).0 += 1;
            }
        }
        // A gang of the group with no live pod at all cannot reach any minMember.
        if let Some(gone) = s
            .gangs
            .iter()
            .find(|g| !live.keys().any(|id| &id.to_string() == *g))
        {
            return Some(format!(
                "gang {gone} lost every pod before binding; the group's placement is released and it waits for members again"
            ));
        }
        live.values()
            .find(|(n, g)| g.mode == GangMode::Strict && *n < g.min_member)
            .map(|(n, g)| {
                format!(
                    "gang {} (Strict) lost a pod before binding: {n} of minMember {} left; its placement is released and it waits for members again",
                    g.id, g.min_member
                )
            })
    }

    /// Releases members `names` of group `seq` (`what` names them in logs); false when
    /// the next pass must try again: the release failed, or a shard move holds it a
    /// moment (meta refused it as busy).
    async fn release(&self, seq: GroupSeq, names: Vec<String>, what: &str) -> bool {
        match release_members(&self.groups, seq, names).await {
            Err(e) => {
                tracing::warn!(group = seq, error = %e, "releasing {what} failed; retrying next pass");
                false
            }
            Ok(MetaReply::Rejected {
                kind: RejectionKind::Busy,
                reason,
            }) => {
                tracing::info!(
                    group = seq,
                    reason,
                    "releasing {what} waits for a shard move"
                );
                false
            }
            Ok(_) => true,
        }
    }

    /// Releases every placement of group `s` and forgets its live pods' submission, so
    /// they are submitted again once their gangs are ready.
    async fn release_whole(&mut self, s: &GroupSummary, pods: &[PodRef], why: &str) -> bool {
        let names = placed_members(s, |_| true);
        if !self.release(s.seq, names, "a broken Strict gang").await {
            return false;
        }
        tracing::info!(group = s.seq, reason = %why, "released a Strict gang that lost a pod");
        for p in pods {
            self.unmark_submitted(p);
            if self.memory.pods.alive(p) {
                self.failed_scheduling(p, why).await;
            }
        }
        true
    }

    /// Keeps a queue for every ElasticQuota (named after its namespace) and deletes the
    /// queues of ElasticQuotas gone; a queue with live groups is deleted once they end.
    /// Compared with meta's queues every pass (a local read), so a write only follows a
    /// change.
    async fn sync_queues(&mut self) {
        let objects: Vec<Arc<Value>> = self
            .cache
            .read(Slot::ElasticQuotas, |o| o.values().cloned().collect());
        let (wanted, problems) = queues::queues_of(objects.iter().map(|o| o.as_ref()));
        for (subject, message) in problems {
            self.warn_once(&subject, &message);
        }
        let current: Vec<QueueSpec> = match self.groups.meta_query_local(&MetaQuery::Queues) {
            Ok(MetaReply::Queues { queues }) => queues.into_iter().map(|q| q.spec).collect(),
            _ => return,
        };
        let kept_before: BTreeMap<&str, &QueueSpec> = current
            .iter()
            .filter(|q| q.managed_by.starts_with("ElasticQuota "))
            .map(|q| (q.name.as_str(), q))
            .collect();
        let mut writes = Vec::new();
        for (name, spec) in &wanted {
            if kept_before.get(name.as_str()) != Some(&spec) {
                writes.push(MetaCommand::PutQueue {
                    queue: spec.clone(),
                });
            }
        }
        for (name, spec) in &kept_before {
            if !wanted.contains_key(*name) {
                writes.push(MetaCommand::DeleteQueue {
                    name: name.to_string(),
                    managed_by: spec.managed_by.clone(),
                });
            }
        }
        // A namespace's pods are charged to the queue its ElasticQuota keeps: only once
        // meta holds it as kept (a queue the admin API made under that name is not it),
        // which is before this pass's writes, or by one of them.
        let mut kept: BTreeSet<String> = wanted
            .keys()
            .filter(|n| kept_before.contains_key(n.as_str()))
            .cloned()
            .collect();
        let mut specs: BTreeMap<String, QueueSpec> = current
            .iter()
            .map(|q| (q.name.clone(), q.clone()))
            .collect();
        for cmd in writes {
            let subject = match &cmd {
                MetaCommand::PutQueue { queue } => queue.managed_by.clone(),
                MetaCommand::DeleteQueue { managed_by, .. } => managed_by.clone(),
                _ => String::new(),
            };
            match self.groups.meta(&cmd).await {
                Ok(MetaReply::Rejected { reason, .. }) => {
                    self.warn_once(&subject, &format!("{subject}: {reason}"));
                }
                Ok(_) => {
                    self.memory.reported.remove(&subject);
                    if let MetaCommand::PutQueue { queue } = &cmd {
                        kept.insert(queue.name.clone());
                        specs.insert(queue.name.clone(), queue.clone());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "syncing queues failed; retrying next pass"),
            }
        }
        self.memory.kept_queues = kept;
        self.memory.queue_specs = specs;
    }

    /// Submits the pending pods of ours not yet submitted, when something that decides
    /// them changed (a pod, a PodGroup, a claim, a submission given up). Not before the
    /// pools the shards offer were compared with the slices: a pool whose slices went
    /// while no leader watched must not be given out meanwhile.
    async fn submit_pending(&mut self) {
        if !self.memory.offered_read {
            return;
        }
        if !std::mem::take(&mut self.memory.waiting_dirty) || self.memory.waiting.is_empty() {
            return;
        }
        let pod_groups = self.pod_groups();
        let claims: ClaimIndex = self.cache.read(Slot::ResourceClaims, |o| o.clone());
        let mut ready = Vec::new();
        let mut problems = Vec::new();
        let mut queue_of: HashMap<String, String> = HashMap::new();
        let mut unhonoured = Vec::new();
        for key in &self.memory.waiting {
            let Some(facts) = self.memory.pods.get(key) else {
                continue;
            };
            let (queue, not_honoured) = queues::queue_of_pod(
                &facts.object,
                &self.memory.kept_queues,
                &self.memory.queue_specs,
            );
            if let Some(why) = not_honoured {
                let subject = format!("queue label in namespace {}", facts.pod.namespace);
                unhonoured.push((subject, why));
            }
            queue_of.insert(facts.pod.uid.clone(), queue);
            let identity = match gangs::identify(&facts.object, &pod_groups) {
                Ok(i) => i,
                Err(p) => {
                    problems.push((facts.pod.clone(), p));
                    continue;
                }
            };
            let spec = objects::pod_spec(&facts.object, &claims).and_then(|(mut spec, names)| {
                self.share_claims(facts, &mut spec, &names, &claims)?;
                Ok(spec)
            });
            match spec {
                Ok(spec) => ready.push(ReadyPod {
                    arrival: facts.arrival.clone(),
                    pod: facts.pod.clone(),
                    spec,
                    identity,
                }),
                Err(p) => problems.push((facts.pod.clone(), p)),
            }
        }
        for (subject, why) in unhonoured {
            self.warn_once(&subject, &why);
        }
        let bound_per_gang = self.bound_per_gang(&ready, &pod_groups);
        let satisfied = gangs::apply_match_policies(&mut ready, &bound_per_gang);
        for (pod, problem) in problems {
            if let PodProblem::Invalid(why) = problem {
                self.failed_scheduling(&pod, &why).await;
            }
        }
        let mut submissions = gangs::submissions(&ready, &satisfied);
        for s in &mut submissions {
            // A group is charged to one queue: its first pod's.
            if let Some(q) = s.pods.first().and_then(|p| queue_of.get(&p.uid)) {
                s.group.queue = q.clone();
            }
        }
        for chunk in submissions.chunks(SUBMIT_BATCH_MAX) {
            if !self.submit(chunk).await {
                // Looked at again next pass.
                self.memory.waiting_dirty = true;
            }
        }
    }

    /// Records in `spec` the ResourceClaims the pod shares with other pods of its gang:
    /// a claim it carries stays among its claims, one it follows leaves them (its
    /// carrier allocates it). Refuses a claim shared beyond the gang.
    fn share_claims(
        &self,
        facts: &PodFacts,
        spec: &mut PodSpec,
        names: &BTreeMap<String, String>,
        claims: &ClaimIndex,
    ) -> Result<(), PodProblem> {
        for (claim, object_name) in names {
            let key = (facts.pod.namespace.clone(), object_name.clone());
            let others: Vec<objects::Sharer> = self
                .memory
                .pods
                .naming_claim(&key)
                .filter(|f| f.pod.uid != facts.pod.uid)
                .map(|f| objects::Sharer {
                    name: f.pod.name.clone(),
                    uid: f.pod.uid.clone(),
                    ours: f.ours,
                    gang: f.gang.clone(),
                    placed: f.bound() || self.memory.submitted.contains_key(&f.pod.uid),
                    going: f.terminating,
                })
                .collect();
            let role = objects::share_role(
                &facts.object,
                facts.gang.as_deref(),
                claim,
                object_name,
                claims.get(&key).map(|o| o.as_ref()),
                &others,
            )?;
            // A claim the pod names directly may gain sharers later: its first pod carries
            // it, so that they find it carried. A claim made from a template is the pod's own.
            if role == ShareRole::Alone && !objects::names_claim_directly(&facts.object, claim) {
                continue;
            }
            if role == ShareRole::Follower {
                spec.claims.retain(|c| &c.name != claim);
            }
            spec.shares.push(ClaimShare {
                pod_claim: claim.clone(),
                claim: format!("{}/{object_name}", facts.pod.namespace),
            });
        }
        Ok(())
    }

    /// The bound pods of ours of each gang that `ready` pods belong to.
    fn bound_per_gang(
        &self,
        ready: &[ReadyPod],
        pod_groups: &PodGroupIndex,
    ) -> BTreeMap<GangId, BoundPods> {
        let mut counted: BTreeMap<GangId, BoundPods> = BTreeMap::new();
        for pod in ready {
            let Identity::Gang(g) = &pod.identity else {
                continue;
            };
            if counted.contains_key(&g.id) {
                continue;
            }
            let mut bound = BoundPods::default();
            let members = self.memory.pods.in_gang(&g.id.namespace, &g.id.name);
            for facts in members.filter(|f| f.ours && f.bound()) {
                if let Ok(Identity::Gang(p)) = gangs::identify(&facts.object, pod_groups) {
                    if p.id == g.id {
                        bound.ever += 1;
                        if !facts.finished {
                            bound.running += 1;
                        }
                    }
                }
            }
            counted.insert(g.id.clone(), bound);
        }
        counted
    }

    /// Proposes one batch of submissions; false when the meta group did not answer.
    async fn submit(&mut self, chunk: &[gangs::Submission]) -> bool {
        let at_ms = now_ms();
        let commands = chunk
            .iter()
            .map(|s| MetaCommand::Submit {
                key: s.key.clone(),
                group: s.group.clone(),
                at_ms,
                live_max: None,
            })
            .collect();
        let replies = match self.groups.meta(&MetaCommand::Batch { commands }).await {
            Ok(MetaReply::Batch { replies }) => replies,
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected reply to a submission batch");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "submitting pods failed; retrying next pass");
                return false;
            }
        };
        tracing::info!(
            groups = chunk.len(),
            "submitted pending pods as gang groups"
        );
        for (s, reply) in chunk.iter().zip(replies) {
            match reply {
                MetaReply::Submitted { .. } => {
                    for p in &s.pods {
                        self.mark_submitted(p, &s.key);
                    }
                    self.memory.pods_of.insert(s.key.clone(), s.pods.clone());
                }
                MetaReply::Rejected { reason, .. } => {
                    for p in &s.pods {
                        self.failed_scheduling(p, &reason).await;
                    }
                }
                other => tracing::warn!(reply = ?other, "unexpected submission reply"),
            }
        }
        true
    }

    fn pod_groups(&self) -> PodGroupIndex {
        let mut index = PodGroupIndex::new();
        for slot in [Slot::PodGroupsSigs, Slot::PodGroupsX] {
            self.cache.read(slot, |o| {
                for (k, v) in o {
                    index.insert(k.clone(), v.clone());
                }
            });
        }
        index
    }

    /// Writes the status (phase, scheduled, running, succeeded, failed) of the
    /// PodGroups marked since the last pass, where it changed; a failed write stays marked.
    async fn write_pod_group_status(&mut self) {
        let dirty = std::mem::take(&mut self.memory.pod_groups_dirty);
        for (ns, name) in dirty {
            for slot in [Slot::PodGroupsX, Slot::PodGroupsSigs] {
                let key = (slot, ns.clone(), name.clone());
                let Some(group) = self.cache.get(slot, &ns, &name) else {
                    self.memory.pod_group_status.remove(&key);
                    continue;
                };
                let min = group["spec"]["minMember"].as_u64().unwrap_or(1);
                let members: Vec<&Value> = self
                    .memory
                    .pods
                    .in_pod_group(&(ns.clone(), name.clone()))
                    .map(|f| f.object.as_ref())
                    .collect();
                let status = gangs::pod_group_status(min, &members);
                let current = &group["status"];
                let unchanged = ["phase", "scheduled", "running", "succeeded", "failed"]
                    .iter()
                    .all(|f| {
                        current[*f] == status[*f] || (current[*f].is_null() && status[*f] == 0)
                    });
                if unchanged || self.memory.pod_group_status.get(&key) == Some(&status) {
                    continue;
                }
                let resource = slot.resource();
                let path = format!(
                    "/apis/{}/namespaces/{ns}/podgroups/{name}/status",
                    resource.api_version
                );
                match api::merge_patch(&self.client, &path, &json!({"status": status})).await {
                    Ok(_) => {
                        self.memory.pod_group_status.insert(key, status);
                    }
                    Err(e) => {
                        tracing::debug!(pod_group = %format!("{ns}/{name}"), error = %e, "PodGroup status not written");
                        self.memory
                            .pod_groups_dirty
                            .insert((ns.clone(), name.clone()));
                    }
                }
            }
        }
    }

    /// Events for a group that cannot be placed, and the timeout mark for a timed-out
    /// one. False when a write failed.
    async fn report(&mut self, s: &GroupSummary, pods: &[PodRef]) -> bool {
        let mut done = true;
        match s.state {
            GroupState::Queued if s.attempts > 0 && !s.reason.is_empty() => {
                for p in pods {
                    done &= self.failed_scheduling(p, &s.reason).await;
                }
            }
            GroupState::Done {
                how: Terminal::TimedOut,
            } => {
                for p in pods {
                    if self.memory.timed_out.contains(&p.uid) || !self.memory.pods.alive(p) {
                        continue;
                    }
                    let patch = json!({"metadata": {"annotations": {ANNOTATION_TIMEOUT: "true"}}});
                    match api::merge_patch(&self.client, &api::path_of(p), &patch).await {
                        Ok(_) => {
                            self.memory.timed_out.insert(p.uid.clone());
                            let why =
                                format!("gang timed out before it could be placed: {}", s.reason);
                            done &= self.failed_scheduling(p, &why).await;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %p, error = %e, "marking a timed-out pod failed");
                            done = false;
                        }
                    }
                }
            }
            _ => {}
        }
        done
    }

    /// Writes a FailedScheduling event for `pod` unless this reason was the last one
    /// reported; false when the write failed.
    async fn failed_scheduling(&mut self, pod: &PodRef, why: &str) -> bool {
        if self.memory.reported.get(&pod.uid).map(String::as_str) == Some(why) {
            return true;
        }
        let result = api::pod_event(
            &self.client,
            &self.opts.scheduler_name,
            pod,
            EventType::Warning,
            "FailedScheduling",
            why,
            &api::rfc3339(now_ms()),
        )
        .await;
        match result {
            Ok(()) => {
                self.memory
                    .reported
                    .insert(pod.uid.clone(), why.to_string());
                true
            }
            Err(e) => {
                tracing::debug!(pod = %pod, error = %e, "FailedScheduling event not recorded");
                false
            }
        }
    }

    fn warn_once(&mut self, subject: &str, message: &str) {
        if self.memory.reported.get(subject).map(String::as_str) != Some(message) {
            tracing::warn!("{message}");
            self.memory
                .reported
                .insert(subject.to_string(), message.to_string());
        }
    }
}

/// Waits until the meta group applies entries here (forever if it cannot be watched).
async fn meta_applied(meta: &mut Option<gangway_raft::GroupChanges>) {
    match meta {
        Some(feed) => {
            if !feed.changed().await {
                // The group stopped: nothing more will be applied.
                *meta = None;
                futures::future::pending::<()>().await;
            }
        }
        None => futures::future::pending::<()>().await,
    }
}

/// The names of the placed members of `s` that `chosen` picks (what `release_members`
/// takes).
fn placed_members(s: &GroupSummary, chosen: impl Fn(&MemberKey) -> bool) -> Vec<String> {
    s.placements
        .keys()
        .filter(|member| MemberKey::try_from((*member).clone()).is_ok_and(|key| chosen(&key)))
        .cloned()
        .collect()
}

/// The key under which the rule taints of a network-attached device are kept for
/// `shard` (a node name can hold no `~`, so it names no node).
fn network_key(shard: u32) -> String {
    format!("~network/{shard}")
}

/// The shard a [`network_key`] names, if it is one.
fn network_shard(key: &str) -> Option<u32> {
    key.strip_prefix("~network/")?.parse().ok()
}
