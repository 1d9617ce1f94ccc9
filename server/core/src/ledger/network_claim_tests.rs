//! Shared ResourceClaims carried with network-attached devices (rule 15): the claim's
//! devices are held on every shard under the claim's key for every pod that uses it,
//! wherever it runs, and freed with its last user. Each operation in each state of a
//! claim hold: carried and used in one reservation, used by a later one, used while
//! only reserved elsewhere, carried twice, used from a node the pool does not reach,
//! released by member, by transaction and by abort, evicted, retried and snapshotted.

use crate::ledger::command::{
    claim_key, LedgerOp, LedgerReply, NetworkHold, RefusalCause, ReleaseTarget, ReserveMember,
    TxnId, CLAIM_GANG,
};
use crate::ledger::network_tests::{
    alloc, apply, holders, key, member, node, reserve, shard, DRIVER, POOL,
};
use crate::ledger::shard::ShardLedger;
use crate::model::claim::ClaimShare;
use crate::model::device::DeviceId;

const CLAIM: &str = "ns/channel";

/// Member `name` on `node`, whose pod shares [`CLAIM`] (as pod claim "c") and holds
/// nothing of it on its node.
fn user(name: &str, node: &str) -> ReserveMember {
    let mut m = member(name, node);
    m.pod.shares = vec![ClaimShare {
        pod_claim: "c".into(),
        claim: CLAIM.into(),
    }];
    m.pod.uid = Some(format!("uid-{name}"));
    m
}

/// `member` allocates [`CLAIM`] with network devices `devices`.
fn carry(name: &str, devices: &[usize]) -> NetworkHold {
    NetworkHold {
        member: key(name),
        devices: devices.iter().map(|d| alloc(*d)).collect(),
        claim: Some(CLAIM.into()),
    }
}

/// `member` uses [`CLAIM`], carried by another.
fn uses(name: &str) -> NetworkHold {
    NetworkHold {
        member: key(name),
        devices: Vec::new(),
        claim: Some(CLAIM.into()),
    }
}

fn commit(l: &mut ShardLedger, txn: u64, members: Vec<ReserveMember>, network: Vec<NetworkHold>) {
    let r = apply(
        l,
        txn,
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(txn),
            members,
            network,
        },
    );
    assert!(matches!(r, LedgerReply::Committed { .. }), "{r:?}");
}

fn release(l: &mut ShardLedger, at_ms: u64, target: ReleaseTarget) -> LedgerReply {
    apply(l, at_ms, LedgerOp::Release { target })
}

fn refusals(r: &LedgerReply) -> Vec<(String, RefusalCause)> {
    match r {
        LedgerReply::ReserveRefused { refusals, .. } => refusals
            .iter()
            .map(|x| (x.member.member.clone(), x.cause.clone()))
            .collect(),
        other => panic!("expected a refusal: {other:?}"),
    }
}

/// Which devices the claim holds, and its users, on `l`.
fn claim_state(l: &ShardLedger) -> (Vec<String>, Vec<String>) {
    let devices = holders(l)
        .into_iter()
        .filter(|(_, m)| m.gang == CLAIM_GANG)
        .map(|(d, _)| d.device)
        .collect();
    let users = ["m1", "m2", "m3", "m4"]
        .into_iter()
        .filter(|m| l.network_pools().uses(&key(m), CLAIM))
        .map(String::from)
        .collect();
    (devices, users)
}

/// Shards A (node a1) and B (node b1); m1 on a1 carries the claim with d0, m2 on b1
/// uses it, in one committed transaction (1).
fn carried_across_shards() -> (ShardLedger, ShardLedger) {
    let (mut a, mut b) = (shard("a1"), shard("b1"));
    let network = vec![carry("m1", &[0]), uses("m2")];
    commit(&mut a, 1, vec![user("m1", "a1")], network.clone());
    commit(&mut b, 1, vec![user("m2", "b1")], network);
    (a, b)
}

#[test]
fn a_claim_carried_on_the_network_serves_users_on_every_shard_until_the_last_goes() {
    let (mut a, mut b) = carried_across_shards();
    let both = (
        vec!["d0".to_string()],
        vec!["m1".to_string(), "m2".to_string()],
    );
    assert_eq!(claim_state(&a), both);
    assert_eq!(claim_state(&b), both);
    // The claim is carried once, and its device is no one else's.
    for l in [&mut a, &mut b] {
        let again = reserve(2, Vec::new(), vec![carry("m3", &[1])]);
        let r = apply(l, 2, again);
        let carried = RefusalCause::SharedClaimCarried {
            claim: CLAIM.into(),
        };
        assert_eq!(refusals(&r), vec![("m3".to_string(), carried)]);
        let taken = reserve(
            3,
            Vec::new(),
            vec![crate::ledger::network_tests::hold("x", &[0])],
        );
        assert_eq!(refusals(&apply(l, 3, taken)).len(), 1);
    }
    // The carrier goes first: the claim stays for its user.
    for l in [&mut a, &mut b] {
        let r = release(l, 4, ReleaseTarget::Members(vec![key("m1")]));
        assert!(matches!(r, LedgerReply::Released { .. }), "{r:?}");
        assert_eq!(
            claim_state(l),
            (vec!["d0".to_string()], vec!["m2".to_string()])
        );
    }
    // A later pod of the claim joins it from either shard.
    commit(&mut a, 5, vec![user("m3", "a1")], vec![uses("m3")]);
    commit(&mut b, 5, Vec::new(), vec![uses("m3")]);
    let restored = ShardLedger::restore(&a.snapshot()).expect("restores");
    assert_eq!(restored, a);
    for l in [&mut a, &mut b] {
        release(l, 6, ReleaseTarget::Members(vec![key("m2")]));
        assert_eq!(
            claim_state(l),
            (vec!["d0".to_string()], vec!["m3".to_string()])
        );
        let r = release(l, 7, ReleaseTarget::Members(vec![key("m3")]));
        match r {
            LedgerReply::Released { released, absent } => {
                assert_eq!((released, absent), (vec![key("m3")], Vec::new()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(claim_state(l), (Vec::new(), Vec::new()));
        assert!(l.network_pools().holds().is_empty());
    }
}

#[test]
fn a_pod_uses_a_claim_only_where_it_is_committed_or_carried_by_its_own_reservation() {
    let mut a = shard("a1");
    // Reserved, not committed: another transaction may not use it yet.
    let first = reserve(1, vec![user("m1", "a1")], vec![carry("m1", &[0])]);
    assert!(matches!(
        apply(&mut a, 1, first.clone()),
        LedgerReply::Reserved { .. }
    ));
    assert!(
        matches!(apply(&mut a, 1, first), LedgerReply::Reserved { .. }),
        "a retry is the same"
    );
    let early = reserve(2, vec![user("m2", "a1")], vec![uses("m2")]);
    let not_here = RefusalCause::SharedClaimNotHere {
        claim: CLAIM.into(),
    };
    assert_eq!(
        refusals(&apply(&mut a, 2, early)),
        vec![("m2".to_string(), not_here.clone())]
    );
    // A pod that follows the claim without using it on the network looks for it on
    // its node, where nothing carries it.
    let stray = reserve(3, vec![user("m3", "a1")], Vec::new());
    assert_eq!(
        refusals(&apply(&mut a, 3, stray)),
        vec![("m3".to_string(), not_here)]
    );
    // A user's release waits for its transaction.
    let r = release(&mut a, 4, ReleaseTarget::Members(vec![key("m1")]));
    assert!(matches!(r, LedgerReply::Rejected { .. }), "{r:?}");
    assert!(matches!(
        apply(&mut a, 5, LedgerOp::Abort { txn_id: TxnId(1) }),
        LedgerReply::Aborted { .. }
    ));
    assert_eq!(claim_state(&a), (Vec::new(), Vec::new()));
    assert!(a.network_pools().holds().is_empty());
}

#[test]
fn a_user_on_a_node_the_pool_does_not_reach_is_refused_there() {
    let mut a = shard("a1");
    apply(
        &mut a,
        0,
        LedgerOp::RegisterNode {
            node: node("a2x", "r2"),
        },
    );
    commit(&mut a, 1, vec![user("m1", "a1")], vec![carry("m1", &[0])]);
    let far = reserve(2, vec![user("m2", "a2x")], vec![uses("m2")]);
    let unreachable = RefusalCause::DeviceUnreachable {
        device: DeviceId::new(DRIVER, POOL, "d0"),
    };
    assert_eq!(
        refusals(&apply(&mut a, 2, far)),
        vec![("m2".to_string(), unreachable)]
    );
    // Nor in the reservation that carries it.
    let both = reserve(3, vec![user("m3", "a2x")], vec![uses("m3")]);
    assert_eq!(refusals(&apply(&mut a, 3, both)).len(), 1);
}

#[test]
fn holds_that_misname_a_claim_are_rejected_or_refused() {
    let mut a = shard("a1");
    // The pod does not share the claim it would use.
    let r = apply(
        &mut a,
        1,
        reserve(1, vec![member("m1", "a1")], vec![carry("m1", &[0])]),
    );
    assert!(format!("{r:?}").contains("pod.shares"), "{r:?}");
    // Keys of gangway's own are not members'.
    let mut fake = uses("m2");
    fake.member = claim_key(CLAIM);
    let r = apply(&mut a, 2, reserve(2, Vec::new(), vec![fake]));
    assert!(format!("{r:?}").contains(CLAIM_GANG), "{r:?}");
    // A claim is not `namespace/name`.
    let mut bad = uses("m2");
    bad.claim = Some("no-namespace".into());
    let r = apply(&mut a, 3, reserve(3, Vec::new(), vec![bad]));
    assert!(matches!(r, LedgerReply::Rejected { .. }), "{r:?}");
    // A pod may not allocate the claim on its node and on the network both.
    let mut twice = user("m4", "a1");
    twice.pod.devices = vec![crate::model::claim::DeviceAllocation {
        claim: "c".into(),
        ..alloc(1)
    }];
    let r = apply(&mut a, 4, reserve(4, vec![twice], vec![carry("m4", &[0])]));
    let carried = RefusalCause::SharedClaimCarried {
        claim: CLAIM.into(),
    };
    assert!(refusals(&r).contains(&("m4".to_string(), carried)), "{r:?}");
    assert!(a.network_pools().holds().is_empty());
}

#[test]
fn release_by_transaction_frees_the_claim_only_with_its_last_user() {
    let (mut a, mut b) = carried_across_shards();
    commit(&mut a, 2, vec![user("m3", "a1")], vec![uses("m3")]);
    commit(&mut b, 2, Vec::new(), vec![uses("m3")]);
    for l in [&mut a, &mut b] {
        let r = release(l, 3, ReleaseTarget::Txn(TxnId(1)));
        match r {
            LedgerReply::Released { mut released, .. } => {
                released.sort();
                assert!(released.contains(&key("m2")), "{released:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            claim_state(l),
            (vec!["d0".to_string()], vec!["m3".to_string()])
        );
        // A retried reservation of a released transaction finds it finished.
        release(l, 4, ReleaseTarget::Txn(TxnId(2)));
        assert_eq!(claim_state(l), (Vec::new(), Vec::new()));
    }
}

#[test]
fn a_tainted_claim_device_evicts_every_user_from_its_own_shard() {
    use crate::ledger::network_tests::{ecc_no_execute_on_d0, evicted};
    let (mut a, mut b) = carried_across_shards();
    let taint = ecc_no_execute_on_d0();
    assert_eq!(
        evicted(apply(&mut a, 2, taint.clone())),
        vec![(key("m1"), "a1".to_string())]
    );
    assert_eq!(
        evicted(apply(&mut b, 2, taint)),
        vec![(key("m2"), "b1".to_string())]
    );
    let asked = crate::ledger::network_tests::evictions_asked(&b, 3);
    assert_eq!(asked, vec![(key("m2"), "b1".to_string())]);
}

/// The coordinator's second pass: a shard told of a claim another shard's member
/// carries (`ShardQuery::Plan.carried`) plans the claim's followers on its nodes the
/// pool reaches, as users of it; untold, it cannot place them.
#[test]
fn a_shard_plans_followers_beside_a_claim_another_shard_carries_once_told() {
    use crate::engine::{Placer, Profile};
    use crate::ledger::command::HoldKind;
    use crate::model::pod::PodSpec;
    use crate::query::{answer, ShardAnswer, ShardQuery};
    let b = shard("b1");
    let follower = PodSpec {
        shares: vec![ClaimShare {
            pod_claim: "c".into(),
            claim: CLAIM.into(),
        }],
        ..PodSpec::default()
    };
    let plan = |carried: Vec<NetworkHold>| {
        let query = ShardQuery::Plan {
            members: vec![(key("m2"), follower.clone()), (key("m3"), follower.clone())],
            profile: Box::new(Profile::default()),
            carried,
            topologies: Vec::new(),
            kept: Vec::new(),
        };
        match answer(&b, &query, &mut Placer::new()) {
            ShardAnswer::Plan { placement } => placement,
            other => panic!("{other:?}"),
        }
    };
    let untold = plan(Vec::new());
    assert!(untold.assignments.is_empty(), "{untold:?}");
    let told = plan(vec![carry("m1", &[0])]);
    let placed: Vec<(&str, &str)> = told
        .assignments
        .iter()
        .map(|m| (m.member.member.as_str(), m.node.as_str()))
        .collect();
    assert_eq!(placed, [("m2", "b1"), ("m3", "b1")], "{told:?}");
    let kinds: Vec<(String, bool)> = told
        .network
        .iter()
        .map(|h| (h.member.member.clone(), h.kind() == HoldKind::Use(CLAIM)))
        .collect();
    assert_eq!(kinds, [("m2".to_string(), true), ("m3".to_string(), true)]);
    // The shard's own ledger is untouched: the claim is only planned as held.
    assert!(b.network_pools().holds().is_empty());
    // Reserving them with the carrier's hold is accepted.
    let mut b = b;
    let mut network = vec![carry("m1", &[0])];
    network.extend(told.network.iter().cloned());
    commit(&mut b, 1, told.assignments.clone(), network);
    assert_eq!(
        claim_state(&b),
        (
            vec!["d0".to_string()],
            vec!["m1".to_string(), "m2".to_string(), "m3".to_string()]
        )
    );
}
