//! `gangway-chaos`: run failover drills against real `gangway serve` processes.
//!
//! Exit codes: 0 every invariant held, 1 a violation was found (or the
//! self-test's checker missed one), 2 the drill could not start.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use gangway_chaos::drill::{self, DrillKind, DrillReport, DrillSpec, BUGS, SELF_TEST_BUGS};
use gangway_chaos::report::{summary, SeriesReport};
use gangway_chaos::supervisor::kill_registered;

/// Failover drills against real gangway processes, with an invariant checker.
#[derive(Parser)]
#[command(name = "gangway-chaos", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one drill.
    Run(RunArgs),
    /// Run a drill many times with consecutive seeds and report the totals.
    Soak {
        #[command(flatten)]
        run: RunArgs,
        /// How many drills (seeds --seed, --seed+1, ...).
        #[arg(long, default_value_t = 200)]
        count: u64,
    },
    /// Check the checker: each bug switch, armed alone in a mixed drill, must be caught.
    SelfTest {
        #[command(flatten)]
        run: RunArgs,
    },
    /// The bounded set CI runs: every named drill briefly, then the self-test of every bug.
    Ci {
        #[command(flatten)]
        run: RunArgs,
    },
    /// List the drills.
    List,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// The drill.
    #[arg(long, value_enum, default_value = "mixed")]
    drill: DrillKind,
    /// Seed of the fault schedule and the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long faults are injected (e.g. 8s, 1500ms, 2m).
    #[arg(long, default_value = "8s", value_parser = parse_duration_ms)]
    duration: u64,
    /// Replicas to start.
    #[arg(long, default_value_t = 3)]
    replicas: u64,
    /// Shard groups.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// The gangway binary [default: `gangway` next to this binary, else on PATH].
    #[arg(long)]
    gangway: Option<PathBuf>,
    /// Where data dirs, logs and the history go [default: a new dir under the temp dir].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Use ports from here (gRPC and HTTP per replica) instead of free ones.
    #[arg(long)]
    base_port: Option<u16>,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Keep the work dir even when every invariant held.
    #[arg(long)]
    keep: bool,
    /// Arm a deliberate bug to see the checker catch it (self-test: the bugs to try,
    /// default every one it is known to catch).
    #[arg(long, value_parser = BUGS)]
    bug: Vec<String>,
}

fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let (n, mult) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000)
    } else {
        return Err(format!("{text:?}: give a unit, e.g. 8s, 1500ms or 2m"));
    };
    n.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("{text:?} is not a duration like 8s, 1500ms or 2m"))
}

fn find_gangway(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("gangway")));
    if let Some(s) = sibling.filter(|s| s.is_file()) {
        return s;
    }
    // Test binaries live one level below the binaries (target/debug/deps).
    let uncle = std::env::current_exe().ok().and_then(|exe| {
        exe.parent()
            .and_then(Path::parent)
            .map(|d| d.join("gangway"))
    });
    if let Some(u) = uncle.filter(|u| u.is_file()) {
        return u;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("gangway"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("gangway"))
}

impl RunArgs {
    fn spec(&self, seed: u64, kind: DrillKind) -> DrillSpec {
        let dir = match &self.work_dir {
            Some(d) => d.join(format!("{}-{seed}", kind.name())),
            None => std::env::temp_dir().join(format!(
                "gangway-chaos-{}-{}-{seed}",
                std::process::id(),
                kind.name()
            )),
        };
        DrillSpec {
            kind,
            seed,
            duration_ms: self.duration,
            replicas: self.replicas,
            shards: self.shards,
            bin: find_gangway(self.gangway.as_deref()),
            dir,
            base_port: self.base_port,
            bugs: self.bug.clone(),
        }
    }
}

/// Why a command stopped.
enum Stop {
    /// The drill could not start: one line on stderr, exit 2.
    CannotStart(String),
    /// Anything else at this edge.
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Self {
        Stop::Other(e)
    }
}

/// Runs one drill; removes its work dir unless a violation was found or `keep`.
async fn one(spec: DrillSpec, keep: bool) -> Result<DrillReport, Stop> {
    let dir = spec.dir.clone();
    let existed = dir.exists();
    let name = spec.kind.name();
    let seed = spec.seed;
    let result = drill::run(spec).await;
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            if !existed {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Err(Stop::CannotStart(format!(
                "cannot start drill {name} (seed {seed}): {e}"
            )));
        }
    };
    if report.violations.is_empty() && !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

fn write_json(path: Option<&Path>, value: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(value)?;
        std::fs::write(path, text).with_context(|| format!("--report {}", path.display()))?;
    }
    Ok(())
}

async fn series(
    args: &RunArgs,
    drills: &[(DrillKind, u64, u64)],
    stream: bool,
) -> Result<SeriesReport, Stop> {
    let mut reports = Vec::new();
    for (i, (kind, seed, duration)) in drills.iter().enumerate() {
        let mut spec = args.spec(*seed, *kind);
        spec.duration_ms = *duration;
        let r = one(spec, args.keep).await?;
        if stream {
            let leader: Vec<String> = r
                .recoveries
                .iter()
                .filter(|x| x.leader_lost)
                .filter_map(|x| x.ms.map(|ms| format!("{ms}")))
                .collect();
            println!(
                "[{}/{}] {} seed {}: {} faults, {} ops, {} preempted, {} violations, leader-loss recoveries [{}] ms",
                i + 1,
                drills.len(),
                r.drill,
                r.seed,
                r.faults.len(),
                r.operations.invoked,
                r.preempted,
                r.violations.len(),
                leader.join(", ")
            );
            if !r.violations.is_empty() {
                print!("{}", summary(&r));
            }
        }
        reports.push(r);
    }
    Ok(SeriesReport::of(reports))
}

async fn execute(cli: Cli) -> Result<ExitCode, Stop> {
    match cli.command {
        Command::List => {
            for kind in DrillKind::ALL {
                println!("{}", kind.name());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            let r = one(args.spec(args.seed, args.drill), args.keep).await?;
            print!("{}", summary(&r));
            write_json(args.report.as_deref(), &r)?;
            Ok(if r.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Soak { run, count } => {
            let drills: Vec<_> = (0..count)
                .map(|i| (run.drill, run.seed + i, run.duration))
                .collect();
            let s = series(&run, &drills, true).await?;
            print!("{}", s.summary());
            write_json(run.report.as_deref(), &s)?;
            Ok(if s.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::SelfTest { run } => {
            let caught = self_test(&run, run.seed, run.duration).await?;
            Ok(if caught {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Ci { mut run } => {
            let short = run.duration.min(4_000);
            let drills: Vec<_> = DrillKind::ALL
                .into_iter()
                .enumerate()
                .map(|(i, k)| (k, run.seed + i as u64, short))
                .collect();
            let s = series(&run, &drills, true).await?;
            print!("{}", s.summary());
            write_json(run.report.take().as_deref(), &s)?;
            run.drill = DrillKind::Mixed;
            let caught = self_test(&run, run.seed, short.max(6_000)).await?;
            Ok(if s.failed == 0 && caught {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Seeds the self-test tries per bug switch before it calls the bug missed: a drill's
/// faults and workload are random, and one seed may never open the bug's window
/// (`release-members-shards-first` was missed on seeds 1–3 of one clean-clone run and
/// caught on seed 1 of the run before it and on seed 4 run alone).
const SELF_TEST_SEEDS_MAX: u64 = 5;

/// Runs a mixed drill per bug switch (`run.bug`, or every one) with that switch
/// armed, on seeds `seed`, `seed + 1`, ... until the checker catches it (at most
/// `SELF_TEST_SEEDS_MAX`); true if it caught each. Prints one line per drill.
async fn self_test(run: &RunArgs, seed: u64, duration_ms: u64) -> Result<bool, Stop> {
    let bugs: Vec<String> = if run.bug.is_empty() {
        SELF_TEST_BUGS.iter().map(|b| b.to_string()).collect()
    } else {
        run.bug.clone()
    };
    let mut missed = Vec::new();
    let mut reports = Vec::new();
    for bug in &bugs {
        let mut caught = false;
        for try_seed in seed..seed + SELF_TEST_SEEDS_MAX {
            let r = self_test_once(run, bug, try_seed, duration_ms).await?;
            caught = !r.violations.is_empty();
            reports.push(r);
            if caught {
                break;
            }
        }
        if !caught {
            missed.push(bug.clone());
        }
    }
    write_json(run.report.as_deref(), &reports)?;
    if missed.is_empty() {
        println!("self-test passed: the checker caught {}", bugs.join(", "));
    } else {
        println!(
            "self-test FAILED: the checker missed {} on {SELF_TEST_SEEDS_MAX} seeds from {seed}",
            missed.join(", ")
        );
    }
    Ok(missed.is_empty())
}

/// One mixed drill with `bug` armed on `seed`; prints whether the checker caught it.
async fn self_test_once(
    run: &RunArgs,
    bug: &str,
    seed: u64,
    duration_ms: u64,
) -> Result<DrillReport, Stop> {
    let mut bugged = run.clone();
    bugged.bug = vec![bug.to_string()];
    bugged.duration = duration_ms;
    let mut spec = bugged.spec(seed, run.drill);
    // One dir per bug: the drills share kind and seed.
    spec.dir = spec.dir.with_file_name(format!(
        "{}-{bug}",
        spec.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let r = one(spec, run.keep).await?;
    print!("{}", summary(&r));
    match r.violations.first() {
        Some(v) => {
            println!(
                "self-test {bug} (seed {seed}): caught, {} violation(s), first {}",
                r.violations.len(),
                v.invariant
            );
            if !run.keep {
                let _ = std::fs::remove_dir_all(&r.work_dir);
            }
        }
        None => println!("self-test {bug} (seed {seed}): NOT caught"),
    }
    Ok(r)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gangway-chaos: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Stop::Other(e.into()))?;
        tokio::select! {
            r = execute(cli) => r,
            _ = tokio::signal::ctrl_c() => Err(Stop::Other(anyhow::anyhow!("interrupted"))),
            _ = term.recv() => Err(Stop::Other(anyhow::anyhow!("terminated"))),
        }
    });
    // The drill future is dropped by now, and with it the supervisor; this only
    // catches children of a future that could not be dropped cleanly.
    kill_registered();
    match outcome {
        Ok(code) => code,
        Err(Stop::CannotStart(line)) => {
            eprintln!("gangway-chaos: {line}");
            ExitCode::from(2)
        }
        Err(Stop::Other(e)) => {
            eprintln!("gangway-chaos: {e:#}");
            ExitCode::from(1)
        }
    }
}
