//! Network-attached pools in the engine: a node sees the pools that reach it beside its
//! own devices, a device planned for one node is gone for every node of the round, the
//! result hands network devices out as holds (the members keep their nodes' devices),
//! and a placer that keeps fit results never reuses one a network hold has made stale.
//! Every placement is reserved through the ledger, which must accept it.

use super::{exact, gpu, one, request, unplaced_reasons, Fixture, DRIVER};
use crate::engine::filter::FilterReason;
use crate::engine::placement::{GangPlacement, MemberRef, Placer};
use crate::engine::profile::Profile;
use crate::ledger::command::{LedgerOp, LedgerReply, TxnId};
use crate::model::claim::{ClaimShare, PodClaim};
use crate::model::device::Device;
use crate::model::gang::MemberKey;
use crate::model::pod::{NodeSelectorOperator, NodeSelectorRequirement, PodSpec};
use crate::model::reach::{PoolReach, ReachTerm};

const FABRIC: &str = "fabric";

/// Nodes n1 and n2 in rack r1, n3 in rack r2; a network pool of `devices` devices of
/// the test driver reaching rack r1.
fn fixture(devices: usize) -> Fixture {
    let mut f = Fixture::new(&["n1", "n2", "n3"]);
    for (name, rack) in [("n1", "r1"), ("n2", "r1"), ("n3", "r2")] {
        let mut node = super::node(name);
        node.labels.insert("rack".into(), rack.into());
        f.apply(LedgerOp::RegisterNode { node });
    }
    let reply = f.apply(LedgerOp::PublishNetworkPool {
        driver: DRIVER.into(),
        pool: FABRIC.into(),
        generation: 1,
        reach: PoolReach::Selected(ReachTerm {
            match_expressions: vec![NodeSelectorRequirement {
                key: "rack".into(),
                operator: NodeSelectorOperator::In,
                values: vec!["r1".into()],
            }],
            match_fields: Vec::new(),
        }),
        devices: (0..devices)
            .map(|i| Device::new(format!("fabric-{i}")))
            .collect(),
        counter_sets: Vec::new(),
    });
    assert!(
        matches!(reply, LedgerReply::PoolPublished { .. }),
        "{reply:?}"
    );
    f
}

fn place_with(placer: &mut Placer, f: &Fixture, names: &[&str], spec: &PodSpec) -> GangPlacement {
    let keys: Vec<MemberKey> = names
        .iter()
        .map(|n| MemberKey::new("ns", "g", *n))
        .collect();
    let members: Vec<MemberRef<'_>> = keys.iter().map(|key| MemberRef { key, spec }).collect();
    placer.place_members(&f.ledger, &members, &Profile::default(), &[])
}

/// Reserves and commits a placement with its network holds; the ledger must accept it.
fn commit(f: &mut Fixture, placement: &GangPlacement) {
    f.txn += 1;
    let reply = f.apply(LedgerOp::ReserveAndCommit {
        txn_id: TxnId(f.txn),
        members: placement.assignments.clone(),
        network: placement.network.clone(),
    });
    assert_eq!(
        reply,
        LedgerReply::Committed {
            txn_id: TxnId(f.txn)
        }
    );
    assert_eq!(f.ledger.check_invariants(), Ok(()));
}

/// Network devices of a placement: member → devices.
fn network_devices(placement: &GangPlacement) -> Vec<(String, Vec<String>)> {
    placement
        .network
        .iter()
        .map(|h| {
            (
                h.member.member.clone(),
                h.devices.iter().map(|a| a.device.device.clone()).collect(),
            )
        })
        .collect()
}

#[test]
fn a_network_device_goes_to_one_pod_of_a_round_on_a_node_it_reaches() {
    let mut f = fixture(2);
    let spec = one("true");
    let placement = f.place(&["a", "b", "c"], &spec);
    let placed: Vec<(&str, &str)> = placement
        .assignments
        .iter()
        .map(|a| (a.member.member.as_str(), a.node.as_str()))
        .collect();
    assert_eq!(placed.len(), 2, "{placement:?}");
    assert!(placed.iter().all(|(_, node)| *node != "n3"), "{placed:?}");
    assert!(placement
        .assignments
        .iter()
        .all(|a| a.pod.devices.is_empty()));
    let mut devices: Vec<String> = network_devices(&placement)
        .into_iter()
        .flat_map(|(_, d)| d)
        .collect();
    devices.sort();
    assert_eq!(devices, ["fabric-0", "fabric-1"]);
    assert_eq!(placement.unplaced.len(), 1, "{placement:?}");
    assert!(unplaced_reasons(&placement).contains(&FilterReason::CannotAllocateDevices));
    commit(&mut f, &placement);
    // Held now: nothing is left for a later round.
    let later = f.place(&["d"], &spec);
    assert!(later.assignments.is_empty(), "{later:?}");
}

#[test]
fn a_pod_takes_devices_of_its_node_and_of_the_network_together() {
    let mut f = fixture(1);
    f.publish("n2", vec![gpu("gpu-0", "a100", 40, 0)], Vec::new());
    let spec = PodSpec {
        claims: vec![PodClaim {
            name: "devices".into(),
            requests: vec![
                request(
                    "local",
                    exact(1, &["has(device.attributes['gpu.example.com'].model)"]),
                ),
                request(
                    "fabric",
                    exact(1, &["!has(device.attributes['gpu.example.com'].model)"]),
                ),
            ],
            constraints: vec![],
            config: vec![],
        }],
        ..PodSpec::default()
    };
    spec.validate(&crate::model::error::FieldPath::new("spec"))
        .expect("valid spec");
    let placement = f.place(&["a"], &spec);
    assert_eq!(placement.assignments.len(), 1, "{placement:?}");
    let member = &placement.assignments[0];
    assert_eq!(member.node, "n2");
    let local: Vec<&str> = member
        .pod
        .devices
        .iter()
        .map(|a| a.device.device.as_str())
        .collect();
    assert_eq!(local, ["gpu-0"]);
    assert_eq!(
        network_devices(&placement),
        vec![("a".to_string(), vec!["fabric-0".to_string()])]
    );
    commit(&mut f, &placement);
}

#[test]
fn a_placer_that_keeps_fits_sees_network_devices_taken_since() {
    let mut f = fixture(1);
    let spec = one("true");
    let mut placer = Placer::new();
    let first = place_with(&mut placer, &f, &["a"], &spec);
    assert_eq!(first.assignments.len(), 1, "{first:?}");
    commit(&mut f, &first);
    // No node's own state changed, yet nothing fits any more.
    let second = place_with(&mut placer, &f, &["b"], &spec);
    assert!(second.assignments.is_empty(), "{second:?}");
    // Released, it fits again.
    f.release("a");
    let third = place_with(&mut placer, &f, &["c"], &spec);
    assert_eq!(third.assignments.len(), 1, "{third:?}");
    commit(&mut f, &third);
}

/// A carrier of shared claim `claim` (through pod claim "devices", one device) and
/// followers, as the Kubernetes adapter builds them.
fn sharing(claim: &str) -> (PodSpec, PodSpec) {
    let share = ClaimShare {
        pod_claim: "devices".into(),
        claim: claim.into(),
    };
    let mut carrier = one("true");
    carrier.shares = vec![share.clone()];
    let follower = PodSpec {
        shares: vec![share],
        ..PodSpec::default()
    };
    (carrier, follower)
}

/// Places members named `carriers` with spec `carrier` and `followers` with
/// `follower`, in one call.
fn place_shared(
    f: &Fixture,
    (carrier, follower): &(PodSpec, PodSpec),
    carriers: &[&str],
    followers: &[&str],
) -> GangPlacement {
    let key = |n: &&str| MemberKey::new("ns", "g", *n);
    let keys: Vec<(MemberKey, &PodSpec)> = carriers
        .iter()
        .map(|n| (key(n), carrier))
        .chain(followers.iter().map(|n| (key(n), follower)))
        .collect();
    let members: Vec<MemberRef<'_>> = keys
        .iter()
        .map(|(key, spec)| MemberRef { key, spec })
        .collect();
    Placer::new().place_members(&f.ledger, &members, &Profile::default(), &[])
}

/// What each member holds on the network: (member, claim, devices).
fn holds(placement: &GangPlacement) -> Vec<(String, Option<String>, usize)> {
    placement
        .network
        .iter()
        .map(|h| (h.member.member.clone(), h.claim.clone(), h.devices.len()))
        .collect()
}

#[test]
fn a_shared_claim_carried_on_the_network_serves_pods_on_every_node_its_pool_reaches() {
    let mut f = fixture(1);
    let shared = sharing("ns/channel");
    let placement = place_shared(&f, &shared, &["carrier"], &["f1", "f2", "f3"]);
    assert!(placement.is_complete(), "{placement:?}");
    // Spread over both nodes of rack r1, never on n3, which the pool does not reach.
    let nodes: std::collections::BTreeSet<&str> = placement
        .assignments
        .iter()
        .map(|a| a.node.as_str())
        .collect();
    assert!(!nodes.contains("n3"), "{placement:?}");
    assert!(placement
        .assignments
        .iter()
        .all(|a| a.pod.devices.is_empty()));
    let claim = Some("ns/channel".to_string());
    assert_eq!(
        holds(&placement),
        vec![
            ("carrier".to_string(), claim.clone(), 1),
            ("f1".to_string(), claim.clone(), 0),
            ("f2".to_string(), claim.clone(), 0),
            ("f3".to_string(), claim.clone(), 0),
        ]
    );
    commit(&mut f, &placement);
    // Its one device stays held while any pod uses the claim, carrier gone or not.
    let (other, _) = sharing("ns/other");
    f.release("carrier");
    f.release("f1");
    assert!(f.place(&["x"], &other).assignments.is_empty());
    // A later pod of the claim uses it where the pool reaches.
    let later = place_shared(&f, &shared, &[], &["f4"]);
    assert!(later.is_complete(), "{later:?}");
    assert_ne!(later.assignments[0].node, "n3");
    assert_eq!(holds(&later), vec![("f4".to_string(), claim, 0)]);
    commit(&mut f, &later);
    for name in ["f2", "f3", "f4"] {
        f.release(name);
    }
    assert_eq!(f.ledger.network_pools().holds().len(), 0);
    let again = f.place(&["x"], &other);
    assert_eq!(again.assignments.len(), 1, "{again:?}");
}

#[test]
fn a_shared_claim_takes_its_nodes_devices_first_and_never_mixes_them_with_the_networks() {
    let mut f = fixture(2);
    f.publish("n1", vec![gpu("gpu-0", "a100", 40, 0)], Vec::new());
    let shared = sharing("ns/channel");
    // The node's device: carried on n1, its followers there too, nothing on the network.
    let placement = place_shared(&f, &shared, &["carrier"], &["f1"]);
    assert!(placement.is_complete(), "{placement:?}");
    assert!(
        placement.assignments.iter().all(|a| a.node == "n1"),
        "{placement:?}"
    );
    assert!(placement.network.is_empty(), "{placement:?}");
    commit(&mut f, &placement);
    // Two devices, one of the node and one of the network, are never one shared
    // claim's: with n1's GPU taken it takes both of the network's.
    let mut two = sharing("ns/pair");
    two.0.claims[0].requests[0] = request("gpu", exact(2, &["true"]));
    let placement = place_shared(&f, &two, &["c2"], &["g1"]);
    assert!(placement.is_complete(), "{placement:?}");
    assert_eq!(
        holds(&placement),
        vec![
            ("c2".to_string(), Some("ns/pair".to_string()), 2),
            ("g1".to_string(), Some("ns/pair".to_string()), 0),
        ]
    );
    commit(&mut f, &placement);
    // An unshared claim mixes them freely.
    f.release("carrier");
    f.release("f1");
    f.release("c2");
    f.release("g1");
    let mut mixed = one("true");
    mixed.claims[0].requests[0] = request("gpu", exact(3, &["true"]));
    let placement = f.place(&["m"], &mixed);
    assert_eq!(placement.assignments.len(), 1, "{placement:?}");
    assert_eq!(placement.assignments[0].node, "n1");
    commit(&mut f, &placement);
}

#[test]
fn a_node_that_serves_a_pod_from_its_own_devices_scores_above_one_that_takes_the_networks() {
    let mut f = fixture(1);
    f.publish("n3", vec![gpu("gpu-0", "a100", 40, 0)], Vec::new());
    let spec = one("true");
    // n1 and n2 would take the network's one device; n3 has a device of its own.
    let placement = f.place(&["a"], &spec);
    assert_eq!(placement.assignments.len(), 1, "{placement:?}");
    assert_eq!(placement.assignments[0].node, "n3");
    assert!(placement.network.is_empty(), "{placement:?}");
    commit(&mut f, &placement);
    // With n3's taken, the network's serves the next pod.
    let next = f.place(&["b"], &spec);
    assert_eq!(next.assignments.len(), 1, "{next:?}");
    assert_ne!(next.assignments[0].node, "n3");
    assert_eq!(network_devices(&next).len(), 1, "{next:?}");
    commit(&mut f, &next);
}

/// A pool whose slices choose nodes per device (`perDeviceNodeSelection`): one device
/// on n1 by name, one reaching rack r2, one reaching every node.
fn per_device_fixture() -> Fixture {
    let mut f = fixture(0);
    let reach = |reach: PoolReach, name: &str| Device {
        reach: Some(Box::new(reach)),
        ..Device::new(name)
    };
    let reply = f.apply(LedgerOp::PublishNetworkPool {
        driver: DRIVER.into(),
        pool: "per-device".into(),
        generation: 1,
        reach: PoolReach::PerDevice,
        devices: vec![
            reach(
                PoolReach::Selected(ReachTerm {
                    match_expressions: Vec::new(),
                    match_fields: vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: NodeSelectorOperator::In,
                        values: vec!["n1".into()],
                    }],
                }),
                "on-n1",
            ),
            reach(
                PoolReach::Selected(ReachTerm {
                    match_expressions: vec![NodeSelectorRequirement {
                        key: "rack".into(),
                        operator: NodeSelectorOperator::In,
                        values: vec!["r2".into()],
                    }],
                    match_fields: Vec::new(),
                }),
                "rack-r2",
            ),
            reach(PoolReach::AllNodes, "anywhere"),
        ],
        counter_sets: Vec::new(),
    });
    assert!(
        matches!(reply, LedgerReply::PoolPublished { .. }),
        "{reply:?}"
    );
    f
}

#[test]
fn each_device_of_a_per_device_pool_serves_only_the_nodes_it_names() {
    let mut f = per_device_fixture();
    // Two devices at once: only n1 (on-n1, anywhere) and n3 (rack-r2, anywhere) have two.
    let two = super::claim_spec(vec![request("gpu", exact(2, &["true"]))], vec![]);
    let placement = f.place(&["a"], &two);
    let node = placement.assignments.first().map(|a| a.node.clone());
    let mut devices: Vec<String> = network_devices(&placement)
        .into_iter()
        .flat_map(|(_, d)| d)
        .collect();
    devices.sort();
    match node.as_deref() {
        Some("n1") => assert_eq!(devices, ["anywhere", "on-n1"]),
        Some("n3") => assert_eq!(devices, ["anywhere", "rack-r2"]),
        other => panic!("placed on {other:?}: {placement:?}"),
    }
    commit(&mut f, &placement);
    // The ledger refuses a device where it does not reach, whatever the plan says.
    let on_n2 = crate::ledger::command::NetworkHold {
        member: MemberKey::new("ns", "g", "b"),
        devices: vec![crate::model::claim::DeviceAllocation {
            claim: "c".into(),
            request: "gpu".into(),
            device: crate::model::device::DeviceId::new(DRIVER, "per-device", "on-n1"),
            admin_access: crate::model::claim::AdminAccess::Disabled,
            tolerations: Vec::new(),
            share_id: None,
            consumed_capacity: Default::default(),
        }],
        claim: None,
    };
    let reply = f.apply(LedgerOp::ReserveAndCommit {
        txn_id: TxnId(99),
        members: vec![crate::ledger::command::ReserveMember {
            member: MemberKey::new("ns", "g", "b"),
            node: "n2".into(),
            pod: Default::default(),
        }],
        network: vec![on_n2],
    });
    assert!(
        format!("{reply:?}").contains("DeviceUnreachable"),
        "{reply:?}"
    );
}

#[test]
fn a_per_device_pool_needs_every_device_to_say_where_it_is() {
    let mut f = fixture(0);
    for (reach, devices) in [
        (PoolReach::PerDevice, vec![Device::new("silent")]),
        (
            PoolReach::AllNodes,
            vec![Device {
                reach: Some(Box::new(PoolReach::AllNodes)),
                ..Device::new("says")
            }],
        ),
    ] {
        let reply = f.apply(LedgerOp::PublishNetworkPool {
            driver: DRIVER.into(),
            pool: "bad".into(),
            generation: 1,
            reach,
            devices,
            counter_sets: Vec::new(),
        });
        assert!(format!("{reply:?}").contains("devices[0]: "), "{reply:?}");
    }
}
