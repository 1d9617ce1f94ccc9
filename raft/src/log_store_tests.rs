//! Purging the log: every entry up to the purged index goes, by key, and the rest stays.

use std::sync::atomic::AtomicU64;

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, EntryPayload};

use super::*;
use crate::storage::{KvStore, MemoryStore};

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

#[tokio::test]
async fn a_purge_deletes_every_entry_up_to_its_index_and_keeps_the_rest() {
    let store: Arc<dyn KvStore> = Arc::new(MemoryStore::new());
    let log = store.tree("g1/log").expect("tree");
    let sync = SyncHandle::start(store.clone()).expect("sync");
    let mut logs = LogStore::new(
        1,
        log.clone(),
        store.tree("g1/meta").expect("tree"),
        sync,
        Arc::new(AtomicU64::new(0)),
        LastLog::default(),
    );
    // A log purged up to 4 before, holding 5..=25_004: more than one delete batch.
    let (first, last, purged) = (5, 25_004, 20_000);
    let ops = (first..=last)
        .map(|i| {
            let entry = Entry {
                log_id: log_id(i),
                payload: EntryPayload::Blank,
            };
            let bytes = codec::encode("log entry", &entry).expect("encodes");
            WriteOp::Put(log_key(i).to_vec(), bytes)
        })
        .collect();
    log.apply(ops).expect("stored");
    logs.purge(log_id(purged)).await.expect("purged");
    let left = log.scan(&log_key(0), None, 100_000).expect("scan");
    let indexes: Vec<u64> = left.iter().filter_map(|(k, _)| key_index(k)).collect();
    assert_eq!(indexes.first(), Some(&(purged + 1)));
    assert_eq!(indexes.last(), Some(&last));
    assert_eq!(indexes.len() as u64, last - purged);
    let state = logs.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(purged)));
    assert_eq!(state.last_log_id, Some(log_id(last)));
}
