//! Unit tests of `read_gate.rs`.

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
