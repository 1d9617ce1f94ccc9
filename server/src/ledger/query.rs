//! Read-only questions to a shard ledger and their answers, as the front door
//! asks them through a linearizable read of the shard group.

use serde::{Deserialize, Serialize};

use crate::ledger::shard::{NodeEntry, ShardLedger};

/// A read-only question to a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardQuery {
    /// One node with its usage.
    GetNode {
        /// Node name.
        name: String,
    },
    /// Every node of the shard, in name order.
    ListNodes,
}

/// A shard's answer to a query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardAnswer {
    /// The nodes asked for (empty: no such node).
    Nodes {
        /// Node and usage, in name order.
        nodes: Vec<NodeEntry>,
    },
    /// The query could not be decoded.
    Malformed {
        /// Why.
        reason: String,
    },
}

/// Answers `q` from `ledger`.
pub fn answer(ledger: &ShardLedger, q: &ShardQuery) -> ShardAnswer {
    let nodes = match q {
        ShardQuery::GetNode { name } => ledger.node(name).cloned().into_iter().collect(),
        ShardQuery::ListNodes => ledger.nodes().cloned().collect(),
    };
    ShardAnswer::Nodes { nodes }
}
