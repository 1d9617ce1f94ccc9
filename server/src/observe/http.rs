//! The HTTP endpoints of a process: `/healthz` (the process serves),
//! `/readyz` (every hosted replica runs every group, and knows its leader) and
//! `/metrics` (Prometheus text), and the web view under `/ui` (`observe::ui`) when
//! the process gives it a replica to read.

use std::future::Future;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use gangway_raft::RaftHost;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::observe::ui::events::{self, Hub};
use crate::observe::ui::{self, UiDeps};

/// What the endpoints look at.
#[derive(Clone)]
pub struct HttpState {
    /// Every replica this process hosts.
    pub hosts: Vec<RaftHost>,
    /// The Prometheus recorder's handle, if one is installed.
    pub prometheus: Option<PrometheusHandle>,
    /// What the web view reads; `None` serves no `/ui`.
    pub ui: Option<UiDeps>,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, String) {
    let mut missing = Vec::new();
    for host in &state.hosts {
        for (group, reason) in host.stopped_groups() {
            missing.push(format!(
                "node {} stopped group {group}: {reason}",
                host.node_id()
            ));
        }
        let groups: Vec<u64> = host
            .group_ids()
            .into_iter()
            .filter(|g| host.leader_of(*g).is_none())
            .collect();
        if !groups.is_empty() {
            missing.push(format!(
                "node {} knows no leader for groups {groups:?}",
                host.node_id()
            ));
        }
    }
    if missing.is_empty() {
        (StatusCode::OK, "ready\n".into())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", missing.join("; ")),
        )
    }
}

async fn metrics(State(state): State<HttpState>) -> (StatusCode, String) {
    match &state.prometheus {
        Some(handle) => (StatusCode::OK, handle.render()),
        None => (
            StatusCode::NOT_FOUND,
            "no metrics recorder installed\n".into(),
        ),
    }
}

/// Time open connections (a scraper's keep-alive, a half-sent request) get to finish
/// once shutdown begins; they would otherwise hold it forever.
pub const HTTP_DRAIN_MS: u64 = 1_000;

/// Serves the endpoints on `listener` until `shutdown` completes and the open
/// connections finished, or `HTTP_DRAIN_MS` passed.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hub = Hub::default();
    let (stop_watch, watch_stopped) = tokio::sync::watch::channel(false);
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    let watcher = state.ui.map(|deps| {
        let host = deps.source.groups.host().clone();
        metrics::counter!("gangway_ui_clients_dropped_total").increment(0);
        app = app.clone().merge(ui::router(deps, hub.clone()));
        tokio::spawn(events::watch(host, hub.clone(), watch_stopped))
    });
    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let graceful = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        // Open event streams would hold graceful shutdown until the drain bound.
        let _ = stop_watch.send(true);
        hub.close();
        let _ = draining.send(());
    });
    let drain_bound = async {
        if drain_started.await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(HTTP_DRAIN_MS)).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let served = tokio::select! {
        served = graceful => served,
        _ = drain_bound => Ok(()),
    };
    if let Some(task) = watcher {
        task.abort();
        let _ = task.await;
    }
    served
}
