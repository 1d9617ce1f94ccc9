//! Meta's groups by seq, with a count of the records that passes over them visited,
//! so a test can tell a command or read whose work grows with every group kept
//! (issue: meta work must be O(what a command changes), not O(history)).
//!
//! Invariants: behaves as the ordered map it wraps and encodes as it; lookups by seq
//! are not counted, every record an iteration yields is. The count is never encoded
//! and never compared. Records are shared copy-on-write, so a clone (the copy a
//! snapshot is encoded from, off the state-machine lock) costs the map's nodes, not
//! its records; a record is copied only when it changes while a clone holds it.
//! Owned by [`super::MetaState`].

use std::collections::BTreeMap;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::groups::{GroupRecord, GroupSeq};

/// The groups meta keeps, by seq. Records sit behind a pointer: a map node holds
/// eleven slots whether or not they are used, and a record is a few hundred bytes.
#[derive(Debug, Default)]
pub struct GroupTable {
    records: BTreeMap<GroupSeq, Arc<GroupRecord>>,
    /// Records yielded by iterations so far (relaxed: a statistic for tests).
    visited: AtomicU64,
}

impl Serialize for GroupTable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.records.iter().map(|(seq, r)| (seq, &**r)))
    }
}

impl<'de> Deserialize<'de> for GroupTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(TableVisitor)
    }
}

/// Reads the map straight into shared records (a map of records by value would move
/// each few-hundred-byte record around as its nodes split, then again into its `Arc`).
struct TableVisitor;

impl<'de> Visitor<'de> for TableVisitor {
    type Value = GroupTable;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map of gang group records by seq")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GroupTable, A::Error> {
        let mut records = BTreeMap::new();
        while let Some((seq, record)) = map.next_entry::<GroupSeq, GroupRecord>()? {
            records.insert(seq, Arc::new(record));
        }
        Ok(GroupTable {
            records,
            visited: AtomicU64::new(0),
        })
    }
}

impl Clone for GroupTable {
    fn clone(&self) -> Self {
        Self {
            records: self.records.clone(),
            visited: AtomicU64::new(0),
        }
    }
}

impl PartialEq for GroupTable {
    fn eq(&self, other: &Self) -> bool {
        self.records == other.records
    }
}

impl GroupTable {
    /// The record of `seq`.
    pub fn get(&self, seq: &GroupSeq) -> Option<&GroupRecord> {
        self.records.get(seq).map(|r| &**r)
    }

    /// The record of `seq`, to change (the caller bumps its version).
    pub fn get_mut(&mut self, seq: &GroupSeq) -> Option<&mut GroupRecord> {
        self.records.get_mut(seq).map(Arc::make_mut)
    }

    /// Keeps `record` under `seq`.
    pub fn insert(&mut self, seq: GroupSeq, record: GroupRecord) -> Option<GroupRecord> {
        self.records
            .insert(seq, Arc::new(record))
            .map(Arc::unwrap_or_clone)
    }

    /// Forgets `seq`.
    pub fn remove(&mut self, seq: &GroupSeq) -> Option<GroupRecord> {
        self.records.remove(seq).map(Arc::unwrap_or_clone)
    }

    /// How many groups are kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Every record in seq order (counted as visited as it is yielded).
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &GroupRecord> + '_ {
        self.records
            .values()
            .map(|r| &**r)
            .inspect(|_| self.note_visit())
    }

    /// Every record in seq order, to change (counted as visited).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut GroupRecord> + '_ {
        let visited = &self.visited;
        self.records.values_mut().map(move |r| {
            visited.fetch_add(1, Ordering::Relaxed);
            Arc::make_mut(r)
        })
    }

    /// The records whose seqs fall in `range`, in order (counted as visited).
    pub fn range(
        &self,
        range: impl RangeBounds<GroupSeq>,
    ) -> impl Iterator<Item = (&GroupSeq, &GroupRecord)> + '_ {
        self.records.range(range).map(|(seq, r)| {
            self.note_visit();
            (seq, &**r)
        })
    }

    /// Records yielded by iterations so far.
    #[cfg(test)]
    pub fn visited(&self) -> u64 {
        self.visited.load(Ordering::Relaxed)
    }

    fn note_visit(&self) {
        self.visited.fetch_add(1, Ordering::Relaxed);
    }
}
