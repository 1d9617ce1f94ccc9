use super::*;

use crate::engine::{Diagnosis, Unplaced};
use crate::model::{MemberKey, ResourceName};

fn plan(reasons: &[FilterReason], placed_some: bool) -> GangPlacement {
    let diagnosis = Diagnosis {
        nodes: 4,
        reasons: reasons.iter().map(|r| (r.clone(), 1)).collect(),
    };
    let mut placement = GangPlacement {
        assignments: Vec::new(),
        unplaced: vec![Unplaced {
            member: MemberKey::new("ns", "g", "m0"),
            diagnosis,
        }],
        domain: None,
        network: Vec::new(),
        member_labels: Default::default(),
    };
    if placed_some {
        placement.assignments.push(crate::ledger::ReserveMember {
            member: MemberKey::new("ns", "g", "m1"),
            node: "n1".into(),
            pod: Default::default(),
        });
    }
    placement
}

fn counts(nodes: u64, room: u64) -> ChangeCounts {
    ChangeCounts { nodes, room }
}

#[test]
fn node_filters_park_for_node_changes_and_room_for_either() {
    let selector = plan(&[FilterReason::NodeAffinityMismatch], false);
    let full = plan(
        &[
            FilterReason::NodeAffinityMismatch,
            FilterReason::Insufficient(ResourceName::Cpu),
        ],
        false,
    );
    let plans = BTreeMap::from([(1, selector), (2, full)]);
    assert_eq!(
        what_helps(&plans, [1, 2]),
        Some(BTreeMap::from([(1, Helps::Nodes), (2, Helps::NodesOrRoom)]))
    );
    assert_eq!(
        what_helps(&plans, [1, 2, 3]),
        None,
        "shard 3 did not answer"
    );
    let partly = BTreeMap::from([(1, plan(&[FilterReason::NodeUnschedulable], true))]);
    assert_eq!(
        what_helps(&partly, [1]),
        Some(BTreeMap::from([(1, Helps::NodesOrRoom)])),
        "it planned some members there"
    );
}

#[test]
fn a_node_smaller_than_the_request_waits_for_node_changes_only() {
    let too_large = plan(
        &[
            FilterReason::LargerThanNode(ResourceName::Cpu),
            FilterReason::NodeAffinityMismatch,
        ],
        false,
    );
    let plans = BTreeMap::from([(1, too_large)]);
    assert_eq!(
        what_helps(&plans, [1]),
        Some(BTreeMap::from([(1, Helps::Nodes)])),
        "room freed on a node smaller than the request cannot help"
    );
}

#[test]
fn a_reason_that_passes_by_itself_parks_nothing() {
    for passing in [
        FilterReason::NodeMoving,
        FilterReason::SelectorsWarming,
        FilterReason::PodAffinityUnsatisfied,
        FilterReason::DeviceSearchLimit,
    ] {
        let plans = BTreeMap::from([(
            1,
            plan(&[FilterReason::NodeAffinityMismatch, passing], false),
        )]);
        assert_eq!(what_helps(&plans, [1]), None);
    }
}

#[test]
fn only_a_change_that_could_help_wakes() {
    let helps = BTreeMap::from([(1, Helps::Nodes), (2, Helps::NodesOrRoom)]);
    let then = BTreeMap::from([(1, counts(5, 5)), (2, counts(0, 0))]);
    let room_on_1 = BTreeMap::from([(1, counts(5, 9)), (2, counts(0, 0))]);
    assert!(
        !helped(&helps, &then, &room_on_1),
        "shard 1 needs a node change"
    );
    let node_on_1 = BTreeMap::from([(1, counts(6, 5)), (2, counts(0, 0))]);
    assert!(helped(&helps, &then, &node_on_1));
    let room_on_2 = BTreeMap::from([(1, counts(5, 5)), (2, counts(0, 1))]);
    assert!(helped(&helps, &then, &room_on_2));
    let added = BTreeMap::from([(1, counts(5, 5)), (2, counts(0, 0)), (3, counts(1, 0))]);
    assert!(
        helped(&helps, &then, &added),
        "a shard the plans did not cover"
    );
    assert!(!helped(&helps, &then, &then));
}

mod from_a_joint_plan {
    use super::*;
    use crate::model::{Gang, GangGroup, GangMode};
    use std::collections::BTreeSet;

    fn group() -> GangGroup {
        GangGroup {
            id: "x".into(),
            gangs: vec![Gang {
                creation_order: 1,
                ..Gang::with_members("ns", "g", 2, 2, GangMode::Strict)
            }],
            ..Default::default()
        }
    }

    fn keys() -> BTreeSet<MemberKey> {
        (0..2)
            .map(|i| MemberKey::new("ns", "g", format!("m{i}")))
            .collect()
    }

    /// Every member of `keys()` unplaced for `reason`, beside a member of another group.
    fn misses(reason: FilterReason) -> Vec<Unplaced> {
        let diagnosis = Diagnosis {
            nodes: 4,
            reasons: [(reason, 4)].into(),
        };
        keys()
            .into_iter()
            .chain([MemberKey::new("ns", "other", "m0")])
            .map(|member| Unplaced {
                member,
                diagnosis: diagnosis.clone(),
            })
            .collect()
    }

    #[test]
    fn node_bound_reasons_on_every_shard_park_it_with_its_own_reason() {
        let by_shard = BTreeMap::from([
            (1, misses(FilterReason::NodeAffinityMismatch)),
            (2, misses(FilterReason::LargerThanNode(ResourceName::Cpu))),
        ]);
        let (helps, reason) = node_bound(&group(), &keys(), &by_shard, &BTreeSet::new(), [1, 2])
            .expect("only a node change can help");
        assert_eq!(
            helps,
            BTreeMap::from([(1, Helps::Nodes), (2, Helps::Nodes)])
        );
        assert!(
            reason.contains("didn't match Pod's node affinity/selector")
                && reason.contains("less allocatable cpu"),
            "{reason}"
        );
    }

    #[test]
    fn room_a_shard_that_did_not_answer_or_a_member_planned_gives_none() {
        let group = group();
        let none = BTreeSet::new();
        // Room the other groups of the plan took: its own plan might fit.
        let taken = BTreeMap::from([
            (1, misses(FilterReason::NodeAffinityMismatch)),
            (2, misses(FilterReason::CapacityTakenByGang)),
        ]);
        assert_eq!(node_bound(&group, &keys(), &taken, &none, [1, 2]), None);
        let full = BTreeMap::from([(1, misses(FilterReason::Insufficient(ResourceName::Cpu)))]);
        assert_eq!(node_bound(&group, &keys(), &full, &none, [1]), None);
        // Shard 2 did not answer.
        let one = BTreeMap::from([(1, misses(FilterReason::NodeAffinityMismatch))]);
        assert_eq!(node_bound(&group, &keys(), &one, &none, [1, 2]), None);
        // A member some shard planned.
        let planned = BTreeSet::from([MemberKey::new("ns", "g", "m1")]);
        assert_eq!(node_bound(&group, &keys(), &one, &planned, [1]), None);
        // A member a shard's plan does not list.
        let mut partial = misses(FilterReason::NodeAffinityMismatch);
        partial.remove(0);
        let partial = BTreeMap::from([(1, partial)]);
        assert_eq!(node_bound(&group, &keys(), &partial, &none, [1]), None);
        // A reason that passes by itself.
        let moving = BTreeMap::from([(1, misses(FilterReason::NodeMoving))]);
        assert_eq!(node_bound(&group, &keys(), &moving, &none, [1]), None);
        assert_eq!(
            node_bound(&group, &BTreeSet::new(), &one, &none, [1]),
            None,
            "no members"
        );
    }
}
