//! gangway-chaos: failover drills against real `gangway serve` processes.
//!
//! The supervisor starts replicas with a proxy on every peer link; drills
//! inject faults (kills, pauses, partitions, one-way loss, latency, crash
//! points at protocol steps, full and rolling restarts) while the workload
//! records what clients saw; the checker then verifies the invariants of docs/ARCHITECTURE.md §6
//! over that history and the cluster's final state.

pub mod checker;
pub mod drill;
pub mod history;
pub mod hostile;
pub mod kube_workload;
pub mod proxy;
pub mod report;
pub mod rng;
pub mod supervisor;
pub mod workload;
