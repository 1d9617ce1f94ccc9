//! openraft's `RaftStateMachine` around a domain `StateMachine`, with the
//! group's current snapshot kept durable in a `KvTree`.
//!
//! The state machine itself lives in memory; on start it is restored from the
//! stored snapshot and openraft re-applies the log from there up to the saved
//! committed id. Invariant: a snapshot is durable before openraft learns of
//! it, so it may purge the log it covers. Shared with the `RaftHost` (status,
//! reads) through `SmShared`.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::codec;
use crate::snapshot_cadence::SinceSnapshot;
use crate::state_machine::StateMachine;
use crate::storage::{KvTree, SyncHandle, WriteOp};
use crate::types::{
    Entry, LogId, Reply, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

const KEY_SNAPSHOT: &[u8] = b"current";

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// What [`StoredSnapshot`] encodes as, borrowing the data: a snapshot is the whole
/// state, so it is not copied once more to be written.
#[derive(Serialize)]
struct StoredSnapshotRef<'a> {
    meta: &'a SnapshotMeta,
    #[serde(with = "serde_bytes")]
    data: &'a [u8],
}

/// The state machine and what Raft knows about it.
pub(crate) struct SmInner {
    pub(crate) sm: Box<dyn StateMachine>,
    pub(crate) last_applied: Option<LogId>,
    pub(crate) membership: StoredMembership,
    snapshot_seq: u64,
}

/// A group's state machine, shared by openraft and the host.
pub(crate) struct SmShared {
    inner: Mutex<SmInner>,
    /// What was applied since the last snapshot (its cadence, `snapshot_cadence.rs`);
    /// written under the lock, read without it.
    since: SinceCounters,
}

/// [`SinceSnapshot`] as counters.
#[derive(Default)]
struct SinceCounters {
    entries: AtomicU64,
    command_bytes: AtomicU64,
    snapshot_bytes: AtomicU64,
}

impl SinceCounters {
    /// A snapshot was taken or installed (of `bytes`, when known yet): nothing
    /// applied since.
    fn restart(&self, bytes: Option<usize>) {
        self.entries.store(0, Ordering::Relaxed);
        self.command_bytes.store(0, Ordering::Relaxed);
        if let Some(bytes) = bytes {
            self.sized(bytes);
        }
    }

    /// The last snapshot encoded to `bytes`.
    fn sized(&self, bytes: usize) {
        self.snapshot_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

impl SmShared {
    /// Locks the state machine. A poisoned lock means an apply panicked, which
    /// only corrupted state can cause: stop rather than serve it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, SmInner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(_) => panic!("state machine lock poisoned: an apply panicked on corrupted state"),
        }
    }

    /// What was applied since the last snapshot, and its size; read without the
    /// state-machine lock, which a snapshot being encoded holds for seconds.
    pub(crate) fn since_snapshot(&self) -> SinceSnapshot {
        SinceSnapshot {
            entries: self.since.entries.load(Ordering::Relaxed),
            command_bytes: self.since.command_bytes.load(Ordering::Relaxed),
            snapshot_bytes: self.since.snapshot_bytes.load(Ordering::Relaxed),
        }
    }

    /// (applied index, hex SHA-256 of the snapshot bytes) taken atomically.
    pub(crate) fn state_hash(&self) -> (u64, String) {
        let inner = self.lock();
        let applied = inner.last_applied.map(|l| l.index).unwrap_or(0);
        let digest = Sha256::digest(inner.sm.snapshot());
        (applied, hex::encode(digest))
    }
}

fn sm_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

fn snap_read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_snapshot(None, AnyError::new(&e)).into()
}

/// openraft's view of one group's state machine.
#[derive(Clone)]
pub(crate) struct SmStore {
    shared: Arc<SmShared>,
    snapshots: Arc<dyn KvTree>,
    sync: SyncHandle,
}

impl SmStore {
    /// Builds the store and restores the state machine from the stored snapshot, if any.
    pub(crate) fn open(
        mut sm: Box<dyn StateMachine>,
        snapshots: Arc<dyn KvTree>,
        sync: SyncHandle,
    ) -> Result<Self, StorageError> {
        let mut last_applied = None;
        let mut membership = StoredMembership::default();
        let since = SinceCounters::default();
        if let Some(bytes) = snapshots.get(KEY_SNAPSHOT).map_err(snap_read_err)? {
            let stored: StoredSnapshot =
                codec::decode("snapshot", &bytes).map_err(snap_read_err)?;
            sm.restore(&stored.data).map_err(snap_read_err)?;
            last_applied = stored.meta.last_log_id;
            membership = stored.meta.last_membership.clone();
            since.restart(Some(stored.data.len()));
        }
        let inner = SmInner {
            sm,
            last_applied,
            membership,
            snapshot_seq: 0,
        };
        Ok(Self {
            shared: Arc::new(SmShared {
                inner: Mutex::new(inner),
                since,
            }),
            snapshots,
            sync,
        })
    }

    pub(crate) fn shared(&self) -> Arc<SmShared> {
        self.shared.clone()
    }

    async fn persist(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<(), StorageError> {
        let stored = StoredSnapshotRef { meta, data };
        let write_err = |e: String| -> StorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::error(e)).into()
        };
        let bytes = codec::encode("snapshot", &stored).map_err(|e| write_err(e.to_string()))?;
        self.snapshots
            .apply(vec![WriteOp::Put(KEY_SNAPSHOT.to_vec(), bytes)])
            .map_err(|e| write_err(e.to_string()))?;
        self.sync
            .sync_wait()
            .await
            .map_err(|e| write_err(e.to_string()))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SmStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        // All of it on the blocking pool: the copy is taken under the lock, and
        // encoded after it is released (applies go on meanwhile).
        let shared = self.shared.clone();
        let (meta, data) = tokio::task::spawn_blocking(move || {
            let (meta, writer) = {
                let mut inner = shared.lock();
                inner.snapshot_seq += 1;
                let snapshot_id = match inner.last_applied {
                    Some(l) => format!("{}-{}-{}", l.leader_id, l.index, inner.snapshot_seq),
                    None => format!("none-{}", inner.snapshot_seq),
                };
                let meta = SnapshotMeta {
                    last_log_id: inner.last_applied,
                    last_membership: inner.membership.clone(),
                    snapshot_id,
                };
                let writer = inner.sm.snapshot_writer();
                shared.since.restart(None);
                (meta, writer)
            };
            let data = writer();
            shared.since.sized(data.len());
            (meta, data)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, AnyError::error(e.to_string())))?;
        self.persist(&meta, &data).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for SmStore {
    type SnapshotBuilder = SmStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.shared.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let shared = self.shared.clone();
        let mut inner = shared.lock();
        let since = &shared.since;
        let mut replies = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            since.entries.fetch_add(1, Ordering::Relaxed);
            let reply = match entry.payload {
                EntryPayload::Blank => Reply::default(),
                EntryPayload::Normal(batch) => {
                    let index = entry.log_id.index;
                    let bytes: usize = batch.commands.iter().map(|c| c.len()).sum();
                    since
                        .command_bytes
                        .fetch_add(bytes as u64, Ordering::Relaxed);
                    let replies = batch
                        .commands
                        .iter()
                        .map(|c| serde_bytes::ByteBuf::from(inner.sm.apply(index, c)))
                        .collect();
                    Reply { replies }
                }
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                    Reply::default()
                }
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        {
            let mut inner = self.shared.lock();
            inner.sm.restore(&data).map_err(sm_err)?;
            self.shared.since.restart(Some(data.len()));
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
        }
        self.persist(meta, &data).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let Some(bytes) = self.snapshots.get(KEY_SNAPSHOT).map_err(snap_read_err)? else {
            return Ok(None);
        };
        let stored: StoredSnapshot = codec::decode("snapshot", &bytes).map_err(snap_read_err)?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}
