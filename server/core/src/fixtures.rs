//! Fixtures the unit tests of every layer share (test builds only): nodes of given
//! resources and labels, and ledger commands applied with or without the full
//! invariant check.

use std::collections::BTreeMap;

use crate::ledger::{LedgerCommand, LedgerOp, LedgerReply, ShardLedger};
use crate::model::{Node, Resources};

/// `cpu_milli` CPU, `memory_bytes` memory and room for `pods` pods.
pub fn resources(cpu_milli: u64, memory_bytes: u64, pods: u64) -> Resources {
    Resources {
        cpu_milli,
        memory_bytes,
        pods,
        ..Resources::zero()
    }
}

/// A node named `name` with those resources allocatable and no labels.
pub fn node_with(name: &str, cpu_milli: u64, memory_bytes: u64, pods: u64) -> Node {
    Node::new(name, resources(cpu_milli, memory_bytes, pods))
}

/// `pairs` as a label map.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Applies `op` to `ledger` at `at_ms`.
pub fn apply(ledger: &mut ShardLedger, at_ms: u64, op: LedgerOp) -> LedgerReply {
    ledger.apply(&LedgerCommand::new(at_ms, op))
}

/// Applies `op` to `ledger` at `at_ms`, then checks every invariant (panicking with the
/// reply when one breaks).
pub fn apply_checked(ledger: &mut ShardLedger, at_ms: u64, op: LedgerOp) -> LedgerReply {
    let reply = apply(ledger, at_ms, op);
    if let Err(e) = ledger.check_invariants() {
        panic!("{e} after {reply:?}");
    }
    reply
}
