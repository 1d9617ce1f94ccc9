use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn reservation(starts_by_ms: Option<u64>, preempts_below: Option<i32>) -> HeadReservation {
    HeadReservation {
        seq: 1,
        priority: 0,
        nodes: BTreeMap::from([(1, vec!["n0".to_string(), "n1".to_string()])]),
        starts_by_ms,
        preempts_below,
        made_at_ms: 0,
        expires_at_ms: 600_000,
    }
}

fn candidate(seq: GroupSeq, priority: i32, run_limit_ms: Option<u64>) -> Candidate {
    Candidate {
        seq,
        priority,
        run_limit_ms,
    }
}

#[test]
fn each_kind_of_group_stands_as_the_rule_says() {
    let r = reservation(Some(60_000), Some(0));
    let b = ReservationMode::Backfill;
    assert_eq!(use_of(&candidate(1, 0, None), &r, b, 0), Use::Own);
    assert_eq!(use_of(&candidate(2, 5, None), &r, b, 0), Use::Ahead);
    assert_eq!(
        use_of(&candidate(2, 0, Some(60_000)), &r, b, 0),
        Use::EndsBefore
    );
    // One ms too long, at equal priority: it could delay the start.
    assert_eq!(use_of(&candidate(2, 0, Some(60_001)), &r, b, 0), Use::Kept);
    assert_eq!(
        use_of(&candidate(2, 0, Some(10_000)), &r, b, 50_001),
        Use::Kept
    );
    assert_eq!(use_of(&candidate(2, -1, None), &r, b, 0), Use::Preemptible);
    // Without preemption, a lower priority does not help.
    let no_preemption = reservation(Some(60_000), None);
    assert_eq!(
        use_of(&candidate(2, -1, None), &no_preemption, b, 0),
        Use::Kept
    );
    // An unknown start admits no run-time backfill.
    let unknown = reservation(None, None);
    assert_eq!(use_of(&candidate(2, 0, Some(1)), &unknown, b, 0), Use::Kept);
    // Reserve only: nothing backfills; Off: nothing is kept.
    let reserve = ReservationMode::Reserve;
    assert_eq!(use_of(&candidate(2, 0, Some(1)), &r, reserve, 0), Use::Kept);
    assert_eq!(use_of(&candidate(2, -1, None), &r, reserve, 0), Use::Kept);
    assert_eq!(use_of(&candidate(2, 5, None), &r, reserve, 0), Use::Ahead);
    let off = ReservationMode::Off;
    assert!(use_of(&candidate(2, 0, None), &r, off, 0).allowed());
}

#[test]
fn kept_nodes_are_those_of_reservations_a_group_may_not_use() {
    let mut other = reservation(Some(10_000), None);
    other.seq = 7;
    other.nodes = BTreeMap::from([(1, vec!["n2".into()]), (2, vec!["m0".into()])]);
    let both = [reservation(Some(60_000), None), other];
    let c = candidate(3, 0, Some(20_000));
    // It ends before group 1 starts, not before group 7 does.
    let b = ReservationMode::Backfill;
    assert_eq!(kept_from(&c, &both, b, 0, 1), vec!["n2".to_string()]);
    assert_eq!(kept_from(&c, &both, b, 0, 2), vec!["m0".to_string()]);
    assert_eq!(kept_from(&c, &both, b, 0, 3), Vec::<String>::new());
    let all = all_reserved(&both);
    assert_eq!(all[&1], vec!["n0", "n1", "n2"]);
    assert_eq!(all[&2], vec!["m0"]);
}

#[test]
fn modes_read_from_their_names() {
    for mode in ReservationMode::ALL {
        assert_eq!(mode.name().parse::<ReservationMode>().ok(), Some(mode));
    }
    let err = "sometimes".parse::<ReservationMode>().err();
    assert!(err.is_some_and(|e| e.to_string().contains("off, reserve or backfill")));
}

fn placed(seq: GroupSeq, ends_at_ms: Option<u64>) -> PlacedEnd {
    PlacedEnd {
        seq,
        gangs: vec![GangId::new("ns".to_string(), format!("g{seq}"))],
        ends_at_ms,
        kubernetes: false,
    }
}

#[test]
fn the_search_tries_each_declared_end_once_and_stays_bounded() {
    let groups: Vec<PlacedEnd> = (0..100)
        .map(|i| placed(i, (i % 3 != 0).then_some(1_000 * (i % 50))))
        .collect();
    let instants = search_instants(&groups, 5_000, 1_000);
    // Ends at or before now count as now; none is unknown; each once.
    assert_eq!(instants.first(), Some(&5_000));
    assert_eq!(instants.last(), Some(&49_000));
    assert!(instants.windows(2).all(|w| w[0] < w[1]));
    let few = search_instants(&groups, 5_000, 8);
    assert!(few.len() <= 8, "{few:?}");
    assert_eq!(few.last(), Some(&49_000));
    assert_eq!(few.first(), Some(&5_000));
    let gone = gone_by(&groups, 2_000);
    assert!(gone
        .iter()
        .all(|g| matches!(g.name.as_str(), "g1" | "g2" | "g50" | "g52" | "g51")));
    assert!(gone_by(&groups, 0).iter().all(|g| g.name == "g50"));
}

/// One group running in the model below.
#[derive(Debug, Clone, Copy)]
struct Running {
    priority: i32,
    /// When it ends (None: it declared no limit and runs on).
    ends_at: Option<u64>,
    how: Use,
}

/// A group arriving in the model below: when, its priority against the reserved group
/// (0), its run-time limit and how much of it it runs, in seconds.
#[derive(Debug, Clone)]
struct Arrival {
    at_s: u64,
    priority: i32,
    limit_s: Option<u64>,
    runs_percent: u64,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0u64..40,
        -1i32..=1,
        proptest::option::of(1u64..60),
        1u64..=100,
    )
        .prop_map(|(at_s, priority, limit_s, runs_percent)| Arrival {
            at_s,
            priority,
            limit_s,
            runs_percent,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A reference model of a cluster of nodes, a few of them reserved for a group
    /// whose start is the latest declared end on them: groups arrive over time and each
    /// takes the first free node the rule opens to it, running at most its declared
    /// limit. At the reserved group's expected start, every reserved node is free but
    /// for groups ahead of it and groups it may preempt: no backfilled group delays it.
    #[test]
    fn no_backfilled_group_delays_the_reserved_group(
        nodes in 2usize..10,
        reserved in 1usize..6,
        first_ends_s in proptest::collection::vec(1u64..30, 10),
        preempts in any::<bool>(),
        backfill in any::<bool>(),
        arrivals in proptest::collection::vec(arrival(), 0..60),
    ) {
        let reserved = reserved.min(nodes);
        let mode = if backfill { ReservationMode::Backfill } else { ReservationMode::Reserve };
        // Every node busy at first; those reserved with groups of declared ends.
        let mut running: Vec<Option<Running>> = (0..nodes)
            .map(|i| {
                Some(Running {
                    priority: 0,
                    ends_at: (i < reserved || i % 2 == 0).then(|| first_ends_s[i] * 1_000),
                    how: Use::Kept,
                })
            })
            .collect();
        let starts_by = (0..reserved)
            .filter_map(|i| running[i].and_then(|r| r.ends_at))
            .max();
        let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
        let r = HeadReservation {
            seq: 1,
            priority: 0,
            nodes: BTreeMap::from([(1, names[..reserved].to_vec())]),
            starts_by_ms: starts_by,
            preempts_below: preempts.then_some(0),
            made_at_ms: 0,
            expires_at_ms: 3_600_000,
        };
        let mut arrivals = arrivals;
        arrivals.sort_by_key(|a| a.at_s);
        let start = starts_by.unwrap_or(0);
        for (i, a) in arrivals.iter().enumerate() {
            let now = a.at_s * 1_000;
            if now >= start {
                break;
            }
            for slot in running.iter_mut() {
                if slot.is_some_and(|r| r.ends_at.is_some_and(|end| end <= now)) {
                    *slot = None;
                }
            }
            let c = Candidate {
                seq: 10 + i as u64,
                priority: a.priority,
                run_limit_ms: a.limit_s.map(|s| s * 1_000),
            };
            let kept = kept_from(&c, std::slice::from_ref(&r), mode, now, 1);
            let free = (0..nodes).find(|n| running[*n].is_none() && !kept.contains(&names[*n]));
            if let Some(n) = free {
                let how = if n < reserved { use_of(&c, &r, mode, now) } else { Use::Kept };
                running[n] = Some(Running {
                    priority: a.priority,
                    ends_at: a.limit_s.map(|s| now + s * 1_000 * a.runs_percent / 100),
                    how,
                });
            }
        }
        for (n, slot) in running.iter().enumerate().take(reserved) {
            let Some(job) = slot else { continue };
            let ended = job.ends_at.is_some_and(|end| end <= start);
            let allowed = job.priority > 0
                || (r.preempts_below.is_some_and(|below| job.priority < below)
                    && mode == ReservationMode::Backfill);
            prop_assert!(
                ended || allowed,
                "node n{n} still runs {job:?} at the reserved group's start {start} ms"
            );
            prop_assert!(job.how.allowed() || ended, "{job:?} on reserved node n{n}");
        }
    }
}
