//! `run` end to end against a fake API server (list and watch of this node's pods and of
//! PlacementHistories, the token Secret, the Node, NodeState apply): a first start reports a new
//! store; a restart after the pod vanished reports it recovered, with the container Lost.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use ebb_node_agent::agent::{open_store, run_with};
use ebb_node_agent::cli::RunArgs;
use http::{Request, Response};
use http_body_util::{Either, Full, channel::Channel};
use kube::client::Body;
use serde_json::{Value, json};

type FakeBody = Either<Full<Bytes>, Channel<Bytes, Infallible>>;

#[derive(Default)]
struct Fake {
    pods: Mutex<Vec<Value>>,
    statuses: Mutex<Vec<Value>>,
    /// Open watch streams (kept so they never end).
    watches: Mutex<Vec<http_body_util::channel::Sender<Bytes, Infallible>>>,
}

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
}

fn history() -> Value {
    json!({"apiVersion": "ebb.dev/v1alpha1", "kind": "PlacementHistory",
           "metadata": {"name": "hbase", "namespace": "ns", "uid": "ph-uid", "resourceVersion": "1"},
           "spec": {"selector": {"matchLabels": {"app": "hbase"}}, "roleLabel": "role",
                    "roles": [{"name": "region"}]}})
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "region-0", "namespace": "ns", "uid": "pod-uid-1", "resourceVersion": "1",
                        "labels": {"app": "hbase", "role": "region"}},
           "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "hbase:2"}]},
           "status": {"phase": "Running", "containerStatuses": [{"name": "main", "image": "hbase:2",
               "imageID": "", "ready": true, "restartCount": 0,
               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}})
}

impl Fake {
    fn reply(&self, method: &str, path: &str, query: &str, body: Value) -> (u16, Option<Value>) {
        if query.contains("watch=true") {
            return (200, None);
        }
        match (method, path) {
            ("GET", "/api/v1/pods") => {
                assert!(
                    query.contains("fieldSelector=spec.nodeName%3Dn1"),
                    "{query}"
                );
                (
                    200,
                    Some(list("PodList", "v1", self.pods.lock().unwrap().clone())),
                )
            }
            ("GET", "/apis/ebb.dev/v1alpha1/placementhistories") => (
                200,
                Some(list(
                    "PlacementHistoryList",
                    "ebb.dev/v1alpha1",
                    vec![history()],
                )),
            ),
            ("GET", "/api/v1/namespaces/ebb-system/secrets/ebb-node-agent-tokens") => (
                200,
                Some(json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "ebb-node-agent-tokens", "namespace": "ebb-system"},
                    "data": {"current.id": "azE=",
                             "current.key": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}})),
            ),
            ("GET", "/api/v1/nodes/n1") => (
                200,
                Some(
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "node-uid"}}),
                ),
            ),
            ("PATCH", "/apis/ebb.dev/v1alpha1/nodestates/n1/status") => {
                self.statuses.lock().unwrap().push(body["status"].clone());
                let mut obj = body;
                obj["metadata"] = json!({"name": "n1"});
                obj["spec"] = json!({"nodeName": "n1"});
                (200, Some(obj))
            }
            ("PATCH", "/apis/ebb.dev/v1alpha1/nodestates/n1") => {
                let mut obj = body;
                obj["metadata"]["name"] = json!("n1");
                (200, Some(obj))
            }
            _ => (
                404,
                Some(
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                            "reason": "NotFound", "code": 404, "message": format!("{method} {path}")}),
                ),
            ),
        }
    }

    fn client(self: &Arc<Self>) -> kube::Client {
        let this = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let query = req.uri().query().unwrap_or("").to_string();
                let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (status, reply) = this.reply(&method, &path, &query, body);
                let body: FakeBody = match reply {
                    Some(v) => {
                        Either::Left(Full::new(Bytes::from(serde_json::to_vec(&v).unwrap())))
                    }
                    None => {
                        let (tx, rx) = Channel::new(1);
                        this.watches.lock().unwrap().push(tx);
                        Either::Right(rx)
                    }
                };
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(body)
                        .unwrap(),
                )
            }
        });
        kube::Client::new(svc, "default")
    }
}

fn args(state: &std::path::Path, cache: &std::path::Path) -> RunArgs {
    RunArgs {
        node_name: "n1".into(),
        state_dir: Some(state.to_path_buf()),
        reset_state: false,
        cache_dir: cache.to_path_buf(),
        socket: state.join("unused.sock"),
        listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        report_interval_secs: 1,
        token_secret: "ebb-system/ebb-node-agent-tokens".into(),
        max_resource_bytes: 1 << 20,
        fetch_concurrency: 2,
        file_roots: vec![],
        fetch_allow_hosts: vec![],
        fetch_allow_cidrs: vec![],
        cluster_cidrs: vec![],
        cache_max_bytes: 1 << 30,
        namespace_quota_bytes: 1 << 30,
        no_socket: true,
        log_format: Default::default(),
        log_filter: "info".into(),
    }
}

/// Runs the agent until it has reported once, and returns that status.
async fn run_until_reported(
    fake: &Arc<Fake>,
    state: &std::path::Path,
    cache: &std::path::Path,
) -> Value {
    fake.statuses.lock().unwrap().clear();
    let opened = open_store(Some(state), false).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_with(
        args(state, cache),
        opened,
        fake.client(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let mut status = None;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Some(s) = fake.statuses.lock().unwrap().first() {
            status = Some(s.clone());
            break;
        }
        assert!(!task.is_finished(), "agent stopped early: {:?}", task.await);
    }
    let _ = stop_tx.send(());
    task.await.unwrap().unwrap();
    status.expect("no NodeState status written within 10s")
}

fn condition<'a>(status: &'a Value, t: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_then_restart_with_the_pod_gone() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cache = dir.path().join("cache");
    let fake = Arc::new(Fake::default());
    fake.pods.lock().unwrap().push(pod());

    let first = run_until_reported(&fake, &state, &cache).await;
    assert_eq!(first["recovery"]["result"], "New");
    assert_eq!(first["storeSchemaVersion"], "1.0");
    assert_eq!(first["containersTracked"], 1);
    assert_eq!(first["keyIds"]["current"], "k1");
    assert_eq!(condition(&first, "Ready")["status"], "True");
    assert_eq!(condition(&first, "StoreHealthy")["status"], "True");

    // the pod disappears while the agent is down
    fake.pods.lock().unwrap().clear();
    let second = run_until_reported(&fake, &state, &cache).await;
    assert_eq!(second["recovery"]["result"], "Recovered");
    assert_eq!(second["recovery"]["containers"], 1);
    assert_eq!(second["recovery"]["lost"], 1);
    let role = &second["roles"][0];
    assert_eq!(role["placementHistory"], "hbase");
    assert_eq!(role["role"], "region");
    assert_eq!(role["nodeFailures"], 1);
    assert_eq!(second["keyIds"]["current"], "k1");
}
