//! Leader balancing plan: which group leaderships to move so that no live
//! replica leads more than ceil(groups / live replicas). The meta group moves
//! only when no shard group can: its leader runs the coordinator and the
//! Kubernetes ingest, whose state a new leader must rebuild. Pure; the host
//! carries the plan out.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{GroupId, NodeId, META_GROUP};

/// One planned leadership move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The group whose leadership moves.
    pub group: GroupId,
    /// Its current leader.
    pub from: NodeId,
    /// The voter that should lead it.
    pub to: NodeId,
}

/// The most groups one of `live` replicas should lead.
pub fn leaders_max(groups: usize, live: usize) -> usize {
    if live == 0 {
        return groups;
    }
    groups.div_ceil(live)
}

/// Plans moves so that every live node leads at most `leaders_max` groups.
///
/// `leaders` maps each group to its current leader (if any), `voters` each
/// group to its voter set. A group moves only to a live voter.
pub fn plan(
    leaders: &BTreeMap<GroupId, Option<NodeId>>,
    voters: &BTreeMap<GroupId, BTreeSet<NodeId>>,
    live: &BTreeSet<NodeId>,
) -> Vec<Move> {
    let max = leaders_max(leaders.len(), live.len());
    let mut count: BTreeMap<NodeId, usize> = live.iter().map(|n| (*n, 0)).collect();
    let mut led: BTreeMap<GroupId, NodeId> = BTreeMap::new();
    for (g, l) in leaders {
        if let Some(l) = l {
            *count.entry(*l).or_default() += 1;
            led.insert(*g, *l);
        }
    }
    let mut moves = Vec::new();
    while let Some((&busiest, &n)) = count
        .iter()
        .max_by_key(|(id, c)| (**c, std::cmp::Reverse(**id)))
    {
        if n <= max {
            break;
        }
        // Shard groups first: the meta group is the costliest to move.
        let candidate = led
            .iter()
            .filter(|(_, l)| **l == busiest)
            .filter(|(g, _)| **g != META_GROUP)
            .chain(
                led.iter()
                    .filter(|(g, l)| **g == META_GROUP && **l == busiest),
            )
            .find_map(|(g, _)| {
                let target = voters
                    .get(g)?
                    .iter()
                    .filter(|v| live.contains(v) && **v != busiest)
                    .min_by_key(|v| (count.get(v).copied().unwrap_or(0), **v))?;
                (count.get(target).copied().unwrap_or(0) + 1 < n).then_some((*g, *target))
            });
        let Some((group, to)) = candidate else { break };
        led.insert(group, to);
        *count.entry(busiest).or_default() -= 1;
        *count.entry(to).or_default() += 1;
        moves.push(Move {
            group,
            from: busiest,
            to,
        });
    }
    moves
}

#[cfg(test)]
mod tests {
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
}
