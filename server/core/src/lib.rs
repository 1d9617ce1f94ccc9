//! gangway-core: the scheduler's pure, deterministic core. No clock, I/O, randomness or
//! async runtime: every function here is a function of its inputs, so replicas that apply
//! the same log agree, and every rule is tested by unit and property tests.
//!
//! Layers, each importing only the ones before it (`.ci/layers.sh` checks it; tests are
//! exempt):
//!
//! 1. `wire`: the encoding of log entries and snapshots;
//! 2. `model`: the domain's objects (pods, nodes, gangs, devices, claims, queues) and their
//!    validation, label matching, CEL;
//! 3. `ledger`: the replicated state machines (a shard's nodes, reservations and devices;
//!    meta's groups, decisions, queues and shard map) and their commands;
//! 4. `engine`: placement (filters, scores, devices, inter-pod rules, preemption) over a
//!    ledger view;
//! 5. `query`: read-only questions to a shard ledger, some answered by the engine;
//! 6. `plan`: the coordinator's pure decisions (assigning placements to reservations,
//!    choosing victims, disruption budgets, rebalancing, delivering decisions).
//!
//! Services (gangway-server) call in; nothing here calls out.

pub mod wire;

pub mod model;

pub mod ledger;

pub mod engine;

pub mod query;

pub mod plan;

#[cfg(test)]
mod fixtures;
