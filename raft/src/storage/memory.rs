//! In-memory `KvStore` for tests and benchmarks: same semantics as the sled
//! store, nothing survives the process.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{KvPair, KvStore, KvTree, SnapshotSlot, StoreError, WriteOp};

/// A store whose trees live in memory.
#[derive(Default)]
pub struct MemoryStore {
    trees: Mutex<HashMap<String, Arc<MemoryTree>>>,
    slots: Mutex<HashMap<String, Arc<MemorySlot>>>,
}

/// A snapshot slot in memory.
#[derive(Default)]
struct MemorySlot {
    bytes: Mutex<Option<Vec<u8>>>,
}

impl MemorySlot {
    fn lock(&self) -> Result<MutexGuard<'_, Option<Vec<u8>>>, StoreError> {
        self.bytes
            .lock()
            .map_err(|_| StoreError::Io("memory slot lock poisoned".into()))
    }
}

impl SnapshotSlot for MemorySlot {
    fn read(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock()?.clone())
    }

    fn is_written(&self) -> Result<bool, StoreError> {
        Ok(self.lock()?.is_some())
    }

    fn replace(&self, parts: &[&[u8]]) -> Result<(), StoreError> {
        *self.lock()? = Some(parts.concat());
        Ok(())
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
struct MemoryTree {
    map: Mutex<Map>,
}

impl MemoryTree {
    fn lock(&self) -> Result<MutexGuard<'_, Map>, StoreError> {
        self.map
            .lock()
            .map_err(|_| StoreError::Io("memory tree lock poisoned".into()))
    }
}

impl KvTree for MemoryTree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock()?.get(key).cloned())
    }

    fn apply(&self, batch: Vec<WriteOp>) -> Result<(), StoreError> {
        let mut map = self.lock()?;
        for op in batch {
            match op {
                WriteOp::Put(k, v) => {
                    map.insert(k, v);
                }
                WriteOp::Delete(k) => {
                    map.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn scan(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KvPair>, StoreError> {
        let map = self.lock()?;
        let upper = match to {
            Some(to) => Bound::Excluded(to.to_vec()),
            None => Bound::Unbounded,
        };
        Ok(map
            .range((Bound::Included(from.to_vec()), upper))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn last(&self) -> Result<Option<KvPair>, StoreError> {
        Ok(self
            .lock()?
            .iter()
            .next_back()
            .map(|(k, v)| (k.clone(), v.clone())))
    }
}

impl KvStore for MemoryStore {
    fn tree(&self, name: &str) -> Result<Arc<dyn KvTree>, StoreError> {
        let mut trees = self
            .trees
            .lock()
            .map_err(|_| StoreError::Io("memory store lock poisoned".into()))?;
        let tree = trees.entry(name.to_string()).or_default().clone();
        Ok(tree)
    }

    fn snapshot_slot(&self, name: &str) -> Result<Arc<dyn SnapshotSlot>, StoreError> {
        let mut slots = self
            .slots
            .lock()
            .map_err(|_| StoreError::Io("memory store lock poisoned".into()))?;
        let slot: Arc<dyn SnapshotSlot> = slots.entry(name.to_string()).or_default().clone();
        Ok(slot)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn is_durable(&self) -> bool {
        false
    }
}
