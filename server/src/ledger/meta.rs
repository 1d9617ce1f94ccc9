//! The meta group's state: the shard map (node -> shard).
//!
//! Invariant: a node's shard never changes once assigned (until a rebalance
//! command exists), so every replica and every front door agree on where a
//! node lives. Shard ids are 1..=shards.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A command of the meta group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaCommand {
    /// Assigns `node` to `shard` unless it already has a shard.
    AssignNode {
        /// Node name.
        node: String,
        /// Proposed shard.
        shard: u32,
        /// Leader's timestamp.
        at_ms: u64,
    },
}

/// The meta group's answer to a command or query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaReply {
    /// The node's shard (the existing one if it was already assigned).
    Shard {
        /// Shard id.
        shard: u32,
    },
    /// The node has no shard yet.
    NotAssigned,
    /// The whole shard map.
    ShardMap {
        /// node -> shard.
        map: BTreeMap<String, u32>,
    },
    /// The command was refused; the state is unchanged.
    Rejected {
        /// Why, naming the field.
        reason: String,
    },
}

/// A read-only question to the meta group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaQuery {
    /// The shard of one node.
    ShardOf {
        /// Node name.
        node: String,
    },
    /// The whole map.
    ShardMap,
}

/// The meta group's replicated state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    shards: u32,
    shard_map: BTreeMap<String, u32>,
}

impl MetaState {
    /// An empty map over `shards` shards.
    pub fn new(shards: u32) -> Self {
        Self {
            shards,
            shard_map: BTreeMap::new(),
        }
    }

    /// Applies one command.
    pub fn apply(&mut self, cmd: &MetaCommand) -> MetaReply {
        match cmd {
            MetaCommand::AssignNode { node, shard, .. } => {
                if node.is_empty() {
                    return MetaReply::Rejected {
                        reason: "node: must not be empty".into(),
                    };
                }
                if *shard == 0 || *shard > self.shards {
                    return MetaReply::Rejected {
                        reason: format!("shard: {shard} is not in 1..={}", self.shards),
                    };
                }
                let shard = *self.shard_map.entry(node.clone()).or_insert(*shard);
                MetaReply::Shard { shard }
            }
        }
    }

    /// Answers a query.
    pub fn query(&self, q: &MetaQuery) -> MetaReply {
        match q {
            MetaQuery::ShardOf { node } => match self.shard_map.get(node) {
                Some(shard) => MetaReply::Shard { shard: *shard },
                None => MetaReply::NotAssigned,
            },
            MetaQuery::ShardMap => MetaReply::ShardMap {
                map: self.shard_map.clone(),
            },
        }
    }
}

/// The shard a new node belongs to: by the value of `topology_label` when the
/// node has it (nodes of one rack or zone share a shard), by its name
/// otherwise. FNV-1a, so every process computes the same answer.
pub fn shard_for(
    name: &str,
    labels: &BTreeMap<String, String>,
    topology_label: Option<&str>,
    shards: u32,
) -> u32 {
    let key = topology_label
        .and_then(|l| labels.get(l))
        .map(String::as_str)
        .unwrap_or(name);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shards.max(1))) as u32 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_is_sticky_and_bounded() {
        let mut m = MetaState::new(3);
        let a = MetaCommand::AssignNode {
            node: "n1".into(),
            shard: 2,
            at_ms: 1,
        };
        assert_eq!(m.apply(&a), MetaReply::Shard { shard: 2 });
        let b = MetaCommand::AssignNode {
            node: "n1".into(),
            shard: 3,
            at_ms: 2,
        };
        assert_eq!(m.apply(&b), MetaReply::Shard { shard: 2 });
        let bad = MetaCommand::AssignNode {
            node: "n2".into(),
            shard: 4,
            at_ms: 3,
        };
        assert!(
            matches!(m.apply(&bad), MetaReply::Rejected { reason } if reason.starts_with("shard:"))
        );
        assert_eq!(
            m.query(&MetaQuery::ShardOf { node: "n2".into() }),
            MetaReply::NotAssigned
        );
    }

    #[test]
    fn topology_label_keeps_a_rack_together() {
        let rack = |r: &str| BTreeMap::from([("rack".to_string(), r.to_string())]);
        let s1 = shard_for("a", &rack("r1"), Some("rack"), 8);
        let s2 = shard_for("b", &rack("r1"), Some("rack"), 8);
        assert_eq!(s1, s2);
        assert!((1..=8).contains(&shard_for("x", &BTreeMap::new(), Some("rack"), 8)));
    }
}
