//! Shares one leadership check among the concurrent linearizable reads of a group.
//!
//! openraft 0.9's `ensure_linearizable` sends a heartbeat to every other voter per
//! call, so a leader answering many reads at once spent two RPCs on each. A read is
//! linearizable once a quorum has confirmed the leader *after the read arrived* and
//! the state machine has applied up to the commit index the leader held then; every
//! read already waiting when a check starts can therefore share it. Invariants: a
//! waiter is answered only by a check that started after it was queued (reads that
//! arrive during a check wait for the next one); each waiter gets exactly one answer;
//! at most one check per group is in flight. One gate task per group, owned by the host.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

/// Bound on reads waiting for a check of one group.
pub const READ_QUEUE_MAX: usize = 65_536;
/// Most reads one check answers (the rest wait for the next check).
pub const READ_BATCH_MAX: usize = 4_096;

/// What a waiting read learns from its check.
pub(crate) type CheckOutcome<E> = Result<(), CheckFailed<E>>;

/// Why a check did not confirm the leader.
#[derive(Debug, Clone)]
pub(crate) enum CheckFailed<E> {
    /// The check itself answered with an error (not leader, no quorum, fatal).
    Refused(E),
    /// The check did not finish within the gate's bound.
    TimedOut,
}

/// The read queue of one group.
pub(crate) struct ReadGate<E> {
    tx: mpsc::Sender<oneshot::Sender<CheckOutcome<E>>>,
}

/// The gate's queue was closed (the host is shutting down).
#[derive(Debug)]
pub(crate) struct ReadGateClosed;

impl<E: Clone + Send + 'static> ReadGate<E> {
    /// Starts the gate of a group around `check` (one leadership check, including
    /// the wait for the state machine to catch up); it ends when `stop` fires or the
    /// queue closes. A check taking longer than `check_timeout` answers `TimedOut`.
    pub(crate) fn start<F, Fut>(
        check: F,
        check_timeout: Duration,
        stop: watch::Receiver<bool>,
    ) -> (Self, impl Future<Output = ()>)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let (tx, rx) = mpsc::channel(READ_QUEUE_MAX);
        (Self { tx }, run(check, check_timeout, rx, stop))
    }

    /// Queues a read; the receiver yields once a check that started after now ends.
    pub(crate) async fn confirm(
        &self,
    ) -> Result<oneshot::Receiver<CheckOutcome<E>>, ReadGateClosed> {
        let (done, rx) = oneshot::channel();
        self.tx.send(done).await.map_err(|_| ReadGateClosed)?;
        Ok(rx)
    }
}

async fn run<E, F, Fut>(
    mut check: F,
    check_timeout: Duration,
    mut rx: mpsc::Receiver<oneshot::Sender<CheckOutcome<E>>>,
    mut stop: watch::Receiver<bool>,
) where
    E: Clone,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    loop {
        let first = tokio::select! {
            w = rx.recv() => match w { Some(w) => w, None => return },
            _ = stop.changed() => return,
        };
        // Everything queued now arrived before the check below starts.
        let mut waiters = vec![first];
        while waiters.len() < READ_BATCH_MAX {
            match rx.try_recv() {
                Ok(w) => waiters.push(w),
                Err(_) => break,
            }
        }
        let outcome = tokio::select! {
            r = tokio::time::timeout(check_timeout, check()) => match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(CheckFailed::Refused(e)),
                Err(_) => Err(CheckFailed::TimedOut),
            },
            _ = stop.changed() => return,
        };
        for w in waiters {
            let _ = w.send(outcome.clone());
        }
    }
}

#[cfg(test)]
#[path = "read_gate_tests.rs"]
mod tests;
