//! Per-group Raft metrics for Prometheus: term, leadership, leader changes,
//! log, commit and apply positions and apply lag, labelled by group and node.
//! One watcher task per group, owned by the host.

use std::sync::Arc;

use tokio::sync::watch;

use crate::host::{committed_index, Group};
use crate::types::NodeId;

/// Mirrors `group`'s openraft metrics into the `metrics` facade until shutdown.
pub(crate) async fn watch_group(group: Arc<Group>, node: NodeId, mut stop: watch::Receiver<bool>) {
    let mut rx = group.raft.metrics();
    let labels = [("group", group.id.to_string()), ("node", node.to_string())];
    let mut last_leader = None;
    loop {
        let m = rx.borrow_and_update().clone();
        let committed = committed_index(&group);
        let applied = m.last_applied.map(|l| l.index).unwrap_or(0);
        metrics::gauge!("gangway_raft_term", &labels).set(m.current_term as f64);
        let is_leader = m.current_leader == Some(node);
        metrics::gauge!("gangway_raft_is_leader", &labels).set(if is_leader { 1.0 } else { 0.0 });
        metrics::gauge!("gangway_raft_last_log_index", &labels)
            .set(m.last_log_index.unwrap_or(0) as f64);
        metrics::gauge!("gangway_raft_commit_index", &labels).set(committed as f64);
        metrics::gauge!("gangway_raft_applied_index", &labels).set(applied as f64);
        metrics::gauge!("gangway_raft_apply_lag", &labels)
            .set(committed.saturating_sub(applied) as f64);
        if m.current_leader.is_some() && m.current_leader != last_leader {
            metrics::counter!("gangway_raft_leader_changes_total", &labels).increment(1);
            last_leader = m.current_leader;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}
