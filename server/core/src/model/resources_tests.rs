//! Unit tests of `resources.rs`.

use super::*;

fn res(cpu: u64, mem: u64, gpu: u64) -> Resources {
    let mut r = Resources {
        cpu_milli: cpu,
        memory_bytes: mem,
        ..Resources::zero()
    };
    r.set(&ResourceName::Extended("nvidia.com/gpu".into()), gpu);
    r
}

#[test]
fn arithmetic_is_checked_and_normalized() {
    let a = res(1000, 100, 2);
    let b = res(500, 50, 2);
    let diff = a.checked_sub(&b).expect("fits");
    assert_eq!(diff, res(500, 50, 0));
    assert!(diff.extended.is_empty());
    assert_eq!(b.checked_sub(&a), None);
    assert_eq!(diff.checked_add(&b), Some(a.clone()));
    let max = Resources {
        cpu_milli: u64::MAX,
        ..Resources::zero()
    };
    assert_eq!(max.checked_add(&res(1, 0, 0)), None);
    assert_eq!(b.saturating_sub(&a), Resources::zero());
}

#[test]
fn fits_and_shortfall() {
    let free = res(1000, 100, 1);
    assert!(res(1000, 100, 1).fits(&free));
    assert_eq!(
        res(1000, 100, 2).shortfall(&free),
        Some(ResourceName::Extended("nvidia.com/gpu".into()))
    );
    assert_eq!(res(1001, 1, 0).shortfall(&free), Some(ResourceName::Cpu));
    assert_eq!(res(300, 10, 0).copies_within(&free), 3);
    assert_eq!(Resources::zero().copies_within(&free), u64::MAX);
}

#[test]
fn from_raw_names_the_entry() {
    let path = FieldPath::new("spec")
        .child("members")
        .index(2)
        .child("requests");
    let mut list = RawResourceList::new();
    list.insert("cpu".into(), RawQuantity::Text("-1".into()));
    let err = Resources::from_raw(&path, &list, ResourceListKind::Requests).expect_err("neg");
    assert_eq!(
        err.to_string(),
        "spec.members[2].requests.cpu: invalid quantity \"-1\": negative values are not allowed"
    );

    let mut list = RawResourceList::new();
    list.insert("cpu".into(), RawQuantity::Text("1.5".into()));
    list.insert("memory".into(), RawQuantity::Text("2Gi".into()));
    list.insert("nvidia.com/gpu".into(), RawQuantity::Integer(2));
    let r = Resources::from_raw(&path, &list, ResourceListKind::Requests).expect("valid");
    assert_eq!(r.cpu_milli, 1500);
    assert_eq!(r.memory_bytes, 2 << 30);
    assert_eq!(r.extended.get("nvidia.com/gpu"), Some(&2));
}

#[test]
fn from_raw_refuses_bad_names_and_fractions() {
    let path = FieldPath::new("allocatable");
    let one = |name: &str, q: &str| {
        let mut list = RawResourceList::new();
        list.insert(name.into(), RawQuantity::Text(q.into()));
        list
    };
    let err = Resources::from_raw(&path, &one("gpu", "1"), ResourceListKind::Allocatable)
        .expect_err("unknown");
    assert_eq!(err.path, "allocatable.gpu");
    let err = Resources::from_raw(
        &path,
        &one("nvidia.com/gpu", "0.5"),
        ResourceListKind::Allocatable,
    )
    .expect_err("fraction");
    assert!(err.message.contains("whole number"), "{err}");
    let err = Resources::from_raw(&path, &one("pods", "1"), ResourceListKind::Requests)
        .expect_err("pods");
    assert_eq!(err.path, "allocatable.pods");
    let err = Resources::from_raw(&path, &one("memory", "12x"), ResourceListKind::Allocatable)
        .expect_err("malformed");
    assert!(err.message.starts_with("invalid quantity \"12x\""), "{err}");
    let mut neg = RawResourceList::new();
    neg.insert("memory".into(), RawQuantity::Integer(-5));
    let err = Resources::from_raw(&path, &neg, ResourceListKind::Allocatable).expect_err("neg");
    assert_eq!(err.path, "allocatable.memory");
}
