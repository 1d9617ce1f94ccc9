//! Placement metrics: how long each phase of a placement takes
//! (`gangway_placement_phase_seconds{phase}`: the coordinator's round phases, and
//! `bind`, one pod's claim writes and binding), how many pods were placed and bound,
//! and how transactions ended. Called by the coordinator and the Kubernetes binder;
//! docs/METRICS.md is the catalogue.

use std::time::Instant;

use gangway_core::ledger::meta::Decision;

/// A phase of a placement round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the queue of pending groups from the meta group.
    Pending,
    /// Asking shards for placement plans.
    Quote,
    /// Recording the transaction in the meta group.
    Begin,
    /// Phase 1 on the participants (or reserve-and-commit on one shard).
    Reserve,
    /// Recording the decision in the meta group.
    Decide,
    /// Phase 2: telling the participants.
    Commit,
    /// A whole round.
    Round,
    /// One pod's claim allocations and binding through the Kubernetes API.
    Bind,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Quote => "quote",
            Phase::Begin => "begin",
            Phase::Reserve => "reserve",
            Phase::Decide => "decide",
            Phase::Commit => "commit",
            Phase::Round => "round",
            Phase::Bind => "bind",
        }
    }
}

/// Times one phase from creation to drop.
pub struct PhaseTimer {
    phase: Phase,
    started: Instant,
}

impl PhaseTimer {
    /// Starts timing `phase`.
    pub fn start(phase: Phase) -> Self {
        Self {
            phase,
            started: Instant::now(),
        }
    }
}

impl Drop for PhaseTimer {
    fn drop(&mut self) {
        metrics::histogram!("gangway_placement_phase_seconds", "phase" => self.phase.label())
            .record(self.started.elapsed().as_secs_f64());
    }
}

/// Transaction outcomes, as `gangway_transactions_total{outcome}` labels them.
pub const OUTCOMES: [&str; 2] = ["commit", "abort"];

/// Registers the counters at zero, so that rates exist before the first event.
pub fn register() {
    for outcome in OUTCOMES {
        metrics::counter!("gangway_transactions_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("gangway_pods_placed_total").increment(0);
    metrics::counter!("gangway_pods_bound_total").increment(0);
}

/// Counts a pod bound through the Kubernetes API.
pub fn pod_bound() {
    metrics::counter!("gangway_pods_bound_total").increment(1);
}

/// Counts a transaction's end and, when committed, the pods it placed.
pub fn transaction_ended(decision: Decision, pods: usize) {
    let outcome = match decision {
        Decision::Commit => OUTCOMES[0],
        Decision::Abort => OUTCOMES[1],
    };
    metrics::counter!("gangway_transactions_total", "outcome" => outcome).increment(1);
    if decision == Decision::Commit {
        metrics::counter!("gangway_pods_placed_total").increment(pods as u64);
    }
}
