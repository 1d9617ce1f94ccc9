//! openraft's `RaftStateMachine` around a domain `StateMachine`, with the
//! group's current snapshot kept durable in a `SnapshotSlot` (a file).
//!
//! The state machine itself lives in memory; on start it is restored from the
//! stored snapshot and openraft re-applies the log from there up to the saved
//! committed id. Invariant: a snapshot is durable before openraft learns of
//! it, so it may purge the log it covers. A data dir written before snapshots
//! were files holds its snapshot in the `g{N}/snapshot` tree; it is read from
//! there until the first snapshot file is written. Shared with the `RaftHost`
//! (status, reads) through `SmShared`.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::codec;
use crate::snapshot_cadence::SinceSnapshot;
use crate::state_machine::StateMachine;
use crate::storage::{KvTree, SnapshotSlot, WriteOp};
use crate::types::{
    Entry, GroupId, LogId, Reply, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig,
};

/// Key of the snapshot in the `g{N}/snapshot` tree of a data dir written before
/// snapshots were files.
const LEGACY_KEY_SNAPSHOT: &[u8] = b"current";

/// First bytes of a snapshot file; then the length of the encoded `SnapshotMeta`
/// (u32, little-endian), the meta, and the state machine's bytes to the end.
const SNAPSHOT_FILE_MAGIC: &[u8; 8] = b"GWSNAP\x00\x01";
/// Bytes of the meta's length.
const META_LEN_BYTES: usize = 4;

/// A snapshot as the data dir written before snapshots were files stored it.
#[derive(Deserialize)]
struct LegacySnapshot {
    meta: SnapshotMeta,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// A stored snapshot: its meta and the bytes that hold the state from `data_at` on.
struct StoredSnapshot {
    meta: SnapshotMeta,
    bytes: Vec<u8>,
    data_at: usize,
}

impl StoredSnapshot {
    fn data(&self) -> &[u8] {
        &self.bytes[self.data_at..]
    }

    /// The meta, and the state's bytes alone (moved down in place, not copied elsewhere).
    fn into_parts(mut self) -> (SnapshotMeta, Vec<u8>) {
        self.bytes.drain(..self.data_at);
        (self.meta, self.bytes)
    }
}

/// The header a snapshot file starts with, before the state's bytes.
fn snapshot_file_header(meta: &SnapshotMeta) -> Result<Vec<u8>, codec::CodecError> {
    let encoded = codec::encode("snapshot meta", meta)?;
    let mut header = Vec::with_capacity(SNAPSHOT_FILE_MAGIC.len() + META_LEN_BYTES + encoded.len());
    header.extend_from_slice(SNAPSHOT_FILE_MAGIC);
    header.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    header.extend_from_slice(&encoded);
    Ok(header)
}

/// A snapshot file that is not one.
#[derive(Debug, thiserror::Error)]
#[error("snapshot file: {0}")]
struct BadSnapshotFile(String);

fn parse_snapshot_file(bytes: Vec<u8>) -> Result<StoredSnapshot, BadSnapshotFile> {
    let fixed = SNAPSHOT_FILE_MAGIC.len() + META_LEN_BYTES;
    if bytes.len() < fixed || &bytes[..SNAPSHOT_FILE_MAGIC.len()] != SNAPSHOT_FILE_MAGIC {
        return Err(BadSnapshotFile(format!(
            "does not start with {SNAPSHOT_FILE_MAGIC:?} ({} bytes)",
            bytes.len()
        )));
    }
    let mut len = [0u8; META_LEN_BYTES];
    len.copy_from_slice(&bytes[SNAPSHOT_FILE_MAGIC.len()..fixed]);
    let data_at = fixed + u32::from_le_bytes(len) as usize;
    if data_at > bytes.len() {
        return Err(BadSnapshotFile(format!(
            "its meta ends at byte {data_at}, past its end ({} bytes)",
            bytes.len()
        )));
    }
    let meta = codec::decode("snapshot meta", &bytes[fixed..data_at])
        .map_err(|e| BadSnapshotFile(e.to_string()))?;
    Ok(StoredSnapshot {
        meta,
        bytes,
        data_at,
    })
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

/// What restoring a group's state machine at start took.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RestoreTimes {
    /// Size of the stored snapshot's state (0: none stored).
    pub(crate) bytes: usize,
    /// Reading the stored snapshot and its envelope.
    pub(crate) read_ms: u64,
    /// Decoding the state and rebuilding what is derived from it.
    pub(crate) restore_ms: u64,
}

/// openraft's view of one group's state machine.
#[derive(Clone)]
pub(crate) struct SmStore {
    /// The group, as logs name it.
    group: GroupId,
    shared: Arc<SmShared>,
    /// Where the current snapshot is kept.
    slot: Arc<dyn SnapshotSlot>,
    /// Where a data dir written before snapshot files kept it.
    legacy: Arc<dyn KvTree>,
}

impl SmStore {
    /// Builds the store and restores the state machine from the stored snapshot, if any.
    pub(crate) fn open(
        group: GroupId,
        mut sm: Box<dyn StateMachine>,
        slot: Arc<dyn SnapshotSlot>,
        legacy: Arc<dyn KvTree>,
    ) -> Result<(Self, RestoreTimes), StorageError> {
        let mut last_applied = None;
        let mut membership = StoredMembership::default();
        let since = SinceCounters::default();
        let mut times = RestoreTimes::default();
        let started = std::time::Instant::now();
        if let Some(stored) = read_snapshot(&*slot, &*legacy)? {
            times.read_ms = started.elapsed().as_millis() as u64;
            times.bytes = stored.data().len();
            sm.restore(stored.data()).map_err(snap_read_err)?;
            times.restore_ms = started.elapsed().as_millis() as u64 - times.read_ms;
            last_applied = stored.meta.last_log_id;
            membership = stored.meta.last_membership.clone();
            since.restart(Some(stored.data().len()));
        }
        let inner = SmInner {
            sm,
            last_applied,
            membership,
            snapshot_seq: 0,
        };
        let store = Self {
            group,
            shared: Arc::new(SmShared {
                inner: Mutex::new(inner),
                since,
            }),
            slot,
            legacy,
        };
        Ok((store, times))
    }

    pub(crate) fn shared(&self) -> Arc<SmShared> {
        self.shared.clone()
    }

    /// Makes `data` the group's durable snapshot (on the blocking pool: writing a
    /// large state takes seconds), and hands it back.
    async fn persist(&self, meta: &SnapshotMeta, data: Vec<u8>) -> Result<Vec<u8>, StorageError> {
        let write_err = |e: String| -> StorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::error(e)).into()
        };
        let header = snapshot_file_header(meta).map_err(|e| write_err(e.to_string()))?;
        let (slot, legacy) = (self.slot.clone(), self.legacy.clone());
        tokio::task::spawn_blocking(move || {
            slot.replace(&[&header, &data])?;
            // The file supersedes a snapshot stored before snapshots were files.
            legacy.apply(vec![WriteOp::Delete(LEGACY_KEY_SNAPSHOT.to_vec())])?;
            Ok::<_, crate::storage::StoreError>(data)
        })
        .await
        .map_err(|e| write_err(e.to_string()))?
        .map_err(|e| write_err(e.to_string()))
    }
}

/// The stored snapshot: the file, or else the one a data dir written before
/// snapshot files kept in its tree.
fn read_snapshot(
    slot: &dyn SnapshotSlot,
    legacy: &dyn KvTree,
) -> Result<Option<StoredSnapshot>, StorageError> {
    if let Some(bytes) = slot.read().map_err(snap_read_err)? {
        return parse_snapshot_file(bytes).map(Some).map_err(snap_read_err);
    }
    let Some(bytes) = legacy.get(LEGACY_KEY_SNAPSHOT).map_err(snap_read_err)? else {
        return Ok(None);
    };
    let stored: LegacySnapshot = codec::decode("snapshot", &bytes).map_err(snap_read_err)?;
    Ok(Some(StoredSnapshot {
        meta: stored.meta,
        bytes: stored.data,
        data_at: 0,
    }))
}

impl RaftSnapshotBuilder<TypeConfig> for SmStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        // All of it on the blocking pool: the copy is taken under the lock, and
        // encoded after it is released (applies go on meanwhile).
        let shared = self.shared.clone();
        let started = std::time::Instant::now();
        let (meta, data, copy_ms) = tokio::task::spawn_blocking(move || {
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
            let copy_ms = started.elapsed().as_millis() as u64;
            let data = writer();
            shared.since.sized(data.len());
            (meta, data, copy_ms)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, AnyError::error(e.to_string())))?;
        let encoded_ms = started.elapsed().as_millis() as u64;
        let data = self.persist(&meta, data).await?;
        // Applies wait only for the copy (under the lock); the encode and the write
        // run after it is released.
        tracing::info!(
            group = self.group,
            snapshot = %meta.snapshot_id,
            bytes = data.len(),
            copy_ms,
            encode_ms = encoded_ms - copy_ms,
            persist_ms = started.elapsed().as_millis() as u64 - encoded_ms,
            "snapshot built"
        );
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
        self.persist(meta, data).await.map(drop)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let (slot, legacy) = (self.slot.clone(), self.legacy.clone());
        let stored = tokio::task::spawn_blocking(move || read_snapshot(&*slot, &*legacy))
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, AnyError::error(e.to_string())))??;
        Ok(stored.map(|stored| {
            let (meta, data) = stored.into_parts();
            Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            }
        }))
    }
}

#[cfg(test)]
#[path = "sm_store_tests.rs"]
mod tests;
