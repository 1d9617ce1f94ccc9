use super::*;

#[test]
fn the_stream_mixes_every_kind_and_never_requires_a_rack_larger_than_one() {
    let s = stream(7, 300);
    for kind in [Kind::RequiredRack, Kind::PreferredBlock, Kind::Free] {
        assert!(
            s.iter().filter(|g| g.kind == kind).count() >= 80,
            "{kind:?}"
        );
    }
    let rack_gpus = NODES_PER_RACK as u64 * GPUS_PER_NODE;
    assert!(s
        .iter()
        .all(|g| g.kind != Kind::RequiredRack || g.gpus <= rack_gpus));
    assert_eq!(stream(7, 300), s, "seeded");
}

#[test]
fn gangway_and_the_baseline_keep_required_gangs_in_one_rack_and_report_the_same_fleet() {
    let s = stream(11, 240);
    for placement in [Placement::Gangway, Placement::BestFit] {
        let r = run(placement, &s, 40);
        assert!(r.required_placed > 0, "{placement:?}: {r:?}");
        assert_eq!(r.required_spanning, 0, "{placement:?}: {r:?}");
        assert!(r.preferred_in_one_block <= r.preferred_placed, "{r:?}");
        assert!(
            r.gangs_placed > 0 && r.gangs_placed <= r.gangs_tried,
            "{r:?}"
        );
        assert!(
            r.stranded_gpus_at_saturation <= r.free_gpus_at_saturation,
            "{r:?}"
        );
        assert_eq!(r.fleet_gpus, 4096);
    }
    // Without constraints, required gangs are placed anywhere: some span racks.
    let loose = run(Placement::GangwayUnconstrained, &s, 40);
    assert!(loose.required_spanning > 0, "{loose:?}");
}

#[test]
fn fewest_domains_take_the_largest_then_the_tightest_that_completes() {
    let capacity: BTreeMap<&str, u64> = [("a", 10), ("b", 4), ("c", 7), ("d", 3)].into();
    assert_eq!(largest_first(&capacity, 6), Some(BTreeSet::from(["c"])));
    assert_eq!(
        largest_first(&capacity, 13),
        Some(BTreeSet::from(["a", "d"]))
    );
    assert_eq!(largest_first(&capacity, 25), None);
    assert_eq!(tightest(&capacity, 5), Some("c"));
}
