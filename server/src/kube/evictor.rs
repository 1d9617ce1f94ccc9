//! The evictor: on every replica, for each shard it leads, deletes the pods gangway
//! placed that must leave: those whose devices went bad (unhealthy, NoExecute-tainted
//! past the pod's toleration, or dropped by a republished pool), as Kubernetes' taint
//! managers do, and the victims of committed preemptions, as kube-scheduler does. Each
//! gets a `DisruptionTarget` condition, then a delete with the pod's uid as
//! precondition, and an event naming the device or the preemptor. The ledger's
//! `ShardQuery::Evictions` and `ShardQuery::PreemptionVictims` are the work lists; the
//! ingest loop then releases deleted device holders like any other pod. A preemption
//! victim's room stays held until its pod is gone from the API server (or finished):
//! the evictor then records `LedgerOp::VictimsGone`, and the preemptor's members on
//! that node become bindable; meanwhile they carry `status.nominatedNodeName`. A pod
//! is asked to go at most once per `EVICT_RETRY_MS`, so a new leader (or a failed call)
//! repeats a delete harmlessly: the uid precondition keeps it from touching a successor
//! under the same name. Owned by `kube::run`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::kube::api::{self, EventType, EvictOutcome};
use crate::kube::informer::Cache;
use crate::kube::objects::PodRef;
use crate::kube::KubeOptions;
use crate::replicated::growth::ShardCount;
use crate::replicated::{now_ms, Groups};
use gangway_core::ledger::command::LEDGER_BATCH_MAX;
use gangway_core::ledger::{EvictionCause, LedgerOp};
use gangway_core::model::MemberKey;
use gangway_core::query::{PodEviction, PreemptedPod, ShardAnswer, ShardQuery};

/// Period of the evictor's look at its shards, in ms.
pub const EVICT_POLL_MS: u64 = 500;
/// Pods evicted per shard per look.
pub const EVICT_BATCH_MAX: u32 = 64;
/// Wait before the same pod is asked to go again, in ms.
pub const EVICT_RETRY_MS: u64 = 5_000;
/// The `DisruptionTarget` reason, as Kubernetes' device taint eviction controller writes it.
pub const EVICTION_REASON: &str = "DeletionByDeviceTaintManager";
/// The `DisruptionTarget` reason of a preemption victim, as kube-scheduler writes it.
pub const PREEMPTION_REASON: &str = "PreemptionByScheduler";
/// Preemptor pods remembered as nominated; past it the memory starts over (a pod may
/// be nominated once more, which is harmless).
pub const NOMINATED_REMEMBERED_MAX: usize = 10_000;

/// What the evictor keeps between looks.
#[derive(Default)]
struct Memory {
    /// Pods asked to go, until when not to ask again.
    asked: HashMap<MemberKey, Instant>,
    /// Preemption victims asked to go, likewise (kept apart: a victim may also be on a
    /// bad device).
    victims_asked: HashMap<MemberKey, Instant>,
    /// Preemptor pods (member, uid) already given their nominated node.
    nominated: HashSet<(MemberKey, String)>,
}

/// Runs the evictor until `stop` fires.
pub async fn run(
    groups: Groups,
    shards: ShardCount,
    client: kube::Client,
    cache: Arc<Cache>,
    opts: KubeOptions,
    mut stop: watch::Receiver<bool>,
) {
    let mut memory = Memory::default();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(EVICT_POLL_MS)) => {}
        }
        let now = Instant::now();
        memory.asked.retain(|_, at| *at > now);
        memory.victims_asked.retain(|_, at| *at > now);
        let me = groups.host().node_id();
        for shard in shards.ids() {
            if groups.host().leader_of(u64::from(shard)) != Some(me) {
                continue;
            }
            preemption_victims(&groups, shard, &client, &cache, &opts, &mut memory).await;
            let asked = &mut memory.asked;
            // Pods already asked (still terminating, say) come first in node order; read
            // past them so that the pods behind them are not starved.
            let query = ShardQuery::Evictions {
                at_ms: now_ms(),
                limit: EVICT_BATCH_MAX
                    .saturating_add(u32::try_from(asked.len()).unwrap_or(u32::MAX)),
            };
            let pods = match groups.shard_query_local(shard, &query) {
                Ok(ShardAnswer::Evictions { pods }) => pods,
                Ok(other) => {
                    tracing::warn!(shard, answer = ?other, "unexpected answer to Evictions");
                    continue;
                }
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot read evictions");
                    continue;
                }
            };
            let fresh: Vec<PodEviction> = pods
                .into_iter()
                .filter(|p| !asked.contains_key(&p.member))
                .take(EVICT_BATCH_MAX as usize)
                .collect();
            for p in fresh {
                asked.insert(
                    p.member.clone(),
                    Instant::now() + Duration::from_millis(EVICT_RETRY_MS),
                );
                let name = pod_name(&cache, &p.member, &p.uid);
                evict(&client, &opts, &p, &name).await;
            }
        }
    }
}

/// One look at shard `shard`'s preemption victims: those whose pods are gone are
/// recorded gone; the others are evicted (once per `EVICT_RETRY_MS`) and the preemptor
/// pods waiting for them nominated to their node. Gone means the informer's copy,
/// once synced, has no pod of that uid, or shows it finished.
async fn preemption_victims(
    groups: &Groups,
    shard: u32,
    client: &kube::Client,
    cache: &Cache,
    opts: &KubeOptions,
    memory: &mut Memory,
) {
    let limit = EVICT_BATCH_MAX
        .saturating_add(u32::try_from(memory.victims_asked.len()).unwrap_or(u32::MAX));
    let victims = match groups.shard_query_local(shard, &ShardQuery::PreemptionVictims { limit }) {
        Ok(ShardAnswer::PreemptionVictims { victims }) => victims,
        Ok(other) => {
            tracing::warn!(shard, answer = ?other, "unexpected answer to PreemptionVictims");
            return;
        }
        Err(e) => {
            tracing::debug!(shard, error = %e, "cannot read preemption victims");
            return;
        }
    };
    if victims.is_empty() || !cache.synced() {
        return;
    }
    let (gone, running): (Vec<_>, Vec<_>) = victims
        .into_iter()
        .map(|v| (victim_pod(cache, &v), v))
        .partition(|(pod, _)| *pod == VictimPod::Gone);
    let gone: Vec<PreemptedPod> = gone.into_iter().map(|(_, v)| v).collect();
    for chunk in gone.chunks(LEDGER_BATCH_MAX) {
        let members = chunk.iter().map(|v| v.member.clone()).collect();
        match groups.shard(shard, LedgerOp::VictimsGone { members }).await {
            Ok(_) => {
                let now = now_ms();
                for v in chunk {
                    let waited = now.saturating_sub(v.since_ms) as f64 / 1_000.0;
                    metrics::histogram!("gangway_preemption_victims_gone_seconds").record(waited);
                    memory.victims_asked.remove(&v.member);
                    tracing::info!(victim = %v.member, node = %v.node, txn = %v.txn, "preemption victim gone; its room is the preemptor's");
                }
            }
            Err(e) => tracing::warn!(shard, error = %e, "recording preemption victims gone failed"),
        }
    }
    let mut evicted = 0;
    for (pod, v) in running {
        for (member, uid) in &v.waiting {
            nominate_once(client, memory, member, uid, &v.node).await;
        }
        if memory.victims_asked.contains_key(&v.member)
            || evicted >= EVICT_BATCH_MAX
            || pod == VictimPod::Terminating
        {
            continue;
        }
        evicted += 1;
        memory.victims_asked.insert(
            v.member.clone(),
            Instant::now() + Duration::from_millis(EVICT_RETRY_MS),
        );
        let name = pod_name(cache, &v.member, &v.uid);
        evict_victim(client, opts, &v, &name).await;
    }
}

/// A preemption victim's pod as the informer's copy shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VictimPod {
    /// Gone from the API server (or another pod holds its name now), or finished: its
    /// containers no longer hold the node's room.
    Gone,
    /// Being deleted already (asked before, by this replica or an earlier leader):
    /// asking again would only repeat its condition and event.
    Terminating,
    /// Running on.
    Running,
}

fn victim_pod(cache: &Cache, v: &PreemptedPod) -> VictimPod {
    let Some(object) = cache.pod_with_uid(&v.member.namespace, &v.member.member, &v.uid) else {
        return VictimPod::Gone;
    };
    let finished = matches!(
        object["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if finished {
        VictimPod::Gone
    } else if !object["metadata"]["deletionTimestamp"].is_null() {
        VictimPod::Terminating
    } else {
        VictimPod::Running
    }
}

/// Sets a waiting preemptor pod's nominated node, once.
async fn nominate_once(
    client: &kube::Client,
    memory: &mut Memory,
    member: &MemberKey,
    uid: &str,
    node: &str,
) {
    let key = (member.clone(), uid.to_string());
    if memory.nominated.contains(&key) {
        return;
    }
    let pod = PodRef {
        namespace: member.namespace.clone(),
        name: member.member.clone(),
        uid: uid.to_string(),
    };
    match api::nominate(client, &pod, node).await {
        Ok(_) => {
            if memory.nominated.len() >= NOMINATED_REMEMBERED_MAX {
                memory.nominated.clear();
            }
            memory.nominated.insert(key);
        }
        Err(e) => tracing::debug!(pod = %pod, error = %e, "nominating failed; will retry"),
    }
}

/// Evicts one preemption victim as kube-scheduler does: `DisruptionTarget` with reason
/// `PreemptionByScheduler`, a uid-precondition delete, and a `Preempted` event.
async fn evict_victim(client: &kube::Client, opts: &KubeOptions, v: &PreemptedPod, name: &str) {
    let pod = PodRef {
        namespace: v.member.namespace.clone(),
        name: name.to_string(),
        uid: v.uid.clone(),
    };
    let message = format!(
        "{}: preempting to accommodate gang {} (higher priority) on node {}",
        opts.scheduler_name, v.preemptor, v.node
    );
    let now = api::rfc3339(now_ms());
    match api::evict(client, &pod, PREEMPTION_REASON, &message, &now).await {
        Ok(EvictOutcome::Deleted) => {
            metrics::counter!("gangway_evictions_total", "cause" => CAUSES[3]).increment(1);
            tracing::info!(pod = %pod, preemptor = %v.preemptor, node = %v.node, "preemption victim evicted");
            let event = api::pod_event(
                client,
                &opts.scheduler_name,
                &pod,
                EventType::Normal,
                "Preempted",
                &format!("Preempted by gang {} on node {}", v.preemptor, v.node),
                &now,
            )
            .await;
            if let Err(e) = event {
                tracing::debug!(pod = %pod, error = %e, "Preempted event not recorded");
            }
        }
        Ok(EvictOutcome::Gone) => tracing::debug!(pod = %pod, "preemption victim already gone"),
        Err(e) => {
            tracing::warn!(pod = %pod, error = %e, "evicting a preemption victim failed; will retry")
        }
    }
}

/// Eviction causes, as `gangway_evictions_total{cause}` labels them.
pub const CAUSES: [&str; 4] = [
    "unhealthy",
    "no_execute_taint",
    "device_removed",
    "preemption",
];

fn cause_label(cause: &EvictionCause) -> &'static str {
    match cause {
        EvictionCause::Unhealthy => CAUSES[0],
        EvictionCause::NoExecuteTaint { .. } => CAUSES[1],
        EvictionCause::DeviceRemoved => CAUSES[2],
    }
}

/// Registers the eviction counters at zero.
pub fn register_metrics() {
    for cause in CAUSES {
        metrics::counter!("gangway_evictions_total", "cause" => cause).increment(0);
    }
}

/// Why a pod must go, for people.
pub fn eviction_message(p: &PodEviction) -> String {
    match &p.cause {
        EvictionCause::Unhealthy => format!("device {} on node {} is unhealthy", p.device, p.node),
        EvictionCause::NoExecuteTaint { key, value } => format!(
            "device {} on node {} has NoExecute taint {key}={value}, not tolerated",
            p.device, p.node
        ),
        EvictionCause::DeviceRemoved => format!(
            "device {} on node {} is no longer published (or no longer has room)",
            p.device, p.node
        ),
    }
}

/// The name of member `member`'s pod of `uid`: the member's own, unless the informer
/// shows the pod under another (one the member selected by labels).
fn pod_name(cache: &Cache, member: &MemberKey, uid: &str) -> String {
    cache
        .pod_with_uid(&member.namespace, &member.member, uid)
        .and_then(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .unwrap_or_else(|| member.member.clone())
}

async fn evict(client: &kube::Client, opts: &KubeOptions, p: &PodEviction, name: &str) {
    let pod = PodRef {
        namespace: p.member.namespace.clone(),
        name: name.to_string(),
        uid: p.uid.clone(),
    };
    let message = eviction_message(p);
    let now = api::rfc3339(now_ms());
    match api::evict(client, &pod, EVICTION_REASON, &message, &now).await {
        Ok(EvictOutcome::Deleted) => {
            metrics::counter!("gangway_evictions_total", "cause" => cause_label(&p.cause))
                .increment(1);
            tracing::info!(pod = %pod, reason = %message, "evicted");
            let event = api::pod_event(
                client,
                &opts.scheduler_name,
                &pod,
                EventType::Warning,
                "DeviceEviction",
                &format!("Deleting pod: {message}"),
                &now,
            )
            .await;
            if let Err(e) = event {
                tracing::debug!(pod = %pod, error = %e, "eviction event not recorded");
            }
        }
        Ok(EvictOutcome::Gone) => tracing::debug!(pod = %pod, "pod to evict is already gone"),
        Err(e) => tracing::warn!(pod = %pod, error = %e, "eviction failed; will retry"),
    }
}
