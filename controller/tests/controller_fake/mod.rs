//! A small in-memory Kubernetes API for the controller's edge tests: Nodes (get, merge patch
//! with resourceVersion preconditions, delete), Pod evictions with scripted answers (an accepted
//! eviction removes the pod from the shared pod cache, as the watch would), status patches and
//! Events (recorded). Every request is logged for assertions.

#![allow(dead_code)]

pub mod fixtures;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::http::{Request, Response, StatusCode};
use ebb_controller::cluster::CachedPod;
use k8s_openapi::api::core::v1::Node;
use kube::client::Body;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;

/// An empty, synced cache of `K`.
pub fn empty_store<K>() -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store_of(Vec::new())
}

/// A synced cache holding `items`.
pub fn store_of<K>(items: Vec<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut w) = reflector::store::<K>();
    w.apply_watcher_event(&watcher::Event::Init);
    for i in items {
        w.apply_watcher_event(&watcher::Event::InitApply(i));
    }
    w.apply_watcher_event(&watcher::Event::InitDone);
    // Keep the writer alive so readers never see it dropped.
    std::mem::forget(w);
    store
}
use serde_json::{Value, json};
use tokio::sync::watch;

/// One request the fake served.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
    pub status: u16,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    policies: BTreeMap<String, Value>,
    lease: Option<Value>,
    /// Field manager owning the Lease's holderIdentity (server-side apply conflicts).
    lease_owner: Option<String>,
    /// Answer every Lease request with 503 (an API the replica cannot reach).
    lease_down: bool,
    /// Lease writes fail while reads work (renewals cannot land: etcd refusing writes).
    lease_writes_down: bool,
    /// Scripted eviction answers per `namespace/name`; when empty, 201.
    evictions: BTreeMap<String, VecDeque<u16>>,
    /// Conflicts (409) to answer to the next node patches.
    node_conflicts: usize,
    /// Answer of SelfSubjectAccessReviews (delete nodes); `None`: the API is not served (404).
    may_delete_nodes: Option<bool>,
    log: Vec<Logged>,
    rv: u64,
}

/// The fake API server plus the pod cache it keeps in step.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    pods: Arc<Mutex<Writer<CachedPod>>>,
    pod_store: Store<CachedPod>,
    node_writer: Arc<Mutex<Writer<Node>>>,
    node_store: Store<Node>,
    pod_tick: Arc<watch::Sender<u64>>,
    /// The cluster model over these caches, marked on every change as the watches mark it.
    model: Arc<ebb_controller::state::shared_model::SharedModel>,
    /// When true, accepted evictions do not remove the pod (it "hangs" terminating).
    pub keep_evicted_pods: Arc<Mutex<bool>>,
    /// Eviction calls answered only after this long (an API server slow to answer).
    pub eviction_latency: Arc<Mutex<Option<std::time::Duration>>>,
    /// Eviction calls received and not yet answered: (now, most ever).
    evictions_open: Arc<Mutex<(usize, usize)>>,
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
           "reason": reason, "message": format!("fake: {reason}")})
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl FakeApi {
    pub fn new() -> Self {
        let (pod_store, writer) = reflector::store::<CachedPod>();
        let mut writer = writer;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (node_store, mut node_writer) = reflector::store::<Node>();
        node_writer.apply_watcher_event(&watcher::Event::Init);
        node_writer.apply_watcher_event(&watcher::Event::InitDone);
        Self {
            state: Arc::default(),
            pods: Arc::new(Mutex::new(writer)),
            pod_store,
            node_writer: Arc::new(Mutex::new(node_writer)),
            node_store,
            pod_tick: Arc::new(watch::channel(0).0),
            model: Arc::default(),
            keep_evicted_pods: Arc::default(),
            eviction_latency: Arc::default(),
            evictions_open: Arc::default(),
        }
    }

    pub fn client(&self) -> kube::Client {
        let this = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move { Ok::<_, Infallible>(this.serve(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    /// Answer SelfSubjectAccessReviews for deleting nodes with `allowed`.
    pub fn set_may_delete_nodes(&self, allowed: bool) {
        self.state.lock().unwrap().may_delete_nodes = Some(allowed);
    }

    pub fn pod_store(&self) -> Store<CachedPod> {
        self.pod_store.clone()
    }

    /// The controller's caches over this fake (owner kinds and PDBs empty).
    pub fn stores(&self) -> ebb_controller::state::Stores {
        ebb_controller::state::Stores {
            nodes: self.node_store(),
            pods: self.pod_store(),
            pod_index: Default::default(),
            pdbs: empty_store(),
            replica_sets: empty_store(),
            stateful_sets: empty_store(),
            daemon_sets: empty_store(),
            jobs: empty_store(),
            replication_controllers: empty_store(),
            persistent_volumes: empty_store(),
            persistent_volume_claims: empty_store(),
            storage_classes: empty_store(),
            node_states: empty_store(),
            providers: Default::default(),
            model: self.model.clone(),
            ended: Default::default(),
        }
    }

    pub fn pod_changes(&self) -> watch::Receiver<u64> {
        self.pod_tick.subscribe()
    }

    pub fn add_node(&self, node: Node) {
        let mut node = node;
        node.metadata
            .resource_version
            .get_or_insert_with(|| "1".into());
        let name = node.metadata.name.clone().unwrap();
        self.state.lock().unwrap().nodes.insert(name, node.clone());
        self.sync_node(Some(node), None);
    }

    /// Keep the node cache in step with the API, as the watch would.
    fn sync_node(&self, applied: Option<Node>, deleted: Option<Node>) {
        // Marked after the cache holds the change, as the watches do.
        let names: Vec<String> = applied
            .iter()
            .chain(&deleted)
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let mut w = self.node_writer.lock().unwrap();
        if let Some(n) = applied {
            w.apply_watcher_event(&watcher::Event::Apply(n));
        }
        if let Some(n) = deleted {
            w.apply_watcher_event(&watcher::Event::Delete(n));
        }
        drop(w);
        for n in names {
            self.model.node_changed(&n);
        }
    }

    pub fn node_store(&self) -> Store<Node> {
        self.node_store.clone()
    }

    /// Store a ScaleDownPolicy (served by GET and PATCH on its path).
    pub fn add_policy(&self, policy: &ebb_api::ScaleDownPolicy) {
        let name = policy.metadata.name.clone().unwrap();
        self.state
            .lock()
            .unwrap()
            .policies
            .insert(name, serde_json::to_value(policy).unwrap());
    }

    pub fn policy(&self, name: &str) -> Option<Value> {
        self.state.lock().unwrap().policies.get(name).cloned()
    }

    pub fn node(&self, name: &str) -> Option<Node> {
        self.state.lock().unwrap().nodes.get(name).cloned()
    }

    fn mark_pod(&self, pod: &CachedPod) {
        self.model.pod_changed(
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
    }

    /// Put a pod into the cache (as if the watch saw it).
    pub fn add_pod(&self, pod: CachedPod) {
        let marked = pod.clone();
        self.pods
            .lock()
            .unwrap()
            .apply_watcher_event(&watcher::Event::Apply(pod));
        self.mark_pod(&marked);
        self.pod_tick.send_modify(|v| *v += 1);
    }

    /// Remove a pod from the cache (as if it terminated).
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        let found = self.pod_store.state().into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        });
        if let Some(p) = found {
            self.pods
                .lock()
                .unwrap()
                .apply_watcher_event(&watcher::Event::Delete((*p).clone()));
            self.mark_pod(&p);
            self.pod_tick.send_modify(|v| *v += 1);
        }
    }

    /// Answer the next evictions of `namespace/name` with these codes (then 201).
    pub fn script_evictions(&self, pod: &str, codes: &[u16]) {
        self.state
            .lock()
            .unwrap()
            .evictions
            .insert(pod.to_string(), codes.iter().copied().collect());
    }

    /// Answer the next `n` node patches with 409 Conflict.
    pub fn conflict_next_node_patches(&self, n: usize) {
        self.state.lock().unwrap().node_conflicts = n;
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    /// Logged requests with this method whose path contains `fragment`.
    pub fn requests(&self, method: &str, fragment: &str) -> Vec<Logged> {
        self.log()
            .into_iter()
            .filter(|l| l.method == method && l.path.contains(fragment))
            .collect()
    }

    /// The most eviction calls this API held unanswered at once.
    pub fn most_evictions_open(&self) -> usize {
        self.evictions_open.lock().unwrap().1
    }

    async fn serve(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let latency = *self.eviction_latency.lock().unwrap();
        if let Some(latency) = latency.filter(|_| path.ends_with("/eviction")) {
            {
                let mut open = self.evictions_open.lock().unwrap();
                open.0 += 1;
                open.1 = open.1.max(open.0);
            }
            tokio::time::sleep(latency).await;
            self.evictions_open.lock().unwrap().0 -= 1;
        }
        let query = req.uri().query().unwrap_or_default().to_string();
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (code, out) = if path.starts_with("/apis/coordination.k8s.io/") {
            self.lease(&method, &query, &content_type, &body)
        } else {
            self.route(&method, &path, &body)
        };
        self.state.lock().unwrap().log.push(Logged {
            method,
            path,
            query,
            body,
            status: code,
        });
        Response::builder()
            .status(StatusCode::from_u16(code).unwrap())
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&out).unwrap()))
            .unwrap()
    }

    fn route(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (method, parts.as_slice()) {
            ("GET", ["api", "v1", "nodes", name]) => match self.node(name) {
                Some(n) => (200, serde_json::to_value(n).unwrap()),
                None => (404, status(404, "NotFound")),
            },
            ("PATCH", ["api", "v1", "nodes", name]) => self.patch_node(name, body),
            ("DELETE", ["api", "v1", "nodes", name]) => {
                let removed = self.state.lock().unwrap().nodes.remove(*name);
                match removed {
                    Some(n) => {
                        self.sync_node(None, Some(n.clone()));
                        (200, serde_json::to_value(n).unwrap())
                    }
                    None => (404, status(404, "NotFound")),
                }
            }
            (
                "POST",
                [
                    "apis",
                    "authorization.k8s.io",
                    "v1",
                    "selfsubjectaccessreviews",
                ],
            ) => match self.state.lock().unwrap().may_delete_nodes {
                Some(allowed) => {
                    let mut review = body.clone();
                    review["status"] = serde_json::json!({ "allowed": allowed });
                    (201, review)
                }
                None => (404, status(404, "NotFound")),
            },
            ("POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
                self.evict(ns, name)
            }
            (
                "PATCH",
                [
                    "apis",
                    "ebb.dev",
                    "v1alpha1",
                    "scaledownpolicies",
                    name,
                    "status",
                ],
            ) => {
                let mut s = self.state.lock().unwrap();
                match s.policies.get_mut(*name) {
                    Some(p) => {
                        p["status"] = body["status"].clone();
                        (200, p.clone())
                    }
                    None => (404, status(404, "NotFound")),
                }
            }
            ("GET" | "PATCH", ["apis", "ebb.dev", "v1alpha1", "scaledownpolicies", name]) => {
                let mut s = self.state.lock().unwrap();
                match s.policies.get_mut(*name) {
                    Some(p) => {
                        // The finalizer helper removes its finalizer with a JSON patch.
                        if method == "PATCH"
                            && body
                                .as_array()
                                .is_some_and(|ops| ops.iter().any(|o| o["op"] == "remove"))
                        {
                            p["metadata"]["finalizers"] = json!([]);
                        }
                        (200, p.clone())
                    }
                    None => (404, status(404, "NotFound")),
                }
            }
            ("POST", ["apis", "events.k8s.io", "v1", "namespaces", _ns, "events"]) => {
                (201, body.clone())
            }
            _ => (404, status(404, "NotFound")),
        }
    }

    /// The Lease's holder, if any.
    pub fn lease_holder(&self) -> Option<String> {
        let s = self.state.lock().unwrap();
        s.lease
            .as_ref()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    }

    /// Someone else takes the Lease (as another replica would after ours expired).
    pub fn take_lease(&self, holder: &str, duration_secs: i64) {
        let mut s = self.state.lock().unwrap();
        let now = jiff::Timestamp::now().to_string();
        if let Some(l) = s.lease.as_mut() {
            l["spec"]["holderIdentity"] = json!(holder);
            l["spec"]["renewTime"] = json!(now);
            l["spec"]["acquireTime"] = json!(now);
            l["spec"]["leaseDurationSeconds"] = json!(duration_secs);
        }
        s.lease_owner = Some(format!("intruder-{holder}"));
    }

    /// Make Lease requests fail (or work again).
    pub fn lease_down(&self, down: bool) {
        self.state.lock().unwrap().lease_down = down;
    }

    /// Make Lease writes fail while reads still work (or work again).
    pub fn lease_writes_down(&self, down: bool) {
        self.state.lock().unwrap().lease_writes_down = down;
    }

    /// The Lease's `renewTime`, if any.
    pub fn lease_renew_time(&self) -> Option<String> {
        let s = self.state.lock().unwrap();
        s.lease.as_ref()?["spec"]["renewTime"]
            .as_str()
            .map(str::to_string)
    }

    /// One Lease (any name) with server-side-apply ownership of `holderIdentity`.
    fn lease(&self, method: &str, query: &str, content_type: &str, body: &Value) -> (u16, Value) {
        let mut s = self.state.lock().unwrap();
        if s.lease_down || (s.lease_writes_down && method != "GET") {
            return (503, status(503, "ServiceUnavailable"));
        }
        let manager = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldManager="))
            .unwrap_or_default()
            .to_string();
        s.rv += 1;
        let rv = format!("{}", 100 + s.rv);
        match method {
            "GET" => match &s.lease {
                Some(l) => (200, l.clone()),
                None => (404, status(404, "NotFound")),
            },
            "POST" => {
                if s.lease.is_some() {
                    return (409, status(409, "AlreadyExists"));
                }
                let mut l = body.clone();
                l["metadata"]["resourceVersion"] = json!(rv);
                s.lease = Some(l.clone());
                (201, l)
            }
            "PATCH" => {
                let Some(mut l) = s.lease.clone() else {
                    return (404, status(404, "NotFound"));
                };
                let wanted = &body["spec"]["holderIdentity"];
                let current = l["spec"]["holderIdentity"].clone();
                let apply = content_type.contains("apply-patch");
                if apply
                    && wanted.is_string()
                    && current.is_string()
                    && wanted != &current
                    && s.lease_owner.as_deref() != Some(manager.as_str())
                {
                    return (409, status(409, "Conflict"));
                }
                merge(&mut l, body);
                if wanted.is_string() {
                    s.lease_owner = Some(manager);
                } else if body["spec"]
                    .get("holderIdentity")
                    .is_some_and(Value::is_null)
                {
                    s.lease_owner = None;
                }
                l["metadata"]["resourceVersion"] = json!(rv);
                s.lease = Some(l.clone());
                (200, l)
            }
            _ => (405, status(405, "MethodNotAllowed")),
        }
    }

    fn patch_node(&self, name: &str, patch: &Value) -> (u16, Value) {
        let mut s = self.state.lock().unwrap();
        if s.node_conflicts > 0 {
            s.node_conflicts -= 1;
            return (409, status(409, "Conflict"));
        }
        s.rv += 1;
        let next_rv = format!("{}", 100 + s.rv);
        let Some(node) = s.nodes.get_mut(name) else {
            return (404, status(404, "NotFound"));
        };
        let mut value = serde_json::to_value(&*node).unwrap();
        if let Some(want) = patch.pointer("/metadata/resourceVersion")
            && !want.is_null()
            && Some(want) != value.pointer("/metadata/resourceVersion")
        {
            return (409, status(409, "Conflict"));
        }
        merge(&mut value, patch);
        value["metadata"]["resourceVersion"] = json!(next_rv);
        *node = serde_json::from_value(value.clone()).unwrap();
        let updated = node.clone();
        drop(s);
        self.sync_node(Some(updated), None);
        (200, value)
    }

    fn evict(&self, ns: &str, name: &str) -> (u16, Value) {
        let key = format!("{ns}/{name}");
        let scripted = self
            .state
            .lock()
            .unwrap()
            .evictions
            .get_mut(&key)
            .and_then(|q| q.pop_front());
        let exists = self.pod_store.state().iter().any(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        });
        let code = scripted.unwrap_or(if exists { 201 } else { 404 });
        if code == 201 && !*self.keep_evicted_pods.lock().unwrap() {
            self.remove_pod(ns, name);
        }
        let out = if code == 201 {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
        } else {
            status(code, "TooManyRequests")
        };
        (code, out)
    }
}

impl FakeApi {
    /// A controller context over this API holding `policies`, a ReplicaSet `web` of 2 and a
    /// DaemonSet `logs` scheduled on `daemon_set_nodes` nodes; drains re-check after 1 s.
    pub fn context(
        &self,
        policies: &[&ebb_api::ScaleDownPolicy],
        daemon_set_nodes: i32,
    ) -> Arc<ebb_controller::reconcilers::scaledown::Context> {
        use ebb_controller::actuation::{Actuator, Tracker};
        use ebb_controller::metrics::Metrics;
        use ebb_controller::testkit::{daemon_set, replica_set};
        for p in policies {
            self.add_policy(p);
        }
        let mut stores = self.stores();
        stores.replica_sets = store_of(vec![replica_set("web", 2)]);
        stores.daemon_sets = store_of(vec![daemon_set("logs", daemon_set_nodes)]);
        let actuator = Actuator::new(
            self.client(),
            stores.clone(),
            self.pod_changes(),
            Tracker::default(),
            Metrics::new(),
        )
        .with_recheck_delay(std::time::Duration::from_secs(1));
        Arc::new(ebb_controller::reconcilers::scaledown::Context::new(
            self.client(),
            stores,
            store_of(policies.iter().map(|p| (*p).clone()).collect()),
            actuator,
            Metrics::new(),
            kube::runtime::events::Recorder::new(self.client(), "ebb-controller".into()),
            ebb_controller::state::Leadership::always(),
            tokio_util::sync::CancellationToken::new(),
        ))
    }
}
