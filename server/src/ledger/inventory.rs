//! A shard's node inventory: the nodes of its partition as their agents
//! registered them. The scheduling ledger of each shard builds on this record.
//!
//! Invariant: a node appears at most once; re-registering replaces its spec
//! and keeps its first registration time. Called through `replicated::shard`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaintRecord {
    /// Taint key.
    pub key: String,
    /// Taint value.
    pub value: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// What an agent registers for a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecordSpec {
    /// Node name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<TaintRecord>,
    /// Allocatable quantities by resource name, as given.
    pub allocatable: BTreeMap<String, String>,
    /// Cordoned.
    pub unschedulable: bool,
}

/// A node as the shard records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The registered spec.
    pub spec: NodeRecordSpec,
    /// When it first registered (leader's clock).
    pub registered_at_ms: u64,
    /// When it last registered.
    pub updated_at_ms: u64,
}

/// A command of a shard group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardCommand {
    /// Inserts or replaces a node.
    RegisterNode {
        /// The node.
        spec: NodeRecordSpec,
        /// Leader's timestamp.
        at_ms: u64,
    },
    /// Removes a node.
    RemoveNode {
        /// Node name.
        name: String,
        /// Leader's timestamp.
        at_ms: u64,
    },
}

/// A read-only question to a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardQuery {
    /// One node.
    GetNode {
        /// Node name.
        name: String,
    },
    /// Every node of the shard.
    ListNodes,
}

/// A shard's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardReply {
    /// One node.
    Node {
        /// The record.
        node: NodeRecord,
    },
    /// Several nodes, in name order.
    Nodes {
        /// The records.
        nodes: Vec<NodeRecord>,
    },
    /// No such node.
    NotFound,
    /// Done, nothing to return.
    Done,
    /// The command was refused; the state is unchanged.
    Rejected {
        /// Why, naming the field.
        reason: String,
    },
}

/// The nodes of one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    nodes: BTreeMap<String, NodeRecord>,
}

impl NodeInventory {
    /// Applies one command.
    pub fn apply(&mut self, cmd: &ShardCommand) -> ShardReply {
        match cmd {
            ShardCommand::RegisterNode { spec, at_ms } => {
                if spec.name.is_empty() {
                    return ShardReply::Rejected {
                        reason: "node.name: must not be empty".into(),
                    };
                }
                let registered_at_ms = self
                    .nodes
                    .get(&spec.name)
                    .map(|n| n.registered_at_ms)
                    .unwrap_or(*at_ms);
                let record = NodeRecord {
                    spec: spec.clone(),
                    registered_at_ms,
                    updated_at_ms: *at_ms,
                };
                self.nodes.insert(spec.name.clone(), record.clone());
                ShardReply::Node { node: record }
            }
            ShardCommand::RemoveNode { name, .. } => match self.nodes.remove(name) {
                Some(_) => ShardReply::Done,
                None => ShardReply::NotFound,
            },
        }
    }

    /// Answers a query.
    pub fn query(&self, q: &ShardQuery) -> ShardReply {
        match q {
            ShardQuery::GetNode { name } => match self.nodes.get(name) {
                Some(n) => ShardReply::Node { node: n.clone() },
                None => ShardReply::NotFound,
            },
            ShardQuery::ListNodes => ShardReply::Nodes {
                nodes: self.nodes.values().cloned().collect(),
            },
        }
    }
}
