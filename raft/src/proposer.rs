//! Batches concurrent writes to one group into single Raft entries.
//!
//! openraft 0.9's leader appends each entry after the previous local flush,
//! so a group commits roughly one entry per flush round trip. Packing every
//! write that arrives while earlier entries are in flight into one entry turns
//! that into one flush per batch. Invariants: commands keep their arrival
//! order; each waiter gets exactly one answer (its reply, or the batch's
//! error); at most `INFLIGHT_BATCHES_MAX` batches are in flight per group.
//! One proposer task per group, owned by the host.

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::types::{Command, NodeId, Raft};

/// Bound on writes queued for one group.
pub const PROPOSAL_QUEUE_MAX: usize = 65_536;
/// Most commands packed into one entry.
pub const BATCH_COMMANDS_MAX: usize = 1_024;
/// Most command bytes packed into one entry.
pub const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Batches of one group awaiting commit at once.
pub const INFLIGHT_BATCHES_MAX: usize = 2;

/// The error openraft returns for a write.
pub(crate) type WriteError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

/// What a waiter learns: its reply and the entry's index, or the batch's error.
pub(crate) type ProposalResult = Result<(Vec<u8>, u64), WriteError>;

struct Proposal {
    command: Vec<u8>,
    done: oneshot::Sender<ProposalResult>,
}

/// The write queue of one group.
pub(crate) struct Proposer {
    tx: mpsc::Sender<Proposal>,
}

/// The proposer's queue was closed (the host is shutting down).
#[derive(Debug)]
pub(crate) struct ProposerClosed;

impl Proposer {
    /// Starts the batching task of a group; it ends when `stop` fires or the queue closes.
    pub(crate) fn start(
        raft: Raft,
        stop: watch::Receiver<bool>,
    ) -> (Self, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(PROPOSAL_QUEUE_MAX);
        (Self { tx }, run(raft, rx, stop))
    }

    /// Queues `command`; the receiver yields its result once its batch commits.
    pub(crate) async fn propose(
        &self,
        command: Vec<u8>,
    ) -> Result<oneshot::Receiver<ProposalResult>, ProposerClosed> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(Proposal { command, done })
            .await
            .map_err(|_| ProposerClosed)?;
        Ok(rx)
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Proposal>, mut stop: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(INFLIGHT_BATCHES_MAX));
    loop {
        let first = tokio::select! {
            p = rx.recv() => match p { Some(p) => p, None => return },
            _ = stop.changed() => return,
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        let mut bytes = batch[0].command.len();
        while batch.len() < BATCH_COMMANDS_MAX && bytes < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.command.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let mut waiters = Vec::with_capacity(batch.len());
            let mut commands = Vec::with_capacity(batch.len());
            for p in batch {
                commands.push(serde_bytes::ByteBuf::from(p.command));
                waiters.push(p.done);
            }
            let result = raft.client_write(Command { commands }).await;
            drop(permit);
            match result {
                Ok(resp) => {
                    let index = resp.log_id.index;
                    let mut replies = resp.data.replies.into_iter();
                    for w in waiters {
                        let reply = replies.next().map(|r| r.into_vec()).unwrap_or_default();
                        let _ = w.send(Ok((reply, index)));
                    }
                }
                Err(e) => {
                    for w in waiters {
                        let _ = w.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
