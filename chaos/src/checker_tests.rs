//! Unit tests of `checker.rs`.

use super::*;
use gangway_proto::v1::{DeviceInfo, MemberPlacement, NodePod, NodeSpec};

fn node(name: &str, cpu: &str, requested: &str, slots: &[(&str, &str)]) -> NodeInfo {
    NodeInfo {
        node: Some(NodeSpec {
            name: name.into(),
            allocatable: [("cpu".to_string(), cpu.to_string())].into(),
            ..Default::default()
        }),
        requested: [("cpu".to_string(), requested.to_string())].into(),
        pod_slots: slots
            .iter()
            .map(|(m, s)| NodePod {
                member: m.to_string(),
                state: s.to_string(),
                txn: "t1".into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn group(id: u64, key: &str, state: &str, placed: &[(&str, &str)]) -> GangGroupStatus {
    GangGroupStatus {
        id,
        idempotency_key: key.into(),
        state: state.into(),
        placements: placed
            .iter()
            .map(|(m, n)| {
                let parts: Vec<&str> = m.split('/').collect();
                MemberPlacement {
                    namespace: parts[0].into(),
                    gang: parts[1].into(),
                    member: parts[2].into(),
                    node: n.to_string(),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}

fn entry(t_ms: u64, event: Event) -> Entry {
    Entry { t_ms, event }
}

fn place(op: u64, key: &str, min: u32) -> Event {
    Event::Invoke {
        op,
        f: "place".into(),
        key: key.into(),
        gangs: vec![GangShape {
            name: format!("chaos/op{op}-0"),
            min_member: min,
            members: min,
            mode: "Strict".into(),
            cpu: 1,
            gpu: 0,
            priority: 0,
            required: None,
        }],
        members: vec![],
    }
}

fn hashes(states: &[(u64, &str)]) -> BTreeMap<u64, Option<Vec<GroupHash>>> {
    states
        .iter()
        .enumerate()
        .map(|(i, (applied, hash))| {
            (
                i as u64 + 1,
                Some(vec![GroupHash {
                    group: 0,
                    applied: *applied,
                    hash: hash.to_string(),
                }]),
            )
        })
        .collect()
}

fn consistent() -> (Vec<Entry>, FinalState) {
    let history = vec![
        entry(0, place(1, "k1", 2)),
        entry(
            30,
            Event::Ok {
                op: 1,
                group: 7,
                state: "Placed".into(),
                placed: vec![],
            },
        ),
    ];
    let fin = FinalState {
        groups: vec![group(
            7,
            "k1",
            "Placed",
            &[("chaos/op1-0/m-0", "a"), ("chaos/op1-0/m-1", "b")],
        )],
        nodes: vec![
            node("a", "4", "1", &[("chaos/op1-0/m-0", "Committed")]),
            node("b", "4", "1", &[("chaos/op1-0/m-1", "Committed")]),
        ],
        replicas: hashes(&[(5, "aa"), (5, "aa"), (5, "aa")]),
        unreadable: vec![],
    };
    (history, fin)
}

fn invariants(v: &Verdict) -> Vec<&str> {
    v.violations.iter().map(|x| x.invariant.as_str()).collect()
}

#[test]
fn a_consistent_end_state_passes() {
    let (h, fin) = consistent();
    let v = check(&h, &fin);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
}

#[test]
fn a_member_held_for_no_placed_group_is_i3() {
    let (h, mut fin) = consistent();
    fin.nodes[1].pod_slots.push(NodePod {
        member: "chaos/op9-0/m".into(),
        state: "Committed".into(),
        txn: "t9".into(),
    });
    assert_eq!(invariants(&check(&h, &fin)), ["I3"]);
}

#[test]
fn a_partly_placed_group_is_i3() {
    let (h, mut fin) = consistent();
    fin.groups[0].placements.pop();
    fin.nodes[1].pod_slots.clear();
    assert_eq!(invariants(&check(&h, &fin)), ["I3"]);
}

#[test]
fn overcommit_two_owners_and_a_stale_reservation_are_found() {
    let (h, mut fin) = consistent();
    fin.nodes[0].requested.insert("cpu".into(), "4500m".into());
    fin.nodes[0].devices.push(DeviceInfo {
        driver: "d".into(),
        pool: "p".into(),
        name: "gpu-0".into(),
        unhealthy: false,
        held_by: vec!["x".into(), "y".into()],
        withdrawn: false,
    });
    fin.nodes[0].pod_slots[0].state = "Reserved".into();
    let v = check(&h, &fin);
    let found = invariants(&v);
    for i in ["I1", "I2", "I5"] {
        assert!(found.contains(&i), "{i} not in {found:?}");
    }
}

#[test]
fn a_lost_acknowledgement_or_a_second_group_per_key_is_i4() {
    let (h, mut fin) = consistent();
    let mut twin = fin.groups[0].clone();
    twin.id = 8;
    twin.state = "Cancelled".into();
    twin.placements.clear();
    fin.groups.push(twin);
    assert_eq!(invariants(&check(&h, &fin)), ["I4"]);
    let (h, mut fin) = consistent();
    fin.groups.clear();
    fin.nodes.iter_mut().for_each(|n| n.pod_slots.clear());
    assert_eq!(invariants(&check(&h, &fin)), ["I4"]);
}

/// A release or cancel acknowledged with the final state of a group that had
/// already ended changes nothing; one acknowledged as taking effect must show.
#[test]
fn a_release_of_an_ended_group_answers_its_end() {
    let call = |op, f: &str, answered: &str| {
        [
            entry(
                40,
                Event::Invoke {
                    op,
                    f: f.into(),
                    key: "7".into(),
                    gangs: vec![],
                    members: vec![],
                },
            ),
            entry(
                50,
                Event::Ok {
                    op,
                    group: 7,
                    state: answered.into(),
                    placed: vec![],
                },
            ),
        ]
    };
    let (mut h, mut fin) = consistent();
    fin.groups[0].state = "TimedOut".into();
    fin.groups[0].placements.clear();
    fin.nodes.iter_mut().for_each(|n| n.pod_slots.clear());
    h.truncate(1);
    h.extend(call(2, "release", "TimedOut"));
    h.extend(call(3, "cancel", "TimedOut"));
    assert_eq!(invariants(&check(&h, &fin)), Vec::<&str>::new());
    h.truncate(1);
    h.extend(call(4, "release", "Releasing"));
    assert_eq!(invariants(&check(&h, &fin)), ["I4"]);
}

/// A twin declaring a placed group's gang is refused while that group lives; once
/// it ended on its own (preempted), a twin is rightly accepted. The checker tells
/// the two apart by what the group's release, invoked after the twin's answer, says.
#[test]
fn an_accepted_twin_is_i4_only_if_its_declarer_was_live_after_it() {
    let twin_then_release = |released: &str| {
        let (mut h, mut fin) = consistent();
        let gangs = match &h[0].event {
            Event::Invoke { gangs, .. } => gangs.clone(),
            _ => unreachable!("consistent() starts with a placement"),
        };
        h.push(entry(
            40,
            Event::Invoke {
                op: 2,
                f: crate::hostile::F_PLACE_DUPLICATE_GANG.into(),
                key: "k1-twin".into(),
                gangs,
                members: vec![],
            },
        ));
        h.push(entry(
            55,
            Event::Ok {
                op: 2,
                group: 8,
                state: "Queued".into(),
                placed: vec![],
            },
        ));
        h.push(entry(
            60,
            Event::Invoke {
                op: 3,
                f: "release".into(),
                key: "7".into(),
                gangs: vec![],
                members: vec![],
            },
        ));
        h.push(entry(
            70,
            Event::Ok {
                op: 3,
                group: 7,
                state: released.into(),
                placed: vec![],
            },
        ));
        fin.groups[0].state = released.into();
        fin.groups[0].placements.clear();
        fin.nodes.iter_mut().for_each(|n| n.pod_slots.clear());
        fin.groups.push(group(8, "k1-twin", "Cancelled", &[]));
        let refusals: Vec<String> = check(&h, &fin)
            .violations
            .into_iter()
            .filter(|v| v.detail.contains("must be refused"))
            .map(|v| v.detail)
            .collect();
        refusals
    };
    let live = twin_then_release("Released");
    assert_eq!(live.len(), 1, "{live:?}");
    assert!(
        live[0].contains("declaring group 7 was live after it"),
        "{live:?}"
    );
    assert!(
        twin_then_release("Preempted").is_empty(),
        "a group preempted before the twin took effect frees its gang"
    );
    assert_eq!(twin_then_release("Placing").len(), 1, "a live answer");
}

#[test]
fn differing_hashes_are_i6() {
    let (h, mut fin) = consistent();
    fin.replicas = hashes(&[(5, "aa"), (5, "bb"), (5, "aa")]);
    assert_eq!(invariants(&check(&h, &fin)), ["I6"]);
}

#[test]
fn recovery_counts_from_the_fault_or_the_heal() {
    let fault = |fault, single| Event::Fault {
        fault,
        what: "kill".into(),
        targets: vec![1],
        led: vec![0],
        single_replica: single,
    };
    let ok = |op| Event::Ok {
        op,
        group: op,
        state: "Placed".into(),
        placed: vec![],
    };
    let h = vec![
        entry(100, fault(1, true)),
        entry(150, place(1, "a", 1)),
        entry(900, ok(1)),
        entry(1000, Event::Heal { fault: 1 }),
        entry(2000, fault(2, false)),
        entry(3000, Event::Heal { fault: 2 }),
        entry(2500, place(2, "b", 1)),
        entry(3100, place(3, "c", 1)),
        entry(3300, ok(2)),
        entry(3400, ok(3)),
    ];
    let r = recoveries(&h);
    assert_eq!(r[0].ms, Some(800));
    // Placements invoked before the heal do not count for a heal-measured fault.
    assert_eq!(r[1].ms, Some(400));
    let none = recoveries(&h[..4]);
    assert_eq!(none.len(), 1);
    let v = check(&[entry(0, fault(1, false))], &FinalState::default());
    assert_eq!(invariants(&v), ["I7"]);
}

#[test]
fn kube_pods_bound_twice_partly_or_unknown_to_the_ledger_are_i3() {
    use crate::kube_workload::ApiView;
    let (_, mut fin) = consistent();
    fin.nodes[0].pod_slots = vec![NodePod {
        member: "chaos/g1/g1-0".into(),
        state: "Bound".into(),
        txn: "t1".into(),
    }];
    let mut view = ApiView::default();
    view.pods
        .insert("g1-0".into(), ("g1".into(), Some("a".into())));
    view.bindings.insert("chaos/g1-0".into(), vec!["a".into()]);
    assert!(check_kube(&view, &fin).is_empty());

    let mut twice = view.clone();
    twice
        .bindings
        .insert("chaos/g1-0".into(), vec!["a".into(), "b".into()]);
    assert_eq!(check_kube(&twice, &fin).len(), 1);

    let mut partly = view.clone();
    partly.pods.insert("g1-1".into(), ("g1".into(), None));
    let found = check_kube(&partly, &fin);
    assert!(found[0].detail.contains("partly bound"), "{found:?}");

    let mut elsewhere = view.clone();
    elsewhere
        .pods
        .insert("g1-0".into(), ("g1".into(), Some("b".into())));
    let found = check_kube(&elsewhere, &fin);
    assert!(found[0].detail.contains("Bound on a"), "{found:?}");
}

/// A group preempted by a higher-priority group that was placed passes; one naming
/// no preemptor, a preemptor of equal priority, or one never placed is a violation.
#[test]
fn a_preempted_group_names_a_placed_preemptor_of_higher_priority() {
    let (mut history, mut fin) = consistent();
    let mut urgent = place(2, "k2", 1);
    if let Event::Invoke { gangs, .. } = &mut urgent {
        gangs[0].priority = 100;
    }
    history.push(entry(40, urgent));
    fin.groups[0].state = "Preempted".into();
    fin.groups[0].placements.clear();
    fin.groups[0].reason = "preempted by gang group 8 (txn-3)".into();
    fin.groups
        .push(group(8, "k2", "Placed", &[("chaos/op2-0/m-0", "a")]));
    fin.nodes = vec![
        node("a", "4", "1", &[("chaos/op2-0/m-0", "Committed")]),
        node("b", "4", "0", &[]),
    ];
    assert!(
        check(&history, &fin).violations.is_empty(),
        "{:?}",
        check(&history, &fin)
    );

    let mut nameless = fin.clone();
    nameless.groups[0].reason = "gone".into();
    assert_eq!(invariants(&check(&history, &nameless)), ["I4"]);

    let mut waiting = fin.clone();
    waiting.groups[1].state = "TimedOut".into();
    waiting.groups[1].placements.clear();
    waiting.nodes[0].pod_slots.clear();
    waiting.nodes[0].requested.clear();
    let found = check(&history, &waiting);
    assert!(
        found
            .violations
            .iter()
            .any(|v| v.detail.contains("never placed")),
        "{found:?}"
    );

    let equal: Vec<Entry> = history
        .iter()
        .take(2)
        .cloned()
        .chain([entry(40, place(2, "k2", 1))])
        .collect();
    let found = check(&equal, &fin);
    assert!(
        found
            .violations
            .iter()
            .any(|v| v.detail.contains("priority 0")),
        "{found:?}"
    );
}

#[test]
fn quantities_and_percentiles() {
    assert_eq!(quantity("2"), Some(2000));
    assert_eq!(quantity("1500m"), Some(1500));
    assert_eq!(quantity("1Ki"), Some(1024 * 1000));
    assert_eq!(quantity("x"), None);
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(percentile(&v, 50), Some(50));
    assert_eq!(percentile(&v, 99), Some(99));
    assert_eq!(percentile(&[7], 99), Some(7));
    assert_eq!(percentile(&[], 50), None);
}

#[test]
fn a_gang_required_in_one_rack_on_two_racks_is_i9() {
    let (mut h, mut fin) = consistent();
    if let Event::Invoke { gangs, .. } = &mut h[0].event {
        gangs[0].required = Some("chaos/rack".into());
    }
    let rack = |fin: &mut FinalState, i: usize, value: &str| {
        if let Some(spec) = fin.nodes[i].node.as_mut() {
            spec.labels.insert("chaos/rack".into(), value.into());
        }
    };
    rack(&mut fin, 0, "rack-0");
    rack(&mut fin, 1, "rack-0");
    assert!(check(&h, &fin).violations.is_empty(), "one rack");
    rack(&mut fin, 1, "rack-1");
    assert_eq!(invariants(&check(&h, &fin)), ["I9"]);
}
