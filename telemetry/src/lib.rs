//! Logs and traces of ebb's binaries: a `tracing` subscriber (text or JSON) and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, an OTLP/gRPC exporter that never blocks or crashes them.

use std::time::Duration;

pub mod exposition;
pub mod report;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{OTEL_EXPORTER_OTLP_ENDPOINT, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Whether text logs are coloured: only on a terminal (a pod's log, a pipe or a file gets plain
/// text, never escape codes), and never with `NO_COLOR` set (<https://no-color.org>).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// How long one export to the collector may take before it is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long shutdown waits for the last spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "invalid log filter {filter:?}: {source} (use RUST_LOG syntax, e.g. \"info,ebb_controller=debug\")"
    )]
    Filter {
        filter: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("cannot build the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// Keeps the trace exporter alive; flushes it (bounded) when dropped.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// True when spans are exported to a collector.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
        {
            eprintln!("trace exporter shutdown: {err}");
        }
    }
}

/// The OTLP endpoint from the environment, if set and not empty.
pub fn otlp_endpoint() -> Option<String> {
    std::env::var(OTEL_EXPORTER_OTLP_ENDPOINT)
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Install the global subscriber. `service` names the process in traces (`ebb-controller`,
/// `ebb-node-agent`); `OTEL_RESOURCE_ATTRIBUTES` adds to its resource.
/// Must be called inside a Tokio runtime when an OTLP endpoint is set.
pub fn init(
    service: &'static str,
    format: LogFormat,
    filter: &str,
) -> Result<TelemetryGuard, TelemetryError> {
    let env_filter = EnvFilter::try_new(filter).map_err(|source| TelemetryError::Filter {
        filter: filter.to_string(),
        source,
    })?;
    let fmt_layer = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colour_on_stderr())
            .with_target(true)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed(),
    };
    let provider = match otlp_endpoint() {
        Some(endpoint) => Some(build_provider(service, &endpoint)?),
        None => None,
    };
    let otel_layer = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service))
            .boxed()
    });
    tracing_subscriber::registry()
        .with(env_filter)
        .with(fmt_layer)
        .with(otel_layer)
        .try_init()?;
    if let Some(endpoint) = otlp_endpoint() {
        tracing::info!(%endpoint, "exporting traces over OTLP/gRPC");
    }
    Ok(TelemetryGuard { provider })
}

fn build_provider(
    service: &'static str,
    endpoint: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: endpoint.to_string(),
            source,
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    // The batch exporter drops spans when its queue is full rather than blocking callers.
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Where the current span sits in its trace, kept to give a later span (one made after the
/// current span ended, too) the current span as its parent. Empty when not exporting.
#[derive(Clone, Debug, Default)]
pub struct TraceParent(opentelemetry::Context);

impl TraceParent {
    /// The current span's place in its trace.
    pub fn current() -> Self {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        TraceParent(tracing::Span::current().context())
    }

    /// Makes `span` a child of the span this was taken in.
    pub fn adopt(&self, span: &tracing::Span) {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let _ = span.set_parent(self.0.clone());
    }
}

/// Trace id of the current span, for metric exemplars; `None` when not exporting.
pub fn current_trace_id() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_filter_is_reported_with_guidance() {
        let err = match init("test", LogFormat::Text, "info,[=") {
            Err(e) => e,
            Ok(_) => panic!("a malformed filter was accepted"),
        };
        assert!(err.to_string().contains("RUST_LOG syntax"), "{err}");
    }

    #[test]
    fn no_trace_id_outside_an_exported_span() {
        assert_eq!(current_trace_id(), None);
    }

    #[tokio::test]
    async fn an_unreachable_collector_does_not_block_startup_or_shutdown() {
        // Port 9 on loopback (discard) is closed: exports fail fast, shutdown stays bounded.
        let provider = build_provider("test", "http://127.0.0.1:9").unwrap();
        let tracer = provider.tracer("test");
        use opentelemetry::trace::Tracer;
        tracer.in_span("work", |_| {});
        // A hang here would block the controller's exit: bound it generously.
        let shutdown =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT));
        let finished = tokio::time::timeout(Duration::from_secs(60), shutdown).await;
        assert!(
            finished.is_ok(),
            "shutdown with an unreachable collector hung"
        );
    }
}
