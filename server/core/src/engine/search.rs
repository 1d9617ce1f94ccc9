//! The node search: how many feasible nodes to find, and in which order to look.
//!
//! Owns kube-scheduler's `percentageOfNodesToScore` rule ([`feasible_nodes_to_find`]:
//! below 100 nodes every node; 0 means adaptive, `50 - nodes/125` percent but at least
//! 5; never fewer than 100 nodes; 100 or more means every node) and the round-robin
//! order ([`Scope`]): a search starts at the node where the previous one stopped and
//! wraps around, so every node gets the same chance of being examined across pods.
//! A search stops once it has found enough feasible nodes; placement extends that to
//! "and enough room for the members it places", so sampling never fails a gang the
//! whole scope could hold. Invariant: pure arithmetic on positions; the cursor is
//! plain data owned by the caller ([`crate::engine::placement::Placer`]), so equal
//! inputs give equal searches. Called by placement.

/// kube-scheduler's minFeasibleNodesToFind: searches never stop before this many.
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// kube-scheduler's minFeasibleNodesPercentageToFind: the adaptive percentage's floor.
pub const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: u32 = 5;
/// Percentage of a score-all search.
pub const ALL_NODES_PERCENTAGE: u32 = 100;

/// How many feasible nodes a search over `nodes` nodes looks for (kube-scheduler's
/// numFeasibleNodesToFind), for a `percentageOfNodesToScore` of `percentage`.
pub fn feasible_nodes_to_find(percentage: u32, nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES_TO_FIND || percentage >= ALL_NODES_PERCENTAGE {
        return nodes;
    }
    let percentage = if percentage == 0 {
        let adaptive = 50i64 - i64::try_from(nodes / 125).unwrap_or(i64::MAX);
        u32::try_from(adaptive.max(i64::from(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)))
            .unwrap_or(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    } else {
        percentage
    };
    let found = u128::from(percentage) * nodes as u128 / u128::from(ALL_NODES_PERCENTAGE);
    usize::try_from(found)
        .unwrap_or(nodes)
        .max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// The nodes a search may visit: every node of the cluster, or a subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'s> {
    /// Nodes `0..n`.
    All(usize),
    /// These node positions, ascending.
    Only(&'s [usize]),
}

impl Scope<'_> {
    /// Number of nodes in scope.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Self::All(n) => *n,
            Self::Only(nodes) => nodes.len(),
        }
    }

    /// Whether no node is in scope.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The node at scope position `pos` (< len).
    #[inline]
    pub fn node(&self, pos: usize) -> usize {
        match self {
            Self::All(_) => pos,
            Self::Only(nodes) => nodes.get(pos).copied().unwrap_or(usize::MAX),
        }
    }

    /// Scope position where a search starting at node `cursor` begins: the first node
    /// in scope at or after it, wrapping around.
    pub fn first_position(&self, cursor: usize) -> usize {
        match self {
            Self::All(0) => 0,
            Self::All(n) => cursor % n,
            Self::Only(nodes) => {
                let at = nodes.partition_point(|&node| node < cursor);
                if at == nodes.len() {
                    0
                } else {
                    at
                }
            }
        }
    }

    /// The node at round-robin step `step` of a search beginning at position `first`.
    #[inline]
    pub fn node_at_step(&self, first: usize, step: usize) -> usize {
        let len = self.len();
        let pos = first + step;
        self.node(if pos >= len { pos - len } else { pos })
    }

    /// The cursor after a search from position `first` visited `processed` nodes: the
    /// node after the last one visited (kube-scheduler's `(start + processed) % n` for
    /// a search over every node).
    pub fn cursor_after(&self, first: usize, processed: usize, cursor: usize) -> usize {
        if processed == 0 || self.is_empty() {
            return cursor;
        }
        match self {
            Self::All(n) => (first + processed) % n,
            Self::Only(_) => self.node_at_step(first, processed - 1) + 1,
        }
    }
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
