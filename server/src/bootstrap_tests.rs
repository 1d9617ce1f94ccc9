//! Unit tests of `bootstrap.rs`.

use super::*;

fn view(holds: bool, saw: bool) -> Option<PeerView> {
    Some(PeerView {
        holds_raft_state: holds,
        saw_this_replica: saw,
    })
}

#[test]
fn a_peer_that_saw_this_id_refuses_it_even_before_the_others_answer() {
    let answers = BTreeMap::from([(2, None), (3, view(true, true))]);
    assert_eq!(verdict(&answers), Verdict::LostDisk(3));
}

#[test]
fn nothing_is_decided_while_a_peer_is_silent() {
    let answers = BTreeMap::from([(2, view(false, false)), (3, None)]);
    assert_eq!(verdict(&answers), Verdict::Wait(vec![3]));
    let answers = BTreeMap::from([(2, view(true, false)), (3, None)]);
    assert_eq!(verdict(&answers), Verdict::Wait(vec![3]));
}

#[test]
fn all_blank_creates_and_a_formed_cluster_is_served_without_bootstrap() {
    let blank = BTreeMap::from([(2, view(false, false)), (3, view(false, false))]);
    assert_eq!(verdict(&blank), Verdict::Bootstrap);
    let formed = BTreeMap::from([(2, view(true, false)), (3, view(false, false))]);
    assert_eq!(verdict(&formed), Verdict::Serve);
    assert_eq!(verdict(&BTreeMap::new()), Verdict::Bootstrap);
}

fn cfg(join: bool, state: InitialClusterState) -> ServeConfig {
    let args = crate::config::ServeArgs {
        id: Some(1),
        join,
        initial_cluster_state: Some(state),
        ..Default::default()
    };
    ServeConfig::resolve(args).expect("valid config")
}

#[test]
fn a_blank_replica_bootstraps_only_when_told_and_resumes_otherwise() {
    let existing = cfg(false, InitialClusterState::Existing);
    let err = start_mode(&existing, false).expect_err("blank, existing");
    assert!(err.to_string().contains("--initial-cluster-state"), "{err}");
    assert_eq!(
        start_mode(&existing, true).expect("resume"),
        StartMode::Resume
    );
    let new = cfg(false, InitialClusterState::New);
    assert_eq!(start_mode(&new, false).expect("create"), StartMode::Create);
    assert_eq!(start_mode(&new, true).expect("resume"), StartMode::Resume);
}

#[test]
fn a_peer_started_with_another_shard_count_is_refused_naming_the_flag() {
    let me = cfg(false, InitialClusterState::New);
    let status = |started_groups| StatusReply {
        cluster_id: me.cluster_id.clone(),
        started_groups,
        ..Default::default()
    };
    let same = status(me.shards + 1);
    assert!(view_of(&me, 2, &same).is_ok());
    // Releases before the field answer 0: nothing to compare.
    assert!(view_of(&me, 2, &status(0)).is_ok());
    let err = view_of(&me, 2, &status(me.shards + 3)).expect_err("another count");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("--shards {}", me.shards + 2)) && msg.contains("shards grow"),
        "{msg}"
    );
}

#[test]
fn the_lost_disk_refusal_names_the_flags() {
    let msg = lost_disk_error(&cfg(false, InitialClusterState::New), 2).to_string();
    assert!(
        msg.contains("lost its disk") && msg.contains("--initial-cluster-state"),
        "{msg}"
    );
    assert!(msg.contains("--join"), "{msg}");
}
