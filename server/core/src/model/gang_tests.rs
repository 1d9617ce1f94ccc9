//! Unit tests of `gang.rs`.

use super::*;

fn gang_json(spec: &str) -> String {
    format!(r#"{{"name": "train", "namespace": "ml", "creationOrder": 3, "spec": {spec}}}"#)
}

fn parse(json: &str) -> Result<Gang, String> {
    let raw: RawGang = serde_json::from_str(json).map_err(|e| e.to_string())?;
    raw.validate().map_err(|e| e.to_string())
}

#[test]
fn valid_gang() {
    let gang = parse(&gang_json(
            r#"{"minMember": 2, "totalNumber": 3, "mode": "NonStrict", "waitTimeMs": 1000, "priority": 5,
                "members": [{"name": "w-0", "requests": {"cpu": "1"}}, {"name": "w-1", "labels": {"role": "w"}}]}"#,
        ))
        .expect("valid");
    assert_eq!(gang.min_member, 2);
    assert_eq!(gang.total_number, 3);
    assert_eq!(gang.mode, GangMode::NonStrict);
    assert_eq!(gang.members[0].spec.requests.cpu_milli, 1000);
    assert_eq!(
        gang.member_key(&gang.members[1]).to_string(),
        "ml/train/w-1"
    );
    let defaults = parse(&gang_json(
        r#"{"minMember": 1, "members": [{"name": "a"}]}"#,
    ))
    .expect("valid");
    assert_eq!(defaults.total_number, 1);
    assert_eq!(defaults.mode, GangMode::Strict);
    assert_eq!(defaults.wait_time_ms, DEFAULT_WAIT_TIME_MS);
}

#[test]
fn bad_gangs_name_the_field() {
    let cases = [
            (
                r#"{"minMember": 4, "totalNumber": 3, "members": [{"name": "a"}]}"#,
                "spec.minMember: minMember 4 exceeds totalNumber 3",
            ),
            (r#"{"minMember": 0, "members": [{"name": "a"}]}"#, "spec.minMember: must be at least 1"),
            (r#"{"minMember": -1, "members": [{"name": "a"}]}"#, "spec.minMember: -1 out of range"),
            (r#"{"minMember": 1, "totalNumber": 1, "members": []}"#, "spec.members: a gang needs at least one member"),
            (
                r#"{"minMember": 1, "totalNumber": 2, "members": [{"name": "a"}, {"name": "a"}]}"#,
                "spec.members[1].name: duplicate member name \"a\"",
            ),
            (
                r#"{"minMember": 1, "totalNumber": 1, "members": [{"name": "a"}, {"name": "b"}]}"#,
                "spec.members: 2 members exceed totalNumber 1",
            ),
            (
                r#"{"minMember": 1, "mode": "Loose", "members": [{"name": "a"}]}"#,
                "spec.mode: unknown mode \"Loose\"",
            ),
            (
                r#"{"minMember": 1, "totalNumber": 3, "members": [{"name": "a"}, {"name": "b"}, {"name": "c", "requests": {"cpu": "-1"}}]}"#,
                "spec.members[2].requests.cpu: invalid quantity \"-1\"",
            ),
            (
                r#"{"minMember": 1, "members": [{"name": "a", "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Within", "values": ["1"]}]}]}}}}]}"#,
                "spec.members[0].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: unknown operator \"Within\"",
            ),
            (r#"{"minMember": 1, "members": [{"name": "A"}]}"#, "spec.members[0].name: invalid name"),
        ];
    for (spec, expected) in cases {
        let err = parse(&gang_json(spec)).expect_err(spec);
        assert!(err.starts_with(expected), "got {err}\nwant {expected}");
    }
    let err = parse(r#"{"name": "t", "namespace": "Bad NS", "spec": {"minMember": 1, "members": [{"name": "a"}]}}"#)
            .expect_err("ns");
    assert!(err.starts_with("namespace: invalid name"), "{err}");
}

#[test]
fn groups_refuse_empty_and_duplicates() {
    let parse_group = |json: &str| -> Result<GangGroup, String> {
        let raw: RawGangGroup = serde_json::from_str(json).map_err(|e| e.to_string())?;
        raw.validate().map_err(|e| e.to_string())
    };
    let err = parse_group(r#"{"id": "g", "gangs": []}"#).expect_err("empty");
    assert_eq!(err, "gangs: a gang group needs at least one gang");
    let one = gang_json(r#"{"minMember": 1, "members": [{"name": "a"}]}"#);
    let err = parse_group(&format!(r#"{{"id": "g", "gangs": [{one}, {one}]}}"#)).expect_err("dup");
    assert_eq!(err, "gangs[1]: duplicate gang ml/train");
    let bad = gang_json(r#"{"minMember": 2, "totalNumber": 1, "members": [{"name": "a"}]}"#);
    let err = parse_group(&format!(r#"{{"id": "g", "gangs": [{one}, {bad}]}}"#)).expect_err("bad");
    assert!(err.starts_with("gangs[1].spec.minMember"), "{err}");
    assert!(parse_group(&format!(r#"{{"id": "g", "gangs": [{one}]}}"#)).is_ok());
}

#[test]
fn member_keys_round_trip_as_strings() {
    let key = MemberKey::new("ns", "g", "m");
    let json = serde_json::to_string(&key).expect("serialize");
    assert_eq!(json, "\"ns/g/m\"");
    let back: MemberKey = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, key);
    assert!(serde_json::from_str::<MemberKey>("\"a/b\"").is_err());
    assert!(serde_json::from_str::<MemberKey>("\"a//c\"").is_err());
    assert!(MemberKey::new("a/b", "g", "m").validate().is_err());
    assert!(MemberKey::new("a", "", "m").validate().is_err());
    assert_eq!(key.validate(), Ok(()));
}
