//! The `gangway` binary: `serve` (one replica of a cluster), `dev` (the whole
//! system in one process), `agent` (a node agent for device plugins) and `bench`
//! (benchmarks). Errors end the process
//! with a one-line message and exit code 1.

use clap::{Parser, Subcommand};
use gangway_server::agent::{self, AgentArgs};
use gangway_server::bench::abuse::AbuseBenchArgs;
use gangway_server::bench::e2e::E2eBenchArgs;
use gangway_server::bench::engine::EngineBenchArgs;
use gangway_server::bench::failover::FailoverBenchArgs;
use gangway_server::bench::preemption::PreemptionBenchArgs;
use gangway_server::bench::raft::RaftBenchArgs;
use gangway_server::bench::selectors::SelectorBenchArgs;
use gangway_server::bench::ui::UiBenchArgs;
use gangway_server::bench::wire::WireBenchArgs;
use gangway_server::config::{ServeArgs, ServeConfig};
use gangway_server::dev::DevArgs;
use gangway_server::{bench, dev, observe, serve};

/// gangway: a distributed gang and device scheduler.
#[derive(Parser)]
#[command(name = "gangway", version, about)]
struct Cli {
    /// Log line format on stderr (RUST_LOG sets the level).
    #[arg(long, global = true, value_enum, default_value_t = observe::LogFormat::Text)]
    log_format: observe::LogFormat,
    /// Export spans to this OTLP/gRPC collector (e.g. http://otel-collector:4317).
    #[arg(long, global = true, env = "GANGWAY_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one replica of a gangway cluster.
    Serve(ServeArgs),
    /// Run the whole system in one process with a simulated fleet.
    Dev(DevArgs),
    /// Run a node agent that Kubernetes device plugins register with (nodes without kubelets).
    Agent(AgentArgs),
    /// Run a benchmark and print its figures.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Raft commit throughput and latency, sled and in-memory stores.
    Raft(RaftBenchArgs),
    /// Placement engine and shard ledger throughput on one core, and memory per node.
    Engine(EngineBenchArgs),
    /// The replicated encoding on one core: commands and snapshots in binary and JSON.
    Wire(WireBenchArgs),
    /// End to end: three real processes, nodes through the Inventory API, gangs through the client.
    E2e(E2eBenchArgs),
    /// Placement stopped by a meta leader kill, with many gang groups placed.
    Failover(FailoverBenchArgs),
    /// Submission to placed of a high-priority gang that must preempt, victims on 1, 2, 4 shards.
    Preemption(PreemptionBenchArgs),
    /// A tenant's plain gang placed while another tenant attacks, against idle.
    Abuse(AbuseBenchArgs),
    /// Placement latency of plain gangs while a gang with a slow CEL selector waits.
    Selectors(SelectorBenchArgs),
    /// The web view in a headless Chromium: time to first render of each page and update latency.
    Ui(UiBenchArgs),
    /// The shard map: unequal zones laid out and rebalanced, placement while a zone moves.
    Shards(gangway_server::bench::shards::ShardsBenchArgs),
    /// Topology-aware gangs on blocks of racks: one-domain share, stranded GPUs, rate.
    Topology(gangway_server::bench::topology::TopologyBenchArgs),
    /// What groups that fit nowhere cost: idle CPU and placeable gangs' rate, parked and not.
    Parked(gangway_server::bench::parked::ParkedBenchArgs),
    /// A large gang behind a stream of small ones: its wait and the GPUs kept busy, per
    /// `--head-reservations` mode.
    Starvation(gangway_server::bench::starvation::StarvationBenchArgs),
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            let cfg = ServeConfig::resolve(args)?;
            let prometheus = observe::install_metrics()?;
            serve::run(cfg, Some(prometheus)).await
        }
        Command::Dev(args) => {
            let prometheus = observe::install_metrics()?;
            dev::run(args, Some(prometheus)).await
        }
        Command::Agent(args) => {
            let prometheus = observe::install_metrics()?;
            agent::run(args, Some(prometheus), serve::shutdown_signal()).await
        }
        Command::Bench {
            which: Bench::Raft(args),
        } => bench::raft::run(args).await,
        Command::Bench {
            which: Bench::Engine(args),
        } => bench::engine::run_bench(args),
        Command::Bench {
            which: Bench::Topology(args),
        } => bench::topology::run_bench(args),
        Command::Bench {
            which: Bench::Wire(args),
        } => bench::wire::run_bench(args),
        Command::Bench {
            which: Bench::E2e(args),
        } => bench::e2e::run(args).await,
        Command::Bench {
            which: Bench::Failover(args),
        } => bench::failover::run(args).await,
        Command::Bench {
            which: Bench::Preemption(args),
        } => bench::preemption::run(args).await,
        Command::Bench {
            which: Bench::Selectors(args),
        } => bench::selectors::run(args).await,
        Command::Bench {
            which: Bench::Abuse(args),
        } => bench::abuse::run(args).await,
        Command::Bench {
            which: Bench::Ui(args),
        } => bench::ui::run(args).await,
        Command::Bench {
            which: Bench::Shards(args),
        } => bench::shards::run(args).await,
        Command::Bench {
            which: Bench::Parked(args),
        } => bench::parked::run(args).await,
        Command::Bench {
            which: Bench::Starvation(args),
        } => bench::starvation::run(args).await,
    }
}

/// Time left to blocking tasks when the process exits.
const RUNTIME_EXIT_MS: u64 = 1_000;

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gangway: error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let telemetry = runtime
        .block_on(async { observe::init_logging(cli.log_format, cli.otlp_endpoint.as_deref()) });
    let telemetry = match telemetry {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gangway: error: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(run(cli));
    telemetry.shutdown();
    // Blocking work still running (a sled flush on a stuck disk) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(RUNTIME_EXIT_MS));
    if let Err(e) = result {
        eprintln!("gangway: error: {e:#}");
        std::process::exit(1);
    }
}
