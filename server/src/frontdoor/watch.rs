//! The scheduler's streams: `WatchGangGroup` (one group's statuses, resumable from a
//! version) and `WatchGangGroups` (every change of a namespace's or queue's groups,
//! resumable the same way). Each runs as a task the front door spawns per stream, which
//! ends when the group ends, a read fails for good, or the caller leaves; its bounds are
//! the constants below. Called by `frontdoor::scheduler`.

use std::time::Duration;

use gangway_core::ledger::meta::{GroupSeq, GroupSummary, MetaQuery, MetaReply};
use gangway_proto::v1::GangGroupStatus;
use gangway_raft::GroupChanges;
use tonic::Status;

use super::scheduler::group_namespaces;
use crate::auth::access::{Access, Principal, Verb};
use crate::replicated::Groups;

/// How often a watcher reads when nothing woke it, in ms.
pub const WATCH_CONFIRM_MS: u64 = 50;
/// Pause after a wake-up before a watcher reads, in ms, so a burst of applies costs one read.
pub const WATCH_GAP_MS: u64 = 2;
/// Status updates buffered per watcher.
pub const WATCH_BUFFER: usize = 16;
/// Changed groups one read of a many-group watch takes (it reads again at once when
/// more changed).
pub const WATCH_MANY_PAGE: u32 = 1_000;
/// A many-group watch reads changes at least this often even without a local apply, in
/// ms (as [`WATCH_CONFIRM_MS`], but one such watch follows many groups, so less often).
pub const WATCH_MANY_CONFIRM_MS: u64 = 500;

/// Sends `first`, then every new version of group `seq` until it ends or the receiver
/// goes. Reads linearizably, when the meta group applies entries on this replica or
/// every [`WATCH_CONFIRM_MS`] otherwise.
pub(super) async fn watch_group(
    groups: Groups,
    seq: GroupSeq,
    first: GroupSummary,
    after_version: u64,
    mut changes: GroupChanges,
    tx: tokio::sync::mpsc::Sender<Result<GangGroupStatus, Status>>,
) {
    let mut version = first.version;
    let mut done = first.state.is_terminal();
    // A client resuming from `after_version` already has every status up to it.
    if first.version > after_version
        && tx
            .send(Ok(crate::convert::group_status(&first)))
            .await
            .is_err()
    {
        return;
    }
    let query = MetaQuery::Group { seq };
    while !done {
        // Woken by applies here, a watcher still reads linearizably: a follower's local
        // copy can trail the leader by a heartbeat, and a watcher must never miss the end.
        let read = tokio::select! {
            alive = changes.changed() => {
                if !alive {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(WATCH_GAP_MS)).await;
                groups.meta_query(&query).await
            }
            _ = tokio::time::sleep(Duration::from_millis(WATCH_CONFIRM_MS)) => {
                groups.meta_query(&query).await
            }
            _ = tx.closed() => return,
        };
        let group = match read {
            Ok(MetaReply::Group { group }) => group,
            Ok(_) => {
                let gone = Status::not_found(format!("id: gang group {seq} is gone"));
                let _ = tx.send(Err(gone)).await;
                return;
            }
            Err(e) if e.to_status().code() == tonic::Code::Unavailable => continue,
            Err(e) => {
                let _ = tx.send(Err(e.to_status())).await;
                return;
            }
        };
        if group.version == version {
            continue;
        }
        version = group.version;
        done = group.state.is_terminal();
        if tx
            .send(Ok(crate::convert::group_status(&group)))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// A watch of every group of a namespace or queue (`WatchGangGroups`), as its task
/// runs it: reads meta's changes after the last version sent, sends those the caller may
/// see and asked for, then waits for the next apply.
pub(super) struct ManyWatch {
    pub(super) groups: Groups,
    pub(super) access: Access,
    pub(super) who: Principal,
    pub(super) namespace: String,
    pub(super) queue: String,
}

impl ManyWatch {
    /// Whether `g` is one of the groups asked for.
    fn wanted(&self, g: &GroupSummary) -> bool {
        let in_namespace =
            self.namespace.is_empty() || group_namespaces(g).contains(&self.namespace.as_str());
        let in_queue = self.queue.is_empty() || g.queue == self.queue;
        in_namespace && in_queue
    }

    /// Sends every change after `after` until the caller leaves or a read fails for good.
    pub(super) async fn run(
        self,
        mut after: u64,
        mut changes: GroupChanges,
        tx: tokio::sync::mpsc::Sender<Result<GangGroupStatus, Status>>,
    ) {
        loop {
            let read = self
                .groups
                .meta_query(&MetaQuery::ChangedSince {
                    after,
                    limit: WATCH_MANY_PAGE,
                })
                .await;
            let (changed, stamp, more) = match read {
                Ok(MetaReply::Changed {
                    groups,
                    stamp,
                    more,
                    ..
                }) => (groups, stamp, more),
                Ok(other) => {
                    let e = Status::internal(format!("unexpected meta reply {other:?}"));
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                Err(e) if e.to_status().code() == tonic::Code::Unavailable => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(WATCH_MANY_CONFIRM_MS)) => continue,
                        _ = tx.closed() => return,
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_status())).await;
                    return;
                }
            };
            for g in changed.iter().filter(|g| self.wanted(g)) {
                match self
                    .access
                    .may_touch_group(&self.who, Verb::List, &g.owner, &group_namespaces(g))
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                if tx.send(Ok(crate::convert::group_status(g))).await.is_err() {
                    return;
                }
            }
            after = after.max(stamp);
            if more {
                continue;
            }
            tokio::select! {
                alive = changes.changed() => {
                    if !alive {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(WATCH_GAP_MS)).await;
                }
                _ = tokio::time::sleep(Duration::from_millis(WATCH_MANY_CONFIRM_MS)) => {}
                _ = tx.closed() => return,
            }
        }
    }
}
