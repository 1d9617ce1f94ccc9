//! Unit tests of `cache.rs`.

use super::*;

fn plain() -> NodeFit {
    NodeFit {
        allocatable: [4000, 1 << 30, 10, 0],
        requested: [0; 4],
        flags: 0,
    }
}

fn seen(
    slot: &TemplateSlot<'_>,
    idx: usize,
    stamp: u64,
) -> Option<(Result<u64, FilterReason>, u64)> {
    slot.get(idx, stamp).map(|hit| (hit.outcome(), hit.local))
}

#[test]
fn entries_are_used_only_for_the_stamp_they_were_computed_for() {
    let mut cache = FitCache::default();
    let spec = PodSpec::default();
    let profile = Profile::default();
    let mut slot = cache.template(&spec, &profile, 3);
    assert_eq!(seen(&slot, 1, 7), None, "empty");
    slot.put(1, 7, &plain(), &Ok(4), 170);
    assert_eq!(seen(&slot, 1, 7), Some((Ok(4), 170)));
    assert_eq!(seen(&slot, 1, 8), None, "the node changed since");
    let short = Err(FilterReason::Insufficient(ResourceName::Memory));
    slot.put(1, 8, &plain(), &short, 0);
    assert_eq!(seen(&slot, 1, 8), Some((short, 0)));
    assert_eq!(seen(&slot, 1, 7), None, "replaced");
    slot.put(2, 9, &plain(), &Err(FilterReason::NodeNotReady), 0);
    assert_eq!(seen(&slot, 2, 9), None, "only fits and shortfalls are kept");
    let mut sick = plain();
    sick.flags = NodeFit::NOT_READY;
    slot.put(2, 10, &sick, &Ok(1), 0);
    assert_eq!(
        seen(&slot, 2, 10),
        None,
        "nodes with condition flags are not kept"
    );
    assert_eq!(seen(&slot, 0, 0), None, "stamp 0 names nothing");
}

#[test]
fn templates_are_bounded_least_recently_used_first() {
    let mut cache = FitCache::default();
    let profile = Profile::default();
    let spec = |cpu: u64| {
        let mut s = PodSpec::default();
        s.requests.cpu_milli = cpu;
        s
    };
    for cpu in 0..CACHED_TEMPLATES_MAX as u64 {
        cache
            .template(&spec(cpu), &profile, 1)
            .put(0, 1, &plain(), &Ok(1), cpu);
    }
    // Touch template 0 so that template 1 is the least recently used.
    cache.template(&spec(0), &profile, 1);
    cache.template(&spec(99), &profile, 1);
    assert_eq!(cache.templates(), CACHED_TEMPLATES_MAX);
    assert_eq!(
        seen(&cache.template(&spec(0), &profile, 1), 0, 1),
        Some((Ok(1), 0))
    );
    assert_eq!(seen(&cache.template(&spec(1), &profile, 1), 0, 1), None);
    let other = Profile {
        percentage_of_nodes_to_score: 100,
        topologies: Vec::new(),
        ..Profile::default()
    };
    assert_eq!(
        seen(&cache.template(&spec(0), &other, 1), 0, 1),
        None,
        "per profile"
    );
}
