//! Device allocation tests with the semantics of Kubernetes' structured allocator.
//!
//! ExactCount and All, CEL selectors with quantity comparison, matchAttribute and
//! distinctAttribute across requests (with a case that needs backtracking),
//! firstAvailable choices and their score, taints and tolerations, admin access,
//! partitionable devices and their counters, consumable capacity, health, device-backed
//! extended resources, gangs, and bad input. Fixtures are real ledgers built through
//! commands; every placement is also reserved through the ledger, which must accept it.

use std::collections::BTreeMap;

use crate::engine::filter::FilterReason;
use crate::engine::placement::{place_members, quote, GangPlacement, MemberRef, Placer};
use crate::engine::profile::Profile;
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReleaseTarget, TxnId};
use crate::ledger::devices::{DeviceHealth, DeviceHealthReport};
use crate::ledger::shard::ShardLedger;
use crate::model::claim::{
    AdminAccess, AllocationMode, ConstraintRule, DeviceConstraint, DeviceRequest, DeviceToleration,
    ExactRequest, PodClaim, RequestSpec, SubRequest, EXTENDED_RESOURCE_CLAIM,
};
use crate::model::device::{
    AllocationSharing, AttributeValue, CapacityRequestPolicy, CapacityValidity, CelSelector,
    CounterConsumption, CounterSet, Device, DeviceCapacity, DeviceClass, DeviceId, DeviceQuantity,
    DeviceTaint, DeviceTaintEffect,
};
use crate::model::error::FieldPath;
use crate::model::gang::MemberKey;
use crate::model::node::{Node, LABEL_HOSTNAME};
use crate::model::pod::{PodSpec, TolerationOperator};
use crate::model::resources::ResourceName;

const DRIVER: &str = "gpu.example.com";
const CLASS: &str = "gpu.example.com";
const GIB: u64 = 1 << 30;

fn node(name: &str) -> Node {
    let mut n = crate::fixtures::node_with(name, 64_000, 256 * GIB, 110);
    n.labels.insert(LABEL_HOSTNAME.into(), name.into());
    n
}

fn gpu(name: &str, model: &str, memory_gib: u64, numa: i64) -> Device {
    let mut d = Device::new(name);
    d.attributes
        .insert("model".into(), AttributeValue::String(model.into()));
    d.attributes
        .insert("numa".into(), AttributeValue::Int(numa));
    d.capacity.insert(
        "memory".into(),
        DeviceCapacity::fixed(DeviceQuantity::from_units(memory_gib * GIB)),
    );
    d
}

struct Fixture {
    ledger: ShardLedger,
    txn: u64,
    at_ms: u64,
}

impl Fixture {
    fn new(nodes: &[&str]) -> Self {
        let mut f = Self {
            ledger: ShardLedger::new(),
            txn: 0,
            at_ms: 1,
        };
        for n in nodes {
            f.apply(LedgerOp::RegisterNode { node: node(n) });
        }
        f.class(DeviceClass {
            name: CLASS.into(),
            selectors: vec![CelSelector::new(format!("device.driver == '{DRIVER}'"))],
            config: vec![],
            extended_resource_name: None,
        });
        f
    }

    fn apply(&mut self, op: LedgerOp) -> LedgerReply {
        self.at_ms += 1;
        self.ledger.apply(&LedgerCommand::new(self.at_ms, op))
    }

    fn class(&mut self, class: DeviceClass) {
        let reply = self.apply(LedgerOp::PutDeviceClass { class });
        assert!(
            matches!(reply, LedgerReply::DeviceClassStored { .. }),
            "{reply:?}"
        );
    }

    fn publish(&mut self, node: &str, devices: Vec<Device>, counter_sets: Vec<CounterSet>) {
        let reply = self.apply(LedgerOp::PublishPool {
            node: node.into(),
            driver: DRIVER.into(),
            pool: node.into(),
            generation: 1,
            devices,
            counter_sets,
        });
        assert!(
            matches!(reply, LedgerReply::PoolPublished { .. }),
            "{reply:?}"
        );
    }

    /// Places pods `names` with `spec` as one batch.
    fn place(&self, names: &[&str], spec: &PodSpec) -> GangPlacement {
        let keys: Vec<MemberKey> = names
            .iter()
            .map(|n| MemberKey::new("ns", "g", *n))
            .collect();
        let members: Vec<MemberRef<'_>> = keys.iter().map(|key| MemberRef { key, spec }).collect();
        place_members(&self.ledger, &members, &Profile::default(), &[])
    }

    /// Places and commits; returns the devices per member.
    fn commit(&mut self, names: &[&str], spec: &PodSpec) -> BTreeMap<String, Vec<String>> {
        let placement = self.place(names, spec);
        assert!(placement.is_complete(), "{placement:?}");
        self.txn += 1;
        let reply = self.apply(LedgerOp::ReserveAndCommit {
            txn_id: TxnId(self.txn),
            members: placement.assignments.clone(),
            network: Vec::new(),
        });
        assert_eq!(
            reply,
            LedgerReply::Committed {
                txn_id: TxnId(self.txn)
            }
        );
        assert_eq!(self.ledger.check_invariants(), Ok(()));
        devices_of(&placement)
    }

    fn release(&mut self, name: &str) {
        let reply = self.apply(LedgerOp::Release {
            target: ReleaseTarget::Members(vec![MemberKey::new("ns", "g", name)]),
        });
        assert!(matches!(reply, LedgerReply::Released { .. }), "{reply:?}");
    }
}

/// Member name → `request:device` of its allocations.
fn devices_of(placement: &GangPlacement) -> BTreeMap<String, Vec<String>> {
    placement
        .assignments
        .iter()
        .map(|a| {
            (
                a.member.member.clone(),
                a.pod
                    .devices
                    .iter()
                    .map(|d| format!("{}:{}", d.request, d.device.device))
                    .collect(),
            )
        })
        .collect()
}

fn exact(count: u32, selectors: &[&str]) -> ExactRequest {
    ExactRequest {
        device_class_name: CLASS.into(),
        selectors: selectors.iter().map(|s| CelSelector::new(*s)).collect(),
        allocation_mode: AllocationMode::ExactCount(count),
        admin_access: AdminAccess::Disabled,
        tolerations: vec![],
        capacity: BTreeMap::new(),
    }
}

fn request(name: &str, exact: ExactRequest) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        spec: RequestSpec::Exactly(exact),
    }
}

fn claim_spec(requests: Vec<DeviceRequest>, constraints: Vec<DeviceConstraint>) -> PodSpec {
    let spec = PodSpec {
        claims: vec![PodClaim {
            name: "devices".into(),
            requests,
            constraints,
            config: vec![],
        }],
        ..PodSpec::default()
    };
    assert_eq!(spec.validate(&FieldPath::new("spec")), Ok(()));
    spec
}

fn one(selector: &str) -> PodSpec {
    claim_spec(vec![request("gpu", exact(1, &[selector]))], vec![])
}

fn unplaced_reasons(placement: &GangPlacement) -> Vec<FilterReason> {
    placement
        .unplaced
        .iter()
        .flat_map(|u| u.diagnosis.reasons.keys().cloned())
        .collect()
}

#[test]
fn exact_count_and_all() {
    let mut f = Fixture::new(&["n1"]);
    f.publish(
        "n1",
        vec![
            gpu("gpu-0", "a100", 40, 0),
            gpu("gpu-1", "t4", 16, 0),
            gpu("gpu-2", "a100", 40, 1),
            gpu("gpu-3", "t4", 16, 1),
        ],
        vec![],
    );
    let a100 = r#"device.attributes["gpu.example.com"].model == "a100""#;
    let t4 = r#"device.attributes["gpu.example.com"].model == "t4""#;
    let two = claim_spec(vec![request("gpu", exact(2, &[a100]))], vec![]);
    assert_eq!(
        f.commit(&["a"], &two),
        BTreeMap::from([("a".into(), vec!["gpu:gpu-0".into(), "gpu:gpu-2".into()])])
    );
    let mut all = exact(1, &[t4]);
    all.allocation_mode = AllocationMode::All;
    let all = claim_spec(vec![request("gpu", all)], vec![]);
    assert_eq!(
        f.commit(&["b"], &all),
        BTreeMap::from([("b".into(), vec!["gpu:gpu-1".into(), "gpu:gpu-3".into()])])
    );
    // Nothing is left: a third a100 or any t4 finds no device.
    let placement = f.place(&["c"], &one(a100));
    assert_eq!(
        unplaced_reasons(&placement),
        vec![FilterReason::CannotAllocateDevices]
    );
    f.release("b");
    // All needs every matching device free.
    f.commit(&["c"], &one(t4));
    let placement = f.place(&["d"], &all);
    assert!(!placement.is_complete());
}

#[test]
fn a_withdrawn_pool_is_not_planned_until_published_again() {
    let mut f = Fixture::new(&["n1", "n2"]);
    for node in ["n1", "n2"] {
        f.publish(node, vec![gpu("gpu-0", "a100", 40, 0)], vec![]);
    }
    let any = one("true");
    let withdraw = |node: &str| LedgerOp::WithdrawPool {
        node: node.into(),
        driver: DRIVER.into(),
        pool: node.into(),
    };
    f.apply(withdraw("n1"));
    assert_eq!(
        f.place(&["a"], &any)
            .assignments
            .first()
            .map(|m| m.node.clone()),
        Some("n2".to_string())
    );
    f.apply(withdraw("n2"));
    let placement = f.place(&["a"], &any);
    assert_eq!(
        unplaced_reasons(&placement),
        vec![FilterReason::CannotAllocateDevices]
    );
    f.publish("n1", vec![gpu("gpu-0", "a100", 40, 0)], vec![]);
    assert_eq!(
        f.commit(&["a"], &any),
        BTreeMap::from([("a".into(), vec!["gpu:gpu-0".into()])])
    );
}

#[test]
fn cel_selectors_compare_quantities() {
    let mut f = Fixture::new(&["n1"]);
    f.publish(
        "n1",
        vec![gpu("gpu-0", "t4", 16, 0), gpu("gpu-1", "a100", 40, 0)],
        vec![],
    );
    let big = one(r#"device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("20Gi"))"#);
    assert_eq!(
        f.commit(&["a"], &big),
        BTreeMap::from([("a".into(), vec!["gpu:gpu-1".into()])])
    );
    let at_least_16 =
        one(r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("16Gi")) >= 0"#);
    assert_eq!(
        f.commit(&["b"], &at_least_16),
        BTreeMap::from([("b".into(), vec!["gpu:gpu-0".into()])])
    );
    // A runtime error (a missing attribute) refuses the node with the error.
    let broken = one(r#"device.attributes["gpu.example.com"].missing == "x""#);
    let placement = f.place(&["c"], &broken);
    let reasons = unplaced_reasons(&placement);
    assert!(
        matches!(reasons.as_slice(), [FilterReason::DeviceSelectorError(m)] if m.contains("missing")),
        "{reasons:?}"
    );
}

#[test]
fn match_attribute_across_requests_backtracks() {
    let mut f = Fixture::new(&["n1"]);
    // gpu-0 is on NUMA 0, but the only NIC is on NUMA 1: the first GPU tried must be
    // given back for gpu-1.
    let mut nic = Device::new("nic-1");
    nic.attributes
        .insert("kind".into(), AttributeValue::String("nic".into()));
    nic.attributes.insert("numa".into(), AttributeValue::Int(1));
    f.publish(
        "n1",
        vec![
            gpu("gpu-0", "a100", 40, 0),
            gpu("gpu-1", "a100", 40, 1),
            nic,
        ],
        vec![],
    );
    let model = r#"has(device.attributes["gpu.example.com"].model)"#;
    let is_nic = r#""kind" in device.attributes["gpu.example.com"]"#;
    let spec = claim_spec(
        vec![
            request("gpu", exact(1, &[model])),
            request("nic", exact(1, &[is_nic])),
        ],
        vec![DeviceConstraint {
            requests: vec!["gpu".into(), "nic".into()],
            rule: ConstraintRule::MatchAttribute("gpu.example.com/numa".into()),
        }],
    );
    assert_eq!(
        f.commit(&["a"], &spec),
        BTreeMap::from([("a".into(), vec!["gpu:gpu-1".into(), "nic:nic-1".into()])])
    );
}

#[test]
fn distinct_attribute_spreads_and_combines_with_match() {
    let mut f = Fixture::new(&["n1"]);
    let mut devices = vec![
        gpu("gpu-0", "a100", 40, 0),
        gpu("gpu-1", "a100", 40, 0),
        gpu("gpu-2", "a100", 40, 1),
        gpu("gpu-3", "a100", 40, 1),
    ];
    for (d, root) in devices.iter_mut().zip(["r0", "r0", "r1", "r2"]) {
        d.attributes
            .insert("pcieRoot".into(), AttributeValue::String(root.into()));
    }
    f.publish("n1", devices, vec![]);
    // Two GPUs on different PCIe roots: gpu-1 shares gpu-0's root, so gpu-2 is taken.
    let spec = claim_spec(
        vec![request("gpu", exact(2, &[]))],
        vec![DeviceConstraint {
            requests: vec![],
            rule: ConstraintRule::DistinctAttribute("gpu.example.com/pcieRoot".into()),
        }],
    );
    assert_eq!(
        f.place(&["a"], &spec).assignments[0]
            .pod
            .devices
            .iter()
            .map(|d| d.device.device.clone())
            .collect::<Vec<_>>(),
        vec!["gpu-0".to_string(), "gpu-2".to_string()]
    );
    // Same NUMA node and different roots: only gpu-2 + gpu-3 (NUMA 1) qualify, after
    // backtracking out of gpu-0's NUMA 0 (whose two GPUs share a root).
    let both = claim_spec(
        vec![request("gpu", exact(2, &[]))],
        vec![
            DeviceConstraint {
                requests: vec![],
                rule: ConstraintRule::MatchAttribute("gpu.example.com/numa".into()),
            },
            DeviceConstraint {
                requests: vec![],
                rule: ConstraintRule::DistinctAttribute("gpu.example.com/pcieRoot".into()),
            },
        ],
    );
    assert_eq!(
        f.commit(&["b"], &both),
        BTreeMap::from([("b".into(), vec!["gpu:gpu-2".into(), "gpu:gpu-3".into()])])
    );
}

/// List attributes (DRAListTypeAttributes): matchAttribute holds where every device's
/// set shares one value (a CPU near two PCIe roots matches a NIC on either), and
/// distinctAttribute where the sets are pairwise disjoint.
#[test]
fn list_attributes_match_by_intersection_and_stay_distinct_when_disjoint() {
    let mut f = Fixture::new(&["n1"]);
    let with_roots = |mut d: Device, roots: &[&str]| {
        d.attributes.insert(
            "pcieRoots".into(),
            AttributeValue::Strings(roots.iter().map(|r| r.to_string()).collect()),
        );
        d
    };
    let mut nic = Device::new("nic-0");
    nic.attributes
        .insert("kind".into(), AttributeValue::String("nic".into()));
    // A scalar is a set of one.
    nic.attributes
        .insert("pcieRoots".into(), AttributeValue::String("r2".into()));
    f.publish(
        "n1",
        vec![
            with_roots(gpu("gpu-0", "a100", 40, 0), &["r0", "r1"]),
            with_roots(gpu("gpu-1", "a100", 40, 0), &["r1", "r2"]),
            with_roots(gpu("gpu-2", "a100", 40, 1), &["r3"]),
            nic,
        ],
        vec![],
    );
    let model = r#"has(device.attributes["gpu.example.com"].model)"#;
    let is_nic = r#""kind" in device.attributes["gpu.example.com"] && device.attributes["gpu.example.com"].kind.includes("nic")"#;
    let near = claim_spec(
        vec![
            request("gpu", exact(1, &[model])),
            request("nic", exact(1, &[is_nic])),
        ],
        vec![DeviceConstraint {
            requests: vec![],
            rule: ConstraintRule::MatchAttribute("gpu.example.com/pcieRoots".into()),
        }],
    );
    // gpu-0's roots miss the NIC's r2: backtracks to gpu-1.
    assert_eq!(
        f.commit(&["a"], &near),
        BTreeMap::from([("a".into(), vec!["gpu:gpu-1".into(), "nic:nic-0".into()])])
    );
    // Two GPUs with disjoint root sets: gpu-0 and gpu-1 share r1, so gpu-0 goes with gpu-2.
    let apart = claim_spec(
        vec![request("gpu", exact(2, &[model]))],
        vec![DeviceConstraint {
            requests: vec![],
            rule: ConstraintRule::DistinctAttribute("gpu.example.com/pcieRoots".into()),
        }],
    );
    f.release("a");
    assert_eq!(
        f.commit(&["b"], &apart),
        BTreeMap::from([("b".into(), vec!["gpu:gpu-0".into(), "gpu:gpu-2".into()])])
    );
}

fn prioritized() -> PodSpec {
    let sub = |name: &str, model: &str| SubRequest {
        name: name.into(),
        exact: exact(
            1,
            &[&format!(
                r#"device.attributes["gpu.example.com"].model == "{model}""#
            )],
        ),
    };
    claim_spec(
        vec![DeviceRequest {
            name: "gpu".into(),
            spec: RequestSpec::FirstAvailable(vec![sub("big", "a100"), sub("small", "t4")]),
        }],
        vec![],
    )
}

#[test]
fn first_available_takes_the_first_satisfiable_and_scores_it() {
    let mut f = Fixture::new(&["n1"]);
    f.publish(
        "n1",
        vec![gpu("gpu-0", "a100", 40, 0), gpu("gpu-1", "t4", 16, 0)],
        vec![],
    );
    let spec = prioritized();
    assert_eq!(
        f.commit(&["a"], &spec),
        BTreeMap::from([("a".into(), vec!["gpu/big:gpu-0".into()])])
    );
    assert_eq!(
        f.commit(&["b"], &spec),
        BTreeMap::from([("b".into(), vec!["gpu/small:gpu-1".into()])])
    );
    assert!(!f.place(&["c"], &spec).is_complete());

    // Between a node offering the first choice and one offering only the second, the
    // first wins on score even though it comes later in name order.
    let mut f = Fixture::new(&["m1", "m2"]);
    f.publish("m1", vec![gpu("gpu-0", "t4", 16, 0)], vec![]);
    f.publish("m2", vec![gpu("gpu-0", "a100", 40, 0)], vec![]);
    let placement = f.place(&["a"], &spec);
    assert_eq!(placement.assignments[0].node, "m2");
    let q = quote(&f.ledger, &spec, &Profile::default(), &[]);
    assert_eq!(q.fit_count, 2);
}

#[test]
fn taints_need_tolerations() {
    let mut f = Fixture::new(&["n1"]);
    let mut tainted = gpu("gpu-0", "a100", 40, 0);
    tainted.push_taint(DeviceTaint {
        key: "example.com/maintenance".into(),
        value: "soon".into(),
        effect: DeviceTaintEffect::NoSchedule,
        time_added_ms: None,
    });
    f.publish("n1", vec![tainted], vec![]);
    let plain = claim_spec(vec![request("gpu", exact(1, &[]))], vec![]);
    let placement = f.place(&["a"], &plain);
    assert_eq!(
        unplaced_reasons(&placement),
        vec![FilterReason::CannotAllocateDevices]
    );
    let mut tolerant = exact(1, &[]);
    tolerant.tolerations.push(DeviceToleration {
        key: "example.com/maintenance".into(),
        operator: TolerationOperator::Equal,
        value: "soon".into(),
        effect: Some(DeviceTaintEffect::NoSchedule),
        toleration_seconds: None,
    });
    let tolerant = claim_spec(vec![request("gpu", tolerant)], vec![]);
    let devices = f.commit(&["a"], &tolerant);
    assert_eq!(devices["a"], vec!["gpu:gpu-0".to_string()]);
}

#[test]
fn admin_access_does_not_consume() {
    let mut f = Fixture::new(&["n1"]);
    f.publish("n1", vec![gpu("gpu-0", "a100", 40, 0)], vec![]);
    let plain = claim_spec(vec![request("gpu", exact(1, &[]))], vec![]);
    f.commit(&["a"], &plain);
    let mut admin = exact(1, &[]);
    admin.admin_access = AdminAccess::Enabled;
    let admin = claim_spec(vec![request("monitor", admin)], vec![]);
    let devices = f.commit(&["m1", "m2"], &admin);
    assert_eq!(devices["m1"], vec!["monitor:gpu-0".to_string()]);
    assert_eq!(devices["m2"], vec!["monitor:gpu-0".to_string()]);
    let held = f.ledger.node("n1").and_then(|e| {
        e.usage
            .devices
            .use_of(&DeviceId::new(DRIVER, "n1", "gpu-0"))
            .cloned()
    });
    assert_eq!(
        held.map(|u| u.holders),
        Some(1),
        "only the ordinary claim holds it"
    );
}

/// A GPU with 40 GiB and 7 compute slices, carved into profiles as MIG does.
fn mig_gpu(g: usize) -> (Vec<Device>, CounterSet) {
    let set = format!("gpu-{g}");
    let counters = CounterSet {
        name: set.clone(),
        counters: BTreeMap::from([
            ("memory".to_string(), DeviceQuantity::from_units(40 * GIB)),
            ("slices".to_string(), DeviceQuantity::from_units(7)),
        ]),
    };
    let profile = |name: &str, slices: u64, memory: u64| {
        let mut d = Device::new(format!("gpu-{g}-{name}"));
        d.attributes
            .insert("profile".into(), AttributeValue::String(name.into()));
        d.push_counter_use(CounterConsumption {
            counter_set: set.clone(),
            counters: BTreeMap::from([
                (
                    "memory".to_string(),
                    DeviceQuantity::from_units(memory * GIB),
                ),
                ("slices".to_string(), DeviceQuantity::from_units(slices)),
            ]),
        });
        d
    };
    let devices = vec![
        profile("7g-40gb", 7, 40),
        profile("3g-20gb-0", 3, 20),
        profile("3g-20gb-1", 3, 20),
        profile("1g-5gb-0", 1, 5),
        profile("1g-5gb-1", 1, 5),
    ];
    (devices, counters)
}

#[test]
fn partitions_never_over_consume_a_counter() {
    let mut f = Fixture::new(&["n1"]);
    let (devices, set) = mig_gpu(0);
    f.publish("n1", devices, vec![set]);
    let profile = |p: &str| {
        one(&format!(
            r#"device.attributes["gpu.example.com"].profile.startsWith("{p}")"#
        ))
    };
    // The whole GPU, or both 3g halves, or one 3g and the 1g slices: never more.
    assert_eq!(
        f.commit(&["a"], &profile("3g"))["a"],
        vec!["gpu:gpu-0-3g-20gb-0".to_string()]
    );
    let placement = f.place(&["w"], &profile("7g"));
    assert_eq!(
        unplaced_reasons(&placement),
        vec![FilterReason::CannotAllocateDevices]
    );
    assert_eq!(
        f.commit(&["b"], &profile("3g"))["b"],
        vec!["gpu:gpu-0-3g-20gb-1".to_string()]
    );
    // 6 of 7 slices and all 40 GiB are used: a 1g slice would exceed memory.
    assert!(!f.place(&["c"], &profile("1g")).is_complete());
    f.release("a");
    let both = f.commit(&["c", "d"], &profile("1g"));
    assert_eq!(both.len(), 2);
    assert!(!f.place(&["e"], &profile("3g")).is_complete());
    let usage = f
        .ledger
        .node("n1")
        .map(|e| e.usage.devices.clone())
        .unwrap_or_default();
    assert!(usage
        .counters
        .values()
        .all(|used| *used <= DeviceQuantity::from_units(40 * GIB)));
}

#[test]
fn consumable_capacity_shares_a_device_up_to_its_capacity() {
    let mut f = Fixture::new(&["n1"]);
    let mut nic = Device::new("nic-0");
    nic.sharing = AllocationSharing::Shared;
    nic.capacity.insert(
        "bandwidth".into(),
        DeviceCapacity {
            value: DeviceQuantity::from_units(10),
            request_policy: Some(Box::new(CapacityRequestPolicy {
                default: Some(DeviceQuantity::from_units(1)),
                valid: CapacityValidity::Range {
                    min: DeviceQuantity::from_units(1),
                    max: None,
                    step: Some(DeviceQuantity::from_units(2)),
                },
            })),
        },
    );
    f.publish("n1", vec![nic], vec![]);
    let mut wants = exact(1, &[]);
    wants
        .capacity
        .insert("bandwidth".into(), DeviceQuantity::from_units(4));
    let spec = claim_spec(vec![request("net", wants)], vec![]);
    // 4 rounds up to 5 (min 1, steps of 2): two claims share the NIC, a third does not fit.
    let placement = f.place(&["a", "b", "c"], &spec);
    assert_eq!(placement.assignments.len(), 2);
    let allocation = &placement.assignments[0].pod.devices[0];
    assert_eq!(
        allocation.consumed_capacity.get("bandwidth"),
        Some(&DeviceQuantity::from_units(5))
    );
    // The API server takes a share id only as a UUID: 8-4-4-4-12 hex digits.
    let share = allocation.share_id.clone().unwrap_or_default();
    let groups: Vec<usize> = share.split('-').map(str::len).collect();
    assert_eq!(groups, vec![8, 4, 4, 4, 12], "{share}");
    assert!(
        share.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
        "{share}"
    );
    let other = &placement.assignments[1].pod.devices[0];
    assert_ne!(other.share_id, allocation.share_id, "one id per share");
    f.commit(&["a", "b"], &spec);
    // A claim naming no amount takes the default.
    let default = claim_spec(vec![request("net", exact(1, &[]))], vec![]);
    assert!(!f.place(&["d"], &default).is_complete());
    f.release("a");
    let devices = f.commit(&["d"], &default);
    assert_eq!(devices["d"], vec!["net:nic-0".to_string()]);
}

#[test]
fn unhealthy_devices_are_skipped_and_release_returns_devices_at_once() {
    let mut f = Fixture::new(&["n1"]);
    f.publish(
        "n1",
        vec![gpu("gpu-0", "a100", 40, 0), gpu("gpu-1", "a100", 40, 0)],
        vec![],
    );
    let reply = f.apply(LedgerOp::SetDeviceHealth {
        node: "n1".into(),
        devices: vec![DeviceHealthReport {
            device: DeviceId::new(DRIVER, "n1", "gpu-0"),
            health: DeviceHealth::Unhealthy,
        }],
    });
    assert!(matches!(reply, LedgerReply::DeviceHealthRecorded { .. }));
    let spec = claim_spec(vec![request("gpu", exact(1, &[]))], vec![]);
    assert_eq!(f.commit(&["a"], &spec)["a"], vec!["gpu:gpu-1".to_string()]);
    assert!(!f.place(&["b"], &spec).is_complete());
    f.release("a");
    assert_eq!(f.commit(&["b"], &spec)["b"], vec!["gpu:gpu-1".to_string()]);
}

#[test]
fn gangs_get_distinct_devices_across_nodes() {
    let mut f = Fixture::new(&["n1", "n2", "n3"]);
    for n in ["n1", "n2", "n3"] {
        f.publish(
            n,
            vec![gpu("gpu-0", "a100", 40, 0), gpu("gpu-1", "a100", 40, 1)],
            vec![],
        );
    }
    let spec = claim_spec(vec![request("gpu", exact(1, &[]))], vec![]);
    let names = ["w0", "w1", "w2", "w3", "w4"];
    let placement = f.place(&names, &spec);
    assert!(placement.is_complete());
    let mut seen = std::collections::BTreeSet::new();
    for a in &placement.assignments {
        assert_eq!(a.pod.devices.len(), 1);
        assert!(seen.insert((a.node.clone(), a.pod.devices[0].device.device.clone())));
    }
    f.commit(&names, &spec);
    assert!(!f.place(&["w5", "w6"], &spec).is_complete());
    // One placer over repeated calls gives the same answers as fresh calls.
    let mut placer = Placer::new();
    let key = MemberKey::new("ns", "g", "w5");
    let members = [MemberRef {
        key: &key,
        spec: &spec,
    }];
    let first = placer.place_members(&f.ledger, &members, &Profile::default(), &[]);
    let again = placer.place_members(&f.ledger, &members, &Profile::default(), &[]);
    assert_eq!(first, again);
    assert_eq!(first.assignments.len(), 1);
}

#[test]
fn extended_resources_come_from_devices_where_a_class_maps_them() {
    let mut f = Fixture::new(&["n1"]);
    let mut plugin_node = node("n2");
    plugin_node
        .allocatable
        .set(&ResourceName::Extended("example.com/gpu".into()), 4);
    f.apply(LedgerOp::RegisterNode { node: plugin_node });
    f.class(DeviceClass {
        name: "example-gpu".into(),
        selectors: vec![CelSelector::new(r#"device.driver == "gpu.example.com""#)],
        config: vec![],
        extended_resource_name: Some("example.com/gpu".into()),
    });
    f.publish(
        "n1",
        vec![gpu("gpu-0", "a100", 40, 0), gpu("gpu-1", "a100", 40, 1)],
        vec![],
    );
    let mut spec = PodSpec::default();
    spec.requests
        .set(&ResourceName::Extended("example.com/gpu".into()), 2);
    let placement = f.place(&["a", "b"], &spec);
    assert!(placement.is_complete(), "{placement:?}");
    let on_n1 = placement.assignments.iter().find(|a| a.node == "n1");
    let on_n2 = placement.assignments.iter().find(|a| a.node == "n2");
    let (Some(on_n1), Some(on_n2)) = (on_n1, on_n2) else {
        panic!("one pod per node: {placement:?}");
    };
    // n1 serves the resource from devices: concrete ids, not counted against allocatable.
    assert_eq!(
        on_n1
            .pod
            .devices
            .iter()
            .map(|d| (d.claim.as_str(), d.device.device.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (EXTENDED_RESOURCE_CLAIM, "gpu-0"),
            (EXTENDED_RESOURCE_CLAIM, "gpu-1")
        ]
    );
    assert!(on_n1.pod.requests.extended.is_empty());
    // n2 has a device plugin: allocatable counts it.
    assert!(on_n2.pod.devices.is_empty());
    assert_eq!(on_n2.pod.requests.extended.get("example.com/gpu"), Some(&2));
    f.txn += 1;
    let reply = f.apply(LedgerOp::ReserveAndCommit {
        txn_id: TxnId(f.txn),
        members: placement.assignments,
        network: Vec::new(),
    });
    assert!(matches!(reply, LedgerReply::Committed { .. }), "{reply:?}");
    assert_eq!(f.ledger.check_invariants(), Ok(()));
}

#[test]
fn unknown_classes_and_bad_selectors_are_reported() {
    let mut f = Fixture::new(&["n1"]);
    f.publish("n1", vec![gpu("gpu-0", "a100", 40, 0)], vec![]);
    let mut unknown = exact(1, &[]);
    unknown.device_class_name = "missing.example.com".into();
    let spec = claim_spec(vec![request("gpu", unknown)], vec![]);
    let placement = f.place(&["a"], &spec);
    assert_eq!(
        unplaced_reasons(&placement),
        vec![FilterReason::DeviceClassNotFound(
            "missing.example.com".into()
        )]
    );
    let err = spec.claims[0]
        .check_classes(
            &FieldPath::new("spec").child("claims").index(0),
            f.ledger.device_classes(),
        )
        .expect_err("unknown class");
    assert_eq!(
        err.to_string(),
        "spec.claims[0].requests[0].exactly.deviceClassName: device class \"missing.example.com\" not found"
    );
    // Counts beyond the per-claim limit and zero counts are refused when validating.
    let too_many = PodSpec {
        claims: vec![PodClaim {
            name: "c".into(),
            requests: vec![request("gpu", exact(33, &[]))],
            constraints: vec![],
            config: vec![],
        }],
        ..PodSpec::default()
    };
    let err = too_many
        .validate(&FieldPath::new("spec"))
        .expect_err("33 devices");
    assert_eq!(err.path, "spec.claims[0].requests[0].exactly.count");
}

#[test]
fn placements_are_deterministic() {
    let mut f = Fixture::new(&["n1", "n2"]);
    for n in ["n1", "n2"] {
        let (devices, set) = mig_gpu(0);
        f.publish(n, devices, vec![set]);
    }
    let spec = one(r#"device.attributes["gpu.example.com"].profile.startsWith("1g")"#);
    let names = ["a", "b", "c", "d"];
    assert_eq!(f.place(&names, &spec), f.place(&names, &spec));
    f.commit(&names, &spec);
}

#[test]
fn placers_stay_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Placer>();
    send_sync::<ShardLedger>();
}

mod agreement {
    //! What the engine allocates, the ledger accepts: random pools, health and claims.

    use proptest::prelude::*;

    use super::*;

    fn arb_device(i: usize) -> impl Strategy<Value = Device> {
        (any::<bool>(), 4u64..12, 0u64..4, 0i64..2, 0u8..6).prop_map(
            move |(shared, mem, counter, numa, taint)| {
                let mut d = Device::new(format!("d{i}"));
                d.attributes
                    .insert("numa".into(), AttributeValue::Int(numa));
                if shared {
                    d.sharing = AllocationSharing::Shared;
                    d.capacity.insert(
                        "mem".into(),
                        DeviceCapacity::fixed(DeviceQuantity::from_units(mem)),
                    );
                }
                if counter > 0 {
                    d.push_counter_use(CounterConsumption {
                        counter_set: "s".into(),
                        counters: BTreeMap::from([(
                            "slices".to_string(),
                            DeviceQuantity::from_units(counter),
                        )]),
                    });
                }
                if taint == 0 {
                    d.push_taint(DeviceTaint {
                        key: "example.com/t".into(),
                        value: String::new(),
                        effect: DeviceTaintEffect::NoSchedule,
                        time_added_ms: None,
                    });
                }
                d
            },
        )
    }

    fn arb_pool() -> impl Strategy<Value = Vec<Device>> {
        (arb_device(0), arb_device(1), arb_device(2), arb_device(3))
            .prop_map(|(a, b, c, d)| vec![a, b, c, d])
    }

    /// Claim shapes: one device; two on one NUMA node; a share of 3 mem; admin access;
    /// two-or-one by preference; one tolerating the taint.
    fn spec_of(shape: u8) -> PodSpec {
        let numa = || DeviceConstraint {
            requests: vec![],
            rule: ConstraintRule::MatchAttribute("gpu.example.com/numa".into()),
        };
        match shape {
            0 => claim_spec(vec![request("r", exact(1, &[]))], vec![]),
            1 => claim_spec(vec![request("r", exact(2, &[]))], vec![numa()]),
            2 => {
                let mut e = exact(1, &[]);
                e.capacity
                    .insert("mem".into(), DeviceQuantity::from_units(3));
                claim_spec(vec![request("r", e)], vec![])
            }
            3 => {
                let mut e = exact(1, &[]);
                e.admin_access = AdminAccess::Enabled;
                claim_spec(vec![request("r", e)], vec![])
            }
            4 => claim_spec(
                vec![DeviceRequest {
                    name: "r".into(),
                    spec: RequestSpec::FirstAvailable(vec![
                        SubRequest {
                            name: "two".into(),
                            exact: exact(2, &[]),
                        },
                        SubRequest {
                            name: "one".into(),
                            exact: exact(1, &[]),
                        },
                    ]),
                }],
                vec![],
            ),
            _ => {
                let mut e = exact(1, &[]);
                e.tolerations.push(DeviceToleration {
                    key: "example.com/t".into(),
                    operator: TolerationOperator::Exists,
                    value: String::new(),
                    effect: None,
                    toleration_seconds: None,
                });
                claim_spec(vec![request("r", e)], vec![])
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Place { shape: u8, size: usize },
        Release(usize),
        Sick(usize, usize),
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0u8..6, 1usize..4).prop_map(|(shape, size)| Step::Place { shape, size }),
            2 => (0usize..40).prop_map(Step::Release),
            1 => (0usize..2, 0usize..4).prop_map(|(n, d)| Step::Sick(n, d)),
        ]
    }

    proptest! {
           #![proptest_config(ProptestConfig::with_cases(64))]

           #[test]
           fn the_ledger_accepts_what_the_engine_allocates(
               pools in (arb_pool(), arb_pool()),
               slices in (2u64..8, 2u64..8),
               steps in prop::collection::vec(arb_step(), 1..30),
           ) {
               let mut f = Fixture::new(&["n1", "n2"]);
               for (node, devices, total) in [("n1", pools.0, slices.0), ("n2", pools.1, slices.1)] {
                   let set = CounterSet {
                       name: "s".into(),
                       counters: BTreeMap::from([("slices".to_string(), DeviceQuantity::from_units(total))]),
                   };
                   f.publish(node, devices, vec![set]);
               }
               let mut placed: Vec<String> = Vec::new();
               let mut next = 0usize;
               let mut placer = Placer::new();
               for step in steps {
                   match step {
                       Step::Place { shape, size } => {
                           let spec = spec_of(shape);
                           let keys: Vec<MemberKey> = (0..size)
                               .map(|i| MemberKey::new("ns", "g", format!("p{}", next + i)))
                               .collect();
                           next += size;
                           let members: Vec<MemberRef<'_>> =
                               keys.iter().map(|key| MemberRef { key, spec: &spec }).collect();
                           let placement = placer.place_members(&f.ledger, &members, &Profile::default(), &[]);
                           if !placement.is_complete() {
                               continue;
                           }
                           f.txn += 1;
                           let reply = f.apply(LedgerOp::ReserveAndCommit {
                               txn_id: TxnId(f.txn),
                               members: placement.assignments,
    network: Vec::new(),
                           });
                           prop_assert_eq!(&reply, &LedgerReply::Committed { txn_id: TxnId(f.txn) });
                           placed.extend(keys.into_iter().map(|k| k.member));
                       }
                       Step::Release(i) => {
                           if !placed.is_empty() {
                               let name = placed.remove(i % placed.len());
                               f.release(&name);
                           }
                       }
                       Step::Sick(n, d) => {
                           let node = ["n1", "n2"][n];
                           let reply = f.apply(LedgerOp::SetDeviceHealth {
                               node: node.into(),
                               devices: vec![DeviceHealthReport {
                                   device: DeviceId::new(DRIVER, node, format!("d{d}")),
                                   health: DeviceHealth::Unhealthy,
                               }],
                           });
                           let recorded = matches!(reply, LedgerReply::DeviceHealthRecorded { .. });
                           prop_assert!(recorded);
                       }
                   }
                   prop_assert_eq!(f.ledger.check_invariants(), Ok(()));
               }
           }
       }
}

mod network_tests;
#[cfg(test)]
mod share_tests;
