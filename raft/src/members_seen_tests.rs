//! Unit tests of `members_seen.rs`.

use super::*;
use crate::storage::MemoryStore;

#[test]
fn the_set_survives_reopening_and_only_grows() {
    let store: Arc<dyn KvStore> = Arc::new(MemoryStore::default());
    let seen = MembersSeen::open(store.clone()).expect("open");
    assert!(seen.get().is_empty());
    assert_eq!(seen.record(&[2, 3].into()).expect("record"), vec![2, 3]);
    assert_eq!(
        seen.record(&[3].into()).expect("record"),
        Vec::<NodeId>::new()
    );
    let again = MembersSeen::open(store).expect("reopen");
    assert_eq!(again.get(), [2, 3].into());
}

#[test]
fn only_acknowledgements_to_a_leader_and_applied_leaders_count() {
    let groups = [
        GroupParticipation {
            leading: true,
            acknowledged: vec![2],
            applied_from: None,
        },
        GroupParticipation {
            leading: false,
            acknowledged: vec![5],
            applied_from: Some(3),
        },
        GroupParticipation {
            leading: false,
            acknowledged: vec![],
            applied_from: Some(1),
        },
    ];
    assert_eq!(participants(1, &groups), [2, 3].into());
}

#[test]
fn a_blank_store_holds_no_raft_state_until_a_group_writes() {
    let store = MemoryStore::default();
    assert!(!holds_raft_state(&store, &[0, 1]).expect("read"));
    store
        .tree("g1/meta")
        .expect("tree")
        .apply(vec![WriteOp::Put(b"vote".to_vec(), b"x".to_vec())])
        .expect("write");
    assert!(holds_raft_state(&store, &[0, 1]).expect("read"));
}
