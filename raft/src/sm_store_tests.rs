//! Where a group's snapshot is kept: a file written whole, read back at open, and a
//! data dir written before snapshot files still restored from its tree.

use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, RaftSnapshotBuilder};

use super::*;
use crate::state_machine::RestoreError;
use crate::storage::{KvStore, MemoryStore};

/// A machine whose state is the bytes it was last given.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl StateMachine for Bytes {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        self.0 = command.to_vec();
        Vec::new()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        self.0 = snapshot.to_vec();
        Ok(())
    }
    fn query(&self, _query: &[u8]) -> Vec<u8> {
        self.0.clone()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn meta_at(index: u64) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), index)),
        last_membership: StoredMembership::default(),
        snapshot_id: format!("s-{index}"),
    }
}

fn open(store: &dyn KvStore) -> (SmStore, RestoreTimes) {
    SmStore::open(
        1,
        Box::new(Bytes::default()),
        store.snapshot_slot("g1").expect("slot"),
        store.tree("g1/snapshot").expect("tree"),
    )
    .expect("opens")
}

fn state_of(sm: &SmStore) -> Vec<u8> {
    sm.shared().lock().sm.snapshot()
}

/// What a data dir written before snapshot files stored: the meta and the data,
/// encoded together in the `g{N}/snapshot` tree.
#[derive(serde::Serialize)]
struct LegacyWritten<'a> {
    meta: &'a SnapshotMeta,
    #[serde(with = "serde_bytes")]
    data: &'a [u8],
}

#[tokio::test]
async fn a_snapshot_is_a_file_read_back_at_open_and_the_tree_one_is_read_until_then() {
    let store = MemoryStore::new();
    let legacy = store.tree("g1/snapshot").expect("tree");
    let written = codec::encode(
        "legacy snapshot",
        &LegacyWritten {
            meta: &meta_at(7),
            data: b"before files",
        },
    )
    .expect("encodes");
    legacy
        .apply(vec![WriteOp::Put(LEGACY_KEY_SNAPSHOT.to_vec(), written)])
        .expect("stored");

    // Restored from the tree.
    let (mut sm, times) = open(&store);
    assert_eq!(state_of(&sm), b"before files");
    assert_eq!(times.bytes, b"before files".len());
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied.map(|l| l.index), Some(7));
    let current = sm.get_current_snapshot().await.expect("read").expect("one");
    assert_eq!(current.meta.snapshot_id, "s-7");
    assert_eq!(current.snapshot.into_inner(), b"before files");

    // A new snapshot is a file, and the tree's is gone.
    sm.shared().lock().sm.apply(8, b"in a file");
    sm.shared().lock().last_applied = meta_at(8).last_log_id;
    let built = sm.build_snapshot().await.expect("built");
    assert_eq!(built.snapshot.into_inner(), b"in a file");
    assert_eq!(legacy.get(LEGACY_KEY_SNAPSHOT).expect("get"), None);
    let file = store
        .snapshot_slot("g1")
        .expect("slot")
        .read()
        .expect("read");
    let file = parse_snapshot_file(file.expect("written")).expect("parses");
    assert_eq!(file.meta.last_log_id.map(|l| l.index), Some(8));
    assert_eq!(file.data(), b"in a file");

    // Read back at open, and sent to a follower whole.
    let (mut reopened, times) = open(&store);
    assert_eq!(state_of(&reopened), b"in a file");
    assert_eq!(times.bytes, b"in a file".len());
    let current = reopened
        .get_current_snapshot()
        .await
        .expect("read")
        .expect("one");
    assert_eq!(current.meta.last_log_id.map(|l| l.index), Some(8));
    assert_eq!(current.snapshot.into_inner(), b"in a file");

    // An installed snapshot replaces the file.
    reopened
        .install_snapshot(&meta_at(12), Box::new(Cursor::new(b"installed".to_vec())))
        .await
        .expect("installed");
    let (again, _) = open(&store);
    assert_eq!(state_of(&again), b"installed");
}

#[test]
fn a_file_that_is_not_a_snapshot_is_refused_with_why() {
    let too_short = parse_snapshot_file(b"GWSNAP".to_vec())
        .err()
        .expect("refused");
    assert!(
        too_short.to_string().contains("does not start with"),
        "{too_short}"
    );
    let mut past_end = SNAPSHOT_FILE_MAGIC.to_vec();
    past_end.extend_from_slice(&1_000u32.to_le_bytes());
    let past_end = parse_snapshot_file(past_end).err().expect("refused");
    assert!(past_end.to_string().contains("past its end"), "{past_end}");
    let header = snapshot_file_header(&meta_at(3)).expect("header");
    let whole = parse_snapshot_file([header, b"data".to_vec()].concat()).expect("parses");
    assert_eq!(whole.data(), b"data");
    let (meta, data) = whole.into_parts();
    assert_eq!(meta.snapshot_id, "s-3");
    assert_eq!(data, b"data");
}
