//! Unit tests of `names.rs`.

use super::*;

#[test]
fn qualified_names() {
    let p = FieldPath::new("labels");
    for ok in [
        "app",
        "topology.kubernetes.io/zone",
        "nvidia.com/gpu",
        "a_b.c-d",
    ] {
        assert!(validate_qualified_name(&p, ok).is_ok(), "{ok}");
    }
    for bad in ["", "/x", "a/", "-a", "a b", "Upper.Case/x", "a/b/c"] {
        assert!(validate_qualified_name(&p, bad).is_err(), "{bad}");
    }
}

#[test]
fn dns_names() {
    let p = FieldPath::new("name");
    assert!(validate_dns_subdomain(&p, "node-1.rack-a").is_ok());
    assert!(validate_dns_subdomain(&p, "Node").is_err());
    assert!(validate_dns_subdomain(&p, "a/b").is_err());
    assert!(validate_dns_label(&p, "team-a").is_ok());
    assert!(validate_dns_label(&p, "team.a").is_err());
    assert!(validate_dns_label(&p, &"a".repeat(64)).is_err());
}

#[test]
fn label_values() {
    let p = FieldPath::new("v");
    assert!(validate_label_value(&p, "").is_ok());
    assert!(validate_label_value(&p, "Zone_A.1").is_ok());
    assert!(validate_label_value(&p, "a b").is_err());
    assert!(validate_label_value(&p, "_a").is_err());
}
