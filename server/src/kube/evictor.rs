//! The evictor: on every replica, for each shard it leads, deletes the pods gangway
//! placed that must leave their devices (unhealthy, NoExecute-tainted past the
//! pod's toleration, or dropped by a republished pool), as Kubernetes' taint
//! managers do: a `DisruptionTarget` condition, then a delete with the pod's uid as
//! precondition, and a Warning event naming the device. The ledger's
//! `ShardQuery::Evictions` is the work list; the ingest loop then releases the
//! deleted pods like any other. A pod is asked to go at most once per
//! `EVICT_RETRY_MS`, so a new leader (or a failed call) repeats a delete harmlessly:
//! the uid precondition keeps it from touching a successor under the same name.
//! Owned by `kube::run`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::kube::api::{self, EventType, EvictOutcome};
use crate::kube::objects::PodRef;
use crate::kube::KubeOptions;
use crate::ledger::query::{PodEviction, ShardAnswer, ShardQuery};
use crate::ledger::EvictionCause;
use crate::model::MemberKey;
use crate::replicated::{now_ms, Groups};

/// Period of the evictor's look at its shards, in ms.
pub const EVICT_POLL_MS: u64 = 500;
/// Pods evicted per shard per look.
pub const EVICT_BATCH_MAX: u32 = 64;
/// Wait before the same pod is asked to go again, in ms.
pub const EVICT_RETRY_MS: u64 = 5_000;
/// The `DisruptionTarget` reason, as Kubernetes' device taint eviction controller writes it.
pub const EVICTION_REASON: &str = "DeletionByDeviceTaintManager";

/// Runs the evictor until `stop` fires.
pub async fn run(
    groups: Groups,
    shards: u32,
    client: kube::Client,
    opts: KubeOptions,
    mut stop: watch::Receiver<bool>,
) {
    let mut asked: HashMap<MemberKey, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(EVICT_POLL_MS)) => {}
        }
        let now = Instant::now();
        asked.retain(|_, at| *at > now);
        let me = groups.host().node_id();
        for shard in 1..=shards {
            if groups.host().leader_of(u64::from(shard)) != Some(me) {
                continue;
            }
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
                evict(&client, &opts, &p).await;
            }
        }
    }
}

/// Eviction causes, as `gangway_evictions_total{cause}` labels them.
pub const CAUSES: [&str; 3] = ["unhealthy", "no_execute_taint", "device_removed"];

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

async fn evict(client: &kube::Client, opts: &KubeOptions, p: &PodEviction) {
    let pod = PodRef {
        namespace: p.member.namespace.clone(),
        name: p.member.member.clone(),
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
