//! Unit tests of `failpoints.rs`.

use super::*;

#[test]
fn a_misspelt_point_is_reported_and_arms_nothing() {
    let points = Failpoints {
        armed: ["coordinator-after-decide", "coordinator-after-decid"]
            .map(String::from)
            .into(),
        once_dir: None,
    };
    assert_eq!(points.unknown(), ["coordinator-after-decid"]);
    assert!(points.armed(AFTER_DECIDE));
    assert!(!points.armed(AFTER_RESERVE));
    assert!(Failpoints::disabled().unknown().is_empty());
}
