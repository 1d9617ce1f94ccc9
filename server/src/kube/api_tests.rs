//! Unit tests of `api.rs`.

use super::*;

#[test]
fn timestamps_are_rfc3339() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_795_000_000_000), "2026-11-18T11:06:40Z");
}

#[test]
fn timestamps_read_back_to_the_second() {
    for ms in [0, 951_782_400_000, 1_795_000_000_000, 4_102_444_799_000] {
        assert_eq!(parse_rfc3339_ms(&rfc3339(ms)), Some(ms), "{}", rfc3339(ms));
    }
    assert_eq!(
        parse_rfc3339_ms("2026-11-18T11:06:40.123456Z"),
        Some(1_795_000_000_000)
    );
    for bad in [
        "",
        "2026-11-18",
        "2026-13-01T00:00:00Z",
        "2026-11-18T11:06:40+01:00",
        "x",
    ] {
        assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
    }
}
