//! `gangway bench …`: benchmarks that print figures for docs/BENCHMARKS.md.
//! Each run is bounded in time and talks only to 127.0.0.1.

pub mod e2e;
pub mod engine;
pub mod failover;
pub mod preemption;
pub mod raft;
pub mod selectors;
pub mod ui;
pub mod webdriver;
pub mod wire;

/// The p-th percentile (0..=100) of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
