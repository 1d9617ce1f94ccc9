//! Unit tests of `workload.rs`.

use super::*;

#[test]
fn the_fleet_fills_every_shard_with_one_device_node_first() {
    let f = fleet(2);
    assert_eq!(f.len(), 2 * NODES_PER_SHARD);
    let devices: Vec<&str> = f
        .iter()
        .filter(|(_, d)| *d)
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(devices, ["node-000", "node-001"]);
}

#[test]
fn a_wide_group_needs_more_nodes_than_one_shard_has() {
    let g = &gangs_of(Shape::Wide, 1)[0];
    assert!(g.cpu * 2 > NODE_CPUS, "one member per node");
    assert!(g.members as usize > NODES_PER_SHARD);
}

#[test]
fn requests_carry_key_gangs_and_devices() {
    let gangs = gangs_of(Shape::Devices, 7);
    let r = request_of("k", &gangs);
    assert_eq!(r.idempotency_key, "k");
    assert_eq!(r.gangs[0].namespace, NAMESPACE);
    assert_eq!(r.gangs[0].name, "op7-0");
    assert!(r.gangs[0].members[0].pod_json.contains(GPU_RESOURCE));
}

#[test]
fn a_rack_is_two_nodes_of_one_shard() {
    for shards in [1u32, 2, 3] {
        let racks: Vec<String> = (0..fleet(shards).len())
            .map(|i| rack_of(i, shards))
            .collect();
        for (i, rack) in racks.iter().enumerate() {
            let mates: Vec<usize> = (0..racks.len()).filter(|j| racks[*j] == *rack).collect();
            assert_eq!(mates.len(), 2, "{shards} shards: {racks:?}");
            assert!(
                mates
                    .iter()
                    .all(|j| j % shards as usize == i % shards as usize),
                "{racks:?}"
            );
        }
    }
}
