//! Unit tests of `bench.rs`.

use super::*;

#[test]
fn single_pods_fill_the_fleet_until_it_is_full() {
    let report = run(20, 300);
    assert_eq!(report.pods_requested, 300);
    assert_eq!(report.pods_placed, 300);
    assert_eq!(report.reserve_refusals, 0);
    assert_eq!(report.ledger_commands, 20 + 2 * 300);
    // 2 nodes × 32 cpu hold 64 cpu: average pod 937.5m → about 68 pods, then nothing fits.
    let full = run(2, 100);
    assert_eq!(full.pods_placed + full.pods_unplaced, 100);
    assert!(full.pods_placed >= 60 && full.pods_placed < 100, "{full:?}");
    assert_eq!(run(20, 300), report, "deterministic");
}

#[test]
fn gangs_are_packed_per_zone() {
    // 8 workers per node, 16 workers per gang: 2 nodes per gang.
    let report = run_gangs(40, 6, 16);
    assert_eq!(report.gangs_placed, 6);
    assert_eq!(report.pods_placed, 96);
    let too_many = run_gangs(4, 3, 16);
    assert_eq!(too_many.gangs_placed, 2);
    assert_eq!(too_many.pods_unplaced, 16);
}

#[test]
fn gpu_pods_fill_every_gpu_and_no_more() {
    // 4 nodes × 8 GPUs: 32 pods fit, the 33rd finds no device.
    let report = run_devices(4, 33);
    assert_eq!(report.pods_placed, 32);
    assert_eq!(report.devices_allocated, 32);
    assert_eq!(report.pods_unplaced, 1);
    assert_eq!(report.reserve_refusals, 0);
    assert_eq!(run_devices(4, 33), report, "deterministic");
}

#[test]
fn mig_gangs_never_over_consume_slices() {
    // 2 nodes × 8 GPUs × 7 one-slice partitions = 112 slices: 56 pods of 2 slices.
    let report = run_device_gangs(2, 4, 16);
    assert_eq!(report.gangs_placed, 3);
    assert_eq!(report.pods_placed, 48);
    assert_eq!(report.devices_allocated, 96);
    assert_eq!(report.reserve_refusals, 0);
}
