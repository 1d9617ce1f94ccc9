//! Unit tests of `wire.rs`.

use super::*;

#[test]
fn a_small_run_measures_every_item_in_both_formats() {
    let (ledger, commands) = gang_workload(20, 2, 4);
    let reserves: Vec<&LedgerCommand> = commands
        .iter()
        .filter(|c| matches!(c.op, LedgerOp::Reserve { .. }))
        .collect();
    assert_eq!(reserves.len(), 2);
    let json = measure("r", &reserves, WireFormat::Json, 1).expect("json");
    let binary = measure("r", &reserves, WireFormat::Binary, 1).expect("binary");
    assert!(
        binary.bytes < json.bytes,
        "{} vs {}",
        binary.bytes,
        json.bytes
    );
    let snap = measure_snapshot(&ledger, WireFormat::Binary, 1).expect("snapshot");
    assert!(snap.bytes > 0);
}
