//! The shard map and shard moves in meta: where new nodes go, and each move command in
//! each phase of a move.

use std::collections::BTreeMap;

use super::*;
use crate::ledger::meta::shard_map::{hashed_shard, shard_command, SHARDS_MAX};
use crate::model::{Gang, GangMode};

fn place(m: &mut MetaState, node: &str, domain: Option<&str>) -> u32 {
    match m.apply(&MetaCommand::PlaceNode {
        node: node.into(),
        domain: domain.map(str::to_string),
        at_ms: 0,
    }) {
        MetaReply::Shard { shard } => shard,
        other => panic!("place {node}: {other:?}"),
    }
}

fn begin_move(m: &mut MetaState, target: MoveTarget, to: u32) -> Result<(ShardMove, u64), String> {
    match m.apply(&MetaCommand::BeginMove {
        target,
        to,
        reason: String::new(),
        at_ms: 5,
    }) {
        MetaReply::MoveBegun { shard_move, left } => Ok((*shard_move, left)),
        MetaReply::Rejected { reason, .. } => Err(reason),
        other => panic!("begin move: {other:?}"),
    }
}

fn step(m: &mut MetaState, cmd: MetaCommand) -> Result<ShardMove, String> {
    match m.apply(&cmd) {
        MetaReply::Move { shard_move } => Ok(*shard_move),
        MetaReply::Rejected { reason, .. } => Err(reason),
        other => panic!("{cmd:?}: {other:?}"),
    }
}

fn shard_of(m: &MetaState, node: &str) -> Option<u32> {
    match m.query(&MetaQuery::ShardOf { node: node.into() }) {
        MetaReply::Shard { shard } => Some(shard),
        _ => None,
    }
}

#[test]
fn a_new_domain_goes_to_the_least_loaded_shard_and_its_nodes_follow() {
    let mut m = MetaState::new(4);
    // Zone a's first node takes shard 1, zone b's shard 2, …; later nodes follow home.
    assert_eq!(place(&mut m, "a-0", Some("a")), 1);
    assert_eq!(place(&mut m, "b-0", Some("b")), 2);
    assert_eq!(place(&mut m, "a-1", Some("a")), 1);
    assert_eq!(place(&mut m, "c-0", Some("c")), 3);
    assert_eq!(place(&mut m, "d-0", Some("d")), 4);
    // Shards 2, 3, 4 hold one node, shard 1 two: zone e goes to 2.
    assert_eq!(place(&mut m, "e-0", Some("e")), 2);
    // Nodes without a domain each go to the least loaded shard.
    assert_eq!(place(&mut m, "x", None), 3);
    assert_eq!(place(&mut m, "y", None), 4);
    // Sticky: the same node keeps its shard, whatever its domain says now.
    assert_eq!(place(&mut m, "a-0", Some("d")), 1);
    // Old entries name their shard and still apply.
    let old = MetaCommand::AssignNode {
        node: "z".into(),
        shard: 4,
        at_ms: 0,
    };
    assert_eq!(m.apply(&old), MetaReply::Shard { shard: 4 });
    let MetaReply::ShardShares { shares } = m.query(&MetaQuery::ShardShares) else {
        panic!("shares");
    };
    let nodes: Vec<u64> = shares.iter().map(|s| s.nodes).collect();
    assert_eq!(nodes, vec![2, 2, 2, 3]);
    assert_eq!(shares[0].homes, vec!["a".to_string()]);
}

#[test]
fn a_restored_state_places_nodes_as_the_live_one_does() {
    let mut live = MetaState::new(3);
    for i in 0..7 {
        place(&mut live, &format!("n{i}"), (i % 3 == 0).then_some("z"));
    }
    let bytes = crate::wire::WireFormat::Binary
        .encode(&live)
        .expect("encodes");
    let mut restored: MetaState = crate::wire::decode(&bytes).expect("decodes");
    assert_eq!(restored, live);
    // A node of a known domain first (its home, no count needed to choose it), then more.
    assert_eq!(
        place(&mut restored, "z-late", Some("z")),
        place(&mut live, "z-late", Some("z"))
    );
    for i in 7..12 {
        let name = format!("n{i}");
        assert_eq!(
            place(&mut restored, &name, None),
            place(&mut live, &name, None)
        );
    }
}

#[test]
fn a_move_is_checked_when_begun() {
    let mut m = MetaState::new(2);
    for i in 0..3 {
        place(&mut m, &format!("a-{i}"), Some("a"));
    }
    place(&mut m, "b-0", Some("b"));
    let nodes = |names: &[&str]| MoveTarget::Nodes(names.iter().map(|n| n.to_string()).collect());
    assert!(begin_move(&mut m, nodes(&["a-0"]), 3).is_err_and(|e| e.starts_with("to:")));
    assert!(begin_move(&mut m, nodes(&["nope"]), 2).is_err_and(|e| e.contains("nope")));
    assert!(begin_move(&mut m, nodes(&["b-0"]), 2).is_err_and(|e| e.contains("already")));
    assert!(begin_move(&mut m, nodes(&["a-0", "a-0"]), 2).is_err_and(|e| e.contains("twice")));
    assert!(begin_move(&mut m, MoveTarget::Domain("q".into()), 2)
        .is_err_and(|e| e.starts_with("domain:")));
    let (first, left) = begin_move(&mut m, MoveTarget::Domain("a".into()), 2).expect("begins");
    assert_eq!(left, 0);
    assert_eq!(
        first.sources,
        BTreeMap::from([(1, vec!["a-0".into(), "a-1".into(), "a-2".into()])])
    );
    // One at a time.
    assert!(begin_move(&mut m, nodes(&["b-0"]), 1).is_err_and(|e| e.contains("still running")));
}

fn gang(name: &str, members: u32) -> Gang {
    Gang::with_members("default", name, members, members, GangMode::Strict)
}

/// A group placed with one member on `node` (shard 1) holding network devices also
/// held on shard 2.
fn placed_on(m: &mut MetaState, node: &str) -> GroupSeq {
    let seq = match m.apply(&MetaCommand::Submit {
        key: "k".into(),
        group: GangGroup {
            queue: String::new(),
            id: "g".into(),
            gangs: vec![gang("g", 1)],
            ..Default::default()
        },
        at_ms: 0,
        live_max: None,
    }) {
        MetaReply::Submitted { seq, .. } => seq,
        other => panic!("{other:?}"),
    };
    let MetaReply::TxnBegun { txn } = m.apply(&MetaCommand::BeginTxn {
        seq,
        participants: vec![1, 2],
        at_ms: 1,
    }) else {
        panic!("begin");
    };
    let placement = Placement {
        node: node.into(),
        shard: 1,
        devices: Vec::new(),
        txn: Some(txn),
        network_shards: vec![2],
        allocations: Vec::new(),
    };
    m.apply(&MetaCommand::Decide {
        txn,
        decision: Decision::Commit,
        placements: BTreeMap::from([("default/g/m0".to_string(), placement)]),
        reason: String::new(),
        at_ms: 2,
        delivered: Vec::new(),
    });
    seq
}

#[test]
fn a_move_seals_only_when_nothing_is_in_flight_and_commits_the_map_and_placements() {
    let mut m = MetaState::new(3);
    place(&mut m, "n1", Some("z"));
    place(&mut m, "n2", Some("y"));
    let seq = placed_on(&mut m, "n1");
    let (mv, _) = begin_move(&mut m, MoveTarget::Domain("z".into()), 3).expect("begins");
    // The COMMIT is not acknowledged by shards 1 and 2: the seal waits.
    assert!(
        step(&mut m, MetaCommand::SealMove { id: mv.id }).is_err_and(|e| e.contains("in flight"))
    );
    let txn = m.record(seq).and_then(|g| g.txn).expect("txn");
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1, 2],
    });
    // Commit before the seal is refused; the seal, then commit.
    assert!(step(&mut m, MetaCommand::CommitMove { id: mv.id }).is_err());
    assert_eq!(
        step(&mut m, MetaCommand::SealMove { id: mv.id }).map(|m| m.phase),
        Ok(MovePhase::Sealed)
    );
    // While sealed, members on its nodes are not released (the caller retries).
    let release = MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/g/m0".into()],
        at_ms: 3,
    };
    assert!(
        matches!(m.apply(&release), MetaReply::Rejected { reason, .. } if reason.contains("moving"))
    );
    let version = m.record(seq).map(|g| g.version);
    assert_eq!(
        step(&mut m, MetaCommand::CommitMove { id: mv.id }).map(|m| m.phase),
        Ok(MovePhase::Committed)
    );
    assert_eq!(shard_of(&m, "n1"), Some(3));
    let g = m.record(seq).expect("group");
    let p = &g.placements["default/g/m0"];
    assert_eq!((p.shard, p.network_shards.clone()), (3, vec![1, 2]));
    assert!(Some(g.version) > version, "watchers see the change");
    // The domain's home followed; a new node of it goes to shard 3.
    assert_eq!(place(&mut m, "n3", Some("z")), 3);
    // Cancel after commit is refused; end; a second end answers the same.
    assert!(step(
        &mut m,
        MetaCommand::CancelMove {
            id: mv.id,
            reason: "x".into(),
            at_ms: 4
        }
    )
    .is_err());
    assert_eq!(
        step(
            &mut m,
            MetaCommand::EndMove {
                id: mv.id,
                at_ms: 6
            }
        )
        .map(|m| m.phase),
        Ok(MovePhase::Done)
    );
    assert_eq!(
        step(
            &mut m,
            MetaCommand::EndMove {
                id: mv.id,
                at_ms: 7
            }
        )
        .map(|m| m.ended_at_ms),
        Ok(6)
    );
    assert!(matches!(m.apply(&release), MetaReply::Group { .. }));
}

#[test]
fn a_seal_waits_for_releases_under_way_and_a_move_is_given_up_only_before_its_seal() {
    let mut m = MetaState::new(2);
    place(&mut m, "n1", None);
    let seq = placed_on(&mut m, "n1");
    let txn = m.record(seq).and_then(|g| g.txn).expect("txn");
    m.apply(&MetaCommand::Delivered {
        txn,
        shards: vec![1, 2],
    });
    m.apply(&MetaCommand::ReleaseMembers {
        seq,
        members: vec!["default/g/m0".into()],
        at_ms: 3,
    });
    let (mv, _) = begin_move(&mut m, MoveTarget::Nodes(vec!["n1".into()]), 2).expect("begins");
    let seal = |m: &mut MetaState, id| step(m, MetaCommand::SealMove { id });
    let cancel = |m: &mut MetaState, id| {
        step(
            m,
            MetaCommand::CancelMove {
                id,
                reason: "gone".into(),
                at_ms: 5,
            },
        )
    };
    assert!(seal(&mut m, mv.id).is_err_and(|e| e.contains("releasing")));
    m.apply(&MetaCommand::MembersReleased {
        seq,
        members: vec!["default/g/m0".into()],
        at_ms: 4,
    });
    // Given up before the seal: cancelling until the sources lifted the fence, then
    // cancelled; nothing seals it or begins another move meanwhile.
    assert_eq!(
        cancel(&mut m, mv.id).map(|m| m.phase),
        Ok(MovePhase::Cancelling)
    );
    assert!(seal(&mut m, mv.id).is_err());
    assert!(begin_move(&mut m, MoveTarget::Nodes(vec!["n1".into()]), 2).is_err());
    let ended = step(
        &mut m,
        MetaCommand::EndMove {
            id: mv.id,
            at_ms: 6,
        },
    );
    assert_eq!(ended.map(|m| m.phase), Ok(MovePhase::Cancelled));
    assert_eq!(shard_of(&m, "n1"), Some(1));
    // Sealed, a move is not given up any more.
    let (again, _) = begin_move(&mut m, MoveTarget::Nodes(vec!["n1".into()]), 2).expect("begins");
    assert!(seal(&mut m, again.id).is_ok());
    assert!(cancel(&mut m, again.id).is_err());
}

#[test]
fn a_replica_writing_for_the_first_rollout_proposes_the_hash_rule_old_replicas_apply() {
    // Nodes of one rack hash together; a legacy writer names the shard, as releases
    // before the recorded map did, and every release applies it alike.
    let a = shard_command("a", Some("r1".into()), true, 8, 1);
    let b = shard_command("b", Some("r1".into()), true, 8, 1);
    let (MetaCommand::AssignNode { shard: sa, .. }, MetaCommand::AssignNode { shard: sb, .. }) =
        (&a, &b)
    else {
        panic!("a legacy writer proposes AssignNode: {a:?}");
    };
    assert_eq!(sa, sb);
    assert!((1..=8).contains(sa));
    assert_eq!(*sa, hashed_shard("anything", Some("r1"), 8));
    assert!(matches!(
        shard_command("a", Some("r1".into()), false, 8, 1),
        MetaCommand::PlaceNode { domain: Some(d), .. } if d == "r1"
    ));
    let mut m = MetaState::new(8);
    assert_eq!(m.apply(&a), MetaReply::Shard { shard: *sa });
}

#[test]
fn nodes_assigned_before_domains_were_recorded_learn_theirs_and_keep_their_zone_together() {
    let mut m = MetaState::new(4);
    for (node, shard) in [("z-0", 3), ("z-1", 3)] {
        let old = MetaCommand::AssignNode {
            node: node.into(),
            shard,
            at_ms: 0,
        };
        m.apply(&old);
    }
    // Registered again (the ingest does at start): sticky, and the zone's home is theirs.
    assert_eq!(place(&mut m, "z-0", Some("z")), 3);
    assert_eq!(place(&mut m, "z-2", Some("z")), 3);
    let MetaReply::MappedNodes { nodes } = m.query(&MetaQuery::MappedNodes) else {
        panic!("mapped nodes");
    };
    assert_eq!(nodes[0].domain.as_deref(), Some("z"));
}

fn voters() -> BTreeMap<u64, String> {
    (1..=3)
        .map(|id| (id, format!("127.0.0.1:700{id}")))
        .collect()
}

fn grow(m: &mut MetaState, shards: u32, voters: BTreeMap<u64, String>) -> Result<u32, String> {
    match m.apply(&MetaCommand::GrowShards { shards, voters }) {
        MetaReply::ShardSet { shards, .. } => Ok(shards),
        MetaReply::Rejected { reason, .. } => Err(reason),
        other => panic!("grow: {other:?}"),
    }
}

#[test]
fn growing_records_the_added_shards_and_new_domains_go_to_them() {
    let mut m = MetaState::new(2);
    assert_eq!(place(&mut m, "a-0", Some("a")), 1);
    assert_eq!(place(&mut m, "b-0", Some("b")), 2);
    assert_eq!(place(&mut m, "a-1", Some("a")), 1);
    assert_eq!(grow(&mut m, 4, voters()), Ok(4));
    let MetaReply::ShardSet { shards, added } = m.query(&MetaQuery::ShardSet) else {
        panic!("shard set");
    };
    assert_eq!(shards, 4);
    assert_eq!(added.keys().copied().collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(added[&3], voters());
    // The added shards are empty, so the next domains go there; old nodes stay home.
    assert_eq!(place(&mut m, "c-0", Some("c")), 3);
    assert_eq!(place(&mut m, "d-0", Some("d")), 4);
    assert_eq!(place(&mut m, "a-2", Some("a")), 1);
    // A move may now target an added shard.
    let (mv, _) = begin_move(&mut m, MoveTarget::Domain("b".into()), 4).expect("move to 4");
    assert_eq!(mv.to, 4);
    // A restored state holds the same set and keeps placing alike.
    let bytes = crate::wire::WireFormat::Binary.encode(&m).expect("encodes");
    let mut restored: MetaState = crate::wire::decode(&bytes).expect("decodes");
    assert_eq!(restored, m);
    assert_eq!(
        place(&mut restored, "e-0", None),
        place(&mut m, "e-0", None)
    );
}

#[test]
fn the_shard_count_never_falls_and_refusals_name_the_field_and_change_nothing() {
    let mut m = MetaState::new(3);
    place(&mut m, "a-0", Some("a"));
    let before = m.clone();
    let err = grow(&mut m, 2, voters()).expect_err("shrink");
    assert!(
        err.starts_with("shards: 2 is below the current count 3"),
        "{err}"
    );
    let err = grow(&mut m, SHARDS_MAX + 1, voters()).expect_err("too many");
    assert!(err.starts_with("shards:"), "{err}");
    for bad in [
        BTreeMap::new(),
        [(0, "127.0.0.1:1".to_string())].into(),
        [(1, String::new())].into(),
    ] {
        let err = grow(&mut m, 5, bad).expect_err("bad voters");
        assert!(err.starts_with("voters:"), "{err}");
    }
    assert_eq!(m, before, "a refused grow changes nothing");
    // The count it has again is answered as it is (a retried call), voters unread.
    assert_eq!(grow(&mut m, 3, BTreeMap::new()), Ok(3));
    assert_eq!(m, before);
    assert_eq!(grow(&mut m, 5, voters()), Ok(5));
    assert_eq!(grow(&mut m, 5, voters()), Ok(5));
    let err = grow(&mut m, 4, voters()).expect_err("shrink after grow");
    assert!(err.contains("only grows"), "{err}");
}
