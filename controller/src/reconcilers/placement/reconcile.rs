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

    use axum::http::{Request, Response};
    use kube::client::Body;
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
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "InternalError", "code": 500, "message": "down"});
            Ok::<_, Infallible>(
                Response::builder()
                    .status(500)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&status).unwrap()))
                    .unwrap(),
            )
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
        let stores = empty_stores();
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
            CurrentKey::default(),
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
}
