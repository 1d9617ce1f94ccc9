//! Unit tests of `reachability.rs`.

use super::*;
use openraft::CommittedLeaderId;

fn log(term: u64, node: NodeId, index: u64) -> Option<LogId> {
    Some(LogId::new(CommittedLeaderId::new(term, node), index))
}

/// A peer's view; `hears` makes it hear leader 1.
fn view(last_log: Option<LogId>, hears: bool) -> PeerGroupView {
    PeerGroupView {
        last_log,
        leader: hears.then_some(1),
    }
}

const TIMING: GateTiming = GateTiming {
    lease_ms: 600,
    restraint_max_ms: 1_800,
};

/// Replica 2 of voters {1, 2, 3}; 1 led and went silent `silent_ms` ago;
/// 3 is in reach with `three`.
fn follower(last_log: Option<LogId>, three: PeerGroupView, silent_ms: Option<u64>) -> GateInput {
    GateInput {
        me: 2,
        voters: vec![1, 2, 3],
        last_log,
        role: Role::Follower,
        peers: vec![(3, three)],
        held: false,
        leader_silent_ms: silent_ms,
    }
}

#[test]
fn a_replica_campaigns_only_with_a_majority_in_reach() {
    let all = |_| true;
    let none = |_| false;
    assert!(majority_reachable(1, &[1, 2, 3], all));
    assert!(!majority_reachable(1, &[1, 2, 3], none));
    assert!(majority_reachable(1, &[1, 2, 3], |p| p == 3));
    assert!(!majority_reachable(1, &[1, 2, 3, 4, 5], |p| p == 3));
    assert!(majority_reachable(1, &[1], none));
    // A learner never campaigns; the gate leaves it alone.
    assert!(majority_reachable(9, &[1, 2, 3], none));
}

#[test]
fn a_peer_is_reachable_only_within_the_window() {
    let r = Reachability::default();
    let now = Instant::now();
    assert!(r.views(0, now).is_empty());
    r.answered(2, BTreeMap::from([(0, view(log(1, 1, 5), true))]));
    assert!(!r.leads(2, 0, Instant::now()));
    r.answered(1, BTreeMap::from([(0, view(log(1, 1, 5), true))]));
    assert!(r.leads(1, 0, Instant::now()));
    assert_eq!(r.views(0, Instant::now()).len(), 2);
    assert!(r.views(1, Instant::now()).is_empty());
    let later = Instant::now() + Duration::from_millis(REACH_WINDOW_MS + 1);
    assert!(r.views(0, later).is_empty());
    assert!(!r.leads(1, 0, later));
    assert!(r.start_ping(2));
    assert!(!r.start_ping(2));
    r.end_ping(2);
    assert!(r.start_ping(2));
}

#[test]
fn without_a_majority_in_reach_nobody_campaigns() {
    let mut input = follower(log(1, 1, 9), view(log(1, 1, 9), false), Some(5_000));
    input.peers.clear();
    let d = decide(&input, TIMING);
    assert_eq!(
        (d.enable, d.campaign_now, d.reason),
        (false, false, GateReason::OutOfReach)
    );
}

#[test]
fn nobody_campaigns_while_a_voter_in_reach_hears_a_leader() {
    // Back from a pause: its own leader looks silent, but replica 3 hears 1.
    let input = follower(log(1, 1, 9), view(log(1, 1, 8), true), Some(5_000));
    let d = decide(&input, TIMING);
    assert_eq!(
        (d.enable, d.campaign_now, d.reason),
        (false, false, GateReason::LeaderHeard(1))
    );
    // A peer that names this replica as leader is stale; it does not hold it back.
    let mut input = follower(log(1, 1, 9), view(log(1, 1, 8), false), Some(5_000));
    input.peers[0].1.leader = Some(2);
    assert!(decide(&input, TIMING).enable);
}

#[test]
fn a_shorter_log_defers_to_the_longest_while_the_leader_is_silent() {
    let input = follower(log(1, 1, 8), view(log(1, 1, 9), false), Some(400));
    let d = decide(&input, TIMING);
    assert_eq!(
        (d.enable, d.campaign_now, d.reason),
        (false, false, GateReason::DefersTo(3))
    );
    // A later term outranks a higher index, as openraft compares log ids.
    let input = follower(log(2, 3, 4), view(log(1, 1, 9), false), Some(400));
    assert_eq!(decide(&input, TIMING).reason, GateReason::MayCampaign);
    // Equal logs: the lower id goes first.
    let input = follower(log(1, 1, 9), view(log(1, 1, 9), false), Some(400));
    assert_eq!(decide(&input, TIMING).reason, GateReason::MayCampaign);
    let mut input = follower(log(1, 1, 9), view(log(1, 1, 9), false), Some(400));
    input.me = 4;
    input.voters = vec![1, 3, 4];
    assert_eq!(decide(&input, TIMING).reason, GateReason::DefersTo(3));
}

#[test]
fn the_restraint_ends_after_its_bound_but_never_campaigns_early() {
    let input = follower(
        log(1, 1, 8),
        view(log(1, 1, 9), false),
        Some(TIMING.restraint_max_ms),
    );
    let d = decide(&input, TIMING);
    assert_eq!(
        (d.enable, d.campaign_now, d.reason),
        (true, false, GateReason::MayCampaign)
    );
}

#[test]
fn the_longest_log_campaigns_once_the_lease_has_surely_run_out() {
    let early = TIMING.lease_ms + CAMPAIGN_SLACK_MS - 1;
    let input = follower(log(1, 1, 9), view(log(1, 1, 8), false), Some(early));
    let d = decide(&input, TIMING);
    assert_eq!((d.enable, d.campaign_now), (true, false));
    let input = follower(log(1, 1, 9), view(log(1, 1, 8), false), Some(early + 1));
    assert!(decide(&input, TIMING).campaign_now);
    // Not while it hears a leader itself.
    let input = follower(log(1, 1, 9), view(log(1, 1, 8), false), None);
    assert!(!decide(&input, TIMING).campaign_now);
}

#[test]
fn no_early_campaign_during_a_transfer_hold_or_while_already_campaigning() {
    let mut input = follower(log(1, 1, 9), view(log(1, 1, 8), false), Some(1_000));
    input.held = true;
    let d = decide(&input, TIMING);
    assert_eq!(
        (d.enable, d.campaign_now, d.reason),
        (false, false, GateReason::TransferHold)
    );
    let mut input = follower(log(1, 1, 9), view(log(1, 1, 8), false), Some(1_000));
    input.role = Role::Candidate;
    assert!(!decide(&input, TIMING).campaign_now);
}

#[test]
fn a_learner_never_campaigns_early() {
    let mut input = follower(log(1, 1, 9), view(log(1, 1, 8), false), Some(1_000));
    input.voters = vec![1, 3, 5];
    input.peers.push((5, view(log(1, 1, 8), false)));
    assert!(!decide(&input, TIMING).campaign_now);
}

#[test]
fn a_new_vote_restarts_the_wait() {
    let mut st = GateState::default();
    let t0 = Instant::now();
    let v1 = Vote::new_committed(1, 1);
    assert_eq!(st.vote_changed_at(0, v1, t0), t0);
    let t1 = t0 + Duration::from_millis(500);
    assert_eq!(st.vote_changed_at(0, v1, t1), t0);
    let v2 = Vote::new(2, 3);
    assert_eq!(st.vote_changed_at(0, v2, t1), t1);
    assert_eq!(st.vote_changed_at(1, v1, t1), t1);
}

#[test]
fn one_early_campaign_per_lease() {
    let mut st = GateState::default();
    let t0 = Instant::now();
    assert!(st.may_campaign_again(0, t0, TIMING));
    st.campaigned_at.insert(0, t0);
    let almost = t0 + Duration::from_millis(TIMING.lease_ms - 1);
    assert!(!st.may_campaign_again(0, almost, TIMING));
    assert!(st.may_campaign_again(1, almost, TIMING));
    let later = t0 + Duration::from_millis(TIMING.lease_ms);
    assert!(st.may_campaign_again(0, later, TIMING));
}
