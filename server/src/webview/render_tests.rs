//! Unit tests of `render.rs`.

use super::*;
use gangway_proto::admin::QueueSpec;
use gangway_proto::v1::{DeviceInfo, NodeSpec};

fn node(name: &str, gpus_held: usize, unhealthy: bool) -> NodeInfo {
    NodeInfo {
        node: Some(NodeSpec {
            name: name.into(),
            allocatable: [("cpu".to_string(), "8".to_string())].into(),
            ..Default::default()
        }),
        shard: 1,
        devices: (0..4)
            .map(|i| DeviceInfo {
                driver: "gpu.example.com".into(),
                pool: name.into(),
                name: format!("gpu-{i}"),
                unhealthy: unhealthy && i == 3,
                held_by: if i < gpus_held {
                    vec!["ns/g/m".into()]
                } else {
                    vec![]
                },
                withdrawn: false,
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn cells_are_coloured_by_held_devices_and_mark_unhealthy_ones() {
    let free = node("a", 0, false);
    let half = node("b", 2, false);
    let full = node("c", 4, true);
    assert_eq!(heat(&free, device_counts(&free)), 0);
    assert_eq!(heat(&half, device_counts(&half)), 2);
    assert_eq!(heat(&full, device_counts(&full)), 4);
    let html = cell(&full).into_string();
    assert!(html.contains("cell h4 u"), "{html}");
    assert!(html.contains("data-n=\"c\""), "{html}");
}

#[test]
fn counted_gpus_are_read_from_allocatable_and_requests() {
    let mut n = node("a", 0, false);
    n.devices.clear();
    if let Some(s) = n.node.as_mut() {
        s.allocatable.insert("nvidia.com/gpu".into(), "8".into());
        s.allocatable.insert("hugepages-2Mi".into(), "1Gi".into());
    }
    n.requested.insert("nvidia.com/gpu".into(), "6".into());
    let c = device_counts(&n);
    assert_eq!((c.total, c.held, c.unhealthy), (8, 6, 0));
    assert_eq!(heat(&n, c), 3);
}

#[test]
fn names_and_reasons_are_escaped() {
    let g = GangGroupStatus {
        id: 7,
        name: "<script>alert(1)</script>".into(),
        state: "Queued".into(),
        attempts: 2,
        reason:
            "member template ns/w/worker: no node has 3 <gpu> free; member template ns/w/ps: fits"
                .into(),
        gangs: vec!["ns/w".into()],
        ..Default::default()
    };
    let html = gangs(&[g], &GangFilter::default(), 0).into_string();
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(html.contains("&lt;script&gt;"), "{html}");
    assert!(
        html.contains("<li>member template ns/w/worker: no node has 3 &lt;gpu&gt; free</li>"),
        "{html}"
    );
}

#[test]
fn the_filter_keeps_groups_of_the_namespace_and_queue() {
    let mk = |id, gang: &str, queue: &str| GangGroupStatus {
        id,
        state: "Queued".into(),
        gangs: vec![gang.into()],
        queue: queue.into(),
        ..Default::default()
    };
    let groups = [mk(1, "a/x", "q1"), mk(2, "b/y", "q1"), mk(3, "a/z", "q2")];
    let f = GangFilter {
        namespace: "a".into(),
        queue: "q1".into(),
    };
    let kept: Vec<u64> = groups.iter().filter(|g| f.keeps(g)).map(|g| g.id).collect();
    assert_eq!(kept, vec![1]);
    let html = gangs(&groups, &f, 0).into_string();
    assert!(html.contains("data-group=\"1\""));
    assert!(!html.contains("data-group=\"2\""));
}

#[test]
fn fair_shares_split_a_pool_by_weight_and_respect_a_max() {
    let q = |name: &str, parent: &str, weight, max: Option<&str>| ApiQueueStatus {
        spec: Some(QueueSpec {
            name: name.into(),
            parent: parent.into(),
            weight,
            max: max
                .map(|m| [("cpu".to_string(), m.to_string())].into())
                .unwrap_or_default(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let queues = [
        q("a", "", 3, None),
        q("b", "", 1, Some("10")),
        q("a1", "a", 1, None),
        q("a2", "a", 1, None),
    ];
    let capacity: BTreeMap<String, String> = [("cpu".to_string(), "100".to_string())].into();
    let fair = fair_shares(&queues, &capacity);
    assert_eq!(fair["a"]["cpu"], 75.0);
    assert_eq!(fair["b"]["cpu"], 10.0);
    assert_eq!(fair["a1"]["cpu"], 37.5);
    assert_eq!(fair["a2"]["cpu"], 37.5);
}

#[test]
fn amounts_are_shown_in_units_people_read() {
    assert_eq!(show("memory", 412_316_860_416.0), "384Gi");
    assert_eq!(show("memory", 1_649_267_441_664.0), "1.5Ti");
    assert_eq!(show("cpu", 96.0), "96");
    assert_eq!(show("cpu", 0.5), "0.5");
    assert_eq!(show("cpu", 0.25), "0.25");
    assert_eq!(show("nvidia.com/gpu", 1200.0), "1200");
}

#[test]
fn the_lag_of_a_member_is_read_from_the_leaders_matched_index() {
    let g = GroupStatus {
        last_log_index: 10,
        voters: vec![1, 2, 3],
        matched: [(1, 11), (2, 7), (3, 0)].into(),
        ..Default::default()
    };
    assert_eq!(lag_text(&g, 1), "0");
    assert_eq!(lag_text(&g, 2), "4 entries");
    assert_eq!(lag_text(&g, 3), "nothing yet");
    assert_eq!(lag_text(&g, 4), "not a member");
}

#[test]
fn the_fleet_grid_groups_nodes_by_block_then_rack_when_the_hierarchy_is_known() {
    let racked = |name: &str, block: &str, rack: &str| {
        let mut n = node(name, 0, false);
        if let Some(s) = n.node.as_mut() {
            s.labels.insert("example.com/block".into(), block.into());
            s.labels.insert("example.com/rack".into(), rack.into());
        }
        n
    };
    let view = FleetView {
        nodes: vec![
            racked("a", "b1", "r2"),
            racked("b", "b0", "r1"),
            racked("c", "b0", "r0"),
            racked("d", "b0", "r0"),
        ],
        unreadable: Vec::new(),
        topology_label: Some("example.com/rack".into()),
        topology_levels: vec!["example.com/block".into(), "example.com/rack".into()],
        shards: 1,
    };
    let html = fleet(&view, &BTreeMap::new()).into_string();
    let at = |text: &str| {
        html.find(text)
            .unwrap_or_else(|| panic!("{text} missing: {html}"))
    };
    assert!(
        at("b0 › r0") < at("b0 › r1") && at("b0 › r1") < at("b1 › r2"),
        "{html}"
    );
    let flat = FleetView {
        topology_levels: Vec::new(),
        ..view
    };
    let html = fleet(&flat, &BTreeMap::new()).into_string();
    assert!(html.contains(">r0<") && !html.contains("›"), "{html}");
}

#[test]
fn the_queue_panel_shows_decayed_usage_only_with_fair_sharing_over_time() {
    let status = ApiQueueStatus {
        spec: Some(QueueSpec {
            name: "team-a".into(),
            weight: 1,
            max: [("cpu".to_string(), "8".to_string())].into(),
            ..Default::default()
        }),
        usage: [("cpu".to_string(), "2".to_string())].into(),
        decayed_usage: [("cpu".to_string(), "5500m".to_string())].into(),
        ..Default::default()
    };
    let mut view = QueuesView {
        queues: vec![status],
        capacity: BTreeMap::new(),
        fair_share_half_life_ms: 0,
        reservations: Vec::new(),
        read_at_ms: 1_000,
    };
    let off = queues(&view).into_string();
    assert!(!off.contains("decayed"), "{off}");
    assert!(!off.contains("reservations"), "{off}");
    view.reservations = vec![gangway_core::ledger::meta::HeadReservation {
        seq: 42,
        priority: 3,
        nodes: [(2, vec!["n1".to_string(), "n2".to_string()])].into(),
        starts_by_ms: Some(31_000),
        preempts_below: None,
        made_at_ms: 1_000,
        expires_at_ms: 61_000,
    }];
    let held = queues(&view).into_string();
    assert!(held.contains("gang group 42"), "{held}");
    assert!(held.contains("2 on shard 2"), "{held}");
    assert!(held.contains("in 30 s"), "{held}");
    assert!(held.contains("60 s"), "{held}");
    view.reservations.clear();
    view.fair_share_half_life_ms = 604_800_000;
    let on = queues(&view).into_string();
    assert!(on.contains("half-life 604800 s"), "{on}");
    assert!(on.contains("· decayed 5.5"), "{on}");
}
