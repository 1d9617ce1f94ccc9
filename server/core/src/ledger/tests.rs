//! Ledger tests: command semantics, idempotency, invariants, determinism.
//!
//! Table-style unit tests for each command and property tests over random command
//! sequences (I2 after every command, rejected input changes nothing, two replicas agree
//! byte for byte, snapshot/restore round-trips, I5 after resolving open transactions).

use proptest::prelude::*;

use crate::ledger::command::{
    LedgerCommand, LedgerError, LedgerOp, LedgerReply, NodeChange, ObservedPod, Presence,
    RefusalCause, ReleaseTarget, ReserveMember, TxnId, TxnOutcome,
};
use crate::ledger::shard::{ShardLedger, SnapshotError, FINISHED_TXNS_MAX};
use crate::ledger::usage::SlotState;
use crate::ledger::view::{LedgerView, NodeFit};
use crate::model::gang::MemberKey;
use crate::model::node::{Node, Readiness};
use crate::model::pod::{HostPort, PodSummary, Protocol};
use crate::model::resources::{ResourceName, Resources};
use crate::wire::WireFormat;

const GPU: &str = "nvidia.com/gpu";

fn node(name: &str, cpu_milli: u64, pods: u64) -> Node {
    crate::fixtures::node_with(name, cpu_milli, 1 << 30, pods)
}

fn key(member: &str) -> MemberKey {
    MemberKey::new("ns", "g", member)
}

use crate::fixtures::pod_with_cpu as pod;

fn with_port(mut p: PodSummary, port: u16) -> PodSummary {
    p.host_ports.push(HostPort {
        port,
        protocol: Protocol::Tcp,
    });
    p
}

fn rm(member: &str, node: &str, p: PodSummary) -> ReserveMember {
    ReserveMember {
        member: key(member),
        node: node.to_string(),
        pod: p,
    }
}

use crate::fixtures::apply;

fn reserve(txn: u64, members: Vec<ReserveMember>, deadline_ms: u64) -> LedgerOp {
    LedgerOp::Reserve {
        txn_id: TxnId(txn),
        members,
        deadline_ms,
        network: Vec::new(),
    }
}

fn ledger_with(nodes: &[Node]) -> ShardLedger {
    let mut ledger = ShardLedger::new();
    for n in nodes {
        let reply = apply(&mut ledger, 0, LedgerOp::RegisterNode { node: n.clone() });
        assert!(
            matches!(reply, LedgerReply::NodeRegistered { .. }),
            "{reply:?}"
        );
    }
    ledger
}

fn observed(uid: &str, pod: PodSummary) -> ObservedPod {
    ObservedPod {
        namespace: "kube-system".into(),
        uid: uid.into(),
        pod,
    }
}

fn set_observed(node: &str, pods: Vec<ObservedPod>) -> LedgerOp {
    LedgerOp::SetObservedPods {
        node: node.into(),
        pods,
    }
}

fn rejected(reply: &LedgerReply) -> Option<&LedgerError> {
    match reply {
        LedgerReply::Rejected { error } => Some(error),
        _ => None,
    }
}

#[test]
fn adding_a_node_again_is_accepted_only_unchanged() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let same = apply(
        &mut ledger,
        1,
        LedgerOp::AddNode {
            node: node("n1", 1000, 10),
        },
    );
    assert_eq!(
        same,
        LedgerReply::NodeRegistered {
            name: "n1".into(),
            change: NodeChange::Unchanged
        }
    );
    let other = apply(
        &mut ledger,
        2,
        LedgerOp::AddNode {
            node: node("n1", 2000, 10),
        },
    );
    let Some(LedgerError::NodeDiffers { name, differences }) = rejected(&other) else {
        panic!("a different spec must be refused");
    };
    assert_eq!(name, "n1");
    assert!(differences.starts_with("allocatable ("), "{differences}");
    assert!(!differences.contains("labels"), "{differences}");
    let fresh = apply(
        &mut ledger,
        3,
        LedgerOp::AddNode {
            node: node("n2", 1000, 10),
        },
    );
    assert!(matches!(
        fresh,
        LedgerReply::NodeRegistered {
            change: NodeChange::Added,
            ..
        }
    ));
}

#[test]
fn nodes_register_update_and_remove() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let reply = apply(
        &mut ledger,
        1,
        LedgerOp::RegisterNode {
            node: node("n1", 2000, 10),
        },
    );
    assert_eq!(
        reply,
        LedgerReply::NodeRegistered {
            name: "n1".into(),
            change: NodeChange::Updated
        }
    );
    apply(
        &mut ledger,
        2,
        reserve(1, vec![rm("a", "n1", pod(1500))], 100),
    );
    let shrink = apply(
        &mut ledger,
        3,
        LedgerOp::RegisterNode {
            node: node("n1", 1000, 10),
        },
    );
    assert_eq!(
        rejected(&shrink),
        Some(&LedgerError::AllocatableBelowUsage {
            name: "n1".into(),
            resource: ResourceName::Cpu
        })
    );
    let busy = apply(&mut ledger, 4, LedgerOp::RemoveNode { name: "n1".into() });
    assert!(matches!(
        rejected(&busy),
        Some(LedgerError::NodeInUse { pods: 1, .. })
    ));
    apply(&mut ledger, 5, LedgerOp::Abort { txn_id: TxnId(1) });
    let gone = apply(&mut ledger, 6, LedgerOp::RemoveNode { name: "n1".into() });
    assert_eq!(
        gone,
        LedgerReply::NodeRemoved {
            name: "n1".into(),
            presence: Presence::Removed
        }
    );
    let again = apply(&mut ledger, 7, LedgerOp::RemoveNode { name: "n1".into() });
    assert_eq!(
        again,
        LedgerReply::NodeRemoved {
            name: "n1".into(),
            presence: Presence::Absent
        }
    );
    let bad = apply(
        &mut ledger,
        8,
        LedgerOp::RegisterNode {
            node: node("Bad_Name", 1, 1),
        },
    );
    assert!(
        matches!(rejected(&bad), Some(LedgerError::InvalidNode { message }) if message.starts_with("node.name"))
    );
}

#[test]
fn reserve_is_all_or_nothing_and_retries_return_the_stored_answer() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10), node("n2", 1000, 10)]);
    let before = ledger.snapshot();
    let members = vec![
        rm("a", "n1", pod(600)),
        rm("b", "n2", pod(600)),
        rm("c", "n1", pod(600)),
    ];
    let reply = apply(&mut ledger, 1, reserve(7, members.clone(), 50));
    let LedgerReply::ReserveRefused { txn_id, refusals } = &reply else {
        panic!("expected a refusal, got {reply:?}");
    };
    assert_eq!(*txn_id, TxnId(7));
    assert_eq!(refusals.len(), 1);
    assert_eq!(refusals[0].member, key("c"));
    assert_eq!(
        refusals[0].cause,
        RefusalCause::Insufficient {
            resource: ResourceName::Cpu,
            requested: 1200,
            free: 1000
        }
    );
    assert_eq!(ledger.total_reserved(), Resources::zero());
    assert_eq!(ledger.member_node(&key("a")), None);
    assert_eq!(apply(&mut ledger, 2, reserve(7, members, 50)), reply);
    assert_eq!(ledger.outcome(TxnId(7)), Some(TxnOutcome::Refused));
    assert_ne!(ledger.snapshot(), before, "the no vote is recorded");
}

#[test]
fn reserve_repeat_and_conflict() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let members = vec![rm("a", "n1", pod(500))];
    let first = apply(&mut ledger, 1, reserve(1, members.clone(), 50));
    assert_eq!(
        first,
        LedgerReply::Reserved {
            txn_id: TxnId(1),
            deadline_ms: 50
        }
    );
    let snap = ledger.snapshot();
    assert_eq!(apply(&mut ledger, 2, reserve(1, members, 99)), first);
    assert_eq!(ledger.snapshot(), snap);
    let other = apply(
        &mut ledger,
        3,
        reserve(1, vec![rm("a", "n1", pod(400))], 50),
    );
    assert_eq!(
        rejected(&other),
        Some(&LedgerError::TxnConflict { txn_id: TxnId(1) })
    );
    assert_eq!(ledger.snapshot(), snap);
    let held = apply(&mut ledger, 4, reserve(2, vec![rm("a", "n1", pod(1))], 50));
    assert!(matches!(
        &held,
        LedgerReply::ReserveRefused { refusals, .. } if refusals[0].cause == RefusalCause::MemberHeld { node: "n1".into() }
    ));
}

#[test]
fn commit_abort_and_their_retries() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    apply(
        &mut ledger,
        1,
        reserve(1, vec![rm("a", "n1", pod(500))], 50),
    );
    assert_eq!(
        apply(&mut ledger, 2, LedgerOp::Commit { txn_id: TxnId(1) }),
        LedgerReply::Committed { txn_id: TxnId(1) }
    );
    assert_eq!(
        apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(1) }),
        LedgerReply::Committed { txn_id: TxnId(1) }
    );
    let abort = apply(&mut ledger, 4, LedgerOp::Abort { txn_id: TxnId(1) });
    assert_eq!(
        rejected(&abort),
        Some(&LedgerError::TxnCommitted { txn_id: TxnId(1) })
    );
    let late = apply(
        &mut ledger,
        5,
        reserve(1, vec![rm("a", "n1", pod(500))], 50),
    );
    assert_eq!(
        late,
        LedgerReply::AlreadyFinished {
            txn_id: TxnId(1),
            outcome: TxnOutcome::Committed
        }
    );
    let Some(entry) = ledger.node("n1") else {
        panic!("n1 registered");
    };
    assert_eq!(entry.usage.committed.cpu_milli, 500);
    assert_eq!(entry.usage.reserved, Resources::zero());

    apply(
        &mut ledger,
        6,
        reserve(2, vec![rm("b", "n1", pod(500))], 50),
    );
    assert_eq!(
        apply(&mut ledger, 7, LedgerOp::Abort { txn_id: TxnId(2) }),
        LedgerReply::Aborted { txn_id: TxnId(2) }
    );
    assert_eq!(
        apply(&mut ledger, 8, LedgerOp::Abort { txn_id: TxnId(2) }),
        LedgerReply::Aborted { txn_id: TxnId(2) }
    );
    let commit = apply(&mut ledger, 9, LedgerOp::Commit { txn_id: TxnId(2) });
    assert_eq!(
        rejected(&commit),
        Some(&LedgerError::TxnNotCommittable {
            txn_id: TxnId(2),
            outcome: TxnOutcome::Aborted
        })
    );
    let unknown = apply(&mut ledger, 10, LedgerOp::Commit { txn_id: TxnId(99) });
    assert_eq!(
        rejected(&unknown),
        Some(&LedgerError::UnknownTxn { txn_id: TxnId(99) })
    );
}

#[test]
fn abort_before_reserve_leaves_a_tombstone() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    assert_eq!(
        apply(&mut ledger, 1, LedgerOp::Abort { txn_id: TxnId(5) }),
        LedgerReply::Aborted { txn_id: TxnId(5) }
    );
    let late = apply(
        &mut ledger,
        2,
        reserve(5, vec![rm("a", "n1", pod(500))], 50),
    );
    assert_eq!(
        late,
        LedgerReply::AlreadyFinished {
            txn_id: TxnId(5),
            outcome: TxnOutcome::Aborted
        }
    );
    assert_eq!(ledger.member_node(&key("a")), None);
}

#[test]
fn reserve_and_commit_in_one_entry() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let op = LedgerOp::ReserveAndCommit {
        txn_id: TxnId(3),
        members: vec![rm("a", "n1", pod(300)), rm("b", "n1", pod(300))],
        network: Vec::new(),
    };
    assert_eq!(
        apply(&mut ledger, 1, op.clone()),
        LedgerReply::Committed { txn_id: TxnId(3) }
    );
    assert_eq!(
        apply(&mut ledger, 2, op),
        LedgerReply::Committed { txn_id: TxnId(3) }
    );
    assert!(matches!(
        ledger.slot(&key("b")).map(|s| s.state),
        Some(SlotState::Committed {
            txn_id: TxnId(3),
            at_ms: 1
        })
    ));
    assert!(ledger.open_txns().is_empty());
}

#[test]
fn host_ports_conflict_with_placed_pods_and_within_the_batch() {
    let mut ledger = ledger_with(&[node("n1", 4000, 10)]);
    let reply = apply(
        &mut ledger,
        1,
        reserve(
            1,
            vec![
                rm("a", "n1", with_port(pod(1), 80)),
                rm("b", "n1", with_port(pod(1), 80)),
            ],
            50,
        ),
    );
    assert!(matches!(
        &reply,
        LedgerReply::ReserveRefused { refusals, .. }
            if refusals.len() == 1 && refusals[0].member == key("b")
                && matches!(refusals[0].cause, RefusalCause::HostPortInUse { .. })
    ));
    apply(
        &mut ledger,
        2,
        reserve(2, vec![rm("a", "n1", with_port(pod(1), 80))], 50),
    );
    let reply = apply(
        &mut ledger,
        3,
        reserve(3, vec![rm("c", "n1", with_port(pod(1), 80))], 50),
    );
    assert!(matches!(reply, LedgerReply::ReserveRefused { .. }));
    let udp = PodSummary {
        host_ports: vec![HostPort {
            port: 80,
            protocol: Protocol::Udp,
        }],
        ..pod(1)
    };
    let reply = apply(&mut ledger, 4, reserve(4, vec![rm("d", "n1", udp)], 50));
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
}

#[test]
fn refusals_for_unknown_and_unready_nodes_and_extended_resources() {
    let mut sick = node("n2", 1000, 10);
    sick.readiness = Readiness::NotReady;
    let mut ledger = ledger_with(&[node("n1", 1000, 10), sick]);
    let mut gpu = pod(1);
    gpu.requests.set(&ResourceName::Extended(GPU.into()), 1);
    let reply = apply(
        &mut ledger,
        1,
        reserve(
            1,
            vec![
                rm("a", "n9", pod(1)),
                rm("b", "n2", pod(1)),
                rm("c", "n1", gpu),
            ],
            50,
        ),
    );
    let LedgerReply::ReserveRefused { refusals, .. } = reply else {
        panic!("expected refusal");
    };
    let causes: Vec<_> = refusals.into_iter().map(|r| r.cause).collect();
    assert_eq!(causes[0], RefusalCause::UnknownNode);
    assert_eq!(causes[1], RefusalCause::NodeNotReady);
    assert!(
        matches!(&causes[2], RefusalCause::Insufficient { resource: ResourceName::Extended(n), .. } if n == GPU)
    );
}

#[test]
fn pods_allocatable_counts_one_per_member() {
    let mut ledger = ledger_with(&[node("n1", 10_000, 2)]);
    let reply = apply(
        &mut ledger,
        1,
        reserve(
            1,
            vec![
                rm("a", "n1", pod(0)),
                rm("b", "n1", pod(0)),
                rm("c", "n1", pod(0)),
            ],
            50,
        ),
    );
    assert!(matches!(
        &reply,
        LedgerReply::ReserveRefused { refusals, .. }
            if refusals[0].cause == RefusalCause::Insufficient { resource: ResourceName::Pods, requested: 3, free: 2 }
    ));
}

#[test]
fn bad_reservations_change_nothing() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let snap = ledger.snapshot();
    let mut zero_entry = pod(1);
    zero_entry.requests.extended.insert(GPU.into(), 0);
    let mut with_pods = pod(1);
    with_pods.requests.pods = 3;
    let cases = [
        (reserve(1, vec![], 50), "EmptyReservation"),
        (
            reserve(1, vec![rm("a", "n1", pod(1)), rm("a", "n1", pod(1))], 50),
            "DuplicateMember",
        ),
        (
            reserve(1, vec![rm("a", "n1", pod(1))], 10),
            "DeadlinePassed",
        ),
        // No coordinator holds a reservation for ever: a forged deadline is refused.
        (
            reserve(1, vec![rm("a", "n1", pod(1))], u64::MAX),
            "HoldTooLong",
        ),
        (
            reserve(1, vec![rm("a", "n1", zero_entry)], 50),
            "InvalidMember",
        ),
        (
            reserve(1, vec![rm("a", "n1", with_pods)], 50),
            "InvalidMember",
        ),
        (
            reserve(
                1,
                vec![ReserveMember {
                    member: MemberKey::new("n/s", "g", "a"),
                    node: "n1".into(),
                    pod: pod(1),
                }],
                50,
            ),
            "InvalidMember",
        ),
    ];
    for (op, expected) in cases {
        let reply = apply(&mut ledger, 10, op);
        let error = rejected(&reply)
            .map(|e| format!("{e:?}"))
            .unwrap_or_default();
        assert!(error.starts_with(expected), "{reply:?}");
        assert_eq!(ledger.snapshot(), snap);
    }
}

#[test]
fn a_member_naming_its_pod_learns_the_uid_when_bound() {
    use crate::model::PodBinding;
    use crate::query::{named_bound, unbound, ShardAnswer, Victims};
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let named = PodSummary {
        binding: PodBinding::Named,
        ..pod(100)
    };
    let ingested = PodSummary {
        uid: Some("uid-b".into()),
        ..pod(100)
    };
    let plain = pod(100);
    let members = vec![
        rm("a", "n1", named),
        rm("b", "n1", ingested),
        rm("c", "n1", plain),
    ];
    apply(&mut ledger, 1, reserve(1, members, 50));
    apply(&mut ledger, 2, LedgerOp::Commit { txn_id: TxnId(1) });
    let waiting = |ledger: &ShardLedger| match unbound(ledger, 10, Victims::Wait) {
        ShardAnswer::Unbound { members } => members
            .into_iter()
            .map(|m| m.member.member)
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        waiting(&ledger),
        ["a", "b"],
        "a named member waits without a uid; a plain one never"
    );
    for (member, uid) in [("a", "uid-a"), ("b", "uid-other")] {
        let op = LedgerOp::BindConfirmed {
            member: key(member),
            uid: Some(uid.into()),
        };
        assert!(rejected(&apply(&mut ledger, 3, op)).is_none());
    }
    assert!(waiting(&ledger).is_empty());
    assert_eq!(
        ledger
            .slot(&key("a"))
            .and_then(|s| s.pod.uid.clone())
            .as_deref(),
        Some("uid-a")
    );
    assert_eq!(
        ledger
            .slot(&key("b"))
            .and_then(|s| s.pod.uid.clone())
            .as_deref(),
        Some("uid-b"),
        "an ingested pod's uid never changes"
    );
    assert_eq!(
        named_bound(&ledger, 10),
        ShardAnswer::NamedBound {
            members: vec![(key("a"), "uid-a".to_string())]
        }
    );
}

#[test]
fn release_and_bind() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    apply(
        &mut ledger,
        1,
        reserve(
            1,
            vec![rm("a", "n1", pod(100)), rm("b", "n1", pod(100))],
            50,
        ),
    );
    let early = apply(
        &mut ledger,
        2,
        LedgerOp::Release {
            target: ReleaseTarget::Members(vec![key("a")]),
        },
    );
    assert_eq!(
        rejected(&early),
        Some(&LedgerError::MemberReserved {
            member: key("a"),
            txn_id: TxnId(1)
        })
    );
    let bind_early = apply(
        &mut ledger,
        3,
        LedgerOp::BindConfirmed {
            member: key("a"),
            uid: None,
        },
    );
    assert!(matches!(
        rejected(&bind_early),
        Some(LedgerError::NotCommitted { .. })
    ));
    apply(&mut ledger, 4, LedgerOp::Commit { txn_id: TxnId(1) });
    assert_eq!(
        apply(
            &mut ledger,
            5,
            LedgerOp::BindConfirmed {
                member: key("a"),
                uid: None
            }
        ),
        LedgerReply::BindRecorded { member: key("a") }
    );
    assert_eq!(
        apply(
            &mut ledger,
            6,
            LedgerOp::BindConfirmed {
                member: key("a"),
                uid: None
            }
        ),
        LedgerReply::BindRecorded { member: key("a") }
    );
    assert!(matches!(
        ledger.slot(&key("a")).map(|s| s.state),
        Some(SlotState::Bound { at_ms: 5, .. })
    ));
    let released = apply(
        &mut ledger,
        7,
        LedgerOp::Release {
            target: ReleaseTarget::Members(vec![key("a"), key("zz"), key("a")]),
        },
    );
    assert_eq!(
        released,
        LedgerReply::Released {
            released: vec![key("a")],
            absent: vec![key("zz")]
        }
    );
    let rest = apply(
        &mut ledger,
        8,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(1)),
        },
    );
    assert_eq!(
        rest,
        LedgerReply::Released {
            released: vec![key("b")],
            absent: vec![]
        }
    );
    let unknown = apply(
        &mut ledger,
        9,
        LedgerOp::BindConfirmed {
            member: key("b"),
            uid: None,
        },
    );
    assert_eq!(
        rejected(&unknown),
        Some(&LedgerError::UnknownMember { member: key("b") })
    );
    let Some(entry) = ledger.node("n1") else {
        panic!("n1 registered");
    };
    assert!(entry.usage.committed.is_zero() && entry.usage.pods.is_empty());
}

#[test]
fn release_of_an_open_txn_aborts_it() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    apply(
        &mut ledger,
        1,
        reserve(1, vec![rm("a", "n1", pod(100))], 50),
    );
    let reply = apply(
        &mut ledger,
        2,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(1)),
        },
    );
    assert_eq!(
        reply,
        LedgerReply::Released {
            released: vec![key("a")],
            absent: vec![]
        }
    );
    assert_eq!(ledger.outcome(TxnId(1)), Some(TxnOutcome::Aborted));
    assert_eq!(ledger.total_reserved(), Resources::zero());
}

#[test]
fn tick_reports_expired_reservations_without_dropping_them() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    apply(
        &mut ledger,
        1,
        reserve(1, vec![rm("a", "n1", pod(100))], 50),
    );
    apply(
        &mut ledger,
        1,
        reserve(2, vec![rm("b", "n1", pod(100))], 80),
    );
    assert_eq!(
        apply(&mut ledger, 49, LedgerOp::Tick),
        LedgerReply::Expired {
            txn_ids: vec![],
            evictions: vec![],
            lapsed: vec![]
        }
    );
    assert_eq!(
        apply(&mut ledger, 50, LedgerOp::Tick),
        LedgerReply::Expired {
            txn_ids: vec![TxnId(1)],
            evictions: vec![],
            lapsed: vec![]
        }
    );
    assert_eq!(
        apply(&mut ledger, 500, LedgerOp::Tick),
        LedgerReply::Expired {
            txn_ids: vec![TxnId(1), TxnId(2)],
            evictions: vec![],
            lapsed: vec![]
        }
    );
    assert_eq!(ledger.open_txns().len(), 2);
    assert_eq!(
        apply(&mut ledger, 501, LedgerOp::Commit { txn_id: TxnId(1) }),
        LedgerReply::Committed { txn_id: TxnId(1) }
    );
}

fn heartbeat(node: &str, ready: bool, lease_ms: u64) -> LedgerOp {
    LedgerOp::NodeHeartbeat {
        node: node.to_string(),
        ready,
        lease_ms,
    }
}

fn readiness(ledger: &ShardLedger, name: &str) -> Option<Readiness> {
    ledger.node(name).map(|e| e.node.readiness)
}

#[test]
fn a_lapsed_lease_makes_the_node_not_ready_until_the_next_heartbeat() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10), node("n2", 1000, 10)]);
    let reply = apply(&mut ledger, 100, heartbeat("n1", true, 1_000));
    assert_eq!(
        reply,
        LedgerReply::HeartbeatRecorded {
            node: "n1".to_string(),
            readiness: Readiness::Ready,
            lease_until_ms: 1_100
        }
    );
    // A renewal moves the lapse time; the old one no longer counts.
    apply(&mut ledger, 900, heartbeat("n1", true, 1_000));
    let tick = apply(&mut ledger, 1_100, LedgerOp::Tick);
    assert!(matches!(tick, LedgerReply::Expired { ref lapsed, .. } if lapsed.is_empty()));
    assert_eq!(readiness(&ledger, "n1"), Some(Readiness::Ready));
    let tick = apply(&mut ledger, 1_900, LedgerOp::Tick);
    assert!(
        matches!(tick, LedgerReply::Expired { ref lapsed, .. } if lapsed == &["n1".to_string()]),
        "{tick:?}"
    );
    assert_eq!(readiness(&ledger, "n1"), Some(Readiness::NotReady));
    // A node that never sent a heartbeat has no lease to lapse.
    assert_eq!(readiness(&ledger, "n2"), Some(Readiness::Ready));
    // Not ready: reservations are refused.
    let refused = apply(
        &mut ledger,
        2_000,
        reserve(1, vec![rm("a", "n1", pod(100))], 9_000),
    );
    let LedgerReply::ReserveRefused { refusals, .. } = refused else {
        panic!("expected refusal, got {refused:?}");
    };
    assert_eq!(refusals[0].cause, RefusalCause::NodeNotReady);
    ledger.check_invariants().expect("invariants");
    apply(&mut ledger, 2_100, heartbeat("n1", true, 1_000));
    assert_eq!(readiness(&ledger, "n1"), Some(Readiness::Ready));
    ledger.check_invariants().expect("invariants");
    // The restored ledger rebuilds the lease index: the lease lapses there too.
    let mut restored = ShardLedger::restore(&ledger.snapshot()).expect("restore");
    let tick = apply(&mut restored, 3_100, LedgerOp::Tick);
    assert!(matches!(tick, LedgerReply::Expired { ref lapsed, .. } if lapsed.len() == 1));
}

#[test]
fn heartbeats_report_not_ready_and_refuse_bad_leases() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    apply(&mut ledger, 0, heartbeat("n1", false, 5_000));
    assert_eq!(readiness(&ledger, "n1"), Some(Readiness::NotReady));
    assert_eq!(
        apply(&mut ledger, 0, heartbeat("n1", true, 10)),
        LedgerReply::Rejected {
            error: LedgerError::InvalidLease { lease_ms: 10 }
        }
    );
    assert_eq!(readiness(&ledger, "n1"), Some(Readiness::NotReady));
    assert_eq!(
        apply(&mut ledger, 0, heartbeat("ghost", true, 5_000)),
        LedgerReply::Rejected {
            error: LedgerError::UnknownNode {
                name: "ghost".to_string()
            }
        }
    );
    // Removing a node drops its lease from the index.
    assert!(matches!(
        apply(&mut ledger, 1, LedgerOp::RemoveNode { name: "n1".into() }),
        LedgerReply::NodeRemoved { .. }
    ));
    ledger.check_invariants().expect("invariants");
}

#[test]
fn finished_records_are_bounded() {
    let mut ledger = ShardLedger::new();
    let extra = 5u64;
    for i in 0..(FINISHED_TXNS_MAX as u64 + extra) {
        apply(&mut ledger, i, LedgerOp::Abort { txn_id: TxnId(i) });
    }
    assert_eq!(ledger.finished_count(), FINISHED_TXNS_MAX);
    assert_eq!(ledger.outcome(TxnId(0)), None);
    assert_eq!(ledger.outcome(TxnId(extra)), Some(TxnOutcome::Aborted));
    assert_eq!(ledger.check_invariants(), Ok(()));
}

#[test]
fn restore_refuses_garbage_and_inconsistent_snapshots() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    apply(
        &mut ledger,
        1,
        reserve(1, vec![rm("a", "n1", pod(800))], 50),
    );
    assert!(matches!(
        ShardLedger::restore(b"not json"),
        Err(SnapshotError::Decode(_))
    ));
    let text = String::from_utf8(ledger.snapshot_as(WireFormat::Json)).unwrap_or_default();
    let shrunk = text.replacen("\"cpu_milli\":1000", "\"cpu_milli\":700", 1);
    assert_ne!(shrunk, text);
    assert!(matches!(
        ShardLedger::restore(shrunk.as_bytes()),
        Err(SnapshotError::Invariant(_))
    ));
    let future = text.replacen("\"format\":1", "\"format\":9", 1);
    assert_eq!(
        ShardLedger::restore(future.as_bytes()),
        Err(SnapshotError::Format { found: 9 })
    );
    let twin_seq = {
        let mut l = ledger.clone();
        apply(&mut l, 2, LedgerOp::Abort { txn_id: TxnId(8) });
        apply(&mut l, 3, LedgerOp::Abort { txn_id: TxnId(9) });
        let t = String::from_utf8(l.snapshot_as(WireFormat::Json)).unwrap_or_default();
        t.replacen("\"seq\":1", "\"seq\":0", 1)
    };
    assert!(matches!(
        ShardLedger::restore(twin_seq.as_bytes()),
        Err(SnapshotError::Invariant(_))
    ));
    let restored = ShardLedger::restore(text.as_bytes());
    assert_eq!(restored.as_ref().ok(), Some(&ledger));
    let binary = ShardLedger::restore(&ledger.snapshot());
    assert_eq!(binary.as_ref().ok(), Some(&ledger));
    assert!(matches!(
        ShardLedger::restore(&[crate::wire::BINARY_V1, 0xC1]),
        Err(SnapshotError::Decode(_))
    ));
}

#[test]
fn nodes_are_indexed_in_name_order_with_fresh_summaries() {
    let mut ledger = ledger_with(&[
        node("n2", 2000, 10),
        node("n0", 1000, 10),
        node("n1", 4000, 10),
    ]);
    let text = String::from_utf8(ledger.snapshot_as(WireFormat::Json)).unwrap_or_default();
    let (n0, n1, n2) = (
        text.find("\"n0\":"),
        text.find("\"n1\":"),
        text.find("\"n2\":"),
    );
    assert!(n0 < n1 && n1 < n2, "encoded as a name-ordered map: {text}");
    let stamps = |l: &ShardLedger| -> Vec<u64> {
        let view = l.indexed().expect("the shard ledger keeps an indexed view");
        (0..view.len()).filter_map(|i| view.stamp(i)).collect()
    };
    let summaries_agree = |l: &ShardLedger| {
        let view = l.indexed().expect("indexed");
        let listed = l.node_views();
        assert_eq!(view.len(), listed.len());
        for (i, nv) in listed.iter().enumerate() {
            let at = view.node(i).expect("in range");
            assert_eq!(at.node.name, nv.node.name);
            assert_eq!(view.fits()[i], NodeFit::of(nv.node, nv.usage));
        }
    };
    summaries_agree(&ledger);
    let before = stamps(&ledger);
    assert!(before.iter().all(|s| *s != 0));
    apply(
        &mut ledger,
        1,
        reserve(1, vec![rm("a", "n1", with_port(pod(500), 80))], 50),
    );
    summaries_agree(&ledger);
    let after = stamps(&ledger);
    assert_eq!(
        (after[0], after[2]),
        (before[0], before[2]),
        "untouched nodes keep theirs"
    );
    assert_ne!(after[1], before[1], "the changed node gets a new stamp");
    let fit = ledger.indexed().map(|v| v.fits()[1]).unwrap_or_default();
    assert_eq!(fit.requested[0], 500);
    assert!(fit.has(NodeFit::HOST_PORTS));
    // A clone is the same node states; from then on each side changes on its own.
    let mut twin = ledger.clone();
    assert_eq!(stamps(&twin), after);
    apply(&mut twin, 2, LedgerOp::Commit { txn_id: TxnId(1) });
    apply(&mut ledger, 2, LedgerOp::Abort { txn_id: TxnId(1) });
    assert_ne!(stamps(&twin)[1], stamps(&ledger)[1]);
    summaries_agree(&twin);
    summaries_agree(&ledger);
    // Restored nodes are indexed again; stamps are not state.
    let restored = ShardLedger::restore(&twin.snapshot());
    assert_eq!(restored.as_ref().ok(), Some(&twin));
    if let Ok(restored) = &restored {
        summaries_agree(restored);
        assert_ne!(stamps(restored), stamps(&twin));
    }
    apply(&mut ledger, 3, LedgerOp::RemoveNode { name: "n0".into() });
    summaries_agree(&ledger);
    assert_eq!(ledger.check_invariants(), Ok(()));
}

#[test]
fn a_snapshot_with_a_node_under_another_name_is_refused() {
    let ledger = ledger_with(&[node("n1", 1000, 10)]);
    let text = String::from_utf8(ledger.snapshot_as(WireFormat::Json)).unwrap_or_default();
    let renamed = text.replacen("\"n1\":", "\"n9\":", 1);
    assert_ne!(renamed, text);
    assert!(matches!(
        ShardLedger::restore(renamed.as_bytes()),
        Err(SnapshotError::Invariant(_))
    ));
}

// ---- property tests ------------------------------------------------------------------------

const NODE_NAMES: [&str; 4] = ["n0", "n1", "n2", "n9"];
const UIDS: [&str; 3] = ["u1", "u2", "u3"];
const MEMBERS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn arb_node() -> impl Strategy<Value = Node> {
    (0usize..3, 0u64..4, 0u64..4, any::<bool>(), 0u64..3).prop_map(|(i, cpu, pods, ready, gpus)| {
        let mut n = node(NODE_NAMES[i], cpu * 1000, pods);
        n.allocatable.set(&ResourceName::Extended(GPU.into()), gpus);
        if !ready {
            n.readiness = Readiness::NotReady;
        }
        n
    })
}

fn arb_summary() -> impl Strategy<Value = PodSummary> {
    (
        0u64..3,
        0u64..2,
        prop::option::of(80u16..82),
        prop_oneof![Just(0u64), Just(1), Just(u64::MAX)],
    )
        .prop_map(|(cpu, gpus, port, huge_mem)| {
            let mut p = pod(cpu * 500);
            p.requests.memory_bytes = huge_mem;
            p.requests.set(&ResourceName::Extended(GPU.into()), gpus);
            match port {
                Some(port) => with_port(p, port),
                None => p,
            }
        })
}

fn arb_member() -> impl Strategy<Value = ReserveMember> {
    (
        0usize..MEMBERS.len(),
        0usize..NODE_NAMES.len(),
        arb_summary(),
    )
        .prop_map(|(m, n, p)| rm(MEMBERS[m], NODE_NAMES[n], p))
}

fn arb_op() -> impl Strategy<Value = LedgerOp> {
    let txn = || (0u64..6).prop_map(TxnId);
    prop_oneof![
        2 => arb_node().prop_map(|node| LedgerOp::RegisterNode { node }),
        1 => (0usize..NODE_NAMES.len()).prop_map(|i| LedgerOp::RemoveNode { name: NODE_NAMES[i].into() }),
        5 => (txn(), prop::collection::vec(arb_member(), 0..4), 0u64..60)
            .prop_map(|(txn_id, members, deadline_ms)| LedgerOp::Reserve { txn_id, members, deadline_ms, network: Vec::new() }),
        1 => (txn(), prop::collection::vec(arb_member(), 0..3))
            .prop_map(|(txn_id, members)| LedgerOp::ReserveAndCommit { txn_id, members, network: Vec::new() }),
        3 => txn().prop_map(|txn_id| LedgerOp::Commit { txn_id }),
        3 => txn().prop_map(|txn_id| LedgerOp::Abort { txn_id }),
        1 => txn().prop_map(|t| LedgerOp::Release { target: ReleaseTarget::Txn(t) }),
        1 => prop::collection::vec(0usize..MEMBERS.len(), 0..3)
            .prop_map(|ms| LedgerOp::Release { target: ReleaseTarget::Members(ms.into_iter().map(|m| key(MEMBERS[m])).collect()) }),
        1 => (0usize..MEMBERS.len()).prop_map(|m| LedgerOp::BindConfirmed { member: key(MEMBERS[m]), uid: None }),
        1 => Just(LedgerOp::Tick),
        1 => (0usize..NODE_NAMES.len(), any::<bool>(), prop_oneof![Just(1_000u64), Just(1_100), Just(5)])
            .prop_map(|(n, ready, lease_ms)| heartbeat(NODE_NAMES[n], ready, lease_ms)),
        2 => (0usize..NODE_NAMES.len(), prop::collection::vec((0usize..3, arb_summary()), 0..3))
            .prop_map(|(n, pods)| LedgerOp::SetObservedPods {
                node: NODE_NAMES[n].into(),
                pods: pods.into_iter().map(|(u, pod)| observed(UIDS[u], pod)).collect(),
            }),
    ]
}

fn arb_commands() -> impl Strategy<Value = Vec<LedgerCommand>> {
    prop::collection::vec((0u64..40, arb_op()), 1..60).prop_map(|steps| {
        let mut at_ms = 0;
        steps
            .into_iter()
            .map(|(delta, op)| {
                at_ms += delta;
                LedgerCommand::new(at_ms, op)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn invariants_hold_and_rejections_change_nothing(commands in arb_commands()) {
        let mut ledger = ShardLedger::new();
        for cmd in &commands {
            let before = ledger.snapshot();
            let reply = ledger.apply(cmd);
            prop_assert_eq!(ledger.check_invariants(), Ok(()));
            if rejected(&reply).is_some() {
                prop_assert_eq!(ledger.snapshot(), before);
            }
            // Something is reserved exactly while some transaction is open.
            prop_assert_eq!(ledger.total_reserved().is_zero(), ledger.open_txns().is_empty());
        }
    }

    #[test]
    fn replicas_agree_and_snapshots_round_trip(commands in arb_commands()) {
        // The restored replica keeps agreeing with the original on further commands.
        let first: Vec<_> = commands.iter().take(10).cloned().collect();
        crate::fixtures::replicas_agree(&commands, &first)?;
    }

    #[test]
    fn every_reservation_ends(commands in arb_commands(), commit_first in any::<bool>()) {
        let mut ledger = ShardLedger::new();
        let mut at_ms = 0;
        for cmd in &commands {
            ledger.apply(cmd);
            at_ms = cmd.at_ms;
        }
        let open: Vec<TxnId> = ledger.open_txns().keys().copied().collect();
        for (i, txn_id) in open.into_iter().enumerate() {
            let op = if commit_first && i % 2 == 0 {
                LedgerOp::Commit { txn_id }
            } else {
                LedgerOp::Abort { txn_id }
            };
            let reply = ledger.apply(&LedgerCommand::new(at_ms, op));
            prop_assert!(matches!(reply, LedgerReply::Committed { .. } | LedgerReply::Aborted { .. }), "{:?}", reply);
        }
        prop_assert!(ledger.open_txns().is_empty());
        prop_assert!(ledger.total_reserved().is_zero());
        for entry in ledger.nodes() {
            prop_assert!(entry.usage.pods.values().all(|slot| !slot.state.is_reserved()));
        }
        prop_assert_eq!(ledger.check_invariants(), Ok(()));
    }
}

#[test]
fn a_batch_applies_each_operation_as_if_alone() {
    let mut alone = ledger_with(&[node("n1", 1000, 10)]);
    let mut batched = alone.clone();
    let ops = vec![
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(1),
            members: vec![rm("a", "n1", pod(600))],
            network: Vec::new(),
        },
        // Does not fit after the first: refused, and the batch goes on.
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(2),
            members: vec![rm("b", "n1", pod(600))],
            network: Vec::new(),
        },
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(3),
            members: vec![rm("c", "n1", pod(300))],
            network: Vec::new(),
        },
    ];
    let expected: Vec<LedgerReply> = ops
        .iter()
        .map(|op| apply(&mut alone, 5, op.clone()))
        .collect();
    let reply = apply(&mut batched, 5, LedgerOp::Batch { ops });
    assert_eq!(reply, LedgerReply::Batch { replies: expected });
    assert_eq!(batched.snapshot(), alone.snapshot());
    batched.check_invariants().expect("invariants");

    let nested = apply(
        &mut batched,
        6,
        LedgerOp::Batch {
            ops: vec![LedgerOp::Batch { ops: vec![] }],
        },
    );
    assert_eq!(
        nested,
        LedgerReply::Batch {
            replies: vec![LedgerReply::Rejected {
                error: LedgerError::NestedBatch
            }]
        }
    );
    let too_many = vec![LedgerOp::Tick; crate::ledger::command::LEDGER_BATCH_MAX + 1];
    assert!(matches!(
        apply(&mut batched, 7, LedgerOp::Batch { ops: too_many }),
        LedgerReply::Rejected {
            error: LedgerError::BatchTooLarge { .. }
        }
    ));
    assert_eq!(batched.snapshot(), alone.snapshot());
}

#[test]
fn observed_pods_take_room_but_are_never_refused_released_or_bound() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let ds = observed("u1", with_port(pod(600), 9100));
    let reply = apply(&mut ledger, 1, set_observed("n1", vec![ds.clone()]));
    assert!(
        matches!(&reply, LedgerReply::ObservedPodsSet { added: 1, removed: 0, conflicts, .. } if conflicts.is_empty()),
        "{reply:?}"
    );
    // 400m left: a 600m member is refused, and so is the observed pod's port.
    let refused = apply(
        &mut ledger,
        2,
        reserve(1, vec![rm("a", "n1", pod(600))], 50),
    );
    assert!(
        matches!(refused, LedgerReply::ReserveRefused { .. }),
        "{refused:?}"
    );
    let port = apply(
        &mut ledger,
        2,
        reserve(2, vec![rm("a", "n1", with_port(pod(100), 9100))], 50),
    );
    assert!(
        matches!(port, LedgerReply::ReserveRefused { .. }),
        "{port:?}"
    );
    let fits = apply(
        &mut ledger,
        3,
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(3),
            members: vec![rm("a", "n1", pod(400))],
            network: Vec::new(),
        },
    );
    assert_eq!(fits, LedgerReply::Committed { txn_id: TxnId(3) });
    // A second observed pod overcommits the node: recorded anyway (it is a fact).
    let more = apply(
        &mut ledger,
        4,
        set_observed(
            "n1",
            vec![ds.clone(), observed("u2", with_port(pod(500), 9100))],
        ),
    );
    match &more {
        LedgerReply::ObservedPodsSet {
            added: 1,
            removed: 0,
            conflicts,
            ..
        } => assert_eq!(conflicts.len(), 1, "the second 9100 is left out"),
        other => panic!("{other:?}"),
    }
    ledger
        .check_invariants()
        .expect("observed overcommit is not an I2 violation");
    let observed_key = ds.member_key();
    assert_eq!(
        rejected(&apply(
            &mut ledger,
            5,
            LedgerOp::Release {
                target: ReleaseTarget::Members(vec![observed_key.clone()])
            }
        )),
        Some(&LedgerError::ObservedMember {
            member: observed_key.clone()
        })
    );
    assert_eq!(
        rejected(&apply(
            &mut ledger,
            5,
            LedgerOp::BindConfirmed {
                member: observed_key,
                uid: None,
            }
        )),
        Some(&LedgerError::ObservedMember {
            member: ds.member_key()
        })
    );
    // Gone from the API server: the room comes back (u1 and u2 leave, gangway's pod stays).
    let cleared = apply(&mut ledger, 6, set_observed("n1", vec![]));
    assert!(
        matches!(
            cleared,
            LedgerReply::ObservedPodsSet {
                added: 0,
                removed: 2,
                ..
            }
        ),
        "{cleared:?}"
    );
    let entry = ledger.node("n1").expect("n1");
    assert!(entry.usage.observed.is_zero());
    assert_eq!(entry.usage.pods.len(), 1);
    ledger.check_invariants().expect("invariants");
}

#[test]
fn a_node_with_only_observed_pods_can_be_removed_and_bad_lists_change_nothing() {
    let mut ledger = ledger_with(&[node("n1", 1000, 10)]);
    let before = ledger.snapshot();
    let twice = set_observed("n1", vec![observed("u1", pod(1)), observed("u1", pod(2))]);
    assert!(matches!(
        rejected(&apply(&mut ledger, 1, twice)),
        Some(LedgerError::InvalidObservedPod { message, .. }) if message.contains("pods[1].uid")
    ));
    let unknown = set_observed("n7", vec![observed("u1", pod(1))]);
    assert!(matches!(
        rejected(&apply(&mut ledger, 1, unknown)),
        Some(LedgerError::UnknownNode { .. })
    ));
    let mut bad_key = observed("u/1", pod(1));
    bad_key.namespace = String::new();
    assert!(rejected(&apply(&mut ledger, 1, set_observed("n1", vec![bad_key]))).is_some());
    assert_eq!(ledger.snapshot(), before);

    apply(
        &mut ledger,
        2,
        set_observed("n1", vec![observed("u1", pod(100))]),
    );
    let removed = apply(&mut ledger, 3, LedgerOp::RemoveNode { name: "n1".into() });
    assert_eq!(
        removed,
        LedgerReply::NodeRemoved {
            name: "n1".into(),
            presence: Presence::Removed
        }
    );
    ledger.check_invariants().expect("invariants");
    // The same uid may appear on a new node.
    let mut ledger = ledger_with(&[node("n2", 1000, 10)]);
    apply(
        &mut ledger,
        4,
        set_observed("n2", vec![observed("u1", pod(100))]),
    );
    ledger.check_invariants().expect("invariants");
}

/// The label of `key` on `node`, as the ledger keeps it.
fn kept_label(ledger: &ShardLedger, node: &str, key: &str) -> crate::model::Symbol {
    let view = ledger.node_view(node).expect("registered");
    let (_, value) = view
        .node
        .labels
        .iter()
        .find(|(k, _)| k.as_str() == key)
        .expect("labelled");
    value.clone()
}

fn zoned(name: &str, zone: &str) -> Node {
    let mut n = node(name, 1000, 10);
    n.labels.insert("zone".into(), zone.into());
    n
}

#[test]
fn nodes_share_the_labels_they_repeat_after_registration_update_and_restore() {
    let mut ledger = ledger_with(&[zoned("a", "z1"), zoned("b", "z1"), zoned("c", "z2")]);
    let shared = |l: &ShardLedger, x: &str, y: &str| {
        kept_label(l, x, "zone").shares(&kept_label(l, y, "zone"))
    };
    assert!(shared(&ledger, "a", "b"));
    assert!(!shared(&ledger, "a", "c"));

    let reply = apply(
        &mut ledger,
        1,
        LedgerOp::RegisterNode {
            node: zoned("c", "z1"),
        },
    );
    assert!(
        matches!(reply, LedgerReply::NodeRegistered { .. }),
        "{reply:?}"
    );
    assert!(
        shared(&ledger, "a", "c"),
        "an updated node's labels are interned too"
    );

    let restored = ShardLedger::restore(&ledger.snapshot()).expect("restores");
    assert!(shared(&restored, "a", "b") && shared(&restored, "b", "c"));
    assert_eq!(restored.snapshot(), ledger.snapshot());
}
