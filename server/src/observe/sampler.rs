//! The metrics sampler: once a second, on every replica, turns the state of the
//! groups this replica leads into gauges: gang groups by state (meta leader),
//! open reservations and the oldest one's age, and devices by node, driver and
//! state (shard leaders). A replica that stops leading a group sets that group's
//! gauges to zero, so a sum over replicas counts each group once. The meta leader also
//! reports every queue's usage, min, max, share and gang groups, and the reservations
//! for the head of the line. `Replica` registers
//! every labelled counter at zero before starting it, so rates exist before the first
//! event. docs/METRICS.md is the catalogue. Owned by `Replica`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::sync::watch;

use crate::replicated::growth::ShardCount;
use crate::replicated::{now_ms, Groups};
use gangway_core::ledger::meta::queues::share;
use gangway_core::ledger::meta::{GroupState, MetaQuery, MetaReply, QueueStatus};
use gangway_core::model::ResourceName;
use gangway_core::query::{ShardAnswer, ShardQuery, ShardStats};

/// Period between samples, in ms.
pub const SAMPLE_PERIOD_MS: u64 = 1_000;

/// Device states the `gangway_devices` gauge reports.
const DEVICE_STATES: [&str; 3] = ["allocated", "free", "unhealthy"];

/// The (node, driver) device series one shard's gauges were last set for.
type DeviceSeries = BTreeSet<(String, String)>;

/// Samples until `stop` fires.
pub async fn run(groups: Groups, shards: ShardCount, mut stop: watch::Receiver<bool>) {
    let mut leading_meta = false;
    let mut reported: BTreeMap<u32, DeviceSeries> = BTreeMap::new();
    let mut queue_series = QueueSeries::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(SAMPLE_PERIOD_MS)) => {}
        }
        let me = groups.host().node_id();
        if groups.host().leader_of(0) == Some(me) {
            if let Ok(MetaReply::StateCounts { counts }) =
                groups.meta_query_local(&MetaQuery::StateCounts)
            {
                for (state, n) in counts {
                    metrics::gauge!("gangway_gang_groups", "state" => state).set(n as f64);
                }
                leading_meta = true;
            }
            let held = MetaQuery::HeadReservations { at_ms: now_ms() };
            if let Ok(MetaReply::HeadReservations { reservations }) = groups.meta_query_local(&held)
            {
                let nodes: usize = reservations.iter().map(|r| r.node_count()).sum();
                metrics::gauge!("gangway_reservations").set(reservations.len() as f64);
                metrics::gauge!("gangway_reserved_nodes").set(nodes as f64);
            }
            if let Ok(MetaReply::Queues { queues }) = groups.meta_query_local(&MetaQuery::Queues) {
                let now = report_queues(&queues);
                zero_queues(queue_series.difference(&now));
                queue_series = now;
            }
        } else if leading_meta {
            for state in GroupState::NAMES {
                metrics::gauge!("gangway_gang_groups", "state" => state).set(0.0);
            }
            zero_queues(queue_series.iter());
            queue_series.clear();
            metrics::gauge!("gangway_reservations").set(0.0);
            metrics::gauge!("gangway_reserved_nodes").set(0.0);
            leading_meta = false;
        }
        for shard in shards.ids() {
            if groups.host().leader_of(u64::from(shard)) == Some(me) {
                let at_ms = now_ms();
                if let Ok(ShardAnswer::Stats { stats }) =
                    groups.shard_query_local(shard, &ShardQuery::Stats { at_ms })
                {
                    let before = reported.remove(&shard).unwrap_or_default();
                    let now = report_shard(shard, &stats, at_ms);
                    zero_devices(shard, before.difference(&now));
                    reported.insert(shard, now);
                }
            } else if let Some(before) = reported.remove(&shard) {
                zero_devices(shard, before.iter());
                report_shard(shard, &ShardStats::default(), 0);
            }
        }
    }
}

/// The (queue, resource) series the queue gauges were last set for (resource empty:
/// the per-queue gauges).
type QueueSeries = BTreeSet<(String, String)>;

/// Sets every queue's gauges; returns the series it set.
fn report_queues(queues: &[QueueStatus]) -> QueueSeries {
    let mut series = QueueSeries::new();
    for q in queues {
        let name = q.spec.name.clone();
        let decayed = q.decayed_usage.clone().unwrap_or_default();
        let mut resources: BTreeSet<ResourceName> = q.usage.nonzero().map(|(r, _)| r).collect();
        resources.extend(decayed.nonzero().map(|(r, _)| r));
        resources.extend(q.spec.min.iter().map(|(r, _)| r));
        resources.extend(q.spec.max.iter().map(|(r, _)| r));
        for r in resources {
            let label = r.to_string();
            let used = q.usage.get(&r) as f64;
            metrics::gauge!("gangway_queue_usage", "queue" => name.clone(), "resource" => label.clone()).set(used);
            let min = q.spec.min.get(&r).unwrap_or(0) as f64;
            metrics::gauge!("gangway_queue_min", "queue" => name.clone(), "resource" => label.clone()).set(min);
            // No limit reads as -1, so a dashboard can tell it from a max of zero.
            let max = q.spec.max.get(&r).map_or(-1.0, |m| m as f64);
            metrics::gauge!("gangway_queue_max", "queue" => name.clone(), "resource" => label.clone()).set(max);
            metrics::gauge!("gangway_queue_decayed_usage", "queue" => name.clone(), "resource" => label.clone())
                .set(decayed.get(&r) as f64);
            series.insert((name.clone(), label));
        }
        // The share the fair order measures: usage now, plus the decayed usage while
        // fair sharing over time is on.
        metrics::gauge!("gangway_queue_share", "queue" => name.clone())
            .set(share(&q.spec, &q.usage.saturating_add(&decayed)).0);
        metrics::gauge!("gangway_queue_gang_groups", "queue" => name.clone(), "state" => "queued")
            .set(q.queued as f64);
        metrics::gauge!("gangway_queue_gang_groups", "queue" => name.clone(), "state" => "admitted")
            .set(q.admitted as f64);
        series.insert((name, String::new()));
    }
    series
}

/// Sets the gauges of queues gone (or no longer this replica's to report) to zero.
fn zero_queues<'a>(series: impl Iterator<Item = &'a (String, String)>) {
    for (queue, resource) in series {
        if resource.is_empty() {
            metrics::gauge!("gangway_queue_share", "queue" => queue.clone()).set(0.0);
            for state in ["queued", "admitted"] {
                metrics::gauge!("gangway_queue_gang_groups", "queue" => queue.clone(), "state" => state)
                    .set(0.0);
            }
        } else {
            for gauge in [
                "gangway_queue_usage",
                "gangway_queue_min",
                "gangway_queue_max",
                "gangway_queue_decayed_usage",
            ] {
                metrics::gauge!(gauge, "queue" => queue.clone(), "resource" => resource.clone())
                    .set(0.0);
            }
        }
    }
}

/// Sets one shard's gauges; returns the device series it set.
fn report_shard(shard: u32, stats: &ShardStats, at_ms: u64) -> DeviceSeries {
    let label = shard.to_string();
    metrics::gauge!("gangway_reservations_open", "shard" => label.clone())
        .set(stats.open_reservations as f64);
    let age_s = stats
        .oldest_reserved_at_ms
        .map_or(0.0, |t| at_ms.saturating_sub(t) as f64 / 1_000.0);
    metrics::gauge!("gangway_reservation_oldest_age_seconds", "shard" => label.clone()).set(age_s);
    let mut series = DeviceSeries::new();
    for d in &stats.devices {
        let free = d.published.saturating_sub(d.allocated);
        for (state, n) in DEVICE_STATES.iter().zip([d.allocated, free, d.unhealthy]) {
            metrics::gauge!("gangway_devices", "shard" => label.clone(), "node" => d.node.clone(),
                "driver" => d.driver.clone(), "state" => *state)
            .set(n as f64);
        }
        series.insert((d.node.clone(), d.driver.clone()));
    }
    series
}

fn zero_devices<'a>(shard: u32, series: impl Iterator<Item = &'a (String, String)>) {
    let label = shard.to_string();
    for (node, driver) in series {
        for state in DEVICE_STATES {
            metrics::gauge!("gangway_devices", "shard" => label.clone(), "node" => node.clone(),
                "driver" => driver.clone(), "state" => state)
            .set(0.0);
        }
    }
}
