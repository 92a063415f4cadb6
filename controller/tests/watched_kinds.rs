//! What `ebb-controller plan` reads, the running controller watches: both are pointed at an API
//! server that records every request, and every kind `plan` lists must be one the controller's
//! caches list and watch. A kind added to `plan` without a watch (the live model would not see
//! it) fails here.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{Request, Response};
use kube::client::Body;
use serde_json::json;

/// `(verb, resource)` of each request the recording API server saw.
type RequestLog = Arc<Mutex<Vec<(String, String)>>>;

/// An API server that serves an empty list for every collection, 404 for discovery (no Cluster
/// API or Karpenter), holds watches open, and records `(verb, resource)` of each request.
fn recording_client() -> (kube::Client, RequestLog) {
    let log: RequestLog = Arc::default();
    let seen = log.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let seen = seen.clone();
        async move {
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or("").to_string();
            let watch = query
                .split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1");
            if let Some(resource) = resource_of(&path) {
                let verb = if watch { "watch" } else { "list" };
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((verb.to_string(), resource));
            }
            if watch {
                // An open watch with nothing to say: the reflector waits on it.
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            let (code, body) = if resource_of(&path).is_some() {
                (
                    200,
                    json!({"kind": "List", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "1"}, "items": []}),
                )
            } else {
                (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not served"}),
                )
            };
            let mut response =
                Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
            *response.status_mut() = axum::http::StatusCode::from_u16(code).unwrap_or_default();
            response.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            Ok::<_, Infallible>(response)
        }
    });
    (kube::Client::new(svc, "default"), log)
}

/// `group/plural` (`plural` for the core group) of a cluster-wide collection path such as
/// `/api/v1/pods` or `/apis/apps/v1/replicasets`; `None` for discovery and other paths.
fn resource_of(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", _version, plural] => Some(plural.to_string()),
        ["apis", group, _version, plural] => Some(format!("{group}/{plural}")),
        _ => None,
    }
}

fn requests(log: &Mutex<Vec<(String, String)>>, verb: &str) -> BTreeSet<String> {
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(v, _)| v == verb)
        .map(|(_, r)| r.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_plan_lists_is_watched_by_the_controller() {
    let (client, log) = recording_client();
    ebb_controller::cli::plan::list_live(&client)
        .await
        .expect("plan lists against the recording API");
    let listed_by_plan = requests(&log, "list");
    for kind in [
        "nodes",
        "pods",
        "persistentvolumes",
        "storage.k8s.io/storageclasses",
    ] {
        assert!(
            listed_by_plan.contains(kind),
            "the recording API saw plan list {listed_by_plan:?}, not {kind}"
        );
    }

    let (client, log) = recording_client();
    let watches = ebb_controller::state::stores::start(client, &Default::default()).await;
    tokio::time::timeout(Duration::from_secs(20), watches.stores.wait_synced())
        .await
        .expect("the controller's caches sync against empty lists")
        .expect("no cache stopped");
    // Every cache has listed and opened its watch once it synced; give the watches a moment.
    let watched = watched_once(&log, &listed_by_plan).await;
    let missing: Vec<&String> = listed_by_plan.difference(&watched).collect();
    assert!(
        missing.is_empty(),
        "`ebb-controller plan` reads {missing:?}, which the running controller does not watch \
         (so its live model would not see them); plan lists {listed_by_plan:?}, the controller \
         watches {watched:?}"
    );
    for t in watches.tasks {
        t.abort();
    }
}

/// The kinds the controller has opened watches on, once every kind in `wanted` is among them or
/// a few seconds have passed.
async fn watched_once(
    log: &Mutex<Vec<(String, String)>>,
    wanted: &BTreeSet<String>,
) -> BTreeSet<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let watched = requests(log, "watch");
        if wanted.is_subset(&watched) || tokio::time::Instant::now() >= deadline {
            return watched;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
