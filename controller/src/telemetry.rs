//! Logs and traces of the controller: the shared `ebb-telemetry` subscriber and OTLP exporter,
//! and the current trace id for metric exemplars.

/// The `/metrics` exposition formats (OpenMetrics and the classic text format).
pub use ebb_telemetry::exposition;
pub use ebb_telemetry::{current_trace_id, init};
