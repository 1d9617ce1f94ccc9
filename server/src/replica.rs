//! One gangway replica: a multi-raft host for the meta group and every shard,
//! and the gRPC server that serves its Raft transport, cluster admin and the
//! public front door. `gangway serve` runs one, `gangway dev` three.
//!
//! Invariant: the gRPC server task is owned by the `Replica` and stops with it.

use std::sync::Arc;

use gangway_raft::storage::KvStore;
use gangway_raft::{HostConfig, HostError, RaftHost, StateMachineFactory};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Router;

use crate::frontdoor::inventory::InventoryService;
use crate::replicated::{machine_for, Groups};

/// What a replica needs besides its storage and listener.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// The Raft host's identity, groups and timing.
    pub host: HostConfig,
    /// Number of shard groups.
    pub shards: u32,
    /// Node label partitioning nodes into shards.
    pub topology_label: Option<String>,
}

/// A running replica.
pub struct Replica {
    /// Its Raft host.
    pub host: RaftHost,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    stop: oneshot::Sender<()>,
}

impl Replica {
    /// Starts the host on `store` and serves gRPC on `listener`.
    pub async fn start(
        opts: ReplicaOptions,
        store: Arc<dyn KvStore>,
        listener: TcpListener,
    ) -> Result<Self, HostError> {
        let shards = opts.shards;
        let factory = move |g| machine_for(g, shards);
        let host = RaftHost::start(opts.host, store, &factory).await?;
        let inventory =
            InventoryService::new(Groups::new(host.clone()), shards, opts.topology_label);
        let router = tonic::transport::Server::builder()
            .add_service(host.transport_service())
            .add_service(host.admin_service())
            .add_service(inventory);
        Ok(Self::serve(host, router, listener))
    }

    /// Starts a bare host with custom state machines (no front door), for benchmarks.
    pub async fn start_with(
        cfg: HostConfig,
        store: Arc<dyn KvStore>,
        listener: TcpListener,
        factory: &StateMachineFactory,
    ) -> Result<Self, HostError> {
        let host = RaftHost::start(cfg, store, factory).await?;
        let router = tonic::transport::Server::builder()
            .add_service(host.transport_service())
            .add_service(host.admin_service());
        Ok(Self::serve(host, router, listener))
    }

    fn serve(host: RaftHost, router: Router, listener: TcpListener) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(router.serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            async {
                let _ = stopped.await;
            },
        ));
        Self { host, server, stop }
    }

    /// Stops serving and shuts the host down.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.host.shutdown().await;
        match self.server.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server ended with an error"),
            Err(e) => tracing::warn!(error = %e, "gRPC server task failed"),
            Ok(Ok(())) => {}
        }
    }
}

/// The host configuration for `shards` shard groups plus the meta group.
pub fn host_config(
    cluster_id: &str,
    node_id: u64,
    advertise: &str,
    shards: u32,
    timing: gangway_raft::RaftTiming,
) -> HostConfig {
    HostConfig {
        cluster_id: cluster_id.to_string(),
        node_id,
        advertise_addr: advertise.to_string(),
        groups: (0..=u64::from(shards)).collect(),
        timing,
    }
}
