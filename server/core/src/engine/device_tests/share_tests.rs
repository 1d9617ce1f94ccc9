//! Shared ResourceClaims: one claim named by several pods is allocated once, by its
//! carrier, and its followers are placed beside it; the ledger refuses a follower away
//! from its carrier and a second carrier, hands the devices to a follower when the
//! carrier leaves, frees them with the last consumer and evicts every consumer of a bad
//! device. A random walk checks the ledger against a reference model, and finds the
//! bug switch that frees the devices with their carrier.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::{exact, gpu, one, request, unplaced_reasons, Fixture, DRIVER};
use crate::engine::filter::FilterReason;
use crate::engine::placement::{place_members, MemberRef};
use crate::engine::profile::Profile;
use crate::ledger::command::{
    LedgerOp, LedgerReply, RefusalCause, ReleaseTarget, ReserveMember, TxnId,
};
use crate::ledger::devices::{DeviceEviction, DeviceHealth, DeviceHealthReport, EvictionCause};
use crate::ledger::usage::HandOver;
use crate::model::claim::{AdminAccess, AllocationMode, ClaimShare, DeviceAllocation, PodClaim};
use crate::model::device::DeviceId;
use crate::model::error::FieldPath;
use crate::model::gang::MemberKey;
use crate::model::pod::{PodSpec, PodSummary};

const SHARED: &str = "ns/channel";

fn share() -> ClaimShare {
    ClaimShare {
        pod_claim: "gpu".into(),
        claim: SHARED.into(),
    }
}

/// The pod that allocates the shared claim: one GPU.
fn carrier_spec() -> PodSpec {
    let mut spec = PodSpec {
        claims: vec![PodClaim {
            name: "gpu".into(),
            requests: vec![request("gpu", exact(1, &[]))],
            constraints: vec![],
            config: vec![],
        }],
        ..PodSpec::default()
    };
    spec.shares = vec![share()];
    assert_eq!(spec.validate(&FieldPath::new("spec")), Ok(()));
    spec
}

/// A pod that names the shared claim without allocating it.
fn follower_spec() -> PodSpec {
    let spec = PodSpec {
        shares: vec![share()],
        ..PodSpec::default()
    };
    assert_eq!(spec.validate(&FieldPath::new("spec")), Ok(()));
    spec
}

fn key(name: &str) -> MemberKey {
    MemberKey::new("ns", "g", name)
}

/// A fixture with `n1` (no devices) and `n2`, `n3` (two GPUs each).
fn fixture() -> Fixture {
    let mut f = Fixture::new(&["n1", "n2", "n3"]);
    for n in ["n2", "n3"] {
        f.publish(
            n,
            vec![gpu("gpu-0", "a100", 40, 0), gpu("gpu-1", "a100", 40, 0)],
            vec![],
        );
    }
    f
}

/// Places `members` (name, spec) as one gang and commits them through the ledger.
fn place_and_commit(f: &mut Fixture, members: &[(&str, &PodSpec)]) -> Vec<ReserveMember> {
    let keys: Vec<MemberKey> = members.iter().map(|(n, _)| key(n)).collect();
    let refs: Vec<MemberRef<'_>> = keys
        .iter()
        .zip(members)
        .map(|(key, (_, spec))| MemberRef { key, spec })
        .collect();
    let placement = place_members(&f.ledger, &refs, &Profile::default(), &[]);
    assert!(placement.is_complete(), "{placement:?}");
    f.txn += 1;
    let reply = f.apply(LedgerOp::ReserveAndCommit {
        txn_id: TxnId(f.txn),
        members: placement.assignments.clone(),
        network: Vec::new(),
    });
    assert_eq!(
        reply,
        LedgerReply::Committed {
            txn_id: TxnId(f.txn)
        }
    );
    assert_eq!(f.ledger.check_invariants(), Ok(()));
    placement.assignments
}

/// Devices held on `node`, as `device (holders)`.
fn held(f: &Fixture, node: &str) -> Vec<String> {
    let Some(entry) = f.ledger.node(node) else {
        return Vec::new();
    };
    ["gpu-0", "gpu-1"]
        .iter()
        .filter_map(|d| {
            let id = DeviceId::new(DRIVER, node, *d);
            entry
                .usage
                .devices
                .use_of(&id)
                .map(|u| format!("{d} ({})", u.holders))
        })
        .collect()
}

/// Each eviction's member and cause.
fn evicted(evictions: Vec<DeviceEviction>) -> BTreeSet<(String, EvictionCause)> {
    evictions
        .into_iter()
        .map(|e| (e.member.member, e.cause))
        .collect()
}

#[test]
fn a_gang_sharing_a_claim_lands_on_one_node_and_allocates_it_once() {
    let mut f = fixture();
    let carrier = carrier_spec();
    let follower = follower_spec();
    // The carrier is not first in the gang; the engine places it first anyway.
    let placed = place_and_commit(
        &mut f,
        &[
            ("a", &follower),
            ("b", &follower),
            ("c", &carrier),
            ("d", &follower),
        ],
    );
    let nodes: BTreeSet<&str> = placed.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(nodes.len(), 1, "{placed:?}");
    let node = placed[0].node.clone();
    assert_ne!(node, "n1", "n1 has no devices");
    let with_devices: Vec<&str> = placed
        .iter()
        .filter(|m| !m.pod.devices.is_empty())
        .map(|m| m.member.member.as_str())
        .collect();
    assert_eq!(with_devices, vec!["c"]);
    assert_eq!(held(&f, &node), vec!["gpu-0 (1)"]);

    // A later pod of the same claim follows it to its node and takes nothing more.
    let later = place_and_commit(&mut f, &[("e", &follower)]);
    assert_eq!(later[0].node, node);
    assert_eq!(held(&f, &node), vec!["gpu-0 (1)"]);
}

#[test]
fn a_follower_without_a_carrier_anywhere_waits_with_the_reason() {
    let f = fixture();
    let follower = follower_spec();
    let k = key("a");
    let placement = place_members(
        &f.ledger,
        &[MemberRef {
            key: &k,
            spec: &follower,
        }],
        &Profile::default(),
        &[],
    );
    assert_eq!(
        unplaced_reasons(&placement),
        vec![FilterReason::SharedClaimNotHere(SHARED.into())]
    );
}

#[test]
fn the_ledger_refuses_a_follower_away_from_its_carrier_and_a_second_carrier() {
    let mut f = fixture();
    let placed = place_and_commit(&mut f, &[("c", &carrier_spec())]);
    let node = placed[0].node.clone();
    let other = if node == "n2" { "n3" } else { "n2" };
    let follower = PodSummary::from_spec(&follower_spec());
    let mut second = placed[0].pod.clone();
    second.devices[0].device = DeviceId::new(DRIVER, &node, "gpu-1");
    let cases = [
        (
            "follower elsewhere",
            other.to_string(),
            follower.clone(),
            RefusalCause::SharedClaimNotHere {
                claim: SHARED.into(),
            },
        ),
        (
            "second carrier",
            node.clone(),
            second,
            RefusalCause::SharedClaimCarried {
                claim: SHARED.into(),
            },
        ),
    ];
    for (what, node, pod, cause) in cases {
        f.txn += 1;
        let reply = f.apply(LedgerOp::ReserveAndCommit {
            txn_id: TxnId(f.txn),
            members: vec![ReserveMember {
                member: key("x"),
                node,
                pod,
            }],
            network: Vec::new(),
        });
        let LedgerReply::ReserveRefused { refusals, .. } = reply else {
            panic!("{what}: {reply:?}");
        };
        assert_eq!(refusals[0].cause, cause, "{what}");
    }
    // Two carriers in one batch are refused too, wherever they are listed.
    let mut two = placed[0].pod.clone();
    two.devices[0].device = DeviceId::new(DRIVER, other, "gpu-1");
    let mut again = two.clone();
    again.devices[0].device = DeviceId::new(DRIVER, other, "gpu-0");
    f.txn += 1;
    let reply = f.apply(LedgerOp::ReserveAndCommit {
        txn_id: TxnId(f.txn),
        members: vec![
            ReserveMember {
                member: key("y"),
                node: other.to_string(),
                pod: two,
            },
            ReserveMember {
                member: key("z"),
                node: other.to_string(),
                pod: again,
            },
        ],
        network: Vec::new(),
    });
    assert!(
        matches!(reply, LedgerReply::ReserveRefused { .. }),
        "{reply:?}"
    );
    assert_eq!(f.ledger.check_invariants(), Ok(()));
}

#[test]
fn the_devices_pass_to_a_follower_and_go_with_the_last_consumer() {
    let mut f = fixture();
    let carrier = carrier_spec();
    let follower = follower_spec();
    let placed = place_and_commit(
        &mut f,
        &[("c", &carrier), ("a", &follower), ("b", &follower)],
    );
    let node = placed[0].node.clone();
    f.release("c");
    assert_eq!(f.ledger.check_invariants(), Ok(()));
    assert_eq!(
        held(&f, &node),
        vec!["gpu-0 (1)"],
        "the followers still use it"
    );
    let heir = f.ledger.slot(&key("a")).expect("a is held");
    assert_eq!(heir.pod.devices.len(), 1);
    assert_eq!(heir.pod.devices[0].claim, "gpu");
    // The node's other GPU is the only one left there.
    let gpu_pod = one("true");
    let more = place_and_commit(&mut f, &[("p", &gpu_pod), ("q", &gpu_pod)]);
    let on_node: Vec<String> = more
        .iter()
        .filter(|m| m.node == node)
        .flat_map(|m| m.pod.devices.iter().map(|d| d.device.device.clone()))
        .collect();
    assert!(
        on_node.iter().all(|d| d == "gpu-1"),
        "{more:?} took the shared GPU"
    );
    f.release("a");
    f.release("b");
    assert_eq!(f.ledger.check_invariants(), Ok(()));
    assert!(
        !held(&f, &node).contains(&"gpu-0 (1)".to_string()),
        "freed with the last consumer: {:?}",
        held(&f, &node)
    );
}

#[test]
fn a_bad_device_evicts_every_pod_of_the_claim() {
    let mut f = fixture();
    let placed = place_and_commit(&mut f, &[("c", &carrier_spec()), ("a", &follower_spec())]);
    let node = placed[0].node.clone();
    let reply = f.apply(LedgerOp::SetDeviceHealth {
        node: node.clone(),
        devices: vec![DeviceHealthReport {
            device: DeviceId::new(DRIVER, &node, "gpu-0"),
            health: DeviceHealth::Unhealthy,
        }],
    });
    let LedgerReply::DeviceHealthRecorded { evictions, .. } = reply else {
        panic!("{reply:?}");
    };
    let evicted = evicted(evictions);
    assert_eq!(
        evicted,
        BTreeSet::from([
            ("a".to_string(), EvictionCause::Unhealthy),
            ("c".to_string(), EvictionCause::Unhealthy),
        ])
    );
}

#[test]
fn a_device_dropped_from_its_pool_evicts_every_pod_of_the_claim() {
    let mut f = fixture();
    let placed = place_and_commit(&mut f, &[("c", &carrier_spec()), ("a", &follower_spec())]);
    let node = placed[0].node.clone();
    let used = placed
        .iter()
        .flat_map(|m| m.pod.devices.iter().map(|d| d.device.device.clone()))
        .next()
        .unwrap_or_default();
    let kept: Vec<_> = ["gpu-0", "gpu-1"]
        .into_iter()
        .filter(|d| *d != used)
        .map(|d| gpu(d, "a100", 40, 0))
        .collect();
    let reply = f.apply(LedgerOp::PublishPool {
        node: node.clone(),
        driver: DRIVER.into(),
        pool: node.clone(),
        generation: 2,
        devices: kept,
        counter_sets: vec![],
    });
    let LedgerReply::PoolPublished { evictions, .. } = reply else {
        panic!("{reply:?}");
    };
    let evicted = evicted(evictions);
    assert_eq!(
        evicted,
        BTreeSet::from([
            ("a".to_string(), EvictionCause::DeviceRemoved),
            ("c".to_string(), EvictionCause::DeviceRemoved),
        ])
    );
    assert_eq!(f.ledger.check_invariants(), Ok(()));
}

/// One step of the random walk.
#[derive(Debug, Clone)]
enum Step {
    /// Reserve pod `pod` as carrier (with device `device`) or follower on node `node`;
    /// commit or abort it at once, or leave it open.
    Reserve {
        pod: usize,
        node: usize,
        carrier: Option<usize>,
        end: End,
    },
    /// Release pod `pod`.
    Release { pod: usize },
    /// Decide the open transaction of pod `pod`, if any.
    Decide { pod: usize, commit: bool },
}

#[derive(Debug, Clone, Copy)]
enum End {
    Commit,
    Abort,
    Open,
}

const PODS: usize = 5;
const NODES: [&str; 2] = ["n2", "n3"];

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..PODS, 0..2usize, prop::option::of(0..2usize), 0..3u8).prop_map(
            |(pod, node, carrier, end)| Step::Reserve {
                pod,
                node,
                carrier,
                end: [End::Commit, End::Abort, End::Open][usize::from(end)],
            }
        ),
        2 => (0..PODS).prop_map(|pod| Step::Release { pod }),
        1 => (0..PODS, any::<bool>()).prop_map(|(pod, commit)| Step::Decide { pod, commit }),
    ]
}

/// The reference: who consumes the claim where, and which device it holds.
#[derive(Debug, Default)]
struct Model {
    /// Pod → (node, carrier?) for every held pod.
    held: BTreeMap<usize, (usize, bool)>,
    /// Pod → its open transaction.
    open: BTreeMap<usize, u64>,
    /// Node → the claim's device there, while any consumer is held on it.
    device: BTreeMap<usize, usize>,
}

impl Model {
    fn accepts(&self, pod: usize, node: usize, carrier: Option<usize>) -> bool {
        if self.held.contains_key(&pod) {
            return false;
        }
        let carried_here = self.device.contains_key(&node);
        match carrier {
            Some(_) => !carried_here,
            None => carried_here,
        }
    }

    fn release(&mut self, pod: usize) {
        if let Some((node, _)) = self.held.remove(&pod) {
            self.open.remove(&pod);
            if !self.held.values().any(|(n, _)| *n == node) {
                self.device.remove(&node);
            }
        }
    }
}

/// Runs `steps` on a ledger whose carriers hand over as `hand_over` says; the first
/// disagreement with the model or broken invariant, if any.
fn walk(steps: &[Step], hand_over: HandOver) -> Result<(), String> {
    let mut f = fixture();
    f.ledger.set_hand_over(hand_over);
    let mut model = Model::default();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Reserve {
                pod,
                node,
                carrier,
                end,
            } => {
                let mut summary = PodSummary::from_spec(&follower_spec());
                if let Some(d) = carrier {
                    summary.devices = vec![DeviceAllocation {
                        claim: "gpu".into(),
                        request: "gpu".into(),
                        device: DeviceId::new(DRIVER, NODES[node], format!("gpu-{d}")),
                        admin_access: AdminAccess::Disabled,
                        tolerations: vec![],
                        share_id: None,
                        consumed_capacity: BTreeMap::new(),
                    }];
                }
                f.txn += 1;
                let txn = f.txn;
                let deadline_ms = f.at_ms + 60_000;
                let reply = f.apply(LedgerOp::Reserve {
                    txn_id: TxnId(txn),
                    members: vec![ReserveMember {
                        member: key(&format!("p{pod}")),
                        node: NODES[node].into(),
                        pod: summary,
                    }],
                    deadline_ms,
                    network: Vec::new(),
                });
                let accepted = matches!(reply, LedgerReply::Reserved { .. });
                if accepted != model.accepts(pod, node, carrier) {
                    return Err(format!(
                        "step {i} {step:?}: ledger {reply:?}, model {model:?}"
                    ));
                }
                if accepted {
                    model.held.insert(pod, (node, carrier.is_some()));
                    model.open.insert(pod, txn);
                    if let Some(d) = carrier {
                        model.device.insert(node, d);
                    }
                    match end {
                        End::Commit => {
                            f.apply(LedgerOp::Commit { txn_id: TxnId(txn) });
                            model.open.remove(&pod);
                        }
                        End::Abort => {
                            f.apply(LedgerOp::Abort { txn_id: TxnId(txn) });
                            model.release(pod);
                        }
                        End::Open => {}
                    }
                }
            }
            Step::Release { pod } => {
                match model.open.get(&pod) {
                    // The shard releases an open transaction whole.
                    Some(&txn) => {
                        f.apply(LedgerOp::Release {
                            target: ReleaseTarget::Txn(TxnId(txn)),
                        });
                    }
                    None => {
                        f.apply(LedgerOp::Release {
                            target: ReleaseTarget::Members(vec![key(&format!("p{pod}"))]),
                        });
                    }
                }
                model.release(pod);
            }
            Step::Decide { pod, commit } => {
                if let Some(&txn) = model.open.get(&pod) {
                    if commit {
                        f.apply(LedgerOp::Commit { txn_id: TxnId(txn) });
                        model.open.remove(&pod);
                    } else {
                        f.apply(LedgerOp::Abort { txn_id: TxnId(txn) });
                        model.release(pod);
                    }
                }
            }
        }
        f.ledger
            .check_invariants()
            .map_err(|e| format!("step {i} {step:?}: {e:?}"))?;
        for (n, name) in NODES.iter().enumerate() {
            let expected: Vec<String> = model
                .device
                .get(&n)
                .map(|d| vec![format!("gpu-{d} (1)")])
                .unwrap_or_default();
            if held(&f, name) != expected {
                return Err(format!(
                    "step {i} {step:?}: {name} holds {:?}, the model {expected:?}",
                    held(&f, name)
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn the_ledger_keeps_a_shared_claim_as_the_model_does(
        steps in prop::collection::vec(arb_step(), 1..40),
    ) {
        if let Err(e) = walk(&steps, HandOver::ToFollower) {
            prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn the_walk_finds_devices_freed_with_their_carrier() {
    // Carrier and follower on n2, then the carrier goes.
    let steps = [
        Step::Reserve {
            pod: 0,
            node: 0,
            carrier: Some(0),
            end: End::Commit,
        },
        Step::Reserve {
            pod: 1,
            node: 0,
            carrier: None,
            end: End::Commit,
        },
        Step::Release { pod: 0 },
    ];
    assert_eq!(walk(&steps, HandOver::ToFollower), Ok(()));
    let found = walk(&steps, HandOver::Freed).expect_err("the bug switch is caught");
    assert!(found.contains("I1"), "{found}");
}

#[test]
fn an_all_mode_claim_is_shared_whole() {
    let mut f = fixture();
    let mut all = exact(1, &[]);
    all.allocation_mode = AllocationMode::All;
    let mut carrier = carrier_spec();
    carrier.claims[0].requests = vec![request("gpu", all)];
    let placed = place_and_commit(&mut f, &[("a", &follower_spec()), ("c", &carrier)]);
    let node = placed[0].node.clone();
    assert_eq!(held(&f, &node), vec!["gpu-0 (1)", "gpu-1 (1)"]);
    f.release("c");
    assert_eq!(held(&f, &node), vec!["gpu-0 (1)", "gpu-1 (1)"]);
    f.release("a");
    assert_eq!(held(&f, &node), Vec::<String>::new());
}

#[test]
fn a_carrier_that_follows_another_claim_goes_after_that_claims_carrier() {
    let mut f = fixture();
    let other = |pod_claim: &str| ClaimShare {
        pod_claim: pod_claim.into(),
        claim: "ns/other".into(),
    };
    // a carries channel; b follows channel and carries other; c follows other.
    let a = carrier_spec();
    let mut b = follower_spec();
    b.claims = vec![PodClaim {
        name: "second".into(),
        requests: vec![request("gpu", exact(1, &[]))],
        constraints: vec![],
        config: vec![],
    }];
    b.shares.push(other("second"));
    let c = PodSpec {
        shares: vec![other("second")],
        ..PodSpec::default()
    };
    for spec in [&b, &c] {
        assert_eq!(spec.validate(&FieldPath::new("spec")), Ok(()));
    }
    let placed = place_and_commit(&mut f, &[("c", &c), ("b", &b), ("a", &a)]);
    let nodes: BTreeSet<&str> = placed.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(nodes.len(), 1, "{placed:?}");
    let node = placed[0].node.clone();
    assert_eq!(held(&f, &node), vec!["gpu-0 (1)", "gpu-1 (1)"]);
}
