//! Group commit: appends from every Raft group of the process ask for
//! durability here; one worker thread flushes once for all requests that
//! queued while the previous flush ran, then answers each of them.
//!
//! Invariant: a callback runs only after a flush that started after its
//! request was queued, so every write issued before the request is durable.
//! Owned by the `RaftHost`; the worker stops when the last handle is dropped.

use std::sync::Arc;
use std::thread;

use crossbeam::channel::{self, Receiver, Sender};

use super::{KvStore, StoreError};

/// Bound on queued durability requests; senders wait when it is full.
pub const SYNC_QUEUE_MAX: usize = 65_536;
/// Bound on requests answered by one flush.
pub const SYNC_BATCH_MAX: usize = 4_096;

type Callback = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// Cloneable handle to the process's group-commit worker.
#[derive(Clone)]
pub struct SyncHandle {
    tx: Option<Sender<Callback>>,
}

impl SyncHandle {
    /// Starts the worker for `store` (no worker if the store is not durable).
    pub fn start(store: Arc<dyn KvStore>) -> Result<Self, StoreError> {
        if !store.is_durable() {
            return Ok(Self { tx: None });
        }
        let (tx, rx) = channel::bounded::<Callback>(SYNC_QUEUE_MAX);
        thread::Builder::new()
            .name("gangway-sync".into())
            .spawn(move || run_worker(store, rx))
            .map_err(|e| StoreError::Io(format!("cannot start the sync thread: {e}")))?;
        Ok(Self { tx: Some(tx) })
    }

    /// Calls `done` once every write issued before this call is durable.
    pub fn sync(&self, done: impl FnOnce(Result<(), StoreError>) + Send + 'static) {
        match &self.tx {
            None => done(Ok(())),
            Some(tx) => {
                if let Err(err) = tx.send(Box::new(done)) {
                    (err.into_inner())(Err(StoreError::Closed));
                }
            }
        }
    }

    /// Waits until every write issued before this call is durable.
    pub async fn sync_wait(&self) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.sync(move |res| {
            let _ = tx.send(res);
        });
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

fn run_worker(store: Arc<dyn KvStore>, rx: Receiver<Callback>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < SYNC_BATCH_MAX {
            match rx.try_recv() {
                Ok(cb) => batch.push(cb),
                Err(_) => break,
            }
        }
        let result = store.flush();
        for cb in batch {
            cb(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(StoreError::Io(e.to_string())),
            });
        }
    }
}
