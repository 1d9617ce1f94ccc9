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
#[path = "balance_tests.rs"]
mod tests;
