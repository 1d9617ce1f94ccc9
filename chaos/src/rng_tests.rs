//! Unit tests of `rng.rs`.

use super::*;

#[test]
fn one_seed_one_sequence() {
    let a: Vec<u64> = (0..5)
        .scan(Rng::new(7), |r, _| Some(r.next_u64()))
        .collect();
    let b: Vec<u64> = (0..5)
        .scan(Rng::new(7), |r, _| Some(r.next_u64()))
        .collect();
    let c: Vec<u64> = (0..5)
        .scan(Rng::new(8), |r, _| Some(r.next_u64()))
        .collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn range_and_weights_stay_in_bounds() {
    let mut r = Rng::new(1);
    for _ in 0..1000 {
        let x = r.range(3, 5);
        assert!((3..=5).contains(&x), "{x}");
        assert_ne!(r.weighted(&[0, 2, 0, 1]), Some(0));
    }
    assert_eq!(r.weighted(&[0, 0]), None);
}
