//! Unit tests of `mod.rs` (replicated).

use super::*;
use gangway_core::ledger::{LedgerCommand, LedgerOp};
use gangway_core::model::{Node, Resources};

fn shard_machine(format: WireFormat) -> Box<dyn StateMachine> {
    machine_for(
        1,
        4,
        format,
        &Failpoints::disabled(),
        &SelectorWarmer::inline(),
        &wake::WakeBoard::default(),
    )
}

fn meta_machine(format: WireFormat) -> Box<dyn StateMachine> {
    machine_for(
        META_GROUP,
        4,
        format,
        &Failpoints::disabled(),
        &SelectorWarmer::inline(),
        &wake::WakeBoard::default(),
    )
}

fn register(at_ms: u64, name: &str) -> LedgerCommand {
    let node = Node::new(
        name,
        Resources {
            cpu_milli: 4000,
            memory_bytes: 1 << 30,
            pods: 10,
            ..Resources::zero()
        },
    );
    LedgerCommand {
        at_ms,
        op: LedgerOp::RegisterNode { node },
    }
}

/// A typed read (the leader reading its own state machine) answers what the encoded
/// query answers, in both formats.
#[test]
fn typed_reads_answer_as_encoded_queries_do() {
    for format in [WireFormat::Binary, WireFormat::Json] {
        let mut shard = shard_machine(format);
        for (i, name) in ["n1", "n2", "n3"].iter().enumerate() {
            shard.apply(
                i as u64 + 1,
                &encode(&register(i as u64, name)).expect("encodes"),
            );
        }
        for q in [
            ShardQuery::Capacity,
            ShardQuery::NodeWeights,
            ShardQuery::Unbound { limit: 10 },
        ] {
            let encoded: ShardAnswer =
                decode(&shard.query(&encode(&q).expect("encodes"))).expect("decodes");
            let typed = shard
                .as_any()
                .downcast_ref::<ShardMachine>()
                .expect("a shard machine")
                .answer(q.clone());
            assert_eq!(typed, encoded, "{q:?}");
        }
        let mut meta = meta_machine(format);
        let place = MetaCommand::PlaceNode {
            node: "n1".into(),
            domain: Some("a".into()),
            at_ms: 0,
        };
        meta.apply(1, &encode(&place).expect("encodes"));
        for q in [
            MetaQuery::ShardSet,
            MetaQuery::ShardMap,
            MetaQuery::ShardShares,
            MetaQuery::Groups { active_only: false },
        ] {
            let encoded: MetaReply =
                decode(&meta.query(&encode(&q).expect("encodes"))).expect("decodes");
            let typed = meta
                .as_any()
                .downcast_ref::<MetaMachine>()
                .expect("a meta machine")
                .state
                .query(&q);
            assert_eq!(typed, encoded, "{q:?}");
        }
        assert!(
            meta.as_any().downcast_ref::<ShardMachine>().is_none(),
            "a meta machine is no shard machine"
        );
    }
}

/// A replica upgraded in place restores the JSON snapshot the old release wrote,
/// applies the JSON entries after it, then binary ones, and ends in the state a
/// replica that only ever wrote binary reaches (and answers in its own format).
#[test]
fn json_snapshots_and_entries_from_before_the_upgrade_restore_and_replay() {
    let mut old = shard_machine(WireFormat::Json);
    let mut fresh = shard_machine(WireFormat::Binary);
    for (i, name) in ["n1", "n2"].iter().enumerate() {
        let cmd = register(i as u64, name);
        old.apply(i as u64 + 1, &WireFormat::Json.encode(&cmd).expect("json"));
        fresh.apply(i as u64 + 1, &encode(&cmd).expect("binary"));
    }
    let json_snapshot = old.snapshot();
    assert_eq!(json_snapshot.first(), Some(&b'{'));
    let mut upgraded = shard_machine(WireFormat::Binary);
    upgraded
        .restore(&json_snapshot)
        .expect("JSON snapshot restores");
    assert_eq!(upgraded.snapshot(), fresh.snapshot());
    let from_json_log = register(3, "n3");
    let reply = upgraded.apply(3, &WireFormat::Json.encode(&from_json_log).expect("json"));
    assert_eq!(reply.first(), Some(&gangway_core::wire::BINARY_V1));
    fresh.apply(3, &encode(&from_json_log).expect("binary"));
    let after = register(4, "n4");
    upgraded.apply(4, &encode(&after).expect("binary"));
    fresh.apply(4, &encode(&after).expect("binary"));
    assert_eq!(upgraded.snapshot(), fresh.snapshot());

    let mut meta_old = meta_machine(WireFormat::Json);
    let meta_json = meta_old.snapshot();
    assert_eq!(meta_json.first(), Some(&b'{'));
    let mut meta_upgraded = meta_machine(WireFormat::Binary);
    meta_upgraded
        .restore(&meta_json)
        .expect("JSON meta snapshot restores");
    assert_eq!(
        meta_upgraded.snapshot(),
        meta_machine(WireFormat::Binary).snapshot()
    );
    meta_old
        .restore(&meta_upgraded.snapshot())
        .expect("binary restores too");
    assert_eq!(meta_old.snapshot(), meta_json);
}

#[test]
fn malformed_command_is_rejected_and_changes_nothing() {
    let mut m = shard_machine(WireFormat::Binary);
    let before = m.snapshot();
    let reply: ShardOutcome = decode(&m.apply(1, b"{not json")).expect("reply decodes");
    assert!(matches!(reply, ShardOutcome::Malformed { .. }));
    assert_eq!(before, m.snapshot());
    let mut meta = meta_machine(WireFormat::Binary);
    let reply: MetaReply = decode(&meta.apply(1, b"[]")).expect("reply decodes");
    assert!(matches!(reply, MetaReply::Rejected { .. }));
}

#[test]
fn admission_refuses_what_no_replica_builds_before_it_takes_an_index() {
    let shard = shard_machine(WireFormat::Binary)
        .admission()
        .expect("shards check commands");
    let meta = meta_machine(WireFormat::Binary)
        .admission()
        .expect("meta checks commands");
    assert!(shard(b"{not json").is_err());
    assert!(meta(b"[]").is_err());
    let tick = encode(&LedgerCommand::new(5, LedgerOp::Tick)).expect("encode");
    assert_eq!(shard(&tick), Ok(()));
    let forever = LedgerCommand::new(
        5,
        LedgerOp::Reserve {
            txn_id: gangway_core::ledger::TxnId(1),
            members: vec![gangway_core::ledger::ReserveMember {
                member: gangway_core::model::MemberKey::new("ns", "g", "m"),
                node: "n1".into(),
                pod: gangway_core::model::pod::PodSummary::default(),
            }],
            deadline_ms: u64::MAX,
            network: Vec::new(),
        },
    );
    let refused = shard(&encode(&forever).expect("encode")).expect_err("held for ever");
    assert!(refused.contains("more than"), "{refused}");
    let nested = LedgerCommand::new(
        5,
        LedgerOp::Batch {
            ops: vec![LedgerOp::Batch { ops: Vec::new() }],
        },
    );
    assert!(shard(&encode(&nested).expect("encode")).is_err());
}

#[test]
fn shard_snapshot_round_trips_through_restore() {
    let mut m = shard_machine(WireFormat::Binary);
    let cmd = register(5, "n1");
    let reply: ShardOutcome =
        decode(&m.apply(1, &encode(&cmd).expect("encodes"))).expect("reply decodes");
    assert!(
        matches!(
            reply,
            ShardOutcome::Applied(LedgerReply::NodeRegistered { .. })
        ),
        "{reply:?}"
    );
    let snap = m.snapshot();
    let mut other = shard_machine(WireFormat::Binary);
    other.restore(&snap).expect("restore");
    assert_eq!(other.snapshot(), snap);
}

/// A meta submission of a one-pod group named `name`.
fn submit(name: &str, at_ms: u64) -> Vec<u8> {
    let gang = gangway_core::model::Gang {
        name: name.into(),
        namespace: "ns".into(),
        min_member: 1,
        total_number: 1,
        mode: gangway_core::model::GangMode::Strict,
        wait_time_ms: 0,
        priority: 0,
        creation_order: 0,
        members: vec![gangway_core::model::Member {
            name: "w".into(),
            spec: Default::default(),
            uid: None,
            binding: Default::default(),
            pod_selector: Default::default(),
        }],
        topology: Default::default(),
    };
    let cmd = MetaCommand::Submit {
        key: name.into(),
        group: gangway_core::model::GangGroup {
            id: name.into(),
            gangs: vec![gang],
            ..Default::default()
        },
        at_ms,
        live_max: None,
    };
    encode(&cmd).expect("encodes")
}

/// The copy a meta snapshot is encoded from, off the lock, is the state when it was
/// taken: the commands applied while it is encoded do not reach it.
#[test]
fn a_meta_snapshot_writer_encodes_the_state_it_was_taken_at() {
    let mut meta = meta_machine(WireFormat::Binary);
    for i in 0..20 {
        meta.apply(i + 1, &submit(&format!("g{i}"), i));
    }
    let then = meta.snapshot();
    let writer = meta.snapshot_writer();
    for i in 20..40 {
        meta.apply(i + 1, &submit(&format!("g{i}"), i));
    }
    let cancel = MetaCommand::Cancel { seq: 1, at_ms: 50 };
    meta.apply(41, &encode(&cancel).expect("encodes"));
    assert_eq!(
        writer(),
        then,
        "the writer encodes the state it was taken at"
    );
    assert_ne!(meta.snapshot(), then);
    let mut restored = meta_machine(WireFormat::Binary);
    restored.restore(&then).expect("restores");
    assert_eq!(restored.snapshot(), then);
}
