//! Unit tests of `balance.rs`.

use super::*;

fn full(groups: u64, nodes: &[NodeId]) -> BTreeMap<GroupId, BTreeSet<NodeId>> {
    (0..groups)
        .map(|g| (g, nodes.iter().copied().collect()))
        .collect()
}

#[test]
fn all_on_one_node_spreads_to_at_most_ceil() {
    let leaders = (0..7).map(|g| (g, Some(1))).collect();
    let live = [1, 2, 3].into_iter().collect();
    let moves = plan(&leaders, &full(7, &[1, 2, 3]), &live);
    let mut count = BTreeMap::from([(1, 7usize), (2, 0), (3, 0)]);
    for m in &moves {
        *count.get_mut(&m.from).unwrap() -= 1;
        *count.get_mut(&m.to).unwrap() += 1;
    }
    assert!(count.values().all(|c| *c <= 3), "{count:?}");
    assert_eq!(moves.len(), 4);
}

#[test]
fn the_meta_group_stays_where_a_shard_group_can_move_instead() {
    let leaders = BTreeMap::from([
        (META_GROUP, Some(1)),
        (1, Some(1)),
        (2, Some(1)),
        (3, Some(2)),
        (4, Some(3)),
    ]);
    let live = [1, 2, 3].into_iter().collect();
    let moves = plan(&leaders, &full(5, &[1, 2, 3]), &live);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_ne!(moves[0].group, META_GROUP, "{moves:?}");
}

#[test]
fn balanced_cluster_needs_no_move() {
    let leaders = BTreeMap::from([(0, Some(1)), (1, Some(2)), (2, Some(3)), (3, Some(1))]);
    let live = [1, 2, 3].into_iter().collect();
    assert!(plan(&leaders, &full(4, &[1, 2, 3]), &live).is_empty());
}

#[test]
fn never_moves_to_a_dead_node_or_non_voter() {
    let leaders = (0..6).map(|g| (g, Some(1))).collect();
    let live = [1, 2].into_iter().collect();
    let mut voters = full(6, &[1, 2, 3]);
    voters.insert(5, [1, 3].into_iter().collect());
    let moves = plan(&leaders, &voters, &live);
    assert!(moves.iter().all(|m| m.to == 2 && m.group != 5), "{moves:?}");
    assert_eq!(moves.len(), 3);
}
