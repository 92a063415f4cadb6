//! The node-local API pods use, on the Unix socket only: `GET /v1/resources` returns the status
//! and local paths of the caller's role resources, after validating its token offline. The probes
//! port serves only `/healthz`, `/readyz` and `/metrics`; everything but `/healthz` waits for recovery.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;

use crate::tokens::Keys;

/// One resource as a pod sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceView {
    pub name: String,
    /// `Localized`, `Fetching` or `Failed`.
    pub state: String,
    /// Absolute path on the node (present when `Localized`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A pod the API knows, with its role and resources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    pub role: String,
    pub resources: Vec<ResourceView>,
}

/// What the API serves from; the agent replaces parts of it as its state changes.
#[derive(Clone, Debug, Default)]
pub struct ApiView {
    pub ready: bool,
    pub keys: Keys,
    pub pods: BTreeMap<String, PodView>,
    pub cache_root: PathBuf,
}

/// Shared handle to the view.
#[derive(Clone, Default)]
pub struct ApiState {
    view: Arc<RwLock<ApiView>>,
    clock: Option<Arc<dyn Fn() -> i64 + Send + Sync>>,
    metrics: Option<Arc<crate::metrics::AgentMetrics>>,
}

impl ApiState {
    pub fn new(view: ApiView) -> Self {
        Self {
            view: Arc::new(RwLock::new(view)),
            clock: None,
            metrics: None,
        }
    }

    /// Serves these metrics on `/metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::AgentMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Uses `clock` (unix seconds) instead of the system clock (tests).
    pub fn with_clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    pub fn update(&self, f: impl FnOnce(&mut ApiView)) {
        let mut v = self.view.write().unwrap_or_else(|p| p.into_inner());
        f(&mut v);
    }

    fn now_secs(&self) -> i64 {
        match &self.clock {
            Some(c) => c(),
            None => jiff::Timestamp::now().as_second(),
        }
    }
}

fn reject(status: StatusCode, reason: String) -> Response {
    let error = status.canonical_reason().unwrap_or("Error");
    (status, Json(json!({ "error": error, "reason": reason }))).into_response()
}

async fn resources(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let now = state.now_secs();
    let view = state.view.read().unwrap_or_else(|p| p.into_inner());
    if !view.ready {
        return reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is recovering its state; retry shortly".into(),
        );
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let claims = if token.is_empty() {
        Err(crate::tokens::Rejection::Missing)
    } else {
        view.keys.validate(token, now)
    };
    let claims = match claims {
        Ok(c) => c,
        Err(r) => return reject(StatusCode::UNAUTHORIZED, r.to_string()),
    };
    let Some(pod) = view.pods.get(&claims.pod_uid) else {
        return reject(
            StatusCode::NOT_FOUND,
            format!("no pod with UID {} is known on this node", claims.pod_uid),
        );
    };
    if pod.role != claims.role {
        return reject(
            StatusCode::FORBIDDEN,
            format!(
                "token is for role {:?} but the pod has role {:?}",
                claims.role, pod.role
            ),
        );
    }
    Json(json!({
        "podUid": claims.pod_uid,
        "role": claims.role,
        "resources": pod.resources,
    }))
    .into_response()
}

async fn readyz(State(state): State<ApiState>) -> Response {
    let ready = state.view.read().unwrap_or_else(|p| p.into_inner()).ready;
    if ready {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "recovering").into_response()
    }
}

/// OpenMetrics when the scraper asks for it (Prometheus does), the classic text format otherwise.
async fn metrics(State(state): State<ApiState>, headers: axum::http::HeaderMap) -> Response {
    use ebb_telemetry::exposition::{
        OPENMETRICS, PROMETHEUS_TEXT, to_prometheus_text, wants_openmetrics,
    };
    let Some(m) = &state.metrics else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if wants_openmetrics(accept) {
        ([(header::CONTENT_TYPE, OPENMETRICS)], m.render()).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            to_prometheus_text(&m.render()),
        )
            .into_response()
    }
}

/// The node-local API (served on the Unix socket).
pub fn api_router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/resources", get(resources))
        .with_state(state)
}

/// Probes and metrics (served on `--listen-addr`): nothing about pods or resources.
pub fn probe_router(state: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MasterKey;
    use crate::tokens::issue;

    fn key(id: &str, b: u8) -> MasterKey {
        MasterKey {
            id: id.into(),
            secret: vec![b; 32],
        }
    }

    /// Serves a router on a loopback port (the tests' stand-in for the socket).
    async fn serve_router(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}")
    }

    async fn get_with(url: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let mut req = client.get(url);
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
        )
    }

    #[tokio::test]
    async fn serves_a_pods_resources_only_with_a_valid_token() {
        let mut pods = BTreeMap::new();
        pods.insert(
            "uid-1".to_string(),
            PodView {
                role: "region".into(),
                resources: vec![ResourceView {
                    name: "model".into(),
                    state: "Localized".into(),
                    path: Some("/var/cache/ebb/public/ab/model".into()),
                    size_bytes: 9,
                    message: None,
                }],
            },
        );
        let state = ApiState::new(ApiView {
            ready: false,
            keys: Keys {
                current: Some(key("k2", 2)),
                previous: Some(key("k1", 1)),
            },
            pods,
            cache_root: "/var/cache/ebb".into(),
        })
        .with_clock(|| 1_000);
        let base = serve_router(api_router(state.clone())).await;
        let probes = serve_router(probe_router(state.clone())).await;
        let url = format!("{base}/v1/resources");
        let good = issue(&key("k1", 1), "uid-1", "region", 2_000);

        let (status, body) = get_with(&url, Some(&good)).await;
        assert_eq!(status, 503, "not before recovery: {body}");
        assert_eq!(get_with(&format!("{probes}/readyz"), None).await.0, 503);
        state.update(|v| v.ready = true);
        assert_eq!(get_with(&format!("{probes}/readyz"), None).await.0, 200);
        // the probes port knows nothing of resources, the socket nothing of metrics
        assert_eq!(
            get_with(&format!("{probes}/v1/resources"), Some(&good))
                .await
                .0,
            404
        );
        assert_eq!(get_with(&format!("{base}/metrics"), None).await.0, 404);

        let (status, body) = get_with(&url, Some(&good)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["resources"][0]["path"],
            "/var/cache/ebb/public/ab/model"
        );
        assert_eq!(body["role"], "region");

        let (status, body) = get_with(&url, None).await;
        assert_eq!(status, 401);
        assert!(
            body["reason"].as_str().unwrap().contains("no token"),
            "{body}"
        );
        let expired = issue(&key("k2", 2), "uid-1", "region", 999);
        let (status, body) = get_with(&url, Some(&expired)).await;
        assert_eq!(status, 401);
        assert!(
            body["reason"].as_str().unwrap().contains("expired"),
            "{body}"
        );
        let wrong = issue(&key("k3", 3), "uid-1", "region", 2_000);
        let (status, body) = get_with(&url, Some(&wrong)).await;
        assert_eq!(status, 401);
        assert!(body["reason"].as_str().unwrap().contains("k3"), "{body}");
        let other_role = issue(&key("k2", 2), "uid-1", "master", 2_000);
        assert_eq!(get_with(&url, Some(&other_role)).await.0, 403);
        let other_pod = issue(&key("k2", 2), "uid-9", "region", 2_000);
        assert_eq!(get_with(&url, Some(&other_pod)).await.0, 404);
    }
}
