//! Unit tests of `warmer.rs`.

use super::*;
use gangway_core::model::cel::compile_selector;

fn devices(n: usize) -> Vec<Device> {
    (0..n).map(|i| Device::new(format!("gpu-{i}"))).collect()
}

#[test]
fn cheap_selectors_are_ready_costly_ones_are_warmed_then_ready() {
    let warmer = SelectorWarmer::start().expect("thread");
    let devs = devices(50);
    let refs: Vec<(&str, &Device)> = devs.iter().map(|d| ("gpu.example.com", d)).collect();
    let cheap = compile_selector("device.driver == \"gpu.example.com\"").expect("cheap");
    assert!(warmer.ready(&[cheap], &refs));

    let items: Vec<String> = (0..120).map(|i| i.to_string()).collect();
    let r = format!("[{}]", items.join(","));
    let slow = compile_selector(&format!(
        "{r}.exists(a, {r}.exists(b, a * b == 14399 + size(device.driver)))"
    ))
    .expect("within budget");
    assert!(slow.estimated_cost() * 50 > INLINE_SELECTOR_WORK_MAX);
    assert!(
        !warmer.ready(std::slice::from_ref(&slow), &refs),
        "cold: queued"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !warmer.ready(std::slice::from_ref(&slow), &refs) {
        assert!(std::time::Instant::now() < deadline, "never warmed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let cold = refs
        .iter()
        .filter(|(d, dev)| !slow.is_cached(d, dev))
        .count() as u64;
    assert!(
        cold * slow.estimated_cost() <= INLINE_SELECTOR_WORK_MAX,
        "{cold} cold"
    );
    warmer.stop();
}

#[test]
fn inline_never_defers() {
    let devs = devices(3);
    let refs: Vec<(&str, &Device)> = devs.iter().map(|d| ("x.example.com", d)).collect();
    let items: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    let r = format!("[{}]", items.join(","));
    let slow = compile_selector(&format!("{r}.exists(a, {r}.exists(b, a == b + 1000))"))
        .expect("within budget");
    assert!(SelectorWarmer::inline().ready(&[slow], &refs));
}
