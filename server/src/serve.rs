//! `gangway serve`: one replica of a multi-process cluster. Binds its ports
//! first (so a taken port fails before anything is stored), checks the data
//! dir, refuses to bootstrap a wiped replica under an id the cluster already
//! replicated to, then serves until SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::StatusRequest;
use gangway_raft::storage::SledStore;
use gangway_raft::PeerSecurity;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::ServeConfig;
use crate::datadir::{self, DataDirState, Identity};
use crate::engine::Profile;
use crate::failpoints::Failpoints;
use crate::observe::http::{self, HttpState};
use crate::replica::{host_config, Replica, ReplicaOptions};
use crate::replicated::Groups;
use crate::security::{self, ServerSecurity, ServerTls, Tokens};

/// Time allowed to reach each peer when checking a fresh replica's id.
pub const REJOIN_PROBE_TIMEOUT_MS: u64 = 1_500;

/// Runs one replica until a shutdown signal.
pub async fn run(cfg: ServeConfig, prometheus: Option<PrometheusHandle>) -> anyhow::Result<()> {
    let grpc = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", cfg.listen))?;
    let http_listener = TcpListener::bind(cfg.http)
        .await
        .with_context(|| format!("cannot listen on {} (--http)", cfg.http))?;
    println!(
        "gangway serve: node {} of cluster {:?}, {} shards",
        cfg.id, cfg.cluster_id, cfg.shards
    );
    println!("  gRPC {}", grpc.local_addr()?);
    println!("  HTTP http://{}", http_listener.local_addr()?);

    let identity = Identity {
        cluster_id: cfg.cluster_id.clone(),
        node_id: cfg.id,
        shards: cfg.shards,
    };
    let state = datadir::probe(&cfg.data, &identity)?;
    let bootstrap = state == DataDirState::Fresh && !cfg.join;
    let server_security = ServerSecurity {
        tls: match &cfg.tls {
            Some(files) => Some(ServerTls::load(files.clone())?),
            None => None,
        },
        tokens: match &cfg.auth_tokens_file {
            Some(path) => Some(Tokens::load(path.clone())?),
            None => None,
        },
        peer_secret: match &cfg.peer_secret_file {
            Some(path) => Tokens::load_peer_secret(path.clone())?,
            None => Tokens::generated_peer_secret()?,
        },
    };
    let peer_security = PeerSecurity {
        tls: match &cfg.tls {
            Some(files) => Some(security::client_config(files)?),
            None => None,
        },
        token: server_security.tokens.as_ref().map(|t| t.own_shared()),
        peer_secret: Some(server_security.peer_secret.own_shared()),
    };
    if bootstrap {
        refuse_wiped_member(&cfg, &peer_security).await?;
    }
    datadir::open(&cfg.data, &identity)?;
    let store = SledStore::open(&datadir::store_path(&cfg.data), cfg.sled_cache_bytes)
        .with_context(|| format!("cannot open the store in {} (--data)", cfg.data.display()))?;
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
        profile: Profile::default(),
        failpoints: if cfg.test_failpoints {
            Failpoints::from_env()
        } else {
            Failpoints::disabled()
        },
        security: server_security,
    };
    opts.host.peer_security = peer_security;
    opts.host.peer_routes = cfg.peer_routes.clone();
    let replica = Replica::start(opts, Arc::new(store), grpc).await?;
    if bootstrap {
        replica.host.bootstrap(&cfg.initial_members()).await?;
        tracing::info!(members = ?cfg.initial_members(), "bootstrapped a new cluster");
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
                Groups::new(replica.host.clone()),
                cfg.shards,
                cfg.topology_label.clone(),
                crate::kube::KubeOptions {
                    failpoints: if cfg.test_failpoints {
                        Failpoints::from_env()
                    } else {
                        Failpoints::disabled()
                    },
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
    let http_task = tokio::spawn(http::serve(http_listener, http_state, async {
        let _ = http_stopped.await;
    }));
    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop_kube.send(true);
    if let Some(task) = kube_task {
        let _ = task.await;
    }
    let _ = stop_http.send(());
    replica.stop().await;
    http_task.await??;
    Ok(())
}

/// A fresh data dir under an id that peers already replicated to means the
/// replica lost its disk; bootstrapping it would let it vote twice in a term.
async fn refuse_wiped_member(cfg: &ServeConfig, peers: &PeerSecurity) -> anyhow::Result<()> {
    let scheme = if peers.tls.is_some() { "https" } else { "http" };
    for (peer, addr) in &cfg.peers {
        let dial = cfg.peer_routes.get(addr).unwrap_or(addr);
        let Ok(mut endpoint) =
            tonic::transport::Endpoint::from_shared(format!("{scheme}://{dial}"))
        else {
            continue;
        };
        if let Some(tls) = &peers.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let probe = Duration::from_millis(REJOIN_PROBE_TIMEOUT_MS);
        // The whole connect is bounded, TLS handshake included: a peer that is itself
        // still probing has not started serving, and would never answer it.
        let Ok(Ok(channel)) =
            tokio::time::timeout(probe, endpoint.connect_timeout(probe).connect()).await
        else {
            continue;
        };
        let mut req = tonic::Request::new(StatusRequest {
            include_state_hash: false,
        });
        req.set_timeout(Duration::from_millis(REJOIN_PROBE_TIMEOUT_MS));
        let token = peers
            .token
            .as_ref()
            .and_then(|t| t.read().ok().map(|t| t.clone()));
        if let Some(value) = token.and_then(|t| format!("Bearer {t}").parse().ok()) {
            req.metadata_mut().insert("authorization", value);
        }
        let reply = match AdminClient::new(channel).status(req).await {
            Ok(reply) => reply,
            // A peer that refuses our credentials is up: skipping it would bootstrap a
            // replica that may have lost its disk.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) =>
            {
                bail!(
                    "peer {peer} at {addr} refused this replica's credentials ({}); check --tls-cert, --tls-key, --tls-client-ca and --auth-tokens-file",
                    s.message()
                )
            }
            Err(_) => continue,
        };
        let status = reply.into_inner();
        if status.cluster_id != cfg.cluster_id {
            bail!(
                "peer {peer} at {addr} belongs to cluster {:?}, not {:?} (--cluster-id)",
                status.cluster_id,
                cfg.cluster_id
            );
        }
        for g in &status.groups {
            if g.matched.get(&cfg.id).is_some_and(|m| *m > 0) {
                bail!(
                    "node id {} already holds data in cluster {:?} (peer {peer} replicated group {} to it), but {} is empty: \
                     this replica lost its disk and must not rejoin under its old id; start it with a new --id and --join, \
                     then add it with `gangctl cluster add --id NEW --addr HOST:PORT`",
                    cfg.id,
                    cfg.cluster_id,
                    g.group_id,
                    cfg.data.display()
                );
            }
        }
    }
    Ok(())
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
