//! Tests of the cross-shard victim choice, against a reference that tries every set
//! of eligible units with its own reading of the offers.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn g(name: &str) -> GangId {
    GangId::new("ns", name)
}

fn counts(pairs: &[(&str, u32)]) -> BTreeMap<GangId, u32> {
    pairs.iter().map(|(n, c)| (g(n), *c)).collect()
}

fn step(evict: &[&str], hostable: &[(&str, u32)]) -> OfferStep {
    OfferStep {
        evict: evict.iter().map(|n| g(n)).collect(),
        hostable: counts(hostable),
    }
}

fn unit(priority: i32, pods: u32) -> VictimUnit {
    VictimUnit { priority, pods }
}

#[test]
fn a_group_that_fits_evicts_nothing() {
    let units = BTreeMap::from([(g("low"), unit(1, 8))]);
    let offers = BTreeMap::from([(
        1,
        ShardOffer {
            hostable_now: counts(&[("high", 8)]),
            steps: vec![step(&["low"], &[("high", 8)])],
        },
    )]);
    let chosen = choose_victims(&units, &offers, &counts(&[("high", 8)]), 10);
    assert_eq!(chosen.map(|c| c.evict), Some(BTreeSet::new()));
}

#[test]
fn a_gang_across_two_shards_is_evicted_whole_for_a_gang_needing_both() {
    // "low" (8 pods, 4 on each shard) fills both shards; "high" needs 8.
    let units = BTreeMap::from([(g("low"), unit(1, 8))]);
    let offer = ShardOffer {
        hostable_now: counts(&[("high", 0)]),
        steps: vec![step(&["low"], &[("high", 4)])],
    };
    let offers = BTreeMap::from([(1, offer.clone()), (2, offer)]);
    let chosen = choose_victims(&units, &offers, &counts(&[("high", 8)]), 10);
    let chosen = chosen.expect("a plan");
    assert_eq!(chosen.evict, BTreeSet::from([g("low")]));
    assert_eq!(chosen.steps_used, BTreeMap::from([(1, 1), (2, 1)]));
}

#[test]
fn a_group_of_two_gangs_is_costed_whole() {
    // Gangs "a1" (2 pods, shard 1) and "a2" (6 pods, shard 2) are one group; "b" (3
    // pods, shard 2) is another. Evicting a1 alone would make room, but a1 takes a2
    // with it: 8 pods, against b's 3.
    let units = BTreeMap::from([
        (g("a1"), unit(1, 2)),
        (g("a2"), unit(1, 6)),
        (g("b"), unit(1, 3)),
    ]);
    let offers = BTreeMap::from([
        (
            1,
            ShardOffer {
                hostable_now: counts(&[("high", 0)]),
                steps: vec![step(&["a1"], &[("high", 2)])],
            },
        ),
        (
            2,
            ShardOffer {
                hostable_now: counts(&[("high", 0)]),
                steps: vec![step(&["b"], &[("high", 2)]), step(&["a2"], &[("high", 4)])],
            },
        ),
    ]);
    let need = counts(&[("high", 2)]);
    let by_gang = choose_victims(&units, &offers, &need, 10).expect("a plan");
    assert_eq!(
        by_gang.evict,
        BTreeSet::from([g("a1")]),
        "per gang, a1 is cheapest"
    );
    let group = vec![g("a1"), g("a2")];
    let gangs_of = BTreeMap::from([
        (g("a1"), group.clone()),
        (g("a2"), group),
        (g("b"), vec![g("b")]),
    ]);
    let (units, offers) = by_group(&units, &offers, &gangs_of, &BTreeSet::new());
    assert_eq!(units[&g("a1")], unit(1, 8), "one unit for the group");
    assert!(!units.contains_key(&g("a2")));
    let whole = choose_victims(&units, &offers, &need, 10).expect("a plan");
    assert_eq!(
        whole.evict,
        BTreeSet::from([g("b")]),
        "the group costs 8 pods"
    );

    // A group with a gang some shard names ineligible is no unit.
    let (units, offers) = by_group(
        &BTreeMap::from([(g("a1"), unit(1, 2)), (g("b"), unit(1, 3))]),
        &offers,
        &gangs_of,
        &BTreeSet::from([g("a2")]),
    );
    assert!(!units.contains_key(&g("a1")));
    let only_b = choose_victims(&units, &offers, &need, 10).expect("a plan");
    assert_eq!(only_b.evict, BTreeSet::from([g("b")]));
}

#[test]
fn equal_priority_is_never_a_victim() {
    let units = BTreeMap::from([(g("peer"), unit(10, 8))]);
    let offers = BTreeMap::from([(
        1,
        ShardOffer {
            hostable_now: BTreeMap::new(),
            steps: vec![step(&["peer"], &[("high", 8)])],
        },
    )]);
    assert_eq!(
        choose_victims(&units, &offers, &counts(&[("high", 8)]), 10),
        None
    );
}

#[test]
fn nothing_is_evicted_when_even_every_victim_leaves_too_little_room() {
    let units = BTreeMap::from([(g("a"), unit(1, 4)), (g("b"), unit(1, 4))]);
    let offers = BTreeMap::from([(
        1,
        ShardOffer {
            hostable_now: BTreeMap::new(),
            steps: vec![step(&["a"], &[("high", 3)]), step(&["b"], &[("high", 7)])],
        },
    )]);
    assert_eq!(
        choose_victims(&units, &offers, &counts(&[("high", 8)]), 10),
        None
    );
}

#[test]
fn lower_priorities_are_evicted_before_fewer_pods() {
    // Shard 1 frees room by evicting one pod of priority 5; shard 2 by four pods of 1.
    let units = BTreeMap::from([(g("mid"), unit(5, 1)), (g("low"), unit(1, 4))]);
    let offers = BTreeMap::from([
        (
            1,
            ShardOffer {
                hostable_now: BTreeMap::new(),
                steps: vec![step(&["mid"], &[("high", 2)])],
            },
        ),
        (
            2,
            ShardOffer {
                hostable_now: BTreeMap::new(),
                steps: vec![step(&["low"], &[("high", 2)])],
            },
        ),
    ]);
    let chosen = choose_victims(&units, &offers, &counts(&[("high", 2)]), 10).expect("a plan");
    assert_eq!(chosen.evict, BTreeSet::from([g("low")]));
}

#[test]
fn every_gang_of_a_gang_group_reaches_its_minimum() {
    let units = BTreeMap::from([(g("x"), unit(1, 2)), (g("y"), unit(2, 2))]);
    let offers = BTreeMap::from([(
        1,
        ShardOffer {
            hostable_now: counts(&[("a", 2)]),
            steps: vec![
                step(&["x"], &[("a", 4), ("b", 0)]),
                step(&["y"], &[("a", 4), ("b", 2)]),
            ],
        },
    )]);
    let need = counts(&[("a", 2), ("b", 2)]);
    let chosen = choose_victims(&units, &offers, &need, 10).expect("a plan");
    assert_eq!(chosen.evict, BTreeSet::from([g("x"), g("y")]));
}

/// The reference reading of the offers: a shard hosts what its longest prefix of
/// steps all of whose units are evicted says.
fn reference_fits(
    offers: &BTreeMap<u32, ShardOffer>,
    need: &BTreeMap<GangId, u32>,
    evicted: &BTreeSet<GangId>,
    preemptor_priority: i32,
    units: &BTreeMap<GangId, VictimUnit>,
) -> bool {
    let mut total: BTreeMap<&GangId, u64> = BTreeMap::new();
    for offer in offers.values() {
        let mut counts = &offer.hostable_now;
        for s in &offer.steps {
            let usable = s.evict.iter().all(|u| {
                evicted.contains(u)
                    && units
                        .get(u)
                        .is_some_and(|u| u.priority < preemptor_priority)
            });
            if !usable {
                break;
            }
            counts = &s.hostable;
        }
        for (gang, n) in counts {
            *total.entry(gang).or_default() += u64::from(*n);
        }
    }
    need.iter()
        .all(|(gang, min)| total.get(gang).copied().unwrap_or(0) >= u64::from(*min))
}

/// Random units, offers and needs: victim units (as many as `units` says), shards (as
/// many as `shards` says) of up to `max_steps` steps of 1–2 units, 1–2 preemptor gangs.
fn scenario(
    units: std::ops::RangeInclusive<usize>,
    shards: std::ops::RangeInclusive<usize>,
    max_steps: usize,
) -> impl Strategy<
    Value = (
        BTreeMap<GangId, VictimUnit>,
        BTreeMap<u32, ShardOffer>,
        BTreeMap<GangId, u32>,
    ),
> {
    let units = prop::collection::vec((0i32..12, 1u32..9), units);
    (units, shards, 1usize..=2).prop_flat_map(move |(units, shards, gangs)| {
        let n = units.len();
        let step = (
            prop::collection::vec(0..n, 1..3),
            prop::collection::vec(0u32..5, gangs),
        );
        let offer = (
            prop::collection::vec(0u32..3, gangs),
            prop::collection::vec(step, 0..=max_steps),
        );
        let offers = prop::collection::vec(offer, shards);
        let need = prop::collection::vec(1u32..(4 * max_steps as u32 + 6), gangs);
        (Just(units), offers, need).prop_map(move |(units, offers, need)| {
            let name = |i: usize| g(&format!("u{i}"));
            let gang = |i: usize| g(&format!("p{i}"));
            let units: BTreeMap<GangId, VictimUnit> = units
                .into_iter()
                .enumerate()
                .map(|(i, (priority, pods))| (name(i), VictimUnit { priority, pods }))
                .collect();
            let offers = offers
                .into_iter()
                .enumerate()
                .map(|(s, (now, steps))| {
                    // Hostable counts never fall as a shard evicts more.
                    let mut running: Vec<u32> = now.clone();
                    let steps = steps
                        .into_iter()
                        .map(|(evict, gains)| {
                            for (r, add) in running.iter_mut().zip(gains) {
                                *r += add;
                            }
                            let evict: BTreeSet<usize> = evict.into_iter().collect();
                            OfferStep {
                                evict: evict.into_iter().map(name).collect(),
                                hostable: running
                                    .iter()
                                    .enumerate()
                                    .map(|(i, c)| (gang(i), *c))
                                    .collect(),
                            }
                        })
                        .collect();
                    let offer = ShardOffer {
                        hostable_now: now.iter().enumerate().map(|(i, c)| (gang(i), *c)).collect(),
                        steps,
                    };
                    (s as u32 + 1, offer)
                })
                .collect();
            let need = need
                .into_iter()
                .enumerate()
                .map(|(i, n)| (gang(i), n))
                .collect();
            (units, offers, need)
        })
    })
}

proptest! {
    /// Up to EXACT_UNITS_MAX units: the choice fits, evicts only units of lower
    /// priority, costs exactly what the cheapest fitting set costs, and is `None`
    /// exactly when no set of eligible units fits.
    #[test]
    fn small_choices_are_the_cheapest_that_fit(
        (units, offers, need) in scenario(1..=8, 1..=3, 4),
        preemptor in 0i32..12,
    ) {
        let chosen = choose_victims(&units, &offers, &need, preemptor);
        let eligible: Vec<&GangId> = units.iter().filter(|(_, u)| u.priority < preemptor).map(|(g, _)| g).collect();
        let mut best: Option<Cost> = None;
        for mask in 0u32..(1u32 << eligible.len()) {
            let set: BTreeSet<GangId> = eligible.iter().enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0).map(|(_, g)| (*g).clone()).collect();
            if reference_fits(&offers, &need, &set, preemptor, &units) {
                let cost = cost_of(&units, &set);
                if best.as_ref().is_none_or(|b| cost.clone().without_names() < b.clone().without_names()) {
                    best = Some(cost);
                }
            }
        }
        match (&chosen, &best) {
            (None, None) => {}
            (Some(c), Some(b)) => {
                prop_assert!(reference_fits(&offers, &need, &c.evict, preemptor, &units), "chosen {:?} does not fit", c.evict);
                for v in &c.evict {
                    prop_assert!(units[v].priority < preemptor, "victim {} of priority {} for {}", v, units[v].priority, preemptor);
                }
                prop_assert_eq!(cost_of(&units, &c.evict).without_names(), b.clone().without_names());
            }
            (c, b) => prop_assert!(false, "chosen {:?}, cheapest {:?}", c, b),
        }
    }

    /// Above EXACT_UNITS_MAX (the greedy path): the choice fits, evicts only units of
    /// lower priority, and no single unit of it could be spared.
    #[test]
    fn large_choices_fit_and_spare_no_unit(
        (units, offers, need) in scenario(13..=30, 2..=4, 8),
        preemptor in 0i32..12,
    ) {
        let Some(c) = choose_victims(&units, &offers, &need, preemptor) else {
            let eligible: BTreeSet<GangId> = units.iter().filter(|(_, u)| u.priority < preemptor).map(|(g, _)| g.clone()).collect();
            prop_assert!(!reference_fits(&offers, &need, &eligible, preemptor, &units), "None, but every eligible unit fits");
            return Ok(());
        };
        prop_assert!(reference_fits(&offers, &need, &c.evict, preemptor, &units));
        for v in &c.evict {
            prop_assert!(units[v].priority < preemptor);
            let mut without = c.evict.clone();
            without.remove(v);
            prop_assert!(!reference_fits(&offers, &need, &without, preemptor, &units), "{} could be spared from {:?}", v, c.evict);
        }
    }
}

impl Cost {
    /// The cost without the tie-break by names (two sets may cost the same).
    fn without_names(self) -> (i32, u64, i64) {
        (self.max_priority, self.pods, self.priority_sum)
    }
}
