//! Queues in the meta group: a group is charged when its transaction begins, keeps the
//! charge for what it holds, and gives it back when it aborts or ends; a queue (or an
//! ancestor) without room refuses the transaction (I8). Unit tests walk each command in
//! each state; a property test checks I8 and the kept usage after every command of
//! random sequences, and finds the bug switch that charges without asking.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::*;
use crate::model::queue::Limits;
use crate::model::{Gang, GangMode, ResourceName};

fn limits(cores: Option<u64>, pods: Option<u64>) -> Limits {
    let mut l = Limits::none();
    if let Some(c) = cores {
        l.set(&ResourceName::Cpu, c * 1_000);
    }
    if let Some(p) = pods {
        l.set(&ResourceName::Pods, p);
    }
    l
}

fn queue(name: &str, parent: &str, max_cores: Option<u64>) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        parent: parent.into(),
        weight: 1,
        min: Limits::none(),
        max: limits(max_cores, None),
        lend: crate::model::queue::Limits::none(),
        managed_by: String::new(),
        namespaces: Vec::new(),
    }
}

fn put(m: &mut MetaState, q: QueueSpec) {
    match m.apply(&MetaCommand::PutQueue { queue: q }) {
        MetaReply::Queues { .. } => {}
        other => panic!("put queue: {other:?}"),
    }
}

/// A group of `members` one-core members (NonStrict with `min` below `members`).
fn group_in(queue: &str, name: &str, members: u32, min: u32) -> GangGroup {
    let mode = if min < members {
        GangMode::NonStrict
    } else {
        GangMode::Strict
    };
    let mut gang = Gang::with_members("default", name, members, min, mode);
    for m in &mut gang.members {
        m.spec.requests.cpu_milli = 1_000;
    }
    GangGroup {
        id: name.into(),
        gangs: vec![gang],
        queue: queue.into(),
        ..Default::default()
    }
}

fn submit(m: &mut MetaState, g: GangGroup) -> GroupSeq {
    let key = format!("key-{}", g.id);
    match m.apply(&MetaCommand::Submit {
        key,
        group: g,
        at_ms: 0,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit: {other:?}"),
    }
}

fn begin(m: &mut MetaState, seq: GroupSeq) -> MetaReply {
    m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1],
        at_ms: 0,
    })
}

fn placed(name: &str, members: &[u32]) -> BTreeMap<String, Placement> {
    members
        .iter()
        .map(|i| (format!("default/{name}/m{i}"), super::tests::on("n1")))
        .collect()
}

fn decide(
    m: &mut MetaState,
    txn: TxnId,
    decision: Decision,
    placements: BTreeMap<String, Placement>,
) {
    let reply = m.apply(&MetaCommand::Decide {
        txn,
        decision,
        placements,
        reason: "test".into(),
        at_ms: 0,
        delivered: vec![1],
    });
    assert!(matches!(reply, MetaReply::Decided { .. }), "{reply:?}");
}

fn txn_of(reply: MetaReply) -> TxnId {
    match reply {
        MetaReply::TxnBegun { txn } => txn,
        other => panic!("begin: {other:?}"),
    }
}

fn cores(m: &MetaState, queue: &str) -> u64 {
    m.queues.usage(queue).get(&ResourceName::Cpu) / 1_000
}

fn consistent(m: &MetaState) {
    assert_eq!(m.quota_violation(), None);
}

#[test]
fn a_group_is_charged_from_its_begin_and_refunded_by_abort_and_release() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("team", "", Some(4)));
    let seq = submit(&mut m, group_in("team", "a", 2, 2));
    assert_eq!(cores(&m, "team"), 0, "a queued group holds nothing");
    let txn = txn_of(begin(&mut m, seq));
    assert_eq!(
        cores(&m, "team"),
        2,
        "charged in the entry that lets reservations begin"
    );
    assert_eq!(m.queues.usage("team").get(&ResourceName::Pods), 2);
    decide(&mut m, txn, Decision::Abort, BTreeMap::new());
    assert_eq!(cores(&m, "team"), 0, "an abort gives it back");
    consistent(&m);
    let later = m.record(seq).map(|r| r.not_before_ms).unwrap_or_default();
    let txn = txn_of(m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1],
        at_ms: later,
    }));
    decide(&mut m, txn, Decision::Commit, placed("a", &[0, 1]));
    assert_eq!(cores(&m, "team"), 2, "placed: kept");
    m.apply(&MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/a/m0".into()],
        at_ms: 0,
    });
    assert_eq!(
        cores(&m, "team"),
        2,
        "a member being released still holds its node"
    );
    m.apply(&MetaCommand::MembersReleased {
        seq,
        members: vec!["default/a/m0".into()],
        at_ms: 0,
    });
    assert_eq!(cores(&m, "team"), 1);
    m.apply(&MetaCommand::Release { seq, at_ms: 0 });
    assert_eq!(
        cores(&m, "team"),
        1,
        "releasing: held until the shards free it"
    );
    m.apply(&MetaCommand::ReleaseDone { seq, at_ms: 0 });
    assert_eq!(cores(&m, "team"), 0);
    consistent(&m);
}

#[test]
fn a_queue_without_room_refuses_the_transaction_and_names_itself() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("team", "", Some(3)));
    let a = submit(&mut m, group_in("team", "a", 2, 2));
    let b = submit(&mut m, group_in("team", "b", 2, 2));
    let txn = txn_of(begin(&mut m, a));
    decide(&mut m, txn, Decision::Commit, placed("a", &[0, 1]));
    let MetaReply::QuotaRefusals { refusals } =
        m.query(&MetaQuery::QuotaRefusals { seqs: vec![a, b] })
    else {
        panic!("refusals");
    };
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].0, b);
    assert_eq!(
        refusals[0].1,
        "queue team has no room: cpu 2 asked, 2 used of max 3"
    );
    let before = m.clone();
    let reply = begin(&mut m, b);
    assert!(
        matches!(&reply, MetaReply::Rejected { kind: RejectionKind::NoRoom, reason } if reason.starts_with("queue team has no room")),
        "{reply:?}"
    );
    assert_eq!(m, before, "a refusal changes nothing");
    m.apply(&MetaCommand::Release { seq: a, at_ms: 0 });
    m.apply(&MetaCommand::ReleaseDone { seq: a, at_ms: 0 });
    txn_of(begin(&mut m, b));
    assert_eq!(cores(&m, "team"), 2);
    consistent(&m);
}

#[test]
fn a_nonstrict_group_keeps_only_the_charge_of_what_it_holds() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("team", "", Some(3)));
    let seq = submit(&mut m, group_in("team", "a", 3, 1));
    let txn = txn_of(begin(&mut m, seq));
    assert_eq!(
        cores(&m, "team"),
        3,
        "every member while its transaction runs"
    );
    decide(&mut m, txn, Decision::Commit, placed("a", &[0]));
    assert_eq!(cores(&m, "team"), 1, "the members left out are given back");
    consistent(&m);
}

#[test]
fn a_child_borrows_up_to_its_ancestors_max_and_no_further() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("org", "", Some(4)));
    put(&mut m, queue("a", "org", None));
    put(&mut m, queue("b", "org", Some(2)));
    let a1 = submit(&mut m, group_in("a", "a1", 3, 3));
    let txn = txn_of(begin(&mut m, a1));
    decide(&mut m, txn, Decision::Commit, placed("a1", &[0, 1, 2]));
    assert_eq!(cores(&m, "org"), 3);
    let b1 = submit(&mut m, group_in("b", "b1", 2, 2));
    let reply = begin(&mut m, b1);
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, .. } if reason.starts_with("queue b's ancestor org has no room: cpu 2 asked, 3 used of max 4")),
        "{reply:?}"
    );
    let b2 = submit(&mut m, group_in("b", "b2", 1, 1));
    txn_of(begin(&mut m, b2));
    assert_eq!(cores(&m, "org"), 4);
    consistent(&m);
}

#[test]
fn submissions_name_existing_queues_and_a_key_keeps_its_queue() {
    let mut m = MetaState::new(1);
    let reply = m.apply(&MetaCommand::Submit {
        key: "k".into(),
        group: group_in("nowhere", "a", 1, 1),
        at_ms: 0,
        live_max: None,
    });
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, .. } if reason.starts_with("queue: no queue nowhere")),
        "{reply:?}"
    );
    put(&mut m, queue("x", "", None));
    put(&mut m, queue("y", "", None));
    let first = m.apply(&MetaCommand::Submit {
        key: "k".into(),
        group: group_in("x", "a", 1, 1),
        at_ms: 0,
        live_max: None,
    });
    assert!(matches!(first, MetaReply::Submitted { created: true, .. }));
    let other = m.apply(&MetaCommand::Submit {
        key: "k".into(),
        group: group_in("y", "a", 1, 1),
        at_ms: 0,
        live_max: None,
    });
    assert!(
        matches!(
            &other,
            MetaReply::Rejected {
                kind: RejectionKind::Conflict,
                ..
            }
        ),
        "another queue under the same key is another body: {other:?}"
    );
    let bad = m.apply(&MetaCommand::Submit {
        key: "k2".into(),
        group: group_in("Not_A_Label", "b", 1, 1),
        at_ms: 0,
        live_max: None,
    });
    assert!(
        matches!(&bad, MetaReply::Rejected { reason, .. } if reason.starts_with("queue:")),
        "{bad:?}"
    );
}

#[test]
fn queues_in_use_are_neither_deleted_nor_shrunk_below_their_usage() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("team", "", Some(4)));
    let seq = submit(&mut m, group_in("team", "a", 2, 2));
    let reply = m.apply(&MetaCommand::DeleteQueue {
        name: "team".into(),
        managed_by: String::new(),
    });
    assert!(
        matches!(&reply, MetaReply::Rejected { kind: RejectionKind::Conflict, reason } if reason.contains("1 gang groups")),
        "{reply:?}"
    );
    txn_of(begin(&mut m, seq));
    let shrink = m.apply(&MetaCommand::PutQueue {
        queue: queue("team", "", Some(1)),
    });
    assert!(
        matches!(&shrink, MetaReply::Rejected { reason, .. } if reason.starts_with("queue.max.cpu: 1 is below")),
        "{shrink:?}"
    );
    let unknown = m.apply(&MetaCommand::DeleteQueue {
        name: "other".into(),
        managed_by: String::new(),
    });
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
    m.apply(&MetaCommand::Cancel { seq, at_ms: 0 });
    m.apply(&MetaCommand::ReleaseDone { seq, at_ms: 0 });
    assert_eq!(
        m.apply(&MetaCommand::DeleteQueue {
            name: "team".into(),
            managed_by: String::new(),
        }),
        MetaReply::Queues { queues: Vec::new() }
    );
    consistent(&m);
}

#[test]
fn a_full_queue_does_not_hide_other_queues_groups_from_a_round() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("full", "", Some(1)));
    put(&mut m, queue("free", "", None));
    let holder = submit(&mut m, group_in("full", "holder", 1, 1));
    txn_of(begin(&mut m, holder));
    for i in 0..5 {
        submit(&mut m, group_in("full", &format!("w{i}"), 1, 1));
    }
    let free = submit(&mut m, group_in("free", "f", 1, 1));
    let MetaReply::Groups { records } = m.query(&MetaQuery::Pending {
        limit: 2,
        due_at_ms: None,
    }) else {
        panic!("pending");
    };
    let seqs: Vec<GroupSeq> = records.iter().map(|r| r.seq).collect();
    assert!(
        seqs.contains(&free),
        "the free queue's group is listed: {seqs:?}"
    );
    assert!(seqs.contains(&holder), "{seqs:?}");
    assert!(
        seqs.len() <= 4,
        "at most `limit` waiting ones beside: {seqs:?}"
    );
}

#[test]
fn a_waiting_note_changes_the_reason_only() {
    let mut m = MetaState::new(1);
    put(&mut m, queue("team", "", Some(1)));
    let seq = submit(&mut m, group_in("team", "a", 2, 2));
    let before = m.record(seq).cloned().expect("group");
    m.apply(&MetaCommand::NoteWaiting {
        seq,
        reason: "queue team has no room".into(),
    });
    let after = m.record(seq).cloned().expect("group");
    assert_eq!(after.reason, "queue team has no room");
    assert_eq!(
        (after.attempts, after.not_before_ms),
        (before.attempts, before.not_before_ms)
    );
    assert!(
        after.version > before.version,
        "watchers see the new reason"
    );
}

/// One step of the random sequences: a command over three queues (`org` with children
/// `a` and `b`) and six groups of one to three one-core members.
#[derive(Debug, Clone)]
enum Step {
    Begin(u8),
    Commit(u8, u8),
    Abort(u8),
    Cancel(u8),
    Release(u8),
    ReleaseDone(u8),
    ReleaseMember(u8, u8),
    MemberReleased(u8, u8),
    Expire(u8),
    Resize(u8, u8),
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..6).prop_map(Step::Begin),
        3 => (0u8..6, 1u8..8).prop_map(|(g, mask)| Step::Commit(g, mask)),
        1 => (0u8..6).prop_map(Step::Abort),
        1 => (0u8..6).prop_map(Step::Cancel),
        1 => (0u8..6).prop_map(Step::Release),
        2 => (0u8..6).prop_map(Step::ReleaseDone),
        1 => (0u8..6, 0u8..3).prop_map(|(g, i)| Step::ReleaseMember(g, i)),
        1 => (0u8..6, 0u8..3).prop_map(|(g, i)| Step::MemberReleased(g, i)),
        1 => (0u8..6).prop_map(Step::Expire),
        1 => (0u8..3, 1u8..7).prop_map(|(q, c)| Step::Resize(q, c)),
    ]
}

const QUEUE_NAMES: [&str; 3] = ["org", "a", "b"];

fn world() -> (MetaState, Vec<GroupSeq>) {
    let mut m = MetaState::new(1);
    put(&mut m, queue("org", "", Some(5)));
    put(&mut m, queue("a", "org", Some(4)));
    put(&mut m, queue("b", "org", None));
    let seqs = (0..6u8)
        .map(|i| {
            let q = if i % 2 == 0 { "a" } else { "b" };
            let members = u32::from(i % 3) + 1;
            let min = if i == 5 { 1 } else { members };
            let mut g = group_in(q, &format!("g{i}"), members, min);
            g.gangs[0].wait_time_ms = 1_000;
            submit(&mut m, g)
        })
        .collect();
    (m, seqs)
}

fn apply_step(m: &mut MetaState, seqs: &[GroupSeq], step: &Step) {
    let seq = |g: u8| seqs[usize::from(g) % seqs.len()];
    let name = |g: u8| format!("g{}", usize::from(g) % seqs.len());
    let txn = |m: &MetaState, g: u8| m.record(seq(g)).and_then(|r| r.txn);
    let cmd = match step {
        Step::Begin(g) => MetaCommand::BeginTxn {
            seq: seq(*g),
            participants: vec![1],
            at_ms: 500,
        },
        Step::Commit(g, mask) => {
            let Some(t) = txn(m, *g) else { return };
            let members: Vec<u32> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
            MetaCommand::Decide {
                txn: t,
                decision: Decision::Commit,
                placements: placed(&name(*g), &members),
                reason: String::new(),
                at_ms: 500,
                delivered: vec![1],
            }
        }
        Step::Abort(g) => {
            let Some(t) = txn(m, *g) else { return };
            MetaCommand::Decide {
                txn: t,
                decision: Decision::Abort,
                placements: BTreeMap::new(),
                reason: "no".into(),
                at_ms: 500,
                delivered: vec![1],
            }
        }
        Step::Cancel(g) => MetaCommand::Cancel {
            seq: seq(*g),
            at_ms: 500,
        },
        Step::Release(g) => MetaCommand::Release {
            seq: seq(*g),
            at_ms: 500,
        },
        Step::ReleaseDone(g) => MetaCommand::ReleaseDone {
            seq: seq(*g),
            at_ms: 500,
        },
        Step::ReleaseMember(g, i) => MetaCommand::ReleaseMembers {
            seq: seq(*g),
            members: vec![format!("default/{}/m{i}", name(*g))],
            at_ms: 500,
        },
        Step::MemberReleased(g, i) => MetaCommand::MembersReleased {
            seq: seq(*g),
            members: vec![format!("default/{}/m{i}", name(*g))],
            at_ms: 500,
        },
        Step::Expire(g) => MetaCommand::Expire {
            seq: seq(*g),
            at_ms: 2_000,
        },
        Step::Resize(q, c) => {
            let name = QUEUE_NAMES[usize::from(*q) % QUEUE_NAMES.len()];
            let parent = if name == "org" { "" } else { "org" };
            MetaCommand::PutQueue {
                queue: queue(name, parent, Some(u64::from(*c))),
            }
        }
    };
    m.apply(&cmd);
}

/// The first step after which the accounting is inconsistent or a queue passes its max.
fn first_violation(steps: &[Step], unchecked: bool) -> Option<String> {
    let (mut m, seqs) = world();
    m.set_quota_unchecked(unchecked);
    for (i, step) in steps.iter().enumerate() {
        apply_step(&mut m, &seqs, step);
        if let Some(why) = m.quota_violation() {
            return Some(format!("after step {i} ({step:?}): {why}"));
        }
    }
    None
}

proptest! {
    /// I8 after every command of any sequence: every group is charged what its state is
    /// due, each queue's usage is its subtree's charges, and none passes its max.
    #[test]
    fn no_queue_ever_passes_its_max_and_usage_is_the_sum_of_charges(
        steps in prop::collection::vec(arb_step(), 1..60)
    ) {
        prop_assert_eq!(first_violation(&steps, false), None);
    }
}

#[test]
fn the_check_finds_a_meta_group_that_charges_without_asking() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = prop::collection::vec(arb_step(), 1..60);
    for _ in 0..2_000 {
        let steps = strategy
            .new_tree(&mut runner)
            .map(|t| t.current())
            .unwrap_or_default();
        if let Some(why) = first_violation(&steps, true) {
            assert!(why.contains("I8"), "{why}");
            return;
        }
    }
    panic!("2,000 random sequences with the bug switch on passed the I8 check");
}

fn guaranteed(name: &str, min_cores: u64, max_cores: u64) -> QueueSpec {
    QueueSpec {
        min: limits(Some(min_cores), None),
        ..queue(name, "", Some(max_cores))
    }
}

fn placed_group(m: &mut MetaState, queue: &str, name: &str, members: u32) -> GroupSeq {
    let seq = submit(m, group_in(queue, name, members, members));
    let txn = txn_of(begin(m, seq));
    let all: Vec<u32> = (0..members).collect();
    decide(m, txn, Decision::Commit, placed(name, &all));
    seq
}

#[test]
fn a_queue_below_its_min_reclaims_the_youngest_borrowed_groups_and_nothing_of_a_guarantee() {
    let mut m = MetaState::new(1);
    put(&mut m, guaranteed("a", 4, 8));
    put(&mut m, guaranteed("b", 4, 8));
    let a1 = placed_group(&mut m, "a", "a1", 2);
    let a2 = placed_group(&mut m, "a", "a2", 2);
    let a3 = placed_group(&mut m, "a", "a3", 2);
    let a4 = placed_group(&mut m, "a", "a4", 2);
    assert_eq!(cores(&m, "a"), 8, "a borrowed 4 above its min");
    let b1 = submit(&mut m, group_in("b", "b1", 2, 2));
    assert_eq!(
        m.reclaimable(b1),
        Ok(vec![a4, a3]),
        "youngest first, stopping at a's min (a2 and a1 are its guarantee)"
    );
    let too_big = submit(&mut m, group_in("b", "b-big", 5, 5));
    let why = m.reclaimable(too_big).expect_err("past b's min");
    assert!(why.contains("would be 5 of min 4"), "{why}");
    let own = submit(&mut m, group_in("a", "a5", 1, 1));
    assert_eq!(
        m.reclaimable(own).map(|v| v.is_empty()),
        Err("queue a: cpu would be 9 of min 4; reclaim takes back only what min guarantees".into())
    );

    let inside = m.apply(&MetaCommand::BeginPreemption {
        seq: b1,
        victims: vec![a2],
        participants: vec![1],
        at_ms: 0,
        reclaim: true,
    });
    assert!(
        matches!(&inside, MetaReply::Rejected { reason, .. } if reason.starts_with("victims[0]: gang group 2 is not among what queue b may reclaim")),
        "{inside:?}"
    );
    let txn = txn_of(m.apply(&MetaCommand::BeginPreemption {
        seq: b1,
        victims: vec![a4],
        participants: vec![1],
        at_ms: 0,
        reclaim: true,
    }));
    assert_eq!(cores(&m, "b"), 2);
    assert_eq!(cores(&m, "a"), 8, "a victim is charged until the decision");
    decide(&mut m, txn, Decision::Commit, placed("b1", &[0, 1]));
    assert_eq!(cores(&m, "a"), 6);
    assert_eq!(
        m.record(a4).map(|r| r.state),
        Some(GroupState::Done {
            how: Terminal::Preempted
        })
    );
    assert!(m.record(a1).is_some_and(|r| r.state == GroupState::Placed));
    assert!(m.record(a3).is_some_and(|r| r.state == GroupState::Placed));
    consistent(&m);
}

#[test]
fn without_reclaim_grounds_priority_rules_still_apply() {
    let mut m = MetaState::new(1);
    put(&mut m, guaranteed("a", 0, 8));
    put(&mut m, guaranteed("b", 4, 8));
    let a1 = placed_group(&mut m, "a", "a1", 2);
    let b1 = submit(&mut m, group_in("b", "b1", 2, 2));
    assert_eq!(
        m.reclaimable(b1),
        Ok(vec![a1]),
        "a has no min: all it holds is borrowed"
    );
    let by_priority = m.apply(&MetaCommand::BeginPreemption {
        seq: b1,
        victims: vec![a1],
        participants: vec![1],
        at_ms: 0,
        reclaim: false,
    });
    assert!(
        matches!(&by_priority, MetaReply::Rejected { reason, .. } if reason.contains("not below the preemptor's")),
        "{by_priority:?}"
    );
}

#[test]
fn a_round_takes_queued_groups_in_fair_order_across_queues() {
    let mut m = MetaState::new(1);
    put(&mut m, guaranteed("x", 4, 8));
    put(&mut m, guaranteed("y", 4, 8));
    placed_group(&mut m, "x", "x0", 3);
    let x1 = submit(&mut m, group_in("x", "x1", 1, 1));
    let x2 = submit(&mut m, group_in("x", "x2", 1, 1));
    let y1 = submit(&mut m, group_in("y", "y1", 1, 1));
    let y2 = submit(&mut m, group_in("y", "y2", 1, 1));
    let MetaReply::Groups { records } = m.query(&MetaQuery::Pending {
        limit: 10,
        due_at_ms: None,
    }) else {
        panic!("pending");
    };
    let order: Vec<GroupSeq> = records.iter().map(|r| r.seq).collect();
    assert_eq!(
        order,
        vec![y1, y2, x1, x2],
        "y (share 0, then 1/4) before x (3/4), though x's groups came first"
    );
}

#[test]
fn only_a_queues_keeper_changes_or_deletes_it() {
    let mut m = MetaState::new(1);
    let kept = QueueSpec {
        managed_by: "ElasticQuota team/quota".into(),
        ..queue("team", "", Some(4))
    };
    put(&mut m, kept.clone());
    let by_api = m.apply(&MetaCommand::PutQueue {
        queue: queue("team", "", Some(8)),
    });
    assert!(
        matches!(&by_api, MetaReply::Rejected { kind: RejectionKind::Conflict, reason } if reason.contains("kept by ElasticQuota team/quota")),
        "{by_api:?}"
    );
    let delete = m.apply(&MetaCommand::DeleteQueue {
        name: "team".into(),
        managed_by: String::new(),
    });
    assert!(matches!(
        delete,
        MetaReply::Rejected {
            kind: RejectionKind::Conflict,
            ..
        }
    ));
    put(&mut m, queue("api", "", None));
    let take_over = m.apply(&MetaCommand::PutQueue {
        queue: QueueSpec {
            managed_by: "ElasticQuota api/q".into(),
            ..queue("api", "", None)
        },
    });
    assert!(
        matches!(&take_over, MetaReply::Rejected { reason, .. } if reason.contains("made through the admin API")),
        "{take_over:?}"
    );
    put(
        &mut m,
        QueueSpec {
            max: limits(Some(6), None),
            ..kept.clone()
        },
    );
    assert_eq!(
        m.apply(&MetaCommand::DeleteQueue {
            name: "team".into(),
            managed_by: kept.managed_by.clone(),
        }),
        MetaReply::Queues { queues: Vec::new() }
    );
}

#[test]
fn the_recorded_capacity_bounds_borrowing_past_a_lending_limit_and_survives_a_snapshot() {
    let mut m = MetaState::new(1);
    let mut lender = guaranteed("lender", 4, 8);
    lender.lend = limits(Some(1), None);
    put(&mut m, lender);
    put(&mut m, queue("borrower", "", None));
    assert_eq!(
        m.query(&MetaQuery::Capacity),
        MetaReply::Capacity { capacity: None }
    );
    let mut six = Resources::zero();
    six.cpu_milli = 6_000;
    assert_eq!(
        m.apply(&MetaCommand::NoteCapacity {
            capacity: six.clone()
        }),
        MetaReply::Capacity {
            capacity: Some(six.clone())
        }
    );
    // 6 cores, 3 of them kept for the lender: the borrower gets 3.
    let first = submit(&mut m, group_in("borrower", "first", 3, 3));
    txn_of(begin(&mut m, first));
    let second = submit(&mut m, group_in("borrower", "second", 1, 1));
    let refused = begin(&mut m, second);
    assert!(
        matches!(&refused, MetaReply::Rejected { kind: RejectionKind::NoRoom, reason }
            if reason.contains("lending limits keep") && reason.contains("3 kept free (3 for lender)")),
        "{refused:?}"
    );
    for format in [
        crate::wire::WireFormat::Binary,
        crate::wire::WireFormat::Json,
    ] {
        let copy: MetaState =
            crate::wire::decode(&format.encode(&m).expect("snapshot")).expect("restore");
        assert_eq!(copy, m, "{format:?}");
        assert_eq!(
            copy.query(&MetaQuery::Capacity),
            MetaReply::Capacity {
                capacity: Some(six.clone())
            }
        );
    }
    let within = submit(&mut m, group_in("lender", "own", 3, 3));
    txn_of(begin(&mut m, within));
    consistent(&m);
}

/// Which queue's group the next round takes first.
fn first_in_line(m: &MetaState) -> String {
    let MetaReply::Groups { records } = m.query(&MetaQuery::Pending {
        limit: 10,
        due_at_ms: None,
    }) else {
        panic!("pending");
    };
    records
        .first()
        .map(|r| r.group.queue.clone())
        .unwrap_or_default()
}

fn sample(m: &mut MetaState, at_ms: u64, half_life_ms: u64) {
    let reply = m.apply(&MetaCommand::SampleUsage {
        at_ms,
        half_life_ms,
    });
    assert!(matches!(reply, MetaReply::Queues { .. }), "{reply:?}");
}

#[test]
fn a_queue_that_used_the_cluster_for_long_yields_until_the_decayed_shares_cross() {
    const HALF_LIFE_MS: u64 = 60_000;
    let mut m = MetaState::new(1);
    put(&mut m, guaranteed("a", 4, 8));
    put(&mut m, guaranteed("b", 4, 8));
    // a holds 8 cores for ten half-lives, sampled every second; b holds nothing.
    sample(&mut m, 0, HALF_LIFE_MS);
    let long = placed_group(&mut m, "a", "long", 8);
    let mut at = 0;
    while at < 10 * HALF_LIFE_MS {
        at += 1_000;
        sample(&mut m, at, HALF_LIFE_MS);
    }
    let decayed = |m: &MetaState, q: &str| {
        m.queues
            .history()
            .map(|h| h.decayed(q).cpu_milli)
            .unwrap_or(0)
    };
    assert!(decayed(&m, "a") >= 7_990, "{}", decayed(&m, "a"));
    assert_eq!(decayed(&m, "b"), 0);
    m.apply(&MetaCommand::Release {
        seq: long,
        at_ms: at,
    });
    m.apply(&MetaCommand::ReleaseDone {
        seq: long,
        at_ms: at,
    });
    assert_eq!(cores(&m, "a"), 0, "a holds nothing now");

    // Both submit; without the history the two idle queues tie and a's name wins.
    submit(&mut m, group_in("a", "a-next", 1, 1));
    submit(&mut m, group_in("b", "b-next", 1, 1));
    let mut forgetful = m.clone();
    sample(&mut forgetful, at, 0);
    assert_eq!(first_in_line(&forgetful), "a");
    assert_eq!(first_in_line(&m), "b", "a's past use puts b first");

    // b now holds 2 cores. a's measure is 8·2^(−t/h); b's 2 + 2·(1 − 2^(−t/h)): they
    // cross at 2^(−t/h) = 0.4, t = h·log2(2.5), about 79.3 s.
    placed_group(&mut m, "b", "b-running", 2);
    let start = at;
    let crossing_ms = (HALF_LIFE_MS as f64 * 2.5f64.log2()) as u64;
    let mut switched_at = None;
    while at < start + 3 * HALF_LIFE_MS {
        at += 1_000;
        sample(&mut m, at, HALF_LIFE_MS);
        if at == start + HALF_LIFE_MS {
            // A snapshot taken now continues exactly as the state it was taken from.
            for format in [
                crate::wire::WireFormat::Binary,
                crate::wire::WireFormat::Json,
            ] {
                let copy: MetaState =
                    crate::wire::decode(&format.encode(&m).expect("snapshot")).expect("restore");
                assert_eq!(copy, m, "{format:?}");
            }
        }
        let first = first_in_line(&m);
        match switched_at {
            None if first == "a" => switched_at = Some(at - start),
            None => assert_eq!(first, "b"),
            Some(_) => assert_eq!(first, "a", "once crossed, a stays first"),
        }
    }
    let switched = switched_at.expect("the shares never crossed");
    assert!(
        switched.abs_diff(crossing_ms) <= 1_000,
        "crossed after {switched} ms, the half-life says {crossing_ms}"
    );

    // Turning it off forgets the history: the order is by current usage again.
    sample(&mut m, at + 1_000, 0);
    assert!(m.queues.history().is_none());
    assert_eq!(first_in_line(&m), "a", "b holds 2 cores now, a none");
    consistent(&m);
}

#[test]
fn a_sample_with_a_half_life_out_of_range_is_refused_naming_it() {
    let mut m = MetaState::new(1);
    let reply = m.apply(&MetaCommand::SampleUsage {
        at_ms: 5,
        half_life_ms: 999,
    });
    assert!(
        matches!(&reply, MetaReply::Rejected { reason, .. } if reason.starts_with("half_life_ms: 999 is not 0 or in 1000..=")),
        "{reply:?}"
    );
    assert!(m.queues.history().is_none(), "nothing recorded");
    assert_eq!(
        m.query(&MetaQuery::UsageHistory),
        MetaReply::UsageHistory {
            half_life_ms: 0,
            sampled_at_ms: 0,
            queues: 0
        }
    );
    sample(&mut m, 5, 1_000);
    assert_eq!(
        m.query(&MetaQuery::UsageHistory),
        MetaReply::UsageHistory {
            half_life_ms: 1_000,
            sampled_at_ms: 5,
            queues: 0
        }
    );
}
