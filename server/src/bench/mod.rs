//! `gangway bench …`: benchmarks that print figures for docs/BENCHMARKS.md.
//! Each run is bounded in time and talks only to 127.0.0.1.

pub mod abuse;
pub mod e2e;
pub mod engine;
pub mod failover;
pub mod parked;
pub mod preemption;
pub mod raft;
pub mod selectors;
pub mod shards;
pub mod starvation;
pub mod topology;
pub mod ui;
pub mod webdriver;
pub mod wire;

/// Resident memory of process `pid` (`None`: this process) in bytes, from /proc.
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The p-th percentile (0..=100) of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
