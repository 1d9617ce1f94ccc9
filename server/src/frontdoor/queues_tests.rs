//! Unit tests of `queues.rs`.

use super::*;
use gangway_core::model::Resources;

fn api(name: &str, max: &[(&str, &str)]) -> ApiQueueSpec {
    ApiQueueSpec {
        name: name.into(),
        max: max
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn api_queues_are_read_with_defaults_and_errors_name_the_field() {
    let spec = queue_spec(&api("team-a", &[("cpu", "8"), ("nvidia.com/gpu", "4")])).expect("valid");
    assert_eq!(spec.weight, QUEUE_WEIGHT_DEFAULT);
    assert_eq!(
        spec.max.get(&gangway_core::model::ResourceName::Cpu),
        Some(8_000)
    );
    let bad = queue_spec(&api("team-a", &[("cpu", "eight")])).expect_err("bad quantity");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(
        bad.message().starts_with("queue.max.cpu"),
        "{}",
        bad.message()
    );
    let name = queue_spec(&api("", &[])).expect_err("no name");
    assert!(
        name.message().starts_with("queue.name"),
        "{}",
        name.message()
    );
}

#[test]
fn statuses_print_cpu_in_cores_and_leave_zero_usage_out() {
    let spec = queue_spec(&api("team-a", &[("cpu", "1500m")])).expect("valid");
    let mut usage = Resources::zero();
    usage.cpu_milli = 2_000;
    let mut decayed = Resources::zero();
    decayed.cpu_milli = 1_250;
    let shown = crate::convert::queue_status(&QueueStatus {
        spec,
        usage,
        decayed_usage: Some(decayed),
        queued: 1,
        admitted: 2,
    });
    assert_eq!(shown.usage.get("cpu").map(String::as_str), Some("2"));
    assert_eq!(shown.usage.len(), 1);
    assert_eq!(
        shown.decayed_usage.get("cpu").map(String::as_str),
        Some("1250m")
    );
    let max = shown.spec.map(|s| s.max).unwrap_or_default();
    assert_eq!(max.get("cpu").map(String::as_str), Some("1500m"));
}
