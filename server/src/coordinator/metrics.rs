//! The coordinator's metrics: how long each phase of a placement round takes
//! (`gangway_coordinator_phase_seconds{phase}`), how many pods it placed, and
//! how its transactions ended. Called by the coordinator only.

use std::time::Instant;

use crate::ledger::meta::Decision;

/// A phase of a placement round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the queue of pending groups from the meta group.
    Pending,
    /// Asking shards for placement plans (the quote).
    Plan,
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
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Plan => "plan",
            Phase::Begin => "begin",
            Phase::Reserve => "reserve",
            Phase::Decide => "decide",
            Phase::Commit => "commit",
            Phase::Round => "round",
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
        metrics::histogram!("gangway_coordinator_phase_seconds", "phase" => self.phase.label())
            .record(self.started.elapsed().as_secs_f64());
    }
}

/// Counts a transaction's end and, when committed, the pods it placed.
pub fn transaction_ended(decision: Decision, pods: usize) {
    let outcome = match decision {
        Decision::Commit => "commit",
        Decision::Abort => "abort",
    };
    metrics::counter!("gangway_transactions_total", "outcome" => outcome).increment(1);
    if decision == Decision::Commit {
        metrics::counter!("gangway_pods_placed_total").increment(pods as u64);
    }
}
