//! Parked groups in the meta group: a group that fit nowhere is requeued parked, out of
//! the rounds' pending reads until a wake or the safety net; a wake makes only parked,
//! queued groups due; a group holding members is never parked; a deadline is never
//! delayed by parking; parking survives a snapshot.

use super::*;
use crate::model::{Gang, GangMode};

fn submit(m: &mut MetaState, name: &str, members: u32, min: u32, wait_ms: u64) -> GroupSeq {
    let mode = if min < members {
        GangMode::NonStrict
    } else {
        GangMode::Strict
    };
    let gang = Gang {
        wait_time_ms: wait_ms,
        ..Gang::with_members("default", name, members, min, mode)
    };
    match m.apply(&MetaCommand::Submit {
        key: name.into(),
        group: GangGroup {
            id: name.into(),
            gangs: vec![gang],
            ..Default::default()
        },
        at_ms: 0,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit: {other:?}"),
    }
}

fn requeue(m: &mut MetaState, seq: GroupSeq, at_ms: u64, retry: Retry) -> MetaReply {
    let attempts = m.record(seq).map(|r| r.attempts);
    m.apply(&MetaCommand::Requeue {
        seq,
        reason: "0/4 nodes are available".into(),
        at_ms,
        attempts,
        retry,
    })
}

/// The groups a round at `now` reads.
fn due(m: &MetaState, now: u64) -> Vec<GroupSeq> {
    match m.query(&MetaQuery::Pending {
        limit: 100,
        due_at_ms: Some(now),
    }) {
        MetaReply::Groups { records } => records.iter().map(|r| r.seq).collect(),
        other => panic!("pending: {other:?}"),
    }
}

#[test]
fn a_parked_group_leaves_the_rounds_until_woken_or_the_safety_net() {
    let mut m = MetaState::new(1);
    let parked = submit(&mut m, "parked", 2, 2, 0);
    let backing_off = submit(&mut m, "backoff", 2, 2, 0);
    requeue(&mut m, parked, 1_000, Retry::Parked);
    requeue(&mut m, backing_off, 1_000, Retry::Backoff);
    let record = m.record(parked).expect("parked").clone();
    assert_eq!(record.parked_at_ms, Some(1_000));
    let net = parked_recheck_ms(parked, 1);
    assert_eq!(
        net,
        PARKED_RECHECK_MS + PARKED_RECHECK_MS / 64,
        "seq 1 spreads by 1/64"
    );
    assert_eq!(record.not_before_ms, on_recheck_grid(1_000 + net));
    assert_eq!(
        record.not_before_ms % PARKED_RECHECK_GRID_MS,
        0,
        "on the grid"
    );
    assert!(record.not_before_ms - (1_000 + net) < PARKED_RECHECK_GRID_MS);
    assert_eq!(record.attempts, 1, "a parked attempt counts");
    // The backoff comes due; the parked group does not.
    assert_eq!(due(&m, 1_000 + RETRY_BACKOFF_MAX_MS), vec![backing_off]);
    assert_eq!(
        due(&m, record.not_before_ms - 1),
        vec![backing_off],
        "not before the grid point"
    );
    assert_eq!(
        due(&m, record.not_before_ms),
        vec![parked, backing_off],
        "the safety net"
    );
    // A wake makes it due at once; a wake of a group that is not parked changes nothing.
    let reply = m.apply(&MetaCommand::Wake {
        which: Woken::Groups(vec![parked, backing_off, 99]),
        at_ms: 2_000,
    });
    assert_eq!(reply, MetaReply::Woken { groups: 1 });
    assert_eq!(due(&m, 2_000), vec![parked, backing_off]);
    assert_eq!(m.record(parked).and_then(|r| r.parked_at_ms), None);
    let again = m.apply(&MetaCommand::Wake {
        which: Woken::Groups(vec![parked]),
        at_ms: 2_500,
    });
    assert_eq!(again, MetaReply::Woken { groups: 0 }, "woken once");
}

#[test]
fn a_new_coordinator_wakes_every_parked_group_and_only_those() {
    let mut m = MetaState::new(1);
    let seqs: Vec<GroupSeq> = (0..4)
        .map(|i| submit(&mut m, &format!("g{i}"), 1, 1, 0))
        .collect();
    for (i, seq) in seqs.iter().enumerate() {
        let retry = if i % 2 == 0 {
            Retry::Parked
        } else {
            Retry::Backoff
        };
        requeue(&mut m, *seq, 0, retry);
    }
    // A parked group that began a transaction is no longer parked.
    m.apply(&MetaCommand::BeginTxn {
        seq: seqs[2],
        participants: vec![1],
        at_ms: 10,
    });
    assert_eq!(m.record(seqs[2]).and_then(|r| r.parked_at_ms), None);
    let reply = m.apply(&MetaCommand::Wake {
        which: Woken::AllParked,
        at_ms: 100,
    });
    assert_eq!(reply, MetaReply::Woken { groups: 1 });
    assert!(due(&m, 100).contains(&seqs[0]));
    let too_many = m.apply(&MetaCommand::Wake {
        which: Woken::Groups(vec![1; WAKE_GROUPS_MAX + 1]),
        at_ms: 100,
    });
    assert!(
        matches!(&too_many, MetaReply::Rejected { reason, .. } if reason.starts_with("which: 4097 groups in one wake")),
        "{too_many:?}"
    );
}

#[test]
fn a_group_holding_members_is_never_parked_and_parking_delays_no_deadline() {
    let mut m = MetaState::new(1);
    // A NonStrict group's partial hold: one member committed, short of its min.
    let nonstrict = submit(&mut m, "nonstrict", 3, 2, 0);
    let txn2 = match m.apply(&MetaCommand::BeginTxn {
        seq: nonstrict,
        participants: vec![1],
        at_ms: 0,
    }) {
        MetaReply::TxnBegun { txn } => txn,
        other => panic!("begin: {other:?}"),
    };
    m.apply(&MetaCommand::Decide {
        txn: txn2,
        decision: Decision::Commit,
        placements: [("default/nonstrict/m0".to_string(), super::tests::on("n1"))].into(),
        reason: String::new(),
        at_ms: 5,
        delivered: vec![1],
    });
    assert_eq!(
        m.record(nonstrict).map(|r| r.state),
        Some(GroupState::Queued),
        "accumulating"
    );
    let refused = requeue(&mut m, nonstrict, 10, Retry::Parked);
    assert!(
        matches!(&refused, MetaReply::Rejected { reason, .. } if reason.starts_with("retry: gang group")),
        "{refused:?}"
    );

    let waits = submit(&mut m, "waits", 1, 1, 3_000);
    requeue(&mut m, waits, 100, Retry::Parked);
    assert!(
        due(&m, 3_000).contains(&waits),
        "read at its deadline, long before the safety net"
    );
    m.apply(&MetaCommand::Expire {
        seq: waits,
        at_ms: 3_000,
    });
    assert!(m.record(waits).is_some_and(|r| r.state.is_terminal()));
}

#[test]
fn the_safety_net_doubles_per_attempt_up_to_its_bound_and_spreads_by_group() {
    assert_eq!(parked_recheck_ms(64, 1), PARKED_RECHECK_MS);
    assert_eq!(parked_recheck_ms(64, 2), 2 * PARKED_RECHECK_MS);
    assert_eq!(parked_recheck_ms(64, 40), PARKED_RECHECK_MAX_MS);
    assert_eq!(
        parked_recheck_ms(63, 1),
        PARKED_RECHECK_MS + PARKED_RECHECK_MS * 63 / 64
    );
    let spread: std::collections::BTreeSet<u64> =
        (0..128).map(|seq| parked_recheck_ms(seq, 1)).collect();
    assert_eq!(spread.len(), 64, "64 due times for groups parked together");
}

#[test]
fn a_read_lists_few_groups_due_by_their_safety_net_and_they_hide_no_other() {
    let mut m = MetaState::new(1);
    let parked: Vec<GroupSeq> = (0..PARKED_RECHECKS_PER_READ_MAX + 24)
        .map(|i| submit(&mut m, &format!("p{i:03}"), 1, 1, 0))
        .collect();
    for seq in &parked {
        requeue(&mut m, *seq, 0, Retry::Parked);
    }
    let fresh = submit(&mut m, "fresh", 1, 1, 0);
    let MetaReply::Groups { records } = m.query(&MetaQuery::Pending {
        limit: 4,
        due_at_ms: Some(2 * PARKED_RECHECK_MS),
    }) else {
        panic!("pending");
    };
    let seqs: Vec<GroupSeq> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs.len(), PARKED_RECHECKS_PER_READ_MAX + 1, "{seqs:?}");
    assert!(seqs.contains(&fresh), "the window is not theirs: {seqs:?}");
}

#[test]
fn parking_survives_a_snapshot() {
    let mut m = MetaState::new(1);
    let g = submit(&mut m, "g", 1, 1, 0);
    requeue(&mut m, g, 7, Retry::Parked);
    for format in [
        crate::wire::WireFormat::Binary,
        crate::wire::WireFormat::Json,
    ] {
        let copy: MetaState =
            crate::wire::decode(&format.encode(&m).expect("snapshot")).expect("restore");
        assert_eq!(copy, m, "{format:?}");
        assert_eq!(copy.record(g).and_then(|r| r.parked_at_ms), Some(7));
    }
}
