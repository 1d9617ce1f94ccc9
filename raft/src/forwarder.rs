//! Batches the writes a replica forwards to a group's leader into single RPCs.
//!
//! A replica that is not the leader used to forward each write in its own
//! `Propose` call: under load, the front door's submissions cost one more RPC
//! each on both ends. Every write queued while earlier batches are in flight goes
//! in one `ProposeMany` call; the leader proposes each as if it had come alone, so
//! its own proposer packs them into entries as usual, and answers one outcome per
//! write. Invariants: writes to one leader keep their arrival order; each waiter
//! gets exactly one answer (its outcome, or the call's error); at most
//! `FORWARD_INFLIGHT_MAX` calls per group are in flight; a write whose caller gave
//! up before its batch left is not sent. A leader that predates `ProposeMany` (a
//! rolling upgrade) is remembered and sent each write alone, all at once. One
//! forwarder task per group, owned by the host.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use gangway_proto::raft::{ProposeManyRequest, ProposeRequest};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::error::HostError;
use crate::host::{Outcome, ATTEMPT_TIMEOUT_MS};
use crate::network::{transport_client, Origin, PeerPool};
use crate::types::NodeId;

/// Bound on forwarded writes queued for one group.
pub const FORWARD_QUEUE_MAX: usize = 65_536;
/// Most writes in one forwarded call (a leader refuses more).
pub const FORWARD_BATCH_MAX: usize = 1_024;
/// Most command bytes in one forwarded call.
pub const FORWARD_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Forwarded calls of one group in flight at once.
pub const FORWARD_INFLIGHT_MAX: usize = 4;
/// How long one forwarded call may take, in milliseconds (the leader's own bound
/// on a commit, plus the trip).
pub const FORWARD_TIMEOUT_MS: u64 = ATTEMPT_TIMEOUT_MS + 500;

/// One forwarded write and who waits for it.
struct Forwarded {
    leader: NodeId,
    addr: String,
    command: Vec<u8>,
    done: oneshot::Sender<Result<Outcome, HostError>>,
}

/// The forwarding queue of one group.
pub(crate) struct Forwarder {
    group: crate::types::GroupId,
    tx: mpsc::Sender<Forwarded>,
}

impl Forwarder {
    /// Starts the forwarding task of the group `origin` names; it ends when `stop`
    /// fires or the queue closes.
    pub(crate) fn start(
        origin: Origin,
        pool: Arc<PeerPool>,
        stop: watch::Receiver<bool>,
    ) -> (Self, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(FORWARD_QUEUE_MAX);
        (
            Self {
                group: origin.group,
                tx,
            },
            run(origin, pool, rx, stop),
        )
    }

    /// Forwards `command` to `leader` at `addr` and waits for its outcome.
    pub(crate) async fn forward(
        &self,
        leader: NodeId,
        addr: &str,
        command: Vec<u8>,
    ) -> Result<Outcome, HostError> {
        let (done, rx) = oneshot::channel();
        let closed = || HostError::Unavailable {
            group: self.group,
            detail: "the host is shutting down".to_string(),
        };
        self.tx
            .send(Forwarded {
                leader,
                addr: addr.to_string(),
                command,
                done,
            })
            .await
            .map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }
}

async fn run(
    origin: Origin,
    pool: Arc<PeerPool>,
    mut rx: mpsc::Receiver<Forwarded>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(FORWARD_INFLIGHT_MAX));
    let legacy = Legacy::default();
    // A write for another leader than its batch's waits here for the next batch.
    let mut carried: VecDeque<Forwarded> = VecDeque::new();
    loop {
        let first = match carried.pop_front() {
            Some(f) => f,
            None => tokio::select! {
                f = rx.recv() => match f { Some(f) => f, None => return },
                _ = stop.changed() => return,
            },
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (leader, addr) = (first.leader, first.addr.clone());
        let mut bytes = first.command.len();
        let mut batch = vec![first];
        let mut other = VecDeque::new();
        // Writes for other leaders wait in `carried`, which stays within one batch's
        // worth, so the channel's bound still holds back the callers.
        while batch.len() < FORWARD_BATCH_MAX
            && bytes < FORWARD_BATCH_BYTES_MAX
            && other.len() < FORWARD_BATCH_MAX
        {
            let next = match carried.pop_front() {
                Some(f) => f,
                None => match rx.try_recv() {
                    Ok(f) => f,
                    Err(_) => break,
                },
            };
            if next.leader == leader && next.addr == addr {
                bytes += next.command.len();
                batch.push(next);
            } else {
                other.push_back(next);
            }
        }
        other.extend(carried.drain(..));
        carried = other;
        // A caller that gave up (its deadline passed, or it saw the leader change
        // and will route again) withdraws its write, as it did when each went alone.
        batch.retain(|f| !f.done.is_closed());
        if batch.is_empty() {
            continue;
        }
        let (origin, pool, legacy) = (origin.clone(), pool.clone(), legacy.clone());
        tokio::spawn(async move {
            send(&origin, &pool, &legacy, leader, &addr, batch).await;
            drop(permit);
        });
    }
}

/// Leaders (by address) that answered `ProposeMany` with UNIMPLEMENTED: they predate
/// it, and are sent each write alone until this replica restarts.
#[derive(Clone, Default)]
struct Legacy(Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>);

impl Legacy {
    fn has(&self, addr: &str) -> bool {
        self.0.lock().map(|s| s.contains(addr)).unwrap_or(false)
    }

    fn add(&self, addr: &str) {
        if let Ok(mut s) = self.0.lock() {
            s.insert(addr.to_string());
        }
    }
}

/// Sends one batch and answers each of its waiters.
async fn send(
    origin: &Origin,
    pool: &PeerPool,
    legacy: &Legacy,
    leader: NodeId,
    addr: &str,
    batch: Vec<Forwarded>,
) {
    let group = origin.group;
    let (commands, waiters): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|f| (f.command, f.done)).unzip();
    if legacy.has(addr) {
        return send_alone(origin, pool, leader, addr, commands, waiters).await;
    }
    let channel = match pool.channel(addr) {
        Ok(c) => c,
        Err(detail) => {
            for done in waiters {
                let _ = done.send(Err(HostError::Unavailable {
                    group,
                    detail: detail.clone(),
                }));
            }
            return;
        }
    };
    let mut req = tonic::Request::new(ProposeManyRequest {
        envelope: Some(origin.envelope(leader)),
        commands,
    });
    req.set_timeout(Duration::from_millis(FORWARD_TIMEOUT_MS));
    // Kept for a leader that turns out to predate ProposeMany (once per leader).
    let sent = req.get_ref().commands.clone();
    match transport_client(pool, channel, leader)
        .propose_many(req)
        .await
    {
        Ok(reply) => {
            let mut outcomes = reply.into_inner().outcomes.into_iter();
            for done in waiters {
                let result = match outcomes.next() {
                    Some(o) => match o.error {
                        Some(e) => Err(HostError::from_forwarded(group, origin.node, addr, &e)),
                        None => Ok(Outcome {
                            reply: o.reply,
                            index: o.log_index,
                        }),
                    },
                    None => Err(HostError::Peer {
                        addr: addr.to_string(),
                        code: tonic::Code::Internal,
                        message: "the leader answered fewer outcomes than commands".to_string(),
                    }),
                };
                let _ = done.send(result);
            }
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            legacy.add(addr);
            send_alone(origin, pool, leader, addr, sent, waiters).await;
        }
        Err(status) => {
            for done in waiters {
                let _ = done.send(Err(HostError::from_peer_status(
                    group,
                    origin.node,
                    addr,
                    &status,
                )));
            }
        }
    }
}

/// Sends each write in its own `Propose`, all at once (as before batching), to a
/// leader that predates `ProposeMany`.
async fn send_alone(
    origin: &Origin,
    pool: &PeerPool,
    leader: NodeId,
    addr: &str,
    commands: Vec<Vec<u8>>,
    waiters: Vec<oneshot::Sender<Result<Outcome, HostError>>>,
) {
    let calls = commands
        .into_iter()
        .zip(waiters)
        .map(|(command, done)| async move {
            if done.is_closed() {
                return;
            }
            let _ = done.send(propose_alone(origin, pool, leader, addr, command).await);
        });
    futures::future::join_all(calls).await;
}

async fn propose_alone(
    origin: &Origin,
    pool: &PeerPool,
    leader: NodeId,
    addr: &str,
    command: Vec<u8>,
) -> Result<Outcome, HostError> {
    let group = origin.group;
    let channel = pool
        .channel(addr)
        .map_err(|detail| HostError::Unavailable { group, detail })?;
    let mut req = tonic::Request::new(ProposeRequest {
        envelope: Some(origin.envelope(leader)),
        command,
    });
    req.set_timeout(Duration::from_millis(FORWARD_TIMEOUT_MS));
    let reply = transport_client(pool, channel, leader)
        .propose(req)
        .await
        .map_err(|s| HostError::from_peer_status(group, origin.node, addr, &s))?
        .into_inner();
    Ok(Outcome {
        reply: reply.reply,
        index: reply.log_index,
    })
}
