//! Observability: the Prometheus recorder, logging, the HTTP endpoints
//! (/healthz, /readyz, /metrics) and the sampler that turns led groups' state into
//! gauges. Metric names start with `gangway_`; docs/METRICS.md is the catalogue.

pub mod http;
pub mod placement;
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

/// The tracing pipeline's parts that must be flushed at exit.
#[must_use = "call shutdown() at exit so buffered spans are exported"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered (bounded by the SDK's export timeout).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown() {
                eprintln!("gangway: warning: flushing spans to the OTLP endpoint failed: {e}");
            }
        }
    }
}

/// The tracing pipeline could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("--otlp-endpoint {endpoint}: {reason}")]
pub struct TelemetryError {
    endpoint: String,
    reason: String,
}

/// Log levels without `RUST_LOG`. openraft logs transient events at ERROR (every failed
/// send to a restarting peer, a vote request a starting peer refuses, a second
/// initialization): gangway logs what needs a person itself, so openraft is off by
/// default. A group that stops is logged with openraft's reason at ERROR (and the replica
/// exits), a silent peer at WARN (once, see `PEER_SILENT_WARN_MS` in gangway-raft), and
/// election-gate changes at INFO. `RUST_LOG=info,openraft=debug` brings openraft back.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft=off,sled=warn";

/// Colour only for a terminal, and never with `NO_COLOR` set (no escape codes in files).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Logs to stderr in `format` (`RUST_LOG` sets the level; default: `DEFAULT_LOG_FILTER`) and, with `otlp_endpoint` (an OTLP/gRPC collector such as
/// `http://otel-collector:4317`), exports every span (`placement_round`, `transaction`,
/// …) there in batches. Call inside the tokio runtime (the exporter's channel needs it).
pub fn init_logging(
    format: LogFormat,
    otlp_endpoint: Option<&str>,
) -> Result<Telemetry, TelemetryError> {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr());
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    };
    let provider = match otlp_endpoint {
        Some(endpoint) => Some(otlp_provider(endpoint)?),
        None => None,
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("gangway"))
            .boxed()
    });
    // A second initialisation (tests calling this twice) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(Telemetry { provider })
}

fn otlp_provider(
    endpoint: &str,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("gangway")
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}
