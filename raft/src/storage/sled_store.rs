//! sled-backed `KvStore`: one `sled::Db` per process, one tree per Raft group
//! and purpose. sled is kept behind this file so nothing else depends on it.

use std::path::Path;
use std::sync::Arc;

use super::snapshot_file::SnapshotFile;
use super::{KvPair, KvStore, KvTree, SnapshotSlot, StoreError, WriteOp};

/// Folder, inside the store's directory, of the groups' snapshot files.
pub const SNAPSHOT_DIR: &str = "group-snapshots";

/// Default bound on sled's page cache.
pub const SLED_CACHE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// A sled database opened on a directory.
pub struct SledStore {
    db: sled::Db,
    /// Where snapshots are kept (beside sled's own files, in its directory).
    snapshot_dir: std::path::PathBuf,
}

impl SledStore {
    /// Opens or creates the database in `dir` with a page cache bounded by `cache_bytes`.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .mode(sled::Mode::HighThroughput)
            // Group commit flushes after every append; sled's own periodic
            // flusher would only contend with it.
            .flush_every_ms(None)
            .open()?;
        Ok(Self {
            db,
            snapshot_dir: dir.join(SNAPSHOT_DIR),
        })
    }
}

struct SledTree(sled::Tree);

impl KvTree for SledTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.0.get(key)?.map(|v| v.to_vec()))
    }

    fn apply(&self, batch: Vec<WriteOp>) -> Result<(), StoreError> {
        let mut b = sled::Batch::default();
        for op in batch {
            match op {
                WriteOp::Put(k, v) => b.insert(k, v),
                WriteOp::Delete(k) => b.remove(k),
            }
        }
        Ok(self.0.apply_batch(b)?)
    }

    fn scan(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KvPair>, StoreError> {
        let iter = match to {
            Some(to) => self.0.range(from..to),
            None => self.0.range(from..),
        };
        let mut out = Vec::new();
        for item in iter.take(limit) {
            let (k, v) = item?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn last(&self) -> Result<Option<KvPair>, StoreError> {
        Ok(self.0.last()?.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }
}

impl KvStore for SledStore {
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StoreError> {
        Ok(Arc::new(SledTree(self.db.open_tree(name)?)))
    }

    fn snapshot_slot(&self, name: &str) -> Result<Arc<dyn SnapshotSlot>, StoreError> {
        Ok(Arc::new(SnapshotFile::open(
            self.snapshot_dir.clone(),
            name,
        )?))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    fn is_durable(&self) -> bool {
        true
    }
}
