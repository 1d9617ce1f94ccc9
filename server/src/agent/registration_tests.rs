//! Unit tests of `registration.rs`.

use super::*;

#[test]
fn extended_resource_names_pass_and_others_are_refused_saying_why() {
    for good in ["vendor.com/gpu", "nvidia.com/gpu", "example.com/foo_bar.1"] {
        assert_eq!(check("v1beta1", good, "gpu.sock"), Ok(()), "{good}");
    }
    for (bad, why) in [
        ("gpu", "domain prefix"),
        ("kubernetes.io/gpu", "reserved"),
        ("foo.kubernetes.io/x", "reserved"),
        ("Example.COM/gpu", "DNS subdomain"),
        ("vendor.com/", "1-63 characters"),
        ("a/b/c", "one '/'"),
        ("vendor.com/-gpu", "starting and ending"),
    ] {
        let err = check("v1beta1", bad, "gpu.sock").expect_err(bad);
        assert!(
            err.to_string().starts_with("resource_name:") && err.to_string().contains(why),
            "{bad}: {err}"
        );
    }
}

#[test]
fn other_versions_and_endpoints_outside_the_directory_are_refused() {
    let err = check("v1alpha", "vendor.com/gpu", "gpu.sock").expect_err("version");
    assert!(
        err.to_string().contains("\"v1alpha\" is not supported"),
        "{err}"
    );
    for endpoint in ["", "../kubelet.sock", "/tmp/gpu.sock", ".."] {
        let err = check("v1beta1", "vendor.com/gpu", endpoint).expect_err(endpoint);
        assert!(err.to_string().starts_with("endpoint:"), "{err}");
    }
}
