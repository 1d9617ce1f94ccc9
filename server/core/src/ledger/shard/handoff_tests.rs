//! Each handoff operation in each state of a node and a move: fenced or not, with an
//! open reservation or committed slots, handed off, adopted, dropped, moved back.

use crate::engine::{place_gang, Profile};
use crate::ledger::command::{
    LedgerError, LedgerOp, LedgerReply, Parcel, RefusalCause, ReleaseTarget, ReserveMember,
    MOVE_NODES_MAX,
};
use crate::ledger::shard::ShardLedger;
use crate::ledger::TxnId;
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::PodSummary;
use crate::model::resources::Resources;
use crate::model::{Gang, GangMode};

fn node(name: &str) -> Node {
    crate::fixtures::node_with(name, 4_000, 1 << 30, 10)
}

fn key(member: &str) -> MemberKey {
    MemberKey::new("ns", "g", member)
}

fn member(name: &str, node: &str) -> ReserveMember {
    ReserveMember {
        member: key(name),
        node: node.into(),
        pod: PodSummary {
            requests: Resources {
                cpu_milli: 1_000,
                ..Resources::zero()
            },
            ..PodSummary::default()
        },
    }
}

fn apply(l: &mut ShardLedger, op: LedgerOp) -> LedgerReply {
    crate::fixtures::apply_checked(l, 10, op)
}

fn ledger(nodes: &[&str]) -> ShardLedger {
    let mut l = ShardLedger::new();
    for n in nodes {
        apply(&mut l, LedgerOp::RegisterNode { node: node(n) });
    }
    l
}

fn commit_now(l: &mut ShardLedger, txn: u64, members: Vec<ReserveMember>) {
    let reply = apply(
        l,
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(txn),
            members,
            network: Vec::new(),
        },
    );
    assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
}

fn fence(l: &mut ShardLedger, move_id: u64, nodes: &[&str]) -> LedgerReply {
    apply(
        l,
        LedgerOp::FenceNodes {
            move_id,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        },
    )
}

fn hand_off(l: &mut ShardLedger, move_id: u64, to: u32) -> Result<Parcel, LedgerError> {
    match apply(l, LedgerOp::HandOff { move_id, to }) {
        LedgerReply::HandedOff { parcel } => Ok(parcel),
        LedgerReply::Rejected { error } => Err(error),
        other => panic!("handoff answered {other:?}"),
    }
}

#[test]
fn a_fenced_node_takes_no_reservation_and_plans_skip_it() {
    let mut a = ledger(&["a1", "a2"]);
    // Fenced by name: a node not registered here yet is fenced as well.
    assert!(
        matches!(fence(&mut a, 1, &["a1", "gone"]), LedgerReply::Fenced { nodes, .. } if nodes == ["a1", "gone"])
    );
    // Again: the same answer; another move may not fence it.
    assert!(matches!(
        fence(&mut a, 1, &["a1"]),
        LedgerReply::Fenced { .. }
    ));
    assert!(matches!(
        fence(&mut a, 2, &["a1"]),
        LedgerReply::Rejected {
            error: LedgerError::NodeMoving { move_id: 1, .. }
        }
    ));
    let reply = apply(
        &mut a,
        LedgerOp::Reserve {
            txn_id: TxnId(7),
            members: vec![member("m0", "a1")],
            deadline_ms: 1_000,
            network: Vec::new(),
        },
    );
    let LedgerReply::ReserveRefused { refusals, .. } = reply else {
        panic!("a fenced node reserved: {reply:?}");
    };
    assert_eq!(refusals[0].cause, RefusalCause::NodeMoving);
    let gang = Gang::with_members("ns", "g", 4, 4, GangMode::Strict);
    let plan = place_gang(&a, &gang, &Profile::default(), &[]);
    assert!(plan.assignments.iter().all(|m| m.node == "a2"), "{plan:?}");
    // Lifted: it takes pods again.
    assert!(
        matches!(apply(&mut a, LedgerOp::UnfenceNodes { move_id: 1 }), LedgerReply::Unfenced { nodes, .. } if nodes == ["a1", "gone"])
    );
    let plan = place_gang(&a, &gang, &Profile::default(), &[]);
    assert!(plan.assignments.iter().any(|m| m.node == "a1"), "{plan:?}");
}

#[test]
fn a_handoff_waits_for_open_reservations_then_carries_committed_slots() {
    let mut a = ledger(&["a1", "a2"]);
    commit_now(&mut a, 1, vec![member("m0", "a1"), member("m1", "a2")]);
    apply(
        &mut a,
        LedgerOp::Reserve {
            txn_id: TxnId(2),
            members: vec![member("m2", "a1")],
            deadline_ms: 1_000,
            network: Vec::new(),
        },
    );
    fence(&mut a, 5, &["a1"]);
    assert!(matches!(
        hand_off(&mut a, 5, 2),
        Err(LedgerError::NodesBusy {
            txn_id: TxnId(2),
            ..
        })
    ));
    apply(&mut a, LedgerOp::Commit { txn_id: TxnId(2) });
    let parcel = hand_off(&mut a, 5, 2).expect("no reservation is open");
    assert_eq!(parcel.nodes.len(), 1);
    assert_eq!(parcel.nodes[0].usage.pods.len(), 2);
    assert!(parcel.holds(&key("m0")) && parcel.holds(&key("m2")));
    // A retry answers the same parcel; the node is gone from the table.
    assert_eq!(hand_off(&mut a, 5, 2), Ok(parcel.clone()));
    assert!(a.node("a1").is_none());
    // The moved node cannot come back here, nor its members be answered "absent".
    assert!(matches!(
        apply(&mut a, LedgerOp::RegisterNode { node: node("a1") }),
        LedgerReply::Rejected {
            error: LedgerError::NodeMoved { to: 2, .. }
        }
    ));
    assert!(matches!(
        apply(
            &mut a,
            LedgerOp::Release {
                target: ReleaseTarget::Members(vec![key("m0")])
            }
        ),
        LedgerReply::Rejected {
            error: LedgerError::MemberMoved { to: 2, .. }
        }
    ));
    assert!(matches!(
        apply(
            &mut a,
            LedgerOp::BindConfirmed {
                member: key("m2"),
                uid: None
            }
        ),
        LedgerReply::Rejected {
            error: LedgerError::MemberMoved { .. }
        }
    ));
    // The member left on a2 is released as ever.
    assert!(matches!(
        apply(&mut a, LedgerOp::Release { target: ReleaseTarget::Members(vec![key("m1")]) }),
        LedgerReply::Released { released, .. } if released == [key("m1")]
    ));
    assert!(matches!(
        apply(&mut a, LedgerOp::DropParcel { move_id: 5 }),
        LedgerReply::ParcelDropped { .. }
    ));
    assert!(a.parcels().is_empty());
    assert_eq!(a.moved_nodes().get("a1"), Some(&2));
}

#[test]
fn an_adoption_takes_every_node_once_and_the_slots_release_there() {
    let mut a = ledger(&["a1"]);
    let mut b = ledger(&["b1"]);
    commit_now(&mut a, 1, vec![member("m0", "a1"), member("m1", "a1")]);
    fence(&mut a, 3, &["a1"]);
    let parcel = hand_off(&mut a, 3, 2).expect("handoff");
    let adopted = apply(
        &mut b,
        LedgerOp::Adopt {
            parcel: parcel.clone(),
        },
    );
    assert!(
        matches!(adopted, LedgerReply::Adopted { nodes: 1, .. }),
        "{adopted:?}"
    );
    // A retried adoption changes nothing.
    let before = b.clone();
    assert!(matches!(
        apply(
            &mut b,
            LedgerOp::Adopt {
                parcel: parcel.clone()
            }
        ),
        LedgerReply::Adopted { .. }
    ));
    assert_eq!(b, before);
    assert_eq!(b.total_reserved(), Resources::zero());
    // The committed transaction is known there: a release's commit-first answers Committed.
    assert!(matches!(
        apply(&mut b, LedgerOp::Commit { txn_id: TxnId(1) }),
        LedgerReply::Committed { .. }
    ));
    assert!(matches!(
        apply(&mut b, LedgerOp::Release { target: ReleaseTarget::Txn(TxnId(1)) }),
        LedgerReply::Released { released, .. } if released.len() == 2
    ));
    // Another parcel naming a node b has is refused whole.
    let mut c = ledger(&["a1"]);
    assert!(matches!(
        apply(&mut c, LedgerOp::Adopt { parcel }),
        LedgerReply::Rejected {
            error: LedgerError::ParcelRefused { .. }
        }
    ));
    assert!(c.node("a1").is_some_and(|n| n.usage.pods.is_empty()));
}

#[test]
fn a_node_moved_back_is_its_first_shards_again() {
    let mut a = ledger(&["a1"]);
    let mut b = ledger(&[]);
    commit_now(&mut a, 1, vec![member("m0", "a1")]);
    fence(&mut a, 1, &["a1"]);
    let out = hand_off(&mut a, 1, 2).expect("handoff");
    apply(&mut b, LedgerOp::Adopt { parcel: out });
    apply(&mut a, LedgerOp::DropParcel { move_id: 1 });
    fence(&mut b, 2, &["a1"]);
    let back = hand_off(&mut b, 2, 1).expect("handoff back");
    apply(&mut a, LedgerOp::Adopt { parcel: back });
    assert!(a.moved_nodes().is_empty());
    assert!(a.node("a1").is_some_and(|n| n.moving.is_none()));
    assert!(matches!(
        apply(&mut a, LedgerOp::Release { target: ReleaseTarget::Members(vec![key("m0")]) }),
        LedgerReply::Released { released, .. } if released == [key("m0")]
    ));
    assert_eq!(b.moved_nodes().get("a1"), Some(&1));
}

#[test]
fn moves_are_bounded_and_snapshots_keep_them() {
    let mut a = ledger(&["a1", "a2"]);
    let many: Vec<String> = (0..=MOVE_NODES_MAX).map(|i| format!("n{i}")).collect();
    assert!(matches!(
        apply(
            &mut a,
            LedgerOp::FenceNodes {
                move_id: 1,
                nodes: many
            }
        ),
        LedgerReply::Rejected {
            error: LedgerError::MoveTooLarge { .. }
        }
    ));
    commit_now(&mut a, 1, vec![member("m0", "a1")]);
    fence(&mut a, 4, &["a1", "a2"]);
    hand_off(&mut a, 4, 3).expect("handoff");
    let restored = ShardLedger::restore(&a.snapshot()).expect("restores");
    assert_eq!(restored, a);
    assert_eq!(restored.parcels().len(), 1);
}

#[test]
fn a_node_registered_or_removed_after_the_fence_still_moves_and_stays_moved() {
    let mut a = ledger(&["a1"]);
    // Meta recorded late-1 before its shard had it: the fence names it anyway.
    assert!(
        matches!(fence(&mut a, 9, &["a1", "late-1"]), LedgerReply::Fenced { nodes, .. } if nodes == ["a1", "late-1"])
    );
    apply(
        &mut a,
        LedgerOp::RegisterNode {
            node: node("late-1"),
        },
    );
    assert_eq!(a.node("late-1").and_then(|n| n.moving), Some(9));
    // Removed and registered again: still fenced.
    apply(&mut a, LedgerOp::RemoveNode { name: "a1".into() });
    apply(&mut a, LedgerOp::RegisterNode { node: node("a1") });
    assert_eq!(a.node("a1").and_then(|n| n.moving), Some(9));
    let parcel = hand_off(&mut a, 9, 2).expect("handoff");
    let names: Vec<&str> = parcel.nodes.iter().map(|n| n.node.name.as_str()).collect();
    assert_eq!(names, ["a1", "late-1"]);
    // Every operation naming a moved node answers "moved", removal and heartbeats too.
    for op in [
        LedgerOp::RemoveNode { name: "a1".into() },
        LedgerOp::NodeHeartbeat {
            node: "late-1".into(),
            ready: true,
            lease_ms: 10_000,
        },
        LedgerOp::SetObservedPods {
            node: "a1".into(),
            pods: Vec::new(),
        },
    ] {
        assert!(
            matches!(
                apply(&mut a, op.clone()),
                LedgerReply::Rejected {
                    error: LedgerError::NodeMoved { to: 2, .. }
                }
            ),
            "{op:?}"
        );
    }
}

#[test]
fn a_name_moved_away_and_back_unregistered_is_no_ones_tombstone_and_a_lifted_move_fences_no_more() {
    let mut s = ledger(&["x"]);
    let mut t = ledger(&[]);
    // x moves s → t while registered.
    fence(&mut s, 1, &["x"]);
    let out = hand_off(&mut s, 1, 2).expect("handoff");
    apply(&mut t, LedgerOp::Adopt { parcel: out });
    // Deleted on t, then moved back by name (a domain move) while unregistered.
    apply(&mut t, LedgerOp::RemoveNode { name: "x".into() });
    fence(&mut t, 2, &["x"]);
    let back = hand_off(&mut t, 2, 1).expect("handoff back");
    assert!(back.nodes.is_empty() && back.names == ["x"]);
    apply(&mut s, LedgerOp::Adopt { parcel: back });
    // s owns the name again: x registers there; t refuses it as moved to s.
    assert!(matches!(
        apply(&mut s, LedgerOp::RegisterNode { node: node("x") }),
        LedgerReply::NodeRegistered { .. }
    ));
    assert!(matches!(
        apply(&mut t, LedgerOp::RegisterNode { node: node("x") }),
        LedgerReply::Rejected {
            error: LedgerError::NodeMoved { to: 1, .. }
        }
    ));
    // A move given up fences nothing, even when a stale coordinator asks again.
    fence(&mut s, 3, &["x"]);
    apply(&mut s, LedgerOp::UnfenceNodes { move_id: 3 });
    assert!(matches!(
        fence(&mut s, 3, &["x"]),
        LedgerReply::Rejected {
            error: LedgerError::MoveEnded { move_id: 3 }
        }
    ));
    assert_eq!(s.node("x").and_then(|n| n.moving), None);
}
