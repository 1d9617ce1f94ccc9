//! Read-only questions to a shard ledger and their answers: the front door's
//! node listings, the coordinator's placement plans (the engine run against
//! this shard's ledger on its leader), and the open reservations and
//! transaction outcomes that resolvers and a recovering coordinator need, and the
//! committed Kubernetes pods a binder has yet to bind.

use serde::{Deserialize, Serialize};

use crate::engine::{GangPlacement, MemberRef, Placer, Profile};
use crate::ledger::shard::{NodeEntry, ShardLedger};
use crate::ledger::usage::SlotState;
use crate::ledger::{TxnId, TxnOutcome};
use crate::model::{MemberKey, PodSpec, PodSummary};

/// A read-only question to a shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardQuery {
    /// One node with its usage.
    GetNode {
        /// Node name.
        name: String,
    },
    /// Every node of the shard, in name order.
    ListNodes,
    /// Where this shard would place these members now (nothing is held).
    Plan {
        /// Members and their specs.
        members: Vec<(MemberKey, PodSpec)>,
        /// Scoring profile.
        profile: Box<Profile>,
    },
    /// Reservations not yet committed or aborted, with their deadlines.
    OpenTxns,
    /// What became of a transaction here, with the nodes of its members.
    Txn {
        /// The transaction.
        txn: TxnId,
    },
    /// Committed members of Kubernetes pods (those with a uid) not yet bound, in node order.
    Unbound {
        /// At most this many.
        limit: u32,
    },
}

/// A committed member waiting for its binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnboundMember {
    /// The member.
    pub member: MemberKey,
    /// Its node.
    pub node: String,
    /// What the ledger keeps of it (devices, uid).
    pub pod: PodSummary,
}

/// A shard's answer to a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardAnswer {
    /// The nodes asked for (empty: no such node).
    Nodes {
        /// Node and usage, in name order.
        nodes: Vec<NodeEntry>,
    },
    /// A placement plan.
    Plan {
        /// The engine's placement.
        placement: GangPlacement,
    },
    /// Open reservations: (transaction, deadline in ms).
    OpenTxns {
        /// In transaction order.
        txns: Vec<(TxnId, u64)>,
    },
    /// A transaction's fate here.
    Txn {
        /// Open (None) or finished outcome; `known` says whether the shard saw it at all.
        outcome: Option<TxnOutcome>,
        /// Whether the shard knows the transaction.
        known: bool,
        /// Its members and their nodes, while it holds them.
        members: Vec<(MemberKey, String)>,
    },
    /// Members waiting for their binding.
    Unbound {
        /// In node order, then member order.
        members: Vec<UnboundMember>,
    },
    /// The query could not be decoded.
    Malformed {
        /// Why.
        reason: String,
    },
}

/// Answers `q` from `ledger`; plans go through `placer`, which keeps kube-scheduler's
/// round-robin start and the engine's caches between plans (they change speed and the
/// node a search starts at, never whether a plan is valid: Reserve re-checks it).
pub fn answer(ledger: &ShardLedger, q: &ShardQuery, placer: &mut Placer) -> ShardAnswer {
    match q {
        ShardQuery::GetNode { name } => ShardAnswer::Nodes {
            nodes: ledger.node(name).cloned().into_iter().collect(),
        },
        ShardQuery::ListNodes => ShardAnswer::Nodes {
            nodes: ledger.nodes().cloned().collect(),
        },
        ShardQuery::Plan { members, profile } => {
            let refs: Vec<MemberRef<'_>> = members
                .iter()
                .map(|(key, spec)| MemberRef { key, spec })
                .collect();
            ShardAnswer::Plan {
                placement: placer.place_members(ledger, &refs, profile, &[]),
            }
        }
        ShardQuery::OpenTxns => ShardAnswer::OpenTxns {
            txns: ledger
                .open_txns()
                .iter()
                .map(|(id, t)| (*id, t.deadline_ms))
                .collect(),
        },
        ShardQuery::Unbound { limit } => ShardAnswer::Unbound {
            members: ledger
                .nodes()
                .flat_map(|e| {
                    e.usage.pods.iter().filter_map(move |(member, slot)| {
                        let waiting = matches!(slot.state, SlotState::Committed { .. })
                            && slot.pod.uid.is_some();
                        waiting.then(|| UnboundMember {
                            member: member.clone(),
                            node: e.node.name.clone(),
                            pod: slot.pod.clone(),
                        })
                    })
                })
                .take(*limit as usize)
                .collect(),
        },
        ShardQuery::Txn { txn } => {
            let open = ledger.open_txns().get(txn);
            let outcome = ledger.outcome(*txn);
            let members: Vec<(MemberKey, String)> = match open {
                Some(t) => t
                    .members
                    .iter()
                    .map(|(m, n)| (m.clone(), n.clone()))
                    .collect(),
                None => ledger
                    .nodes()
                    .flat_map(|e| {
                        e.usage
                            .pods
                            .iter()
                            .filter(|(_, slot)| slot.state.txn_id() == Some(*txn))
                            .map(move |(m, _)| (m.clone(), e.node.name.clone()))
                    })
                    .collect(),
            };
            ShardAnswer::Txn {
                outcome,
                known: open.is_some() || outcome.is_some(),
                members,
            }
        }
    }
}
