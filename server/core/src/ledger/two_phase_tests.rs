//! The meta and shard state machines together: random interleavings of what the
//! coordinator, the front door and the participants' resolvers write, with the
//! coordinator crashing (forgetting everything it had not written) at any point and a
//! new one recovering what it left Placing (rule 11), and preemptions (rule 14: a queued
//! group displacing a placed one of lower priority through `ReserveDisplacing`),
//! checked against the two-phase rules after every step and after a final drain.
//!
//! The actors here write the same commands the services do (docs/ARCHITECTURE.md,
//! "Two-phase rules"), through the same pure helpers where there are some
//! (`plan::decision::decision_ops`, `plan::decision::acknowledgement`); time moves only when a step says so,
//! and every actor reads the same clock (skewed clocks are not modelled).
//! Checked after every step: no member is held twice, not counting holds under a
//! transaction meta recorded ABORT for and has yet to deliver there (I3); every member a Placed or
//! accumulating group lists is held on its node (I3, I4); every held slot is accounted
//! for by a live group, an undecided transaction, or a decision still to be delivered
//! there (I5). After the drain (the coordinator and resolvers run until nothing is
//! left): the ledgers hold exactly what live groups list, nothing is reserved, and every
//! decision was delivered. Groups of odd keys are Kubernetes pods (their members carry
//! a uid): a committed preemption of them keeps its placeholders until the evictor
//! reports the victims gone (`Step::VictimsGone`), and until then the preemptor's
//! members on their nodes are not bindable. Groups of keys 4 and 5 share one
//! ResourceClaim: their first member planned carries a GPU for it and the others follow
//! on the same node (a group holding members already plans them all as followers beside
//! them). Also checked after every step: each shard ledger's own invariants (I1, I2, a
//! shared claim carried by one slot on its node and followed only there) and no shared
//! claim carried twice across shards outside doomed holds. Groups of keys 6 and 7 take
//! network-attached devices (member `i` device `fabric-i` of a pool every shard keeps,
//! so they compete): their transactions have every shard as participant, each holding
//! all their network holds (rule 15), and meta's placements name the other shards,
//! which releases free too. Also checked after every step: no network device is
//! committed to two members across shards, and every network hold is accounted for as
//! slots are; after the drain, every shard holds exactly the network devices of the
//! live groups' placed members. Groups of keys 8 and 9 share one ResourceClaim carried
//! with a network device (`fabric-{key % 3}`, which keys 6 and 7 want too): the first
//! member planned of a group holding none carries it, every other member (on any node
//! of any shard) uses it, and every shard holds it until its last user goes; checked
//! like the other network holds, a claim hold accounted for by any of its users. A
//! failing case prints its steps; proptest's regression file replays it.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::ledger::command::{
    LedgerCommand, LedgerOp, LedgerReply, NetworkHold, ReleaseTarget, ReserveMember, CLAIM_GANG,
};
use crate::ledger::meta::{
    Decision, GroupRecord, GroupState, MetaCommand, MetaQuery, MetaReply, MetaState, MovePhase,
    MoveTarget, Placement, Undelivered,
};
use crate::ledger::shard::ShardLedger;
use crate::ledger::usage::SlotState;
use crate::ledger::TxnId;
use crate::model::claim::{AdminAccess, ClaimShare, DeviceAllocation};
use crate::model::device::{Device, DeviceId};
use crate::model::gang::MemberKey;
use crate::model::node::Node;
use crate::model::pod::PodSummary;
use crate::model::reach::PoolReach;
use crate::model::resources::Resources;
use crate::model::{Gang, GangGroup, GangMode};
use crate::plan::decision::{acknowledgement, decision_ops};

/// Shards of the model cluster (ids 1..=SHARDS).
const SHARDS: u32 = 2;
/// Nodes per shard; each takes [`NODE_CPU_MILLI`].
const NODES_PER_SHARD: usize = 2;
/// CPU of one node: two members of [`MEMBER_CPU_MILLI`] fit.
const NODE_CPU_MILLI: u64 = 2_000;
/// CPU of one member.
const MEMBER_CPU_MILLI: u64 = 1_000;
/// How long a participant holds a reservation before its resolver asks.
const TTL_MS: u64 = 1_000;
/// Most rounds the final drain may take.
const DRAIN_ROUNDS_MAX: usize = 64;

/// One step of one actor.
#[derive(Debug, Clone)]
enum Step {
    /// Front door: a group of one gang of `members`, key `k{key}`, of priority `key`.
    Submit {
        key: u8,
        members: u8,
        non_strict: bool,
    },
    /// Coordinator: begins a transaction for the `pick`-th queued group, planning the
    /// members it does not hold, spread over shards from `shift`.
    Begin { pick: u8, shift: u8 },
    /// Coordinator: begins a preemption of the `victim`-th placed group by the
    /// `pick`-th queued group holding nothing, placing its members from `shift` (which
    /// may not fit even with the victim gone: a No vote).
    Preempt { pick: u8, victim: u8, shift: u8 },
    /// Coordinator: asks one participant of an open transaction to reserve.
    Reserve { pick: u8 },
    /// Coordinator: writes the decision of a transaction whose votes are in.
    Decide { pick: u8 },
    /// Coordinator: tells one participant the decision.
    Tell { pick: u8 },
    /// The coordinator dies: what it had not written is gone.
    Crash,
    /// Coordinator round: delivers undelivered decisions in bulk.
    Deliver,
    /// Coordinator round: recovers groups a dead coordinator left Placing.
    Recover,
    /// Coordinator round: works on groups releasing or half released.
    FinishReleases,
    /// Front door: Release, Cancel or ReleaseMembers of one member.
    Give { pick: u8, how: u8 },
    /// Time passes.
    Wait { ms: u16 },
    /// A shard's resolver looks at expired reservations.
    Resolve { shard: u8 },
    /// A shard's evictor finds the `pick`-th evicting victim's pod gone.
    VictimsGone { shard: u8, pick: u8 },
    /// An operator (or a rebalance) begins moving the `node`-th node to shard `to`.
    BeginMove { node: u8, to: u8 },
    /// Coordinator round: takes the running move on by at most `writes % 6 + 1`
    /// writes (stopping short is a coordinator that died there).
    AdvanceMove { writes: u8 },
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..10, 1u8..4, any::<bool>()).prop_map(|(key, members, non_strict)| Step::Submit { key, members, non_strict }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(pick, shift)| Step::Begin { pick, shift }),
        2 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(pick, victim, shift)| Step::Preempt { pick, victim, shift }),
        4 => any::<u8>().prop_map(|pick| Step::Reserve { pick }),
        3 => any::<u8>().prop_map(|pick| Step::Decide { pick }),
        3 => any::<u8>().prop_map(|pick| Step::Tell { pick }),
        1 => Just(Step::Crash),
        1 => Just(Step::Deliver),
        1 => Just(Step::Recover),
        1 => Just(Step::FinishReleases),
        2 => (any::<u8>(), 0u8..3).prop_map(|(pick, how)| Step::Give { pick, how }),
        2 => (0u16..1_500).prop_map(|ms| Step::Wait { ms }),
        2 => (1u8..=SHARDS as u8).prop_map(|shard| Step::Resolve { shard }),
        1 => (1u8..=SHARDS as u8, any::<u8>()).prop_map(|(shard, pick)| Step::VictimsGone { shard, pick }),
        1 => (any::<u8>(), 1u8..=SHARDS as u8).prop_map(|(node, to)| Step::BeginMove { node, to }),
        2 => any::<u8>().prop_map(|writes| Step::AdvanceMove { writes }),
    ]
}

/// What the coordinator keeps in memory about a transaction it runs.
#[derive(Debug, Clone)]
struct Running {
    /// Every participant's reservation deadline, set once before the first is asked
    /// (as `reserve_all` does), so a reservation that arrives late is refused.
    deadline_ms: u64,
    /// Every participant with the members it reserves (none on a shard that only holds
    /// victims of a preemption).
    per_shard: BTreeMap<u32, Vec<ReserveMember>>,
    /// A preemption's victim members on each participant (empty for a placement).
    victims: BTreeMap<u32, Vec<MemberKey>>,
    /// The members' network-attached devices, which every participant holds.
    network: Vec<NetworkHold>,
    votes: BTreeMap<u32, bool>,
    decided: Option<Decision>,
    told: BTreeSet<u32>,
}

/// The cluster: meta, the shard ledgers, the clock and the coordinator's memory.
struct World {
    meta: MetaState,
    shards: BTreeMap<u32, ShardLedger>,
    now_ms: u64,
    running: BTreeMap<TxnId, Running>,
    /// Fixed bugs brought back, to show the checks find them.
    bugs: Bugs,
}

/// Fixed bugs the model can bring back (as the services' bug switches do).
#[derive(Debug, Clone, Copy, Default)]
struct Bugs {
    /// Meta forgets decisions as it makes them (item 5; rule 5 broken).
    forget_decisions: bool,
    /// ReleaseMembers frees the members on their shards, committing the group's latest
    /// transaction there first, before meta agrees (items 1 and 2; rule 9 broken).
    release_shards_first: bool,
    /// Meta returns a preemption's victims to Placed as soon as it records ABORT, before
    /// every participant put them back (rule 14 broken).
    victims_back_at_abort: bool,
    /// The shards free a shared claim's devices with the pod carrying them, while its
    /// followers stay (I1 broken; `ledger-frees-shared-claims-with-their-carrier`).
    shared_claims_freed_with_carrier: bool,
    /// A release frees a member on its own shard only, leaving its network devices
    /// held on the others (I5 broken; what a release ignoring `network_shards` does).
    network_freed_on_home_shard_only: bool,
    /// Meta seals a shard move while a transaction on its shards is in flight
    /// (`meta-seals-moves-in-flight`): a decision delivered to the source after its
    /// nodes left finds nothing there (I5 broken).
    move_seals_in_flight: bool,
}

fn node_name(shard: u32, i: usize) -> String {
    format!("n{shard}-{i}")
}

fn gang(key: u8, members: u8, non_strict: bool) -> Gang {
    let mode = if non_strict {
        GangMode::NonStrict
    } else {
        GangMode::Strict
    };
    let members = u32::from(members);
    let mut gang = Gang {
        priority: i32::from(key),
        ..Gang::with_members("default", &format!("g{key}"), members, members, mode)
    };
    if key % 2 == 1 {
        for m in &mut gang.members {
            m.uid = Some(format!("uid-g{key}-{}", m.name));
        }
    }
    gang
}

/// The queue groups of even keys are charged to.
const TEAM_QUEUE: &str = "team";
/// The most pods `TEAM_QUEUE` may hold: fewer than its groups ask together.
const TEAM_PODS_MAX: u64 = 4;

fn team_queue() -> crate::model::QueueSpec {
    let mut max = crate::model::queue::Limits::none();
    max.set(&crate::model::ResourceName::Pods, TEAM_PODS_MAX);
    crate::model::QueueSpec {
        name: TEAM_QUEUE.into(),
        parent: String::new(),
        weight: 1,
        min: crate::model::queue::Limits::none(),
        max,
        lend: crate::model::queue::Limits::none(),
        managed_by: String::new(),
        namespaces: Vec::new(),
    }
}

/// The key of a member's gang.
fn key_of(member: &MemberKey) -> Option<u8> {
    member
        .gang
        .strip_prefix('g')
        .and_then(|k| k.parse::<u8>().ok())
}

/// Whether the members of gang `g{key}` share a ResourceClaim.
fn shares_a_claim(key: u8) -> bool {
    (4..6).contains(&key)
}

/// Whether the members of gang `g{key}` take network-attached devices (their own, or
/// through their shared claim).
fn takes_network_devices(key: u8) -> bool {
    key >= 6
}

/// Whether the members of gang `g{key}` share a ResourceClaim carried with a network
/// device.
fn shares_a_network_claim(key: u8) -> bool {
    key >= 8
}

/// The ResourceClaim the members of gang `g{key}` share.
fn claim_of(key: u8) -> String {
    format!("default/claim-g{key}")
}

/// The network-attached pool every shard keeps.
const FABRIC: &str = "fabric";
/// Its devices: member `i` of a gang taking network devices wants `fabric-i`.
const FABRIC_DEVICES: usize = 3;

/// The network holds of `members`: member `i` holds `fabric-i`, for gangs that take
/// network devices of their own; for gangs sharing a network claim, the first member
/// carries it with `fabric-{key % 3}` (unless the group holds members already, which
/// carry it) and the others use it.
fn network_holds<'a>(
    members: impl Iterator<Item = &'a ReserveMember>,
    carried_before: bool,
) -> Vec<NetworkHold> {
    let fabric = |i: usize| DeviceAllocation {
        claim: "net".into(),
        request: "gpu".into(),
        device: DeviceId::new(DRIVER, FABRIC, format!("fabric-{i}")),
        admin_access: AdminAccess::Disabled,
        tolerations: Vec::new(),
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    };
    let mut carried = carried_before;
    let mut holds = Vec::new();
    for m in members {
        let Some(key) = key_of(&m.member).filter(|k| takes_network_devices(*k)) else {
            continue;
        };
        if !shares_a_network_claim(key) {
            // Members are named m0, m1, …: member `mi` wants `fabric-i`.
            let i = m.member.member.trim_start_matches('m').parse().unwrap_or(0);
            holds.push(NetworkHold {
                member: m.member.clone(),
                devices: vec![fabric(i)],
                claim: None,
            });
            continue;
        }
        let devices = if carried {
            Vec::new()
        } else {
            carried = true;
            vec![DeviceAllocation {
                claim: "c".into(),
                ..fabric(usize::from(key) % FABRIC_DEVICES)
            }]
        };
        holds.push(NetworkHold {
            member: m.member.clone(),
            devices,
            claim: Some(claim_of(key)),
        });
    }
    holds
}

/// The driver of the GPUs every node publishes.
const DRIVER: &str = "gpu.example.com";
/// GPUs per node.
const GPUS_PER_NODE: usize = 2;

/// A member's pod: a Kubernetes pod (with a uid) when its gang's key is odd; a
/// follower of its gang's shared claim when the gang shares one.
fn pod(member: &MemberKey) -> PodSummary {
    let key = key_of(member);
    let kube = key.is_some_and(|k| k % 2 == 1);
    let shares = match key {
        Some(k) if shares_a_claim(k) || shares_a_network_claim(k) => vec![ClaimShare {
            pod_claim: "c".into(),
            claim: claim_of(k),
        }],
        _ => Vec::new(),
    };
    PodSummary {
        requests: Resources {
            cpu_milli: MEMBER_CPU_MILLI,
            ..Resources::zero()
        },
        uid: kube.then(|| format!("uid-{}-{}", member.gang, member.member)),
        shares,
        ..PodSummary::default()
    }
}

/// `pod`, carrying its gang's shared claim: GPU `key % 2` of `node`.
fn carrier(member: &MemberKey, node: &str) -> PodSummary {
    let mut p = pod(member);
    let gpu = key_of(member).map_or(0, |k| usize::from(k) % GPUS_PER_NODE);
    p.devices = vec![DeviceAllocation {
        claim: "c".into(),
        request: "gpu".into(),
        device: DeviceId::new(DRIVER, node, format!("gpu-{gpu}")),
        admin_access: AdminAccess::Disabled,
        tolerations: Vec::new(),
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    }];
    p
}

impl World {
    fn new(bugs: Bugs) -> Self {
        let mut w = World {
            meta: MetaState::new(SHARDS),
            shards: BTreeMap::new(),
            now_ms: 1,
            running: BTreeMap::new(),
            bugs,
        };
        w.meta.set_seal_unchecked(bugs.move_seals_in_flight);
        // Groups of even keys are charged to queue `team`, which holds at most
        // `TEAM_PODS_MAX` pods (I8 is checked after every step).
        w.meta_write(&MetaCommand::PutQueue {
            queue: team_queue(),
        });
        for shard in 1..=SHARDS {
            let mut ledger = ShardLedger::new();
            if bugs.shared_claims_freed_with_carrier {
                ledger.set_hand_over(crate::ledger::usage::HandOver::Freed);
            }
            for i in 0..NODES_PER_SHARD {
                let name = node_name(shard, i);
                let node = Node::new(
                    &name,
                    Resources {
                        cpu_milli: NODE_CPU_MILLI,
                        memory_bytes: 1 << 30,
                        pods: 10,
                        ..Resources::zero()
                    },
                );
                ledger.apply(&LedgerCommand::new(0, LedgerOp::RegisterNode { node }));
                let publish = LedgerOp::PublishPool {
                    node: name.clone(),
                    driver: DRIVER.into(),
                    pool: name.clone(),
                    generation: 1,
                    devices: (0..GPUS_PER_NODE)
                        .map(|d| Device::new(format!("gpu-{d}")))
                        .collect(),
                    counter_sets: Vec::new(),
                };
                ledger.apply(&LedgerCommand::new(0, publish));
                w.meta_write(&MetaCommand::AssignNode {
                    node: name,
                    shard,
                    at_ms: 0,
                });
            }
            let fabric = LedgerOp::PublishNetworkPool {
                driver: DRIVER.into(),
                pool: FABRIC.into(),
                generation: 1,
                reach: PoolReach::AllNodes,
                devices: (0..FABRIC_DEVICES)
                    .map(|d| Device::new(format!("fabric-{d}")))
                    .collect(),
                counter_sets: Vec::new(),
            };
            ledger.apply(&LedgerCommand::new(0, fabric));
            w.shards.insert(shard, ledger);
        }
        w
    }

    fn meta_write(&mut self, cmd: &MetaCommand) -> MetaReply {
        let reply = self.meta.apply(cmd);
        if self.bugs.forget_decisions {
            self.meta.forget_decisions_unacknowledged();
        }
        if self.bugs.victims_back_at_abort {
            self.meta.settle_aborted_preemptions_early();
        }
        reply
    }

    fn shard_write(&mut self, shard: u32, op: LedgerOp) -> LedgerReply {
        let at = self.now_ms;
        self.shards
            .get_mut(&shard)
            .map(|l| l.apply(&LedgerCommand::new(at, op)))
            .unwrap_or_else(|| panic!("no shard {shard} in the model"))
    }

    fn groups(&self) -> Vec<GroupRecord> {
        match self.meta.query(&MetaQuery::Groups { active_only: false }) {
            MetaReply::Groups { records } => records,
            other => panic!("groups query answered {other:?}"),
        }
    }

    fn decision(&self, txn: TxnId) -> Option<Decision> {
        match self.meta.query(&MetaQuery::Txn { txn }) {
            MetaReply::Txn { record } => record.and_then(|t| t.decision),
            other => panic!("txn query answered {other:?}"),
        }
    }

    fn pick<T: Clone>(items: &[T], pick: u8) -> Option<T> {
        (!items.is_empty()).then(|| items[usize::from(pick) % items.len()].clone())
    }

    fn step(&mut self, step: &Step) {
        match *step {
            Step::Submit {
                key,
                members,
                non_strict,
            } => {
                let group = GangGroup {
                    queue: if key % 2 == 0 {
                        TEAM_QUEUE.into()
                    } else {
                        String::new()
                    },
                    id: format!("k{key}"),
                    gangs: vec![gang(key, members, non_strict)],
                    ..Default::default()
                };
                let at_ms = self.now_ms;
                self.meta_write(&MetaCommand::Submit {
                    key: format!("k{key}"),
                    group,
                    at_ms,
                    live_max: None,
                });
            }
            Step::Begin { pick, shift } => self.begin(pick, shift),
            Step::Preempt {
                pick,
                victim,
                shift,
            } => self.preempt(pick, victim, shift),
            Step::Reserve { pick } => self.reserve(pick),
            Step::Decide { pick } => self.decide(pick),
            Step::Tell { pick } => self.tell(pick),
            Step::Crash => self.running.clear(),
            Step::Deliver => self.deliver_undelivered(),
            Step::Recover => self.recover(),
            Step::FinishReleases => self.finish_releases(),
            Step::Give { pick, how } => self.give(pick, how),
            Step::Wait { ms } => self.now_ms += u64::from(ms),
            Step::Resolve { shard } => self.resolve(u32::from(shard)),
            Step::VictimsGone { shard, pick } => self.victims_gone(u32::from(shard), Some(pick)),
            Step::BeginMove { node, to } => self.begin_move(node, to),
            Step::AdvanceMove { writes } => {
                self.advance_move(usize::from(writes % 6) + 1);
            }
        }
    }

    /// Every node in slot order (`n1-0`, `n2-0`, `n1-1`, …) with its shard in meta's map.
    fn nodes_in_slot_order(&self) -> Vec<(String, u32)> {
        let mut nodes = Vec::new();
        for i in 0..NODES_PER_SHARD {
            for shard in 1..=SHARDS {
                let name = node_name(shard, i);
                nodes.push((self.shard_of(&name), name));
            }
        }
        nodes.into_iter().map(|(s, n)| (n, s)).collect()
    }

    /// A node's shard in meta's map.
    fn shard_of(&self, node: &str) -> u32 {
        match self.meta.query(&MetaQuery::ShardOf { node: node.into() }) {
            MetaReply::Shard { shard } => shard,
            other => panic!("node {node} has no shard: {other:?}"),
        }
    }

    fn begin_move(&mut self, node: u8, to: u8) {
        let nodes = self.nodes_in_slot_order();
        let Some((name, _)) = Self::pick(&nodes, node) else {
            return;
        };
        let at_ms = self.now_ms;
        self.meta_write(&MetaCommand::BeginMove {
            target: MoveTarget::Nodes(vec![name]),
            to: u32::from(to),
            reason: String::new(),
            at_ms,
        });
    }

    /// The coordinator's `moves::advance`, at most `writes` writes (each step of it is
    /// idempotent, so a call that stops short is one whose coordinator died there);
    /// whether the move ended.
    fn advance_move(&mut self, writes: usize) -> bool {
        let running = match self.meta.query(&MetaQuery::Moves) {
            MetaReply::Moves { moves } => moves.into_iter().find(|m| m.is_active()),
            other => panic!("moves query answered {other:?}"),
        };
        let Some(m) = running else {
            return true;
        };
        let mut left = writes;
        let mut spend = || {
            let ok = left > 0;
            left = left.saturating_sub(1);
            ok
        };
        let mut phase = m.phase;
        loop {
            match phase {
                MovePhase::Begun => {
                    for (source, nodes) in &m.sources {
                        if !spend() {
                            return false;
                        }
                        let fence = LedgerOp::FenceNodes {
                            move_id: m.id,
                            nodes: nodes.clone(),
                        };
                        if let LedgerReply::Rejected { error } = self.shard_write(*source, fence) {
                            panic!("shard {source} refused a fence: {error}");
                        }
                    }
                    if !spend() {
                        return false;
                    }
                    match self.meta_write(&MetaCommand::SealMove { id: m.id }) {
                        MetaReply::Move { .. } => phase = MovePhase::Sealed,
                        _ => return false,
                    }
                }
                MovePhase::Sealed => {
                    let mut parcels = Vec::new();
                    for source in m.sources.keys() {
                        if !spend() {
                            return false;
                        }
                        let op = LedgerOp::HandOff {
                            move_id: m.id,
                            to: m.to,
                        };
                        match self.shard_write(*source, op) {
                            LedgerReply::HandedOff { parcel } => parcels.push(parcel),
                            _ => return false,
                        }
                    }
                    for parcel in parcels {
                        if !spend() {
                            return false;
                        }
                        if let LedgerReply::Rejected { .. } =
                            self.shard_write(m.to, LedgerOp::Adopt { parcel })
                        {
                            // Stuck: the drain's check finds the move still running.
                            return false;
                        }
                    }
                    if !spend() {
                        return false;
                    }
                    self.meta_write(&MetaCommand::CommitMove { id: m.id });
                    phase = MovePhase::Committed;
                }
                // The last step: every source drops its parcel (or lifts the fence of a
                // move given up), then meta ends the move.
                MovePhase::Committed | MovePhase::Cancelling => {
                    let last = match phase {
                        MovePhase::Cancelling => LedgerOp::UnfenceNodes { move_id: m.id },
                        _ => LedgerOp::DropParcel { move_id: m.id },
                    };
                    for source in m.sources.keys() {
                        if !spend() {
                            return false;
                        }
                        self.shard_write(*source, last.clone());
                    }
                    if !spend() {
                        return false;
                    }
                    let at_ms = self.now_ms;
                    self.meta_write(&MetaCommand::EndMove { id: m.id, at_ms });
                    return true;
                }
                MovePhase::Done | MovePhase::Cancelled => return true,
            }
        }
    }

    /// The evictor of `shard`: the `pick`-th evicting victim's pod is gone (every one
    /// when `pick` is `None`).
    fn victims_gone(&mut self, shard: u32, pick: Option<u8>) {
        let Some(ledger) = self.shards.get(&shard) else {
            return;
        };
        let evicting: Vec<MemberKey> = ledger.evicting().keys().cloned().collect();
        let members: Vec<MemberKey> = match pick {
            Some(pick) => Self::pick(&evicting, pick).into_iter().collect(),
            None => evicting,
        };
        if !members.is_empty() {
            self.shard_write(shard, LedgerOp::VictimsGone { members });
        }
    }

    fn begin(&mut self, pick: u8, shift: u8) {
        let queued: Vec<GroupRecord> = self
            .groups()
            .into_iter()
            .filter(|g| g.state == GroupState::Queued)
            .collect();
        let Some(g) = Self::pick(&queued, pick) else {
            return;
        };
        // Members it does not hold, spread over shards from `shift`, filling each node's
        // two slots in turn (the ledger refuses what does not fit: a No vote).
        let mut per_shard: BTreeMap<u32, Vec<ReserveMember>> = BTreeMap::new();
        let unheld: Vec<MemberKey> = g
            .group
            .gangs
            .iter()
            .flat_map(|gang| {
                gang.members
                    .iter()
                    .map(|m| MemberKey::new(&gang.namespace, &gang.name, &m.name))
            })
            .filter(|k| !g.holds(&k.to_string()))
            .collect();
        // A NonStrict group may take only the members that fit now (some of them), and
        // accumulate; a Strict one takes all at once.
        let non_strict = g.group.gangs.iter().all(|x| x.mode == GangMode::NonStrict);
        let take = if non_strict && !unheld.is_empty() {
            1 + usize::from(shift) % unheld.len()
        } else {
            unheld.len()
        };
        let beside = g
            .placements
            .values()
            .next()
            .map(|p| (p.shard, p.node.clone()));
        let held_before = beside.is_some();
        let nodes = self.nodes_in_slot_order();
        spread(
            &mut per_shard,
            &nodes,
            unheld.into_iter().take(take),
            shift,
            beside,
        );
        if per_shard.is_empty() {
            return;
        }
        // Network devices are held on every shard: every shard takes part (rule 15).
        let network = network_holds(per_shard.values().flatten(), held_before);
        if !network.is_empty() {
            for shard in 1..=SHARDS {
                per_shard.entry(shard).or_default();
            }
        }
        let at_ms = self.now_ms;
        let reply = self.meta_write(&MetaCommand::BeginTxn {
            seq: g.seq,
            participants: per_shard.keys().copied().collect(),
            at_ms,
        });
        if let MetaReply::TxnBegun { txn } = reply {
            self.running.insert(
                txn,
                Running {
                    deadline_ms: at_ms + TTL_MS,
                    per_shard,
                    victims: BTreeMap::new(),
                    network,
                    votes: BTreeMap::new(),
                    decided: None,
                    told: BTreeSet::new(),
                },
            );
        }
    }

    /// The coordinator's `preempt` on the model, after its choice: `BeginPreemption`
    /// with every shard of the preemptor's members and of the victim's placements.
    fn preempt(&mut self, pick: u8, victim: u8, shift: u8) {
        let groups = self.groups();
        let queued: Vec<&GroupRecord> = groups
            .iter()
            .filter(|g| g.state == GroupState::Queued && g.holds_nothing())
            .collect();
        let placed: Vec<&GroupRecord> = groups
            .iter()
            .filter(|g| g.state == GroupState::Placed && g.releasing.is_empty())
            .collect();
        let (Some(g), Some(v)) = (Self::pick(&queued, pick), Self::pick(&placed, victim)) else {
            return;
        };
        // A preemptor's plan sees no network pools, and a holder of network devices is
        // no victim (every shard names its gang ineligible).
        let network = |r: &GroupRecord| {
            r.group.gangs.iter().any(|x| {
                x.name
                    .strip_prefix('g')
                    .and_then(|k| k.parse().ok())
                    .is_some_and(takes_network_devices)
            })
        };
        if network(g) || network(v) {
            return;
        }
        let mut per_shard: BTreeMap<u32, Vec<ReserveMember>> = BTreeMap::new();
        let members = g.group.gangs.iter().flat_map(|gang| {
            gang.members
                .iter()
                .map(|m| MemberKey::new(&gang.namespace, &gang.name, &m.name))
        });
        let nodes = self.nodes_in_slot_order();
        spread(&mut per_shard, &nodes, members, shift, None);
        let mut victims: BTreeMap<u32, Vec<MemberKey>> = BTreeMap::new();
        for (key, p) in &v.placements {
            let member = MemberKey::try_from(key.clone())
                .unwrap_or_else(|e| panic!("placed member {key} does not parse: {e}"));
            victims.entry(p.shard).or_default().push(member);
            per_shard.entry(p.shard).or_default();
        }
        let at_ms = self.now_ms;
        let reply = self.meta_write(&MetaCommand::BeginPreemption {
            seq: g.seq,
            victims: vec![v.seq],
            participants: per_shard.keys().copied().collect(),
            at_ms,
            reclaim: false,
        });
        if let MetaReply::TxnBegun { txn } = reply {
            self.running.insert(
                txn,
                Running {
                    deadline_ms: at_ms + TTL_MS,
                    per_shard,
                    victims,
                    network: Vec::new(),
                    votes: BTreeMap::new(),
                    decided: None,
                    told: BTreeSet::new(),
                },
            );
        }
    }

    fn running_where(&self, pick: u8, f: impl Fn(&Running) -> bool) -> Option<TxnId> {
        let txns: Vec<TxnId> = self
            .running
            .iter()
            .filter(|(_, r)| f(r))
            .map(|(t, _)| *t)
            .collect();
        Self::pick(&txns, pick)
    }

    fn reserve(&mut self, pick: u8) {
        let Some(txn) = self.running_where(pick, |r| {
            r.decided.is_none() && r.votes.len() < r.per_shard.len()
        }) else {
            return;
        };
        let r = &self.running[&txn];
        let alone = r.per_shard.len() == 1 && r.victims.is_empty();
        let Some((&shard, members)) = r.per_shard.iter().find(|(s, _)| !r.votes.contains_key(s))
        else {
            return;
        };
        let members = members.clone();
        let network = r.network.clone();
        let deadline_ms = r.deadline_ms;
        let op = if !r.victims.is_empty() {
            LedgerOp::ReserveDisplacing {
                txn_id: txn,
                members,
                victims: r.victims.get(&shard).cloned().unwrap_or_default(),
                deadline_ms,
            }
        } else if alone {
            LedgerOp::ReserveAndCommit {
                txn_id: txn,
                members,
                network,
            }
        } else {
            LedgerOp::Reserve {
                txn_id: txn,
                members,
                deadline_ms,
                network,
            }
        };
        let yes = matches!(
            self.shard_write(shard, op),
            LedgerReply::Reserved { .. } | LedgerReply::Committed { .. }
        );
        if let Some(r) = self.running.get_mut(&txn) {
            r.votes.insert(shard, yes);
        }
    }

    fn decide(&mut self, pick: u8) {
        let Some(txn) = self.running_where(pick, |r| {
            r.decided.is_none() && r.votes.len() == r.per_shard.len()
        }) else {
            return;
        };
        let r = self.running[&txn].clone();
        let commit = r.votes.values().all(|yes| *yes);
        let placements: BTreeMap<String, Placement> = if commit {
            r.per_shard
                .iter()
                .flat_map(|(shard, members)| {
                    let network = &r.network;
                    members.iter().map(move |m| {
                        let held = network.iter().any(|h| h.member == m.member);
                        (
                            m.member.to_string(),
                            Placement {
                                node: m.node.clone(),
                                shard: *shard,
                                devices: Vec::new(),
                                txn: Some(txn),
                                network_shards: if held {
                                    (1..=SHARDS).filter(|s| s != shard).collect()
                                } else {
                                    Vec::new()
                                },
                                allocations: Vec::new(),
                            },
                        )
                    })
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        let alone = r.per_shard.len() == 1 && r.victims.is_empty();
        let delivered: Vec<u32> = if alone && commit {
            r.per_shard.keys().copied().collect()
        } else {
            Vec::new()
        };
        let at_ms = self.now_ms;
        let reply = self.meta_write(&MetaCommand::Decide {
            txn,
            decision: if commit {
                Decision::Commit
            } else {
                Decision::Abort
            },
            placements,
            reason: String::new(),
            at_ms,
            delivered: delivered.clone(),
        });
        let MetaReply::Decided { decision, .. } = reply else {
            // Not recorded (the coordinator would count it an abort and tell no one).
            self.running.remove(&txn);
            return;
        };
        if let Some(r) = self.running.get_mut(&txn) {
            r.decided = Some(decision);
            if decision == Decision::Commit {
                r.told.extend(delivered);
            }
            if r.told.len() == r.per_shard.len() {
                self.running.remove(&txn);
            }
        }
    }

    fn tell(&mut self, pick: u8) {
        let Some(txn) = self.running_where(pick, |r| r.decided.is_some()) else {
            return;
        };
        let r = self.running[&txn].clone();
        let Some(decision) = r.decided else {
            return;
        };
        let alone = r.per_shard.len() == 1;
        let Some(&shard) = r.per_shard.keys().find(|s| !r.told.contains(s)) else {
            self.running.remove(&txn);
            return;
        };
        self.deliver(&[Undelivered {
            txn,
            decision,
            shards: vec![shard],
            alone,
        }]);
        if let Some(r) = self.running.get_mut(&txn) {
            r.told.insert(shard);
            if r.told.len() == r.per_shard.len() {
                self.running.remove(&txn);
            }
        }
    }

    /// `release::deliver` and `record_delivered`, on the model.
    fn deliver(&mut self, decisions: &[Undelivered]) {
        let mut acked: BTreeMap<TxnId, Vec<u32>> = BTreeMap::new();
        for d in decisions {
            for &shard in &d.shards {
                let replies: Vec<LedgerReply> = decision_ops(d.txn, d.decision, d.alone)
                    .into_iter()
                    .map(|op| self.shard_write(shard, op))
                    .collect();
                if acknowledgement(d.decision, &replies).is_delivered() {
                    acked.entry(d.txn).or_default().push(shard);
                }
            }
        }
        for (txn, shards) in acked {
            self.meta_write(&MetaCommand::Delivered { txn, shards });
        }
    }

    fn deliver_undelivered(&mut self) {
        if let MetaReply::Undelivered { txns } =
            self.meta.query(&MetaQuery::Undelivered { limit: 4_096 })
        {
            self.deliver(&txns);
        }
    }

    /// `release::free_members` on the model: per shard, commit the placing
    /// transactions, then release the members.
    /// `release::free_members` on the model: whether every shard released (a refusal,
    /// such as a member whose node moved away, leaves the release to be finished).
    fn free<'a>(&mut self, held: impl IntoIterator<Item = (&'a String, &'a Placement)>) -> bool {
        let mut freed = true;
        let mut per_shard: BTreeMap<u32, (BTreeSet<TxnId>, Vec<MemberKey>)> = BTreeMap::new();
        for (key, p) in held {
            let member = MemberKey::try_from(key.clone())
                .unwrap_or_else(|e| panic!("placed member {key} does not parse: {e}"));
            let others = if self.bugs.network_freed_on_home_shard_only {
                &[][..]
            } else {
                p.network_shards.as_slice()
            };
            for shard in std::iter::once(p.shard).chain(others.iter().copied()) {
                let entry = per_shard.entry(shard).or_default();
                entry.0.extend(p.txn);
                entry.1.push(member.clone());
            }
        }
        for (shard, (txns, members)) in per_shard {
            for txn in txns {
                self.shard_write(shard, LedgerOp::Commit { txn_id: txn });
            }
            let reply = self.shard_write(
                shard,
                LedgerOp::Release {
                    target: ReleaseTarget::Members(members),
                },
            );
            freed &= matches!(reply, LedgerReply::Released { .. });
        }
        freed
    }

    /// The coordinator's `release` and `finish_member_release` on the model.
    fn finish_releases(&mut self) {
        for g in self.groups() {
            let at_ms = self.now_ms;
            match g.state {
                GroupState::Releasing { .. }
                    if g.placements
                        .values()
                        .any(|p| self.meta.sealed_move_of(&p.node).is_some()) =>
                {
                    // Its members may be between shards: released once the move committed.
                }
                GroupState::Releasing { .. } => {
                    if let Some(txn) = g.txn {
                        if let MetaReply::Txn { record: Some(t) } =
                            self.meta.query(&MetaQuery::Txn { txn })
                        {
                            if t.decision == Some(Decision::Abort) && !t.unacked.is_empty() {
                                let alone = t.participants.len() == 1;
                                self.deliver(&[Undelivered {
                                    txn,
                                    decision: Decision::Abort,
                                    shards: t.unacked.clone(),
                                    alone,
                                }]);
                                if self.decision_unacked(txn) {
                                    continue;
                                }
                            }
                        }
                    }
                    let mut held = g.placements.clone();
                    held.extend(g.releasing.clone());
                    if self.free(&held) {
                        self.meta_write(&MetaCommand::ReleaseDone { seq: g.seq, at_ms });
                    }
                }
                GroupState::Placed if !g.releasing.is_empty() => {
                    if !self.free(&g.releasing) {
                        continue;
                    }
                    self.meta_write(&MetaCommand::MembersReleased {
                        seq: g.seq,
                        members: g.releasing.keys().cloned().collect(),
                        at_ms,
                    });
                }
                _ => {}
            }
        }
    }

    fn decision_unacked(&self, txn: TxnId) -> bool {
        matches!(
            self.meta.query(&MetaQuery::Txn { txn }),
            MetaReply::Txn { record: Some(t) } if !t.unacked.is_empty()
        )
    }

    fn give(&mut self, pick: u8, how: u8) {
        let live: Vec<GroupRecord> = self
            .groups()
            .into_iter()
            .filter(|g| !g.state.is_terminal())
            .collect();
        let Some(g) = Self::pick(&live, pick) else {
            return;
        };
        let at_ms = self.now_ms;
        match how {
            0 => {
                self.meta_write(&MetaCommand::Release { seq: g.seq, at_ms });
            }
            1 => {
                self.meta_write(&MetaCommand::Cancel { seq: g.seq, at_ms });
            }
            _ => {
                // ReleaseMembers' first phase only: the rest is the coordinator's (or
                // the caller's, which may die here).
                let Some(member) = g.placements.keys().next().cloned() else {
                    return;
                };
                if self.bugs.release_shards_first {
                    self.release_shards_first(&g, &member);
                }
                self.meta_write(&MetaCommand::ReleaseMembers {
                    seq: g.seq,
                    members: vec![member],
                    at_ms,
                });
            }
        }
    }

    /// The fixed bug behind `release-members-shards-first`: the member's shard commits
    /// the group's latest transaction and frees the member before meta is asked.
    fn release_shards_first(&mut self, g: &GroupRecord, member: &str) {
        let (Some(p), Ok(key)) = (
            g.placements.get(member),
            MemberKey::try_from(member.to_string()),
        ) else {
            return;
        };
        if let Some(txn) = g.txn {
            self.shard_write(p.shard, LedgerOp::Commit { txn_id: txn });
        }
        self.shard_write(
            p.shard,
            LedgerOp::Release {
                target: ReleaseTarget::Members(vec![key]),
            },
        );
    }

    /// `resolver::resolve_shard` on the model.
    fn resolve(&mut self, shard: u32) {
        let Some(ledger) = self.shards.get(&shard) else {
            return;
        };
        let expired: Vec<TxnId> = ledger
            .open_txns()
            .iter()
            .filter(|(_, t)| t.deadline_ms <= self.now_ms)
            .map(|(id, _)| *id)
            .collect();
        let mut decided = Vec::new();
        for txn in expired {
            let decision = match self.decision(txn) {
                Some(d) => d,
                None => {
                    let at_ms = self.now_ms;
                    match self.meta_write(&MetaCommand::AbortIfUndecided {
                        txn,
                        at_ms,
                        shard: Some(shard),
                    }) {
                        MetaReply::Decided { decision, .. } => decision,
                        other => panic!("AbortIfUndecided answered {other:?}"),
                    }
                }
            };
            decided.push(Undelivered {
                txn,
                decision,
                shards: vec![shard],
                alone: false,
            });
        }
        self.deliver(&decided);
    }

    /// Every gangway slot: member -> (shard, node, state). A slot is counted on the shard
    /// meta's map names for its node: during a move the target may hold a node before
    /// meta names it, and between the handoff and the adoption the node is only in its
    /// source's parcel (counted from there).
    fn slots(&self) -> Vec<(String, u32, String, SlotState)> {
        let mut out = Vec::new();
        let mut tabled = BTreeSet::new();
        for ledger in self.shards.values() {
            for n in ledger.nodes() {
                tabled.insert(n.node.name.clone());
                self.push_slots(&mut out, n);
            }
        }
        for ledger in self.shards.values() {
            for parcel in ledger.parcels().values() {
                for n in parcel
                    .nodes
                    .iter()
                    .filter(|n| !tabled.contains(&n.node.name))
                {
                    self.push_slots(&mut out, n);
                }
            }
        }
        out
    }

    fn push_slots(
        &self,
        out: &mut Vec<(String, u32, String, SlotState)>,
        n: &crate::ledger::shard::NodeEntry,
    ) {
        let shard = self.shard_of(&n.node.name);
        for (member, slot) in &n.usage.pods {
            if !matches!(slot.state, SlotState::Observed { .. }) {
                out.push((
                    member.to_string(),
                    shard,
                    n.node.name.clone(),
                    slot.state.clone(),
                ));
            }
        }
    }

    /// Whether a slot is held under a transaction meta recorded ABORT for and has not
    /// delivered to `shard` yet: its participant drops it when told (rule 6) or at its
    /// deadline (rule 4), and it can never commit, so it does not count as a hold of its
    /// member (the group may be planned again meanwhile; the capacity stays counted).
    fn doomed(&self, shard: u32, state: &SlotState) -> bool {
        let txn = match state {
            SlotState::Reserved { txn_id } | SlotState::Committed { txn_id, .. } => *txn_id,
            _ => return false,
        };
        matches!(
            self.meta.query(&MetaQuery::Txn { txn }),
            MetaReply::Txn { record: Some(t) }
                if t.decision == Some(Decision::Abort) && t.unacked.contains(&shard)
        )
    }

    /// The rules that hold between any two steps.
    fn check_always(&self) -> Result<(), String> {
        if let Some(why) = self.meta.quota_violation() {
            return Err(why);
        }
        let mut carriers: BTreeMap<String, (u32, String)> = BTreeMap::new();
        for (shard, ledger) in &self.shards {
            ledger
                .check_invariants()
                .map_err(|e| format!("shard {shard}: {e:?}"))?;
            for entry in ledger.nodes() {
                for (member, slot) in &entry.usage.pods {
                    if self.doomed(*shard, &slot.state) {
                        continue;
                    }
                    for share in slot.pod.carried() {
                        let here = (*shard, entry.node.name.clone());
                        if let Some(other) = carriers.insert(share.claim.clone(), here) {
                            return Err(format!(
                                "shared claim {} carried on {other:?} and by {member} on ({shard}, {})",
                                share.claim, entry.node.name
                            ));
                        }
                    }
                }
            }
        }
        let slots = self.slots();
        let mut seen = BTreeMap::new();
        for (member, shard, node, state) in &slots {
            if self.doomed(*shard, state) {
                continue;
            }
            if let Some(other) = seen.insert(member.clone(), (*shard, node.clone())) {
                return Err(format!(
                    "{member} is held twice: {other:?} and ({shard}, {node})"
                ));
            }
        }
        let groups = self.groups();
        for g in &groups {
            let lists = matches!(g.state, GroupState::Placed | GroupState::Queued);
            for (member, p) in g.placements.iter().filter(|_| lists) {
                if seen.get(member) != Some(&(p.shard, p.node.clone())) {
                    return Err(format!(
                        "group {} ({:?}) lists {member} on {}, but the ledger holds it at {:?}",
                        g.seq,
                        g.state,
                        p.node,
                        seen.get(member)
                    ));
                }
            }
        }
        let listed: BTreeSet<&String> = groups
            .iter()
            .filter(|g| !g.state.is_terminal())
            .flat_map(|g| g.placements.keys().chain(g.releasing.keys()))
            .collect();
        for (member, shard, node, state) in &slots {
            if listed.contains(member) {
                continue;
            }
            let txn = match state {
                SlotState::Reserved { txn_id }
                | SlotState::Committed { txn_id, .. }
                | SlotState::Bound { txn_id, .. } => *txn_id,
                SlotState::Observed { .. } => continue,
            };
            let accounted = match self.meta.query(&MetaQuery::Txn { txn }) {
                MetaReply::Txn { record: Some(t) } => {
                    t.decision.is_none() || t.unacked.contains(shard)
                }
                _ => false,
            } || self.holds_for_running_victims(*shard, member, node, txn);
            if !accounted {
                return Err(format!(
                    "{member} on {node} (shard {shard}, {state:?}) is held for no live group, \
                     undecided transaction or undelivered decision"
                ));
            }
        }
        self.check_network()?;
        self.check_victims_wait()
    }

    /// Network holds: no device committed to two members across shards, and every hold
    /// accounted for by a live group placing its member, an undecided transaction or an
    /// undelivered decision (as slots are).
    fn check_network(&self) -> Result<(), String> {
        let groups = self.groups();
        let listed: BTreeSet<String> = groups
            .iter()
            .filter(|g| !g.state.is_terminal())
            .flat_map(|g| g.placements.keys().chain(g.releasing.keys()))
            .cloned()
            .collect();
        let mut owner: BTreeMap<DeviceId, String> = BTreeMap::new();
        let accounted = |shard: u32, txn: Option<TxnId>| {
            txn.is_some_and(|txn| {
                matches!(self.meta.query(&MetaQuery::Txn { txn }),
                    MetaReply::Txn { record: Some(t) }
                        if t.decision.is_none() || t.unacked.contains(&shard))
            })
        };
        for (shard, ledger) in &self.shards {
            let pools = ledger.network_pools();
            for (member, txn) in pools.consumers() {
                if !listed.contains(&member.to_string()) && !accounted(*shard, Some(txn)) {
                    return Err(format!(
                        "{member} uses a shared claim's network devices on shard {shard} ({txn}) \
                         for no live group, undecided transaction or undelivered decision"
                    ));
                }
            }
            for (key, slot) in pools.holds() {
                // A shared claim's hold is accounted for by its users.
                let users: Vec<String> = if key.gang == CLAIM_GANG {
                    pools
                        .consumers()
                        .filter(|(m, _)| {
                            pools.uses(m, &format!("{}/{}", key.namespace, key.member))
                        })
                        .map(|(m, _)| m.to_string())
                        .collect()
                } else {
                    vec![key.to_string()]
                };
                let member = key.to_string();
                let doomed = self.doomed(*shard, &slot.state);
                if !slot.state.is_reserved() && !doomed {
                    for a in &slot.pod.devices {
                        if let Some(other) = owner.insert(a.device.clone(), member.clone()) {
                            if other != member {
                                return Err(format!(
                                    "{} committed to {other} and, on shard {shard}, to {member}",
                                    a.device
                                ));
                            }
                        }
                    }
                }
                if users.iter().any(|u| listed.contains(u)) {
                    continue;
                }
                if !accounted(*shard, slot.state.txn_id()) {
                    return Err(format!(
                        "network hold of {member} on shard {shard} ({:?}) is held for no live group, \
                         undecided transaction or undelivered decision",
                        slot.state
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `member` is a placeholder of committed preemption `txn` on `node` of
    /// `shard` where one of its Kubernetes victims may still run.
    fn holds_for_running_victims(&self, shard: u32, member: &str, node: &str, txn: TxnId) -> bool {
        let is_placeholder = MemberKey::try_from(member.to_string())
            .is_ok_and(|k| crate::ledger::displace::is_placeholder(&k));
        is_placeholder
            && self.shards[&shard]
                .evicting()
                .values()
                .any(|v| v.txn_id == txn && v.node == node)
    }

    /// No member is bindable on a node where a Kubernetes victim of its preemption may
    /// still run; no victim is evicting for a transaction meta has not committed.
    fn check_victims_wait(&self) -> Result<(), String> {
        use crate::query::{unbound, ShardAnswer, Victims};
        for (shard, ledger) in &self.shards {
            let running = ledger.victims_running();
            if let ShardAnswer::Unbound { members } = unbound(ledger, u32::MAX, Victims::Wait) {
                for m in members {
                    let txn = ledger.slot(&m.member).and_then(|s| s.state.txn_id());
                    if txn.is_some_and(|t| running.contains(&(t, m.node.as_str()))) {
                        return Err(format!(
                            "{} on {} (shard {shard}) is bindable while a victim of its preemption runs there",
                            m.member, m.node
                        ));
                    }
                }
            }
            for (victim, v) in ledger.evicting() {
                if let MetaReply::Txn { record: Some(t) } =
                    self.meta.query(&MetaQuery::Txn { txn: v.txn_id })
                {
                    if t.decision != Some(Decision::Commit) {
                        return Err(format!(
                            "{victim} on shard {shard} is evicting for {}, which meta has {:?}",
                            v.txn_id, t.decision
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The coordinator restarts and, with the resolvers, runs until nothing changes.
    fn drain(&mut self) {
        self.running.clear();
        for _ in 0..DRAIN_ROUNDS_MAX {
            let before = (self.meta.clone(), self.slots());
            self.deliver_undelivered();
            self.finish_releases();
            self.now_ms += TTL_MS;
            for shard in 1..=SHARDS {
                self.resolve(shard);
                self.victims_gone(shard, None);
            }
            self.recover();
            self.advance_move(usize::MAX);
            if (self.meta.clone(), self.slots()) == before {
                return;
            }
        }
    }

    /// The coordinator's `recover` of groups left Placing by a coordinator that died
    /// (their transaction is in no running memory): a multi-shard one is aborted and
    /// every participant told; a one-shard one is aborted on its shard, or, if the shard
    /// had committed it, recorded COMMIT with the members the shard holds.
    fn recover(&mut self) {
        for g in self.groups() {
            let GroupState::Placing { txn } = g.state else {
                continue;
            };
            if self.running.contains_key(&txn) {
                continue;
            }
            let participants = match self.meta.query(&MetaQuery::Txn { txn }) {
                MetaReply::Txn { record: Some(t) } => t.participants,
                _ => Vec::new(),
            };
            match participants[..] {
                [shard] => self.recover_one_shard(txn, shard),
                _ => self.decide_and_tell(txn, Decision::Abort, BTreeMap::new(), &participants),
            }
        }
    }

    fn recover_one_shard(&mut self, txn: TxnId, shard: u32) {
        let reply = self.shard_write(shard, LedgerOp::Abort { txn_id: txn });
        let committed = matches!(
            reply,
            LedgerReply::Rejected {
                error: crate::ledger::LedgerError::TxnCommitted { .. }
            }
        );
        if !committed {
            let at_ms = self.now_ms;
            self.meta_write(&MetaCommand::Decide {
                txn,
                decision: Decision::Abort,
                placements: BTreeMap::new(),
                reason: "coordinator failover".into(),
                at_ms,
                delivered: vec![shard],
            });
            return;
        }
        let placements: BTreeMap<String, Placement> = self
            .slots()
            .into_iter()
            .filter(|(_, s, _, state)| {
                *s == shard
                    && matches!(state, SlotState::Committed { txn_id, .. } if *txn_id == txn)
            })
            .map(|(member, _, node, _)| {
                let placement = Placement {
                    node,
                    shard,
                    devices: Vec::new(),
                    txn: Some(txn),
                    network_shards: Vec::new(),
                    allocations: Vec::new(),
                };
                (member, placement)
            })
            .collect();
        self.decide_and_tell(txn, Decision::Commit, placements, &[shard]);
    }

    /// Writes `decision` (COMMIT delivered already when it is one shard's own commit) and
    /// tells the participants the decision meta recorded.
    fn decide_and_tell(
        &mut self,
        txn: TxnId,
        decision: Decision,
        placements: BTreeMap<String, Placement>,
        participants: &[u32],
    ) {
        let alone = participants.len() == 1;
        let delivered = if alone && decision == Decision::Commit {
            participants.to_vec()
        } else {
            Vec::new()
        };
        let at_ms = self.now_ms;
        let reply = self.meta_write(&MetaCommand::Decide {
            txn,
            decision,
            placements,
            reason: "recovered".into(),
            at_ms,
            delivered: delivered.clone(),
        });
        if let MetaReply::Decided {
            decision: recorded, ..
        } = reply
        {
            if recorded != decision || delivered.is_empty() {
                self.deliver(&[Undelivered {
                    txn,
                    decision: recorded,
                    shards: participants.to_vec(),
                    alone,
                }]);
            }
        }
    }

    /// After the drain: the ledgers hold exactly what live groups list, nothing is
    /// reserved, every decision was delivered.
    fn check_drained(&self) -> Result<(), String> {
        self.check_always()?;
        if let MetaReply::Moves { moves } = self.meta.query(&MetaQuery::Moves) {
            if let Some(m) = moves.iter().find(|m| m.is_active()) {
                return Err(format!(
                    "drained, shard move {} is still {:?}",
                    m.id, m.phase
                ));
            }
        }
        // Every node is in exactly one shard's table: the one meta's map names.
        for (name, shard) in self.nodes_in_slot_order() {
            let holders: Vec<u32> = self
                .shards
                .iter()
                .filter(|(_, l)| l.node(&name).is_some())
                .map(|(s, _)| *s)
                .collect();
            if holders != vec![shard] {
                return Err(format!(
                    "drained, node {name} is on shard {shard} in meta's map but in the tables of {holders:?}"
                ));
            }
        }
        let listed: BTreeMap<String, (u32, String)> = self
            .groups()
            .iter()
            .filter(|g| !g.state.is_terminal())
            .flat_map(|g| g.placements.iter().chain(g.releasing.iter()))
            .map(|(m, p)| (m.clone(), (p.shard, p.node.clone())))
            .collect();
        let held: BTreeMap<String, (u32, String)> = self
            .slots()
            .into_iter()
            .map(|(m, s, n, _)| (m, (s, n)))
            .collect();
        if listed != held {
            return Err(format!(
                "drained, live groups list {listed:?} but the ledgers hold {held:?}"
            ));
        }
        if let Some((m, s, n, st)) = self
            .slots()
            .into_iter()
            .find(|(_, _, _, st)| matches!(st, SlotState::Reserved { .. }))
        {
            return Err(format!("drained, {m} on {n} (shard {s}) is still {st:?}"));
        }
        // Every shard holds the network devices of exactly the live placed members
        // that take them, committed.
        // (A shared claim's under its key, used by exactly its live placed members.)
        let key_of_listed = |m: &String| {
            MemberKey::try_from(m.clone())
                .ok()
                .and_then(|k| key_of(&k))
                .filter(|k| takes_network_devices(*k))
        };
        let mut with_network: BTreeSet<String> = BTreeSet::new();
        let mut users: BTreeSet<String> = BTreeSet::new();
        for m in listed.keys() {
            match key_of_listed(m) {
                Some(k) if shares_a_network_claim(k) => {
                    with_network
                        .insert(crate::ledger::command::claim_key(&claim_of(k)).to_string());
                    users.insert(m.clone());
                }
                Some(_) => {
                    with_network.insert(m.clone());
                }
                None => {}
            }
        }
        for (shard, ledger) in &self.shards {
            let holds = ledger.network_pools().holds();
            let held: BTreeSet<String> = holds.keys().map(|m| m.to_string()).collect();
            if held != with_network {
                return Err(format!(
                    "drained, shard {shard} holds network devices of {held:?}, live groups place {with_network:?}"
                ));
            }
            let using: BTreeSet<String> = ledger
                .network_pools()
                .consumers()
                .map(|(m, _)| m.to_string())
                .collect();
            if using != users {
                return Err(format!(
                    "drained, shard {shard} has {using:?} using shared claims, live groups place {users:?}"
                ));
            }
            if let Some((m, slot)) = holds.iter().find(|(_, slot)| slot.state.is_reserved()) {
                return Err(format!(
                    "drained, network hold of {m} on shard {shard} is still {:?}",
                    slot.state
                ));
            }
        }
        match self.meta.query(&MetaQuery::Undelivered { limit: 1 }) {
            MetaReply::Undelivered { txns } if txns.is_empty() => Ok(()),
            other => Err(format!("drained, decisions still undelivered: {other:?}")),
        }
    }
}

/// Places `members` over `nodes` (slot order, each with its shard now) from `shift`,
/// filling each node's two slots in turn (the ledger refuses what does not fit: a No vote). Members of a gang sharing a
/// claim all go to one node: beside the group's held members (`beside`, as followers),
/// else to the node at `shift`, the first carrying the claim.
fn spread(
    per_shard: &mut BTreeMap<u32, Vec<ReserveMember>>,
    nodes: &[(String, u32)],
    members: impl Iterator<Item = MemberKey>,
    shift: u8,
    beside: Option<(u32, String)>,
) {
    let mut members = members.peekable();
    if members.peek().and_then(key_of).is_some_and(shares_a_claim) {
        let slot = usize::from(shift);
        let (shard, node, mut carried) = match beside {
            Some((shard, node)) => (shard, node, true),
            None => {
                let (node, shard) = nodes[slot % nodes.len()].clone();
                (shard, node, false)
            }
        };
        for member in members {
            let pod = if carried {
                pod(&member)
            } else {
                carried = true;
                carrier(&member, &node)
            };
            per_shard.entry(shard).or_default().push(ReserveMember {
                member,
                node: node.clone(),
                pod,
            });
        }
        return;
    }
    for (i, member) in members.enumerate() {
        let slot = i + usize::from(shift);
        let (node, shard) = nodes[slot % nodes.len()].clone();
        let pod = pod(&member);
        per_shard
            .entry(shard)
            .or_default()
            .push(ReserveMember { member, node, pod });
    }
}

/// Runs `steps`, checking after each; the error names the step.
fn run(steps: &[Step], bugs: Bugs) -> Result<(), String> {
    let mut w = World::new(bugs);
    for (i, step) in steps.iter().enumerate() {
        w.step(step);
        w.check_always()
            .map_err(|e| format!("after step {i} ({step:?}): {e}"))?;
    }
    w.drain();
    w.check_drained()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any interleaving of coordinator, front-door and resolver steps, with crashes,
    /// keeps the two-phase rules, and a drain leaves the ledgers exactly as meta says.
    #[test]
    fn meta_and_shards_agree_under_any_interleaving(steps in prop::collection::vec(arb_step(), 1..80)) {
        if let Err(e) = run(&steps, Bugs::default()) {
            prop_assert!(false, "{}\nsteps: {:?}", e, steps);
        }
    }
}

/// A low group of four placed across both shards, fully delivered: what the
/// preemption runs start from.
fn low_group_placed() -> Vec<Step> {
    low_group_placed_as(0)
}

/// `low_group_placed` with key `key` (odd: a group of Kubernetes pods).
fn low_group_placed_as(key: u8) -> Vec<Step> {
    vec![
        Step::Submit {
            key,
            members: 4,
            non_strict: false,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        Step::Deliver,
    ]
}

/// Steps weighted toward preemptions of higher-priority groups.
fn arb_preemption_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (1u8..4, 1u8..5).prop_map(|(key, members)| Step::Submit { key, members, non_strict: false }),
        4 => (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(pick, victim, shift)| Step::Preempt { pick, victim, shift }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(pick, shift)| Step::Begin { pick, shift }),
        6 => any::<u8>().prop_map(|pick| Step::Reserve { pick }),
        3 => any::<u8>().prop_map(|pick| Step::Decide { pick }),
        3 => any::<u8>().prop_map(|pick| Step::Tell { pick }),
        1 => Just(Step::Crash),
        1 => Just(Step::Deliver),
        1 => Just(Step::Recover),
        1 => Just(Step::FinishReleases),
        2 => (any::<u8>(), 0u8..3).prop_map(|(pick, how)| Step::Give { pick, how }),
        1 => (0u16..1_500).prop_map(|ms| Step::Wait { ms }),
        2 => (1u8..=SHARDS as u8).prop_map(|shard| Step::Resolve { shard }),
        2 => (1u8..=SHARDS as u8, any::<u8>()).prop_map(|(shard, pick)| Step::VictimsGone { shard, pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Preemptions of a placed group interleaved with everything else, crashes and
    /// deadlines included, keep the rules: a victim is never listed Placed while a shard
    /// holds its room displaced, never loses its room while the preemption may abort,
    /// and the drain leaves the ledgers exactly as meta says.
    #[test]
    fn preemptions_keep_the_rules_under_any_interleaving(
        steps in prop::collection::vec(arb_preemption_step(), 1..60),
        kube_low in any::<bool>(),
    ) {
        let low = low_group_placed_as(u8::from(kube_low));
        let all: Vec<Step> = low.into_iter().chain(steps).collect();
        if let Err(e) = run(&all, Bugs::default()) {
            prop_assert!(false, "{}\nsteps: {:?}", e, all);
        }
    }
}

/// The same checks find item 5 (decisions forgotten before every participant
/// acknowledged them): a COMMIT decided, the coordinator dead before telling, the
/// resolvers' tombstone aborts what meta placed.
#[test]
fn the_checks_find_decisions_forgotten_before_acknowledged() {
    let steps = [
        Step::Submit {
            key: 0,
            members: 2,
            non_strict: false,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        Step::Crash,
        Step::Wait { ms: 1_200 },
        Step::Resolve { shard: 1 },
    ];
    assert_eq!(run(&steps, Bugs::default()), Ok(()));
    let bugs = Bugs {
        forget_decisions: true,
        ..Bugs::default()
    };
    let found = run(&steps, bugs).expect_err("the bug went unnoticed");
    assert!(found.contains("lists default/g0/m"), "{found}");
}

/// Random interleavings find items 1 and 2 (ReleaseMembers freeing shards before meta
/// agrees) within a bounded number of cases.
#[test]
fn the_checks_find_release_members_freeing_shards_first() {
    let found = find_in_random_interleavings(Bugs {
        release_shards_first: true,
        ..Bugs::default()
    });
    eprintln!("found, as expected: {found}");
}

/// Runs up to 4,096 random interleavings with `bugs` brought back; the first failure the
/// checks report (panics if none does).
fn find_in_random_interleavings(bugs: Bugs) -> String {
    find_in_interleavings_of(arb_step(), bugs)
}

/// `find_in_random_interleavings` over steps drawn from `step`.
fn find_in_interleavings_of(step: impl Strategy<Value = Step>, bugs: Bugs) -> String {
    let config = ProptestConfig {
        cases: 4_096,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let found = runner.run(&prop::collection::vec(step, 1..80), |steps| {
        run(&steps, bugs).map_err(proptest::test_runner::TestCaseError::fail)
    });
    found
        .err()
        .unwrap_or_else(|| panic!("the bug went unnoticed in 4,096 cases"))
        .to_string()
}

/// Item 2: a release that commits the group's latest transaction on a member's shard
/// commits a transaction meta then aborts (the coordinator died between reserve and
/// decide), leaving a slot no group lists. Checked on the drained state alone, so the
/// finding is item 2's leak, not item 1's freed member.
#[test]
fn the_checks_find_a_release_committing_an_aborted_transaction() {
    let steps = [
        // A NonStrict group of three holds m0 on shard 1 (a one-shard commit)...
        Step::Submit {
            key: 0,
            members: 3,
            non_strict: true,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        // ...is planned again across both shards, and the coordinator dies reserved.
        Step::Begin { pick: 0, shift: 1 },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Crash,
        // ReleaseMembers of m0 while the group is Placing.
        Step::Give { pick: 0, how: 2 },
        Step::Wait { ms: 1_200 },
        Step::Resolve { shard: 2 },
    ];
    // After the drain, the slots no live group lists (none, when the protocol holds).
    let leaked = |bugs: Bugs| -> Vec<String> {
        let mut w = World::new(bugs);
        for step in &steps {
            w.step(step);
        }
        w.drain();
        let listed: BTreeSet<String> = w
            .groups()
            .iter()
            .filter(|g| !g.state.is_terminal())
            .flat_map(|g| g.placements.keys().chain(g.releasing.keys()).cloned())
            .collect();
        w.slots()
            .into_iter()
            .filter(|(m, ..)| !listed.contains(m))
            .map(|(m, _, _, state)| format!("{m} {state:?}"))
            .collect()
    };
    assert_eq!(leaked(Bugs::default()), Vec::<String>::new());
    let bugs = Bugs {
        release_shards_first: true,
        ..Bugs::default()
    };
    let found = leaked(bugs);
    assert!(
        found
            .iter()
            .any(|s| s.starts_with("default/g0/m2 Committed")),
        "{found:?}"
    );
    eprintln!("found, as expected: {found:?}");
}

/// Rule 11's one-shard branch: a reserve-and-commit that committed on its shard before
/// the coordinator died is recorded COMMIT with what the shard holds, not lost.
#[test]
fn a_one_shard_commit_left_undecided_is_recovered_as_placed() {
    let steps = [
        // One member: a one-shard transaction (shard 1), committed at once.
        Step::Submit {
            key: 0,
            members: 1,
            non_strict: false,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Crash,
        Step::Recover,
    ];
    let mut w = World::new(Bugs::default());
    for step in &steps {
        w.step(step);
        assert_eq!(w.check_always(), Ok(()), "after {step:?}");
    }
    let groups = w.groups();
    assert_eq!(groups[0].state, GroupState::Placed, "{:?}", groups[0]);
    assert_eq!(groups[0].placements.len(), 1);
    w.drain();
    assert_eq!(w.check_drained(), Ok(()));
}

/// Rule 14: a preemption whose ABORT reached one participant (its resolver, at the
/// deadline) leaves the victim Preempting until the other participant put it back too.
/// Brought back, the bug of returning victims to Placed at the ABORT itself is found: the
/// victim is listed Placed while a shard still holds its room displaced.
#[test]
fn the_checks_find_victims_returned_before_their_abort_is_delivered() {
    let steps = [
        // A low group of two, one member on each shard...
        Step::Submit {
            key: 0,
            members: 2,
            non_strict: false,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        Step::Tell { pick: 0 },
        Step::Tell { pick: 0 },
        // ...is preempted by a higher one, and the coordinator dies reserved.
        Step::Submit {
            key: 3,
            members: 2,
            non_strict: false,
        },
        Step::Preempt {
            pick: 0,
            victim: 0,
            shift: 0,
        },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Crash,
        // Shard 1's resolver aborts it; shard 2 has not heard.
        Step::Wait { ms: 1_200 },
        Step::Resolve { shard: 1 },
    ];
    assert_eq!(run(&steps, Bugs::default()), Ok(()));
    let bugs = Bugs {
        victims_back_at_abort: true,
        ..Bugs::default()
    };
    let found = run(&steps, bugs).expect_err("the bug went unnoticed");
    assert!(found.contains("lists default/g0/m"), "{found}");
    eprintln!("found, as expected: {found}");
}

/// A preemption that commits places the preemptor on the victim's room and ends the
/// victim Preempted, holding nothing, on every shard.
#[test]
fn a_committed_preemption_moves_the_room_from_victim_to_preemptor() {
    let steps = [
        Step::Submit {
            key: 0,
            members: 4,
            non_strict: false,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        Step::Deliver,
        Step::Submit {
            key: 3,
            members: 8,
            non_strict: false,
        },
        Step::Preempt {
            pick: 0,
            victim: 0,
            shift: 0,
        },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        Step::Tell { pick: 0 },
    ];
    let mut w = World::new(Bugs::default());
    for step in &steps {
        w.step(step);
        assert_eq!(w.check_always(), Ok(()), "after {step:?}");
    }
    let groups = w.groups();
    assert_eq!(groups[0].state, GroupState::Placed, "{:?}", groups[0]);
    assert_eq!(groups[0].placements.len(), 8);
    assert!(matches!(
        groups[1].state,
        GroupState::Done {
            how: crate::ledger::meta::Terminal::Preempted
        }
    ));
    w.drain();
    assert_eq!(w.check_drained(), Ok(()));
    assert_eq!(w.slots().len(), 8);
}

/// Random interleavings find a shared claim's devices freed with their carrier (a
/// follower left on a node where nothing carries its claim) within a bounded number of
/// cases.
#[test]
fn the_checks_find_shared_claims_freed_with_their_carrier() {
    let found = find_in_random_interleavings(Bugs {
        shared_claims_freed_with_carrier: true,
        ..Bugs::default()
    });
    assert!(found.contains("shared claim"), "{found}");
    eprintln!("found, as expected: {found}");
}

#[test]
fn the_checks_find_network_holds_a_release_leaves_on_other_shards() {
    let found = find_in_random_interleavings(Bugs {
        network_freed_on_home_shard_only: true,
        ..Bugs::default()
    });
    assert!(found.contains("network"), "{found}");
    eprintln!("found, as expected: {found}");
}

/// A world in which the group of `key` with `members` members is placed on both shards
/// (begun, reserved on both, decided and told), checked after every step.
fn placed(key: u8, members: u8, bugs: Bugs) -> World {
    let mut w = World::new(bugs);
    let steps = [
        Step::Submit {
            key,
            members,
            non_strict: false,
        },
        Step::Begin { pick: 0, shift: 0 },
        Step::Reserve { pick: 0 },
        Step::Reserve { pick: 0 },
        Step::Decide { pick: 0 },
        Step::Tell { pick: 0 },
        Step::Tell { pick: 0 },
    ];
    for step in &steps {
        w.step(step);
        w.check_always()
            .unwrap_or_else(|e| panic!("after {step:?}: {e}"));
    }
    w
}

/// Group 8 (three members sharing a claim carried with a network device) placed over
/// both shards.
fn placed_network_claim(bugs: Bugs) -> World {
    placed(8, 3, bugs)
}

/// A shared claim carried with a network device serves members on both shards; it is
/// held on both until the last of them is released through meta, whichever goes first.
#[test]
fn a_network_claim_is_held_on_every_shard_until_its_last_member_goes() {
    let mut w = placed_network_claim(Bugs::default());
    let state = |w: &World| -> Vec<(usize, usize)> {
        w.shards
            .values()
            .map(|l| {
                (
                    l.network_pools().holds().len(),
                    l.network_pools().consumers().count(),
                )
            })
            .collect()
    };
    assert_eq!(
        state(&w),
        vec![(1, 3), (1, 3)],
        "one claim, three users, on both shards"
    );
    for left in [2, 1] {
        w.step(&Step::Give { pick: 0, how: 2 });
        w.step(&Step::FinishReleases);
        w.check_always()
            .unwrap_or_else(|e| panic!("after a release: {e}"));
        assert_eq!(state(&w), vec![(1, left), (1, left)]);
    }
    w.step(&Step::Give { pick: 0, how: 2 });
    w.step(&Step::FinishReleases);
    w.check_always()
        .unwrap_or_else(|e| panic!("after the last release: {e}"));
    assert_eq!(state(&w), vec![(0, 0), (0, 0)], "freed with its last user");
    w.drain();
    w.check_drained().unwrap_or_else(|e| panic!("{e}"));
}

/// The checks find a network claim freed with the first of its members to go (its
/// other members left using devices that are free to be given out).
#[test]
fn the_checks_find_a_network_claim_freed_with_one_of_its_members() {
    let mut w = placed_network_claim(Bugs {
        shared_claims_freed_with_carrier: true,
        ..Bugs::default()
    });
    w.step(&Step::Give { pick: 0, how: 2 });
    w.step(&Step::FinishReleases);
    let found = w
        .check_always()
        .expect_err("the checks find the freed claim");
    assert!(found.contains("shared claim"), "{found}");
    eprintln!("found, as expected: {found}");
}

/// A group taking network devices is placed across both shards, every shard holding
/// its devices; releasing one member through meta frees its device on both.
#[test]
fn a_network_member_released_through_meta_is_freed_on_every_shard() {
    let mut w = placed(6, 2, Bugs::default());
    let holders = |w: &World| -> Vec<usize> {
        w.shards
            .values()
            .map(|l| l.network_pools().holds().len())
            .collect()
    };
    assert_eq!(
        holders(&w),
        vec![2, 2],
        "both members' devices on both shards"
    );
    w.step(&Step::Give { pick: 0, how: 2 });
    w.step(&Step::FinishReleases);
    w.check_always()
        .unwrap_or_else(|e| panic!("after the release: {e}"));
    assert_eq!(
        holders(&w),
        vec![1, 1],
        "the released member's device freed everywhere"
    );
    w.drain();
    w.check_drained().unwrap_or_else(|e| panic!("{e}"));
}

/// Random preemption interleavings find the victims returned at the ABORT itself within a
/// bounded number of cases.
#[test]
fn random_preemptions_find_victims_returned_before_their_abort_is_delivered() {
    let bugs = Bugs {
        victims_back_at_abort: true,
        ..Bugs::default()
    };
    let config = ProptestConfig {
        cases: 2_048,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let found = runner.run(
        &prop::collection::vec(arb_preemption_step(), 1..60),
        |steps| {
            let all: Vec<Step> = low_group_placed().into_iter().chain(steps).collect();
            run(&all, bugs).map_err(proptest::test_runner::TestCaseError::fail)
        },
    );
    let found = found
        .err()
        .unwrap_or_else(|| panic!("the bug went unnoticed in 2,048 cases"));
    eprintln!("found, as expected: {found}");
}

/// Steps weighted toward shard moves among placements, releases and crashes.
fn arb_move_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..10, 1u8..4, any::<bool>()).prop_map(|(key, members, non_strict)| Step::Submit { key, members, non_strict }),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(pick, shift)| Step::Begin { pick, shift }),
        4 => any::<u8>().prop_map(|pick| Step::Reserve { pick }),
        3 => any::<u8>().prop_map(|pick| Step::Decide { pick }),
        3 => any::<u8>().prop_map(|pick| Step::Tell { pick }),
        1 => Just(Step::Crash),
        1 => Just(Step::Deliver),
        1 => Just(Step::Recover),
        1 => Just(Step::FinishReleases),
        2 => (any::<u8>(), 0u8..3).prop_map(|(pick, how)| Step::Give { pick, how }),
        1 => (0u16..1_500).prop_map(|ms| Step::Wait { ms }),
        1 => (1u8..=SHARDS as u8).prop_map(|shard| Step::Resolve { shard }),
        3 => (any::<u8>(), 1u8..=SHARDS as u8).prop_map(|(node, to)| Step::BeginMove { node, to }),
        4 => any::<u8>().prop_map(|writes| Step::AdvanceMove { writes }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Shard moves interleaved with placements, releases, deadlines and coordinator
    /// crashes (a move's driver stopping after any write) keep every rule: no member
    /// held twice or lost, nothing held that no live group, undecided transaction or
    /// undelivered decision accounts for, and after the drain every node is in exactly
    /// the table of the shard meta's map names, holding exactly what meta lists there.
    #[test]
    fn shard_moves_keep_the_rules_under_any_interleaving(
        steps in prop::collection::vec(arb_move_step(), 1..80),
    ) {
        if let Err(e) = run(&steps, Bugs::default()) {
            prop_assert!(false, "{}\nsteps: {:?}", e, steps);
        }
    }
}

/// A move sealed while a one-shard transaction on its source is undecided (the bug
/// switch `meta-seals-moves-in-flight`): the node leaves with the committed slot, the
/// group is cancelled, and the ABORT with its release reaches the source, which holds
/// nothing any more; the target keeps the slot for no one (I5).
#[test]
fn the_checks_find_a_move_sealed_while_a_transaction_is_in_flight() {
    let steps = |bugs: Bugs| {
        let mut w = World::new(bugs);
        for step in [
            Step::Submit {
                key: 0,
                members: 1,
                non_strict: false,
            },
            // One member on n1-0: a one-shard reserve-and-commit, not yet decided.
            Step::Begin { pick: 0, shift: 0 },
            Step::Reserve { pick: 0 },
            Step::BeginMove { node: 0, to: 2 },
            Step::AdvanceMove { writes: 5 },
            Step::Crash,
            Step::Give { pick: 0, how: 1 },
        ] {
            w.step(&step);
        }
        w.drain();
        w.check_drained()
    };
    assert_eq!(steps(Bugs::default()), Ok(()));
    let found = steps(Bugs {
        move_seals_in_flight: true,
        ..Bugs::default()
    });
    assert!(found.is_err(), "the sealed-too-early move went unnoticed");
    eprintln!("found, as expected: {found:?}");
}

/// The same bug, found by random interleavings weighted toward moves.
#[test]
fn random_moves_find_a_move_sealed_while_a_transaction_is_in_flight() {
    let found = find_in_interleavings_of(
        arb_move_step(),
        Bugs {
            move_seals_in_flight: true,
            ..Bugs::default()
        },
    );
    eprintln!("found, as expected: {found}");
}
