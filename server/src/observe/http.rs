//! The HTTP endpoints of a process: `/healthz` (the process serves),
//! `/readyz` (every hosted replica runs every group, and knows its leader) and
//! `/metrics` (Prometheus text), and beside them whatever routes the entry point
//! mounts (the web view under `/ui`, see `webview::mounted`).

use std::future::Future;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use gangway_raft::RaftHost;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use tokio::task::JoinHandle;

/// What the endpoints look at.
#[derive(Clone)]
pub struct HttpState {
    /// Every replica this process hosts.
    pub hosts: Vec<RaftHost>,
    /// The Prometheus recorder's handle, if one is installed.
    pub prometheus: Option<PrometheusHandle>,
}

/// Routes served beside the endpoints (the web view), with the task that feeds them.
pub struct MountedRoutes {
    /// The routes.
    pub router: Router,
    /// Ends what the routes hold open (event streams) once shutdown begins, which
    /// graceful shutdown would otherwise wait for until the drain bound.
    pub close: Box<dyn FnOnce() + Send>,
    /// The task that feeds them, aborted once serving ended.
    pub task: JoinHandle<()>,
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

/// Serves the endpoints, and `mounted` beside them, on `listener` until `shutdown`
/// completes and the open connections finished, or `HTTP_DRAIN_MS` passed.
pub async fn serve(
    listener: TcpListener,
    state: HttpState,
    mounted: Option<MountedRoutes>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    let (close, watcher) = match mounted {
        Some(m) => {
            app = app.merge(m.router);
            (Some(m.close), Some(m.task))
        }
        None => (None, None),
    };
    let (draining, drain_started) = tokio::sync::oneshot::channel::<()>();
    let graceful = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        if let Some(close) = close {
            close();
        }
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
