//! openraft's `RaftLogStorage` over a `KvTree`: the log of one group, its vote,
//! committed and purged ids.
//!
//! Invariants: an append is acknowledged (the `LogFlushed` callback) only after
//! group commit made it durable; a vote is durable before `save_vote` returns;
//! the log never has a hole (truncate removes a suffix, purge a prefix, and the
//! purged id is recorded before entries are removed); after every append,
//! truncate and purge, [`LastLog`] holds the stored last log id (the election
//! gate reports it to peers). Used by openraft's core task and its replication
//! tasks (through cloned readers).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, OptionalSend, RaftLogReader, StorageIOError};

use crate::codec;
use crate::storage::{KvTree, StoreError, SyncHandle, WriteOp};
use crate::types::{Entry, GroupId, LogId, StorageError, TypeConfig, Vote};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"purged";
/// Bound on entries read by one range request.
pub const LOG_READ_ENTRIES_MAX: usize = 100_000;

fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn io_read(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

fn io_write(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

/// The last log id a group's log holds here, shared with the election gate
/// (which tells peers, so the replica with the longest log campaigns first).
#[derive(Clone, Default)]
pub(crate) struct LastLog(Arc<Mutex<Option<LogId>>>);

impl LastLog {
    /// The last log id (None for an empty log).
    pub(crate) fn get(&self) -> Option<LogId> {
        self.0.lock().map(|l| *l).unwrap_or(None)
    }

    fn set(&self, id: Option<LogId>) {
        if let Ok(mut l) = self.0.lock() {
            *l = id;
        }
    }
}

/// The Raft log of one group.
#[derive(Clone)]
pub(crate) struct LogStore {
    group: GroupId,
    log: Arc<dyn KvTree>,
    meta: Arc<dyn KvTree>,
    sync: SyncHandle,
    /// Last committed index + 1 (0: nothing committed), for metrics.
    committed: Arc<AtomicU64>,
    last: LastLog,
}

impl LogStore {
    pub(crate) fn new(
        group: GroupId,
        log: Arc<dyn KvTree>,
        meta: Arc<dyn KvTree>,
        sync: SyncHandle,
        committed: Arc<AtomicU64>,
        last: LastLog,
    ) -> Self {
        Self {
            group,
            log,
            meta,
            sync,
            committed,
            last,
        }
    }

    /// The last log id as stored: the last entry's, else the purged id.
    fn stored_last(&self, last_purged: Option<LogId>) -> Result<Option<LogId>, StorageError> {
        let last = match self.log.last().map_err(io_read)? {
            Some((_, v)) => Some(
                codec::decode::<Entry>("log entry", &v)
                    .map_err(io_read)?
                    .log_id,
            ),
            None => last_purged,
        };
        self.last.set(last);
        Ok(last)
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &'static str,
    ) -> Result<Option<T>, StorageError> {
        match self.meta.get(key).map_err(io_read)? {
            None => Ok(None),
            Some(bytes) => Ok(Some(codec::decode(what, &bytes).map_err(io_read)?)),
        }
    }

    fn write_meta<T: serde::Serialize>(
        &self,
        key: &[u8],
        what: &'static str,
        value: &T,
    ) -> Result<(), StorageError> {
        let bytes = codec::encode(what, value).map_err(io_write)?;
        self.meta
            .apply(vec![WriteOp::Put(key.to_vec(), bytes)])
            .map_err(io_write)
    }

    fn delete_range(&self, from: u64, to: Option<u64>) -> Result<(), StorageError> {
        if let Some(to) = to {
            return self.delete_below(from, to);
        }
        loop {
            let batch = self
                .log
                .scan(&log_key(from), None, DELETE_BATCH_MAX)
                .map_err(io_write)?;
            if batch.is_empty() {
                return Ok(());
            }
            let ops = batch.into_iter().map(|(k, _)| WriteOp::Delete(k)).collect();
            self.log.apply(ops).map_err(io_write)?;
        }
    }
}

impl LogStore {
    /// Deletes the entries in `from..to` by key, reading only the first one: a purge
    /// after a snapshot may drop hundreds of thousands of entries, and openraft waits
    /// for it before the group appends again, so their bytes are not read back.
    fn delete_below(&self, from: u64, to: u64) -> Result<(), StorageError> {
        let first = self
            .log
            .scan(&log_key(from), Some(&log_key(to)), 1)
            .map_err(io_write)?;
        let Some(start) = first.first().and_then(|(k, _)| key_index(k)) else {
            return Ok(());
        };
        let mut next = start;
        while next < to {
            let end = next.saturating_add(DELETE_BATCH_MAX as u64).min(to);
            let ops = (next..end)
                .map(|i| WriteOp::Delete(log_key(i).to_vec()))
                .collect();
            self.log.apply(ops).map_err(io_write)?;
            next = end;
        }
        Ok(())
    }
}

/// Most log entries deleted in one write.
const DELETE_BATCH_MAX: usize = 10_000;

/// The index a log key stands for.
fn key_index(key: &[u8]) -> Option<u64> {
    key.try_into().ok().map(u64::from_be_bytes)
}

fn range_to_bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e.checked_add(1),
        Bound::Excluded(e) => Some(*e),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (start, end) = range_to_bounds(&range);
        let end_key = end.map(log_key);
        let rows = self
            .log
            .scan(
                &log_key(start),
                end_key.as_ref().map(|k| &k[..]),
                LOG_READ_ENTRIES_MAX,
            )
            .map_err(io_read)?;
        rows.iter()
            .map(|(_, v)| codec::decode::<Entry>("log entry", v).map_err(io_read))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.read_meta(KEY_PURGED, "purged log id")?;
        let last = self.stored_last(last_purged)?;
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.write_meta(KEY_VOTE, "vote", vote)?;
        self.sync
            .sync_wait()
            .await
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.read_meta(KEY_VOTE, "vote")
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.write_meta(KEY_COMMITTED, "committed log id", &committed)?;
        let next = committed.map(|c| c.index + 1).unwrap_or(0);
        self.committed.store(next, Ordering::Relaxed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self.read_meta(KEY_COMMITTED, "committed log id")?;
        let committed = committed.flatten();
        let next = committed.map(|c| c.index + 1).unwrap_or(0);
        self.committed.store(next, Ordering::Relaxed);
        Ok(committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = Instant::now();
        let mut ops = Vec::new();
        let mut last = None;
        for entry in entries {
            let bytes = codec::encode("log entry", &entry).map_err(io_write)?;
            ops.push(WriteOp::Put(log_key(entry.log_id.index).to_vec(), bytes));
            last = Some(entry.log_id);
        }
        self.log.apply(ops).map_err(io_write)?;
        if last.is_some() {
            self.last.set(last);
        }
        let group = self.group.to_string();
        self.sync.sync(move |res: Result<(), StoreError>| {
            metrics::histogram!("gangway_raft_append_seconds", "group" => group)
                .record(started.elapsed().as_secs_f64());
            callback.log_io_completed(res.map_err(std::io::Error::other));
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.delete_range(log_id.index, None)?;
        let last_purged: Option<LogId> = self.read_meta(KEY_PURGED, "purged log id")?;
        self.stored_last(last_purged).map(|_| ())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write_meta(KEY_PURGED, "purged log id", &log_id)?;
        self.delete_range(0, Some(log_id.index + 1))?;
        self.stored_last(Some(log_id)).map(|_| ())
    }
}

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
