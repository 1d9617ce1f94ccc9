//! Fixtures the unit tests of every layer share (test builds only): nodes of given
//! resources and labels, and ledger commands applied with or without the full
//! invariant check.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::ledger::{LedgerCommand, LedgerOp, LedgerReply, ShardLedger};
use crate::model::pod::{NodeSelectorOperator, NodeSelectorRequirement};
use crate::model::{Node, PodSummary, Resources};

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

/// A pod summary asking `cpu_milli` CPU and nothing else.
pub fn pod_with_cpu(cpu_milli: u64) -> PodSummary {
    PodSummary {
        requests: resources(cpu_milli, 0, 0),
        ..PodSummary::default()
    }
}

/// A node selector requirement on `key`.
pub fn requirement(
    key: &str,
    operator: NodeSelectorOperator,
    values: &[&str],
) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
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

/// Two ledgers that apply `commands` agree on every reply and on their snapshot (I6); the
/// snapshot restores to an equal ledger, which keeps agreeing with the first on `then`.
pub fn replicas_agree(
    commands: &[LedgerCommand],
    then: &[LedgerCommand],
) -> Result<(), TestCaseError> {
    let mut a = ShardLedger::new();
    let mut b = ShardLedger::new();
    for cmd in commands {
        prop_assert_eq!(a.apply(cmd), b.apply(cmd));
    }
    let snap = a.snapshot();
    prop_assert_eq!(&snap, &b.snapshot());
    let restored = ShardLedger::restore(&snap);
    prop_assert!(restored.is_ok(), "{:?}", restored);
    let mut restored = restored.unwrap_or_default();
    prop_assert_eq!(&restored.snapshot(), &snap);
    prop_assert_eq!(&restored, &a);
    for cmd in then {
        prop_assert_eq!(restored.apply(cmd), a.apply(cmd));
    }
    prop_assert_eq!(restored.snapshot(), a.snapshot());
    Ok(())
}
