//! Unit tests of `queue.rs`.

use super::*;

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn spec(name: &str, min: &[(&str, &str)], max: &[(&str, &str)]) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        parent: String::new(),
        weight: 1,
        min: Limits::from_quantities(&FieldPath::new("min"), &quantities(min)).expect("valid min"),
        max: Limits::from_quantities(&FieldPath::new("max"), &quantities(max)).expect("valid max"),
        lend: Limits::none(),
        managed_by: String::new(),
        namespaces: Vec::new(),
    }
}

#[test]
fn a_queue_lends_at_most_its_min_of_what_min_names() {
    let mut ok = spec("team-a", &[("cpu", "8")], &[]);
    ok.lend = Limits::from_quantities(&FieldPath::new("lend"), &quantities(&[("cpu", "3")]))
        .expect("valid lend");
    assert_eq!(ok.validate(&FieldPath::new("queue")), Ok(()));
    assert_eq!(ok.unlendable(&ResourceName::Cpu), 5_000);
    assert_eq!(
        ok.unlendable(&ResourceName::Memory),
        0,
        "no min: nothing kept"
    );
    let mut above = ok.clone();
    above.lend.set(&ResourceName::Cpu, 9_000);
    let err = above
        .validate(&FieldPath::new("queue"))
        .expect_err("lend above min");
    assert!(
        err.to_string().contains("queue.lend.cpu") && err.to_string().contains("above min 8"),
        "{err}"
    );
    let mut unnamed = ok;
    unnamed.lend.set(&ResourceName::Memory, 1);
    let err = unnamed
        .validate(&FieldPath::new("queue"))
        .expect_err("lend of a resource min does not name");
    assert!(
        err.to_string().contains("queue.lend.memory")
            && err.to_string().contains("min names no memory"),
        "{err}"
    );
}

#[test]
fn quantities_are_read_in_base_units() {
    let limits = Limits::from_quantities(
        &FieldPath::new("max"),
        &quantities(&[("cpu", "1500m"), ("memory", "1Gi"), ("nvidia.com/gpu", "8")]),
    )
    .expect("valid");
    assert_eq!(limits.get(&ResourceName::Cpu), Some(1_500));
    assert_eq!(limits.get(&ResourceName::Memory), Some(1 << 30));
    assert_eq!(
        limits.get(&ResourceName::Extended("nvidia.com/gpu".into())),
        Some(8)
    );
    assert_eq!(limits.get(&ResourceName::Pods), None, "unnamed: no limit");
}

#[test]
fn bad_quantities_and_names_are_refused_naming_the_entry() {
    let err = Limits::from_quantities(&FieldPath::new("max"), &quantities(&[("gpu", "1")]))
        .expect_err("an unqualified extended name");
    assert!(err.to_string().contains("max.gpu"), "{err}");
    let err = Limits::from_quantities(&FieldPath::new("min"), &quantities(&[("cpu", "lots")]))
        .expect_err("not a quantity");
    assert!(err.to_string().contains("min.cpu"), "{err}");
}

#[test]
fn a_queue_is_checked_field_by_field() {
    let ok = spec("team-a", &[("cpu", "4")], &[("cpu", "8")]);
    assert_eq!(ok.validate(&FieldPath::new("queue")), Ok(()));
    let above = spec("team-a", &[("cpu", "9")], &[("cpu", "8")]);
    let err = above
        .validate(&FieldPath::new("queue"))
        .expect_err("min above max");
    assert!(
        err.to_string().contains("queue.min.cpu") && err.to_string().contains("above max 8"),
        "{err}"
    );
    let zero = QueueSpec {
        weight: 0,
        ..ok.clone()
    };
    assert!(zero
        .validate(&FieldPath::new("queue"))
        .expect_err("weight 0")
        .to_string()
        .contains("queue.weight"));
    let own = QueueSpec {
        parent: "team-a".into(),
        ..ok.clone()
    };
    assert!(own
        .validate(&FieldPath::new("queue"))
        .expect_err("own parent")
        .to_string()
        .contains("queue.parent"));
    let bad_name = QueueSpec {
        name: "Team_A".into(),
        ..ok
    };
    assert!(bad_name
        .validate(&FieldPath::new("queue"))
        .expect_err("not a DNS label")
        .to_string()
        .contains("queue.name"));
}

#[test]
fn a_pods_devices_are_charged_by_class() {
    use crate::model::claim::{DeviceRequest, PodClaim, SubRequest};
    let exact = |class: &str, mode: AllocationMode, admin: AdminAccess| ExactRequest {
        allocation_mode: mode,
        admin_access: admin,
        ..ExactRequest::one_of(class)
    };
    let request = |name: &str, spec: RequestSpec| DeviceRequest {
        name: name.into(),
        spec,
    };
    let claim = PodClaim {
        name: "devices".into(),
        requests: vec![
            request(
                "two",
                RequestSpec::Exactly(exact(
                    "gpu",
                    AllocationMode::ExactCount(2),
                    AdminAccess::Disabled,
                )),
            ),
            request(
                "nics",
                RequestSpec::Exactly(exact("nic", AllocationMode::All, AdminAccess::Disabled)),
            ),
            request(
                "watch",
                RequestSpec::Exactly(exact(
                    "gpu",
                    AllocationMode::ExactCount(4),
                    AdminAccess::Enabled,
                )),
            ),
            request(
                "choice",
                RequestSpec::FirstAvailable(vec![
                    SubRequest {
                        name: "big".into(),
                        exact: exact("gpu", AllocationMode::ExactCount(3), AdminAccess::Disabled),
                    },
                    SubRequest {
                        name: "small".into(),
                        exact: exact("gpu", AllocationMode::ExactCount(1), AdminAccess::Disabled),
                    },
                ]),
            ),
        ],
        constraints: Vec::new(),
        config: Vec::new(),
    };
    let mut spec = PodSpec {
        claims: vec![claim],
        ..PodSpec::default()
    };
    spec.requests.cpu_milli = 500;
    let charged = queue_footprint(&spec);
    assert_eq!(
        charged.get(&device_class_resource("gpu")),
        2 + 3,
        "exact 2, choice at most 3, admin 0"
    );
    assert_eq!(
        charged.get(&device_class_resource("nic")),
        1,
        "All: at least one"
    );
    assert_eq!((charged.cpu_milli, charged.pods), (500, 1));
    let limits = Limits::from_quantities(
        &FieldPath::new("max"),
        &quantities(&[("gpu.deviceclass.resource.k8s.io/devices", "4")]),
    )
    .expect("a device class is a resource a queue can limit");
    assert_eq!(
        limits.first_exceeded(&charged),
        Some((device_class_resource("gpu"), 5, 4))
    );
}

#[test]
fn the_first_resource_past_max_is_named_with_both_amounts() {
    let q = spec("a", &[], &[("cpu", "2"), ("pods", "3")]);
    let mut usage = Resources::zero();
    usage.set(&ResourceName::Cpu, 2_000);
    usage.set(&ResourceName::Pods, 3);
    assert_eq!(q.max.first_exceeded(&usage), None, "at max is within");
    usage.set(&ResourceName::Pods, 4);
    assert_eq!(
        q.max.first_exceeded(&usage),
        Some((ResourceName::Pods, 4, 3))
    );
    usage.set(&ResourceName::Memory, u64::MAX);
    assert_eq!(
        q.max.first_exceeded(&usage),
        Some((ResourceName::Pods, 4, 3)),
        "memory is not limited"
    );
}
