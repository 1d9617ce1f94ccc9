//! What the web view shows, read from the cluster: every panel's data comes from the
//! replica's linearizable reads of the meta and shard groups (forwarded to their
//! leaders, so any replica shows the same truth), and the cluster panel from each
//! member's own status (this process's replicas directly, the others through their
//! Admin service, each within [`UI_PEER_STATUS_TIMEOUT_MS`]). Called by the `ui`
//! handlers; the views are plain data that `render` turns into HTML.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gangway_proto::admin::{QueueStatus as ApiQueueStatus, StatusReply};
use gangway_proto::v1::{GangGroupStatus, NodeInfo};
use gangway_raft::RaftHost;

use crate::convert::{group_status, node_info, quantities, queue_status};
use crate::replicated::growth::ShardCount;
use crate::replicated::{GroupError, Groups};
use gangway_core::ledger::meta::{MetaQuery, MetaReply, TxnRecord, Undelivered};
use gangway_core::query::{ShardAnswer, ShardQuery};

/// Time a member's status may take before the cluster panel calls it unreachable, in ms.
pub const UI_PEER_STATUS_TIMEOUT_MS: u64 = 500;
/// The well-known zone label: the fleet grid's domains when no topology label is set.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Recent decisions the transactions panel lists.
pub const UI_RECENT_TXNS_MAX: u32 = 50;
/// Undelivered decisions the transactions panel lists.
pub const UI_UNDELIVERED_MAX: u32 = 200;

/// A read the web view could not make.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A group could not answer (no leader, unreachable, stopped).
    #[error("{what}: {source}")]
    Group {
        /// What was being read.
        what: String,
        /// Why it failed.
        source: GroupError,
    },
    /// A group answered something else than asked.
    #[error("{what}: unexpected answer {answer}")]
    Unexpected {
        /// What was being read.
        what: String,
        /// The answer, for the log.
        answer: String,
    },
}

/// The fleet grid's levels for `hierarchies`: the first one's, without the host level.
pub fn grid_levels(hierarchies: &[gangway_core::model::TopologyHierarchy]) -> Vec<String> {
    hierarchies
        .first()
        .map(|h| {
            h.levels
                .iter()
                .filter(|l| l.as_str() != gangway_core::model::node::LABEL_HOSTNAME)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Where the web view reads from.
#[derive(Clone)]
pub struct Source {
    /// This replica's groups (reads are linearizable, forwarded to the leaders).
    pub groups: Groups,
    /// Replicas hosted in this process (their status is read without a call).
    pub hosts: Vec<RaftHost>,
    /// Number of shard groups.
    pub shards: ShardCount,
    /// The node label that names a node's topology domain (the fleet grid's rows):
    /// the shard topology label, else [`ZONE_LABEL`].
    pub topology_label: Option<String>,
    /// The first topology hierarchy's levels above the host, widest first: when given,
    /// the grid's rows are their domains (block › rack) instead.
    pub topology_levels: Vec<String>,
}

/// One member of the cluster as its own status tells.
#[derive(Debug, Clone)]
pub struct MemberView {
    /// Replica id.
    pub id: u64,
    /// Its gRPC address.
    pub addr: String,
    /// Its status, or why it could not be read.
    pub status: Result<StatusReply, String>,
}

/// The cluster panel's data.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// The replica serving the page.
    pub this: u64,
    /// Every member, in id order.
    pub members: Vec<MemberView>,
    /// Number of shard groups.
    pub shards: u32,
}

/// The fleet panel's data.
#[derive(Debug, Clone)]
pub struct FleetView {
    /// Every node, by shard then name.
    pub nodes: Vec<NodeInfo>,
    /// Shards that could not be read, with why.
    pub unreadable: Vec<(u32, String)>,
    /// The label naming a node's topology domain.
    pub topology_label: Option<String>,
    /// The hierarchy levels naming a node's row instead, widest first (may be empty).
    pub topology_levels: Vec<String>,
    /// Number of shard groups.
    pub shards: u32,
}

/// The queues panel's data.
#[derive(Debug, Clone)]
pub struct QueuesView {
    /// Every queue, in name order.
    pub queues: Vec<ApiQueueStatus>,
    /// The cluster's recorded capacity (empty until recorded).
    pub capacity: BTreeMap<String, String>,
    /// The half-life of fair sharing over time as last sampled, in ms; 0: off.
    pub fair_share_half_life_ms: u64,
    /// The reservations for the head of the line holding when read.
    pub reservations: Vec<gangway_core::ledger::meta::HeadReservation>,
    /// When it was read (ms since the epoch).
    pub read_at_ms: u64,
}

/// The transactions panel's data.
#[derive(Debug, Clone)]
pub struct TxnsView {
    /// Open reservations per shard: (shard, transaction, deadline ms since the epoch).
    pub open: Vec<(u32, String, u64)>,
    /// Shards that could not be read, with why.
    pub unreadable: Vec<(u32, String)>,
    /// The newest transactions of the decision log, newest first.
    pub recent: Vec<TxnRecord>,
    /// Decisions some participant has not applied yet (recovery in progress).
    pub undelivered: Vec<Undelivered>,
    /// Groups by seq, for naming what a transaction places.
    pub group_names: HashMap<u64, String>,
}

impl Source {
    /// `q` asked of every shard at once, with each shard's answer.
    async fn each_shard(&self, q: &ShardQuery) -> Vec<(u32, Result<ShardAnswer, GroupError>)> {
        let reads = self
            .shards
            .ids()
            .map(|shard| async move { (shard, self.groups.shard_query(shard, q).await) });
        futures::future::join_all(reads).await
    }

    async fn meta(&self, what: &str, q: &MetaQuery) -> Result<MetaReply, ReadError> {
        self.groups
            .meta_query(q)
            .await
            .map_err(|source| ReadError::Group {
                what: what.to_string(),
                source,
            })
    }

    /// Every gang group the log holds, in queue order.
    pub async fn gangs(&self) -> Result<Vec<GangGroupStatus>, ReadError> {
        let what = "gang groups";
        match self
            .meta(what, &MetaQuery::Summaries { active_only: false })
            .await?
        {
            MetaReply::Summaries { groups } => Ok(groups.iter().map(group_status).collect()),
            other => Err(unexpected(what, &other)),
        }
    }

    /// Every node of every shard; a shard that cannot be read is named, not fatal.
    pub async fn fleet(&self) -> FleetView {
        let mut view = FleetView {
            nodes: Vec::new(),
            unreadable: Vec::new(),
            topology_label: self.topology_label.clone(),
            topology_levels: self.topology_levels.clone(),
            shards: self.shards.get(),
        };
        for (shard, answer) in self.each_shard(&ShardQuery::ListNodes).await {
            match answer {
                Ok(ShardAnswer::Nodes { nodes }) => {
                    view.nodes.extend(nodes.iter().map(|e| node_info(e, shard)))
                }
                Ok(other) => view
                    .unreadable
                    .push((shard, format!("unexpected answer {other:?}"))),
                Err(e) => view.unreadable.push((shard, e.to_string())),
            }
        }
        view
    }

    /// One node, or `None` when it is not registered.
    pub async fn node(&self, name: &str) -> Result<Option<NodeInfo>, ReadError> {
        let what = format!("node {name}");
        let shard = match self
            .meta(
                &what,
                &MetaQuery::ShardOf {
                    node: name.to_string(),
                },
            )
            .await?
        {
            MetaReply::Shard { shard } => shard,
            _ => return Ok(None),
        };
        let q = ShardQuery::GetNode {
            name: name.to_string(),
        };
        match self.groups.shard_query(shard, &q).await {
            Ok(ShardAnswer::Nodes { nodes }) => Ok(nodes.first().map(|e| node_info(e, shard))),
            Ok(other) => Err(unexpected(&what, &other)),
            Err(source) => Err(ReadError::Group { what, source }),
        }
    }

    /// Every queue with its usage, and the recorded capacity.
    pub async fn queues(&self) -> Result<QueuesView, ReadError> {
        let what = "queues";
        let queues = match self.meta(what, &MetaQuery::Queues).await? {
            MetaReply::Queues { queues } => queues.iter().map(queue_status).collect(),
            other => return Err(unexpected(what, &other)),
        };
        let capacity = match self.meta(what, &MetaQuery::Capacity).await? {
            MetaReply::Capacity { capacity: Some(c) } => quantities(&c).into_iter().collect(),
            _ => BTreeMap::new(),
        };
        let fair_share_half_life_ms = match self.meta(what, &MetaQuery::UsageHistory).await? {
            MetaReply::UsageHistory { half_life_ms, .. } => half_life_ms,
            _ => 0,
        };
        let read_at_ms = crate::replicated::now_ms();
        let held = MetaQuery::HeadReservations { at_ms: read_at_ms };
        let reservations = match self.meta(what, &held).await? {
            MetaReply::HeadReservations { reservations } => reservations,
            _ => Vec::new(),
        };
        Ok(QueuesView {
            queues,
            capacity,
            fair_share_half_life_ms,
            reservations,
            read_at_ms,
        })
    }

    /// Open reservations on every shard, recent decisions and undelivered ones.
    pub async fn txns(&self) -> Result<TxnsView, ReadError> {
        let what = "transactions";
        let recent = match self
            .meta(
                what,
                &MetaQuery::RecentTxns {
                    limit: UI_RECENT_TXNS_MAX,
                },
            )
            .await?
        {
            MetaReply::Txns { txns } => txns,
            other => return Err(unexpected(what, &other)),
        };
        let undelivered = match self
            .meta(
                what,
                &MetaQuery::Undelivered {
                    limit: UI_UNDELIVERED_MAX,
                },
            )
            .await?
        {
            MetaReply::Undelivered { txns } => txns,
            other => return Err(unexpected(what, &other)),
        };
        let seqs: Vec<u64> = recent.iter().filter_map(|t| t.group).collect();
        let group_names = match self.meta(what, &MetaQuery::SummariesOf { seqs }).await? {
            MetaReply::Summaries { groups } => {
                groups.into_iter().map(|g| (g.seq, g.name)).collect()
            }
            _ => HashMap::new(),
        };
        let mut open = Vec::new();
        let mut unreadable = Vec::new();
        for (shard, answer) in self.each_shard(&ShardQuery::OpenTxns).await {
            match answer {
                Ok(ShardAnswer::OpenTxns { txns }) => open.extend(
                    txns.into_iter()
                        .map(|(txn, deadline)| (shard, txn.to_string(), deadline)),
                ),
                Ok(other) => unreadable.push((shard, format!("unexpected answer {other:?}"))),
                Err(e) => unreadable.push((shard, e.to_string())),
            }
        }
        Ok(TxnsView {
            open,
            unreadable,
            recent,
            undelivered,
            group_names,
        })
    }

    /// Every member's status, as each tells it.
    pub async fn cluster(&self) -> ClusterView {
        let this = self.groups.host();
        let members = this.members();
        let reads = members.iter().map(|(id, addr)| async move {
            let status = match self.hosts.iter().find(|h| h.node_id() == *id) {
                Some(host) => Ok(host.status_reply(false)),
                None => self.peer_status(*id, addr).await,
            };
            MemberView {
                id: *id,
                addr: addr.clone(),
                status,
            }
        });
        ClusterView {
            this: this.node_id(),
            members: futures::future::join_all(reads).await,
            shards: self.shards.get(),
        }
    }

    async fn peer_status(&self, id: u64, addr: &str) -> Result<StatusReply, String> {
        // Asked as a peer: the replica's own certificate and a proof for that member.
        self.groups
            .host()
            .member_status(id, addr, Duration::from_millis(UI_PEER_STATUS_TIMEOUT_MS))
            .await
    }
}

fn unexpected(what: &str, answer: &impl std::fmt::Debug) -> ReadError {
    let answer: String = format!("{answer:?}").chars().take(200).collect();
    ReadError::Unexpected {
        what: what.to_string(),
        answer,
    }
}
