//! Logs and traces of the controller: the shared `ebb-telemetry` subscriber and OTLP exporter,
//! and the current trace id for metric exemplars.

pub use ebb_telemetry::{current_trace_id, init};
