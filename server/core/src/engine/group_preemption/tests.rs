//! Offers on real shard ledgers, and the whole choice across shards: each shard's
//! offer, the coordinator's victim choice, then the group placed on every shard as it
//! would be without the victims.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::ledger::command::{LedgerCommand, LedgerOp, LedgerReply, ReserveMember, TxnId};
use crate::ledger::shard::ShardLedger;
use crate::model::gang::{Gang, GangMode, Member};
use crate::model::node::Node;
use crate::model::pod::{PodSpec, PodSummary};
use crate::model::resources::Resources;
use crate::plan::victims::{choose_victims, from_group_offers};

const CPU_PER_NODE_MILLI: u64 = 2_000;

fn cpu(milli: u64) -> Resources {
    Resources {
        cpu_milli: milli,
        memory_bytes: 1 << 30,
        pods: 110,
        ..Resources::zero()
    }
}

/// A shard of `nodes` nodes named `prefix-i`, each of 2 cpus.
fn shard(prefix: &str, nodes: usize) -> ShardLedger {
    let mut ledger = ShardLedger::new();
    for i in 0..nodes {
        let node = Node::new(format!("{prefix}-{i}"), cpu(CPU_PER_NODE_MILLI));
        ledger.apply(&LedgerCommand::new(1, LedgerOp::RegisterNode { node }));
    }
    ledger
}

/// Commits (or only reserves) one pod of gang `gang` per node listed, each taking a whole node.
fn hold(
    ledger: &mut ShardLedger,
    txn: u64,
    gang: &str,
    nodes: &[String],
    priority: i32,
    commit: bool,
) {
    let members = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| ReserveMember {
            member: MemberKey::new("ns", gang, format!("{node}-{i}")),
            node: node.clone(),
            pod: PodSummary {
                requests: Resources {
                    cpu_milli: CPU_PER_NODE_MILLI,
                    ..Resources::zero()
                },
                priority,
                ..PodSummary::default()
            },
        })
        .collect();
    let op = if commit {
        LedgerOp::ReserveAndCommit {
            txn_id: TxnId(txn),
            members,
            network: Vec::new(),
        }
    } else {
        LedgerOp::Reserve {
            txn_id: TxnId(txn),
            members,
            deadline_ms: 5_000,
            network: Vec::new(),
        }
    };
    let reply = ledger.apply(&LedgerCommand::new(1, op));
    assert!(
        matches!(
            reply,
            LedgerReply::Committed { .. } | LedgerReply::Reserved { .. }
        ),
        "{reply:?}"
    );
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A Strict gang of `members` pods of 2 cpus each at `priority`.
fn preemptor(name: &str, members: usize, priority: i32) -> GangGroup {
    let spec = PodSpec {
        requests: Resources {
            cpu_milli: CPU_PER_NODE_MILLI,
            ..Resources::zero()
        },
        priority,
        ..PodSpec::default()
    };
    GangGroup {
        queue: String::new(),
        id: name.into(),
        gangs: vec![Gang {
            name: name.into(),
            namespace: "ns".into(),
            min_member: members as u32,
            total_number: members as u32,
            mode: GangMode::Strict,
            wait_time_ms: 1_000,
            priority,
            creation_order: 0,
            members: (0..members)
                .map(|i| Member {
                    name: format!("m-{i}"),
                    spec: spec.clone(),
                    uid: None,
                    binding: Default::default(),
                    pod_selector: Default::default(),
                })
                .collect(),
            topology: Default::default(),
        }],
        ..Default::default()
    }
}

/// Offers from every shard, the choice, and (when there is one) how many members
/// every shard places once the chosen units are gone.
fn plan_across(
    shards: &BTreeMap<u32, ShardLedger>,
    group: &GangGroup,
    priority: i32,
) -> Option<(BTreeSet<GangId>, usize)> {
    let offers: BTreeMap<u32, GroupOffer> = shards
        .iter()
        .map(|(id, ledger)| {
            (
                *id,
                group_offer(ledger, group, priority, &Profile::default(), &[]),
            )
        })
        .collect();
    let (units, shard_offers) = from_group_offers(&offers);
    let need: BTreeMap<GangId, u32> = group.gangs.iter().map(|g| (g.id(), g.min_member)).collect();
    let choice = choose_victims(&units, &shard_offers, &need, priority)?;
    let placed = shards
        .values()
        .map(|ledger| {
            let view = WithoutGangs::new(ledger, &choice.evict);
            place_group(&view, group, &Profile::default(), &[])
                .assignments
                .len()
        })
        .sum();
    Some((choice.evict, placed))
}

/// Two shards of 4 nodes each, filled by one Strict gang `low` of 8 pods at priority 1.
fn filled_by_low() -> BTreeMap<u32, ShardLedger> {
    let mut a = shard("a", 4);
    let mut b = shard("b", 4);
    hold(&mut a, 1, "low", &names("a", 4), 1, true);
    hold(&mut b, 1, "low", &names("b", 4), 1, true);
    BTreeMap::from([(1, a), (2, b)])
}

#[test]
fn a_low_strict_gang_across_two_shards_is_evicted_whole_for_a_high_gang() {
    let shards = filled_by_low();
    let high = preemptor("high", 8, 10);
    let (evict, placed) = plan_across(&shards, &high, 10).expect("a plan");
    assert_eq!(evict, BTreeSet::from([GangId::new("ns", "low")]));
    assert_eq!(
        placed, 8,
        "the whole high gang fits once the low gang is gone"
    );
}

#[test]
fn a_shard_with_nothing_to_evict_still_offers_the_room_it_has() {
    // Shard 1 is empty, shard 2 full of a low gang: a high gang of 8 needs both, the
    // room shard 1 has now and what shard 2 frees.
    let mut b = shard("b", 4);
    hold(&mut b, 1, "low", &names("b", 4), 1, true);
    let shards = BTreeMap::from([(1, shard("a", 4)), (2, b)]);
    let (evict, placed) = plan_across(&shards, &preemptor("high", 8, 10), 10).expect("a plan");
    assert_eq!(evict, BTreeSet::from([GangId::new("ns", "low")]));
    assert_eq!(placed, 8);
}

#[test]
fn nothing_is_evicted_when_the_room_would_still_be_too_small() {
    let shards = filled_by_low();
    assert_eq!(plan_across(&shards, &preemptor("high", 10, 10), 10), None);
}

#[test]
fn a_gang_with_a_reserved_pod_on_any_shard_is_never_a_victim() {
    let mut a = shard("a", 4);
    let mut b = shard("b", 4);
    hold(&mut a, 1, "low", &names("a", 4), 1, true);
    // The same gang, still reserved on shard 2 (its placement is not decided).
    hold(&mut b, 1, "low", &names("b", 4), 1, false);
    let shards = BTreeMap::from([(1, a), (2, b)]);
    assert_eq!(plan_across(&shards, &preemptor("high", 4, 10), 10), None);
}

#[test]
fn equal_priority_pods_are_never_offered() {
    let mut a = shard("a", 2);
    hold(&mut a, 1, "peer", &names("a", 2), 10, true);
    let offer = group_offer(&a, &preemptor("high", 2, 10), 10, &Profile::default(), &[]);
    assert!(offer.steps.is_empty(), "{offer:?}");
    assert!(offer.ineligible.contains(&GangId::new("ns", "peer")));
}

#[test]
fn steps_stop_once_the_shard_could_host_the_whole_group() {
    let mut a = shard("a", 4);
    hold(&mut a, 1, "x", &names("a", 4)[..2], 1, true);
    hold(&mut a, 2, "y", &names("a", 4)[2..], 2, true);
    let offer = group_offer(&a, &preemptor("high", 2, 10), 10, &Profile::default(), &[]);
    assert_eq!(offer.steps.len(), 1, "{offer:?}");
    assert_eq!(
        offer.steps[0].gang,
        GangId::new("ns", "x"),
        "the lower priority first"
    );
    assert_eq!(
        offer.steps[0].hostable.get(&GangId::new("ns", "high")),
        Some(&2)
    );
}

#[test]
fn a_view_without_gangs_gives_their_room_back() {
    let mut a = shard("a", 2);
    hold(&mut a, 1, "x", &names("a", 2), 1, true);
    let gone = BTreeSet::from([GangId::new("ns", "x")]);
    let view = WithoutGangs::new(&a, &gone);
    for v in view.node_views() {
        assert_eq!(v.pods().count(), 0);
        assert_eq!(v.free().cpu_milli, CPU_PER_NODE_MILLI);
    }
    assert_eq!(
        a.node_views()
            .iter()
            .map(|v| v.pods().count())
            .sum::<usize>(),
        2,
        "the ledger itself is untouched"
    );
}

#[test]
fn gangs_the_coordinator_keeps_are_never_steps() {
    let mut a = shard("a", 4);
    hold(&mut a, 1, "x", &names("a", 4)[..2], 1, true);
    hold(&mut a, 2, "y", &names("a", 4)[2..], 2, true);
    let keep = BTreeSet::from([GangId::new("ns", "x")]);
    let offer = group_offer_keeping(
        &a,
        &preemptor("high", 2, 10),
        10,
        &Profile::default(),
        &[],
        &keep,
    );
    assert_eq!(offer.steps.len(), 1, "{offer:?}");
    assert_eq!(offer.steps[0].gang, GangId::new("ns", "y"), "x is kept");
    assert!(offer.ineligible.contains(&GangId::new("ns", "x")));
}

#[test]
fn a_preemptor_that_needs_one_rack_evicts_inside_one_rack_only() {
    const RACK: &str = "example.com/rack";
    let mut a = ShardLedger::new();
    for (i, rack) in ["r0", "r0", "r1", "r1"].iter().enumerate() {
        let mut node = Node::new(format!("a-{i}"), cpu(CPU_PER_NODE_MILLI));
        node.labels.insert(RACK.into(), (*rack).into());
        a.apply(&LedgerCommand::new(1, LedgerOp::RegisterNode { node }));
    }
    let node = |i: usize| vec![format!("a-{i}")];
    // Cheapest first over the shard: p1 (r0), p2 (r1), p4 (r1), p3 (r0).
    hold(&mut a, 1, "p1", &node(0), 1, true);
    hold(&mut a, 2, "p2", &node(2), 1, true);
    hold(&mut a, 3, "p3", &node(1), 3, true);
    hold(&mut a, 4, "p4", &node(3), 2, true);
    let mut racked = preemptor("high", 2, 10);
    racked.gangs[0].topology.required = Some(RACK.into());
    let offer = group_offer(&a, &racked, 10, &Profile::default(), &[]);
    let victims: Vec<&str> = offer.steps.iter().map(|s| s.gang.name.as_str()).collect();
    assert_eq!(victims, ["p2", "p4"], "r1's victims cost least: {offer:?}");
    assert_eq!(
        offer
            .steps
            .last()
            .and_then(|s| s.hostable.get(&GangId::new("ns", "high"))),
        Some(&2)
    );
    // Unconstrained, the two cheapest anywhere make room.
    let free = group_offer(&a, &preemptor("high", 2, 10), 10, &Profile::default(), &[]);
    let victims: Vec<&str> = free.steps.iter().map(|s| s.gang.name.as_str()).collect();
    assert_eq!(victims, ["p1", "p2"], "{free:?}");
}
