//! Network-attached pools on shard ledgers: every shard keeps the pool and holds a
//! transaction's network devices (rule 15), so two transactions that want one device
//! meet on every shard. Unit tests of each operation in each state of a hold, and a
//! random walk over two shards with competing transactions delivered in random orders,
//! checked against the cross-shard form of I1 (no device held for two members on any
//! shard, and decided holds agree on every shard). The walk also runs with the
//! participants a coordinator would pick without rule 15 (only the members' shards),
//! and must catch the double booking that follows.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::ledger::command::{
    DeviceRefusal, LedgerCommand, LedgerOp, LedgerReply, NetworkHold, RefusalCause, ReleaseTarget,
    ReserveMember, TxnId,
};
use crate::ledger::devices::PoolChange;
use crate::ledger::shard::ShardLedger;
use crate::model::claim::{AdminAccess, DeviceAllocation};
use crate::model::device::{Device, DeviceId};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::{NodeSelectorOperator, NodeSelectorRequirement, PodSummary};
use crate::model::reach::{PoolReach, ReachTerm};
use crate::model::resources::Resources;

pub(super) const DRIVER: &str = "fabric.example.com";
pub(super) const POOL: &str = "fabric";
const DEVICES: usize = 3;

pub(super) fn node(name: &str, rack: &str) -> Node {
    let mut n = Node::new(
        name,
        Resources {
            cpu_milli: 64_000,
            memory_bytes: 1 << 40,
            pods: 100,
            ..Resources::zero()
        },
    );
    n.labels.insert("rack".into(), rack.into());
    n
}

pub(super) fn rack(value: &str) -> PoolReach {
    PoolReach::Selected(ReachTerm {
        match_expressions: vec![NodeSelectorRequirement {
            key: "rack".into(),
            operator: NodeSelectorOperator::In,
            values: vec![value.into()],
        }],
        match_fields: Vec::new(),
    })
}

pub(super) fn key(member: &str) -> MemberKey {
    MemberKey::new("ns", "g", member)
}

pub(super) fn alloc(device: usize) -> DeviceAllocation {
    DeviceAllocation {
        claim: "c".into(),
        request: "r".into(),
        device: DeviceId::new(DRIVER, POOL, format!("d{device}")),
        admin_access: AdminAccess::Disabled,
        tolerations: vec![],
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    }
}

pub(super) fn apply(ledger: &mut ShardLedger, at_ms: u64, op: LedgerOp) -> LedgerReply {
    let reply = ledger.apply(&LedgerCommand::new(at_ms, op));
    if let Err(e) = ledger.check_invariants() {
        panic!("invariant broken after {reply:?}: {e}");
    }
    reply
}

pub(super) fn publish(reach: PoolReach, generation: u64, devices: usize) -> LedgerOp {
    LedgerOp::PublishNetworkPool {
        driver: DRIVER.into(),
        pool: POOL.into(),
        generation,
        reach,
        devices: (0..devices).map(|i| Device::new(format!("d{i}"))).collect(),
        counter_sets: Vec::new(),
    }
}

/// A shard with node `name` in rack r1 (or r2 for names ending in `x`) and the pool.
pub(super) fn shard(name: &str) -> ShardLedger {
    let mut l = ShardLedger::new();
    let rack_of = if name.ends_with('x') { "r2" } else { "r1" };
    apply(
        &mut l,
        0,
        LedgerOp::RegisterNode {
            node: node(name, rack_of),
        },
    );
    let reply = apply(&mut l, 0, publish(rack("r1"), 1, DEVICES));
    assert!(
        matches!(
            reply,
            LedgerReply::PoolPublished {
                change: PoolChange::Added,
                ..
            }
        ),
        "{reply:?}"
    );
    l
}

pub(super) fn hold(member: &str, devices: &[usize]) -> NetworkHold {
    NetworkHold {
        member: key(member),
        devices: devices.iter().map(|d| alloc(*d)).collect(),
        claim: None,
    }
}

pub(super) fn member(member: &str, node: &str) -> ReserveMember {
    ReserveMember {
        member: key(member),
        node: node.into(),
        pod: PodSummary::default(),
    }
}

pub(super) fn reserve(
    txn: u64,
    members: Vec<ReserveMember>,
    network: Vec<NetworkHold>,
) -> LedgerOp {
    LedgerOp::Reserve {
        txn_id: TxnId(txn),
        members,
        network,
        deadline_ms: 10_000,
    }
}

pub(super) fn holders(ledger: &ShardLedger) -> BTreeMap<DeviceId, MemberKey> {
    ledger
        .network_pools()
        .holds()
        .iter()
        .flat_map(|(m, slot)| {
            slot.pod
                .devices
                .iter()
                .map(|a| (a.device.clone(), m.clone()))
        })
        .collect()
}

#[test]
fn a_network_device_is_held_on_every_shard_and_refused_to_a_second_member() {
    let (mut a, mut b) = (shard("a1"), shard("b1"));
    // Member m1 on a1 (shard A) takes d0: A holds the member and the device, B the device.
    let r = apply(
        &mut a,
        1,
        reserve(1, vec![member("m1", "a1")], vec![hold("m1", &[0])]),
    );
    assert!(matches!(r, LedgerReply::Reserved { .. }), "{r:?}");
    let r = apply(&mut b, 1, reserve(1, Vec::new(), vec![hold("m1", &[0])]));
    assert!(matches!(r, LedgerReply::Reserved { .. }), "{r:?}");
    // Member m2 on b1 (shard B) wants d0 too: both shards refuse, while reserved...
    for (l, members) in [(&mut b, vec![member("m2", "b1")]), (&mut a, Vec::new())] {
        let r = apply(l, 2, reserve(2, members, vec![hold("m2", &[0])]));
        let LedgerReply::ReserveRefused { refusals, .. } = r else {
            panic!("expected a refusal, got {r:?}");
        };
        assert!(
            matches!(
                refusals[0].cause,
                RefusalCause::DeviceUnavailable {
                    reason: DeviceRefusal::InUse,
                    ..
                }
            ),
            "{refusals:?}"
        );
    }
    // ...and once committed.
    for l in [&mut a, &mut b] {
        let r = apply(l, 3, LedgerOp::Commit { txn_id: TxnId(1) });
        assert!(matches!(r, LedgerReply::Committed { .. }), "{r:?}");
        let r = apply(l, 4, reserve(3, Vec::new(), vec![hold("m3", &[0, 1])]));
        assert!(matches!(r, LedgerReply::ReserveRefused { .. }), "{r:?}");
    }
    assert_eq!(holders(&a), holders(&b));
    // Releasing the member frees the device on both shards.
    for l in [&mut a, &mut b] {
        let r = apply(
            l,
            5,
            LedgerOp::Release {
                target: ReleaseTarget::Members(vec![key("m1")]),
            },
        );
        let LedgerReply::Released { released, absent } = r else {
            panic!("{r:?}");
        };
        assert_eq!((released, absent), (vec![key("m1")], Vec::new()));
        assert!(holders(l).is_empty());
        let r = apply(l, 6, reserve(4, Vec::new(), vec![hold("m4", &[0])]));
        assert!(matches!(r, LedgerReply::Reserved { .. }), "{r:?}");
    }
}

#[test]
fn a_withdrawn_network_pool_keeps_its_holds_and_comes_back_with_a_new_reach() {
    let mut a = shard("a1");
    let r = apply(
        &mut a,
        1,
        reserve(1, vec![member("m1", "a1")], vec![hold("m1", &[0])]),
    );
    assert!(matches!(r, LedgerReply::Reserved { .. }), "{r:?}");
    let withdraw = LedgerOp::WithdrawPool {
        node: String::new(),
        driver: DRIVER.into(),
        pool: POOL.into(),
    };
    let r = apply(&mut a, 2, withdraw);
    assert!(
        matches!(
            r,
            LedgerReply::PoolWithdrawn {
                outcome: crate::ledger::PoolWithdrawal::Withdrawn,
                ..
            }
        ),
        "{r:?}"
    );
    // The open reservation commits; a new one for a free device is refused.
    let r = apply(&mut a, 3, LedgerOp::Commit { txn_id: TxnId(1) });
    assert!(matches!(r, LedgerReply::Committed { .. }), "{r:?}");
    assert_eq!(holders(&a).len(), 1);
    let r = apply(
        &mut a,
        4,
        reserve(2, vec![member("m2", "a1")], vec![hold("m2", &[1])]),
    );
    let LedgerReply::ReserveRefused { refusals, .. } = r else {
        panic!("{r:?}");
    };
    assert!(
        matches!(
            refusals[0].cause,
            RefusalCause::DeviceUnavailable {
                reason: DeviceRefusal::NotPublished,
                ..
            }
        ),
        "{refusals:?}"
    );
    // Back at the same generation with another reach (not a reuse: it was withdrawn).
    let r = apply(&mut a, 5, publish(rack("r2"), 1, DEVICES));
    assert!(
        matches!(
            r,
            LedgerReply::PoolPublished {
                change: PoolChange::Replaced,
                ..
            }
        ),
        "{r:?}"
    );
    assert_eq!(holders(&a).len(), 1, "the holder keeps d0");
}

#[test]
fn a_pool_that_does_not_serve_the_node_is_refused_there() {
    let mut a = shard("ax");
    let r = apply(
        &mut a,
        1,
        reserve(1, vec![member("m1", "ax")], vec![hold("m1", &[0])]),
    );
    let LedgerReply::ReserveRefused { refusals, .. } = r else {
        panic!("{r:?}");
    };
    assert_eq!(
        refusals[0].cause,
        RefusalCause::DeviceUnreachable {
            device: alloc(0).device
        }
    );
    assert!(holders(&a).is_empty());
}

#[test]
fn abort_release_of_a_transaction_and_retries_leave_nothing_behind() {
    let mut a = shard("a1");
    let op = reserve(1, Vec::new(), vec![hold("m1", &[0]), hold("m2", &[1])]);
    assert!(matches!(
        apply(&mut a, 1, op.clone()),
        LedgerReply::Reserved { .. }
    ));
    // A retried reservation is the same one.
    assert!(matches!(apply(&mut a, 2, op), LedgerReply::Reserved { .. }));
    // Another body under the same id is not.
    let other = reserve(1, Vec::new(), vec![hold("m1", &[2])]);
    assert!(matches!(
        apply(&mut a, 2, other),
        LedgerReply::Rejected { .. }
    ));
    // A member whose hold is only reserved is not released by member.
    let r = apply(
        &mut a,
        3,
        LedgerOp::Release {
            target: ReleaseTarget::Members(vec![key("m1")]),
        },
    );
    assert!(matches!(r, LedgerReply::Rejected { .. }), "{r:?}");
    assert!(matches!(
        apply(&mut a, 4, LedgerOp::Abort { txn_id: TxnId(1) }),
        LedgerReply::Aborted { .. }
    ));
    assert!(holders(&a).is_empty());
    // Commit after abort is refused; a committed one is released whole by transaction.
    assert!(matches!(
        apply(&mut a, 5, LedgerOp::Commit { txn_id: TxnId(1) }),
        LedgerReply::Rejected { .. }
    ));
    let op = LedgerOp::ReserveAndCommit {
        txn_id: TxnId(2),
        members: Vec::new(),
        network: vec![hold("m1", &[0, 2])],
    };
    assert!(matches!(
        apply(&mut a, 6, op),
        LedgerReply::Committed { .. }
    ));
    assert_eq!(holders(&a).len(), 2);
    let r = apply(
        &mut a,
        7,
        LedgerOp::Release {
            target: ReleaseTarget::Txn(TxnId(2)),
        },
    );
    assert!(matches!(r, LedgerReply::Released { .. }), "{r:?}");
    assert!(holders(&a).is_empty());
}

#[test]
fn bad_holds_are_rejected_naming_the_member() {
    let mut a = shard("a1");
    let empty = reserve(1, Vec::new(), vec![hold("m1", &[])]);
    let r = apply(&mut a, 1, empty);
    assert!(
        format!("{r:?}").contains("names no device"),
        "expected the empty hold named: {r:?}"
    );
    let twice = reserve(2, Vec::new(), vec![hold("m1", &[0]), hold("m1", &[1])]);
    assert!(matches!(
        apply(&mut a, 1, twice),
        LedgerReply::Rejected { .. }
    ));
    let nothing = reserve(3, Vec::new(), Vec::new());
    assert!(matches!(
        apply(&mut a, 1, nothing),
        LedgerReply::Rejected { .. }
    ));
    assert!(holders(&a).is_empty());
}

#[test]
fn a_new_generation_without_a_held_device_evicts_its_holder_on_its_own_shard_only() {
    let (mut a, mut b) = (shard("a1"), shard("b1"));
    apply(
        &mut a,
        1,
        reserve(1, vec![member("m1", "a1")], vec![hold("m1", &[2])]),
    );
    apply(&mut b, 1, reserve(1, Vec::new(), vec![hold("m1", &[2])]));
    for l in [&mut a, &mut b] {
        apply(l, 2, LedgerOp::Commit { txn_id: TxnId(1) });
    }
    let evictions = |l: &mut ShardLedger| match apply(l, 3, publish(rack("r1"), 2, 2)) {
        LedgerReply::PoolPublished { evictions, .. } => evictions,
        other => panic!("{other:?}"),
    };
    let on_a = evictions(&mut a);
    assert_eq!(on_a.len(), 1, "{on_a:?}");
    assert_eq!(
        (on_a[0].member.clone(), on_a[0].node.as_str()),
        (key("m1"), "a1")
    );
    assert!(
        evictions(&mut b).is_empty(),
        "only the member's shard evicts it"
    );
    // The same generation with another reach is refused; a node's pool may not take the
    // name of a network-attached one, nor the reverse.
    let r = apply(&mut a, 4, publish(PoolReach::AllNodes, 2, 2));
    assert!(matches!(r, LedgerReply::Rejected { .. }), "{r:?}");
    let on_node = LedgerOp::PublishPool {
        node: "a1".into(),
        driver: DRIVER.into(),
        pool: POOL.into(),
        generation: 1,
        devices: vec![Device::new("d9")],
        counter_sets: Vec::new(),
    };
    let r = apply(&mut a, 5, on_node);
    assert!(
        format!("{r:?}").contains("network-attached already"),
        "{r:?}"
    );
    let node_pool = LedgerOp::PublishPool {
        node: "a1".into(),
        driver: DRIVER.into(),
        pool: "a1".into(),
        generation: 1,
        devices: vec![Device::new("d9")],
        counter_sets: Vec::new(),
    };
    assert!(matches!(
        apply(&mut a, 6, node_pool),
        LedgerReply::PoolPublished { .. }
    ));
    let mut shadow = publish(PoolReach::AllNodes, 1, 1);
    if let LedgerOp::PublishNetworkPool { pool, .. } = &mut shadow {
        *pool = "a1".into();
    }
    let r = apply(&mut a, 7, shadow);
    assert!(format!("{r:?}").contains("published by node a1"), "{r:?}");
}

#[test]
fn snapshots_keep_pools_and_holds() {
    let mut a = shard("a1");
    apply(
        &mut a,
        1,
        reserve(1, vec![member("m1", "a1")], vec![hold("m1", &[1])]),
    );
    let restored = ShardLedger::restore(&a.snapshot()).expect("restores");
    assert_eq!(restored, a);
    assert_eq!(restored.snapshot(), a.snapshot());
}

// ---- random walk over two shards -----------------------------------------------------

/// One step of the walk.
#[derive(Debug, Clone)]
enum Step {
    /// Transaction `txn` (member `m{txn}` on a node of shard `home`) wants `devices`.
    Begin { home: usize, devices: Vec<usize> },
    /// The coordinator reserves the next pending transaction's next participant.
    Reserve { pick: usize },
    /// A member is released (rule 9) from every shard its placement names.
    Release { pick: usize },
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0usize..2, prop::collection::btree_set(0usize..DEVICES, 1..=2))
            .prop_map(|(home, d)| Step::Begin { home, devices: d.into_iter().collect() }),
        6 => (0usize..16).prop_map(|pick| Step::Reserve { pick }),
        2 => (0usize..16).prop_map(|pick| Step::Release { pick }),
    ]
}

/// Which shards a transaction asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Participants {
    /// Every shard (rule 15).
    Every,
    /// Only the member's own shard: what a coordinator without rule 15 would do.
    MembersOnly,
}

/// A transaction under way: the shards still to ask, and the votes so far.
#[derive(Debug)]
struct Pending {
    txn: u64,
    home: usize,
    devices: Vec<usize>,
    to_ask: Vec<usize>,
    asked: Vec<usize>,
    refused: bool,
}

/// Runs the walk; `Err` names the first cross-shard I1 violation.
fn walk(steps: &[Step], participants: Participants) -> Result<(), String> {
    let mut shards = [shard("a1"), shard("b1")];
    let nodes = ["a1", "b1"];
    let mut pending: Vec<Pending> = Vec::new();
    // Committed member → the shards it holds its devices on.
    let mut placed: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut next = 1u64;
    for (at, step) in steps.iter().enumerate() {
        let at_ms = at as u64 + 1;
        match step {
            Step::Begin { home, devices } => {
                let to_ask = match participants {
                    Participants::Every => vec![*home, 1 - *home],
                    Participants::MembersOnly => vec![*home],
                };
                pending.push(Pending {
                    txn: next,
                    home: *home,
                    devices: devices.clone(),
                    to_ask,
                    asked: Vec::new(),
                    refused: false,
                });
                next += 1;
            }
            Step::Reserve { pick } if !pending.is_empty() => {
                let i = pick % pending.len();
                let p = &mut pending[i];
                let s = p.to_ask.remove(0);
                let name = format!("m{}", p.txn);
                let members = if s == p.home {
                    vec![member(&name, nodes[s])]
                } else {
                    Vec::new()
                };
                let op = reserve(p.txn, members, vec![hold(&name, &p.devices)]);
                match apply(&mut shards[s], at_ms, op) {
                    LedgerReply::Reserved { .. } => p.asked.push(s),
                    _ => p.refused = true,
                }
                if p.to_ask.is_empty() || p.refused {
                    let p = pending.remove(i);
                    let decision = if p.refused {
                        LedgerOp::Abort {
                            txn_id: TxnId(p.txn),
                        }
                    } else {
                        LedgerOp::Commit {
                            txn_id: TxnId(p.txn),
                        }
                    };
                    for s in p.asked.iter().chain(&p.to_ask) {
                        apply(&mut shards[*s], at_ms, decision.clone());
                    }
                    if !p.refused {
                        placed.insert(p.txn, p.asked);
                    }
                }
            }
            Step::Release { pick } if !placed.is_empty() => {
                let txn = *placed.keys().nth(pick % placed.len()).unwrap_or(&0);
                for s in placed.remove(&txn).unwrap_or_default() {
                    let target = ReleaseTarget::Members(vec![key(&format!("m{txn}"))]);
                    apply(&mut shards[s], at_ms, LedgerOp::Release { target });
                }
            }
            _ => {}
        }
        cross_shard_i1(&shards, &placed)?;
    }
    Ok(())
}

/// No device is committed to two members, counting every shard's holds (two open
/// reservations of one device on different shards are allowed: neither can reserve on
/// the other's shard, so at most one commits), and every committed member's devices
/// are held, for it, on every shard it was reserved on.
fn cross_shard_i1(
    shards: &[ShardLedger],
    placed: &BTreeMap<u64, Vec<usize>>,
) -> Result<(), String> {
    let mut owner: BTreeMap<DeviceId, MemberKey> = BTreeMap::new();
    for (s, l) in shards.iter().enumerate() {
        let committed = l
            .network_pools()
            .holds()
            .iter()
            .filter(|(_, slot)| !slot.state.is_reserved())
            .flat_map(|(m, slot)| {
                slot.pod
                    .devices
                    .iter()
                    .map(|a| (a.device.clone(), m.clone()))
            });
        for (device, member) in committed {
            match owner.get(&device) {
                Some(other) if *other != member => {
                    return Err(format!(
                        "I1: {device} held for {other} and, on shard {s}, for {member}"
                    ))
                }
                _ => {
                    owner.insert(device, member);
                }
            }
        }
    }
    for (txn, on) in placed {
        let m = key(&format!("m{txn}"));
        let missing: BTreeSet<&usize> = on
            .iter()
            .filter(|s| shards[**s].network_pools().hold_of(&m).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(format!("{m} committed but not held on shards {missing:?}"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn competing_transactions_never_hold_a_network_device_twice(
        steps in prop::collection::vec(arb_step(), 1..60)
    ) {
        if let Err(e) = walk(&steps, Participants::Every) {
            prop_assert!(false, "{e}\nsteps: {steps:?}");
        }
    }
}

/// The walk's check finds the double booking a coordinator that asked only the
/// members' shards would cause (what rule 15 prevents).
#[test]
fn the_check_catches_holds_taken_on_the_members_shards_only() {
    let mut found = None;
    let mut seed = 1u64;
    for _ in 0..2_000 {
        // A small deterministic generator: the steps of one walk.
        let mut steps = Vec::new();
        for _ in 0..24 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (seed >> 33) as usize;
            steps.push(match r % 3 {
                0 => Step::Begin {
                    home: (r >> 4) % 2,
                    devices: vec![(r >> 8) % DEVICES],
                },
                _ => Step::Reserve { pick: r >> 12 },
            });
        }
        if let Err(e) = walk(&steps, Participants::MembersOnly) {
            found = Some(e);
            break;
        }
    }
    let found = found.expect("asking only the members' shards double-books some device");
    assert!(found.starts_with("I1:"), "{found}");
}

fn observed(claim: &str, devices: &[usize]) -> NetworkHold {
    NetworkHold {
        member: MemberKey::new("ns", crate::ledger::command::OBSERVED_GANG, claim),
        devices: devices.iter().map(|d| alloc(*d)).collect(),
        claim: None,
    }
}

fn set_observed(l: &mut ShardLedger, at_ms: u64, holds: Vec<NetworkHold>) -> LedgerReply {
    apply(l, at_ms, LedgerOp::SetObservedNetworkHolds { holds })
}

#[test]
fn devices_other_schedulers_allocated_are_not_given_out_until_they_free_them() {
    let mut a = shard("a1");
    let r = set_observed(&mut a, 1, vec![observed("theirs", &[0])]);
    assert!(
        matches!(r, LedgerReply::ObservedNetworkHoldsSet { held: 1, ref conflicts } if conflicts.is_empty()),
        "{r:?}"
    );
    let r = apply(&mut a, 2, reserve(1, Vec::new(), vec![hold("m1", &[0])]));
    assert!(matches!(r, LedgerReply::ReserveRefused { .. }), "{r:?}");
    // Gone from the list: free again.
    set_observed(&mut a, 3, Vec::new());
    let r = apply(&mut a, 4, reserve(2, Vec::new(), vec![hold("m1", &[0])]));
    assert!(matches!(r, LedgerReply::Reserved { .. }), "{r:?}");
}

#[test]
fn an_observed_hold_of_a_device_gangway_holds_is_left_out_then_counted_once_free() {
    let mut a = shard("a1");
    let op = LedgerOp::ReserveAndCommit {
        txn_id: TxnId(1),
        members: Vec::new(),
        network: vec![hold("m1", &[1])],
    };
    assert!(matches!(
        apply(&mut a, 1, op),
        LedgerReply::Committed { .. }
    ));
    let r = set_observed(&mut a, 2, vec![observed("theirs", &[1])]);
    let LedgerReply::ObservedNetworkHoldsSet { conflicts, .. } = r else {
        panic!("{r:?}");
    };
    assert_eq!(
        conflicts,
        vec![(observed("theirs", &[]).member, vec![alloc(1).device])]
    );
    // Gangway's member goes; the next list counts the other scheduler's claim.
    let target = ReleaseTarget::Members(vec![key("m1")]);
    apply(&mut a, 3, LedgerOp::Release { target });
    let r = set_observed(&mut a, 4, vec![observed("theirs", &[1])]);
    assert!(
        matches!(r, LedgerReply::ObservedNetworkHoldsSet { ref conflicts, .. } if conflicts.is_empty()),
        "{r:?}"
    );
    let r = apply(&mut a, 5, reserve(2, Vec::new(), vec![hold("m2", &[1])]));
    assert!(matches!(r, LedgerReply::ReserveRefused { .. }), "{r:?}");
}

#[test]
fn observed_holds_must_be_keyed_as_observed_and_name_devices() {
    let mut a = shard("a1");
    for bad in [
        vec![hold("m1", &[0])],
        vec![observed("x", &[])],
        vec![observed("x", &[0]), observed("x", &[1])],
    ] {
        let r = set_observed(&mut a, 1, bad);
        assert!(matches!(r, LedgerReply::Rejected { .. }), "{r:?}");
    }
    assert!(holders(&a).is_empty());
}

/// Shards A (with node a1) and B, with member m1 placed on a1 (a Kubernetes pod)
/// holding network device d0 on both.
fn placed_kube_member() -> (ShardLedger, ShardLedger) {
    let (mut a, mut b) = (shard("a1"), shard("b1"));
    let mut m1 = member("m1", "a1");
    m1.pod.uid = Some("uid-m1".into());
    let op = |members| LedgerOp::ReserveAndCommit {
        txn_id: TxnId(1),
        members,
        network: vec![hold("m1", &[0])],
    };
    assert!(matches!(
        apply(&mut a, 1, op(vec![m1])),
        LedgerReply::Committed { .. }
    ));
    assert!(matches!(
        apply(&mut b, 1, op(Vec::new())),
        LedgerReply::Committed { .. }
    ));
    (a, b)
}

pub(super) fn evictions_asked(l: &ShardLedger, at_ms: u64) -> Vec<(MemberKey, String)> {
    let q = crate::query::ShardQuery::Evictions { at_ms, limit: 100 };
    match crate::query::answer(l, &q, &mut crate::engine::Placer::new()) {
        crate::query::ShardAnswer::Evictions { pods } => {
            pods.into_iter().map(|p| (p.member, p.node)).collect()
        }
        other => panic!("{other:?}"),
    }
}

/// A rule's NoExecute taint on the network device d0.
pub(super) fn ecc_no_execute_on_d0() -> LedgerOp {
    use crate::model::device::{DeviceTaint, DeviceTaintEffect};
    LedgerOp::SetDeviceTaints {
        node: String::new(),
        device: alloc(0).device,
        taints: vec![DeviceTaint {
            key: "example.com/ecc".into(),
            value: "true".into(),
            effect: DeviceTaintEffect::NoExecute,
            time_added_ms: Some(2),
        }],
    }
}

/// The (member, node) evictions a `SetDeviceTaints` reply asks for.
pub(super) fn evicted(reply: LedgerReply) -> Vec<(MemberKey, String)> {
    match reply {
        LedgerReply::DeviceTaintsSet { evictions, .. } => {
            evictions.into_iter().map(|e| (e.member, e.node)).collect()
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rule_taint_on_a_network_device_evicts_its_holder_from_its_own_shard() {
    let (mut a, mut b) = placed_kube_member();
    let taint = ecc_no_execute_on_d0();
    assert_eq!(
        evicted(apply(&mut a, 2, taint.clone())),
        vec![(key("m1"), "a1".to_string())]
    );
    assert_eq!(
        evicted(apply(&mut b, 2, taint)),
        Vec::new(),
        "B places no pod"
    );
    assert_eq!(evictions_asked(&a, 3), vec![(key("m1"), "a1".to_string())]);
    assert!(evictions_asked(&b, 3).is_empty());
    let rules = crate::query::answer(
        &a,
        &crate::query::ShardQuery::RuleTaints,
        &mut crate::engine::Placer::new(),
    );
    assert!(
        format!("{rules:?}").contains("example.com/ecc"),
        "{rules:?}"
    );
}

#[test]
fn a_network_device_removed_from_its_pool_evicts_its_holder() {
    let (mut a, _) = placed_kube_member();
    // Generation 2 keeps d1 and d2 only: m1's d0 is gone.
    let mut op = publish(rack("r1"), 2, DEVICES);
    if let LedgerOp::PublishNetworkPool { devices, .. } = &mut op {
        devices.remove(0);
    }
    apply(&mut a, 2, op);
    assert_eq!(evictions_asked(&a, 3), vec![(key("m1"), "a1".to_string())]);
}
