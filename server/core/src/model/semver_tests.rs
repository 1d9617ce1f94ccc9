//! Unit tests of `semver.rs`.

use super::*;

fn v(s: &str) -> Semver {
    Semver::parse(s).expect(s)
}

#[test]
fn precedence_follows_the_specification() {
    let ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.2.0",
        "2.0.0",
    ];
    for pair in ordered.windows(2) {
        assert_eq!(
            v(pair[0]).precedence(&v(pair[1])),
            Ordering::Less,
            "{pair:?}"
        );
    }
    assert_eq!(v("1.0.0+a").precedence(&v("1.0.0+b")), Ordering::Equal);
    assert_eq!(v("10.20.30").major(), 10);
    assert_eq!(v("1.0.0-rc.1+build.5").to_string(), "1.0.0-rc.1+build.5");
}

#[test]
fn strict_parsing() {
    for bad in [
        "",
        "1",
        "1.2",
        "v1.2.3",
        "01.2.3",
        "1.2.3-",
        "1.2.3-01",
        "1.2.3+",
        "1.2.3-a..b",
        "1.2.3.4",
        "1.2.x",
    ] {
        assert!(Semver::parse(bad).is_err(), "{bad}");
    }
}
