//! Unit tests of the round pacing (`Activity` in mod.rs): busy while something can be
//! done now, else asleep until the first backoff, safety net or deadline comes due.

use super::*;
use gangway_core::ledger::meta::{MetaState, Retry};
use gangway_core::model::{Gang, GangGroup, GangMode, Member};

/// A meta state holding one group per `(name, wait_ms)`, each requeued at 1,000 ms
/// with `retry`; their records.
fn records(groups: &[(&str, u64)], retry: Retry) -> Vec<GroupRecord> {
    let mut m = MetaState::new(1);
    let mut out = Vec::new();
    for (name, wait_ms) in groups {
        let gang = Gang {
            name: (*name).into(),
            namespace: "default".into(),
            min_member: 1,
            total_number: 1,
            mode: GangMode::Strict,
            wait_time_ms: *wait_ms,
            priority: 0,
            creation_order: 0,
            members: vec![Member {
                name: "m0".into(),
                spec: PodSpec::default(),
                uid: None,
                binding: Default::default(),
                pod_selector: Default::default(),
            }],
            topology: Default::default(),
        };
        let MetaReply::Submitted { seq, .. } = m.apply(&MetaCommand::Submit {
            key: (*name).into(),
            group: GangGroup {
                id: (*name).into(),
                gangs: vec![gang],
                ..Default::default()
            },
            at_ms: 0,
            live_max: None,
        }) else {
            panic!("submit {name}");
        };
        m.apply(&MetaCommand::Requeue {
            seq,
            reason: "0/4 nodes are available".into(),
            at_ms: 1_000,
            attempts: Some(0),
            retry,
        });
        out.push(m.record(seq).expect("record").clone());
    }
    out
}

#[test]
fn a_round_with_nothing_to_do_now_sleeps_until_the_first_group_is_due() {
    assert_eq!(Activity::of(&[], 0, false, 1_000), Activity::Idle);
    assert_eq!(
        Activity::of(&[], 1, false, 1_000),
        Activity::Busy,
        "undelivered"
    );
    assert_eq!(
        Activity::of(&[], 0, true, 1_000),
        Activity::Busy,
        "a move runs"
    );

    let backing_off = records(&[("a", 0), ("b", 0)], Retry::Backoff);
    let due = backing_off
        .iter()
        .map(|r| r.not_before_ms)
        .min()
        .expect("due");
    assert!(due > 1_000, "{due}");
    assert_eq!(
        Activity::of(&backing_off, 0, false, 1_000),
        Activity::DueAt(due)
    );
    assert_eq!(
        Activity::of(&backing_off, 0, false, due),
        Activity::Busy,
        "due now"
    );

    // A deadline before the backoff ends is what comes due first.
    let expiring = records(&[("c", 1_050)], Retry::Backoff);
    let deadline = expiring[0].deadline_ms.expect("deadline");
    assert!(deadline < expiring[0].not_before_ms);
    assert_eq!(
        Activity::of(&expiring, 0, false, 1_000),
        Activity::DueAt(deadline)
    );
    assert_eq!(Activity::of(&expiring, 0, false, deadline), Activity::Busy);
}

#[test]
fn the_pause_stays_within_the_busy_and_idle_ticks() {
    assert_eq!(Activity::Busy.pause_ms(0), COORDINATOR_TICK_MS);
    assert_eq!(Activity::Idle.pause_ms(0), COORDINATOR_IDLE_TICK_MS);
    assert_eq!(Activity::DueAt(1_300).pause_ms(1_000), 300);
    assert_eq!(Activity::DueAt(1_001).pause_ms(1_000), COORDINATOR_TICK_MS);
    assert_eq!(
        Activity::DueAt(500).pause_ms(1_000),
        COORDINATOR_TICK_MS,
        "past"
    );
    assert_eq!(
        Activity::DueAt(60_000).pause_ms(1_000),
        COORDINATOR_IDLE_TICK_MS
    );
}
