//! One gangway replica: a multi-raft host for the meta group and every shard,
//! the gRPC server for its Raft transport, cluster admin and the public front
//! door, and the services that act when it leads a group (the coordinator on
//! the meta leader, resolvers on shard leaders, the metrics sampler). `gangway serve` runs one,
//! `gangway dev` three.
//!
//! Invariant: the gRPC server and every service task are owned by the
//! `Replica` and stop with it.

use std::sync::Arc;

use gangway_raft::storage::KvStore;
use gangway_raft::{HostConfig, HostError, RaftHost, StateMachineFactory};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic::transport::server::TcpIncoming;

use crate::auth::limits::StreamLimits;
use crate::auth::{ClientGate, PeerGate};
use crate::coordinator::Coordinator;
use crate::failpoints::Failpoints;
use crate::frontdoor::admin::AdminFront;
use crate::frontdoor::inventory::InventoryService;
use crate::frontdoor::queues::QueuesService;
use crate::frontdoor::scheduler::SchedulerService;
use crate::participant::resolver;
use crate::replicated::growth::ShardCount;
use crate::replicated::wake::WakeBoard;
use crate::replicated::warmer::SelectorWarmer;
use crate::replicated::{machine_for, Groups};
use crate::security::{tls_incoming, ServerSecurity, ServerTls};
use gangway_core::engine::Profile;
use gangway_core::plan::budgets::DisruptionBudgets;
use gangway_core::wire::WireFormat;

/// Period of the check for groups that stopped on their own.
pub const STOPPED_GROUP_CHECK_MS: u64 = 200;

/// Completes when one of `host`'s groups stops on its own (a storage failure such as
/// a full disk): the group and why. A stopped group does not restart in-process, so
/// the entry points exit non-zero and leave the restart to the supervisor.
pub async fn group_stopped(host: &RaftHost) -> (gangway_raft::GroupId, String) {
    loop {
        if let Some(stopped) = host.stopped_groups().into_iter().next() {
            return stopped;
        }
        tokio::time::sleep(std::time::Duration::from_millis(STOPPED_GROUP_CHECK_MS)).await;
    }
}

/// What a replica needs besides its storage and listener.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// The Raft host's identity, groups and timing.
    pub host: HostConfig,
    /// Number of shard groups the replica starts with (the cluster's may have grown since).
    pub shards: u32,
    /// Node label partitioning nodes into shards.
    pub topology_label: Option<String>,
    /// Host path prefixes a node agent's allocations may name.
    pub host_path_prefixes: Vec<String>,
    /// Scoring profile of the placement engine.
    pub profile: Profile,
    /// The format this replica writes commands, replies and snapshots in (it reads both).
    pub wire: WireFormat,
    /// Whether and when the coordinator rebalances the shards.
    pub rebalance: gangway_core::plan::rebalance::RebalancePolicy,
    /// The half-life of fair sharing over time, in ms; 0: off.
    pub fair_share_half_life_ms: u64,
    /// Reservations for the head of the line.
    pub head_reservations: gangway_core::plan::backfill::ReservationMode,
    /// Crash points (tests only).
    pub failpoints: Failpoints,
    /// Mutual TLS and bearer tokens enforced on the gRPC port.
    pub security: ServerSecurity,
    /// PodDisruptionBudgets the coordinator chooses preemption victims by (the
    /// Kubernetes ingest of the same process fills them; empty without Kubernetes).
    pub budgets: Arc<DisruptionBudgets>,
    /// Topology hierarchies Kueue's Topology objects define, kept by the ingest.
    pub learned_topologies: Arc<gangway_core::model::LearnedHierarchies>,
}

/// A running replica.
pub struct Replica {
    /// Its Raft host.
    pub host: RaftHost,
    /// The format this replica writes.
    wire: WireFormat,
    /// The shard count its services use.
    shard_count: ShardCount,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The peer port's server, when the Raft transport has its own.
    peer_server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    stop: watch::Sender<bool>,
    services: Vec<JoinHandle<()>>,
    stop_services: watch::Sender<bool>,
    warmer: SelectorWarmer,
}

impl Replica {
    /// Starts the host on `store`, serves gRPC (clients and peers) on `listener` and
    /// starts the services.
    pub async fn start(
        opts: ReplicaOptions,
        store: Arc<dyn KvStore>,
        listener: TcpListener,
    ) -> Result<Self, HostError> {
        Self::start_with_peer_port(opts, store, listener, None).await
    }

    /// [`Replica::start`], with the Raft transport (and the Admin service, for peers)
    /// on `peer_listener` alone when given, so the network can open it to replicas only.
    pub async fn start_with_peer_port(
        opts: ReplicaOptions,
        store: Arc<dyn KvStore>,
        listener: TcpListener,
        peer_listener: Option<TcpListener>,
    ) -> Result<Self, HostError> {
        let shards = opts.shards;
        let machine_failpoints = opts.failpoints.clone();
        let warmer = if opts.failpoints.armed(crate::failpoints::SELECTORS_INLINE) {
            tracing::error!(
                "bug switch {}: plans evaluate every selector inline",
                crate::failpoints::SELECTORS_INLINE
            );
            SelectorWarmer::inline()
        } else {
            SelectorWarmer::start().map_err(|e| HostError::Fatal {
                group: gangway_raft::META_GROUP,
                detail: format!("cannot start the selector warmer thread: {e}"),
            })?
        };
        let machine_warmer = warmer.clone();
        let wake = WakeBoard::default();
        let machine_wake = wake.clone();
        let wire = opts.wire;
        let factory = move |g| {
            machine_for(
                g,
                shards,
                wire,
                &machine_failpoints,
                &machine_warmer,
                &machine_wake,
            )
        };
        let credentials = Arc::new(
            opts.security
                .credentials(&opts.host.cluster_id, opts.host.node_id),
        );
        let host = RaftHost::start(opts.host, store, Arc::new(factory)).await?;
        let groups = Groups::new(host.clone(), wire);
        let shard_count = ShardCount::new(shards);
        // The client services authenticate every caller (the gate) and authorize each
        // RPC (`access`); the Raft transport serves replicas only: a peer proof, which no
        // client credential gives.
        let gate = ClientGate(credentials.clone());
        let peers_only = PeerGate {
            credentials,
            open_to_clients: opts
                .failpoints
                .armed(crate::failpoints::RAFT_TRANSPORT_OPEN),
        };
        let authorization_off = opts.failpoints.armed(crate::failpoints::AUTHORIZATION_OFF);
        if authorization_off {
            tracing::error!(
                "bug switch {}: every caller may do everything",
                crate::failpoints::AUTHORIZATION_OFF
            );
        }
        let access = opts
            .security
            .access()
            .allowing_every_caller(authorization_off);
        let streams = StreamLimits::default();
        let mut router = tonic::transport::Server::builder()
            .add_service(InterceptedService::new(
                AdminFront::new(&host, access.clone()),
                gate.clone(),
            ))
            .add_service(InterceptedService::new(
                InventoryService::new(
                    groups.clone(),
                    shard_count.clone(),
                    crate::frontdoor::inventory::InventoryOptions {
                        topology_label: opts.topology_label,
                        host_path_prefixes: opts.host_path_prefixes,
                    },
                    access.clone(),
                    streams.clone(),
                ),
                gate.clone(),
            ))
            .add_service(InterceptedService::new(
                QueuesService::new(groups.clone(), access.clone()),
                gate.clone(),
            ))
            .add_service(InterceptedService::new(
                crate::frontdoor::shard_admin::ShardsService::new(
                    groups.clone(),
                    shard_count.clone(),
                    opts.rebalance,
                    access.clone(),
                ),
                gate.clone(),
            ))
            .add_service(InterceptedService::new(
                SchedulerService::new(
                    groups.clone(),
                    shard_count.clone(),
                    opts.failpoints.clone(),
                    access.clone(),
                    streams,
                    crate::frontdoor::scheduler::Topology {
                        configured: opts.profile.topologies.clone(),
                        learned: opts.learned_topologies.clone(),
                    },
                ),
                gate,
            ));
        let peer_router = match peer_listener {
            Some(peer_listener) => {
                let peer_router = tonic::transport::Server::builder()
                    .add_service(InterceptedService::new(
                        host.transport_service(),
                        peers_only.clone(),
                    ))
                    .add_service(InterceptedService::new(
                        AdminFront::new(&host, access),
                        peers_only,
                    ));
                Some((peer_router, peer_listener))
            }
            None => {
                router = router.add_service(InterceptedService::new(
                    host.transport_service(),
                    peers_only,
                ));
                None
            }
        };
        let mut replica = Self::serve(
            host,
            (router, listener),
            peer_router,
            opts.security.tls.clone(),
            warmer,
            wire,
            shard_count.clone(),
        );
        let secrets = opts
            .security
            .tokens
            .iter()
            .cloned()
            .chain([opts.security.peer_secret.clone()])
            .collect();
        replica
            .services
            .push(tokio::spawn(crate::security::watch_credentials(
                opts.security.tls.clone(),
                secrets,
                opts.security.policy.clone(),
                replica.stop_services.subscribe(),
            )));
        let stop = replica.stop_services.subscribe();
        replica
            .services
            .push(tokio::spawn(crate::replicated::growth::run(
                groups.clone(),
                shard_count.clone(),
                stop.clone(),
            )));
        let coordinator = Coordinator::new(
            groups.clone(),
            shard_count.clone(),
            opts.profile,
            opts.failpoints,
            opts.budgets,
            opts.learned_topologies,
        )
        .with_rebalance(opts.rebalance)
        .with_fair_share(opts.fair_share_half_life_ms)
        .with_wake_board(wake)
        .with_reservations(opts.head_reservations);
        replica
            .services
            .push(tokio::spawn(coordinator.run(stop.clone())));
        // Every series the sampler and the services report starts at zero, so a scrape
        // shows it before its first event.
        crate::observe::placement::register();
        crate::coordinator::preempt::register();
        crate::kube::evictor::register_metrics();
        replica
            .services
            .push(tokio::spawn(crate::observe::sampler::run(
                groups.clone(),
                shard_count.clone(),
                stop.clone(),
            )));
        replica
            .services
            .push(tokio::spawn(resolver::run(groups, shard_count, stop)));
        Ok(replica)
    }

    /// The shard count this replica serves (it rises when the cluster grows).
    pub fn shard_count(&self) -> ShardCount {
        self.shard_count.clone()
    }

    /// Typed access to the groups through this replica, in its write format.
    pub fn groups(&self) -> Groups {
        Groups::new(self.host.clone(), self.wire)
    }

    /// Starts a bare host with custom state machines (no front door), for benchmarks.
    pub async fn start_with(
        cfg: HostConfig,
        store: Arc<dyn KvStore>,
        listener: TcpListener,
        factory: Arc<StateMachineFactory>,
    ) -> Result<Self, HostError> {
        let host = RaftHost::start(cfg, store, factory).await?;
        let router = tonic::transport::Server::builder()
            .add_service(host.transport_service())
            .add_service(host.admin_service());
        Ok(Self::serve(
            host,
            (router, listener),
            None,
            None,
            SelectorWarmer::inline(),
            WireFormat::default(),
            ShardCount::new(0),
        ))
    }

    fn serve(
        host: RaftHost,
        (router, listener): (Router, TcpListener),
        peers: Option<(Router, TcpListener)>,
        tls: Option<Arc<ServerTls>>,
        warmer: SelectorWarmer,
        wire: WireFormat,
        shard_count: ShardCount,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let (stop_services, _) = watch::channel(false);
        let serve_on = |router: Router, listener: TcpListener| {
            let mut stopped = stopped.clone();
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            match &tls {
                Some(tls) => {
                    let incoming = tls_incoming(listener, tls.clone(), stop_services.subscribe());
                    tokio::spawn(router.serve_with_incoming_shutdown(
                        tokio_stream::wrappers::ReceiverStream::new(incoming),
                        shutdown,
                    ))
                }
                None => {
                    // Without TCP_NODELAY, small replies wait on the peer's delayed ACK (~40 ms).
                    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                    tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown))
                }
            }
        };
        let server = serve_on(router, listener);
        let peer_server = peers.map(|(router, listener)| serve_on(router, listener));
        Self {
            host,
            wire,
            shard_count,
            server,
            peer_server,
            stop,
            services: Vec::new(),
            stop_services,
            warmer,
        }
    }

    /// Stops the services, then serving, then the host.
    pub async fn stop(self) {
        let _ = self.stop_services.send(true);
        for task in self.services {
            let _ = task.await;
        }
        let _ = self.stop.send(true);
        self.host.shutdown().await;
        // Its current device is bounded by the selector cost budget.
        let warmer = self.warmer.clone();
        let _ = tokio::task::spawn_blocking(move || warmer.stop()).await;
        for server in std::iter::once(self.server).chain(self.peer_server) {
            match server.await {
                Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server ended with an error"),
                Err(e) => tracing::warn!(error = %e, "gRPC server task failed"),
                Ok(Ok(())) => {}
            }
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
        peer_security: Default::default(),
        peer_routes: Default::default(),
        transport: Default::default(),
    }
}
