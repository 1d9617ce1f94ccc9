//! Unit tests of `http.rs`.

use super::*;

#[test]
fn paths_name_kind_namespace_and_subresource() {
    let t = parse_path("/api/v1/namespaces/ns/pods/p/binding").expect("binding");
    assert_eq!(
        (
            t.kind,
            t.namespace.as_deref(),
            t.name.as_deref(),
            t.subresource.as_deref()
        ),
        (PODS, Some("ns"), Some("p"), Some("binding"))
    );
    let t = parse_path("/apis/resource.k8s.io/v1/resourceslices").expect("slices");
    assert_eq!(t.kind.kind, "ResourceSlice");
    assert!(parse_path("/apis/resource.k8s.io/v1/namespaces/ns/resourceslices").is_err());
    assert!(parse_path("/apis/nope/v1/things").is_err());
}

#[test]
fn query_values_are_decoded() {
    assert_eq!(
        percent_decode("spec.schedulerName%3Dgangway"),
        "spec.schedulerName=gangway"
    );
    assert_eq!(percent_decode("a+b%2"), "a b%2");
}
