//! Preemption in the meta group (rule 14): `BeginPreemption` in every state of the
//! preemptor and its victims, the decision settling the victims (COMMIT at once, ABORT
//! only once every participant applied it), the calls a Preempting victim refuses, and
//! a property test of random interleavings against a reference model of the victims'
//! states.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::model::pod::PreemptionPolicy;
use crate::model::{Gang, GangMode};

fn gang(name: &str, members: u32, priority: i32) -> Gang {
    Gang {
        priority,
        ..Gang::with_members("default", name, members, members, GangMode::Strict)
    }
}

fn submit(m: &mut MetaState, name: &str, members: u32, priority: i32) -> GroupSeq {
    let group = GangGroup {
        queue: String::new(),
        id: name.into(),
        gangs: vec![gang(name, members, priority)],
        ..Default::default()
    };
    match m.apply(&MetaCommand::Submit {
        key: name.into(),
        group,
        at_ms: 1,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit failed: {other:?}"),
    }
}

/// Member `i` of gang `name` on shard 1 + i % 2.
fn placements(name: &str, members: u32) -> BTreeMap<String, Placement> {
    (0..members)
        .map(|i| {
            let p = Placement {
                node: format!("n{i}"),
                shard: 1 + i % 2,
                devices: Vec::new(),
                txn: None,
                network_shards: Vec::new(),
                allocations: Vec::new(),
            };
            (format!("default/{name}/m{i}"), p)
        })
        .collect()
}

/// A placed group `name` of `members` at `priority`.
fn placed(m: &mut MetaState, name: &str, members: u32, priority: i32) -> GroupSeq {
    let seq = submit(m, name, members, priority);
    let MetaReply::TxnBegun { txn } = m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1, 2],
        at_ms: 2,
    }) else {
        panic!("begin");
    };
    m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements: placements(name, members),
        reason: String::new(),
        at_ms: 3,
        delivered: vec![1, 2],
    });
    assert_eq!(m.record(seq).map(|r| r.state), Some(GroupState::Placed));
    seq
}

fn preempt(m: &mut MetaState, seq: GroupSeq, victims: Vec<GroupSeq>) -> MetaReply {
    m.apply(&MetaCommand::BeginPreemption {
        seq,
        victims,
        participants: vec![1, 2],
        at_ms: 4,
        reclaim: false,
    })
}

fn begun(reply: MetaReply) -> TxnId {
    match reply {
        MetaReply::TxnBegun { txn } => txn,
        other => panic!("preemption refused: {other:?}"),
    }
}

fn state_of(m: &MetaState, seq: GroupSeq) -> GroupState {
    m.record(seq).map(|r| r.state).expect("group")
}

fn decide(
    m: &mut MetaState,
    txn: TxnId,
    decision: Decision,
    placements: BTreeMap<String, Placement>,
) {
    m.apply(&MetaCommand::Decide {
        txn,
        decision,
        placements,
        reason: "shard 2 refused".into(),
        at_ms: 5,
        delivered: Vec::new(),
    });
}

#[test]
fn commit_places_the_preemptor_and_ends_every_victim_preempted() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 4, 0);
    let low2 = placed(&mut m, "low2", 2, 1);
    let high = submit(&mut m, "high", 4, 10);
    let txn = begun(preempt(&mut m, high, vec![low, low2]));
    assert_eq!(state_of(&m, low), GroupState::Preempting { txn, by: high });
    assert_eq!(state_of(&m, high), GroupState::Placing { txn });
    let pending = m.query(&MetaQuery::Pending {
        limit: 10,
        due_at_ms: None,
    });
    let MetaReply::Groups { records } = pending else {
        panic!("{pending:?}");
    };
    assert_eq!(
        records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![high]
    );

    decide(&mut m, txn, Decision::Commit, placements("high", 4));
    assert_eq!(state_of(&m, high), GroupState::Placed);
    let reason = &m.record(high).expect("preemptor").reason;
    assert_eq!(
        reason,
        &format!("placed by preempting gang groups {low}, {low2} ({txn})")
    );
    for v in [low, low2] {
        let r = m.record(v).expect("victim");
        assert_eq!(
            r.state,
            GroupState::Done {
                how: Terminal::Preempted
            }
        );
        assert!(r.holds_nothing());
        assert!(
            r.reason.contains(&format!("gang group {high}")),
            "{}",
            r.reason
        );
    }
}

#[test]
fn abort_returns_victims_to_placed_only_once_every_participant_applied_it() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 4, 0);
    let high = submit(&mut m, "high", 4, 10);
    let txn = begun(preempt(&mut m, high, vec![low]));
    decide(&mut m, txn, Decision::Abort, BTreeMap::new());
    assert_eq!(state_of(&m, high), GroupState::Queued);
    assert!(
        matches!(state_of(&m, low), GroupState::Preempting { .. }),
        "shards still hold it displaced"
    );
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1],
    });
    assert!(matches!(state_of(&m, low), GroupState::Preempting { .. }));
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![2],
    });
    let r = m.record(low).expect("victim");
    assert_eq!(r.state, GroupState::Placed);
    assert_eq!(r.placements.len(), 4, "its placements were never touched");
}

#[test]
fn a_participant_deadline_and_a_cancel_of_the_preemptor_abort_it_the_same_way() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 4, 0);
    let high = submit(&mut m, "high", 4, 10);
    let txn = begun(preempt(&mut m, high, vec![low]));
    m.apply(&MetaCommand::AbortIfUndecided {
        txn,
        at_ms: 9,
        shard: Some(2),
    });
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1, 2],
    });
    assert_eq!(state_of(&m, low), GroupState::Placed);

    let txn = begun(preempt(&mut m, high, vec![low]));
    m.apply(&MetaCommand::Cancel {
        seq: high,
        at_ms: 9,
    });
    assert!(matches!(state_of(&m, low), GroupState::Preempting { .. }));
    // A late COMMIT cannot land after the cancel's ABORT.
    decide(&mut m, txn, Decision::Commit, placements("high", 4));
    assert!(matches!(state_of(&m, low), GroupState::Preempting { .. }));
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1, 2],
    });
    assert_eq!(state_of(&m, low), GroupState::Placed);
}

#[test]
fn a_preempting_victim_refuses_cancel_release_and_member_release() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 4, 0);
    let high = submit(&mut m, "high", 4, 10);
    begun(preempt(&mut m, high, vec![low]));
    let before = m.clone();
    for cmd in [
        MetaCommand::Cancel { seq: low, at_ms: 6 },
        MetaCommand::Release { seq: low, at_ms: 6 },
        MetaCommand::ReleaseMembers {
            seq: low,
            members: vec!["default/low/m0".into()],
            at_ms: 6,
        },
    ] {
        let reply = m.apply(&cmd);
        assert!(
            matches!(&reply, MetaReply::Rejected { reason, .. } if reason.contains("preempt")),
            "{cmd:?}: {reply:?}"
        );
        assert_eq!(m, before, "{cmd:?} changed nothing");
    }
}

#[test]
fn preemptions_the_rules_forbid_are_refused_and_change_nothing() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 4, 0);
    let equal = placed(&mut m, "equal", 2, 10);
    let queued = submit(&mut m, "queued", 2, 0);
    let high = submit(&mut m, "high", 4, 10);
    let mut kube = gang("kube", 1, 0);
    kube.members[0].uid = Some("uid-1".into());
    let kube_seq = match m.apply(&MetaCommand::Submit {
        key: "kube".into(),
        group: GangGroup {
            queue: String::new(),
            id: "kube".into(),
            gangs: vec![kube],
            ..Default::default()
        },
        at_ms: 1,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("{other:?}"),
    };
    let MetaReply::TxnBegun { txn } = m.apply(&MetaCommand::BeginTxn {
        seq: kube_seq,
        participants: vec![1],
        at_ms: 2,
    }) else {
        panic!("begin");
    };
    decide(
        &mut m,
        txn,
        Decision::Commit,
        BTreeMap::from([(
            "default/kube/m0".to_string(),
            Placement {
                node: "n0".into(),
                shard: 1,
                devices: Vec::new(),
                txn: None,
                network_shards: Vec::new(),
                allocations: Vec::new(),
            },
        )]),
    );
    let before = m.clone();
    let cases: Vec<(GroupSeq, Vec<GroupSeq>, Vec<u32>, &str)> = vec![
        (high, vec![equal], vec![1, 2], "not below"),
        (high, vec![queued], vec![1, 2], "not Placed"),
        (high, vec![], vec![1, 2], "at least one victim"),
        (high, vec![low, low], vec![1, 2], "twice"),
        (high, vec![high], vec![1, 2], "itself"),
        (high, vec![999], vec![1, 2], "no gang group 999"),
        (high, vec![low], vec![1], "shard 2 holds members"),
        (low, vec![queued], vec![1, 2], "only a queued group"),
    ];
    for (seq, victims, participants, words) in cases {
        let reply = m.apply(&MetaCommand::BeginPreemption {
            seq,
            victims: victims.clone(),
            participants,
            at_ms: 4,
            reclaim: false,
        });
        assert!(
            matches!(&reply, MetaReply::Rejected { reason, .. } if reason.contains(words)),
            "{seq} over {victims:?}: {reply:?} should say {words:?}"
        );
        assert_eq!(m, before);
    }
    // A group of Kubernetes pods is a victim like any other: its pods are evicted by
    // the shards' evictors once the preemption commits.
    let reply = m.apply(&MetaCommand::BeginPreemption {
        seq: high,
        victims: vec![kube_seq],
        participants: vec![1, 2],
        at_ms: 4,
        reclaim: false,
    });
    assert!(matches!(reply, MetaReply::TxnBegun { .. }), "{reply:?}");
}

#[test]
fn a_preemptor_with_a_never_member_does_not_preempt() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 2, 0);
    let mut never = gang("never", 2, 10);
    never.members[1].spec.preemption_policy = PreemptionPolicy::Never;
    let MetaReply::Submitted { seq, .. } = m.apply(&MetaCommand::Submit {
        key: "never".into(),
        group: GangGroup {
            queue: String::new(),
            id: "never".into(),
            gangs: vec![never],
            ..Default::default()
        },
        at_ms: 1,
        live_max: None,
    }) else {
        panic!("submit");
    };
    let reply = preempt(&mut m, seq, vec![low]);
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, .. } if reason.contains("preemptionPolicy Never")),
        "{reply:?}"
    );
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    Begin,
    Decide(bool),
    Deadline,
    Deliver(u32),
    CancelPreemptor,
    CancelVictim,
    ReleaseVictim,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Begin),
        any::<bool>().prop_map(Step::Decide),
        Just(Step::Deadline),
        (1u32..3).prop_map(Step::Deliver),
        Just(Step::CancelPreemptor),
        Just(Step::CancelVictim),
        Just(Step::ReleaseVictim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the order of steps: a victim is Preempting exactly while its
    /// preemption is undecided or an ABORT of it is unapplied somewhere; it ends
    /// Preempted exactly when that preemption committed, holding nothing; otherwise it
    /// keeps its placements; and the preemptor is Placed only if every victim is gone.
    #[test]
    fn victims_follow_their_preemptions_decision(steps in prop::collection::vec(step(), 1..24)) {
        let mut m = MetaState::new(2);
        let low = placed(&mut m, "low", 4, 0);
        let high = submit(&mut m, "high", 4, 10);
        let mut current: Option<TxnId> = None;
        for s in &steps {
            match s {
                Step::Begin => {
                    if let MetaReply::TxnBegun { txn } = preempt(&mut m, high, vec![low]) {
                        current = Some(txn);
                    }
                }
                Step::Decide(commit) => if let Some(txn) = current {
                    let d = if *commit { Decision::Commit } else { Decision::Abort };
                    decide(&mut m, txn, d, placements("high", 4));
                },
                Step::Deadline => if let Some(txn) = current {
                    m.apply(&MetaCommand::AbortIfUndecided { txn, at_ms: 9, shard: Some(1) });
                },
                Step::Deliver(shard) => if let Some(txn) = current {
                    m.apply(&MetaCommand::Delivered { txn, shards: vec![*shard] });
                },
                Step::CancelPreemptor => { m.apply(&MetaCommand::Cancel { seq: high, at_ms: 9 }); }
                Step::CancelVictim => { m.apply(&MetaCommand::Cancel { seq: low, at_ms: 9 }); }
                Step::ReleaseVictim => { m.apply(&MetaCommand::Release { seq: low, at_ms: 9 }); }
            }
            let victim = m.record(low).expect("victim").clone();
            let record = current.and_then(|t| m.txns.get(&t).cloned());
            let unsettled = record.as_ref().is_some_and(|t| match t.decision {
                None => true,
                Some(Decision::Abort) => !t.unacked.is_empty(),
                Some(Decision::Commit) => false,
            });
            let committed = record.as_ref().is_some_and(|t| t.decision == Some(Decision::Commit));
            match victim.state {
                GroupState::Preempting { txn, by } => {
                    prop_assert_eq!(Some(txn), current);
                    prop_assert_eq!(by, high);
                    prop_assert!(unsettled, "Preempting with {:?}", record);
                }
                GroupState::Done { how: Terminal::Preempted } => {
                    prop_assert!(committed);
                    prop_assert!(victim.holds_nothing());
                }
                _ => {
                    prop_assert!(!unsettled && !committed, "{:?} with {:?}", victim.state, record);
                    if matches!(victim.state, GroupState::Placed) {
                        prop_assert_eq!(victim.placements.len(), 4);
                    }
                }
            }
            if state_of(&m, high) == GroupState::Placed {
                prop_assert_eq!(victim.state, GroupState::Done { how: Terminal::Preempted });
            }
        }
    }
}

/// Submits a group declaring gang `name` under a new key: the reply.
fn declare_again(m: &mut MetaState, name: &str, key: &str) -> MetaReply {
    m.apply(&MetaCommand::Submit {
        key: key.into(),
        group: GangGroup {
            queue: String::new(),
            id: key.into(),
            gangs: vec![gang(name, 4, 0)],
            ..Default::default()
        },
        at_ms: 6,
        live_max: None,
    })
}

/// A victim's gang stays its own while its preemption is undecided (it may still be
/// put back by an ABORT) and is free from the COMMIT that ends it Preempted; with the
/// bug switch, a Placed group's gang is taken as free.
#[test]
fn a_victims_gang_is_declared_again_only_once_the_preemption_committed() {
    let mut m = MetaState::new(2);
    let low = placed(&mut m, "low", 4, 0);
    let high = submit(&mut m, "high", 4, 10);
    assert!(matches!(
        declare_again(&mut m, "low", "twin-placed"),
        MetaReply::Rejected {
            kind: RejectionKind::Conflict,
            ..
        }
    ));
    let txn = begun(preempt(&mut m, high, vec![low]));
    assert!(matches!(state_of(&m, low), GroupState::Preempting { .. }));
    assert!(matches!(
        declare_again(&mut m, "low", "twin-preempting"),
        MetaReply::Rejected {
            kind: RejectionKind::Conflict,
            ..
        }
    ));
    decide(&mut m, txn, Decision::Commit, placements("high", 4));
    assert!(state_of(&m, low).is_terminal());
    assert!(matches!(
        declare_again(&mut m, "low", "twin-preempted"),
        MetaReply::Submitted { created: true, .. }
    ));

    let mut bugged = MetaState::new(2);
    bugged.set_twins_of_placed_admitted(true);
    placed(&mut bugged, "low", 4, 0);
    assert!(matches!(
        declare_again(&mut bugged, "low", "twin"),
        MetaReply::Submitted { created: true, .. }
    ));
}

/// A placed group `name` charged to `queue`, of `owner`, at `priority`.
fn placed_in(m: &mut MetaState, queue: &str, name: &str, priority: i32) -> GroupSeq {
    let group = GangGroup {
        id: name.into(),
        gangs: vec![gang(name, 2, priority)],
        queue: queue.into(),
        ..Default::default()
    };
    let seq = match m.apply(&MetaCommand::Submit {
        key: name.into(),
        group,
        at_ms: 1,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit: {other:?}"),
    };
    let MetaReply::TxnBegun { txn } = m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1, 2],
        at_ms: 2,
    }) else {
        panic!("begin");
    };
    decide(m, txn, Decision::Commit, placements(name, 2));
    seq
}

/// A preemptor bounded to queue `within` (`Some("")`: to none) submitted by a tenant.
fn bounded(m: &mut MetaState, queue: &str, name: &str, within: Option<&str>) -> GroupSeq {
    let group = GangGroup {
        id: name.into(),
        gangs: vec![gang(name, 2, 50)],
        queue: queue.into(),
        owner: "team-a".into(),
        preempts_within: within.map(String::from),
        run_limit_ms: None,
    };
    match m.apply(&MetaCommand::Submit {
        key: name.into(),
        group,
        at_ms: 3,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit: {other:?}"),
    }
}

/// By priority, a bounded preemptor displaces only groups of its queue's subtree; an
/// empty boundary admits none; administrators' groups have no boundary.
#[test]
fn a_preemptors_boundary_holds_its_victims_to_its_queue_subtree() {
    let mut m = MetaState::new(2);
    for (name, parent) in [("team-a", ""), ("team-a-dev", "team-a"), ("team-b", "")] {
        m.apply(&MetaCommand::PutQueue {
            queue: crate::model::QueueSpec {
                name: name.into(),
                parent: parent.into(),
                weight: 1,
                ..Default::default()
            },
        });
    }
    let other = placed_in(&mut m, "team-b", "other", 0);
    let own = placed_in(&mut m, "team-a-dev", "own", 0);
    let unqueued = placed_in(&mut m, "", "unqueued", 0);
    let a = bounded(&mut m, "team-a", "urgent", Some("team-a"));
    for victim in [other, unqueued] {
        let refused = preempt(&mut m, a, vec![victim]);
        assert!(
            matches!(&refused, MetaReply::Rejected { reason, .. } if reason.contains("outside the preemptor's boundary")),
            "{refused:?}"
        );
        assert_eq!(
            state_of(&m, victim),
            GroupState::Placed,
            "a refusal changes nothing"
        );
    }
    let txn = begun(preempt(&mut m, a, vec![own]));
    decide(&mut m, txn, Decision::Commit, placements("urgent", 2));
    assert!(state_of(&m, own).is_terminal(), "inside the subtree");

    let none = bounded(&mut m, "", "nowhere", Some(""));
    assert!(matches!(
        preempt(&mut m, none, vec![other]),
        MetaReply::Rejected { .. }
    ));
    let admin = submit(&mut m, "admin-urgent", 2, 50);
    let txn = begun(preempt(&mut m, admin, vec![other]));
    decide(&mut m, txn, Decision::Commit, placements("admin-urgent", 2));
    assert!(
        state_of(&m, other).is_terminal(),
        "an administrator's group has no boundary"
    );
}

/// Keys are per owner, and an owner's live groups are bounded in apply: a group that
/// ends frees its place.
#[test]
fn keys_are_per_owner_and_live_groups_are_bounded() {
    let mut m = MetaState::new(2);
    let of = |owner: &str, name: &str| GangGroup {
        id: name.into(),
        gangs: vec![gang(name, 1, 0)],
        owner: owner.into(),
        ..Default::default()
    };
    let submit = |m: &mut MetaState, owner: &str, name: &str, key: &str| {
        m.apply(&MetaCommand::Submit {
            key: key.into(),
            group: of(owner, name),
            at_ms: 1,
            live_max: Some(2),
        })
    };
    let seq = |r: MetaReply| match r {
        MetaReply::Submitted { seq, created, .. } => (seq, created),
        other => panic!("{other:?}"),
    };
    let (a1, new) = seq(submit(&mut m, "team-a", "a1", "k"));
    assert!(new);
    let (b1, new) = seq(submit(&mut m, "team-b", "b1", "k"));
    assert!(
        new && b1 != a1,
        "the same key of another owner is another group"
    );
    assert_eq!(
        seq(submit(&mut m, "team-a", "a1", "k")),
        (a1, false),
        "a retry"
    );
    seq(submit(&mut m, "team-a", "a2", "k2"));
    let full = submit(&mut m, "team-a", "a3", "k3");
    assert!(
        matches!(&full, MetaReply::Rejected { kind: RejectionKind::Exhausted, reason } if reason.contains("team-a has 2")),
        "{full:?}"
    );
    assert_eq!(
        m.query(&MetaQuery::Owned {
            owner: "team-a".into(),
            key: "k".into()
        }),
        MetaReply::Owned {
            live: 2,
            has_key: true
        }
    );
    m.apply(&MetaCommand::Cancel { seq: a1, at_ms: 2 });
    assert!(
        seq(submit(&mut m, "team-a", "a3", "k3")).1,
        "a group that ended frees its place"
    );
}
