//! Whether a `gangway serve` replica may create, resume, join, or must refuse.
//!
//! Owns: the start decision of a replica from what its data dir holds, its
//! flags, and what its peers answer (`Admin.Status`). Invariants: a replica
//! whose store holds no Raft state never bootstraps unless started with
//! `--initial-cluster-state new`; even then it bootstraps only when every
//! `--peer` answered and none holds Raft state; and it never serves Raft under
//! an id that a peer saw store Raft state (it lost its disk). Called by
//! `serve::run` before and while the replica's Raft transport is held.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use gangway_proto::admin::admin_client::AdminClient;
use gangway_proto::admin::{StatusReply, StatusRequest};
use gangway_raft::{peer_proof, NodeId, PeerSecurity, PEER_PROOF_HEADER};

use crate::config::{InitialClusterState, ServeConfig};

/// Time allowed to reach each peer when asking for its status.
pub const PEER_PROBE_TIMEOUT_MS: u64 = 1_500;
/// Pause between rounds of asking the peers while some do not answer.
pub const BOOTSTRAP_POLL_MS: u64 = 100;
/// Period of the log line naming the peers still awaited.
pub const BOOTSTRAP_WAIT_LOG_MS: u64 = 5_000;

/// How a replica starts, from its store and flags alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    /// The store holds Raft state: carry on from it; never bootstrap.
    Resume,
    /// Blank, started with `--join`: wait to be added by an operator.
    Join,
    /// Blank, started with `--initial-cluster-state new`: ask the peers first.
    Create,
}

/// Picks the start mode, or refuses a blank replica that was not told what to do.
pub fn start_mode(cfg: &ServeConfig, holds_raft_state: bool) -> anyhow::Result<StartMode> {
    if holds_raft_state {
        return Ok(StartMode::Resume);
    }
    if cfg.join {
        return Ok(StartMode::Join);
    }
    match cfg.initial_cluster_state {
        InitialClusterState::New => Ok(StartMode::Create),
        InitialClusterState::Existing => bail!(
            "data dir {} holds no Raft state and --initial-cluster-state is `existing` (the default), \
             so this replica will not bootstrap: to create a new cluster, start each initial replica with \
             --initial-cluster-state new; to add a replica to a running cluster (or replace one that lost \
             its disk), start it with a new --id and --join",
            cfg.data.display()
        ),
    }
}

/// What one peer's status says about this (blank) replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerView {
    /// The peer holds Raft state: the cluster was formed.
    pub holds_raft_state: bool,
    /// The peer saw this replica's id store Raft state before.
    pub saw_this_replica: bool,
}

/// The decision of a blank replica started with `--initial-cluster-state new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some peers have not answered; nothing is decided yet.
    Wait(Vec<NodeId>),
    /// Every peer answered and none holds Raft state: create the cluster.
    Bootstrap,
    /// The cluster was formed without this replica ever storing anything (it
    /// started late): serve it as the member it was created with, no bootstrap.
    Serve,
    /// `peer` saw this id store Raft state: this replica lost its disk.
    LostDisk(NodeId),
}

/// A verdict other than `Wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// See [`Verdict::Bootstrap`].
    Bootstrap,
    /// See [`Verdict::Serve`].
    Serve,
    /// See [`Verdict::LostDisk`].
    LostDisk(NodeId),
}

/// Decides from the peers' answers (`None`: not answered).
pub fn verdict(answers: &BTreeMap<NodeId, Option<PeerView>>) -> Verdict {
    let answered = || answers.iter().filter_map(|(id, v)| v.map(|v| (*id, v)));
    if let Some((peer, _)) = answered().find(|(_, v)| v.saw_this_replica) {
        return Verdict::LostDisk(peer);
    }
    let unanswered: Vec<NodeId> = answers
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(id, _)| *id)
        .collect();
    if !unanswered.is_empty() {
        return Verdict::Wait(unanswered);
    }
    if answered().any(|(_, v)| v.holds_raft_state) {
        Verdict::Serve
    } else {
        Verdict::Bootstrap
    }
}

/// Reads a peer's status as a view of replica `me`; refuses a peer of another cluster.
pub fn view_of(cfg: &ServeConfig, peer: NodeId, status: &StatusReply) -> anyhow::Result<PeerView> {
    if status.cluster_id != cfg.cluster_id {
        bail!(
            "peer {peer} at {} belongs to cluster {:?}, not {:?} (--cluster-id)",
            cfg.peers.get(&peer).map(String::as_str).unwrap_or("?"),
            status.cluster_id,
            cfg.cluster_id
        );
    }
    // A replica replays the meta log from a state made for its own `--shards`: one
    // started with another count than its peers would place nodes differently.
    let started_shards = status.started_groups.saturating_sub(1);
    if status.started_groups != 0 && started_shards != cfg.shards {
        bail!(
            "peer {peer} was started with --shards {started_shards}, the count cluster {:?} was \
             created with, and this replica with --shards {}: start it with --shards \
             {started_shards} (shards added later with `gangctl shards grow` open on their own)",
            cfg.cluster_id,
            cfg.shards
        );
    }
    let me = cfg.id;
    let matched_me = status
        .groups
        .iter()
        .any(|g| g.matched.get(&me).is_some_and(|m| *m > 0));
    Ok(PeerView {
        holds_raft_state: status.groups.iter().any(|g| g.initialized),
        saw_this_replica: matched_me || status.members_seen.contains(&me),
    })
}

/// The refusal of a replica that lost its disk, naming the flags that led here.
pub fn lost_disk_error(cfg: &ServeConfig, peer: NodeId) -> anyhow::Error {
    anyhow::anyhow!(
        "node id {} already stored Raft state in cluster {:?} (peer {peer} saw it), but data dir {} holds none: \
         this replica lost its disk and must not rejoin under its old id (--initial-cluster-state new creates \
         a cluster only once, and never re-creates it); start it with a new --id and --join, then add it with \
         `gangctl cluster add --id NEW --addr HOST:PORT`",
        cfg.id,
        cfg.cluster_id,
        cfg.data.display()
    )
}

/// Asks every peer once; the answers of those that answered in time.
pub async fn ask_peers(
    cfg: &ServeConfig,
    security: &PeerSecurity,
) -> anyhow::Result<BTreeMap<NodeId, Option<PeerView>>> {
    let mut answers = BTreeMap::new();
    for (peer, addr) in &cfg.peers {
        let view = match ask_peer(cfg, security, *peer, addr).await? {
            Some(status) => Some(view_of(cfg, *peer, &status)?),
            None => None,
        };
        answers.insert(*peer, view);
    }
    Ok(answers)
}

/// A blank `--join` replica: refused if a peer that answers saw its id before.
pub async fn check_joiner(cfg: &ServeConfig, security: &PeerSecurity) -> anyhow::Result<()> {
    for (peer, view) in ask_peers(cfg, security).await? {
        if view.is_some_and(|v| v.saw_this_replica) {
            return Err(lost_disk_error(cfg, peer));
        }
    }
    Ok(())
}

/// Asks the peers until they decide; logs the awaited peers meanwhile.
pub async fn await_decision(
    cfg: &ServeConfig,
    security: &PeerSecurity,
) -> anyhow::Result<Decision> {
    let mut last_log = Instant::now();
    loop {
        let unanswered = match verdict(&ask_peers(cfg, security).await?) {
            Verdict::Wait(unanswered) => unanswered,
            Verdict::Bootstrap => return Ok(Decision::Bootstrap),
            Verdict::Serve => return Ok(Decision::Serve),
            Verdict::LostDisk(peer) => return Ok(Decision::LostDisk(peer)),
        };
        if last_log.elapsed() >= Duration::from_millis(BOOTSTRAP_WAIT_LOG_MS) {
            tracing::info!(
                peers = ?unanswered,
                "blank replica waits for every --peer to answer before it creates the cluster"
            );
            last_log = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(BOOTSTRAP_POLL_MS)).await;
    }
}

/// One peer's status, or `None` if it does not answer in time. A peer that refuses
/// this replica's credentials is up, and is an error: skipping it could bootstrap
/// a replica that lost its disk.
async fn ask_peer(
    cfg: &ServeConfig,
    security: &PeerSecurity,
    peer: NodeId,
    addr: &str,
) -> anyhow::Result<Option<StatusReply>> {
    let scheme = if security.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let dial = cfg
        .peer_routes
        .get(addr)
        .map(String::as_str)
        .unwrap_or(addr);
    let Ok(mut endpoint) = tonic::transport::Endpoint::from_shared(format!("{scheme}://{dial}"))
    else {
        bail!("--peer {peer}={addr}: not a usable address");
    };
    if let Some(tls) = &security.tls {
        endpoint = endpoint.tls_config(tls.clone())?;
    }
    let probe = Duration::from_millis(PEER_PROBE_TIMEOUT_MS);
    // The whole connect is bounded, TLS handshake included.
    let Ok(Ok(channel)) =
        tokio::time::timeout(probe, endpoint.connect_timeout(probe).connect()).await
    else {
        return Ok(None);
    };
    let mut req = tonic::Request::new(StatusRequest {
        include_state_hash: false,
    });
    req.set_timeout(probe);
    // The peer proves it is a replica of this cluster with a proof made for that peer
    // alone (the secret itself is never sent).
    let proof = security.peer_secret.as_ref().and_then(|t| {
        t.read()
            .ok()
            .map(|secret| peer_proof(&secret, &cfg.cluster_id, peer))
    });
    if let Some(value) = proof.and_then(|p| p.parse().ok()) {
        req.metadata_mut().insert(PEER_PROOF_HEADER, value);
    }
    if security.send_legacy_secret {
        let secret = security
            .peer_secret
            .as_ref()
            .and_then(|t| t.read().ok().map(|s| s.clone()));
        if let Some(value) = secret.and_then(|s| s.parse().ok()) {
            req.metadata_mut()
                .insert(gangway_raft::LEGACY_PEER_SECRET_HEADER, value);
        }
    }
    match AdminClient::new(channel).status(req).await {
        Ok(reply) => Ok(Some(reply.into_inner())),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ) =>
        {
            bail!(
                "peer {peer} at {addr} refused this replica's credentials ({}); check --tls-cert, --tls-key, --tls-client-ca (a peer certificate, O=gangway:peers), --peer-secret-file and --cluster-id",
                s.message()
            )
        }
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;
