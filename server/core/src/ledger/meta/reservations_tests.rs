//! Reservations for the head of the line in the meta group: what is refused and why,
//! what ends one, that a group holding one retries soon, that a snapshot keeps them, and
//! a property test against a reference model: none outlives its bound, none survives its
//! group's placement or end, and the bound on their number and on shared nodes holds.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::model::{Gang, GangMode};

fn submit(m: &mut MetaState, name: &str) -> GroupSeq {
    match m.apply(&MetaCommand::Submit {
        key: name.into(),
        group: GangGroup {
            id: name.into(),
            gangs: vec![Gang::with_members("default", name, 2, 2, GangMode::Strict)],
            ..Default::default()
        },
        at_ms: 0,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("submit: {other:?}"),
    }
}

fn head(seq: GroupSeq, nodes: &[&str], at_ms: u64, ttl_ms: u64) -> HeadReservation {
    HeadReservation {
        seq,
        priority: 0,
        nodes: BTreeMap::from([(1, nodes.iter().map(|n| n.to_string()).collect())]),
        starts_by_ms: Some(at_ms + 30_000),
        preempts_below: None,
        made_at_ms: at_ms,
        expires_at_ms: at_ms + ttl_ms,
    }
}

fn reserve(m: &mut MetaState, r: HeadReservation) -> MetaReply {
    m.apply(&MetaCommand::ReserveForHead { reservation: r })
}

fn active(m: &MetaState, at_ms: u64) -> Vec<GroupSeq> {
    match m.query(&MetaQuery::HeadReservations { at_ms }) {
        MetaReply::HeadReservations { reservations } => {
            reservations.iter().map(|r| r.seq).collect()
        }
        other => panic!("reservations: {other:?}"),
    }
}

/// A command that only carries a time.
fn tick(m: &mut MetaState, at_ms: u64) {
    m.apply(&MetaCommand::Wake {
        which: Woken::Groups(Vec::new()),
        at_ms,
    });
}

fn refusal(reply: MetaReply) -> (RejectionKind, String) {
    match reply {
        MetaReply::Rejected { kind, reason } => (kind, reason),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Places `seq` whole on shard 1 (begin, then a committed decision).
fn place(m: &mut MetaState, seq: GroupSeq, at_ms: u64) {
    let MetaReply::TxnBegun { txn } = m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1],
        at_ms,
    }) else {
        panic!("begin");
    };
    let record = m.record(seq).expect("group").clone();
    let placements = record
        .group
        .gangs
        .iter()
        .flat_map(|g| {
            g.members
                .iter()
                .map(move |mem| g.member_key(mem).to_string())
        })
        .map(|k| {
            (
                k,
                Placement {
                    txn: None,
                    node: "n9".into(),
                    shard: 1,
                    devices: Vec::new(),
                    network_shards: Vec::new(),
                    allocations: Vec::new(),
                },
            )
        })
        .collect();
    m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements,
        reason: String::new(),
        at_ms,
        delivered: vec![1],
    });
}

#[test]
fn a_reservation_is_refused_naming_what_is_wrong() {
    let mut m = MetaState::new(1);
    let a = submit(&mut m, "a");
    let b = submit(&mut m, "b");
    assert_eq!(
        refusal(reserve(&mut m, head(99, &["n0"], 0, 1_000))).0,
        RejectionKind::NotFound
    );
    let (_, why) = refusal(reserve(&mut m, head(a, &[], 0, 1_000)));
    assert!(why.starts_with("nodes:"), "{why}");
    let (_, why) = refusal(reserve(&mut m, head(a, &["n0", "n0"], 0, 1_000)));
    assert!(why.contains("named twice"), "{why}");
    let (_, why) = refusal(reserve(&mut m, head(a, &["n0"], 0, 0)));
    assert!(why.starts_with("expires_at_ms:"), "{why}");
    let (_, why) = refusal(reserve(
        &mut m,
        head(a, &["n0"], 0, RESERVATION_TTL_MS_MAX + 1),
    ));
    assert!(why.starts_with("expires_at_ms:"), "{why}");
    assert!(matches!(
        reserve(&mut m, head(a, &["n0", "n1"], 0, 10_000)),
        MetaReply::HeadReservations { .. }
    ));
    let (kind, why) = refusal(reserve(&mut m, head(b, &["n1", "n2"], 0, 10_000)));
    assert_eq!(kind, RejectionKind::Conflict);
    assert!(
        why.contains(&format!("reserved for gang group {a}")),
        "{why}"
    );
    // Its own reservation is replaced, not refused.
    assert!(matches!(
        reserve(&mut m, head(a, &["n1", "n2"], 100, 10_000)),
        MetaReply::HeadReservations { .. }
    ));
    assert_eq!(active(&m, 100), vec![a]);
    // The bound.
    let others: Vec<GroupSeq> = (0..RESERVATIONS_MAX)
        .map(|i| submit(&mut m, &format!("g{i}")))
        .collect();
    for (i, seq) in others.iter().enumerate().take(RESERVATIONS_MAX - 1) {
        let node = format!("x{i}");
        assert!(matches!(
            reserve(&mut m, head(*seq, &[&node], 100, 10_000)),
            MetaReply::HeadReservations { .. }
        ));
    }
    let last = others[RESERVATIONS_MAX - 1];
    let (kind, _) = refusal(reserve(&mut m, head(last, &["y"], 100, 10_000)));
    assert_eq!(kind, RejectionKind::Exhausted);
    // A placed group is not reserved for.
    place(&mut m, b, 200);
    let (kind, why) = refusal(reserve(&mut m, head(b, &["z"], 200, 10_000)));
    assert_eq!(kind, RejectionKind::Refused, "{why}");
}

#[test]
fn a_reservation_ends_when_its_group_is_placed_cancelled_or_its_time_passes() {
    let mut m = MetaState::new(1);
    let placed = submit(&mut m, "placed");
    let cancelled = submit(&mut m, "cancelled");
    let lapsing = submit(&mut m, "lapsing");
    let ended = submit(&mut m, "ended");
    for (i, seq) in [placed, cancelled, lapsing, ended].into_iter().enumerate() {
        let node = format!("n{i}");
        reserve(&mut m, head(seq, &[&node], 0, 5_000));
    }
    assert_eq!(active(&m, 0).len(), 4);
    place(&mut m, placed, 10);
    m.apply(&MetaCommand::Cancel {
        seq: cancelled,
        at_ms: 20,
    });
    m.apply(&MetaCommand::EndHeadReservation {
        seq: ended,
        at_ms: 30,
    });
    assert_eq!(active(&m, 30), vec![lapsing]);
    // Reads leave it out once its time passed, before any command prunes it.
    assert_eq!(active(&m, 5_000), Vec::<GroupSeq>::new());
    assert!(m.reservations.holds(lapsing));
    tick(&mut m, 5_000);
    assert!(!m.reservations.holds(lapsing));
}

#[test]
fn a_group_holding_a_reservation_retries_soon_and_others_back_off() {
    let mut m = MetaState::new(1);
    let held = submit(&mut m, "held");
    let other = submit(&mut m, "other");
    reserve(&mut m, head(held, &["n0"], 0, 60_000));
    for _ in 0..6 {
        for seq in [held, other] {
            let attempts = m.record(seq).map(|r| r.attempts);
            m.apply(&MetaCommand::Requeue {
                seq,
                reason: "no room".into(),
                at_ms: 1_000,
                attempts,
                retry: Retry::Reserved,
            });
        }
    }
    assert_eq!(
        m.record(held).map(|r| r.not_before_ms),
        Some(1_000 + RESERVED_RETRY_MS)
    );
    assert_eq!(
        m.record(other).map(|r| r.not_before_ms),
        Some(1_000 + retry_backoff_ms(6)),
        "only a group holding a reservation skips its backoff"
    );
}

#[test]
fn reservations_survive_a_snapshot() {
    let mut m = MetaState::new(1);
    let a = submit(&mut m, "a");
    reserve(&mut m, head(a, &["n0", "n1"], 0, 60_000));
    for format in crate::wire::WireFormat::ALL {
        let bytes = format.encode(&m).expect("encode");
        let back: MetaState = crate::wire::decode(&bytes).expect("decode");
        assert_eq!(back.reservations, m.reservations, "{format:?}");
    }
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    Reserve {
        group: usize,
        nodes: Vec<u8>,
        ttl_ms: u64,
    },
    End {
        group: usize,
    },
    Place {
        group: usize,
    },
    Cancel {
        group: usize,
    },
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..6, proptest::collection::vec(0u8..12, 0..4), 1u64..20_000)
            .prop_map(|(group, nodes, ttl_ms)| Step::Reserve { group, nodes, ttl_ms }),
        1 => (0usize..6).prop_map(|group| Step::End { group }),
        1 => (0usize..6).prop_map(|group| Step::Place { group }),
        1 => (0usize..6).prop_map(|group| Step::Cancel { group }),
        2 => Just(Step::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random reservations, ends, placements, cancellations and time against a model
    /// that keeps, per group, the nodes and expiry the rules allow.
    #[test]
    fn reservations_follow_the_model(steps in proptest::collection::vec((step(), 0u64..3_000), 1..60)) {
        let mut m = MetaState::new(1);
        let seqs: Vec<GroupSeq> = (0..6).map(|i| submit(&mut m, &format!("g{i}"))).collect();
        // The model: seq → (nodes, expires); groups that may hold one.
        let mut model: BTreeMap<GroupSeq, (Vec<String>, u64)> = BTreeMap::new();
        let mut waiting: Vec<bool> = vec![true; 6];
        let mut now = 0u64;
        for (step, advance) in steps {
            now += advance;
            match step {
                Step::Reserve { group, nodes, ttl_ms } => {
                    let mut names: Vec<String> = nodes.iter().map(|n| format!("n{n}")).collect();
                    names.sort();
                    let distinct = names.windows(2).all(|w| w[0] != w[1]);
                    let seq = seqs[group];
                    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                    let reply = reserve(&mut m, head(seq, &refs, now, ttl_ms));
                    model.retain(|_, (_, expires)| *expires > now);
                    let clash = model
                        .iter()
                        .any(|(s, (held, _))| *s != seq && held.iter().any(|n| names.contains(n)));
                    let full = !model.contains_key(&seq) && model.len() >= RESERVATIONS_MAX;
                    let ok = waiting[group] && !names.is_empty() && distinct && !clash && !full;
                    prop_assert_eq!(
                        matches!(reply, MetaReply::HeadReservations { .. }),
                        ok,
                        "reserve {:?} for g{} at {}: {:?}", names, group, now, reply
                    );
                    if ok {
                        model.insert(seq, (names, now + ttl_ms));
                    }
                }
                Step::End { group } => {
                    m.apply(&MetaCommand::EndHeadReservation { seq: seqs[group], at_ms: now });
                    model.remove(&seqs[group]);
                }
                Step::Place { group } if waiting[group] => {
                    place(&mut m, seqs[group], now);
                    waiting[group] = false;
                    model.remove(&seqs[group]);
                }
                Step::Cancel { group } => {
                    m.apply(&MetaCommand::Cancel { seq: seqs[group], at_ms: now });
                    waiting[group] = false;
                    model.remove(&seqs[group]);
                }
                Step::Place { .. } | Step::Tick => tick(&mut m, now),
            }
            model.retain(|_, (_, expires)| *expires > now);
            // None outlives its bound, or its group's wait.
            for r in m.reservations.all() {
                prop_assert!(r.expires_at_ms > now, "{:?} kept at {}", r, now);
            }
            let kept: BTreeMap<GroupSeq, (Vec<String>, u64)> = m
                .reservations
                .all()
                .map(|r| (r.seq, (r.nodes[&1].clone(), r.expires_at_ms)))
                .collect();
            prop_assert_eq!(&kept, &model);
            prop_assert!(kept.len() <= RESERVATIONS_MAX);
        }
    }
}

fn overrun(m: &MetaState, at_ms: u64) -> Vec<GroupSeq> {
    match m.query(&MetaQuery::Overrun { at_ms, limit: 10 }) {
        MetaReply::PlacedEnds { groups } => groups.iter().map(|g| g.seq).collect(),
        other => panic!("overrun: {other:?}"),
    }
}

#[test]
fn placed_groups_past_their_run_time_limit_are_read_and_released_with_a_reason() {
    let mut m = MetaState::new(1);
    let limited = |m: &mut MetaState, name: &str, limit_ms: u64, uid: bool| {
        let mut gang = Gang::with_members("default", name, 2, 2, GangMode::Strict);
        if uid {
            for member in &mut gang.members {
                member.uid = Some(format!("uid-{}", member.name));
            }
        }
        match m.apply(&MetaCommand::Submit {
            key: name.into(),
            group: GangGroup {
                id: name.into(),
                gangs: vec![gang],
                run_limit_ms: Some(limit_ms),
                ..Default::default()
            },
            at_ms: 0,
            live_max: None,
        }) {
            MetaReply::Submitted { seq, .. } => seq,
            other => panic!("submit: {other:?}"),
        }
    };
    let short = limited(&mut m, "short", 5_000, false);
    let long = limited(&mut m, "long", 60_000, false);
    let pods = limited(&mut m, "pods", 5_000, true);
    let unlimited = submit(&mut m, "unlimited");
    for seq in [short, long, pods, unlimited] {
        place(&mut m, seq, 1_000);
    }
    assert_eq!(m.record(short).and_then(|r| r.ends_at_ms()), Some(6_000));
    assert_eq!(overrun(&m, 5_999), Vec::<GroupSeq>::new());
    // Kubernetes pods are stopped by their kubelets: gangway does not list them.
    assert_eq!(overrun(&m, 6_000), vec![short]);
    assert_eq!(overrun(&m, 61_000), vec![short, long]);
    m.apply(&MetaCommand::Release {
        seq: short,
        at_ms: 6_100,
    });
    let r = m.record(short).expect("short");
    assert!(
        r.reason.contains("run-time limit of 5 s passed"),
        "{}",
        r.reason
    );
    assert_eq!(
        overrun(&m, 61_000),
        vec![long],
        "a released group leaves the index"
    );
    // A release before the limit says nothing of it.
    m.apply(&MetaCommand::Release {
        seq: long,
        at_ms: 7_000,
    });
    assert_eq!(
        m.record(long).map(|r| r.reason.clone()),
        Some(String::new())
    );
}
