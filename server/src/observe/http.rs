//! The HTTP endpoints of a process: `/healthz` (the process serves),
//! `/readyz` (every hosted replica runs every group, and knows its leader) and
//! `/metrics` (Prometheus text).

use std::future::Future;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use gangway_raft::RaftHost;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

/// What the endpoints look at.
#[derive(Clone)]
pub struct HttpState {
    /// Every replica this process hosts.
    pub hosts: Vec<RaftHost>,
    /// The Prometheus recorder's handle, if one is installed.
    pub prometheus: Option<PrometheusHandle>,
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

/// Serves the endpoints on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
