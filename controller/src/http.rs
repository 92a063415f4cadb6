//! The controller's HTTP endpoints: `/metrics` (OpenMetrics), `/healthz` (process alive) and
//! `/readyz` (caches synced and leadership known).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// Readiness facts, flipped by the controller as it starts.
#[derive(Clone, Default)]
pub struct Readiness {
    caches_synced: Arc<AtomicBool>,
    leadership_known: Arc<AtomicBool>,
}

impl Readiness {
    pub fn set_caches_synced(&self, v: bool) {
        self.caches_synced.store(v, Ordering::SeqCst);
    }
    pub fn set_leadership_known(&self, v: bool) {
        self.leadership_known.store(v, Ordering::SeqCst);
    }
    /// Why the controller is not ready, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        if !self.caches_synced.load(Ordering::SeqCst) {
            Some("caches not synced yet")
        } else if !self.leadership_known.load(Ordering::SeqCst) {
            Some("leadership not known yet")
        } else {
            None
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    readiness: Readiness,
}

/// Router serving `/metrics`, `/healthz` and `/readyz`.
pub fn router(metrics: Metrics, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, readiness })
}

/// OpenMetrics (with the trace-id exemplars) when the scraper asks for it, as Prometheus does;
/// the classic text format otherwise.
async fn metrics_handler(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    use ebb_telemetry::exposition::{
        OPENMETRICS, PROMETHEUS_TEXT, to_prometheus_text, wants_openmetrics,
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if wants_openmetrics(accept) {
        (
            [(header::CONTENT_TYPE, OPENMETRICS)],
            state.metrics.encode(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            to_prometheus_text(&state.metrics.encode()),
        )
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.readiness.not_ready_reason() {
        None => (StatusCode::OK, "ok".to_string()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get_path(app: Router, path: &str) -> (StatusCode, String) {
        let resp = app
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn ready_only_after_sync_and_leadership() {
        let readiness = Readiness::default();
        let app = router(Metrics::new(), readiness.clone());
        assert_eq!(get_path(app.clone(), "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get_path(app.clone(), "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "caches not synced yet".into()
            )
        );
        readiness.set_caches_synced(true);
        assert_eq!(
            get_path(app.clone(), "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "leadership not known yet".into()
            )
        );
        readiness.set_leadership_known(true);
        assert_eq!(get_path(app, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_endpoint_serves_openmetrics() {
        let metrics = Metrics::new();
        metrics
            .drains_in_progress
            .get_or_create(&crate::metrics::PolicyLabels { policy: "p".into() })
            .set(2);
        let (status, body) = get_path(router(metrics, Readiness::default()), "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("ebb_drains_in_progress{policy=\"p\"} 2"),
            "{body}"
        );
    }
}
