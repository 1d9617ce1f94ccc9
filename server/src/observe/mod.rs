//! Observability: the Prometheus recorder, logging, the HTTP endpoints
//! (/healthz, /readyz, /metrics) and the sampler that turns led groups' state into
//! gauges. Metric names start with `gangway_`; docs/METRICS.md is the catalogue.

pub mod http;
pub mod sampler;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets (seconds) for every `*_seconds` histogram.
const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Installs the process's Prometheus recorder (once, at the binary edge).
pub fn install_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS_S)?
        .install_recorder()
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines with span context.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields, current span and its
    /// parents: `placement_round`, `transaction` with its txn id), for log pipelines.
    Json,
}

/// Logs to stderr in `format`; `RUST_LOG` sets the level (default: info, openraft at error).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error,sled=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}
