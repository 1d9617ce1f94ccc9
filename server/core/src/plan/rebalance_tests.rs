//! Unit tests of `rebalance.rs`.

use super::*;

fn zones(sizes: &[(&str, usize, u32)], weight: u64) -> Vec<WeightedNode> {
    let mut nodes = Vec::new();
    for (zone, count, shard) in sizes {
        for i in 0..*count {
            nodes.push(WeightedNode {
                name: format!("{zone}-{i:03}"),
                shard: *shard,
                domain: Some(zone.to_string()),
                weight,
            });
        }
    }
    nodes
}

fn applied(nodes: &[WeightedNode], moves: &[PlannedMove]) -> Vec<WeightedNode> {
    let mut out = nodes.to_vec();
    for m in moves {
        for n in out.iter_mut().filter(|n| m.nodes.contains(&n.name)) {
            assert_eq!(n.shard, m.from, "{} moved from the wrong shard", n.name);
            n.shard = m.to;
        }
    }
    out
}

#[test]
fn four_unequal_zones_spread_over_eight_shards_within_the_bound() {
    let nodes = zones(
        &[("a", 40, 1), ("b", 24, 2), ("c", 10, 3), ("d", 6, 4)],
        8_000,
    );
    assert!(peak_percent(&loads(&nodes, 8)) > 125);
    let moves = plan(&nodes, 8, 125);
    let after = loads(&applied(&nodes, &moves), 8);
    assert!(peak_percent(&after) <= 125, "{after:?} after {moves:?}");
    // Zones that fit a shard are not split: c and d moved nowhere.
    assert!(moves.iter().all(|m| m
        .nodes
        .iter()
        .all(|n| n.starts_with('a') || n.starts_with('b'))));
}

#[test]
fn a_balanced_map_plans_nothing_and_one_shard_never_moves() {
    let nodes = zones(&[("a", 10, 1), ("b", 10, 2)], 1_000);
    assert!(plan(&nodes, 2, 125).is_empty());
    assert!(plan(&zones(&[("a", 10, 1)], 1_000), 1, 125).is_empty());
    assert!(plan(&[], 4, 125).is_empty());
}

#[test]
fn whole_small_domains_move_before_a_large_one_is_split() {
    // Shard 1 holds a big zone and two small ones; shard 2 is empty.
    let nodes = zones(&[("big", 8, 1), ("s1", 2, 1), ("s2", 2, 1)], 100);
    let moves = plan(&nodes, 2, 125);
    let after = loads(&applied(&nodes, &moves), 2);
    assert!(peak_percent(&after) <= 125, "{after:?}");
    assert!(
        moves[0].nodes.iter().all(|n| n.starts_with('s')),
        "{moves:?}"
    );
}

#[test]
fn random_maps_end_within_the_bound_or_a_node_of_it() {
    let mut seed: u64 = 0x5eed_cafe;
    let mut next = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    for case in 0..200 {
        let shards = 2 + next(10) as u32;
        let mut nodes = Vec::new();
        for i in 0..(1 + next(300)) {
            nodes.push(WeightedNode {
                name: format!("n{i:04}"),
                shard: 1 + next(u64::from(shards)) as u32 % 2,
                domain: Some(format!("z{}", next(6))),
                weight: 1 + next(4) * 1_000,
            });
        }
        let moves = plan(&nodes, shards, 125);
        let after = loads(&applied(&nodes, &moves), shards);
        let total: u64 = after.iter().sum();
        let mean = total / u64::from(shards);
        let heaviest_node = nodes.iter().map(|n| n.weight).max().unwrap_or(0);
        let max = after.iter().copied().max().unwrap_or(0);
        assert!(
            peak_percent(&after) <= 125 || max <= mean + heaviest_node,
            "case {case} of the fixed seed 0x5eedcafe: loads {after:?}"
        );
        assert!(moves
            .iter()
            .all(|m| m.nodes.len() <= MOVE_NODES_MAX && m.from != m.to));
    }
}
