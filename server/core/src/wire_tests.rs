//! Unit tests of `wire.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
enum Tagged {
    Queued,
    Placing { txn: u64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Either {
    Text(String),
    Integer(i64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Inner {
    a: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    list: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sample {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    maybe: Option<u64>,
    #[serde(flatten)]
    inner: Inner,
    state: Tagged,
    quantities: Vec<Either>,
    by_key: BTreeMap<String, i64>,
    raw: serde_json::Value,
    bytes: Vec<u8>,
}

fn sample() -> Sample {
    Sample {
        name: "gang-a/pod-0".into(),
        maybe: None,
        inner: Inner {
            a: 7,
            list: vec!["x".into()],
        },
        state: Tagged::Placing { txn: u64::MAX },
        quantities: vec![Either::Text("500m".into()), Either::Integer(-4)],
        by_key: [("b".to_string(), 2), ("a".to_string(), -1)].into(),
        raw: serde_json::json!({"k": [1, 2.5, "s", null, true]}),
        bytes: vec![0, 0xB1, 0xFF],
    }
}

#[test]
fn both_formats_round_trip_every_serde_shape_gangway_uses() {
    let value = sample();
    for format in [WireFormat::Binary, WireFormat::Json] {
        let bytes = format.encode(&value).expect("encodes");
        assert_eq!(WireFormat::of(&bytes), Some(format));
        let back: Sample = decode(&bytes).expect("decodes");
        assert_eq!(back, value, "{format:?}");
        assert_eq!(format.encode(&back).expect("encodes"), bytes, "{format:?}");
    }
    let unit: Tagged =
        decode(&WireFormat::Binary.encode(&Tagged::Queued).expect("e")).expect("decodes");
    assert_eq!(unit, Tagged::Queued);
}

#[test]
fn binary_is_smaller_than_json() {
    let value = sample();
    let json = WireFormat::Json.encode(&value).expect("json");
    let binary = WireFormat::Binary.encode(&value).expect("binary");
    assert!(
        binary.len() < json.len(),
        "{} vs {}",
        binary.len(),
        json.len()
    );
}

#[test]
fn json_written_before_the_binary_format_still_decodes() {
    let json = br#"{"name":"n","a":1,"state":{"state":"queued"},"quantities":["1",2],
            "byKey":{},"raw":null,"bytes":[1,2]}"#;
    let back: Sample = decode(json).expect("old JSON decodes");
    assert_eq!(back.state, Tagged::Queued);
    assert_eq!(back.inner.a, 1);
    assert_eq!(
        back.quantities,
        vec![Either::Text("1".into()), Either::Integer(2)]
    );
}

#[test]
fn a_format_is_named_in_any_case_and_an_unknown_name_is_quoted() {
    assert_eq!(
        "binary".parse::<WireFormat>().ok(),
        Some(WireFormat::Binary)
    );
    assert_eq!("JSON".parse::<WireFormat>().ok(), Some(WireFormat::Json));
    let err = "yaml".parse::<WireFormat>().expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "\"yaml\" is not a wire format (binary or json)"
    );
    for f in WireFormat::ALL {
        assert_eq!(f.name().parse::<WireFormat>().ok(), Some(f));
    }
}

#[test]
fn an_unknown_version_byte_is_refused_and_named() {
    let err = decode::<Sample>(&[0xB2, 0x80, 1]).expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("0xb2") && text.contains("b28001"), "{text}");
    assert!(decode::<Sample>(&[]).is_err());
    assert!(decode::<Sample>(&[BINARY_V1]).is_err());
    assert!(decode::<Sample>(&[BINARY_V1, 0xC1]).is_err());
    let mut padded = WireFormat::Binary.encode(&sample()).expect("encodes");
    padded.push(0);
    let err = decode::<Sample>(&padded).expect_err("trailing byte");
    assert!(matches!(err, WireError::Trailing { count: 1 }), "{err}");
    assert!(
        decode::<Sample>(b"{} 1").is_err(),
        "JSON refuses trailing text too"
    );
}
