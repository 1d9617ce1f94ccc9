//! Unit tests of `error.rs`.

use super::*;

#[test]
fn paths_compose_like_kubernetes() {
    let p = FieldPath::new("spec")
        .child("members")
        .index(2)
        .child("requests")
        .key("cpu");
    assert_eq!(p.to_string(), "spec.members[2].requests.cpu");
    let e = p.error("invalid quantity \"-1\"");
    assert_eq!(
        e.to_string(),
        "spec.members[2].requests.cpu: invalid quantity \"-1\""
    );
}

#[test]
fn indexes_print_every_digit() {
    for i in [0usize, 7, 10, 99, 1234, usize::MAX] {
        assert_eq!(FieldPath::new("a").index(i).to_string(), format!("a[{i}]"));
    }
}

#[test]
fn root_child_has_no_leading_dot() {
    assert_eq!(FieldPath::root().child("name").to_string(), "name");
    assert_eq!(FieldPath::root().to_string(), "<root>");
}

#[test]
fn long_input_is_cut_at_a_character_boundary() {
    assert_eq!(clip("short"), "short");
    let long = "é".repeat(1_000_000);
    let cut = clip(&long);
    assert!(cut.chars().count() < ECHO_CHARS_MAX + 40, "{}", cut.len());
    assert!(cut.ends_with("more bytes)"), "{cut}");
    let huge = FieldPath::new("gangs").key(&"k".repeat(3_000_000));
    let err = huge.error("x".repeat(3_000_000));
    assert!(err.to_string().len() < 2_000, "{}", err.to_string().len());
}
