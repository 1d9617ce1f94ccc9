//! Durable key-value storage behind gangway-raft, with sled in production and
//! an in-memory store for tests and benchmarks.
//!
//! Owns: the `KvStore` / `KvTree` traits that the Raft log and state-machine
//! stores are written against, and group commit (`SyncHandle`) that turns many
//! appends into one flush. Invariant: a `SyncHandle::sync` callback runs only
//! after every write issued before it is durable. Called by `log_store` and
//! `sm_store`; opened by whoever builds a `RaftHost`.

mod memory;
mod sled_store;
mod snapshot_file;
mod sync;

pub use memory::MemoryStore;
pub use sled_store::{SledStore, SLED_CACHE_BYTES_DEFAULT};
pub use sync::SyncHandle;

use std::sync::Arc;

/// A storage failure; the Raft group that sees it stops rather than diverge.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The underlying engine failed to read or write.
    #[error("storage I/O failed: {0}")]
    Io(String),
    /// Stored bytes could not be decoded.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The store was shut down while a request was pending.
    #[error("storage is shut down")]
    Closed,
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}

/// A stored key and its value.
pub type KvPair = (Vec<u8>, Vec<u8>);

/// One write in an atomic batch.
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// Insert or replace `key`.
    Put(Vec<u8>, Vec<u8>),
    /// Remove `key` if present.
    Delete(Vec<u8>),
}

/// An ordered key-value namespace (a sled tree).
pub trait KvTree: Send + Sync + 'static {
    /// The value stored under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Applies every op of `batch` atomically.
    fn apply(&self, batch: Vec<WriteOp>) -> Result<(), StoreError>;
    /// Entries with `from <= key < to` (`to = None`: no upper bound), in key order, at most `limit`.
    fn scan(&self, from: &[u8], to: Option<&[u8]>, limit: usize)
        -> Result<Vec<KvPair>, StoreError>;
    /// The entry with the greatest key.
    fn last(&self) -> Result<Option<KvPair>, StoreError>;
}

/// Where a group keeps its current snapshot: whole, replaced atomically, and made
/// durable on its own (not by the store's `flush`, which the log's appends wait on).
pub trait SnapshotSlot: Send + Sync + 'static {
    /// The stored bytes, if any.
    fn read(&self) -> Result<Option<Vec<u8>>, StoreError>;
    /// Whether a snapshot is stored (without reading it).
    fn is_written(&self) -> Result<bool, StoreError>;
    /// Replaces the stored bytes with `parts` concatenated; returns once that is
    /// durable. Blocks (for seconds with a large state): call it off the runtime.
    fn replace(&self, parts: &[&[u8]]) -> Result<(), StoreError>;
}

/// A process-wide store holding many trees.
pub trait KvStore: Send + Sync + 'static {
    /// Opens (creating if needed) the tree called `name`.
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StoreError>;
    /// Opens the snapshot slot called `name` (empty if never written). Opening removes
    /// what a stopped write left behind, so a slot is opened only while no write to it
    /// runs: at start, or for a group not open yet.
    fn snapshot_slot(&self, name: &str) -> Result<Arc<dyn SnapshotSlot>, StoreError>;
    /// Makes every write issued so far durable; blocks.
    fn flush(&self) -> Result<(), StoreError>;
    /// Whether `flush` does anything (false for the memory store).
    fn is_durable(&self) -> bool;
}
