//! Device ledger tests: pools and generations, I1 under reserve/commit/release, health,
//! taints, agent links, device classes, and property tests over random command
//! sequences (I1 after every command, rejections change nothing, replicas agree byte
//! for byte, snapshots round-trip).

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::ledger::command::{
    DeviceRefusal, LedgerCommand, LedgerError, LedgerOp, LedgerReply, NodeChange, Presence,
    RefusalCause, ReleaseTarget, ReserveMember, TxnId,
};
use crate::ledger::devices::{
    AgentLink, DeviceHealth, DeviceHealthReport, EvictionCause, PoolChange, PoolKey,
    PoolWithdrawal, AGENT_GRACE_MS_DEFAULT,
};
use crate::ledger::shard::ShardLedger;
use crate::model::claim::{AdminAccess, DeviceAllocation, DeviceToleration};
use crate::model::device::{
    AllocationSharing, AttributeValue, CelSelector, CounterConsumption, CounterSet, Device,
    DeviceCapacity, DeviceClass, DeviceId, DeviceQuantity, DeviceTaint, DeviceTaintEffect,
};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::{PodSummary, TolerationOperator};

const DRIVER: &str = "gpu.example.com";

fn node(name: &str) -> Node {
    crate::fixtures::node_with(name, 64_000, 1 << 40, 100)
}

fn key(member: &str) -> MemberKey {
    MemberKey::new("ns", "g", member)
}

fn q(units: u64) -> DeviceQuantity {
    DeviceQuantity::from_units(units)
}

fn id(pool: &str, device: &str) -> DeviceId {
    DeviceId::new(DRIVER, pool, device)
}

use crate::fixtures::apply;

fn publish(
    node: &str,
    pool: &str,
    generation: u64,
    devices: Vec<Device>,
    sets: Vec<CounterSet>,
) -> LedgerOp {
    LedgerOp::PublishPool {
        node: node.into(),
        driver: DRIVER.into(),
        pool: pool.into(),
        generation,
        devices,
        counter_sets: sets,
    }
}

fn gpus(n: usize) -> Vec<Device> {
    (0..n).map(|i| Device::new(format!("gpu-{i}"))).collect()
}

fn alloc(pool: &str, device: &str) -> DeviceAllocation {
    DeviceAllocation {
        claim: "c".into(),
        request: "r".into(),
        device: id(pool, device),
        admin_access: AdminAccess::Disabled,
        tolerations: vec![],
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    }
}

fn with_devices(devices: Vec<DeviceAllocation>) -> PodSummary {
    PodSummary {
        devices,
        ..PodSummary::default()
    }
}

fn rm(member: &str, node: &str, devices: Vec<DeviceAllocation>) -> ReserveMember {
    ReserveMember {
        member: key(member),
        node: node.into(),
        pod: with_devices(devices),
    }
}

fn commit_now(txn: u64, members: Vec<ReserveMember>) -> LedgerOp {
    LedgerOp::ReserveAndCommit {
        txn_id: TxnId(txn),
        members,
        network: Vec::new(),
    }
}

fn release(member: &str) -> LedgerOp {
    LedgerOp::Release {
        target: ReleaseTarget::Members(vec![key(member)]),
    }
}

fn ledger_with_gpus(n: usize) -> ShardLedger {
    let mut l = ShardLedger::new();
    apply(&mut l, 0, LedgerOp::RegisterNode { node: node("n1") });
    let reply = apply(&mut l, 0, publish("n1", "p", 1, gpus(n), vec![]));
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

fn refused_for(reply: &LedgerReply) -> Option<&DeviceRefusal> {
    match reply {
        LedgerReply::ReserveRefused { refusals, .. } => {
            refusals.iter().find_map(|r| match &r.cause {
                RefusalCause::DeviceUnavailable { reason, .. } => Some(reason),
                _ => None,
            })
        }
        _ => None,
    }
}

fn evictions(reply: &LedgerReply) -> Vec<(MemberKey, EvictionCause, u64)> {
    let list = match reply {
        LedgerReply::PoolPublished { evictions, .. }
        | LedgerReply::DeviceHealthRecorded { evictions, .. }
        | LedgerReply::DeviceTaintsSet { evictions, .. }
        | LedgerReply::Expired { evictions, .. } => evictions.clone(),
        _ => vec![],
    };
    list.into_iter()
        .map(|e| (e.member, e.cause, e.evict_at_ms))
        .collect()
}

#[test]
fn pool_generations_replace_ignore_and_refuse_reuse() {
    let mut l = ledger_with_gpus(2);
    let reply = apply(&mut l, 1, publish("n1", "p", 3, gpus(4), vec![]));
    assert!(matches!(
        reply,
        LedgerReply::PoolPublished {
            change: PoolChange::Replaced,
            ..
        }
    ));
    let reply = apply(&mut l, 2, publish("n1", "p", 2, gpus(1), vec![]));
    assert!(matches!(
        reply,
        LedgerReply::PoolPublished {
            change: PoolChange::Stale { current: 3 },
            ..
        }
    ));
    let reply = apply(&mut l, 3, publish("n1", "p", 3, gpus(4), vec![]));
    assert!(matches!(
        reply,
        LedgerReply::PoolPublished {
            change: PoolChange::Unchanged,
            ..
        }
    ));
    let before = l.snapshot();
    let reply = apply(&mut l, 4, publish("n1", "p", 3, gpus(5), vec![]));
    assert!(matches!(
        reply,
        LedgerReply::Rejected {
            error: LedgerError::PoolGenerationReused { generation: 3, .. }
        }
    ));
    assert_eq!(l.snapshot(), before);
    let devices = &l
        .node("n1")
        .map(|e| e.usage.devices.clone())
        .unwrap_or_default();
    assert_eq!(
        devices.pools.values().next().map(|p| p.devices.len()),
        Some(4)
    );
    let unknown = apply(&mut l, 5, publish("n7", "p", 1, gpus(1), vec![]));
    assert!(matches!(
        unknown,
        LedgerReply::Rejected {
            error: LedgerError::UnknownNode { .. }
        }
    ));
}

#[test]
fn bad_pools_name_the_field_and_change_nothing() {
    let mut l = ledger_with_gpus(1);
    let before = l.snapshot();
    let mut devices = gpus(3);
    devices[2].name = "gpu-0".into();
    let reply = apply(&mut l, 1, publish("n1", "p", 2, devices, vec![]));
    let LedgerReply::Rejected {
        error: LedgerError::InvalidPool { message },
    } = reply
    else {
        panic!("expected InvalidPool, got {reply:?}");
    };
    assert_eq!(message, "devices[2].name: duplicate device name \"gpu-0\"");
    assert_eq!(l.snapshot(), before);
    let mut counters = gpus(1);
    counters[0].push_counter_use(CounterConsumption {
        counter_set: "missing".into(),
        counters: BTreeMap::from([("memory".to_string(), q(1))]),
    });
    let reply = apply(&mut l, 1, publish("n1", "p", 2, counters, vec![]));
    assert!(
        matches!(&reply, LedgerReply::Rejected { error: LedgerError::InvalidPool { message } }
            if message.starts_with("devices[0].consumesCounters[0].counterSet")),
        "{reply:?}"
    );
    assert_eq!(l.snapshot(), before);
}

#[test]
fn exclusive_devices_are_held_once_and_return_on_release() {
    let mut l = ledger_with_gpus(2);
    let reply = apply(
        &mut l,
        1,
        commit_now(1, vec![rm("a", "n1", vec![alloc("p", "gpu-0")])]),
    );
    assert_eq!(reply, LedgerReply::Committed { txn_id: TxnId(1) });
    let reply = apply(
        &mut l,
        2,
        commit_now(2, vec![rm("b", "n1", vec![alloc("p", "gpu-0")])]),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::InUse));
    // Two members of one batch cannot take the same device either.
    let reply = apply(
        &mut l,
        3,
        commit_now(
            3,
            vec![
                rm("b", "n1", vec![alloc("p", "gpu-1")]),
                rm("c", "n1", vec![alloc("p", "gpu-1")]),
            ],
        ),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::InUse));
    let reply = apply(
        &mut l,
        4,
        commit_now(4, vec![rm("b", "n1", vec![alloc("p", "gpu-9")])]),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::NotPublished));
    apply(&mut l, 5, release("a"));
    let reply = apply(
        &mut l,
        6,
        commit_now(5, vec![rm("b", "n1", vec![alloc("p", "gpu-0")])]),
    );
    assert_eq!(reply, LedgerReply::Committed { txn_id: TxnId(5) });
    // Admin access takes nothing.
    let mut admin = alloc("p", "gpu-0");
    admin.admin_access = AdminAccess::Enabled;
    let reply = apply(&mut l, 7, commit_now(6, vec![rm("m", "n1", vec![admin])]));
    assert_eq!(reply, LedgerReply::Committed { txn_id: TxnId(6) });
    assert_eq!(l.check_invariants(), Ok(()));
}

#[test]
fn shared_devices_hold_claims_up_to_their_capacity() {
    let mut l = ShardLedger::new();
    apply(&mut l, 0, LedgerOp::RegisterNode { node: node("n1") });
    let mut nic = Device::new("nic-0");
    nic.sharing = AllocationSharing::Shared;
    nic.capacity
        .insert("bandwidth".into(), DeviceCapacity::fixed(q(10)));
    apply(&mut l, 0, publish("n1", "p", 1, vec![nic], vec![]));
    let share = |member: &str, amount: u64| {
        let mut a = alloc("p", "nic-0");
        a.share_id = Some(format!("{member}/c/r"));
        a.consumed_capacity.insert("bandwidth".into(), q(amount));
        rm(member, "n1", vec![a])
    };
    assert!(matches!(
        apply(&mut l, 1, commit_now(1, vec![share("a", 4)])),
        LedgerReply::Committed { .. }
    ));
    assert!(matches!(
        apply(&mut l, 2, commit_now(2, vec![share("b", 6)])),
        LedgerReply::Committed { .. }
    ));
    let reply = apply(&mut l, 3, commit_now(3, vec![share("c", 1)]));
    assert_eq!(
        refused_for(&reply),
        Some(&DeviceRefusal::CapacityExceeded {
            capacity: "bandwidth".into()
        })
    );
    let mut unshared = alloc("p", "nic-0");
    unshared.consumed_capacity.insert("bandwidth".into(), q(0));
    let reply = apply(
        &mut l,
        4,
        commit_now(4, vec![rm("d", "n1", vec![unshared])]),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::ShareIdMissing));
    apply(&mut l, 5, release("a"));
    assert!(matches!(
        apply(&mut l, 6, commit_now(5, vec![share("c", 4)])),
        LedgerReply::Committed { .. }
    ));
    assert_eq!(l.check_invariants(), Ok(()));
}

/// One GPU with 40 units of memory carved into 20-unit and 10-unit slices.
fn mig_pool() -> (Vec<Device>, Vec<CounterSet>) {
    let set = CounterSet {
        name: "gpu-0".into(),
        counters: BTreeMap::from([("memory".to_string(), q(40))]),
    };
    let slice = |name: &str, memory: u64| {
        let mut d = Device::new(name);
        d.push_counter_use(CounterConsumption {
            counter_set: "gpu-0".into(),
            counters: BTreeMap::from([("memory".to_string(), q(memory))]),
        });
        d
    };
    (
        vec![
            slice("gpu-0-whole", 40),
            slice("gpu-0-a", 20),
            slice("gpu-0-b", 20),
            slice("gpu-0-c", 10),
        ],
        vec![set],
    )
}

#[test]
fn partitions_never_over_consume_their_counters() {
    let mut l = ShardLedger::new();
    apply(&mut l, 0, LedgerOp::RegisterNode { node: node("n1") });
    let (devices, sets) = mig_pool();
    apply(&mut l, 0, publish("n1", "p", 1, devices, sets));
    assert!(matches!(
        apply(
            &mut l,
            1,
            commit_now(1, vec![rm("a", "n1", vec![alloc("p", "gpu-0-a")])])
        ),
        LedgerReply::Committed { .. }
    ));
    let reply = apply(
        &mut l,
        2,
        commit_now(2, vec![rm("b", "n1", vec![alloc("p", "gpu-0-whole")])]),
    );
    assert_eq!(
        refused_for(&reply),
        Some(&DeviceRefusal::CountersExceeded {
            counter_set: "gpu-0".into(),
            counter: "memory".into()
        })
    );
    assert!(matches!(
        apply(
            &mut l,
            3,
            commit_now(3, vec![rm("b", "n1", vec![alloc("p", "gpu-0-b")])])
        ),
        LedgerReply::Committed { .. }
    ));
    let reply = apply(
        &mut l,
        4,
        commit_now(4, vec![rm("c", "n1", vec![alloc("p", "gpu-0-c")])]),
    );
    assert!(matches!(
        refused_for(&reply),
        Some(DeviceRefusal::CountersExceeded { .. })
    ));
    apply(&mut l, 5, release("a"));
    apply(&mut l, 5, release("b"));
    assert!(matches!(
        apply(
            &mut l,
            6,
            commit_now(5, vec![rm("c", "n1", vec![alloc("p", "gpu-0-whole")])])
        ),
        LedgerReply::Committed { .. }
    ));
    assert_eq!(l.check_invariants(), Ok(()));
}

#[test]
fn unhealthy_devices_take_nothing_and_evict_their_holders() {
    let mut l = ledger_with_gpus(2);
    apply(
        &mut l,
        1,
        commit_now(1, vec![rm("a", "n1", vec![alloc("p", "gpu-0")])]),
    );
    let report = |device: &str, health| LedgerOp::SetDeviceHealth {
        node: "n1".into(),
        devices: vec![DeviceHealthReport {
            device: id("p", device),
            health,
        }],
    };
    let reply = apply(&mut l, 10, report("gpu-0", DeviceHealth::Unhealthy));
    assert_eq!(
        evictions(&reply),
        vec![(key("a"), EvictionCause::Unhealthy, 10)]
    );
    apply(&mut l, 11, report("gpu-1", DeviceHealth::Unhealthy));
    let reply = apply(
        &mut l,
        12,
        commit_now(2, vec![rm("b", "n1", vec![alloc("p", "gpu-1")])]),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::Unhealthy));
    apply(&mut l, 13, report("gpu-1", DeviceHealth::Healthy));
    assert!(matches!(
        apply(
            &mut l,
            14,
            commit_now(3, vec![rm("b", "n1", vec![alloc("p", "gpu-1")])])
        ),
        LedgerReply::Committed { .. }
    ));
    let reply = apply(&mut l, 15, report("gpu-7", DeviceHealth::Healthy));
    assert!(matches!(
        reply,
        LedgerReply::Rejected {
            error: LedgerError::UnknownDevice { .. }
        }
    ));
}

#[test]
fn no_execute_taints_evict_unless_tolerated() {
    let mut l = ledger_with_gpus(3);
    let tolerate = |seconds: Option<i64>| DeviceToleration {
        key: "example.com/maintenance".into(),
        operator: TolerationOperator::Exists,
        value: String::new(),
        effect: Some(DeviceTaintEffect::NoExecute),
        toleration_seconds: seconds,
    };
    let mut forever = alloc("p", "gpu-1");
    forever.tolerations.push(tolerate(None));
    let mut a_while = alloc("p", "gpu-2");
    a_while.tolerations.push(tolerate(Some(30)));
    apply(
        &mut l,
        1,
        commit_now(
            1,
            vec![
                rm("a", "n1", vec![alloc("p", "gpu-0")]),
                rm("b", "n1", vec![forever]),
                rm("c", "n1", vec![a_while]),
            ],
        ),
    );
    let mut tainted = gpus(3);
    for d in &mut tainted {
        d.push_taint(DeviceTaint {
            key: "example.com/maintenance".into(),
            value: String::new(),
            effect: DeviceTaintEffect::NoExecute,
            time_added_ms: Some(1_000),
        });
    }
    let reply = apply(&mut l, 2_000, publish("n1", "p", 2, tainted, vec![]));
    let taint = EvictionCause::NoExecuteTaint {
        key: "example.com/maintenance".into(),
        value: String::new(),
    };
    assert_eq!(
        evictions(&reply),
        vec![(key("a"), taint.clone(), 2_000), (key("c"), taint, 31_000)]
    );
    // A NoSchedule rule taint refuses new allocations that do not tolerate it.
    apply(&mut l, 2_001, release("a"));
    let reply = apply(
        &mut l,
        2_002,
        LedgerOp::SetDeviceTaints {
            node: "n1".into(),
            device: id("p", "gpu-0"),
            taints: vec![],
        },
    );
    assert!(matches!(reply, LedgerReply::DeviceTaintsSet { .. }));
    let reply = apply(
        &mut l,
        2_003,
        commit_now(2, vec![rm("d", "n1", vec![alloc("p", "gpu-0")])]),
    );
    assert_eq!(
        refused_for(&reply),
        Some(&DeviceRefusal::Tainted {
            key: "example.com/maintenance".into(),
            effect: DeviceTaintEffect::NoExecute
        })
    );
    let bad = apply(
        &mut l,
        2_004,
        LedgerOp::SetDeviceTaints {
            node: "n1".into(),
            device: id("p", "gpu-0"),
            taints: vec![DeviceTaint {
                key: "bad key".into(),
                value: String::new(),
                effect: DeviceTaintEffect::NoSchedule,
                time_added_ms: None,
            }],
        },
    );
    assert!(
        matches!(&bad, LedgerReply::Rejected { error: LedgerError::InvalidTaints { message } } if message.starts_with("taints[0].key")),
        "{bad:?}"
    );
}

#[test]
fn a_lost_agent_marks_devices_unhealthy_after_the_grace_period() {
    let mut l = ledger_with_gpus(2);
    apply(
        &mut l,
        1,
        commit_now(1, vec![rm("a", "n1", vec![alloc("p", "gpu-0")])]),
    );
    let reply = apply(
        &mut l,
        100,
        LedgerOp::AgentDisconnected {
            node: "n1".into(),
            since_ms: 100,
            grace_ms: None,
        },
    );
    assert!(matches!(
        reply,
        LedgerReply::AgentLinkRecorded {
            link: AgentLink::Disconnected { .. },
            ..
        }
    ));
    let deadline = 100 + AGENT_GRACE_MS_DEFAULT;
    // Within the grace period nothing changes.
    assert_eq!(
        evictions(&apply(&mut l, deadline - 1, LedgerOp::Tick)),
        vec![]
    );
    assert!(matches!(
        apply(
            &mut l,
            deadline - 1,
            commit_now(2, vec![rm("b", "n1", vec![alloc("p", "gpu-1")])])
        ),
        LedgerReply::Committed { .. }
    ));
    apply(&mut l, deadline - 1, release("b"));
    // Past it, a reserve already sees the devices unhealthy, before any tick.
    let reply = apply(
        &mut l,
        deadline,
        commit_now(3, vec![rm("b", "n1", vec![alloc("p", "gpu-1")])]),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::Unhealthy));
    let reply = apply(&mut l, deadline + 5, LedgerOp::Tick);
    assert_eq!(
        evictions(&reply),
        vec![(key("a"), EvictionCause::Unhealthy, deadline + 5)]
    );
    assert_eq!(
        evictions(&apply(&mut l, deadline + 6, LedgerOp::Tick)),
        vec![],
        "applied once"
    );
    let devices = l
        .node("n1")
        .map(|e| e.usage.devices.clone())
        .unwrap_or_default();
    assert!(matches!(devices.agent, AgentLink::Lost { since_ms: 100 }));
    assert_eq!(devices.unhealthy.len(), 2);
    let reply = apply(
        &mut l,
        deadline + 7,
        LedgerOp::AgentConnected { node: "n1".into() },
    );
    assert!(matches!(
        reply,
        LedgerReply::AgentLinkRecorded {
            link: AgentLink::Connected,
            ..
        }
    ));
    assert_eq!(l.check_invariants(), Ok(()));
}

#[test]
fn a_republished_pool_without_a_held_device_evicts_its_holder() {
    let mut l = ledger_with_gpus(2);
    apply(
        &mut l,
        1,
        commit_now(
            1,
            vec![
                rm("a", "n1", vec![alloc("p", "gpu-0")]),
                rm("b", "n1", vec![alloc("p", "gpu-1")]),
            ],
        ),
    );
    let reply = apply(&mut l, 50, publish("n1", "p", 2, gpus(1), vec![]));
    assert_eq!(
        evictions(&reply),
        vec![(key("b"), EvictionCause::DeviceRemoved, 50)]
    );
    assert_eq!(l.check_invariants(), Ok(()));
    let reply = apply(&mut l, 51, publish("n1", "p", 3, gpus(2), vec![]));
    assert_eq!(evictions(&reply), vec![], "b stays detached until it goes");
    assert!(matches!(
        apply(
            &mut l,
            52,
            commit_now(2, vec![rm("c", "n1", vec![alloc("p", "gpu-1")])])
        ),
        LedgerReply::Committed { .. }
    ));
    apply(&mut l, 53, release("b"));
    assert_eq!(l.check_invariants(), Ok(()));
    let restored = ShardLedger::restore(&l.snapshot()).expect("restores");
    assert_eq!(restored.snapshot(), l.snapshot());
}

#[test]
fn device_classes_are_ledger_state() {
    let mut l = ShardLedger::new();
    let class = DeviceClass {
        name: "gpu.example.com".into(),
        selectors: vec![CelSelector::new("device.driver == 'gpu.example.com'")],
        config: vec![],
        extended_resource_name: Some("example.com/gpu".into()),
    };
    let reply = apply(
        &mut l,
        1,
        LedgerOp::PutDeviceClass {
            class: class.clone(),
        },
    );
    assert_eq!(
        reply,
        LedgerReply::DeviceClassStored {
            name: class.name.clone(),
            change: NodeChange::Added
        }
    );
    let before = l.snapshot();
    let mut bad = class.clone();
    bad.selectors[0].expression = "device.attributes".into();
    let reply = apply(&mut l, 2, LedgerOp::PutDeviceClass { class: bad });
    assert!(
        matches!(&reply, LedgerReply::Rejected { error: LedgerError::InvalidDeviceClass { message } }
            if message.starts_with("spec.selectors[0].cel.expression: must evaluate to bool")),
        "{reply:?}"
    );
    assert_eq!(l.snapshot(), before);
    assert_eq!(l.device_classes().len(), 1);
    let restored = ShardLedger::restore(&before).expect("restores");
    assert_eq!(
        restored.device_classes().get("gpu.example.com"),
        Some(&class)
    );
    let reply = apply(
        &mut l,
        3,
        LedgerOp::RemoveDeviceClass {
            name: class.name.clone(),
        },
    );
    assert!(matches!(
        reply,
        LedgerReply::DeviceClassRemoved {
            presence: Presence::Removed,
            ..
        }
    ));
}

// ---- property tests ------------------------------------------------------------------------

const NODES: [&str; 2] = ["n1", "n2"];
const POOLS: [&str; 2] = ["p0", "p1"];
const DEVICES: [&str; 4] = ["d0", "d1", "d2", "d3"];
const MEMBERS: [&str; 5] = ["a", "b", "c", "d", "e"];
const TAINT_KEY: &str = "example.com/t";

fn arb_taint() -> impl Strategy<Value = DeviceTaint> {
    (any::<bool>(), 0u64..3).prop_map(|(no_execute, added)| DeviceTaint {
        key: TAINT_KEY.into(),
        value: String::new(),
        effect: if no_execute {
            DeviceTaintEffect::NoExecute
        } else {
            DeviceTaintEffect::NoSchedule
        },
        time_added_ms: Some(added * 10),
    })
}

fn arb_device(name: &'static str) -> impl Strategy<Value = Device> {
    (
        any::<bool>(),
        1u64..12,
        prop::option::of(0u64..5),
        0u8..5,
        arb_taint(),
    )
        .prop_map(move |(shared, capacity, counter, taint_roll, taint)| {
            let mut d = Device::new(name);
            if shared {
                d.sharing = AllocationSharing::Shared;
                d.capacity
                    .insert("mem".into(), DeviceCapacity::fixed(q(capacity)));
            }
            if let Some(c) = counter {
                d.push_counter_use(CounterConsumption {
                    counter_set: "s".into(),
                    counters: BTreeMap::from([("mem".to_string(), q(c))]),
                });
            }
            if taint_roll == 0 {
                d.push_taint(taint);
            }
            d
        })
}

fn arb_publish() -> impl Strategy<Value = LedgerOp> {
    (
        0usize..NODES.len(),
        0usize..POOLS.len(),
        0u64..4,
        prop::collection::vec(0u8..4, DEVICES.len()),
        (
            arb_device("d0"),
            arb_device("d1"),
            arb_device("d2"),
            arb_device("d3"),
        ),
        2u64..12,
        0u8..10,
    )
        .prop_map(
            |(n, p, generation, present, (d0, d1, d2, d3), total, duplicate)| {
                let mut devices: Vec<Device> = [d0, d1, d2, d3]
                    .into_iter()
                    .zip(present)
                    .filter(|(_, keep)| *keep > 0)
                    .map(|(d, _)| d)
                    .collect();
                if duplicate == 0 {
                    if let Some(first) = devices.first().cloned() {
                        devices.push(first);
                    }
                }
                let sets = vec![CounterSet {
                    name: "s".into(),
                    counters: BTreeMap::from([("mem".to_string(), q(total))]),
                }];
                LedgerOp::PublishPool {
                    node: NODES[n].into(),
                    driver: DRIVER.into(),
                    pool: POOLS[p].into(),
                    generation,
                    devices,
                    counter_sets: sets,
                }
            },
        )
}

fn arb_allocation() -> impl Strategy<Value = DeviceAllocation> {
    (
        0usize..POOLS.len(),
        0usize..DEVICES.len() * 8 + 1,
        0u8..10,
        0u64..6,
        any::<bool>(),
        0u8..3,
    )
        .prop_map(|(p, d, admin, consumed, shared, tolerates)| {
            let device = if d == DEVICES.len() * 8 {
                "d9"
            } else {
                DEVICES[d % DEVICES.len()]
            };
            let mut a = alloc(POOLS[p], device);
            if admin == 0 {
                a.admin_access = AdminAccess::Enabled;
            }
            if shared {
                a.consumed_capacity.insert("mem".into(), q(consumed));
                a.share_id = Some(format!("share-{p}-{d}-{admin}-{consumed}"));
            }
            if tolerates > 0 {
                a.tolerations.push(DeviceToleration {
                    key: TAINT_KEY.into(),
                    operator: TolerationOperator::Exists,
                    value: String::new(),
                    effect: Some(DeviceTaintEffect::NoExecute).filter(|_| tolerates == 1),
                    toleration_seconds: None,
                });
            }
            a
        })
}

fn arb_member() -> impl Strategy<Value = ReserveMember> {
    (
        0usize..MEMBERS.len(),
        0usize..NODES.len(),
        prop::collection::vec(arb_allocation(), 0..=2),
    )
        .prop_map(|(m, n, devices)| rm(MEMBERS[m], NODES[n], devices))
}

fn arb_device_id() -> impl Strategy<Value = DeviceId> {
    (0usize..POOLS.len(), 0usize..DEVICES.len()).prop_map(|(p, d)| id(POOLS[p], DEVICES[d]))
}

fn arb_op() -> impl Strategy<Value = LedgerOp> {
    let txn = || (0u64..6).prop_map(TxnId);
    let node_name = || (0usize..NODES.len()).prop_map(|n| NODES[n].to_string());
    prop_oneof![
        1 => node_name().prop_map(|n| LedgerOp::RegisterNode { node: node(&n) }),
        1 => node_name().prop_map(|name| LedgerOp::RemoveNode { name }),
        3 => (0usize..MEMBERS.len()).prop_map(|m| LedgerOp::Release { target: ReleaseTarget::Members(vec![key(MEMBERS[m])]) }),
        4 => arb_publish(),
        5 => (txn(), prop::collection::vec(arb_member(), 1..=2), 1u64..80)
            .prop_map(|(txn_id, members, deadline_ms)| LedgerOp::Reserve { txn_id, members, deadline_ms: 1_000_000 + deadline_ms, network: Vec::new() }),
        5 => (txn(), prop::collection::vec(arb_member(), 1..=2))
            .prop_map(|(txn_id, members)| LedgerOp::ReserveAndCommit { txn_id, members, network: Vec::new() }),
        2 => txn().prop_map(|txn_id| LedgerOp::Commit { txn_id }),
        2 => txn().prop_map(|txn_id| LedgerOp::Abort { txn_id }),
        2 => prop::collection::vec(0usize..MEMBERS.len(), 0..3)
            .prop_map(|ms| LedgerOp::Release { target: ReleaseTarget::Members(ms.into_iter().map(|m| key(MEMBERS[m])).collect()) }),
        2 => (node_name(), prop::collection::vec((arb_device_id(), any::<bool>()), 0..3))
            .prop_map(|(node, reports)| LedgerOp::SetDeviceHealth {
                node,
                devices: reports.into_iter().map(|(device, sick)| DeviceHealthReport {
                    device,
                    health: if sick { DeviceHealth::Unhealthy } else { DeviceHealth::Healthy },
                }).collect(),
            }),
        1 => (node_name(), arb_device_id(), prop::collection::vec(arb_taint(), 0..2))
            .prop_map(|(node, device, taints)| LedgerOp::SetDeviceTaints { node, device, taints }),
        1 => (node_name(), 0u64..50, prop::option::of(0u64..40))
            .prop_map(|(node, since_ms, grace_ms)| LedgerOp::AgentDisconnected { node, since_ms, grace_ms }),
        1 => node_name().prop_map(|node| LedgerOp::AgentConnected { node }),
        1 => Just(LedgerOp::Tick),
        1 => (node_name(), 0usize..POOLS.len())
            .prop_map(|(node, p)| withdraw(&node, POOLS[p])),
    ]
}

fn arb_commands() -> impl Strategy<Value = Vec<LedgerCommand>> {
    (
        prop::collection::vec(arb_publish(), 4),
        prop::collection::vec((0u64..20, arb_op()), 1..80),
    )
        .prop_map(|(first, steps)| {
            let mut at_ms = 0;
            // Every (node, pool) starts published.
            let first = first.into_iter().enumerate().map(|(i, mut op)| {
                if let LedgerOp::PublishPool {
                    node,
                    pool,
                    devices,
                    ..
                } = &mut op
                {
                    *node = NODES[i / 2].to_string();
                    *pool = POOLS[i % 2].to_string();
                    let mut seen = std::collections::BTreeSet::new();
                    devices.retain(|d| seen.insert(d.name.clone()));
                }
                LedgerCommand::new(0, op)
            });
            let mut out: Vec<LedgerCommand> = NODES
                .iter()
                .map(|n| LedgerCommand::new(0, LedgerOp::RegisterNode { node: node(n) }))
                .chain(first)
                .collect();
            for (delta, op) in steps {
                at_ms += delta;
                out.push(LedgerCommand::new(at_ms, op));
            }
            out
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn i1_holds_after_every_command(commands in arb_commands()) {
        let mut ledger = ShardLedger::new();
        for cmd in &commands {
            let before = ledger.snapshot();
            let reply = ledger.apply(cmd);
            prop_assert_eq!(ledger.check_invariants(), Ok(()), "after {:?} → {:?}", cmd, reply);
            if matches!(reply, LedgerReply::Rejected { .. }) {
                prop_assert_eq!(ledger.snapshot(), before);
            }
        }
    }

    #[test]
    fn withdrawn_pools_give_out_nothing_and_take_nothing_back(commands in arb_commands()) {
        let mut ledger = ShardLedger::new();
        for cmd in &commands {
            let withdrawn = withdrawn_devices(&ledger, &cmd.op);
            let held_before = holdings(&ledger);
            let reply = ledger.apply(cmd);
            // (A retried transaction answers as before and holds nothing new.)
            let took = holdings(&ledger) != held_before;
            if took && matches!(reply, LedgerReply::Reserved { .. } | LedgerReply::Committed { .. }) {
                prop_assert!(withdrawn.is_empty(), "{:?} took {:?} of a withdrawn pool", cmd, withdrawn);
            }
            if let LedgerOp::WithdrawPool { .. } = cmd.op {
                prop_assert!(matches!(reply, LedgerReply::PoolWithdrawn { .. }), "{:?}", reply);
                prop_assert_eq!(holdings(&ledger), held_before, "a withdrawal changed holdings");
            }
        }
    }

    #[test]
    fn device_commands_are_deterministic_and_round_trip(commands in arb_commands()) {
        let last: Vec<_> = commands.iter().rev().take(10).cloned().collect();
        crate::fixtures::replicas_agree(&commands, &last)?;
    }
}

fn withdraw(node: &str, pool: &str) -> LedgerOp {
    LedgerOp::WithdrawPool {
        node: node.into(),
        driver: DRIVER.into(),
        pool: pool.into(),
    }
}

/// Devices a reservation in `op` names whose pools are withdrawn on their member's node.
fn withdrawn_devices(l: &ShardLedger, op: &LedgerOp) -> Vec<DeviceId> {
    let members = match op {
        LedgerOp::Reserve { members, .. } | LedgerOp::ReserveAndCommit { members, .. } => members,
        _ => return Vec::new(),
    };
    members
        .iter()
        .flat_map(|m| {
            let devices = l.node(&m.node).map(|e| &e.usage.devices);
            m.pod.devices.iter().filter_map(move |a| {
                let pool = devices?.pools.get(&crate::ledger::devices::PoolKey {
                    driver: a.device.driver.clone(),
                    pool: a.device.pool.clone(),
                })?;
                (!pool.standing.is_offered()).then(|| a.device.clone())
            })
        })
        .collect()
}

/// Every node's device holdings and the members placed on it.
fn holdings(l: &ShardLedger) -> Vec<(String, String, Vec<MemberKey>)> {
    l.nodes()
        .map(|e| {
            (
                e.node.name.clone(),
                format!("{:?}", e.usage.devices.held),
                e.usage.pods.keys().cloned().collect(),
            )
        })
        .collect()
}

#[test]
fn a_withdrawn_pool_offers_nothing_keeps_its_holders_and_returns_at_any_generation() {
    let mut l = ledger_with_gpus(2);
    apply(&mut l, 1, publish("n1", "p", 5, gpus(2), vec![]));
    let reply = apply(
        &mut l,
        2,
        commit_now(1, vec![rm("a", "n1", vec![alloc("p", "gpu-0")])]),
    );
    assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
    let reply = apply(&mut l, 3, withdraw("n1", "p"));
    assert_eq!(
        reply,
        LedgerReply::PoolWithdrawn {
            node: "n1".into(),
            driver: DRIVER.into(),
            pool: "p".into(),
            outcome: PoolWithdrawal::Withdrawn,
        }
    );
    assert_eq!(l.check_invariants(), Ok(()));
    assert!(
        l.node("n1")
            .is_some_and(|e| e.usage.pods.contains_key(&key("a"))),
        "the holder stays"
    );
    assert!(eviction_list(&l, 3).is_empty(), "nobody is evicted");
    let reply = apply(
        &mut l,
        4,
        commit_now(2, vec![rm("b", "n1", vec![alloc("p", "gpu-1")])]),
    );
    assert_eq!(refused_for(&reply), Some(&DeviceRefusal::NotPublished));
    let again = apply(&mut l, 5, withdraw("n1", "p"));
    assert!(matches!(
        again,
        LedgerReply::PoolWithdrawn {
            outcome: PoolWithdrawal::AlreadyWithdrawn,
            ..
        }
    ));
    for (node, pool) in [("n1", "other"), ("nowhere", "p")] {
        let reply = apply(&mut l, 5, withdraw(node, pool));
        assert!(
            matches!(
                reply,
                LedgerReply::PoolWithdrawn {
                    outcome: PoolWithdrawal::Absent,
                    ..
                }
            ),
            "{node}/{pool}: {reply:?}"
        );
    }
    // A restarted driver counts from 1 again; the held device stays held.
    let reply = apply(&mut l, 6, publish("n1", "p", 1, gpus(2), vec![]));
    assert!(
        matches!(
            reply,
            LedgerReply::PoolPublished {
                change: PoolChange::Replaced,
                ..
            }
        ),
        "{reply:?}"
    );
    assert!(evictions(&reply).is_empty());
    let reply = apply(
        &mut l,
        7,
        commit_now(3, vec![rm("c", "n1", vec![alloc("p", "gpu-0")])]),
    );
    assert!(
        matches!(reply, LedgerReply::ReserveRefused { .. }),
        "gpu-0 is still a's: {reply:?}"
    );
    let reply = apply(
        &mut l,
        8,
        commit_now(4, vec![rm("c", "n1", vec![alloc("p", "gpu-1")])]),
    );
    assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
    assert_eq!(l.check_invariants(), Ok(()));
}

fn eviction_list(l: &ShardLedger, at_ms: u64) -> Vec<(String, String, EvictionCause)> {
    let q = crate::query::ShardQuery::Evictions { at_ms, limit: 100 };
    match crate::query::answer(l, &q, &mut crate::engine::Placer::new()) {
        crate::query::ShardAnswer::Evictions { pods } => pods
            .into_iter()
            .map(|p| (p.member.member, p.uid, p.cause))
            .collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_eviction_query_lists_placed_kubernetes_pods_on_bad_devices_once() {
    let mut l = ledger_with_gpus(4);
    let with_uid = |member: &str, device: &str| {
        let mut m = rm(member, "n1", vec![alloc("p", device), alloc("p", "gpu-3")]);
        m.pod.uid = Some(format!("uid-{member}"));
        m
    };
    apply(&mut l, 1, commit_now(1, vec![with_uid("a", "gpu-0")]));
    // No uid: not a Kubernetes pod, nothing to delete.
    apply(
        &mut l,
        1,
        commit_now(2, vec![rm("b", "n1", vec![alloc("p", "gpu-1")])]),
    );
    // Observed pods are the cluster's own eviction controller's business.
    apply(
        &mut l,
        1,
        LedgerOp::SetObservedPods {
            node: "n1".into(),
            pods: vec![crate::ledger::command::ObservedPod {
                namespace: "other".into(),
                uid: "uid-x".into(),
                pod: with_devices(vec![alloc("p", "gpu-2")]),
            }],
        },
    );
    assert!(eviction_list(&l, 5).is_empty());
    let sick = |device: &str| LedgerOp::SetDeviceHealth {
        node: "n1".into(),
        devices: vec![DeviceHealthReport {
            device: id("p", device),
            health: DeviceHealth::Unhealthy,
        }],
    };
    for device in ["gpu-0", "gpu-1", "gpu-2", "gpu-3"] {
        apply(&mut l, 10, sick(device));
    }
    assert_eq!(
        eviction_list(&l, 10),
        vec![("a".into(), "uid-a".into(), EvictionCause::Unhealthy)],
        "one line for a, though both its devices are sick"
    );
}

/// The device `name` of `pool` on `node`, as the ledger keeps it.
fn kept_device(ledger: &ShardLedger, node: &str, pool: &str, name: &str) -> Device {
    let view = crate::ledger::view::LedgerView::node_view(ledger, node).expect("registered");
    let key = PoolKey {
        driver: DRIVER.into(),
        pool: pool.into(),
    };
    view.usage
        .devices
        .pools
        .get(&key)
        .expect("published")
        .devices[name]
        .clone()
}

fn a100(name: &str) -> Device {
    let mut d = Device::new(name);
    d.attributes
        .insert("model".into(), AttributeValue::String("a100".into()));
    d.capacity
        .insert("memory".into(), DeviceCapacity::fixed(q(40 << 30)));
    d
}

#[test]
fn devices_share_the_names_and_strings_they_repeat_across_nodes_and_restores() {
    let mut ledger = ShardLedger::new();
    for n in ["a", "b"] {
        apply(&mut ledger, 0, LedgerOp::RegisterNode { node: node(n) });
        let reply = apply(
            &mut ledger,
            1,
            publish(n, n, 1, vec![a100("gpu-0")], Vec::new()),
        );
        assert!(
            matches!(reply, LedgerReply::PoolPublished { .. }),
            "{reply:?}"
        );
    }
    let shared = |l: &ShardLedger| {
        let (x, y) = (
            kept_device(l, "a", "a", "gpu-0"),
            kept_device(l, "b", "b", "gpu-0"),
        );
        let model = |d: &Device| match d.attributes.get("model") {
            Some(AttributeValue::String(s)) => s.clone(),
            other => panic!("model is {other:?}"),
        };
        let first_key = |m: Vec<&crate::model::Symbol>| m[0].clone();
        x.name.shares(&y.name)
            && model(&x).shares(&model(&y))
            && first_key(x.attributes.keys().collect())
                .shares(&first_key(y.attributes.keys().collect()))
            && first_key(x.capacity.keys().collect())
                .shares(&first_key(y.capacity.keys().collect()))
    };
    assert!(shared(&ledger));
    let restored = ShardLedger::restore(&ledger.snapshot()).expect("restores");
    assert!(shared(&restored));
    assert_eq!(restored.snapshot(), ledger.snapshot());
}
