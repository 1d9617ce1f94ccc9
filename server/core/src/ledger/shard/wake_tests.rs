//! Each kind of operation wakes what it may help, and nothing else: a test per case
//! and the rule that a refused operation wakes nothing.

use super::*;
use crate::model::Node;

fn node(name: &str, cpu: u64) -> Node {
    Node::new(
        name,
        Resources {
            cpu_milli: cpu * 1_000,
            memory_bytes: 1 << 30,
            pods: 10,
            ..Resources::zero()
        },
    )
}

fn apply(l: &mut ShardLedger, at_ms: u64, op: LedgerOp) -> (LedgerReply, Wake) {
    l.apply_noting_wake(&LedgerCommand { at_ms, op })
}

const NODES: Wake = Wake::NODES;
const ROOM: Wake = Wake::ROOM;

#[test]
fn nodes_added_or_changed_wake_node_waiters_and_the_same_node_again_does_not() {
    let mut l = ShardLedger::new();
    let (_, wake) = apply(
        &mut l,
        0,
        LedgerOp::RegisterNode {
            node: node("n1", 4),
        },
    );
    assert_eq!(wake, NODES);
    let (_, wake) = apply(
        &mut l,
        0,
        LedgerOp::AddNode {
            node: node("n1", 4),
        },
    );
    assert_eq!(wake, Wake::default(), "unchanged");
    let (_, wake) = apply(
        &mut l,
        0,
        LedgerOp::RegisterNode {
            node: node("n1", 8),
        },
    );
    assert_eq!(wake, NODES, "grown");
    let (reply, wake) = apply(
        &mut l,
        0,
        LedgerOp::RemoveNode {
            name: "nowhere".into(),
        },
    );
    assert_eq!(wake, Wake::default(), "{reply:?}");
}

#[test]
fn a_heartbeat_wakes_only_when_the_node_comes_back() {
    let mut l = ShardLedger::new();
    apply(
        &mut l,
        0,
        LedgerOp::RegisterNode {
            node: node("n1", 4),
        },
    );
    let beat = |ready| LedgerOp::NodeHeartbeat {
        node: "n1".into(),
        ready,
        lease_ms: 10_000,
    };
    let (_, first) = apply(&mut l, 0, beat(true));
    assert_eq!(first, NODES, "a lease starts");
    let (_, again) = apply(&mut l, 1_000, beat(true));
    assert_eq!(again, Wake::default(), "a renewal changes nothing");
    let (_, down) = apply(&mut l, 2_000, beat(false));
    assert_eq!(down, NODES);
    let (_, up) = apply(&mut l, 3_000, beat(true));
    assert_eq!(up, NODES, "ready again");
}

#[test]
fn freeing_room_wakes_room_waiters_and_taking_room_wakes_nobody() {
    let mut l = ShardLedger::new();
    apply(
        &mut l,
        0,
        LedgerOp::RegisterNode {
            node: node("n1", 4),
        },
    );
    let member = |i: u32| ReserveMember {
        member: MemberKey::new("ns", "g", &format!("m{i}")),
        node: "n1".into(),
        pod: PodSummary {
            requests: Resources {
                cpu_milli: 1_000,
                ..Resources::zero()
            },
            ..PodSummary::default()
        },
    };
    let (reply, wake) = apply(
        &mut l,
        0,
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(1),
            members: vec![member(0)],
            network: Vec::new(),
        },
    );
    assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
    assert_eq!(wake, Wake::default());
    let (_, wake) = apply(
        &mut l,
        0,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(1)),
        },
    );
    assert_eq!(wake, ROOM);
    let (_, tick) = apply(&mut l, 5_000, LedgerOp::Tick);
    assert_eq!(tick, Wake::default());
}

#[test]
fn a_batch_wakes_what_any_of_its_applied_operations_wakes_and_a_refusal_nothing() {
    let mut l = ShardLedger::new();
    let (_, wake) = apply(
        &mut l,
        0,
        LedgerOp::Batch {
            ops: vec![
                LedgerOp::RegisterNode {
                    node: node("n1", 4),
                },
                LedgerOp::Abort { txn_id: TxnId(9) },
            ],
        },
    );
    assert_eq!(wake, Wake::EVERYTHING);
    let (reply, wake) = apply(
        &mut l,
        0,
        LedgerOp::Batch {
            ops: vec![LedgerOp::Batch { ops: Vec::new() }],
        },
    );
    assert!(matches!(reply, LedgerReply::Batch { .. }), "{reply:?}");
    assert_eq!(wake, Wake::default(), "a nested batch is refused");
    let (_, wake) = apply(
        &mut l,
        0,
        LedgerOp::NodeHeartbeat {
            node: "n1".into(),
            ready: true,
            lease_ms: 1,
        },
    );
    assert_eq!(wake, Wake::default(), "an invalid lease is refused");
}
