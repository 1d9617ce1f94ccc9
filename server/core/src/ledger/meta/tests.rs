//! Unit and property tests of the meta state: idempotent submission, the 2PC
//! decision rules (decision written once; a tombstone beats a late commit),
//! retries with backoff, timeouts, cancel and release, and determinism.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::model::{Gang, GangMode};

fn gang(name: &str, members: u32, min: u32, wait_ms: u64, priority: i32) -> Gang {
    Gang {
        wait_time_ms: wait_ms,
        priority,
        ..Gang::with_members("default", name, members, min, GangMode::Strict)
    }
}

fn group(id: &str, gangs: Vec<Gang>) -> GangGroup {
    GangGroup {
        queue: String::new(),
        id: id.into(),
        gangs,
        ..Default::default()
    }
}

fn submit(m: &mut MetaState, key: &str, g: GangGroup, at_ms: u64) -> GroupSeq {
    match m.apply(&MetaCommand::Submit {
        key: key.into(),
        group: g,
        at_ms,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit failed: {other:?}"),
    }
}

fn begin(m: &mut MetaState, seq: GroupSeq, at_ms: u64) -> TxnId {
    match m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1, 2],
        at_ms,
    }) {
        MetaReply::TxnBegun { txn } => txn,
        other => panic!("begin failed: {other:?}"),
    }
}

/// Where these tests place a member: on `node`, shard 1, nothing else recorded.
pub(super) fn on(node: &str) -> Placement {
    Placement {
        node: node.into(),
        shard: 1,
        devices: Vec::new(),
        txn: None,
        network_shards: Vec::new(),
        allocations: Vec::new(),
    }
}

fn decide(m: &mut MetaState, txn: TxnId, decision: Decision, at_ms: u64) -> Decision {
    let placements = BTreeMap::from([("default/a/m0".to_string(), on("n1"))]);
    match m.apply(&MetaCommand::Decide {
        txn,
        decision,
        placements,
        reason: "no room".into(),
        at_ms,
        delivered: Vec::new(),
    }) {
        MetaReply::Decided { decision, .. } => decision,
        other => panic!("decide failed: {other:?}"),
    }
}

fn state(m: &MetaState, seq: GroupSeq) -> GroupRecord {
    match m.record(seq) {
        Some(record) => record.clone(),
        None => panic!("no group {seq}"),
    }
}

#[test]
fn the_same_key_yields_the_same_group() {
    let mut m = MetaState::new(2);
    let a = submit(&mut m, "k1", group("g", vec![gang("a", 2, 2, 0, 0)]), 10);
    let reply = m.apply(&MetaCommand::Submit {
        key: "k1".into(),
        group: group("g", vec![gang("a", 2, 2, 0, 0)]),
        at_ms: 20,
        live_max: None,
    });
    match reply {
        MetaReply::Submitted {
            seq,
            created: false,
            summary: Some(summary),
        } => {
            assert_eq!(seq, a);
            assert_eq!(summary.seq, a, "the reply carries the group's status");
        }
        other => panic!("expected the existing group, got {other:?}"),
    }
    match m.query(&MetaQuery::Groups { active_only: false }) {
        MetaReply::Groups { records } => assert_eq!(records.len(), 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_submissions_are_refused_and_store_nothing() {
    let mut m = MetaState::new(2);
    let before = m.clone();
    let reply = m.apply(&MetaCommand::Submit {
        key: String::new(),
        group: group("g", vec![gang("a", 1, 1, 0, 0)]),
        at_ms: 1,
        live_max: None,
    });
    assert!(
        matches!(reply, MetaReply::Rejected { reason, .. } if reason.starts_with("idempotency_key"))
    );
    let reply = m.apply(&MetaCommand::Submit {
        key: "k".into(),
        group: group("g", vec![gang("a", 2, 3, 0, 0)]),
        at_ms: 1,
        live_max: None,
    });
    assert!(
        matches!(reply, MetaReply::Rejected { .. }),
        "minMember > totalNumber: {reply:?}"
    );
    assert_eq!(m, before);
}

#[test]
fn commit_places_and_a_decision_never_changes() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    assert_eq!(decide(&mut m, txn, Decision::Commit, 2), Decision::Commit);
    assert_eq!(state(&m, seq).state, GroupState::Placed);
    assert_eq!(
        decide(&mut m, txn, Decision::Abort, 3),
        Decision::Commit,
        "a later abort cannot undo a commit"
    );
    let reply = m.apply(&MetaCommand::AbortIfUndecided {
        txn,
        at_ms: 4,
        shard: None,
    });
    assert_eq!(
        reply,
        MetaReply::Decided {
            txn,
            decision: Decision::Commit
        }
    );
}

#[test]
fn tombstone_beats_a_late_commit() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    let reply = m.apply(&MetaCommand::AbortIfUndecided {
        txn,
        at_ms: 50,
        shard: None,
    });
    assert_eq!(
        reply,
        MetaReply::Decided {
            txn,
            decision: Decision::Abort
        }
    );
    assert_eq!(decide(&mut m, txn, Decision::Commit, 51), Decision::Abort);
    let r = state(&m, seq);
    assert_eq!(r.state, GroupState::Queued, "requeued after the abort");
    assert_eq!(r.attempts, 1);
    assert_eq!(r.not_before_ms, 50 + retry_backoff_ms(1));
    // An unknown transaction gets a tombstone too, and can then never commit.
    let ghost = TxnId(999);
    assert_eq!(
        m.apply(&MetaCommand::AbortIfUndecided {
            txn: ghost,
            at_ms: 60,
            shard: None,
        }),
        MetaReply::Decided {
            txn: ghost,
            decision: Decision::Abort
        }
    );
    assert_eq!(decide(&mut m, ghost, Decision::Commit, 61), Decision::Abort);
}

#[test]
fn abort_after_wait_time_times_the_group_out() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 1_000, 0)]), 0);
    let txn = begin(&mut m, seq, 500);
    decide(&mut m, txn, Decision::Abort, 1_000);
    assert_eq!(
        state(&m, seq).state,
        GroupState::Done {
            how: Terminal::TimedOut
        }
    );
    let seq2 = submit(
        &mut m,
        "k2",
        group("g2", vec![gang("b", 1, 1, 1_000, 0)]),
        0,
    );
    m.apply(&MetaCommand::Expire {
        seq: seq2,
        at_ms: 999,
    });
    assert_eq!(state(&m, seq2).state, GroupState::Queued, "not yet due");
    m.apply(&MetaCommand::Expire {
        seq: seq2,
        at_ms: 1_000,
    });
    assert_eq!(
        state(&m, seq2).state,
        GroupState::Done {
            how: Terminal::TimedOut
        }
    );
}

#[test]
fn cancel_and_release_pass_through_releasing() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    m.apply(&MetaCommand::Cancel { seq, at_ms: 2 });
    assert_eq!(
        state(&m, seq).state,
        GroupState::Releasing {
            then: Terminal::Cancelled
        }
    );
    assert_eq!(
        decide(&mut m, txn, Decision::Commit, 3),
        Decision::Abort,
        "cancel aborted the open transaction"
    );
    m.apply(&MetaCommand::ReleaseDone { seq, at_ms: 4 });
    assert_eq!(
        state(&m, seq).state,
        GroupState::Done {
            how: Terminal::Cancelled
        }
    );

    let seq = submit(&mut m, "k2", group("g2", vec![gang("a", 1, 1, 0, 0)]), 10);
    let refused = m.apply(&MetaCommand::Release { seq, at_ms: 11 });
    assert!(
        matches!(refused, MetaReply::Rejected { .. }),
        "a queued group cannot be released"
    );
    let txn = begin(&mut m, seq, 12);
    decide(&mut m, txn, Decision::Commit, 13);
    m.apply(&MetaCommand::Release { seq, at_ms: 14 });
    m.apply(&MetaCommand::ReleaseDone { seq, at_ms: 15 });
    assert_eq!(
        state(&m, seq).state,
        GroupState::Done {
            how: Terminal::Released
        }
    );
}

#[test]
fn non_strict_members_accumulate_until_min_member() {
    let mut m = MetaState::new(2);
    let mut g = gang("a", 2, 2, 10_000, 0);
    g.mode = GangMode::NonStrict;
    let seq = submit(&mut m, "k", group("g", vec![g]), 0);
    let place = |m: &mut MetaState, member: &str, at_ms: u64| {
        let txn = begin(m, seq, at_ms);
        let placements = BTreeMap::from([(format!("default/a/{member}"), on("n"))]);
        m.apply(&MetaCommand::Decide {
            txn,
            decision: Decision::Commit,
            placements,
            reason: String::new(),
            at_ms,
            delivered: Vec::new(),
        });
    };
    place(&mut m, "m0", 1);
    let r = state(&m, seq);
    assert_eq!(r.state, GroupState::Queued, "one of two: still waiting");
    assert_eq!(r.placements.len(), 1);
    place(&mut m, "m1", 2);
    assert_eq!(state(&m, seq).state, GroupState::Placed);

    // Timing out with accumulated members releases them first.
    let mut g = gang("b", 2, 2, 100, 0);
    g.mode = GangMode::NonStrict;
    let seq = submit(&mut m, "k2", group("g2", vec![g]), 0);
    let txn = begin(&mut m, seq, 10);
    let placements = BTreeMap::from([("default/b/m0".to_string(), on("n"))]);
    m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements,
        reason: String::new(),
        at_ms: 11,
        delivered: Vec::new(),
    });
    m.apply(&MetaCommand::Expire { seq, at_ms: 100 });
    assert_eq!(
        state(&m, seq).state,
        GroupState::Releasing {
            then: Terminal::TimedOut
        }
    );
}

#[test]
fn pending_work_leaves_out_placed_groups() {
    let mut m = MetaState::new(2);
    let placed = submit(&mut m, "a", group("a", vec![gang("a", 1, 1, 0, 5)]), 0);
    let txn = begin(&mut m, placed, 1);
    decide(&mut m, txn, Decision::Commit, 2);
    let queued = submit(&mut m, "b", group("b", vec![gang("b", 1, 1, 0, 0)]), 3);
    match m.query(&MetaQuery::Pending {
        limit: 1,
        due_at_ms: None,
    }) {
        MetaReply::Groups { records } => {
            assert_eq!(
                records.iter().map(|r| r.seq).collect::<Vec<_>>(),
                vec![queued],
                "a placed group never crowds out queued ones"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn groups_waiting_out_their_backoff_leave_the_window_to_those_behind() {
    let mut m = MetaState::new(2);
    let stuck = submit(&mut m, "a", group("a", vec![gang("a", 1, 1, 0, 0)]), 0);
    let deadline = submit(&mut m, "d", group("d", vec![gang("d", 1, 1, 5, 0)]), 1);
    let behind = submit(&mut m, "b", group("b", vec![gang("b", 1, 1, 0, 0)]), 2);
    for seq in [stuck, deadline] {
        m.apply(&MetaCommand::Requeue {
            seq,
            reason: "fits nowhere".into(),
            at_ms: 3,
            attempts: Some(0),
            retry: Retry::Backoff,
        });
        assert!(state(&m, seq).not_before_ms > 10, "backed off");
    }
    let window =
        |m: &MetaState, limit, due_at_ms| match m.query(&MetaQuery::Pending { limit, due_at_ms }) {
            MetaReply::Groups { records } => records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
    assert_eq!(
        window(&m, 1, None),
        vec![stuck],
        "without a time: queue order"
    );
    assert_eq!(
        window(&m, 1, Some(4)),
        vec![behind],
        "a group waiting out its backoff does not hold the window"
    );
    let expired = state(&m, deadline).deadline_ms.expect("a waitTime");
    assert_eq!(
        window(&m, 2, Some(expired)),
        vec![deadline, behind],
        "one past its deadline is read, to be timed out"
    );
}

#[test]
fn members_are_released_one_by_one_until_the_group_ends() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    decide(&mut m, txn, Decision::Commit, 2);
    let bad = m.apply(&MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/a/zz".into()],
        at_ms: 3,
    });
    assert!(matches!(bad, MetaReply::Rejected { reason, .. } if reason.starts_with("members[0]:")));
    assert_eq!(
        state(&m, seq).state,
        GroupState::Placed,
        "a refused release changes nothing"
    );
    // Phase 1: out of the placements, still held (releasing) with its transaction.
    m.apply(&MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/a/m0".into()],
        at_ms: 4,
    });
    let r = state(&m, seq);
    assert!(r.placements.is_empty());
    assert_eq!(r.releasing["default/a/m0"].txn, Some(txn));
    assert_eq!(
        r.state,
        GroupState::Placed,
        "placed until the shard confirms"
    );
    let pending = match m.query(&MetaQuery::Pending {
        limit: 10,
        due_at_ms: None,
    }) {
        MetaReply::Groups { records } => records.len(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        pending, 1,
        "a member release in flight is the coordinator's work"
    );
    // A retried first phase is accepted and changes nothing.
    let again = m.clone();
    m.apply(&MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/a/m0".into()],
        at_ms: 5,
    });
    assert_eq!(m.record(seq), again.record(seq));
    // Phase 2, twice: the second changes nothing.
    for at_ms in [6, 7] {
        m.apply(&MetaCommand::MembersReleased {
            seq,
            members: vec!["default/a/m0".into()],
            at_ms,
        });
        assert_eq!(
            state(&m, seq).state,
            GroupState::Done {
                how: Terminal::Released
            }
        );
    }
}

#[test]
fn members_of_a_group_not_placed_cannot_be_released() {
    let mut m = MetaState::new(2);
    let mut g = gang("a", 2, 2, 0, 0);
    g.mode = GangMode::NonStrict;
    let seq = submit(&mut m, "k", group("g", vec![g]), 0);
    let txn = begin(&mut m, seq, 1);
    decide(&mut m, txn, Decision::Commit, 2);
    assert_eq!(
        state(&m, seq).state,
        GroupState::Queued,
        "one of two placed"
    );
    let before = m.clone();
    let reply = m.apply(&MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/a/m0".into()],
        at_ms: 3,
    });
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, .. } if reason.contains("Queued, not Placed")),
        "{reply:?}"
    );
    assert_eq!(m, before);
}

#[test]
fn a_commit_that_would_place_a_member_twice_is_recorded_as_abort() {
    let mut m = MetaState::new(2);
    let mut g = gang("a", 2, 2, 0, 0);
    g.mode = GangMode::NonStrict;
    let seq = submit(&mut m, "k", group("g", vec![g]), 0);
    let first = begin(&mut m, seq, 1);
    decide(&mut m, first, Decision::Commit, 2);
    let second = begin(&mut m, seq, 3);
    // The same member again (on another shard): meta refuses to place it twice.
    assert_eq!(decide(&mut m, second, Decision::Commit, 4), Decision::Abort);
    let r = state(&m, seq);
    assert_eq!(r.placements["default/a/m0"].txn, Some(first));
    assert_eq!(r.state, GroupState::Queued);
    match m.query(&MetaQuery::Undelivered { limit: 10 }) {
        MetaReply::Undelivered { txns } => assert!(
            txns.iter()
                .any(|u| u.txn == second && u.decision == Decision::Abort && u.shards == [1, 2]),
            "every participant must hear the abort: {txns:?}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn decisions_are_delivered_until_every_participant_acknowledged() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    let reply = m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements: BTreeMap::new(),
        reason: String::new(),
        at_ms: 2,
        delivered: vec![2],
    });
    assert!(matches!(reply, MetaReply::Decided { .. }));
    let undelivered = |m: &MetaState| match m.query(&MetaQuery::Undelivered { limit: 10 }) {
        MetaReply::Undelivered { txns } => txns,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        undelivered(&m),
        vec![Undelivered {
            txn,
            decision: Decision::Commit,
            shards: vec![1],
            alone: false,
        }]
    );
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1],
    });
    assert!(undelivered(&m).is_empty());
    // A tombstone asked for by shard 2 waits for shard 2's acknowledgement.
    m.apply(&MetaCommand::AbortIfUndecided {
        txn: TxnId(77),
        at_ms: 3,
        shard: Some(2),
    });
    assert_eq!(undelivered(&m)[0].shards, vec![2]);
}

/// What the bug switch `meta-forgets-unacknowledged-decisions` brings back (item 5):
/// a participant that missed COMMIT asks, finds no record, and is told ABORT.
#[test]
fn forgetting_an_unacknowledged_commit_turns_a_late_question_into_abort() {
    let ask = |m: &mut MetaState, txn| match m.apply(&MetaCommand::AbortIfUndecided {
        txn,
        at_ms: 9,
        shard: Some(1),
    }) {
        MetaReply::Decided { decision, .. } => decision,
        other => panic!("{other:?}"),
    };
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements: BTreeMap::new(),
        reason: String::new(),
        at_ms: 2,
        delivered: vec![2],
    });
    let mut bugged = m.clone();
    assert_eq!(ask(&mut m, txn), Decision::Commit);
    bugged.forget_decisions_unacknowledged();
    assert_eq!(ask(&mut bugged, txn), Decision::Abort);
}

#[test]
fn a_retried_requeue_counts_one_attempt() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    for _ in 0..2 {
        m.apply(&MetaCommand::Requeue {
            seq,
            reason: "full".into(),
            at_ms: 1,
            attempts: Some(0),
            retry: Retry::Backoff,
        });
    }
    assert_eq!(state(&m, seq).attempts, 1);
}

#[test]
fn queue_order_is_priority_then_submission() {
    let mut m = MetaState::new(2);
    let low = submit(&mut m, "a", group("a", vec![gang("a", 1, 1, 0, 1)]), 0);
    let high = submit(&mut m, "b", group("b", vec![gang("b", 1, 1, 0, 9)]), 1);
    let low2 = submit(&mut m, "c", group("c", vec![gang("c", 1, 1, 0, 1)]), 2);
    match m.query(&MetaQuery::Groups { active_only: true }) {
        MetaReply::Groups { records } => {
            let order: Vec<_> = records.iter().map(|r| r.seq).collect();
            assert_eq!(order, vec![high, low, low2]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shard_assignment_is_sticky_and_bounded() {
    let mut m = MetaState::new(3);
    let a = MetaCommand::AssignNode {
        node: "n1".into(),
        shard: 2,
        at_ms: 1,
    };
    assert_eq!(m.apply(&a), MetaReply::Shard { shard: 2 });
    let b = MetaCommand::AssignNode {
        node: "n1".into(),
        shard: 3,
        at_ms: 2,
    };
    assert_eq!(m.apply(&b), MetaReply::Shard { shard: 2 });
    let bad = MetaCommand::AssignNode {
        node: "n2".into(),
        shard: 4,
        at_ms: 3,
    };
    assert!(
        matches!(m.apply(&bad), MetaReply::Rejected { reason, .. } if reason.starts_with("shard:"))
    );
}

fn arb_command() -> impl Strategy<Value = MetaCommand> {
    prop_oneof![
        (0u8..6, 1u32..4, 0u64..3_000).prop_map(|(k, n, wait)| MetaCommand::Submit {
            key: format!("k{k}"),
            group: group("g", vec![gang(&format!("g{k}"), n, n, wait, 0)]),
            at_ms: 0,
            live_max: None,
        }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::ReleaseMembers {
            seq,
            members: vec![format!("default/g{}/m0", seq % 6)],
            at_ms,
        }),
        (1u64..10, 1u32..3).prop_map(|(t, shard)| MetaCommand::Delivered {
            txn: TxnId(t),
            shards: vec![shard],
        }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::BeginTxn {
            seq,
            participants: vec![1, 2],
            at_ms
        }),
        (1u64..10, prop::bool::ANY, 0u64..5_000).prop_map(|(t, commit, at_ms)| {
            MetaCommand::Decide {
                txn: TxnId(t),
                decision: if commit {
                    Decision::Commit
                } else {
                    Decision::Abort
                },
                placements: BTreeMap::new(),
                reason: String::new(),
                at_ms,
                delivered: Vec::new(),
            }
        }),
        (1u64..10, 0u64..5_000).prop_map(|(t, at_ms)| MetaCommand::AbortIfUndecided {
            txn: TxnId(t),
            at_ms,
            shard: Some(1),
        }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::Cancel { seq, at_ms }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::Release { seq, at_ms }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::ReleaseDone { seq, at_ms }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::MembersReleased {
            seq,
            members: vec!["default/a/m0".into()],
            at_ms,
        }),
        (1u64..8, 0u64..5_000).prop_map(|(seq, at_ms)| MetaCommand::Expire { seq, at_ms }),
        (1u64..8, 0u64..5_000, any::<bool>()).prop_map(|(seq, at_ms, park)| {
            MetaCommand::Requeue {
                seq,
                reason: "full".into(),
                at_ms,
                attempts: None,
                retry: if park { Retry::Parked } else { Retry::Backoff },
            }
        }),
        (prop::collection::vec(1u64..8, 0..4), 0u64..5_000).prop_map(|(seqs, at_ms)| {
            MetaCommand::Wake {
                which: Woken::Groups(seqs),
                at_ms,
            }
        }),
        (0u64..5_000).prop_map(|at_ms| MetaCommand::Wake {
            which: Woken::AllParked,
            at_ms,
        }),
    ]
}

proptest! {
    /// Same commands, same bytes; a decision never changes; Placing always names an undecided-or-own txn.
    #[test]
    fn deterministic_and_decisions_are_final(cmds in prop::collection::vec(arb_command(), 1..60)) {
        let mut a = MetaState::new(2);
        let mut b = MetaState::new(2);
        let mut decided: BTreeMap<TxnId, Decision> = BTreeMap::new();
        for cmd in &cmds {
            let ra = a.apply(cmd);
            let rb = b.apply(cmd);
            prop_assert_eq!(&ra, &rb);
            if let MetaReply::Decided { txn, decision } = ra {
                if let Some(prev) = decided.insert(txn, decision) {
                    prop_assert_eq!(prev, decision, "decision of {} changed", txn);
                }
            }
            let undelivered: BTreeSet<TxnId> = a
                .txns
                .values()
                .filter(|t| t.decision.is_some() && !t.unacked.is_empty())
                .map(|t| t.txn)
                .collect();
            prop_assert_eq!(&undelivered, &a.undelivered, "the undelivered index drifted");
            for g in a.groups.values() {
                for m in g.releasing.keys() {
                    prop_assert!(!g.placements.contains_key(m), "{} both placed and releasing", m);
                }
                if let GroupState::Placing { txn } = g.state {
                    let t = a.txns.get(&txn);
                    prop_assert!(t.is_some_and(|t| t.decision.is_none()), "Placing group {} with decided txn {}", g.seq, txn);
                }
            }
        }
        prop_assert_eq!(serde_json::to_vec(&a).ok(), serde_json::to_vec(&b).ok());
        let binary = crate::wire::WireFormat::Binary;
        prop_assert_eq!(binary.encode(&a).ok(), binary.encode(&b).ok());
    }

    /// A reader that keeps summaries and re-reads only those whose version moved (the
    /// Kubernetes ingest) sees exactly what a full read sees, after every command: every
    /// change of a summary bumps its version.
    #[test]
    fn summaries_kept_by_version_match_a_full_read(cmds in prop::collection::vec(arb_command(), 1..60)) {
        let mut m = MetaState::new(2);
        let mut kept: BTreeMap<GroupSeq, GroupSummary> = BTreeMap::new();
        for cmd in &cmds {
            m.apply(cmd);
            let MetaReply::Versions { groups: versions } = m.query(&MetaQuery::Versions) else {
                panic!("versions");
            };
            let live: BTreeSet<GroupSeq> = versions.iter().map(|(seq, _)| *seq).collect();
            kept.retain(|seq, _| live.contains(seq));
            let moved: Vec<GroupSeq> = versions
                .iter()
                .filter(|(seq, v)| kept.get(seq).map(|s| s.version) != Some(*v))
                .map(|(seq, _)| *seq)
                .collect();
            let MetaReply::Summaries { groups } = m.query(&MetaQuery::SummariesOf { seqs: moved }) else {
                panic!("summaries");
            };
            for g in groups {
                kept.insert(g.seq, g);
            }
            let MetaReply::Summaries { groups: full } = m.query(&MetaQuery::Summaries { active_only: false }) else {
                panic!("summaries");
            };
            let full: BTreeMap<GroupSeq, GroupSummary> = full.into_iter().map(|g| (g.seq, g)).collect();
            prop_assert_eq!(&kept, &full, "after {:?}", cmd);
        }
    }

    /// A reader that asks only for the groups changed since its stamp, a few at a time
    /// (the Kubernetes ingest), sees exactly what a full read sees, after every command.
    #[test]
    fn summaries_kept_by_change_stamp_match_a_full_read(
        cmds in prop::collection::vec(arb_command(), 1..60),
        limit in 1u32..4,
    ) {
        let mut m = MetaState::new(2);
        let mut reader = StampReader::default();
        for cmd in &cmds {
            m.apply(cmd);
            reader.refresh(&m, limit);
            prop_assert_eq!(&reader.kept, &full_read(&m), "after {:?}", cmd);
        }
    }
}

/// The ingest's way of keeping group summaries: changes since a stamp, and the
/// versions of all groups only when some were forgotten.
#[derive(Default)]
struct StampReader {
    kept: BTreeMap<GroupSeq, GroupSummary>,
    stamp: u64,
    forgotten: u64,
}

impl StampReader {
    fn refresh(&mut self, m: &MetaState, limit: u32) {
        loop {
            let MetaReply::Changed {
                groups,
                stamp,
                more,
                forgotten,
            } = m.query(&MetaQuery::ChangedSince {
                after: self.stamp,
                limit,
            })
            else {
                panic!("changed");
            };
            assert!(groups.len() <= limit as usize);
            if forgotten != self.forgotten {
                let MetaReply::Versions { groups: versions } = m.query(&MetaQuery::Versions) else {
                    panic!("versions");
                };
                let live: BTreeSet<GroupSeq> = versions.iter().map(|(seq, _)| *seq).collect();
                self.kept.retain(|seq, _| live.contains(seq));
                self.forgotten = forgotten;
            }
            for g in groups {
                assert!(g.version > self.stamp && g.version <= stamp);
                self.kept.insert(g.seq, g);
            }
            self.stamp = stamp;
            if !more {
                return;
            }
        }
    }
}

fn full_read(m: &MetaState) -> BTreeMap<GroupSeq, GroupSummary> {
    let MetaReply::Summaries { groups } = m.query(&MetaQuery::Summaries { active_only: false })
    else {
        panic!("summaries");
    };
    groups.into_iter().map(|g| (g.seq, g)).collect()
}

#[test]
fn a_reader_by_change_stamp_drops_the_groups_the_log_forgets() {
    let mut m = MetaState::new(2);
    let mut reader = StampReader::default();
    let mut seqs = Vec::new();
    for i in 0..=crate::ledger::meta::FINISHED_GROUPS_MAX + 10 {
        let seq = submit(
            &mut m,
            &format!("k{i}"),
            group(&format!("g{i}"), vec![gang(&format!("a{i}"), 1, 1, 0, 0)]),
            10,
        );
        seqs.push(seq);
        m.apply(&MetaCommand::Cancel { seq, at_ms: 11 });
        if i == 5 {
            reader.refresh(&m, 1_024);
        }
    }
    reader.refresh(&m, 1_024);
    assert!(reader.forgotten > 0, "nothing was forgotten");
    assert!(
        !reader.kept.contains_key(&seqs[0]),
        "a forgotten group is still kept"
    );
    assert_eq!(reader.kept, full_read(&m));
}

#[test]
fn change_stamps_continue_above_versions_written_per_group() {
    // Data written before stamps were global: a group at version 7, the log's stamp 0.
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 10);
    m.groups.get_mut(&seq).map(|g| g.version = 7);
    m.last_version.set_last(0);
    let mut reader = StampReader::default();
    reader.refresh(&m, 10);
    assert_eq!(reader.stamp, 7);
    m.apply(&MetaCommand::Cancel { seq, at_ms: 11 });
    reader.refresh(&m, 10);
    assert_eq!(reader.kept, full_read(&m));
    assert_eq!(reader.kept[&seq].version, 8);
}

#[test]
fn a_batch_applies_each_command_as_if_alone() {
    let mut alone = MetaState::new(2);
    let a = submit(
        &mut alone,
        "k1",
        group("g1", vec![gang("a", 2, 2, 0, 0)]),
        10,
    );
    let b = submit(
        &mut alone,
        "k2",
        group("g2", vec![gang("b", 2, 2, 0, 0)]),
        10,
    );
    let mut batched = alone.clone();
    let commands = vec![
        MetaCommand::BeginTxn {
            seq: a,
            participants: vec![1],
            at_ms: 20,
        },
        // Not Queued any more: rejected, and the batch goes on.
        MetaCommand::BeginTxn {
            seq: a,
            participants: vec![1],
            at_ms: 20,
        },
        MetaCommand::BeginTxn {
            seq: b,
            participants: vec![2],
            at_ms: 20,
        },
    ];
    let expected: Vec<MetaReply> = commands.iter().map(|c| alone.apply(c)).collect();
    assert!(matches!(expected[1], MetaReply::Rejected { .. }));
    let reply = batched.apply(&MetaCommand::Batch { commands });
    assert_eq!(reply, MetaReply::Batch { replies: expected });
    assert_eq!(batched, alone);
    let nested = batched.apply(&MetaCommand::Batch {
        commands: vec![MetaCommand::Batch { commands: vec![] }],
    });
    assert!(
        matches!(&nested, MetaReply::Batch { replies } if matches!(replies[..], [MetaReply::Rejected { .. }])),
        "{nested:?}"
    );
    assert_eq!(batched, alone);
}

/// Places group `seq` (one member of gang `gang`) on shard 1.
fn place(m: &mut MetaState, seq: GroupSeq, gang: &str, at_ms: u64) -> TxnId {
    let txn = begin(m, seq, at_ms);
    let placements = BTreeMap::from([(format!("default/{gang}/m0"), on("n1"))]);
    let reply = m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements,
        reason: String::new(),
        at_ms,
        delivered: vec![1, 2],
    });
    assert!(matches!(reply, MetaReply::Decided { .. }), "{reply:?}");
    assert_eq!(state(m, seq).state, GroupState::Placed);
    txn
}

/// Issue 51: with more groups than [`FINISHED_GROUPS_MAX`] (every lone pod is a group),
/// no command and no per-round read may visit every group; a restored snapshot builds
/// the group index once.
#[test]
fn commands_and_rounds_on_a_large_state_visit_only_what_they_change() {
    // Placed groups, then more ended ones than are kept, so forgetting runs below.
    let mut m = MetaState::new(2);
    let placed = 3_000;
    for i in 0..placed {
        let seq = submit(
            &mut m,
            &format!("p{i}"),
            group(
                &format!("p{i}"),
                vec![gang(&format!("p{i}"), 1, 1, 0, i % 7)],
            ),
            1,
        );
        place(&mut m, seq, &format!("p{i}"), 2);
    }
    for i in 0..FINISHED_GROUPS_MAX {
        let seq = submit(
            &mut m,
            &format!("e{i}"),
            group(&format!("e{i}"), vec![gang(&format!("e{i}"), 1, 1, 0, 0)]),
            3,
        );
        m.apply(&MetaCommand::Cancel { seq, at_ms: 3 });
    }
    let kept = m.groups.len();
    let stamp = m.last_version.last();
    let visited = m.groups_scanned();

    // One group's whole life: submitted, aborted, retried, placed, released.
    let seq = submit(
        &mut m,
        "x",
        group("x", vec![gang("x", 1, 1, 60_000, 0)]),
        10,
    );
    let txn = begin(&mut m, seq, 11);
    decide(&mut m, txn, Decision::Abort, 12);
    m.apply(&MetaCommand::Requeue {
        seq,
        reason: "no room".into(),
        at_ms: 13,
        attempts: None,
        retry: Retry::Backoff,
    });
    let txn = place(&mut m, seq, "x", 14);
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1, 2],
    });
    m.apply(&MetaCommand::Release { seq, at_ms: 15 });
    m.apply(&MetaCommand::ReleaseDone { seq, at_ms: 16 });
    // Others cancelled and timed out, the last past the bound of ended groups kept.
    for i in 0..3 {
        let seq = submit(
            &mut m,
            &format!("c{i}"),
            group("c", vec![gang("c", 1, 1, 1, 0)]),
            20,
        );
        m.apply(&MetaCommand::Expire { seq, at_ms: 30 });
    }
    let cancelled = submit(&mut m, "c", group("c", vec![gang("c", 1, 1, 0, 0)]), 40);
    m.apply(&MetaCommand::Cancel {
        seq: cancelled,
        at_ms: 41,
    });
    assert!(m.groups.len() < kept, "old ended groups were forgotten");
    // What a coordinator round, a status reader and the sampler read.
    let reads = [
        MetaQuery::Pending {
            limit: 100,
            due_at_ms: Some(50),
        },
        MetaQuery::ChangedSince {
            after: stamp,
            limit: 100,
        },
        MetaQuery::LowestPlacedPriority,
        MetaQuery::StateCounts,
        MetaQuery::Queues,
    ];
    for q in &reads {
        m.query(q);
    }
    assert_eq!(
        m.groups_scanned() - visited,
        0,
        "{kept} groups kept: no command or per-round read may visit them all"
    );
    match m.query(&MetaQuery::LowestPlacedPriority) {
        MetaReply::LowestPriority { priority } => assert_eq!(priority, Some(0)),
        other => panic!("{other:?}"),
    }
    match m.query(&MetaQuery::StateCounts) {
        MetaReply::StateCounts { counts } => {
            assert_eq!(counts["Placed"], placed as u64);
            assert_eq!(counts["Released"], 1);
            assert_eq!(counts["TimedOut"], 3);
        }
        other => panic!("{other:?}"),
    }

    // A restored state builds its index once, when it is restored.
    let bytes = crate::wire::WireFormat::Binary.encode(&m).expect("encodes");
    let mut restored: MetaState = crate::wire::decode(&bytes).expect("decodes");
    restored.index_groups();
    assert_eq!(restored.groups_scanned(), restored.groups.len() as u64);
    for i in 0..100 {
        submit(
            &mut restored,
            &format!("r{i}"),
            group(&format!("r{i}"), vec![gang(&format!("r{i}"), 1, 1, 0, 0)]),
            60,
        );
    }
    restored.query(&reads[0]);
    assert_eq!(
        restored.groups_scanned(),
        restored.groups.len() as u64 - 100
    );
}

#[test]
fn old_finished_groups_are_forgotten_in_bulk() {
    let mut m = MetaState::new(1);
    let mut seqs = Vec::new();
    for i in 0..=FINISHED_GROUPS_MAX {
        let seq = submit(
            &mut m,
            &format!("k{i}"),
            group("g", vec![gang("a", 1, 1, 0, 0)]),
            1,
        );
        m.apply(&MetaCommand::Cancel { seq, at_ms: 2 });
        seqs.push(seq);
    }
    // One over the bound: the oldest tenth is forgotten at once, the newest kept.
    let kept = seqs.iter().filter(|s| m.record(**s).is_some()).count();
    assert_eq!(kept, FINISHED_GROUPS_MAX * 9 / 10);
    assert!(m.record(seqs[0]).is_none());
    assert!(m.record(seqs[FINISHED_GROUPS_MAX]).is_some());
    // A forgotten key is free again: it names a new group.
    let again = submit(&mut m, "k0", group("g", vec![gang("a", 1, 1, 0, 0)]), 3);
    assert!(again > seqs[FINISHED_GROUPS_MAX]);
}

#[test]
fn a_decision_is_kept_while_a_participant_may_still_ask() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 1);
    assert_eq!(decide(&mut m, txn, Decision::Commit, 2), Decision::Commit);
    // Far more decisions than the log keeps come after it; no participant said it
    // applied this one, so a participant that asks later must still find COMMIT.
    for t in 0..(DECIDED_TXNS_MAX as u64 + 10) {
        m.apply(&MetaCommand::AbortIfUndecided {
            txn: TxnId(1_000_000 + t),
            at_ms: 3,
            shard: None,
        });
    }
    match m.query(&MetaQuery::Txn { txn }) {
        MetaReply::Txn { record: Some(r) } => assert_eq!(r.decision, Some(Decision::Commit)),
        other => panic!("{txn} forgotten while unacknowledged: {other:?}"),
    }
}

#[test]
fn a_key_reused_with_another_body_is_refused_naming_the_key() {
    let mut m = MetaState::new(2);
    submit(&mut m, "k1", group("g", vec![gang("a", 2, 2, 0, 0)]), 0);
    let before = m.clone();
    let reply = m.apply(&MetaCommand::Submit {
        key: "k1".into(),
        group: group("g", vec![gang("a", 3, 3, 0, 0)]),
        at_ms: 1,
        live_max: None,
    });
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, kind: RejectionKind::Conflict } if reason.contains("k1") && reason.starts_with("idempotency_key")),
        "{reply:?}"
    );
    assert_eq!(m, before);
}

/// The kind of a refusal, not its words, tells callers which status code to send.
#[test]
fn refusals_say_their_kind() {
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k1", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let kind = |reply: MetaReply| match reply {
        MetaReply::Rejected { kind, .. } => kind,
        other => panic!("not refused: {other:?}"),
    };
    let missing = m.apply(&MetaCommand::Release { seq: 99, at_ms: 1 });
    assert_eq!(kind(missing), RejectionKind::NotFound);
    let queued = m.apply(&MetaCommand::Release { seq, at_ms: 1 });
    assert_eq!(kind(queued), RejectionKind::Refused);
    let empty_key = m.apply(&MetaCommand::Submit {
        key: String::new(),
        group: group("h", vec![gang("b", 1, 1, 0, 0)]),
        at_ms: 1,
        live_max: None,
    });
    assert_eq!(kind(empty_key), RejectionKind::Refused);
    // Refused is the default and is left out of the encoded reply (older replicas).
    let encoded = serde_json::to_string(&rejected("x")).unwrap_or_default();
    assert_eq!(encoded, r#"{"rejected":{"reason":"x"}}"#);
}

#[test]
fn two_live_groups_cannot_declare_the_same_gang() {
    let mut m = MetaState::new(2);
    let first = submit(&mut m, "k1", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let reply = m.apply(&MetaCommand::Submit {
        key: "k2".into(),
        group: group("h", vec![gang("a", 1, 1, 0, 0)]),
        at_ms: 1,
        live_max: None,
    });
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, kind: RejectionKind::Conflict } if reason.contains("default/a") && reason.contains(&first.to_string())),
        "{reply:?}"
    );
    m.apply(&MetaCommand::Cancel {
        seq: first,
        at_ms: 2,
    });
    submit(&mut m, "k3", group("h", vec![gang("a", 1, 1, 0, 0)]), 3);
}

#[test]
fn submitted_pods_are_read_a_page_at_a_time_without_specs() {
    let mut m = MetaState::new(2);
    let mut with_uids = Vec::new();
    for i in 0..7 {
        let mut g = group(&format!("g{i}"), vec![gang(&format!("a{i}"), 2, 2, 0, 0)]);
        // Every third group came from the gRPC API: its members carry no uid.
        if i % 3 != 0 {
            for (j, member) in g.gangs[0].members.iter_mut().enumerate() {
                member.uid = Some(format!("uid-{i}-{j}"));
            }
        }
        let seq = submit(&mut m, &format!("k{i}"), g, 10);
        if i % 3 != 0 {
            with_uids.push(seq);
        }
    }
    m.apply(&MetaCommand::Cancel {
        seq: with_uids[0],
        at_ms: 11,
    });
    let mut read = Vec::new();
    let mut after = 0;
    loop {
        let MetaReply::SubmittedPods { groups, more } =
            m.query(&MetaQuery::SubmittedPods { after, limit: 2 })
        else {
            panic!("submitted pods");
        };
        assert!(groups.len() <= 2);
        for g in groups {
            after = g.seq;
            assert_eq!(g.pods.len(), 2);
            assert!(g.pods.iter().all(|(ns, name, uid)| !ns.is_empty()
                && !name.is_empty()
                && uid.starts_with("uid-")));
            read.push((g.seq, g.cancelled));
        }
        if !more {
            break;
        }
    }
    let expected: Vec<(GroupSeq, bool)> =
        with_uids.iter().map(|s| (*s, *s == with_uids[0])).collect();
    assert_eq!(read, expected);
}

#[test]
fn a_node_agents_allocation_lands_on_its_members_placement_and_goes_with_it() {
    use crate::model::node_allocation::NodeAllocation;
    let mut m = MetaState::new(2);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 0);
    let txn = begin(&mut m, seq, 0);
    assert_eq!(decide(&mut m, txn, Decision::Commit, 0), Decision::Commit);
    let allocation = |device: &str| NodeAllocation {
        resource: "vendor.example/gpu".into(),
        device_ids: vec![device.into()],
        envs: [("VISIBLE".to_string(), device.to_string())].into(),
        ..Default::default()
    };
    let note = |m: &mut MetaState, member: &str, node: &str, a: NodeAllocation| {
        m.apply(&MetaCommand::NoteNodeAllocation {
            member: member.into(),
            node: node.into(),
            allocation: a,
        })
    };
    let version = state(&m, seq).version;
    assert!(matches!(
        note(&mut m, "default/a/m0", "n1", allocation("D0")),
        MetaReply::Group { .. }
    ));
    let placed = state(&m, seq);
    assert_eq!(
        placed.placements["default/a/m0"].allocations,
        [allocation("D0")]
    );
    assert!(placed.version > version, "watchers see the report");
    // The same report again changes nothing; another for the resource replaces it.
    note(&mut m, "default/a/m0", "n1", allocation("D0"));
    assert_eq!(state(&m, seq).version, placed.version);
    note(&mut m, "default/a/m0", "n1", allocation("D1"));
    assert_eq!(
        state(&m, seq).placements["default/a/m0"].allocations,
        [allocation("D1")]
    );
    let elsewhere = note(&mut m, "default/a/m0", "n2", allocation("D0"));
    assert!(
        matches!(&elsewhere, MetaReply::Rejected { kind: RejectionKind::Conflict, reason } if reason.contains("placed on node n1, not n2")),
        "{elsewhere:?}"
    );
    let unknown = note(&mut m, "default/zz/m0", "n1", allocation("D0"));
    assert!(
        matches!(
            &unknown,
            MetaReply::Rejected {
                kind: RejectionKind::NotFound,
                ..
            }
        ),
        "{unknown:?}"
    );
    let empty = note(
        &mut m,
        "default/a/m0",
        "n1",
        NodeAllocation {
            device_ids: Vec::new(),
            ..allocation("D0")
        },
    );
    assert!(
        matches!(&empty, MetaReply::Rejected { reason, .. } if reason.starts_with("allocation.device_ids")),
        "{empty:?}"
    );
    // Once the group has ended, no report lands on it.
    m.apply(&MetaCommand::Release { seq, at_ms: 0 });
    m.apply(&MetaCommand::ReleaseDone { seq, at_ms: 0 });
    let after = note(&mut m, "default/a/m0", "n1", allocation("D0"));
    assert!(
        matches!(&after, MetaReply::Rejected { kind: RejectionKind::Conflict, reason } if reason.contains("has ended (Released)")),
        "{after:?}"
    );
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "meta's group index differs from its groups")]
fn a_change_without_a_stamp_is_caught_by_the_index_check() {
    let mut m = MetaState::new(1);
    let seq = submit(&mut m, "k", group("g", vec![gang("a", 1, 1, 0, 0)]), 1);
    // As a command that forgot to bump the group would leave it.
    if let Some(g) = m.groups.get_mut(&seq) {
        g.state = GroupState::Done {
            how: Terminal::Cancelled,
        };
    }
    submit(&mut m, "other", group("o", vec![gang("o", 1, 1, 0, 0)]), 2);
}
