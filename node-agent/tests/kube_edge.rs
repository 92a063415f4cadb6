//! The agent's Kubernetes calls against a fake API server (a tower service): the pod list is
//! filtered by `spec.nodeName`, the NodeState is created owned by its Node and its status written
//! by server-side apply on `/status`, the token Secret is read (absent is not an error).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use ebb_api::NodeStateStatus;
use ebb_node_agent::kube_edge;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

fn fake(seen: Arc<Mutex<Vec<Seen>>>) -> kube::Client {
    let svc = tower::service_fn(move |req: Request<Body>| {
        let seen = seen.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let query = req.uri().query().unwrap_or("").to_string();
            let content_type = req
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            seen.lock().unwrap().push(Seen {
                method: method.clone(),
                path: path.clone(),
                query,
                content_type,
                body: body.clone(),
            });
            let (status, reply) = match (method.as_str(), path.as_str()) {
                ("GET", "/api/v1/nodes/n1") => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": "n1", "uid": "node-uid-1"}}),
                ),
                ("GET", "/api/v1/pods") => (
                    200,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                           "items": [{"metadata": {"name": "web-1", "namespace": "ns", "uid": "u1"}}]}),
                ),
                ("GET", "/api/v1/namespaces/ebb-system/secrets/keys") => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": "keys", "namespace": "ebb-system"},
                           "data": {"current.id": "azE=", "current.key": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}}),
                ),
                ("GET", _) => (
                    404,
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                           "reason": "NotFound", "code": 404, "message": "not found"}),
                ),
                ("PATCH", p) if p.starts_with("/apis/ebb.dev/v1alpha1/nodestates/n1") => {
                    let mut obj = body.clone();
                    obj["metadata"]["name"] = json!("n1");
                    obj["spec"] = json!({"nodeName": "n1"});
                    (200, obj)
                }
                _ => (500, json!({})),
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(svc, "default")
}

#[tokio::test]
async fn node_state_is_owned_by_its_node_and_status_is_server_side_applied() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = fake(seen.clone());
    kube_edge::ensure_node_state(&client, "n1").await.unwrap();
    let status = NodeStateStatus {
        agent_version: Some("0.1.0".into()),
        pending_deletions: 4,
        ..NodeStateStatus::default()
    };
    kube_edge::write_status(&client, "n1", &status)
        .await
        .unwrap();

    let seen = seen.lock().unwrap().clone();
    let create = seen
        .iter()
        .find(|s| s.method == "PATCH" && s.path == "/apis/ebb.dev/v1alpha1/nodestates/n1")
        .unwrap();
    assert_eq!(create.content_type, "application/apply-patch+yaml");
    assert!(
        create.query.contains("fieldManager=ebb-node-agent"),
        "{}",
        create.query
    );
    assert!(create.query.contains("force=true"), "{}", create.query);
    let owner = &create.body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["name"], "n1");
    assert_eq!(owner["uid"], "node-uid-1");
    assert_eq!(create.body["spec"]["nodeName"], "n1");

    let write = seen
        .iter()
        .find(|s| s.path == "/apis/ebb.dev/v1alpha1/nodestates/n1/status")
        .unwrap();
    assert_eq!(write.method, "PATCH");
    assert_eq!(write.content_type, "application/apply-patch+yaml");
    assert!(write.query.contains("fieldManager=ebb-node-agent"));
    assert_eq!(write.body["kind"], "NodeState");
    assert_eq!(write.body["status"]["pendingDeletions"], 4);
    assert_eq!(write.body["status"]["agentVersion"], "0.1.0");
    assert!(
        write.body.get("spec").is_none(),
        "status writes carry only status"
    );
}

#[tokio::test]
async fn pods_are_listed_for_this_node_only_and_the_secret_is_read() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = fake(seen.clone());
    let pods = kube_edge::list_node_pods(&client, "n1").await.unwrap();
    assert_eq!(pods.len(), 1);
    let list = seen.lock().unwrap()[0].clone();
    assert_eq!(list.path, "/api/v1/pods");
    assert!(
        list.query.contains("fieldSelector=spec.nodeName%3Dn1"),
        "{}",
        list.query
    );

    let data = kube_edge::read_secret(&client, "ebb-system", "keys")
        .await
        .unwrap()
        .unwrap();
    let keys = ebb_node_agent::tokens::keys_from_secret(&data).unwrap();
    assert_eq!(keys.current.unwrap().id, "k1");
    assert!(
        kube_edge::read_secret(&client, "ebb-system", "absent")
            .await
            .unwrap()
            .is_none()
    );
}
