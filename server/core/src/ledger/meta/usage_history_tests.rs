use super::*;

use proptest::prelude::*;

fn cpu(milli: u64) -> Resources {
    Resources {
        cpu_milli: milli,
        ..Resources::zero()
    }
}

fn usage(pairs: &[(&str, Resources)]) -> BTreeMap<String, Resources> {
    pairs
        .iter()
        .map(|(q, r)| (q.to_string(), r.clone()))
        .collect()
}

#[test]
fn the_table_holds_the_roots_of_one_half() {
    for (i, root) in HALVING_ROOTS_Q32.iter().enumerate() {
        let exact = 2f64.powf(-(2f64.powi(-(i as i32 + 1)))) * ONE_Q32 as f64;
        assert!(
            (*root as f64 - exact).abs() <= 1.0,
            "root {i}: {root} against {exact}"
        );
    }
}

#[test]
fn whole_half_lives_halve_exactly() {
    assert_eq!(kept_q32(0, 60_000), ONE_Q32);
    assert_eq!(kept_q32(60_000, 60_000), ONE_Q32 / 2);
    assert_eq!(kept_q32(120_000, 60_000), ONE_Q32 / 4);
    assert_eq!(kept_q32(33 * 60_000, 60_000), 0);
    assert_eq!(kept_q32(u64::MAX, 1_000), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The integer factor is 2^(−Δ/h) to within a few parts in 2^32, and never grows
    /// with time.
    #[test]
    fn the_factor_is_two_to_minus_elapsed_over_half_life(
        elapsed in 0u64..10_000_000,
        half_life in FAIR_SHARE_HALF_LIFE_MS_MIN..10_000_000u64,
        more in 0u64..1_000,
    ) {
        let kept = kept_q32(elapsed, half_life);
        let exact = 2f64.powf(-(elapsed as f64) / half_life as f64) * ONE_Q32 as f64;
        prop_assert!((kept as f64 - exact).abs() <= 40.0, "{kept} against {exact}");
        prop_assert!(kept_q32(elapsed + more, half_life) <= kept);
    }

    /// The history follows d ← d·k + u·(1 − k) in floating point, never passes the
    /// largest usage sampled, and two replicas applying the same samples agree bit for
    /// bit (the encoded state round-trips).
    #[test]
    fn samples_follow_the_exponential_average(
        steps in prop::collection::vec((0u64..120_000, 0u64..64_000), 1..40),
        half_life in 1_000u64..600_000,
    ) {
        let mut history = UsageHistory::starting(0, half_life);
        let mut model = 0f64;
        let (mut at, mut peak) = (0u64, 0u64);
        for (gap, used) in steps {
            at += gap;
            let k = 2f64.powf(-(gap as f64) / half_life as f64);
            model = model * k + used as f64 * (1.0 - k);
            peak = peak.max(used);
            history.sample(at, half_life, &usage(&[("a", cpu(used))]));
            let got = history.decayed("a").cpu_milli;
            prop_assert!((got as f64 - model).abs() <= 2.0 + model * 1e-6, "{got} against {model}");
            prop_assert!(got <= peak);
        }
        let bytes = rmp_serde::to_vec(&history).expect("encode");
        let back: UsageHistory = rmp_serde::from_slice(&bytes).expect("decode");
        prop_assert_eq!(&back, &history);
        let text = serde_json::to_string(&history).expect("json");
        let back: UsageHistory = serde_json::from_str(&text).expect("json back");
        prop_assert_eq!(back, history);
    }
}

#[test]
fn a_long_half_life_still_counts_a_second_of_use() {
    // 1 cpu for one second under a week's half-life: far below a millicore a second,
    // but kept in the fraction, so a day of it adds up.
    let week = 7 * 24 * 3_600 * 1_000;
    let mut history = UsageHistory::starting(0, week);
    for s in 1..=86_400u64 {
        history.sample(s * 1_000, week, &usage(&[("a", cpu(1_000))]));
    }
    let expected = 1_000.0 * (1.0 - 2f64.powf(-1.0 / 7.0));
    let got = history.decayed("a").cpu_milli as f64;
    assert!((got - expected).abs() <= 1.0, "{got} against {expected}");
}

#[test]
fn an_older_sample_decays_nothing_and_a_deleted_queue_is_forgotten() {
    let mut history = UsageHistory::starting(10_000, 1_000);
    history.sample(11_000, 1_000, &usage(&[("a", cpu(800)), ("b", cpu(0))]));
    assert_eq!(history.decayed("a").cpu_milli, 400);
    assert_eq!(history.decayed("b"), Resources::zero());
    // A clock behind the last sample: nothing decays, nothing is added.
    history.sample(5_000, 1_000, &usage(&[("a", cpu(0))]));
    assert_eq!(history.decayed("a").cpu_milli, 400);
    assert_eq!(history.sampled_at_ms(), 11_000);
    history.sample(12_000, 1_000, &usage(&[("b", cpu(0))]));
    assert_eq!(history.decayed("a"), Resources::zero(), "a was deleted");
    assert!(history.decayed.is_empty(), "zeros are left out");
}

#[test]
fn extended_resources_are_kept_by_name() {
    let gpus = Resources {
        extended: [("nvidia.com/gpu".to_string(), 8)].into(),
        ..Resources::zero()
    };
    let mut history = UsageHistory::starting(0, 1_000);
    history.sample(2_000, 1_000, &usage(&[("a", gpus)]));
    assert_eq!(
        history
            .decayed("a")
            .get(&ResourceName::Extended("nvidia.com/gpu".into())),
        6
    );
}
