//! What a person reads after drills: one summary per drill, the totals of a
//! series, and the JSON written by `--report`.

use serde::Serialize;

use crate::checker::percentile;
use crate::drill::DrillReport;

/// Recovery figures in ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryStats {
    /// How many faults were measured.
    pub count: usize,
    /// Median.
    pub p50_ms: Option<u64>,
    /// 99th percentile.
    pub p99_ms: Option<u64>,
    /// Worst.
    pub max_ms: Option<u64>,
}

impl RecoveryStats {
    /// Figures over `values`.
    pub fn of(values: &[u64]) -> Self {
        Self {
            count: values.len(),
            p50_ms: percentile(values, 50),
            p99_ms: percentile(values, 99),
            max_ms: values.iter().copied().max(),
        }
    }

    fn line(&self) -> String {
        let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v} ms"));
        format!(
            "p50 {} · p99 {} · max {} (n={})",
            ms(self.p50_ms),
            ms(self.p99_ms),
            ms(self.max_ms),
            self.count
        )
    }
}

/// Recoveries of every fault, and of those that took a leader.
pub fn recovery_figures(reports: &[DrillReport]) -> (RecoveryStats, RecoveryStats) {
    let all: Vec<u64> = reports
        .iter()
        .flat_map(|r| r.recoveries.iter().filter_map(|x| x.ms))
        .collect();
    let leader: Vec<u64> = reports
        .iter()
        .flat_map(|r| {
            r.recoveries
                .iter()
                .filter(|x| x.leader_lost)
                .filter_map(|x| x.ms)
        })
        .collect();
    (RecoveryStats::of(&all), RecoveryStats::of(&leader))
}

/// The summary of one drill, as printed.
pub fn summary(r: &DrillReport) -> String {
    let (all, leader) = recovery_figures(std::slice::from_ref(r));
    let mut out = format!(
        "drill {} · seed {} · {:.1} s\n  faults injected: {}\n  operations: {} invoked, {} ok, {} fail, {} unknown\n  groups preempted: {}\n  recovery (all faults):      {}\n  recovery (leader lost):     {}\n  violations: {}\n",
        r.drill,
        r.seed,
        r.elapsed_ms as f64 / 1000.0,
        r.faults.len(),
        r.operations.invoked,
        r.operations.ok,
        r.operations.fail,
        r.operations.unknown,
        r.preempted,
        all.line(),
        leader.line(),
        r.violations.len(),
    );
    if r.moves_begun > 0 {
        out.push_str(&format!("  shard moves begun: {}\n", r.moves_begun));
    }
    if r.shards.1 != r.shards.0 {
        out.push_str(&format!(
            "  shards grown on the live cluster: {} -> {}\n",
            r.shards.0, r.shards.1
        ));
    }
    for f in &r.faults {
        out.push_str(&format!("    fault {f}\n"));
    }
    for v in &r.violations {
        out.push_str(&format!("  VIOLATION {}: {}\n", v.invariant, v.detail));
    }
    if !r.violations.is_empty() {
        out.push_str(&format!(
            "  seed {} · replay: {}\n  history and logs kept in {}\n",
            r.seed, r.replay, r.work_dir
        ));
    }
    out
}

/// The totals of a series of drills.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesReport {
    /// Drills run.
    pub drills: usize,
    /// Drills with at least one violation.
    pub failed: usize,
    /// Faults injected in all.
    pub faults: usize,
    /// Operations invoked in all.
    pub operations: u64,
    /// Gang groups that ended Preempted, in all.
    pub preempted: usize,
    /// Recovery after any fault.
    pub recovery_all: RecoveryStats,
    /// Recovery after losing a leader.
    pub recovery_leader_lost: RecoveryStats,
    /// Every drill.
    pub reports: Vec<DrillReport>,
}

impl SeriesReport {
    /// Totals over `reports`.
    pub fn of(reports: Vec<DrillReport>) -> Self {
        let (all, leader) = recovery_figures(&reports);
        Self {
            drills: reports.len(),
            failed: reports.iter().filter(|r| !r.violations.is_empty()).count(),
            faults: reports.iter().map(|r| r.faults.len()).sum(),
            operations: reports.iter().map(|r| r.operations.invoked).sum(),
            preempted: reports.iter().map(|r| r.preempted).sum(),
            recovery_all: all,
            recovery_leader_lost: leader,
            reports,
        }
    }

    /// The totals, as printed.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} drills · {} with violations · {} faults · {} operations · {} groups preempted\n  recovery (all faults):  {}\n  recovery (leader lost): {}\n",
            self.drills,
            self.failed,
            self.faults,
            self.operations,
            self.preempted,
            self.recovery_all.line(),
            self.recovery_leader_lost.line()
        );
        for r in self.reports.iter().filter(|r| !r.violations.is_empty()) {
            out.push_str(&format!(
                "  FAILED seed {}: {} violation(s) · replay: {}\n",
                r.seed,
                r.violations.len(),
                r.replay
            ));
        }
        out
    }
}
