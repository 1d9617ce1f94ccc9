//! Read-only questions to a shard ledger and their answers: the front door's
//! node listings, the coordinator's placement plans (the engine run against
//! this shard's ledger on its leader), and the open reservations and
//! transaction outcomes that resolvers and a recovering coordinator need, the
//! committed Kubernetes pods a binder has yet to bind, and the placed pods that must
//! leave their devices (the evictor's work list, computed from state at a given time),
//! and a preemption's offer and plan (the engine on this ledger with victims gone).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::engine::group_preemption::{group_offer_keeping, GroupOffer, WithoutGangs};
use crate::engine::placement::GangTopologies;
use crate::engine::{GangPlacement, MemberRef, Placer, Profile};
use crate::ledger::command::{HoldKind, NetworkHold};
use crate::ledger::devices::{with_followers, DeviceEviction, DeviceHealth, EvictionCause};
use crate::ledger::network::NetworkPools;
use crate::ledger::shard::{NodeEntry, ShardLedger};
use crate::ledger::usage::SlotState;
use crate::ledger::view::{IndexedView, LedgerView, NodeView};
use crate::ledger::{TxnId, TxnOutcome};
use crate::model::claim::DeviceAllocation;
use crate::model::device::DeviceTaint;
use crate::model::{
    DeviceId, Gang, GangGroup, GangId, MemberKey, PodBinding, PodSpec, PodSummary, Resources,
    TopologyConstraint,
};

/// A read-only question to a shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardQuery {
    /// One node with its usage.
    GetNode {
        /// Node name.
        name: String,
    },
    /// The values of node label `keys` on these nodes (those the shard has).
    NodeLabels {
        /// Node names.
        nodes: Vec<String>,
        /// Label keys.
        keys: Vec<String>,
    },
    /// Every node of the shard, in name order.
    ListNodes,
    /// Where this shard would place these members now (nothing is held).
    Plan {
        /// Members and their specs.
        members: Vec<(MemberKey, PodSpec)>,
        /// Scoring profile.
        profile: Box<Profile>,
        /// Shared claims other shards' members carry with network-attached devices in
        /// the same placement: planned as held, so the members here that follow them
        /// use them where their pools reach (the coordinator's second pass, rule 15).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        carried: Vec<NetworkHold>,
        /// The topology constraints of the members' gangs, as (namespace, gang,
        /// constraint); gangs not listed have none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        topologies: Vec<ListedTopology>,
        /// Nodes planned as if absent: reserved for a group ahead of these members
        /// (`plan::backfill`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        kept: Vec<String>,
    },
    /// What this shard could host of a preemptor group of `priority` now and as its
    /// cheapest lower-priority gangs leave, one per step (`engine::group_preemption`).
    PreemptionOffer {
        /// The preemptor group.
        group: Box<GangGroup>,
        /// Its priority: only gangs all of whose pods here are below it are units.
        priority: i32,
        /// Scoring profile.
        profile: Box<Profile>,
        /// Gangs that may not be units (their groups may not go, as meta says).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        keep: Vec<GangId>,
    },
    /// Where this shard would place these members with the pods of `gone` evicted
    /// (nothing is held): a chosen preemption's plan.
    PlanWithout {
        /// Members and their specs.
        members: Vec<(MemberKey, PodSpec)>,
        /// Scoring profile.
        profile: Box<Profile>,
        /// The victims' gangs.
        gone: Vec<GangId>,
        /// The topology constraints of the members' gangs (as in `Plan`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        topologies: Vec<ListedTopology>,
        /// Nodes planned as if absent (as in `Plan`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        kept: Vec<String>,
    },
    /// Reservations not yet committed or aborted, with their deadlines.
    OpenTxns,
    /// What became of a transaction here, with the nodes of its members.
    Txn {
        /// The transaction.
        txn: TxnId,
    },
    /// Committed members of Kubernetes pods (those with a uid) not yet bound, in node
    /// order; members of a preemption whose victims may still run on their node wait.
    Unbound {
        /// At most this many.
        limit: u32,
    },
    /// Bound members that named their Kubernetes pod (gRPC groups' framework pods), with
    /// the uid bound, in node order: what a new ingest leader checks against the pods
    /// (one deleted while no replica led the ingest gives its member back).
    NamedBound {
        /// At most this many.
        limit: u32,
    },
    /// Counts for the metrics: open reservations, the oldest one's time, and per node
    /// and driver the devices published, allocated and unhealthy.
    Stats {
        /// The leader's time, in ms (health as of then).
        at_ms: u64,
    },
    /// Committed or bound Kubernetes pods gangway placed that must leave their node by
    /// `at_ms`: holders of unhealthy devices, of devices with a NoExecute taint they do
    /// not tolerate (past any toleration seconds), or of allocations a republished pool
    /// dropped; one line per pod (its first reason), in node order.
    Evictions {
        /// The leader's time, in ms.
        at_ms: u64,
        /// At most this many.
        limit: u32,
    },
    /// Kubernetes victims of committed preemptions whose pods may still run, in member
    /// order, each with the preemptor's members waiting on its node (the evictor's
    /// preemption work list).
    PreemptionVictims {
        /// At most this many.
        limit: u32,
    },
    /// The taints rules put on devices (`LedgerOp::SetDeviceTaints`), by node and
    /// device: what a new writer of rules starts from.
    RuleTaints,
    /// The pools this shard offers, by node (empty for network-attached ones): what a
    /// new ingest leader compares with the ResourceSlices to withdraw the ones gone.
    OfferedPools,
    /// The sum of every node's allocatable resources (cordoned and not ready ones too):
    /// the shard's part of the cluster capacity queues lend in.
    Capacity,
    /// Every node's weight for rebalancing (its allocatable cpu in millicores), in
    /// name order.
    NodeWeights,
}

/// A node's weight when shards are balanced: its allocatable cpu in millicores (at
/// least 1, so that nodes without cpu still count).
pub fn node_weight(allocatable: &Resources) -> u64 {
    allocatable
        .get(&crate::model::resources::ResourceName::Cpu)
        .max(1)
}

/// A Kubernetes victim of a committed preemption, as the evictor needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptedPod {
    /// The victim.
    pub member: MemberKey,
    /// Its pod's uid.
    pub uid: String,
    /// Its node.
    pub node: String,
    /// The preemption's transaction.
    pub txn: TxnId,
    /// The preemptor's gang (`namespace/name`).
    pub preemptor: String,
    /// When the preemption committed on this shard (leader's clock, ms).
    pub since_ms: u64,
    /// The preemptor's Kubernetes pods waiting on that node (member, uid), to be
    /// nominated there.
    pub waiting: Vec<(MemberKey, String)>,
}

/// What a shard's metrics report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardStats {
    /// Reservations not yet committed or aborted.
    pub open_reservations: u64,
    /// When the oldest of them was applied, in ms.
    pub oldest_reserved_at_ms: Option<u64>,
    /// Per node and driver: (node, driver, published, allocated, unhealthy).
    pub devices: Vec<DeviceCounts>,
}

/// The devices of one driver on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounts {
    /// Node.
    pub node: String,
    /// Driver.
    pub driver: String,
    /// Devices published.
    pub published: u64,
    /// Devices held by at least one allocation.
    pub allocated: u64,
    /// Devices unhealthy.
    pub unhealthy: u64,
}

/// A placed pod that must go, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodEviction {
    /// The member.
    pub member: MemberKey,
    /// Its node.
    pub node: String,
    /// The pod's uid (the delete precondition).
    pub uid: String,
    /// The device it must give up.
    pub device: DeviceId,
    /// Why.
    pub cause: EvictionCause,
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
    /// The shard's capacity ([`ShardQuery::Capacity`]).
    Capacity {
        /// Summed allocatable.
        allocatable: Resources,
    },
    /// Node name → weight ([`ShardQuery::NodeWeights`]).
    NodeWeights {
        /// In name order.
        weights: Vec<(String, u64)>,
    },
    /// Label values per node asked for: (node, the value of each key asked, in order).
    NodeLabels {
        /// Nodes the shard has, in the order asked.
        labels: Vec<(String, Vec<Option<String>>)>,
    },
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
    /// A preemption offer.
    Offer {
        /// What the shard could host as victims leave.
        offer: GroupOffer,
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
        /// The devices each held member was allocated (members holding none left out).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        devices: Vec<(MemberKey, Vec<DeviceAllocation>)>,
    },
    /// Members waiting for their binding.
    Unbound {
        /// In node order, then member order.
        members: Vec<UnboundMember>,
    },
    /// Bound members that named their pod, with its uid ([`ShardQuery::NamedBound`]).
    NamedBound {
        /// (member, uid), in node order, then member order.
        members: Vec<(MemberKey, String)>,
    },
    /// Counts for the metrics.
    Stats {
        /// The counts.
        stats: ShardStats,
    },
    /// Pods to evict.
    Evictions {
        /// In node order, then member order.
        pods: Vec<PodEviction>,
    },
    /// Victims of committed preemptions still to leave.
    PreemptionVictims {
        /// In member order.
        victims: Vec<PreemptedPod>,
    },
    /// Rule taints, by node then device.
    RuleTaints {
        /// (node, device, its rule taints), only devices that have some.
        taints: Vec<(String, DeviceId, Vec<DeviceTaint>)>,
    },
    /// Offered pools.
    OfferedPools {
        /// (node, driver, pool), the node empty for a network-attached pool.
        pools: Vec<(String, String, String)>,
    },
    /// The query could not be decoded.
    Malformed {
        /// Why.
        reason: String,
    },
}

/// A plan query's constraints as the engine takes them.
fn gang_topologies(listed: &[ListedTopology]) -> GangTopologies {
    listed
        .iter()
        .map(|(ns, gang, c)| ((ns.clone(), gang.clone()), c.clone()))
        .collect()
}

/// A gang's topology constraint as a plan query lists it: (namespace, gang, constraint).
pub type ListedTopology = (String, String, TopologyConstraint);

/// The constraints of `gangs` as a plan query lists them.
pub fn listed_topologies<'g>(gangs: impl IntoIterator<Item = &'g Gang>) -> Vec<ListedTopology> {
    gangs
        .into_iter()
        .filter(|g| !g.topology.is_none())
        .map(|g| (g.namespace.clone(), g.name.clone(), g.topology.clone()))
        .collect()
}

/// Answers `q` from `ledger`; plans go through `placer`, which keeps kube-scheduler's
/// round-robin start and the engine's caches between plans (they change speed and the
/// node a search starts at, never whether a plan is valid: Reserve re-checks it).
pub fn answer(ledger: &ShardLedger, q: &ShardQuery, placer: &mut Placer) -> ShardAnswer {
    match q {
        ShardQuery::GetNode { name } => ShardAnswer::Nodes {
            nodes: ledger.node(name).cloned().into_iter().collect(),
        },
        ShardQuery::NodeLabels { nodes, keys } => ShardAnswer::NodeLabels {
            labels: nodes
                .iter()
                .filter_map(|name| {
                    let entry = ledger.node(name)?;
                    let values = keys
                        .iter()
                        .map(|k| entry.node.label(k).map(str::to_string))
                        .collect();
                    Some((name.clone(), values))
                })
                .collect(),
        },
        ShardQuery::ListNodes => ShardAnswer::Nodes {
            nodes: ledger.nodes().cloned().collect(),
        },
        ShardQuery::NodeWeights => ShardAnswer::NodeWeights {
            weights: ledger
                .nodes()
                .map(|e| (e.node.name.clone(), node_weight(&e.node.allocatable)))
                .collect(),
        },
        ShardQuery::Capacity => ShardAnswer::Capacity {
            allocatable: ledger.nodes().fold(Resources::zero(), |sum, e| {
                sum.saturating_add(&e.node.allocatable)
            }),
        },
        ShardQuery::Plan {
            members,
            profile,
            carried,
            topologies,
            kept,
        } => {
            let refs: Vec<MemberRef<'_>> = members
                .iter()
                .map(|(key, spec)| MemberRef { key, spec })
                .collect();
            let topologies = gang_topologies(topologies);
            let placement = match (carried.is_empty(), kept.is_empty()) {
                (true, true) => placer.place_members_with(ledger, &refs, profile, &[], &topologies),
                (true, false) => {
                    let view = WithoutNodes::new(ledger, kept);
                    placer.place_members_with(&view, &refs, profile, &[], &topologies)
                }
                (false, _) => {
                    let carrying = WithCarried::new(ledger, carried);
                    let view = WithoutNodes::new(&carrying, kept);
                    placer.place_members_with(&view, &refs, profile, &[], &topologies)
                }
            };
            ShardAnswer::Plan { placement }
        }
        ShardQuery::PreemptionOffer {
            group,
            priority,
            profile,
            keep,
        } => {
            let keep: BTreeSet<GangId> = keep.iter().cloned().collect();
            ShardAnswer::Offer {
                offer: group_offer_keeping(ledger, group, *priority, profile, &[], &keep),
            }
        }
        ShardQuery::PlanWithout {
            members,
            profile,
            gone,
            topologies,
            kept,
        } => {
            let refs: Vec<MemberRef<'_>> = members
                .iter()
                .map(|(key, spec)| MemberRef { key, spec })
                .collect();
            let gone: BTreeSet<GangId> = gone.iter().cloned().collect();
            let without = WithoutGangs::new(ledger, &gone);
            let view = WithoutNodes::new(&without, kept);
            let topologies = gang_topologies(topologies);
            ShardAnswer::Plan {
                placement: Placer::uncached(0).place_members_with(
                    &view,
                    &refs,
                    profile,
                    &[],
                    &topologies,
                ),
            }
        }
        ShardQuery::OpenTxns => ShardAnswer::OpenTxns {
            txns: ledger
                .open_txns()
                .iter()
                .map(|(id, t)| (*id, t.deadline_ms))
                .collect(),
        },
        ShardQuery::Unbound { limit } => unbound(ledger, *limit, Victims::Wait),
        ShardQuery::NamedBound { limit } => named_bound(ledger, *limit),
        ShardQuery::PreemptionVictims { limit } => ShardAnswer::PreemptionVictims {
            victims: ledger
                .evicting()
                .iter()
                .take(*limit as usize)
                .map(|(member, v)| PreemptedPod {
                    member: member.clone(),
                    uid: v.uid.clone(),
                    node: v.node.clone(),
                    txn: v.txn_id,
                    preemptor: v.preemptor.clone(),
                    since_ms: v.since_ms,
                    waiting: waiting_on(ledger, v.txn_id, &v.node),
                })
                .collect(),
        },
        ShardQuery::OfferedPools => ShardAnswer::OfferedPools {
            pools: offered_pools(ledger),
        },
        ShardQuery::RuleTaints => {
            ShardAnswer::RuleTaints {
                taints: ledger
                    .nodes()
                    .flat_map(|e| {
                        e.usage.devices.rule_taints.iter().map(|(device, taints)| {
                            (e.node.name.clone(), device.clone(), taints.clone())
                        })
                    })
                    .chain(
                        ledger.network_pools().devices().rule_taints.iter().map(
                            |(device, taints)| (String::new(), device.clone(), taints.clone()),
                        ),
                    )
                    .collect(),
            }
        }
        ShardQuery::Stats { at_ms } => ShardAnswer::Stats {
            stats: stats(ledger, *at_ms),
        },
        ShardQuery::Evictions { at_ms, limit } => {
            // A pod with a bad device of its node and a bad network device is one line.
            let mut seen = BTreeSet::new();
            ShardAnswer::Evictions {
                pods: ledger
                    .nodes()
                    .flat_map(|e| evictions_on(e, *at_ms))
                    .chain(network_evictions(ledger, *at_ms))
                    .filter(|p| seen.insert(p.member.clone()))
                    .take(*limit as usize)
                    .collect(),
            }
        }
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
            let devices = members
                .iter()
                .filter_map(|(m, _)| {
                    let slot = ledger.slot(m)?;
                    (!slot.pod.devices.is_empty()).then(|| (m.clone(), slot.pod.devices.clone()))
                })
                .collect();
            ShardAnswer::Txn {
                outcome,
                known: open.is_some() || outcome.is_some(),
                members,
                devices,
            }
        }
    }
}

/// The bound members that named their pod, with the uid bound, at most `limit`.
pub fn named_bound(ledger: &ShardLedger, limit: u32) -> ShardAnswer {
    ShardAnswer::NamedBound {
        members: ledger
            .nodes()
            .flat_map(|e| e.usage.pods.iter())
            .filter(|(_, slot)| {
                slot.pod.binding == PodBinding::Named
                    && matches!(slot.state, SlotState::Bound { .. })
            })
            .filter_map(|(member, slot)| Some((member.clone(), slot.pod.uid.clone()?)))
            .take(limit as usize)
            .collect(),
    }
}

/// Whether a preemptor's members wait for its victims to leave their node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Victims {
    /// They wait (gangway as built).
    Wait,
    /// They do not: the bug switch `binder-binds-before-victims-leave` only.
    Ignore,
}

/// The committed Kubernetes members waiting for their binding (those with a pod uid,
/// and those that name their pod), at most `limit`, in node order; members of a preemption whose victims may still run on their node are
/// left out unless `victims` says to ignore them.
pub fn unbound(ledger: &ShardLedger, limit: u32, victims: Victims) -> ShardAnswer {
    let running = match victims {
        Victims::Wait => ledger.victims_running(),
        Victims::Ignore => BTreeSet::new(),
    };
    let running = &running;
    ShardAnswer::Unbound {
        members: ledger
            .nodes()
            .flat_map(|e| {
                e.usage.pods.iter().filter_map(move |(member, slot)| {
                    let waiting = match slot.state {
                        SlotState::Committed { txn_id, .. } => {
                            (slot.pod.uid.is_some() || slot.pod.binding == PodBinding::Named)
                                && !running.contains(&(txn_id, e.node.name.as_str()))
                        }
                        _ => false,
                    };
                    waiting.then(|| UnboundMember {
                        member: member.clone(),
                        node: e.node.name.clone(),
                        pod: with_network_devices(ledger, member, &slot.pod),
                    })
                })
            })
            .take(limit as usize)
            .collect(),
    }
}

/// A placed member's summary with its network-attached devices after its node's (the
/// binder writes them all into its claims), and those of each shared claim it uses
/// under a network hold, under its own name for the claim: every pod of such a claim
/// writes the same allocation, so whichever binds first allocates it and the others
/// join it, and none waits on a carrier that may be gone.
fn with_network_devices(ledger: &ShardLedger, member: &MemberKey, pod: &PodSummary) -> PodSummary {
    let network = ledger.network_pools();
    let mut out = pod.clone();
    if let Some(hold) = network.hold_of(member) {
        out.devices.extend(hold.pod.devices.iter().cloned());
    }
    for share in pod.followed().filter(|s| network.uses(member, &s.claim)) {
        let Some(hold) = network.claim_hold(&share.claim) else {
            continue;
        };
        out.devices
            .extend(hold.pod.devices.iter().map(|a| DeviceAllocation {
                claim: share.pod_claim.clone(),
                ..a.clone()
            }));
    }
    out
}

/// The Kubernetes members of committed transaction `txn` on `node` (member, uid).
fn waiting_on(ledger: &ShardLedger, txn: TxnId, node: &str) -> Vec<(MemberKey, String)> {
    let Some(entry) = ledger.node(node) else {
        return Vec::new();
    };
    entry
        .usage
        .pods
        .iter()
        .filter(
            |(_, slot)| matches!(slot.state, SlotState::Committed { txn_id, .. } if txn_id == txn),
        )
        .filter_map(|(member, slot)| slot.pod.uid.clone().map(|uid| (member.clone(), uid)))
        .collect()
}

/// The placed Kubernetes pods of this shard that must go by `at_ms` for their
/// network-attached devices (gone, unhealthy, tainted NoExecute), one line per pod.
fn network_evictions(ledger: &ShardLedger, at_ms: u64) -> Vec<PodEviction> {
    let mut out: std::collections::BTreeMap<MemberKey, PodEviction> = Default::default();
    let evictions = ledger.placed_here(ledger.network_pools().evictions(at_ms));
    for e in evictions {
        let Some(slot) = ledger.slot(&e.member) else {
            continue;
        };
        let uid = match slot.state {
            SlotState::Committed { .. } | SlotState::Bound { .. } => slot.pod.uid.clone(),
            SlotState::Reserved { .. } | SlotState::Observed => None,
        };
        let Some(uid) = uid else {
            continue;
        };
        out.entry(e.member.clone()).or_insert(PodEviction {
            member: e.member,
            node: e.node,
            uid,
            device: e.device,
            cause: e.cause,
        });
    }
    out.into_values().collect()
}

/// The placed Kubernetes pods on one node that must go by `at_ms`, one line per pod.
fn evictions_on(entry: &NodeEntry, at_ms: u64) -> Vec<PodEviction> {
    let usage = &entry.usage;
    let placed_uid = |member: &MemberKey| {
        usage.pods.get(member).and_then(|slot| match slot.state {
            SlotState::Committed { .. } | SlotState::Bound { .. } => slot.pod.uid.clone(),
            SlotState::Reserved { .. } | SlotState::Observed => None,
        })
    };
    let mut out: std::collections::BTreeMap<MemberKey, PodEviction> = Default::default();
    let detached: Vec<DeviceEviction> = usage
        .devices
        .detached
        .iter()
        .filter_map(|(member, index)| {
            let device = usage.pods.get(member)?.pod.devices.get(*index as usize)?;
            Some(DeviceEviction {
                member: member.clone(),
                node: entry.node.name.clone(),
                device: device.device.clone(),
                cause: EvictionCause::DeviceRemoved,
                evict_at_ms: at_ms,
            })
        })
        .collect();
    // A shared claim's followers use what its carrier holds.
    let detached = with_followers(detached, &usage.pods)
        .into_iter()
        .map(|e| (e.member, e.device, e.cause));
    let bad_devices = usage
        .devices
        .evictions(&entry.node.name, &usage.pods, at_ms, |_| true)
        .into_iter()
        .filter(|e| e.evict_at_ms <= at_ms)
        .map(|e| (e.member, e.device, e.cause));
    for (member, device, cause) in detached.chain(bad_devices) {
        let Some(uid) = placed_uid(&member) else {
            continue;
        };
        out.entry(member.clone()).or_insert(PodEviction {
            member,
            node: entry.node.name.clone(),
            uid,
            device,
            cause,
        });
    }
    out.into_values().collect()
}

/// (node, driver, pool) of every offered pool, network-attached ones with an empty node.
fn offered_pools(ledger: &ShardLedger) -> Vec<(String, String, String)> {
    let offered = |node: &str, devices: &crate::ledger::NodeDevices| {
        let node = node.to_string();
        (devices.pools.iter())
            .filter(|(_, pool)| pool.standing.is_offered())
            .map(move |(key, _)| (node.clone(), key.driver.clone(), key.pool.clone()))
            .collect::<Vec<_>>()
    };
    ledger
        .nodes()
        .flat_map(|e| offered(&e.node.name, &e.usage.devices))
        .chain(offered("", ledger.network_pools().devices()))
        .collect()
}

fn stats(ledger: &ShardLedger, at_ms: u64) -> ShardStats {
    let open = ledger.open_txns();
    let mut devices = Vec::new();
    for entry in ledger.nodes() {
        let usage = &entry.usage.devices;
        let mut per_driver: std::collections::BTreeMap<&str, DeviceCounts> = Default::default();
        let offered = usage.pools.iter().filter(|(_, p)| p.standing.is_offered());
        for (key, pool) in offered {
            for name in pool.devices.keys() {
                let id = DeviceId::new(&key.driver, &key.pool, name);
                let counts =
                    per_driver
                        .entry(key.driver.as_str())
                        .or_insert_with(|| DeviceCounts {
                            node: entry.node.name.clone(),
                            driver: key.driver.clone(),
                            published: 0,
                            allocated: 0,
                            unhealthy: 0,
                        });
                counts.published += 1;
                if usage.use_of(&id).is_some_and(|u| u.holders > 0) {
                    counts.allocated += 1;
                }
                if usage.health(&id, Some(at_ms)) == DeviceHealth::Unhealthy {
                    counts.unhealthy += 1;
                }
            }
        }
        devices.extend(per_driver.into_values());
    }
    ShardStats {
        open_reservations: open.len() as u64,
        oldest_reserved_at_ms: open.values().map(|t| t.reserved_at_ms).min(),
        devices,
    }
}

/// A view without some nodes: those reserved for a group ahead of the members being
/// planned (`plan::backfill`). Lists its nodes (no index), so the fit cache is not used;
/// a view that keeps no node is the base itself.
struct WithoutNodes<'a, V: ?Sized> {
    base: &'a V,
    kept: BTreeSet<&'a str>,
}

impl<'a, V: LedgerView + ?Sized> WithoutNodes<'a, V> {
    fn new(base: &'a V, kept: &'a [String]) -> Self {
        Self {
            base,
            kept: kept.iter().map(String::as_str).collect(),
        }
    }
}

impl<V: LedgerView + ?Sized> LedgerView for WithoutNodes<'_, V> {
    fn node_views(&self) -> Vec<NodeView<'_>> {
        let mut views = self.base.node_views();
        if !self.kept.is_empty() {
            views.retain(|v| !self.kept.contains(v.node.name.as_str()));
        }
        views
    }

    fn node_view(&self, name: &str) -> Option<NodeView<'_>> {
        if self.kept.contains(name) {
            return None;
        }
        self.base.node_view(name)
    }

    fn indexed(&self) -> Option<IndexedView<'_>> {
        if self.kept.is_empty() {
            return self.base.indexed();
        }
        None
    }

    fn device_classes(&self) -> &std::collections::BTreeMap<String, crate::model::DeviceClass> {
        self.base.device_classes()
    }

    fn network(&self) -> Option<&NetworkPools> {
        self.base.network()
    }
}

/// A shard's view with shared claims that other shards' members of the same placement
/// carry with network-attached devices, held as if committed (on a copy of the shard's
/// network pools), so that the engine plans their followers here.
struct WithCarried<'a> {
    ledger: &'a ShardLedger,
    network: NetworkPools,
}

impl<'a> WithCarried<'a> {
    fn new(ledger: &'a ShardLedger, carried: &[NetworkHold]) -> Self {
        let mut network = ledger.network_pools().clone();
        let carries: Vec<NetworkHold> = carried
            .iter()
            .filter(|h| matches!(h.kind(), HoldKind::Carry(_)))
            .cloned()
            .collect();
        // Claims or devices held here already are not counted twice (the reservation
        // settles whose they are).
        let refused: BTreeSet<MemberKey> = network
            .refusals(&carries, 0)
            .into_iter()
            .map(|(member, _)| member)
            .collect();
        let planned = SlotState::Committed {
            txn_id: TxnId(0),
            at_ms: 0,
        };
        for hold in carries.iter().filter(|h| !refused.contains(&h.member)) {
            network.hold(hold, planned);
        }
        Self { ledger, network }
    }
}

impl LedgerView for WithCarried<'_> {
    fn node_views(&self) -> Vec<NodeView<'_>> {
        self.ledger.node_views()
    }

    fn node_view(&self, name: &str) -> Option<NodeView<'_>> {
        self.ledger.node_view(name)
    }

    fn indexed(&self) -> Option<IndexedView<'_>> {
        self.ledger.indexed()
    }

    fn device_classes(&self) -> &std::collections::BTreeMap<String, crate::model::DeviceClass> {
        self.ledger.device_classes()
    }

    fn network(&self) -> Option<&NetworkPools> {
        self.ledger.network().map(|_| &self.network)
    }
}
