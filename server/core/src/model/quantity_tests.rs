//! Unit tests of `quantity.rs`.

use super::*;

#[test]
fn cpu_quantities_in_milli() {
    let cases = [
        ("500m", 500),
        ("2", 2000),
        ("1.5", 1500),
        ("0.1", 100),
        (".5", 500),
        ("1.", 1000),
        ("+3", 3000),
        ("1e3", 1_000_000),
        ("1E-3", 1),
        ("100u", 1),
        ("1n", 1),
        ("0", 0),
        ("-0", 0),
        ("0.0001", 1),
        ("2k", 2_000_000),
    ];
    for (input, milli) in cases {
        assert_eq!(parse_milli(input), Ok(milli), "{input}");
    }
}

#[test]
fn memory_quantities_in_bytes() {
    let cases = [
        ("128974848", 128_974_848),
        ("129e6", 129_000_000),
        ("129M", 129_000_000),
        ("123Mi", 128_974_848),
        ("2Gi", 2_147_483_648),
        ("1Ki", 1024),
        ("1.5Ki", 1536),
        ("0.5", 1),
        ("1.0000000001", 2),
        ("1e3", 1000),
        ("1E", 1_000_000_000_000_000_000),
        ("1Ei", 1 << 60),
        ("8Ei", 1 << 63),
    ];
    for (input, bytes) in cases {
        assert_eq!(parse_units(input), Ok(bytes), "{input}");
    }
}

#[test]
fn refuses_bad_quantities() {
    let cases = [
        ("-1", QuantityErrorKind::Negative),
        ("-500m", QuantityErrorKind::Negative),
        ("", QuantityErrorKind::Empty),
        ("abc", QuantityErrorKind::Malformed),
        ("1.5.5", QuantityErrorKind::Malformed),
        ("1e", QuantityErrorKind::Malformed),
        ("1Gb", QuantityErrorKind::Malformed),
        ("1 Gi", QuantityErrorKind::Malformed),
        ("1K", QuantityErrorKind::Malformed),
        ("1Ee3", QuantityErrorKind::Malformed),
        ("-", QuantityErrorKind::Malformed),
        (".", QuantityErrorKind::Malformed),
        ("m", QuantityErrorKind::Malformed),
        ("16Ei", QuantityErrorKind::OutOfRange),
        ("1e30", QuantityErrorKind::OutOfRange),
        ("1e999999999999999999999", QuantityErrorKind::Malformed),
    ];
    for (input, kind) in cases {
        let err = parse_units(input).expect_err(input);
        assert_eq!(err.kind, kind, "{input}");
    }
}

#[test]
fn error_text_names_the_input() {
    let err = parse_milli("-1").expect_err("negative");
    assert_eq!(
        err.to_string(),
        "invalid quantity \"-1\": negative values are not allowed"
    );
}

#[test]
fn whole_units_refuse_fractions() {
    assert_eq!(parse_whole_units("2"), Ok(2));
    assert_eq!(parse_whole_units("2000m"), Ok(2));
    assert_eq!(parse_whole_units("1k"), Ok(1000));
    assert_eq!(
        parse_whole_units("1500m").map_err(|e| e.kind),
        Err(QuantityErrorKind::NotWhole)
    );
    assert_eq!(
        parse_whole_units("0.5").map_err(|e| e.kind),
        Err(QuantityErrorKind::NotWhole)
    );
}

#[test]
fn nano_values_keep_sign_and_round_away_from_zero() {
    assert_eq!(parse_nano("16Gi"), Ok(16 * (1i128 << 30) * NANO_PER_UNIT));
    assert_eq!(parse_nano("-1.5"), Ok(-1_500_000_000));
    assert_eq!(parse_nano("0.1n"), Ok(1));
    assert_eq!(parse_nano("-0.1n"), Ok(-1));
    assert_eq!(
        parse_nano("1e30"),
        Err(QuantityError {
            input: "1e30".into(),
            kind: QuantityErrorKind::OutOfRange
        })
    );
    assert_eq!(
        parse_nano("16Ei"),
        Ok(i128::from(i64::MAX) * NANO_PER_UNIT),
        "binary values are capped"
    );
    assert!(parse_nano("--1").is_err());
    assert!(parse_nano("-").is_err());
}

#[test]
fn tiny_values_round_up_to_one() {
    let tiny = format!("0.{}1", "0".repeat(60));
    assert_eq!(parse_units(&tiny), Ok(1));
    assert_eq!(parse_units("1e-80"), Ok(1));
    let tiny = |t: &str| Quantity::parse(t).expect("parses").is_below_one_nano();
    assert!(tiny("1e-400") && tiny("1e-10") && tiny("0.5n"));
    assert!(tiny("1e-80000000000000"));
    assert!(!tiny("1n") && !tiny("1e-9") && !tiny("0") && !tiny("0e-400") && !tiny("1m"));
    assert_eq!(parse_units("0e-80"), Ok(0));
}
