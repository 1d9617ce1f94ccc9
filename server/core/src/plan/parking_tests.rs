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
