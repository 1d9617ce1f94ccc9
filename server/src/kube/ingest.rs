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
//!
//! The loop, its memory and recovery live here; each kind of object's steps in
//! `ingest/nodes.rs`, `devices.rs`, `taint_rules.rs`, `observed.rs`, `groups.rs`,
//! `framework.rs`, `submissions.rs` and `status.rs`.

mod devices;
mod framework;
mod groups;
mod nodes;
mod observed;
mod status;
mod submissions;
mod taint_rules;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;

use crate::failpoints;
use crate::kube::api::{self, EventType};
use crate::kube::gangs::{
    self, BoundPods, GangParams, Identity, PodGroupApi, PodGroups, ReadyPod, ANNOTATION_TIMEOUT,
};
use crate::kube::informer::{Cache, Changes, Key, Slot};
use crate::kube::objects::{
    self, ClaimIndex, PodProblem, PodRef, PoolKey, PoolSlices, ShareRole, SliceScope,
};
use crate::kube::pod_index::{PodFacts, PodIndex, Touched};
use crate::kube::queues;
use crate::kube::topology::{kueue_hierarchy, volcano_tiers};
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
const CHANGE_SLOTS: [Slot; 9] = [
    Slot::Nodes,
    Slot::ResourceSlices,
    Slot::DeviceTaintRules,
    Slot::Pods,
    Slot::ResourceClaims,
    Slot::PodGroupsSigs,
    Slot::PodGroupsX,
    Slot::PodGroupsK8s,
    Slot::PodGroupsVolcano,
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
    /// Kubernetes or Volcano PodGroup (API, namespace, name) → why its gang was last found
    /// unplaceable.
    pod_group_unschedulable: HashMap<(PodGroupApi, Key), String>,
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
    /// Framework pods (uid) bound for the gRPC group that names them → (group, member
    /// key): when such a pod goes or finishes, its member is released.
    framework_bound: HashMap<String, (GroupSeq, String)>,
    /// Members of gRPC groups whose named pods went or finished, still to release.
    framework_gone: BTreeMap<GroupSeq, BTreeSet<String>>,
    /// Whether the framework pods the shards hold bound were read since leading started.
    framework_recovered: bool,
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
        self.sync_kueue_topologies();
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
        self.recover_framework_bound().await;
        self.release_framework_gone().await;
        self.submit_pending().await;
        self.write_pod_group_status().await;
        Ok(())
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

    /// Keeps the hierarchies of Kueue's Topology objects for the coordinator; one that
    /// cannot be read is logged and left out.
    fn sync_kueue_topologies(&mut self) {
        if matches!(
            self.cache.take_changes(Slot::KueueTopologies),
            Changes::Keys(keys) if keys.is_empty()
        ) {
            return;
        }
        let hierarchies = self.cache.read(Slot::KueueTopologies, |objects| {
            objects
                .values()
                .filter_map(|o| match kueue_hierarchy(o) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        tracing::warn!(error = %e, "Kueue Topology left out");
                        None
                    }
                })
                .collect()
        });
        if self.opts.learned_topologies.replace(hierarchies) {
            // Pods refused for a tier no hierarchy had are looked at again.
            self.memory.waiting_dirty = true;
            tracing::info!(
                topologies = ?self.opts.learned_topologies.merged(&self.opts.topologies),
                "topology hierarchies changed"
            );
        }
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
