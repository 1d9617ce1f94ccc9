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
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::*;

    /// A check the test releases by hand, counting the checks started.
    struct ManualCheck {
        started: AtomicU64,
        release: Notify,
    }

    fn manual_check() -> Arc<ManualCheck> {
        Arc::new(ManualCheck {
            started: AtomicU64::new(0),
            release: Notify::new(),
        })
    }

    fn gate(
        manual: Arc<ManualCheck>,
    ) -> (
        ReadGate<String>,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop_tx, stop) = watch::channel(false);
        let (gate, task) = ReadGate::start(
            move || {
                let manual = manual.clone();
                async move {
                    manual.started.fetch_add(1, Ordering::SeqCst);
                    manual.release.notified().await;
                    Ok::<(), String>(())
                }
            },
            Duration::from_secs(30),
            stop,
        );
        (gate, stop_tx, tokio::spawn(task))
    }

    async fn wait_started(manual: &ManualCheck, n: u64) {
        while manual.started.load(Ordering::SeqCst) < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_read_queued_during_a_check_waits_for_the_next_one() {
        let manual = manual_check();
        let (gate, stop, task) = gate(manual.clone());
        let mut early = gate.confirm().await.expect("open");
        wait_started(&manual, 1).await;
        let mut late = gate.confirm().await.expect("open");
        manual.release.notify_one();
        let first = (&mut early).await.expect("answered");
        assert!(first.is_ok());
        // The check that answered `early` started before `late` was queued.
        tokio::task::yield_now().await;
        assert!(
            late.try_recv().is_err(),
            "late read answered by an earlier check"
        );
        wait_started(&manual, 2).await;
        manual.release.notify_one();
        assert!(late.await.expect("answered").is_ok());
        let _ = stop.send(true);
        task.await.expect("gate task");
    }

    #[tokio::test]
    async fn reads_waiting_together_share_one_check() {
        let manual = manual_check();
        let (gate, stop, task) = gate(manual.clone());
        let blocker = gate.confirm().await.expect("open");
        wait_started(&manual, 1).await;
        let mut waiting = Vec::new();
        for _ in 0..100 {
            waiting.push(gate.confirm().await.expect("open"));
        }
        manual.release.notify_one();
        assert!(blocker.await.expect("answered").is_ok());
        wait_started(&manual, 2).await;
        manual.release.notify_one();
        for w in waiting {
            assert!(w.await.expect("answered").is_ok());
        }
        assert_eq!(
            manual.started.load(Ordering::SeqCst),
            2,
            "one check for the 100"
        );
        let _ = stop.send(true);
        task.await.expect("gate task");
    }

    #[tokio::test]
    async fn a_refused_check_answers_every_waiter_with_its_error() {
        let (stop_tx, stop) = watch::channel(false);
        let (gate, task) = ReadGate::start(
            || async { Err::<(), String>("not leader".to_string()) },
            Duration::from_secs(30),
            stop,
        );
        let task = tokio::spawn(task);
        let a = gate.confirm().await.expect("open");
        let b = gate.confirm().await.expect("open");
        for w in [a, b] {
            match w.await.expect("answered") {
                Err(CheckFailed::Refused(e)) => assert_eq!(e, "not leader"),
                other => panic!("expected the check's error, got {other:?}"),
            }
        }
        let _ = stop_tx.send(true);
        task.await.expect("gate task");
    }

    #[tokio::test]
    async fn a_check_past_its_bound_times_out() {
        let (stop_tx, stop) = watch::channel(false);
        let (gate, task) = ReadGate::start(
            std::future::pending::<Result<(), String>>,
            Duration::from_millis(50),
            stop,
        );
        let task = tokio::spawn(task);
        let w = gate.confirm().await.expect("open");
        assert!(matches!(
            w.await.expect("answered"),
            Err(CheckFailed::TimedOut)
        ));
        let _ = stop_tx.send(true);
        task.await.expect("gate task");
    }
}
