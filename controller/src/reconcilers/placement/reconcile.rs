//! kube-runtime entry points of the PlacementHistory controller: [`reconcile`] runs one pass
//! (lifecycle, placement, escalation, status, Events), [`error_policy`] counts its failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb_api::placement::PlacementHistory;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::context::Context;
use super::facts::selected;
use super::pass::Pass;
use super::state::PhState;
use crate::metrics::{Function, Reconciler};

/// Requeue after a failed pass.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(2);
/// A replica that is not the leader looks again this often.
pub const FOLLOWER_REQUEUE: Duration = Duration::from_secs(2);

/// A pass that failed; retried after [`ERROR_REQUEUE`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the status of PlacementHistory {placement_history}: {source}")]
    Status {
        placement_history: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Every value [`Error::reason`] gives (its series start at 0).
    pub const REASONS: &[&str] = &["Status"];

    /// The `reason` label of `ebb_reconcile_errors`: the variant's name.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Status { .. } => "Status",
        }
    }
}

/// One pass over a PlacementHistory. Returns when to look again.
pub async fn reconcile(ph: Arc<PlacementHistory>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = format!("{}/{}", ph.namespace().unwrap_or_default(), ph.name_any());
    if ph.metadata.deletion_timestamp.is_some() {
        ctx.forget(&key);
        return Ok(Action::await_change());
    }
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(FOLLOWER_REQUEUE));
    }
    let started = Instant::now();
    let now = Timestamp::now();
    let taken = ctx.take_state(&key);
    let fresh = taken.is_none();
    let state = match load_state(taken, &ph, &key, now) {
        Ok(s) => s,
        Err(why) => return Ok(ctx.invalid(&ph, &key, why.to_string()).await),
    };
    ctx.set_valid(&key);

    let pods = ctx.stores.pods.state();
    let mut pass = Pass::new(&ctx, &ph, key, state, now);
    let mine = match selected(&ph, &pods) {
        Ok(m) => m,
        Err(why) => {
            ctx.put_state(&pass.key, pass.state);
            return Ok(ctx.invalid(&ph, &pass.key, why.to_string()).await);
        }
    };
    let gated = pass.observe_pods(&mine, fresh);
    let any_waiting = pass.place_gated(gated).await;
    pass.escalate_overdue().await;
    let saved = pass.save_status().await.map_err(|source| Error::Status {
        placement_history: pass.key.clone(),
        source,
    });
    ctx.metrics.observe(Function::placement, started.elapsed());
    let requeue = pass.requeue_after(any_waiting);
    pass.finish().await;
    saved.map(|()| Action::requeue(requeue))
}

/// Logs the failure, counts it by reason, and retries later.
pub fn error_policy(ph: Arc<PlacementHistory>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(ph = %ph.name_any(), %error, "placement pass failed; retrying");
    ctx.metrics
        .reconcile_failed(Reconciler::placement, error.reason());
    Action::requeue(ERROR_REQUEUE)
}

/// The state kept from the last pass following the spec, or (first pass) rebuilt from the
/// status. `Err`: why the PlacementHistory cannot be used.
fn load_state(
    taken: Option<PhState>,
    ph: &PlacementHistory,
    key: &str,
    now: Timestamp,
) -> Result<PhState, crate::placement::HistoryError> {
    match taken {
        Some(mut state) => {
            state.follow_spec(ph, key, now)?;
            Ok(state)
        }
        None => PhState::rebuild(ph, key, now),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use axum::http::Request;
    use http_body_util::BodyExt;
    use kube::client::Body;
    use serde_json::Value;

    use crate::cluster::CachedPod;
    use crate::reconcilers::placement::keys::Key;
    use crate::testkit::api::failure;
    use kube::runtime::events::{Recorder, Reporter};
    use kube::runtime::reflector;
    use serde_json::json;

    use super::*;
    use crate::metrics::Metrics;
    use crate::reconcilers::placement::keys::CurrentKey;
    use crate::reconcilers::placement::settings::PlacementSettings;
    use crate::state::{Leadership, Stores};

    /// An API server answering every request with 500.
    fn failing_client() -> kube::Client {
        let svc = tower::service_fn(|_req: Request<Body>| async {
            let status = failure(500, "InternalError", "down");
            Ok::<_, Infallible>(crate::testkit::api::json_response(500, &status))
        });
        kube::Client::new(svc, "default")
    }

    fn empty_stores() -> Stores {
        Stores {
            nodes: reflector::store().0,
            pods: reflector::store().0,
            pod_index: Default::default(),
            pdbs: reflector::store().0,
            replica_sets: reflector::store().0,
            stateful_sets: reflector::store().0,
            daemon_sets: reflector::store().0,
            jobs: reflector::store().0,
            replication_controllers: reflector::store().0,
            persistent_volumes: reflector::store().0,
            persistent_volume_claims: reflector::store().0,
            storage_classes: reflector::store().0,
            node_states: reflector::store().0,
            providers: Default::default(),
            model: Default::default(),
            ended: Default::default(),
        }
    }

    fn context(client: kube::Client) -> Context {
        context_with(client, empty_stores(), CurrentKey::default())
    }

    fn context_with(client: kube::Client, stores: Stores, keys: CurrentKey) -> Context {
        let node_states = stores.node_states.clone();
        let reporter = Reporter {
            controller: "ebb-controller".into(),
            instance: None,
        };
        Context::new(
            client.clone(),
            stores,
            reflector::store().0,
            Metrics::new(),
            Recorder::new(client, reporter),
            Leadership::always(),
            keys,
            PlacementSettings::default(),
            node_states,
        )
    }

    fn placement_history() -> PlacementHistory {
        serde_json::from_value(json!({
            "apiVersion": "ebb.dev/v1alpha1",
            "kind": "PlacementHistory",
            "metadata": {"name": "web", "namespace": "shop", "generation": 1},
            "spec": {"selector": {}, "roleLabel": "role", "roles": [{"name": "frontend"}]},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_failed_status_write_is_counted_by_reason() {
        let ctx = Arc::new(context(failing_client()));
        let ph = Arc::new(placement_history());
        let error = reconcile(ph.clone(), ctx.clone())
            .await
            .expect_err("the status write fails");
        assert!(
            matches!(&error, Error::Status { placement_history, .. } if placement_history == "shop/web")
        );
        assert_eq!(error.reason(), "Status");
        assert_eq!(
            error_policy(ph, &error, ctx.clone()),
            Action::requeue(ERROR_REQUEUE)
        );
        let text = ctx.metrics.encode();
        assert!(
            text.contains(
                "ebb_reconcile_errors_total{controller=\"placement\",reason=\"Status\"} 1"
            ),
            "{text}"
        );
    }

    /// An API server holding one pod at resourceVersion 5: a merge patch of it carrying a
    /// resourceVersion applies only when that is the pod's (the apiserver's precondition), one
    /// without applies always; every patch body is recorded. The PlacementHistory's status
    /// writes are answered with the object, the rest (Events) with 500.
    fn one_pod_server(ph: Value, patches: Arc<std::sync::Mutex<Vec<Value>>>) -> kube::Client {
        let rv = Arc::new(std::sync::Mutex::new(5u32));
        let svc = tower::service_fn(move |req: Request<Body>| {
            let (ph, patches, rv) = (ph.clone(), patches.clone(), rv.clone());
            async move {
                let path = req.uri().path().to_string();
                let patch = req.method() == axum::http::Method::PATCH;
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let conflict = failure(409, "Conflict", "the object has been modified");
                let (code, out) = if path.contains("placementhistories") {
                    (200, ph)
                } else if patch && path.ends_with("/pods/p") {
                    let body: Value = serde_json::from_slice(&body).unwrap();
                    patches.lock().unwrap().push(body.clone());
                    let mut current = rv.lock().unwrap();
                    match body["metadata"]["resourceVersion"].as_str() {
                        Some(sent) if sent != current.to_string() => (409, conflict),
                        _ => {
                            *current += 1;
                            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": "p", "namespace": "shop", "uid": "u1",
                                    "resourceVersion": current.to_string()},
                                "spec": {"containers": [{"name": "c"}]}});
                            (200, pod)
                        }
                    }
                } else {
                    (500, failure(500, "InternalError", "down"))
                };
                Ok::<_, Infallible>(crate::testkit::api::json_response(code, &out))
            }
        });
        kube::Client::new(svc, "default")
    }

    /// A cache behind the API server still shows a pod gated after its release: the next pass
    /// decides the same, but its patch carries the cached resourceVersion and is refused, so
    /// the pod is released (and counted, and announced) once.
    #[tokio::test]
    async fn a_pass_on_a_stale_cache_does_not_release_a_pod_twice() {
        let ph = placement_history();
        let patches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let client = one_pod_server(serde_json::to_value(&ph).unwrap(), patches.clone());
        let (pods, mut writer) = reflector::store::<CachedPod>();
        let gated: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop", "uid": "u1", "resourceVersion": "5",
                "labels": {"role": "frontend"}},
            "spec": {"containers": [{"name": "c"}],
                "schedulingGates": [{"name": ebb_api::names::SCHEDULING_GATE_PLACEMENT}]}
        }))
        .unwrap();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(gated));
        let stores = Stores {
            pods,
            ..empty_stores()
        };
        let key = Key {
            id: "k1".into(),
            secret: vec![7; 32],
        };
        let ctx = Arc::new(context_with(client, stores, CurrentKey::known(key)));
        let ph = Arc::new(ph);
        // Two passes with the pod's watch event of the release not yet in the cache.
        for _ in 0..2 {
            reconcile(ph.clone(), ctx.clone()).await.unwrap();
        }
        let text = ctx.metrics.encode();
        let released: f64 = text
            .lines()
            .filter(|l| l.starts_with("ebb_placements_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(released, 1.0, "one release counted:\n{text}");
        assert!(
            text.contains(
                "ebb_placement_gate_wait_seconds_count{namespace=\"shop\",placement_history=\"web\"} 1"
            ),
            "one gate wait observed:\n{text}"
        );
        let sent = patches.lock().unwrap().clone();
        assert_eq!(sent.len(), 2, "each pass tried the release: {sent:?}");
        for body in &sent {
            assert_eq!(body["metadata"]["resourceVersion"], "5", "{body}");
        }
    }
}
