//! `gangway serve`: one replica of a multi-process cluster. Binds its ports
//! first (so a taken port fails before anything is stored), checks the data
//! dir, decides whether it resumes, joins or creates the cluster (`bootstrap`:
//! a blank replica never bootstraps unless told, and never under an id its
//! peers saw before), then serves until SIGINT or SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use gangway_raft::storage::SledStore;
use gangway_raft::{PeerSecurity, TransportStart};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::bootstrap::{self, Decision, StartMode};
use crate::config::ServeConfig;
use crate::datadir::{self, Identity};
use crate::failpoints::Failpoints;
use crate::observe::http::{self, HttpState};
use crate::replica::{host_config, Replica, ReplicaOptions};
use crate::security::{self, ServerSecurity, ServerTls, Tokens};
use crate::webview::read::Source;
use crate::webview::UiDeps;
use gangway_core::plan::budgets::DisruptionBudgets;

/// Runs one replica until a shutdown signal.
pub async fn run(cfg: ServeConfig, prometheus: Option<PrometheusHandle>) -> anyhow::Result<()> {
    let grpc = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", cfg.listen))?;
    let peer_port = match cfg.peer_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--peer-listen)"))?,
        ),
        None => None,
    };
    let http_listener = TcpListener::bind(cfg.http)
        .await
        .with_context(|| format!("cannot listen on {} (--http)", cfg.http))?;
    println!(
        "gangway serve: node {} of cluster {:?}, {} shards",
        cfg.id, cfg.cluster_id, cfg.shards
    );
    println!("  gRPC {}", grpc.local_addr()?);
    if let Some(peers) = &peer_port {
        println!("  peers (Raft) {}", peers.local_addr()?);
    }
    println!("  HTTP http://{}", http_listener.local_addr()?);

    let identity = Identity {
        cluster_id: cfg.cluster_id.clone(),
        node_id: cfg.id,
        shards: cfg.shards,
    };
    datadir::probe(&cfg.data, &identity)?;
    // Writing for the first rollout of an upgrade, replicas of the release before (which
    // send and expect the peer secret itself) are peers too.
    let first_rollout = cfg.wire == gangway_core::wire::WireFormat::Json;
    let reviewer: Option<Arc<dyn crate::auth::access::Reviewer>> = match (&cfg.kube, cfg.kube_auth)
    {
        (Some((server, _)), true) => {
            let client = crate::kube::connect(server)
                .await
                .context("cannot reach the Kubernetes API server for --kube-auth")?;
            Some(Arc::new(crate::auth::kube::KubeReviewer::new(client)))
        }
        _ => None,
    };
    let server_security = ServerSecurity {
        tls: match &cfg.tls {
            Some(files) => Some(ServerTls::load(files.clone())?),
            None => None,
        },
        client_certs_optional: cfg.tls_client_certs == crate::config::ClientCerts::Optional,
        tokens: match &cfg.auth_tokens_file {
            Some(path) => Some(Tokens::load(path.clone())?),
            None => None,
        },
        peer_secret: match &cfg.peer_secret_file {
            Some(path) => Tokens::load_peer_secret(path.clone())?,
            None => Tokens::generated_peer_secret()?,
        },
        policy: match &cfg.policy_file {
            Some(path) => Some(crate::auth::PolicyFile::load(path.clone())?),
            None => None,
        },
        reviewer,
        accept_legacy_secret: first_rollout,
    };
    warn_if_open(&server_security);
    let peer_security = PeerSecurity {
        tls: match &cfg.tls {
            Some(files) => Some(security::client_config(files)?),
            None => None,
        },
        peer_secret: Some(server_security.peer_secret.own_shared()),
        send_legacy_secret: first_rollout,
    };
    let ui_security = server_security.clone();
    datadir::open(&cfg.data, &identity)?;
    let store_opened = std::time::Instant::now();
    let store = SledStore::open(&datadir::store_path(&cfg.data), cfg.sled_cache_bytes)
        .with_context(|| format!("cannot open the store in {} (--data)", cfg.data.display()))?;
    tracing::info!(
        ms = store_opened.elapsed().as_millis() as u64,
        "store opened"
    );
    let groups: Vec<u64> = (0..=u64::from(cfg.shards)).collect();
    let holds_state = gangway_raft::holds_raft_state(&store, &groups)
        .with_context(|| format!("cannot read the store in {} (--data)", cfg.data.display()))?;
    let mode = bootstrap::start_mode(&cfg, holds_state)?;
    if mode == StartMode::Join {
        bootstrap::check_joiner(&cfg, &peer_security).await?;
    }
    let budgets: Arc<DisruptionBudgets> = Arc::default();
    let learned_topologies: Arc<gangway_core::model::LearnedHierarchies> = Arc::default();
    let mut opts = ReplicaOptions {
        host: host_config(
            &cfg.cluster_id,
            cfg.id,
            &cfg.advertise,
            cfg.shards,
            cfg.timing.clone(),
        ),
        shards: cfg.shards,
        topology_label: cfg.topology_label.clone(),
        host_path_prefixes: cfg.allocation_host_path_prefixes.clone(),
        profile: cfg.profile.clone(),
        wire: cfg.wire,
        rebalance: cfg.rebalance,
        fair_share_half_life_ms: cfg.fair_share_half_life_ms,
        head_reservations: cfg.head_reservations,
        failpoints: if cfg.test_failpoints {
            Failpoints::from_env()
        } else {
            Failpoints::disabled()
        },
        security: server_security,
        budgets: budgets.clone(),
        learned_topologies: learned_topologies.clone(),
    };
    opts.host.peer_security = peer_security.clone();
    opts.host.peer_routes = cfg.peer_routes.clone();
    opts.host.transport = match mode {
        StartMode::Create => TransportStart::Held,
        StartMode::Resume | StartMode::Join => TransportStart::Open,
    };
    let replica = Replica::start_with_peer_port(opts, Arc::new(store), grpc, peer_port).await?;
    let mut shutdown = std::pin::pin!(shutdown_signal());
    if mode == StartMode::Create {
        let verdict = tokio::select! {
            v = bootstrap::await_decision(&cfg, &peer_security) => v,
            _ = &mut shutdown => {
                tracing::info!("shutting down before the cluster was created");
                replica.stop().await;
                return Ok(());
            }
        };
        match verdict {
            Ok(Decision::Bootstrap) => {
                replica.host.bootstrap(&cfg.initial_members()).await?;
                replica.host.open_transport();
                tracing::info!(members = ?cfg.initial_members(), "bootstrapped a new cluster");
            }
            Ok(Decision::Serve) => {
                replica.host.open_transport();
                tracing::info!("the peers formed the cluster already; serving as its member");
            }
            Ok(Decision::LostDisk(peer)) => {
                replica.stop().await;
                return Err(bootstrap::lost_disk_error(&cfg, peer));
            }
            Err(e) => {
                replica.stop().await;
                return Err(e);
            }
        }
    }
    let (stop_kube, kube_stopped) = tokio::sync::watch::channel(false);
    let kube_task = match &cfg.kube {
        Some((server, kube_opts)) => {
            let client = crate::kube::connect(server)
                .await
                .context("cannot reach the Kubernetes API server (--kubeconfig / --in-cluster)")?;
            println!(
                "  scheduling pods with schedulerName {:?}",
                kube_opts.scheduler_name
            );
            Some(tokio::spawn(crate::kube::run(
                client,
                replica.groups(),
                replica.shard_count(),
                cfg.topology_label.clone(),
                budgets.clone(),
                crate::kube::KubeOptions {
                    failpoints: if cfg.test_failpoints {
                        Failpoints::from_env()
                    } else {
                        Failpoints::disabled()
                    },
                    learned_topologies: learned_topologies.clone(),
                    ..kube_opts.clone()
                },
                kube_stopped,
            )))
        }
        None => None,
    };

    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http_state = HttpState {
        hosts: vec![replica.host.clone()],
        prometheus,
    };
    let ui = crate::webview::mounted(UiDeps {
        source: Source {
            groups: replica.groups(),
            hosts: vec![replica.host.clone()],
            shards: replica.shard_count(),
            topology_label: Some(
                cfg.topology_label
                    .clone()
                    .unwrap_or_else(|| crate::webview::read::ZONE_LABEL.into()),
            ),
            topology_levels: crate::webview::read::grid_levels(&cfg.profile.topologies),
        },
        access: crate::webview::access::UiAccess::new(
            Arc::new(ui_security.credentials(&cfg.cluster_id, cfg.id)),
            ui_security.access(),
        )
        .tokens_over_tls_only(cfg.tls.is_some() && !cfg.ui_plaintext_tokens),
    });
    let http_task = tokio::spawn(http::serve(http_listener, http_state, Some(ui), async {
        let _ = http_stopped.await;
    }));
    let stopped = tokio::select! {
        _ = &mut shutdown => None,
        stopped = crate::replica::group_stopped(&replica.host) => Some(stopped),
    };
    match &stopped {
        None => tracing::info!("shutting down"),
        Some((group, reason)) => {
            tracing::error!(group, %reason, "a raft group stopped; exiting so the supervisor restarts this replica")
        }
    }
    let teardown = async {
        let _ = stop_kube.send(true);
        if let Some(task) = kube_task {
            let _ = task.await;
        }
        let _ = stop_http.send(());
        replica.stop().await;
        http_task.await?
    };
    bounded_shutdown(teardown).await?;
    match stopped {
        None => Ok(()),
        Some((group, reason)) => anyhow::bail!(
            "raft group {group} stopped: {reason}; gangway serve exits so that its supervisor restarts it \
             from its data dir (if the disk is full, free space first: the replica catches up from its peers)"
        ),
    }
}

/// Says at start when every caller is an administrator (no credential is required, or
/// every credential that passes is an administrator's), so an operator notices.
fn warn_if_open(security: &ServerSecurity) {
    match (
        security.tls.is_some(),
        security.tokens.is_some(),
        security.policy.is_some(),
        security.reviewer.is_some(),
    ) {
        (false, false, false, false) => tracing::warn!(
            "no credentials required: every caller that reaches the gRPC port is an administrator \
             (give --policy-file, --kube-auth or --auth-tokens-file, and TLS)"
        ),
        (_, _, false, false) => tracing::warn!(
            "every authenticated caller is an administrator: give --policy-file or --kube-auth \
             for tenants, node agents and viewers"
        ),
        _ => {}
    }
}

/// Time shutdown may take after SIGTERM (services stopped, gRPC calls and streams
/// drained, Raft groups closed) before gangway exits without waiting further.
pub const SHUTDOWN_GRACE_MS: u64 = 10_000;

/// Runs `teardown` for at most `SHUTDOWN_GRACE_MS`, or until a second signal.
/// Open client streams (watches, device streams) would otherwise hold it forever.
pub async fn bounded_shutdown<E>(
    teardown: impl std::future::Future<Output = Result<(), E>>,
) -> anyhow::Result<()>
where
    anyhow::Error: From<E>,
{
    let grace = std::time::Duration::from_millis(SHUTDOWN_GRACE_MS);
    tokio::select! {
        done = tokio::time::timeout(grace, teardown) => match done {
            Ok(result) => Ok(result?),
            Err(_) => {
                tracing::warn!(grace_ms = SHUTDOWN_GRACE_MS, "shutdown did not finish in time; exiting anyway");
                Ok(())
            }
        },
        _ = shutdown_signal() => {
            tracing::warn!("a second signal: exiting without finishing shutdown");
            Ok(())
        }
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
