//! Unit tests of `queues.rs`.

use super::*;
use crate::model::queue::Limits;
use crate::model::ResourceName;
use proptest::prelude::*;

fn cpu(cores: u64) -> Resources {
    let mut r = Resources::zero();
    r.set(&ResourceName::Cpu, cores * 1_000);
    r
}

fn queue(name: &str, parent: &str, max_cores: Option<u64>) -> QueueSpec {
    let mut max = Limits::none();
    if let Some(c) = max_cores {
        max.set(&ResourceName::Cpu, c * 1_000);
    }
    QueueSpec {
        name: name.into(),
        parent: parent.into(),
        weight: 1,
        min: Limits::none(),
        max,
        lend: crate::model::queue::Limits::none(),
        managed_by: String::new(),
        namespaces: Vec::new(),
    }
}

#[test]
fn a_charge_counts_for_every_ancestor_and_any_max_on_the_chain_refuses() {
    let mut q = Queues::default();
    q.put(&queue("org", "", Some(10))).expect("org");
    q.put(&queue("a", "org", Some(8))).expect("a");
    q.put(&queue("b", "org", None)).expect("b");
    assert_eq!(q.refusal("a", &cpu(8)), None);
    q.charge("a", &cpu(6));
    assert_eq!(q.usage("org"), cpu(6));
    let own = q.refusal("a", &cpu(3)).expect("a's max");
    assert!(
        own.starts_with("queue a has no room: cpu 3 asked, 6 used of max 8"),
        "{own}"
    );
    let up = q.refusal("b", &cpu(5)).expect("org's max");
    assert!(
        up.starts_with("queue b's ancestor org has no room: cpu 5 asked, 6 used of max 10"),
        "{up}"
    );
    assert_eq!(q.refusal("b", &cpu(4)), None, "b borrows up to org's max");
    q.refund("a", &cpu(6));
    assert_eq!(q.usage("org"), Resources::zero());
}

#[test]
fn a_tree_stays_a_tree_and_max_never_drops_below_usage() {
    let mut q = Queues::default();
    q.put(&queue("org", "", None)).expect("org");
    q.put(&queue("a", "org", None)).expect("a");
    let cycle = q.put(&queue("org", "a", None)).expect_err("cycle");
    assert!(cycle.starts_with("queue.parent:"), "{cycle}");
    let orphan = q
        .put(&queue("c", "nowhere", None))
        .expect_err("unknown parent");
    assert!(orphan.contains("no queue nowhere"), "{orphan}");
    q.charge("a", &cpu(5));
    let low = q.put(&queue("a", "org", Some(4))).expect_err("below usage");
    assert!(low.starts_with("queue.max.cpu: 4 is below"), "{low}");
    q.put(&queue("small", "", Some(2))).expect("small");
    let squeeze = q.put(&queue("a", "small", None)).expect_err("does not fit");
    assert!(
        squeeze.contains("ancestor") || squeeze.contains("queue small"),
        "{squeeze}"
    );
    q.put(&queue("big", "", Some(5))).expect("big");
    q.put(&queue("a", "big", None))
        .expect("moves with its usage");
    assert_eq!(q.usage("org"), Resources::zero());
    assert_eq!(q.usage("big"), cpu(5));
    let busy = q.delete("a", 1).expect_err("live group");
    assert!(busy.contains("1 gang groups"), "{busy}");
    let parent = q.delete("big", 0).expect_err("has a child");
    assert!(parent.contains("child queue a"), "{parent}");
}

/// The fair order of (queue, charge, item) groups, taken whole.
fn ordered<T>(q: &Queues, groups: Vec<(String, Resources, T)>) -> Vec<T> {
    q.fair_order(
        groups
            .into_iter()
            .map(|(queue, c, item)| (queue, (c, item)))
            .collect(),
        |(c, _)| c.clone(),
    )
    .map(|(_, item)| item)
    .collect()
}

/// The fair order as its definition reads, recomputing every share at each pick: from
/// the top, the lowest of the children with a group left in their subtree (by the
/// subtree's usage) and the queue's own groups (by their own usage), ties to the
/// child's name and own groups last.
fn reference_order(q: &Queues, groups: &[(String, Resources, u32)]) -> Vec<u32> {
    let known = |queue: &str| !queue.is_empty() && q.spec(queue).is_some();
    let mut out: Vec<u32> = groups
        .iter()
        .filter(|(queue, _, _)| !known(queue))
        .map(|(_, _, id)| *id)
        .collect();
    let mut taken: Vec<bool> = groups.iter().map(|(queue, _, _)| !known(queue)).collect();
    let below = |queue: &str, top: &str| q.chain(queue).any(|s| s.name == top);
    // Usage now, plus the decayed usage while fair sharing over time is on.
    let measured = |name: &str| match q.history() {
        Some(h) => q.usage(name).saturating_add(&h.decayed(name)),
        None => q.usage(name),
    };
    let own_usage = |name: &str| {
        let children = q
            .specs()
            .filter(|s| s.parent == name)
            .fold(Resources::zero(), |acc, s| {
                acc.saturating_add(&measured(&s.name))
            });
        measured(name).saturating_sub(&children)
    };
    loop {
        let mut at = String::new();
        let head = loop {
            let mut best: Option<(Share, Slot)> = None;
            for spec in q.specs().filter(|s| s.parent == at) {
                if !(0..groups.len()).any(|i| !taken[i] && below(&groups[i].0, &spec.name)) {
                    continue;
                }
                let mut used = measured(&spec.name);
                for (i, (queue, charge, _)) in groups.iter().enumerate() {
                    if taken[i] && known(queue) && below(queue, &spec.name) {
                        used = used.saturating_add(charge);
                    }
                }
                let cand = (share(spec, &used), Slot::Child(spec.name.clone()));
                if best.as_ref().is_none_or(|b| cand < *b) {
                    best = Some(cand);
                }
            }
            if let Some(spec) = q.spec(&at) {
                let own_head = (0..groups.len()).find(|&i| !taken[i] && groups[i].0 == at);
                if own_head.is_some() {
                    let mut used = own_usage(&at);
                    for (i, (queue, charge, _)) in groups.iter().enumerate() {
                        if taken[i] && *queue == at {
                            used = used.saturating_add(charge);
                        }
                    }
                    let cand = (share(spec, &used), Slot::Own);
                    if best.as_ref().is_none_or(|b| cand < *b) {
                        best = Some(cand);
                    }
                }
            }
            match best {
                None => break None,
                Some((_, Slot::Own)) => {
                    break (0..groups.len()).find(|&i| !taken[i] && groups[i].0 == at)
                }
                Some((_, Slot::Child(c))) => at = c,
            }
        };
        let Some(head) = head else {
            return out;
        };
        taken[head] = true;
        out.push(groups[head].2);
    }
}

/// Queues (weight, min cores, cores used, parent pick) and groups (queue, cores,
/// pods). Queue i's parent is queue `pick % (i + 1)`, or none when that is i itself.
fn arb_queues() -> impl Strategy<Value = (Vec<(u32, u64, u64, u8)>, Vec<(u8, u64, u64)>)> {
    (
        prop::collection::vec((1u32..4, 0u64..6, 0u64..4, 0u8..8), 1..7),
        prop::collection::vec((0u8..8, 1u64..4, 0u64..3), 0..30),
    )
}

/// Fair sharing over time: off, or the usage sampled after this many ms of a one-second
/// half-life, then this many more cores charged to every queue of an odd index (so
/// the decayed usage and the usage now differ).
fn arb_history() -> impl Strategy<Value = Option<(u64, u64)>> {
    prop::option::of((1u64..5_000, 0u64..4))
}

proptest::proptest! {
    /// The fair order matches its definition over random trees of queues (weights,
    /// mins, usage) and groups (charges), groups without a queue included.
    #[test]
    fn the_fair_order_matches_the_reference((qs, gs) in arb_queues(), history in arb_history()) {
        let mut q = Queues::default();
        for (i, (weight, min, used, pick)) in qs.iter().enumerate() {
            let parent = usize::from(*pick) % (i + 1);
            let parent = if parent == i { String::new() } else { format!("q{parent}") };
            let mut spec = queue(&format!("q{i}"), &parent, None);
            spec.weight = *weight;
            if *min > 0 {
                spec.min.set(&ResourceName::Cpu, min * 1_000);
            }
            q.put(&spec).expect("queue");
            let mut usage = cpu(*used);
            usage.pods = *used;
            q.charge(&spec.name, &usage);
        }
        if let Some((after_ms, more)) = history {
            q.sample_usage(0, 1_000).expect("start");
            q.sample_usage(after_ms, 1_000).expect("sample");
            for i in (1..qs.len()).step_by(2) {
                q.charge(&format!("q{i}"), &cpu(more));
            }
        }
        let groups: Vec<(String, Resources, u32)> = gs
            .iter()
            .enumerate()
            .map(|(i, (qi, cores, pods))| {
                let name = if usize::from(*qi) < qs.len() { format!("q{qi}") } else { String::new() };
                let mut charge = cpu(*cores);
                charge.pods = *pods;
                (name, charge, i as u32)
            })
            .collect();
        let fast = ordered(&q, groups.clone());
        proptest::prop_assert_eq!(fast, reference_order(&q, &groups));
    }
}

#[test]
fn siblings_share_fairly_inside_their_parent_before_the_parent_competes() {
    // org (weight 1) holds a and b; solo (weight 1) is alone. org's subtree already
    // uses 4 of its min 8; solo uses 2 of 8. a and b each use 2 of their min 4.
    let mut q = Queues::default();
    let with_min = |name: &str, parent: &str, cores: u64| {
        let mut s = queue(name, parent, None);
        s.min.set(&ResourceName::Cpu, cores * 1_000);
        s
    };
    q.put(&with_min("org", "", 8)).expect("org");
    q.put(&with_min("solo", "", 8)).expect("solo");
    q.put(&with_min("a", "org", 4)).expect("a");
    q.put(&with_min("b", "org", 4)).expect("b");
    q.charge("a", &cpu(2));
    q.charge("b", &cpu(2));
    q.charge("solo", &cpu(2));
    let groups: Vec<(String, Resources, &str)> = vec![
        ("a".into(), cpu(2), "a1"),
        ("a".into(), cpu(2), "a2"),
        ("b".into(), cpu(2), "b1"),
        ("solo".into(), cpu(2), "s1"),
        ("solo".into(), cpu(2), "s2"),
    ];
    // solo 2/8 < org 4/8: s1 (solo 4/8 ties org, name order: org). Inside org a and
    // b tie at 2/4: a1 (org 6/8, a 4/4). solo 4/8 < 6/8: s2 (6/8, ties, org first).
    // Inside org, b 2/4 < a 4/4: b1. Then a2.
    assert_eq!(ordered(&q, groups), vec!["s1", "a1", "s2", "b1", "a2"]);
}

#[test]
fn a_queue_over_its_share_never_starves_one_below() {
    let mut q = Queues::default();
    let mut heavy = queue("heavy", "", None);
    heavy.min.set(&ResourceName::Cpu, 4_000);
    let mut light = queue("light", "", None);
    light.min.set(&ResourceName::Cpu, 4_000);
    light.weight = 2;
    q.put(&heavy).expect("heavy");
    q.put(&light).expect("light");
    q.charge("heavy", &cpu(6));
    let groups: Vec<(String, Resources, &str)> = vec![
        ("heavy".into(), cpu(1), "h1"),
        ("heavy".into(), cpu(1), "h2"),
        ("light".into(), cpu(2), "l1"),
        ("light".into(), cpu(2), "l2"),
        ("".into(), cpu(9), "free"),
    ];
    assert_eq!(
        ordered(&q, groups),
        vec!["free", "l1", "l2", "h1", "h2"],
        "light (weight 2) stays below heavy's share 6/4 after taking 4 cores: 4/4/2"
    );
}

fn lender(name: &str, parent: &str, min_cores: u64, lend_cores: Option<u64>) -> QueueSpec {
    let mut q = queue(name, parent, None);
    q.min.set(&ResourceName::Cpu, min_cores * 1_000);
    if let Some(l) = lend_cores {
        q.lend.set(&ResourceName::Cpu, l * 1_000);
    }
    q
}

#[test]
fn a_borrower_never_takes_what_a_lending_limit_keeps() {
    let mut q = Queues::default();
    q.put(&lender("a", "", 8, Some(4))).expect("a");
    q.put(&lender("b", "", 8, None)).expect("b");
    assert_eq!(
        q.refusal("b", &cpu(100)),
        None,
        "no capacity recorded: the top level has no pool"
    );
    q.set_capacity(cpu(16));
    q.charge("b", &cpu(12));
    let why = q.refusal("b", &cpu(1)).expect("a keeps 4 of its min 8");
    assert_eq!(
            why,
            "queue b would borrow cpu that lending limits keep: 1 asked, 12 used of the cluster's 16, 4 kept free (4 for a)"
        );
    assert_eq!(q.refusal("a", &cpu(4)), None, "a claims what it kept");
    assert_eq!(
        q.refusal("a", &cpu(8)),
        None,
        "within its min a is never refused here: reclaim returns what b borrowed"
    );
    q.charge("a", &cpu(2));
    assert!(q.refusal("b", &cpu(1)).is_some(), "2 still kept for a");
    q.charge("a", &cpu(2));
    q.refund("b", &cpu(1));
    assert_eq!(q.refusal("b", &cpu(1)), None, "a's kept part is in use");
}

#[test]
fn a_parents_max_is_the_pool_its_children_lend_in() {
    let mut q = Queues::default();
    q.put(&queue("org", "", Some(10))).expect("org");
    q.put(&lender("x", "org", 5, Some(0))).expect("x");
    q.put(&queue("y", "org", None)).expect("y");
    q.charge("y", &cpu(5));
    let why = q.refusal("y", &cpu(1)).expect("x keeps all of its min");
    assert!(
        why.contains("5 used of queue org's max 10, 5 kept free (5 for x)"),
        "{why}"
    );
    assert_eq!(q.refusal("x", &cpu(5)), None);
}

#[test]
fn a_guarantee_kept_deeper_in_the_tree_counts_at_every_level() {
    // p (no min) holds a (min 8, lends nothing) and b (min 8); top-level t borrows.
    let mut q = Queues::default();
    q.put(&queue("p", "", None)).expect("p");
    q.put(&lender("a", "p", 8, Some(0))).expect("a");
    q.put(&lender("b", "p", 8, None)).expect("b");
    q.put(&queue("t", "", None)).expect("t");
    q.set_capacity(cpu(16));
    assert_eq!(q.refusal("t", &cpu(8)), None);
    q.charge("t", &cpu(8));
    assert!(q.refusal("t", &cpu(1)).is_some(), "8 kept for a, inside p");
    let why = q
        .refusal("b", &cpu(1))
        .expect("b is within its min, p is not");
    assert!(
        why.starts_with("queue b's ancestor p would borrow cpu"),
        "{why}"
    );
    assert_eq!(q.refusal("a", &cpu(8)), None);
}

#[test]
fn a_borrower_under_a_parent_without_max_is_checked_where_the_parent_lends() {
    // org (min 16, no max) holds x (min 8, lends nothing) and y; 16 cores.
    let mut q = Queues::default();
    q.put(&lender("org", "", 16, None)).expect("org");
    q.put(&lender("x", "org", 8, Some(0))).expect("x");
    q.put(&queue("y", "org", None)).expect("y");
    q.set_capacity(cpu(16));
    assert_eq!(
        q.refusal("y", &cpu(8)),
        None,
        "y borrows what org does not keep"
    );
    let why = q.refusal("y", &cpu(9)).expect("x keeps 8 inside org");
    assert!(why.contains("8 kept free (8 for org)"), "{why}");
    assert_eq!(
        q.refusal("x", &cpu(8)),
        None,
        "x within every min on its chain"
    );
}

#[test]
fn a_device_the_nodes_do_not_list_has_no_pool_at_the_top() {
    let gpu = ResourceName::Extended("vendor.example/gpu".into());
    let mut q = Queues::default();
    let mut a = queue("a", "", None);
    a.min.set(&gpu, 4);
    a.lend.set(&gpu, 0);
    q.put(&a).expect("a");
    q.put(&queue("b", "", None)).expect("b");
    q.set_capacity(cpu(16));
    let mut two = Resources::zero();
    two.set(&gpu, 2);
    assert_eq!(
        q.refusal("b", &two),
        None,
        "unknown capacity: the shards judge"
    );
}

/// Flat queues on a cluster of `capacity` cores, each (min, lend or none) with the
/// mins fitting the cluster, and operations (queue, cores, charge or refund).
fn arb_lenders() -> impl Strategy<Value = (u64, Vec<(u64, Option<u64>)>, Vec<(u8, u64, bool)>)> {
    (8u64..24)
        .prop_flat_map(|capacity| {
            (
                Just(capacity),
                prop::collection::vec((0u64..8, prop::option::of(0u64..8)), 1..5),
                prop::collection::vec((0u8..5, 1u64..6, prop::bool::weighted(0.7)), 1..40),
            )
        })
        .prop_filter("mins fit the cluster", |(capacity, qs, _)| {
            qs.iter().map(|(min, _)| min).sum::<u64>() <= *capacity
        })
}

proptest::proptest! {
    /// Lending limits against their definition over flat queues on a cluster: an
    /// admission that takes a queue past its `min` (borrowing) is refused exactly
    /// when some unlendable part is unclaimed afterwards and what all use, plus it,
    /// plus those parts would pass the capacity; one within `min` never is. After every
    /// borrowing admission (made only where the cluster has room, as the shards
    /// check), the unlendable parts not yet claimed are all free: borrowers never
    /// hold them (I8's second half; a queue within its min that finds them taken by
    /// another's within-min claim reclaims from the borrowers).
    #[test]
    fn borrowers_never_hold_what_lending_limits_keep((capacity, qs, ops) in arb_lenders()) {
        let mut q = Queues::default();
        for (i, (min, lend)) in qs.iter().enumerate() {
            let lend = lend.map(|l| l.min(*min));
            let spec = if *min > 0 {
                lender(&format!("q{i}"), "", *min, lend)
            } else {
                queue(&format!("q{i}"), "", None)
            };
            q.put(&spec).expect("queue");
        }
        q.set_capacity(cpu(capacity));
        let cpu_of = |q: &Queues, name: &str| q.usage(name).get(&ResourceName::Cpu);
        let total = |q: &Queues| -> u64 { q.specs().map(|s| cpu_of(q, &s.name)).sum() };
        let unclaimed = |q: &Queues, grown: &str, more: u64| -> u64 {
            q.specs()
                .map(|s| {
                    let used = cpu_of(q, &s.name) + if s.name == grown { more } else { 0 };
                    s.unlendable(&ResourceName::Cpu).saturating_sub(used)
                })
                .sum()
        };
        for (step, (qi, cores, charge)) in ops.into_iter().enumerate() {
            let name = format!("q{}", usize::from(qi) % qs.len());
            let asked = cores * 1_000;
            if !charge {
                let mut back = Resources::zero();
                back.set(&ResourceName::Cpu, asked.min(cpu_of(&q, &name)));
                q.refund(&name, &back);
                continue;
            }
            let min = q.spec(&name).and_then(|s| s.min.get(&ResourceName::Cpu)).unwrap_or(0);
            let borrows = cpu_of(&q, &name) + asked > min;
            let kept_after = unclaimed(&q, &name, asked);
            let expected_ok =
                !borrows || kept_after == 0 || total(&q) + asked + kept_after <= capacity * 1_000;
            let refusal = q.refusal(&name, &cpu(cores));
            proptest::prop_assert_eq!(
                refusal.is_none(), expected_ok,
                "step {}: {} asks {} cores: {:?}", step, name, cores, refusal
            );
            if refusal.is_none() && total(&q) + asked <= capacity * 1_000 {
                q.charge(&name, &cpu(cores));
                if borrows {
                    proptest::prop_assert!(
                        total(&q) + unclaimed(&q, "", 0) <= capacity * 1_000,
                        "step {}: a borrower holds what lending limits keep", step
                    );
                }
            }
        }
    }
}

#[test]
fn the_tree_depth_is_bounded() {
    let mut q = Queues::default();
    q.put(&queue("q0", "", None)).expect("top");
    for i in 1..QUEUE_DEPTH_MAX {
        q.put(&queue(&format!("q{i}"), &format!("q{}", i - 1), None))
            .expect("within depth");
    }
    let deep = q
        .put(&queue(
            "too-deep",
            &format!("q{}", QUEUE_DEPTH_MAX - 1),
            None,
        ))
        .expect_err("too deep");
    assert!(deep.contains("deeper than"), "{deep}");
}
