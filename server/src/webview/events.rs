//! The web view's live updates: one hub per HTTP server watches this replica's Raft
//! groups (apply notifications, leaders and terms) and tells every open browser which
//! panels changed, as server-sent events. The browser then fetches those panels again,
//! so an event carries a panel's name, never state.
//!
//! Bounds: at most [`UI_CLIENTS_MAX`] browsers at once; each has a queue of
//! [`UI_CLIENT_EVENTS_MAX`] events, and a browser whose queue is full (it stopped
//! reading) is dropped, not buffered for. A panel is announced at most once per its
//! [`Panel::min_interval_ms`]: shards apply a tick every second and, in a real fleet,
//! node heartbeats all the time, so the fleet (the largest panel) follows them at most
//! once a second, and the cluster panel's indices every two; a change of leader or
//! term is announced within [`UI_EVENT_COALESCE_MS`]. Owned by `observe::http::serve`, which stops it with the
//! server; the SSE handler in `ui` subscribes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_raft::{GroupChanges, RaftHost, META_GROUP};
use tokio::sync::mpsc;

/// Browsers with an open event stream at once, per HTTP server.
pub const UI_CLIENTS_MAX: usize = 64;
/// Events queued for one browser before it counts as too slow and is dropped.
pub const UI_CLIENT_EVENTS_MAX: usize = 16;
/// How often the hub looks at the groups' applies, leaders and terms, in ms.
pub const UI_POLL_MS: u64 = 100;
/// Shortest time between two announcements of one panel, in ms.
pub const UI_EVENT_COALESCE_MS: u64 = 250;
/// Shortest time between two announcements of the fleet, in ms.
pub const UI_FLEET_INTERVAL_MS: u64 = 1_000;
/// Shortest time between two announcements of the cluster panel for applies alone
/// (commit indices and lag; leaders and terms go at once), in ms.
pub const UI_CLUSTER_INTERVAL_MS: u64 = 2_000;

/// A panel of the web view whose content may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Panel {
    /// Replicas, Raft groups, leaders and terms.
    Cluster,
    /// Nodes and devices (any shard applied something).
    Fleet,
    /// Gang groups (the meta group applied something).
    Gangs,
    /// Queues and their usage (the meta group applied something).
    Queues,
    /// Reservations and decisions (the meta group or a shard applied something).
    Txns,
}

impl Panel {
    const ALL: [Panel; 5] = [
        Panel::Cluster,
        Panel::Fleet,
        Panel::Gangs,
        Panel::Queues,
        Panel::Txns,
    ];

    /// Shortest time between two announcements of the panel for applies, in ms.
    pub fn min_interval_ms(self) -> u64 {
        match self {
            Panel::Fleet => UI_FLEET_INTERVAL_MS,
            Panel::Cluster => UI_CLUSTER_INTERVAL_MS,
            Panel::Gangs | Panel::Queues | Panel::Txns => UI_EVENT_COALESCE_MS,
        }
    }

    /// The SSE event name (`sse:<name>` in the page's triggers).
    pub fn name(self) -> &'static str {
        match self {
            Panel::Cluster => "cluster",
            Panel::Fleet => "fleet",
            Panel::Gangs => "gangs",
            Panel::Queues => "queues",
            Panel::Txns => "txns",
        }
    }
}

/// Why a browser could not subscribe.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubscribeError {
    /// [`UI_CLIENTS_MAX`] browsers are subscribed already.
    #[error("{UI_CLIENTS_MAX} browsers follow this replica's web view already")]
    Full,
    /// The server is shutting down.
    #[error("the web view is shutting down")]
    Closed,
}

#[derive(Default)]
struct Subscribers {
    senders: Vec<mpsc::Sender<Panel>>,
    closed: bool,
}

/// Hands panel changes to subscribed browsers; cheap to clone.
#[derive(Clone, Default)]
pub struct Hub {
    subscribers: Arc<Mutex<Subscribers>>,
}

impl Hub {
    /// A new browser's queue of changed panels. It ends when the browser is dropped
    /// for being slow or when the server stops.
    pub fn subscribe(&self) -> Result<mpsc::Receiver<Panel>, SubscribeError> {
        let mut subs = self
            .subscribers
            .lock()
            .map_err(|_| SubscribeError::Closed)?;
        if subs.closed {
            return Err(SubscribeError::Closed);
        }
        subs.senders.retain(|s| !s.is_closed());
        if subs.senders.len() >= UI_CLIENTS_MAX {
            return Err(SubscribeError::Full);
        }
        let (tx, rx) = mpsc::channel(UI_CLIENT_EVENTS_MAX);
        subs.senders.push(tx);
        Ok(rx)
    }

    /// Browsers subscribed now.
    pub fn subscribers(&self) -> usize {
        self.subscribers
            .lock()
            .map(|s| s.senders.iter().filter(|t| !t.is_closed()).count())
            .unwrap_or(0)
    }

    /// Queues `panel` for every browser; a browser whose queue is full is dropped
    /// (its stream ends, and its page reconnects and renders afresh). Returns how many
    /// were dropped.
    pub fn publish(&self, panel: Panel) -> usize {
        let Ok(mut subs) = self.subscribers.lock() else {
            return 0;
        };
        let before = subs.senders.len();
        subs.senders.retain(|tx| match tx.try_send(panel) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => false,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        let gone = before - subs.senders.len();
        if gone > 0 {
            metrics::counter!("gangway_ui_clients_dropped_total").increment(gone as u64);
        }
        gone
    }

    /// Ends every stream and refuses new subscribers.
    pub fn close(&self) {
        if let Ok(mut subs) = self.subscribers.lock() {
            subs.closed = true;
            subs.senders.clear();
        }
    }
}

/// What the watcher saw of one group last time.
struct Watched {
    group: u64,
    changes: Option<GroupChanges>,
    leader: Option<u64>,
    term: u64,
}

/// Watches `host`'s groups and publishes changed panels on `hub` until `stop` fires.
pub async fn watch(host: RaftHost, hub: Hub, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut watched: Vec<Watched> = host
        .group_ids()
        .into_iter()
        .map(|group| Watched {
            group,
            changes: host.changes(group).ok(),
            leader: None,
            term: 0,
        })
        .collect();
    let mut pending = BTreeSet::new();
    let mut leadership_changed = false;
    let mut tick = tokio::time::interval(Duration::from_millis(UI_POLL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = tokio::time::Instant::now();
    let mut last_sent: BTreeMap<Panel, tokio::time::Instant> =
        Panel::ALL.into_iter().map(|p| (p, started)).collect();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
        let status = host.status(false);
        for w in &mut watched {
            let applied = w.changes.as_mut().is_some_and(|c| c.applied_since());
            if applied {
                pending.extend(panels_on_apply(w.group));
            }
            let (leader, term) = status
                .iter()
                .find(|g| g.group_id == w.group)
                .map(|g| ((g.leader != 0).then_some(g.leader), g.term))
                .unwrap_or((None, 0));
            if leader != w.leader || term != w.term {
                w.leader = leader;
                w.term = term;
                pending.insert(Panel::Cluster);
                leadership_changed = true;
            }
        }
        let now = tokio::time::Instant::now();
        let due: Vec<Panel> = pending
            .iter()
            .copied()
            .filter(|p| {
                let interval = if *p == Panel::Cluster && leadership_changed {
                    UI_EVENT_COALESCE_MS
                } else {
                    p.min_interval_ms()
                };
                now.duration_since(last_sent[p]) >= Duration::from_millis(interval)
            })
            .collect();
        for panel in due {
            pending.remove(&panel);
            if panel == Panel::Cluster {
                leadership_changed = false;
            }
            last_sent.insert(panel, now);
            hub.publish(panel);
        }
    }
    hub.close();
}

/// The panels an apply on `group` may change.
fn panels_on_apply(group: u64) -> &'static [Panel] {
    // A transaction begins and is decided in meta (an expired reservation is aborted
    // there too), so the transactions panel follows meta applies only.
    if group == META_GROUP {
        &[Panel::Gangs, Panel::Queues, Panel::Txns, Panel::Cluster]
    } else {
        &[Panel::Fleet, Panel::Cluster]
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
