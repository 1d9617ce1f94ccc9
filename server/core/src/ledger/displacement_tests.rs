//! Preemption's first phase on one shard (`LedgerOp::ReserveDisplacing`): victims leave,
//! members take their room, placeholders hold the rest; COMMIT frees the victims' room,
//! ABORT puts every victim back exactly as it was. Unit tests for each state a
//! reservation meets, and a property test over random victims, members and outcomes
//! against the rule that an ABORT leaves the nodes as they were before. Kubernetes
//! victims (pods with a uid): after COMMIT their room stays held, and the preemptor's
//! members on their nodes unbindable, until `LedgerOp::VictimsGone` reports every one
//! there gone; unit tests and a property test over any order of reports. Victims sharing
//! a ResourceClaim: a carrier displaced alone leaves the devices with its follower, and
//! victims put back by ABORT come back with one carrier, even when one was released
//! while displaced; a preemption taking some of a claim's pods on a node, not all, is refused.

use proptest::prelude::*;

use crate::ledger::command::{
    LedgerCommand, LedgerError, LedgerOp, LedgerReply, RefusalCause, ReleaseTarget, ReserveMember,
    TxnId,
};
use crate::ledger::displace::is_placeholder;
use crate::ledger::shard::ShardLedger;
use crate::ledger::usage::SlotState;
use crate::model::claim::{AdminAccess, DeviceAllocation};
use crate::model::device::{Device, DeviceId};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::{HostPort, PodSummary, Protocol};

const DEADLINE_MS: u64 = 10_000;
const DRIVER: &str = "gpu.example.com";
/// GPUs published on every node of the device tests.
const GPUS_PER_NODE: usize = 6;

fn node(name: &str, cpu_milli: u64, pods: u64) -> Node {
    crate::fixtures::node_with(name, cpu_milli, 1 << 30, pods)
}

use crate::fixtures::pod_with_cpu as pod;

fn member(gang: &str, name: &str, node: &str, p: PodSummary) -> ReserveMember {
    ReserveMember {
        member: MemberKey::new("ns", gang, name),
        node: node.to_string(),
        pod: p,
    }
}

use crate::fixtures::apply_checked as apply;

fn ledger_with(nodes: &[Node]) -> ShardLedger {
    let mut ledger = ShardLedger::new();
    for n in nodes {
        apply(&mut ledger, 0, LedgerOp::RegisterNode { node: n.clone() });
        let gpus = (0..GPUS_PER_NODE)
            .map(|i| Device::new(format!("gpu-{i}")))
            .collect();
        let publish = LedgerOp::PublishPool {
            node: n.name.clone(),
            driver: DRIVER.into(),
            pool: n.name.clone(),
            generation: 1,
            devices: gpus,
            counter_sets: Vec::new(),
        };
        apply(&mut ledger, 0, publish);
    }
    ledger
}

/// An exclusive allocation of GPU `i` of `node`.
fn gpu(node: &str, i: usize) -> DeviceAllocation {
    DeviceAllocation {
        claim: "c".into(),
        request: format!("r{i}"),
        device: DeviceId::new(DRIVER, node, &format!("gpu-{i}")),
        admin_access: AdminAccess::Disabled,
        tolerations: Vec::new(),
        share_id: None,
        consumed_capacity: Default::default(),
    }
}

fn with_gpus(mut p: PodSummary, node: &str, gpus: &[usize]) -> PodSummary {
    p.devices = gpus.iter().map(|i| gpu(node, *i)).collect();
    p
}

/// Places `members` committed under `txn` (a victim gang).
fn place(ledger: &mut ShardLedger, txn: u64, members: Vec<ReserveMember>) {
    let reply = apply(
        ledger,
        1,
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(txn),
            members,
            network: Vec::new(),
        },
    );
    assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
}

fn displacing(txn: u64, members: Vec<ReserveMember>, victims: Vec<MemberKey>) -> LedgerOp {
    LedgerOp::ReserveDisplacing {
        txn_id: TxnId(txn),
        members,
        victims,
        deadline_ms: DEADLINE_MS,
    }
}

fn keys(members: &[ReserveMember]) -> Vec<MemberKey> {
    members.iter().map(|m| m.member.clone()).collect()
}

/// Two 8-cpu nodes, each full with two 4-cpu victims of gang `low`.
fn full_of_victims() -> (ShardLedger, Vec<ReserveMember>) {
    let mut ledger = ledger_with(&[node("n1", 8000, 110), node("n2", 8000, 110)]);
    let victims: Vec<ReserveMember> = (0..4)
        .map(|i| {
            member(
                "low",
                &format!("v{i}"),
                if i < 2 { "n1" } else { "n2" },
                pod(4000),
            )
        })
        .collect();
    place(&mut ledger, 1, victims.clone());
    (ledger, victims)
}

#[test]
fn members_take_the_victims_room_and_the_rest_stays_held_until_commit() {
    let (mut ledger, victims) = full_of_victims();
    let high = vec![member("high", "h0", "n1", pod(6000))];
    let reply = apply(
        &mut ledger,
        2,
        displacing(5, high.clone(), keys(&victims[..2])),
    );
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    assert!(
        ledger.slot(&victims[0].member).is_none(),
        "victims leave their node"
    );
    assert_eq!(
        ledger.slot(&high[0].member).map(|s| s.state),
        Some(SlotState::Reserved { txn_id: TxnId(5) })
    );
    // The 2 cpus the member leaves are the victims' until the decision.
    let squeeze = vec![member("other", "o0", "n1", pod(1000))];
    let refused = apply(
        &mut ledger,
        3,
        LedgerOp::Reserve {
            txn_id: TxnId(6),
            members: squeeze.clone(),
            deadline_ms: DEADLINE_MS,
            network: Vec::new(),
        },
    );
    assert!(
        matches!(refused, LedgerReply::ReserveRefused { .. }),
        "{refused:?}"
    );

    let committed = apply(&mut ledger, 4, LedgerOp::Commit { txn_id: TxnId(5) });
    assert!(
        matches!(committed, LedgerReply::Committed { .. }),
        "{committed:?}"
    );
    let n1 = ledger.node("n1").expect("n1");
    assert!(
        n1.usage.pods.keys().all(|k| !is_placeholder(k)),
        "placeholders go at commit"
    );
    assert_eq!(
        n1.usage.committed.cpu_milli, 6000,
        "only the preemptor is left"
    );
    assert!(
        ledger.slot(&victims[2].member).is_some(),
        "victims on n2 were not named"
    );
    let fits = apply(
        &mut ledger,
        5,
        LedgerOp::Reserve {
            txn_id: TxnId(7),
            members: squeeze,
            deadline_ms: DEADLINE_MS,
            network: Vec::new(),
        },
    );
    assert!(matches!(fits, LedgerReply::Reserved { .. }), "{fits:?}");
}

#[test]
fn abort_puts_every_victim_back_as_it_was() {
    let (mut ledger, victims) = full_of_victims();
    let before = ledger.clone();
    let high = vec![
        member("high", "h0", "n1", pod(8000)),
        member("high", "h1", "n2", pod(1000)),
    ];
    let reply = apply(&mut ledger, 2, displacing(5, high, keys(&victims)));
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    let aborted = apply(&mut ledger, 3, LedgerOp::Abort { txn_id: TxnId(5) });
    assert!(
        matches!(aborted, LedgerReply::Aborted { .. }),
        "{aborted:?}"
    );
    for name in ["n1", "n2"] {
        assert_eq!(
            ledger.node(name),
            before.node(name),
            "node {name} as it was"
        );
    }
    // The victims' own transaction still answers for them.
    let released = apply(
        &mut ledger,
        4,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(1)),
        },
    );
    let LedgerReply::Released { released, .. } = released else {
        panic!("{released:?}");
    };
    assert_eq!(released.len(), 4);
}

#[test]
fn a_victim_that_is_not_placed_here_refuses_the_whole_preemption() {
    let (mut ledger, victims) = full_of_victims();
    let before = ledger.clone();
    let high = vec![member("high", "h0", "n1", pod(6000))];
    let mut named = keys(&victims[..2]);
    named.push(MemberKey::new("ns", "low", "elsewhere"));
    let reply = apply(&mut ledger, 2, displacing(5, high, named));
    let LedgerReply::ReserveRefused { refusals, .. } = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(refusals[0].cause, RefusalCause::VictimNotPlaced);
    assert_eq!(ledger.node("n1"), before.node("n1"), "nothing changed");
    assert!(ledger.open_txns().is_empty());
}

#[test]
fn a_reserved_victim_is_not_placed() {
    let mut ledger = ledger_with(&[node("n1", 8000, 110)]);
    let low = vec![member("low", "v0", "n1", pod(8000))];
    let reply = apply(
        &mut ledger,
        1,
        LedgerOp::Reserve {
            txn_id: TxnId(1),
            members: low.clone(),
            deadline_ms: DEADLINE_MS,
            network: Vec::new(),
        },
    );
    assert!(matches!(reply, LedgerReply::Reserved { .. }));
    let high = vec![member("high", "h0", "n1", pod(8000))];
    let reply = apply(&mut ledger, 2, displacing(5, high, keys(&low)));
    let LedgerReply::ReserveRefused { refusals, .. } = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(refusals[0].cause, RefusalCause::VictimNotPlaced);
}

#[test]
fn members_that_do_not_fit_even_without_the_victims_refuse_it() {
    let (mut ledger, victims) = full_of_victims();
    let before = ledger.clone();
    let high = vec![member("high", "h0", "n1", pod(9000))];
    let reply = apply(&mut ledger, 2, displacing(5, high, keys(&victims[..2])));
    let LedgerReply::ReserveRefused { refusals, .. } = reply else {
        panic!("{reply:?}");
    };
    assert!(matches!(
        refusals[0].cause,
        RefusalCause::Insufficient { .. }
    ));
    assert_eq!(ledger.node("n1"), before.node("n1"));
    // The id is spent: a retry is answered as refused, never applied.
    let retry = apply(
        &mut ledger,
        3,
        displacing(
            5,
            vec![member("high", "h0", "n1", pod(1000))],
            keys(&victims[..2]),
        ),
    );
    assert!(
        matches!(retry, LedgerReply::ReserveRefused { .. }),
        "{retry:?}"
    );
}

#[test]
fn a_retry_is_answered_and_another_body_under_the_id_is_refused() {
    let (mut ledger, victims) = full_of_victims();
    let high = vec![member("high", "h0", "n1", pod(6000))];
    let op = displacing(5, high, keys(&victims[..2]));
    assert!(matches!(
        apply(&mut ledger, 2, op.clone()),
        LedgerReply::Reserved { .. }
    ));
    let after = ledger.clone();
    assert!(matches!(
        apply(&mut ledger, 3, op),
        LedgerReply::Reserved { .. }
    ));
    assert_eq!(ledger, after, "a retry changes nothing");
    let other = displacing(
        5,
        vec![member("high", "h0", "n1", pod(5000))],
        keys(&victims[..2]),
    );
    let reply = apply(&mut ledger, 4, other);
    assert!(
        matches!(
            reply,
            LedgerReply::Rejected {
                error: LedgerError::TxnConflict { .. }
            }
        ),
        "{reply:?}"
    );
}

#[test]
fn a_victim_released_while_displaced_does_not_come_back_on_abort() {
    let (mut ledger, victims) = full_of_victims();
    let high = vec![member("high", "h0", "n1", pod(6000))];
    apply(&mut ledger, 2, displacing(5, high, keys(&victims[..2])));
    let released = apply(
        &mut ledger,
        3,
        LedgerOp::Release {
            target: ReleaseTarget::Members(vec![victims[0].member.clone()]),
        },
    );
    let LedgerReply::Released { released, absent } = released else {
        panic!("{released:?}");
    };
    assert_eq!((released.len(), absent.len()), (1, 0));
    apply(&mut ledger, 4, LedgerOp::Abort { txn_id: TxnId(5) });
    assert!(
        ledger.slot(&victims[0].member).is_none(),
        "released stays released"
    );
    assert!(
        ledger.slot(&victims[1].member).is_some(),
        "the other comes back"
    );
}

#[test]
fn a_shard_holding_only_victims_frees_them_at_commit() {
    let (mut ledger, victims) = full_of_victims();
    let reply = apply(
        &mut ledger,
        2,
        displacing(5, Vec::new(), keys(&victims[2..])),
    );
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    assert_eq!(
        ledger.node("n2").expect("n2").usage.reserved.cpu_milli,
        8000
    );
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    assert!(ledger.node("n2").expect("n2").usage.pods.is_empty());
}

#[test]
fn malformed_preemptions_are_rejected_naming_the_member() {
    let (mut ledger, victims) = full_of_victims();
    let twice = vec![victims[0].member.clone(), victims[0].member.clone()];
    let reply = apply(&mut ledger, 2, displacing(5, Vec::new(), twice));
    assert!(
        matches!(
            reply,
            LedgerReply::Rejected {
                error: LedgerError::DuplicateMember { .. }
            }
        ),
        "{reply:?}"
    );
    let empty = apply(&mut ledger, 2, displacing(6, Vec::new(), Vec::new()));
    assert!(
        matches!(
            empty,
            LedgerReply::Rejected {
                error: LedgerError::EmptyReservation { .. }
            }
        ),
        "{empty:?}"
    );
    let mut ported = pod(1000);
    ported.host_ports.push(HostPort {
        port: 80,
        protocol: Protocol::Tcp,
    });
    let both = vec![member("low", "v0", "n1", ported)];
    let reply = apply(&mut ledger, 2, displacing(7, both, keys(&victims[..1])));
    assert!(matches!(reply, LedgerReply::Rejected { .. }), "{reply:?}");
}

#[test]
fn gpus_the_members_do_not_take_stay_held_for_the_victims() {
    let mut ledger = ledger_with(&[node("n1", 8000, 110)]);
    let victims = vec![
        member("low", "v0", "n1", with_gpus(pod(1000), "n1", &[0, 1])),
        member("low", "v1", "n1", with_gpus(pod(1000), "n1", &[2])),
    ];
    place(&mut ledger, 1, victims.clone());
    let before = ledger.clone();
    let high = vec![member(
        "high",
        "h0",
        "n1",
        with_gpus(pod(1000), "n1", &[0, 3]),
    )];
    let reply = apply(&mut ledger, 2, displacing(5, high, keys(&victims)));
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    // gpu-1 and gpu-2 are the victims' until the decision; gpu-4 is free.
    for (i, taken) in [(1, true), (2, true), (4, false)] {
        let want = vec![member(
            "other",
            &format!("o{i}"),
            "n1",
            with_gpus(pod(0), "n1", &[i]),
        )];
        let reply = apply(
            &mut ledger,
            3,
            LedgerOp::Reserve {
                txn_id: TxnId(10 + i as u64),
                members: want,
                deadline_ms: DEADLINE_MS,
                network: Vec::new(),
            },
        );
        let refused = matches!(reply, LedgerReply::ReserveRefused { .. });
        assert_eq!(refused, taken, "gpu-{i}: {reply:?}");
        if !refused {
            apply(
                &mut ledger,
                3,
                LedgerOp::Abort {
                    txn_id: TxnId(10 + i as u64),
                },
            );
        }
    }
    apply(&mut ledger, 4, LedgerOp::Abort { txn_id: TxnId(5) });
    assert_eq!(
        ledger.node("n1"),
        before.node("n1"),
        "victims and their GPUs are back"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random victims and members on three nodes: whatever is reserved keeps every
    /// ledger invariant; ABORT leaves each node exactly as it was before; COMMIT leaves
    /// the members committed and no victim or placeholder anywhere.
    #[test]
    fn abort_restores_and_commit_frees(
        victim_cpus in prop::collection::vec((0usize..3, 1u64..5), 1..7),
        member_cpus in prop::collection::vec((0usize..3, 1u64..9), 0..5),
        victim_gpus in prop::collection::vec(prop::collection::btree_set(0usize..GPUS_PER_NODE, 0..3), 7),
        member_gpus in prop::collection::vec(prop::collection::btree_set(0usize..GPUS_PER_NODE, 0..3), 5),
        named in prop::collection::vec(any::<bool>(), 7),
        ports in prop::collection::vec(any::<bool>(), 12),
        commit in any::<bool>(),
    ) {
        let names = ["n1", "n2", "n3"];
        let mut ledger = ledger_with(&names.map(|n| node(n, 8000, 4)));
        let mut victims = Vec::new();
        for (i, (n, cpu)) in victim_cpus.iter().enumerate() {
            let gpus: Vec<usize> = victim_gpus[i].iter().copied().collect();
            let mut p = with_gpus(pod(cpu * 1000), names[*n], &gpus);
            if ports[i] {
                p.host_ports.push(HostPort { port: 8000 + i as u16 % 2, protocol: Protocol::Tcp });
            }
            victims.push(member("low", &format!("v{i}"), names[*n], p));
        }
        // Victims that do not fit are left out (each placed alone).
        let mut placed = Vec::new();
        for (i, v) in victims.into_iter().enumerate() {
            let reply = ledger.apply(&LedgerCommand::new(1, LedgerOp::ReserveAndCommit {
                txn_id: TxnId(100 + i as u64),
                members: vec![v.clone()],
 network: Vec::new(),
            }));
            if matches!(reply, LedgerReply::Committed { .. }) {
                placed.push(v);
            }
        }
        let named: Vec<MemberKey> = placed
            .iter()
            .zip(&named)
            .filter(|(_, n)| **n)
            .map(|(v, _)| v.member.clone())
            .collect();
        let members: Vec<ReserveMember> = member_cpus
            .iter()
            .enumerate()
            .map(|(i, (n, cpu))| {
                let gpus: Vec<usize> = member_gpus[i].iter().copied().collect();
                let mut p = with_gpus(pod(cpu * 1000), names[*n], &gpus);
                if ports[7 + i] {
                    p.host_ports.push(HostPort { port: 8000, protocol: Protocol::Tcp });
                }
                member("high", &format!("h{i}"), names[*n], p)
            })
            .collect();
        let before = ledger.clone();
        let reply = ledger.apply(&LedgerCommand::new(2, displacing(5, members.clone(), named.clone())));
        prop_assert!(ledger.check_invariants().is_ok(), "{:?}", ledger.check_invariants());
        match reply {
            LedgerReply::Reserved { .. } => {
                let op = if commit { LedgerOp::Commit { txn_id: TxnId(5) } } else { LedgerOp::Abort { txn_id: TxnId(5) } };
                ledger.apply(&LedgerCommand::new(3, op));
                prop_assert!(ledger.check_invariants().is_ok(), "{:?}", ledger.check_invariants());
                if commit {
                    for v in &named {
                        prop_assert!(ledger.slot(v).is_none());
                    }
                    for m in &members {
                        let committed = matches!(ledger.slot(&m.member).map(|s| s.state), Some(SlotState::Committed { .. }));
                        prop_assert!(committed);
                    }
                    for n in ledger.nodes() {
                        prop_assert!(n.usage.pods.keys().all(|k| !is_placeholder(k)));
                    }
                } else {
                    for n in names {
                        prop_assert_eq!(ledger.node(n), before.node(n));
                    }
                }
            }
            LedgerReply::ReserveRefused { .. } | LedgerReply::Rejected { .. } => {
                for n in names {
                    prop_assert_eq!(ledger.node(n), before.node(n));
                }
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }
}

// ---- Kubernetes victims: room held until their pods are gone -----------------------------

/// `pod(cpu)` as a Kubernetes pod (a uid).
fn kube_pod(cpu_milli: u64, uid: &str) -> PodSummary {
    PodSummary {
        uid: Some(uid.to_string()),
        ..pod(cpu_milli)
    }
}

/// Two 8-cpu nodes, each full with two 4-cpu Kubernetes victims of gang `low`.
fn full_of_kube_victims() -> (ShardLedger, Vec<ReserveMember>) {
    let mut ledger = ledger_with(&[node("n1", 8000, 110), node("n2", 8000, 110)]);
    let victims: Vec<ReserveMember> = (0..4)
        .map(|i| {
            let n = if i < 2 { "n1" } else { "n2" };
            member(
                "low",
                &format!("v{i}"),
                n,
                kube_pod(4000, &format!("uid-v{i}")),
            )
        })
        .collect();
    place(&mut ledger, 1, victims.clone());
    (ledger, victims)
}

fn unbound_members(ledger: &ShardLedger) -> Vec<MemberKey> {
    use crate::query::{unbound, ShardAnswer, Victims};
    match unbound(ledger, 100, Victims::Wait) {
        ShardAnswer::Unbound { members } => members.into_iter().map(|m| m.member).collect(),
        other => panic!("{other:?}"),
    }
}

fn placeholders_on(ledger: &ShardLedger, node: &str) -> usize {
    ledger
        .node(node)
        .map(|n| n.usage.pods.keys().filter(|k| is_placeholder(k)).count())
        .unwrap_or(0)
}

fn reserve_other(ledger: &mut ShardLedger, txn: u64, node: &str, cpu_milli: u64) -> LedgerReply {
    apply(
        ledger,
        10,
        LedgerOp::Reserve {
            txn_id: TxnId(txn),
            members: vec![member("other", &format!("o{txn}"), node, pod(cpu_milli))],
            deadline_ms: DEADLINE_MS,
            network: Vec::new(),
        },
    )
}

#[test]
fn kubernetes_victims_keep_their_room_until_their_pods_are_gone() {
    let (mut ledger, victims) = full_of_kube_victims();
    let high = vec![member("high", "h0", "n1", kube_pod(6000, "uid-h0"))];
    let reply = apply(
        &mut ledger,
        2,
        displacing(5, high.clone(), keys(&victims[..2])),
    );
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    let committed = apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    assert!(
        matches!(committed, LedgerReply::Committed { .. }),
        "{committed:?}"
    );

    // Committed, the victims are evicting and their pods may still run on n1: the
    // placeholders hold what the preemptor does not take, and it is not bound yet.
    assert_eq!(
        ledger.evicting().keys().cloned().collect::<Vec<_>>(),
        keys(&victims[..2])
    );
    assert_eq!(ledger.evicting()[&victims[0].member].preemptor, "ns/high");
    assert!(placeholders_on(&ledger, "n1") > 0);
    assert!(
        ledger.slot(&victims[0].member).is_none(),
        "the victims' slots are gone"
    );
    assert!(
        !unbound_members(&ledger).contains(&high[0].member),
        "the preemptor waits for its victims"
    );
    assert!(matches!(
        reserve_other(&mut ledger, 6, "n1", 1000),
        LedgerReply::ReserveRefused { .. }
    ));

    // One victim gone: the other still runs there.
    let gone = apply(
        &mut ledger,
        4,
        LedgerOp::VictimsGone {
            members: keys(&victims[..1]),
        },
    );
    assert!(
        matches!(&gone, LedgerReply::Released { released, .. } if released.len() == 1),
        "{gone:?}"
    );
    assert!(placeholders_on(&ledger, "n1") > 0);
    assert!(!unbound_members(&ledger).contains(&high[0].member));

    // Both gone: the room is free and the preemptor may bind.
    apply(
        &mut ledger,
        5,
        LedgerOp::VictimsGone {
            members: keys(&victims[1..2]),
        },
    );
    assert_eq!(placeholders_on(&ledger, "n1"), 0);
    assert!(ledger.evicting().is_empty());
    assert!(unbound_members(&ledger).contains(&high[0].member));
    assert_eq!(
        ledger.node("n1").map(|n| n.usage.committed.cpu_milli),
        Some(6000)
    );
    assert!(matches!(
        reserve_other(&mut ledger, 7, "n1", 2000),
        LedgerReply::Reserved { .. }
    ));

    // Told again: nothing changes.
    let before = ledger.clone();
    let again = apply(
        &mut ledger,
        6,
        LedgerOp::VictimsGone {
            members: keys(&victims[..2]),
        },
    );
    assert!(
        matches!(&again, LedgerReply::Released { released, absent } if released.is_empty() && absent.len() == 2),
        "{again:?}"
    );
    assert_eq!(ledger, before);
}

#[test]
fn a_preemptor_waits_only_for_the_victims_on_its_own_node() {
    let (mut ledger, victims) = full_of_kube_victims();
    // h0 goes where v0 and v1 were; h1 to n2, where v2 was (v3 stays).
    let high = vec![
        member("high", "h0", "n1", kube_pod(8000, "uid-h0")),
        member("high", "h1", "n2", kube_pod(4000, "uid-h1")),
    ];
    apply(
        &mut ledger,
        2,
        displacing(5, high.clone(), keys(&victims[..3])),
    );
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    assert!(placeholders_on(&ledger, "n1") > 0, "v1's pod slot is held");
    apply(
        &mut ledger,
        4,
        LedgerOp::VictimsGone {
            members: keys(&victims[2..3]),
        },
    );
    let unbound = unbound_members(&ledger);
    assert!(unbound.contains(&high[1].member), "n2's victim is gone");
    assert!(!unbound.contains(&high[0].member), "n1's victims still run");
    assert!(
        unbound.contains(&victims[3].member),
        "v3 was never a victim"
    );
}

#[test]
fn releasing_the_preemptor_frees_its_placeholders_and_names_only_its_members() {
    let (mut ledger, victims) = full_of_kube_victims();
    let high = vec![member("high", "h0", "n1", kube_pod(6000, "uid-h0"))];
    apply(
        &mut ledger,
        2,
        displacing(5, high.clone(), keys(&victims[..2])),
    );
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    let reply = apply(
        &mut ledger,
        4,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(5)),
        },
    );
    let LedgerReply::Released { released, .. } = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(released, keys(&high));
    assert_eq!(placeholders_on(&ledger, "n1"), 0);
    // The evictor's work list stays until the pods are gone; that frees nothing more.
    assert_eq!(ledger.evicting().len(), 2);
    apply(
        &mut ledger,
        5,
        LedgerOp::VictimsGone {
            members: keys(&victims[..2]),
        },
    );
    assert!(ledger.evicting().is_empty());
    assert_eq!(
        ledger.node("n1").map(|n| n.usage.committed.cpu_milli),
        Some(0)
    );
}

#[test]
fn grpc_victims_and_aborted_preemptions_leave_nothing_evicting() {
    let (mut ledger, victims) = full_of_victims();
    let high = vec![member("high", "h0", "n1", pod(6000))];
    apply(&mut ledger, 2, displacing(5, high, keys(&victims[..2])));
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    assert!(
        ledger.evicting().is_empty(),
        "gRPC victims have no pods to wait for"
    );

    let (mut ledger, victims) = full_of_kube_victims();
    let high = vec![member("high", "h0", "n1", kube_pod(6000, "uid-h0"))];
    apply(&mut ledger, 2, displacing(5, high, keys(&victims[..2])));
    apply(&mut ledger, 3, LedgerOp::Abort { txn_id: TxnId(5) });
    assert!(
        ledger.evicting().is_empty(),
        "an aborted preemption evicts nothing"
    );
}

#[test]
fn a_name_preempted_again_frees_the_room_of_its_earlier_pod() {
    // "low/v0" runs on n1 (uid-a), is preempted by h0, and its pod is replaced by
    // another of the same name (uid-b) on n2 before the evictor reported it gone; that
    // one is preempted too. Only one pod of a name exists at a time, so uid-a is gone:
    // n1's room must not stay held for it.
    let mut ledger = ledger_with(&[node("n1", 8000, 110), node("n2", 8000, 110)]);
    let first = member("low", "v0", "n1", kube_pod(4000, "uid-a"));
    place(&mut ledger, 1, vec![first.clone()]);
    let h0 = vec![member("high", "h0", "n1", kube_pod(3000, "uid-h0"))];
    apply(&mut ledger, 2, displacing(5, h0, keys(&[first.clone()])));
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    assert!(placeholders_on(&ledger, "n1") > 0);
    let again = member("low", "v0", "n2", kube_pod(4000, "uid-b"));
    place(&mut ledger, 6, vec![again.clone()]);
    let h1 = vec![member("high", "h1", "n2", kube_pod(3000, "uid-h1"))];
    apply(&mut ledger, 4, displacing(7, h1, keys(&[again])));
    apply(&mut ledger, 5, LedgerOp::Commit { txn_id: TxnId(7) });
    assert_eq!(placeholders_on(&ledger, "n1"), 0, "uid-a's room is free");
    assert!(placeholders_on(&ledger, "n2") > 0, "uid-b may still run");
    let v = &ledger.evicting()[&first.member];
    assert_eq!((v.txn_id, v.uid.as_str()), (TxnId(7), "uid-b"));
}

#[test]
fn an_oversized_victims_gone_is_refused_whole() {
    use crate::ledger::command::LEDGER_BATCH_MAX;
    let (mut ledger, victims) = full_of_kube_victims();
    let high = vec![member("high", "h0", "n1", kube_pod(6000, "uid-h0"))];
    apply(&mut ledger, 2, displacing(5, high, keys(&victims[..2])));
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    let before = ledger.clone();
    let members = std::iter::repeat_n(victims[0].member.clone(), LEDGER_BATCH_MAX + 1).collect();
    let cmd = LedgerCommand::new(4, LedgerOp::VictimsGone { members });
    assert!(matches!(
        crate::ledger::shard::admit(&cmd),
        Err(LedgerError::BatchTooLarge { .. })
    ));
    let reply = ledger.apply(&cmd);
    assert!(
        matches!(
            reply,
            LedgerReply::Rejected {
                error: LedgerError::BatchTooLarge { .. }
            }
        ),
        "{reply:?}"
    );
    assert_eq!(ledger, before, "nothing changed");
}

#[test]
fn evicting_victims_survive_a_snapshot() {
    let (mut ledger, victims) = full_of_kube_victims();
    let high = vec![member("high", "h0", "n1", kube_pod(6000, "uid-h0"))];
    apply(&mut ledger, 2, displacing(5, high, keys(&victims[..2])));
    apply(&mut ledger, 3, LedgerOp::Commit { txn_id: TxnId(5) });
    let restored = ShardLedger::restore(&ledger.snapshot()).expect("restore");
    assert_eq!(restored, ledger);
    assert_eq!(restored.evicting().len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random Kubernetes and gRPC victims, members, and victims reported gone in any
    /// order (repeats included): after every step every invariant holds, a node keeps
    /// the transaction's placeholders exactly while one of its Kubernetes victims is
    /// not reported gone, and a member is bindable exactly when none runs on its node.
    #[test]
    fn placeholders_stay_exactly_while_victims_run(
        victims in prop::collection::vec((0usize..3, 1u64..5, any::<bool>()), 1..7),
        member_cpus in prop::collection::vec((0usize..3, 1u64..9), 0..5),
        named in prop::collection::vec(any::<bool>(), 7),
        gone_order in prop::collection::vec(0usize..7, 0..10),
    ) {
        let names = ["n1", "n2", "n3"];
        let mut ledger = ledger_with(&names.map(|n| node(n, 8000, 8)));
        let mut placed = Vec::new();
        for (i, (n, cpu, kube)) in victims.iter().enumerate() {
            let p = if *kube { kube_pod(cpu * 1000, &format!("uid-v{i}")) } else { pod(cpu * 1000) };
            let v = member("low", &format!("v{i}"), names[*n], p);
            let reply = ledger.apply(&LedgerCommand::new(1, LedgerOp::ReserveAndCommit {
                txn_id: TxnId(100 + i as u64),
                members: vec![v.clone()],
 network: Vec::new(),
            }));
            if matches!(reply, LedgerReply::Committed { .. }) {
                placed.push(v);
            }
        }
        let named: Vec<ReserveMember> = placed
            .into_iter()
            .zip(&named)
            .filter(|(_, n)| **n)
            .map(|(v, _)| v)
            .collect();
        let members: Vec<ReserveMember> = member_cpus
            .iter()
            .enumerate()
            .map(|(i, (n, cpu))| member("high", &format!("h{i}"), names[*n], kube_pod(cpu * 1000, &format!("uid-h{i}"))))
            .collect();
        let reply = ledger.apply(&LedgerCommand::new(2, displacing(5, members.clone(), keys(&named))));
        prop_assume!(matches!(reply, LedgerReply::Reserved { .. }));
        ledger.apply(&LedgerCommand::new(3, LedgerOp::Commit { txn_id: TxnId(5) }));
        let mut running: Vec<&ReserveMember> = named.iter().filter(|v| v.pod.uid.is_some()).collect();
        let check = |ledger: &ShardLedger, running: &[&ReserveMember]| -> Result<(), TestCaseError> {
            prop_assert!(ledger.check_invariants().is_ok(), "{:?}", ledger.check_invariants());
            let unbound = unbound_members(ledger);
            for n in names {
                let runs_here = running.iter().any(|v| v.node == n);
                // A node with room to hold keeps at least one placeholder while a victim runs.
                let members_here: u64 = members.iter().filter(|m| m.node == n).map(|m| m.pod.requests.cpu_milli).sum();
                let victims_here: u64 = named.iter().filter(|v| v.node == n).map(|v| v.pod.requests.cpu_milli).sum();
                let rest = named.iter().filter(|v| v.node == n).count() > members.iter().filter(|m| m.node == n).count()
                    || victims_here > members_here;
                if runs_here && rest {
                    prop_assert!(placeholders_on(ledger, n) > 0, "node {} lost its placeholders early", n);
                }
                if !runs_here {
                    prop_assert_eq!(placeholders_on(ledger, n), 0, "node {} keeps placeholders", n);
                }
                for m in members.iter().filter(|m| m.node == n) {
                    prop_assert_eq!(unbound.contains(&m.member), !runs_here, "member {}", m.member);
                }
            }
            Ok(())
        };
        check(&ledger, &running)?;
        for i in gone_order {
            let Some(v) = named.get(i) else { continue };
            ledger.apply(&LedgerCommand::new(4, LedgerOp::VictimsGone { members: vec![v.member.clone()] }));
            running.retain(|r| r.member != v.member);
            check(&ledger, &running)?;
        }
    }
}

/// A victim gang on n1 sharing one claim: `c` carries GPU 0, `f` follows it.
fn sharing_victims() -> ShardLedger {
    use crate::model::claim::ClaimShare;
    let mut ledger = ledger_with(&[node("n1", 8000, 110)]);
    let share = ClaimShare {
        pod_claim: "c".into(),
        claim: "ns/channel".into(),
    };
    let mut carrier = with_gpus(pod(1000), "n1", &[0]);
    carrier.shares = vec![share.clone()];
    let mut follower = pod(1000);
    follower.shares = vec![share];
    place(
        &mut ledger,
        1,
        vec![
            member("low", "c", "n1", carrier),
            member("low", "f", "n1", follower),
        ],
    );
    ledger
}

/// Holders of GPU 0 of n1, and which slots there carry the shared claim.
fn gpu0_and_carriers(ledger: &ShardLedger) -> (u32, Vec<String>) {
    let Some(entry) = ledger.node("n1") else {
        return (0, Vec::new());
    };
    let holders = entry
        .usage
        .devices
        .use_of(&DeviceId::new(DRIVER, "n1", "gpu-0"))
        .map_or(0, |u| u.holders);
    let carriers = entry
        .usage
        .pods
        .iter()
        .filter(|(_, s)| s.pod.carries("ns/channel"))
        .map(|(k, _)| k.member.clone())
        .collect();
    (holders, carriers)
}

#[test]
fn a_shared_claims_victims_come_back_with_one_carrier_and_its_devices_once() {
    let victims = [
        MemberKey::new("ns", "low", "c"),
        MemberKey::new("ns", "low", "f"),
    ];
    // Both victims, then ABORT: the devices were handed to f as c left, so both come
    // back with them; the first put back (c) carries them, f follows again.
    let mut ledger = sharing_victims();
    let preemptor = vec![member("high", "h", "n1", pod(1000))];
    let reply = apply(
        &mut ledger,
        2,
        displacing(2, preemptor.clone(), victims.to_vec()),
    );
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    let (holders, _) = gpu0_and_carriers(&ledger);
    assert_eq!(holders, 1, "the victims' room holds GPU 0 once");
    apply(&mut ledger, 3, LedgerOp::Abort { txn_id: TxnId(2) });
    assert_eq!(gpu0_and_carriers(&ledger), (1, vec!["c".to_string()]));
    // COMMIT frees it.
    let reply = apply(&mut ledger, 4, displacing(3, preemptor, victims.to_vec()));
    assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
    apply(&mut ledger, 5, LedgerOp::Commit { txn_id: TxnId(3) });
    apply(
        &mut ledger,
        6,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(3)),
        },
    );
    assert_eq!(gpu0_and_carriers(&ledger), (0, Vec::new()));

    // One victim of the two: refused, the other would keep using the GPU the victims'
    // room counts.
    for victim in &victims {
        let mut ledger = sharing_victims();
        let preemptor = vec![member("high", "h", "n1", pod(1000))];
        let reply = apply(
            &mut ledger,
            2,
            displacing(2, preemptor, vec![victim.clone()]),
        );
        let LedgerReply::ReserveRefused { refusals, .. } = reply else {
            panic!("{victim}: {reply:?}");
        };
        assert_eq!(
            refusals[0].cause,
            RefusalCause::SharedClaimSplit {
                claim: "ns/channel".into()
            }
        );
    }

    // Either victim released while displaced, the victims listed either way (the
    // follower taken first keeps nothing, the carrier after it frees the GPU into the
    // room): the other comes back carrying the GPU.
    let orders = [victims.to_vec(), victims.iter().rev().cloned().collect()];
    for (order, released) in orders
        .iter()
        .flat_map(|o| victims.iter().map(move |r| (o, r)))
    {
        let mut ledger = sharing_victims();
        let preemptor = vec![member("high", "h", "n1", pod(1000))];
        let reply = apply(&mut ledger, 2, displacing(2, preemptor, order.clone()));
        assert!(matches!(reply, LedgerReply::Reserved { .. }), "{reply:?}");
        apply(
            &mut ledger,
            3,
            LedgerOp::Release {
                target: ReleaseTarget::Members(vec![released.clone()]),
            },
        );
        apply(&mut ledger, 4, LedgerOp::Abort { txn_id: TxnId(2) });
        let other = victims
            .iter()
            .find(|v| *v != released)
            .map(|v| v.member.clone());
        assert_eq!(
            gpu0_and_carriers(&ledger),
            (1, other.into_iter().collect::<Vec<_>>()),
            "{released} released while displaced, victims {order:?}"
        );
    }
}
