//! The placement step of a pass: a decision per gated pod (pin, wait, relax, anywhere) under
//! the planner's fit check, the gate released by a patch carrying a token, Events and metrics.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::cluster::CachedPod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::Value;
use tracing::Instrument;

use super::events::Notice;
use super::lifecycle::Gated;
use super::pass::{Pass, labels};
use super::patch;
use crate::cluster::PredicateChecker;
use crate::metrics::{PlacementLabels, Release};
use crate::placement::{Action as PlacementAction, Decision, PlacementReason, PodRef};
use crate::state::Stores;

/// The planner's fit check over the shared cluster model, with the pods this pass pinned placed
/// on a fork of it (reverted after each check). Without a readable model every node fits.
pub struct FitCheck {
    stores: Stores,
    /// (pod UID, node) pinned by this pass.
    pinned: Mutex<Vec<(String, String)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FitCheck {
    pub fn new(stores: &Stores) -> Self {
        if let Err(e) = stores.model().0.snapshot() {
            tracing::warn!(error = %e, "cluster model unreadable; placing without the fit check");
        }
        Self {
            stores: stores.clone(),
            pinned: Mutex::default(),
        }
    }

    /// Whether the pod `uid` fits on `node`, with the pods pinned so far in place.
    pub fn fits(&self, uid: &str, node: &str) -> bool {
        let (mut live, _) = self.stores.model();
        let Ok(snap) = live.snapshot_mut() else {
            return true;
        };
        let (Some(p), Some(n)) = (snap.pod_by_uid(uid), snap.node_id(node)) else {
            return false;
        };
        snap.fork();
        for (pod, to) in lock(&self.pinned).iter() {
            if let (Some(pod), Some(to)) = (snap.pod_by_uid(pod), snap.node_id(to)) {
                snap.place(pod, Some(to));
            }
        }
        // Ids change as the model applies events: a checker per check.
        let fits = PredicateChecker::new().check(snap, p, n).is_ok();
        snap.revert();
        fits
    }

    /// The pod `uid` was pinned to `node`: later checks of the pass see it there.
    pub fn pinned(&self, uid: &str, node: &str) {
        lock(&self.pinned).push((uid.to_string(), node.to_string()));
    }
}

impl Pass<'_> {
    /// Place the gated pods; returns whether any still waits (for its node, a token key, or a
    /// failed patch).
    pub async fn place_gated(&mut self, gated: Vec<Gated<'_>>) -> bool {
        if gated.is_empty() {
            return false;
        }
        let fit = FitCheck::new(&self.ctx.stores);
        let mut any_waiting = false;
        for (pod, role) in gated {
            any_waiting |= self.place_pod(&fit, pod, role).await;
        }
        any_waiting
    }

    /// Decide for one gated pod and carry the decision out; returns whether it still waits.
    async fn place_pod(&mut self, fit: &FitCheck, pod: &Arc<CachedPod>, role: &str) -> bool {
        let uid = pod.uid().unwrap_or_default();
        self.ctx.gated_for(&uid);
        let name = pod.name_any();
        let r = PodRef {
            uid: &uid,
            name: &name,
            role,
        };
        let fits = |node: &str| fit.fits(&uid, node);
        let decision = match self.state.history.place(r, &self.facts, &fits, self.now) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(pod = %name, error = %e, "not placed");
                return false;
            }
        };
        // One span per decision (a pod that keeps waiting gets one for its first wait).
        let waits = matches!(decision.action, PlacementAction::Wait { .. });
        let span = if !waits || !self.state.waiting.contains(&uid) {
            decision_span(pod, role, &decision)
        } else {
            tracing::Span::none()
        };
        if let PlacementAction::Wait { node, .. } = &decision.action {
            self.announce_wait(pod, &uid, node, &decision);
            return true;
        }
        self.release(fit, pod, role, &decision, span).await
    }

    /// The pod waits for `node`: a Normal Event the first time.
    fn announce_wait(&mut self, pod: &CachedPod, uid: &str, node: &str, decision: &Decision) {
        if self.state.waiting.insert(uid.to_string()) {
            self.notices.push(Notice::pod(
                pod,
                false,
                "PlacementWaiting",
                format!(
                    "waiting for node {node} ({}) until the escalation timeout",
                    decision.reason
                ),
            ));
        }
    }

    /// Release the pod's gate as decided, with a token; returns whether it still waits (no
    /// token key yet, or the patch failed).
    async fn release(
        &mut self,
        fit: &FitCheck,
        pod: &CachedPod,
        role: &str,
        decision: &Decision,
        span: tracing::Span,
    ) -> bool {
        let uid = pod.uid().unwrap_or_default();
        let name = pod.name_any();
        let ttl = self.ctx.settings.token_ttl;
        let waited = self.ctx.gated_for(&uid);
        let Some(token) = self.ctx.keys.mint(&uid, role, self.now, ttl) else {
            span.record("released", false);
            tracing::info!(parent: &span, pod = %name, "no token key yet; placement waits for it");
            return true;
        };
        let Some((body, outcome)) = release_patch(pod, &decision.action, &token) else {
            return false;
        };
        let api: Api<CachedPod> = Api::namespaced(
            self.ctx.client.clone(),
            &pod.namespace().unwrap_or_default(),
        );
        let patched = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .instrument(span.clone())
            .await;
        span.record("released", patched.is_ok());
        match patched {
            Ok(_) => {
                self.state.waiting.remove(&uid);
                self.record_release(pod, decision, outcome, waited);
                if let Some(node) = decision.pinned_node() {
                    fit.pinned(&uid, node);
                }
                false
            }
            // The cache is behind the API server: the pod was released already (the watch
            // event of this process's own release not yet in) or changed since. Nothing is
            // counted; the next pass decides on the pod as it is then.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(parent: &span, pod = %name, "the pod changed since the cache saw it; looked at again");
                true
            }
            Err(e) => {
                tracing::warn!(parent: &span, pod = %name, error = %e, "could not release the pod's gate; retrying");
                true
            }
        }
    }

    /// Count a released pod (outcome, gate wait, escalation) and announce it.
    fn record_release(
        &mut self,
        pod: &CachedPod,
        decision: &Decision,
        outcome: Release,
        waited: Duration,
    ) {
        let metrics = &self.ctx.metrics;
        let pl = PlacementLabels {
            namespace: self.ph.namespace().unwrap_or_default(),
            placement_history: self.ph.name_any(),
            outcome,
        };
        metrics.placements.get_or_create(&pl).inc();
        // The history's hit, escalation and end series start at 0 with its first release, so a
        // hit rate and the counts read 0 rather than nothing until the first of each.
        metrics
            .placement_hits
            .get_or_create(&labels(self.ph))
            .inc_by(0);
        metrics
            .placement_escalations
            .get_or_create(&labels(self.ph))
            .inc_by(0);
        super::lifecycle::count_end(metrics, &labels(self.ph), None);
        let waited = self.ctx.ungated(&pod.uid().unwrap_or_default(), waited);
        metrics
            .gate_wait
            .get_or_create(&labels(self.ph))
            .observe(waited.as_secs_f64());
        let note = match &decision.action {
            PlacementAction::Pin { node } => format!("pinned to node {node} ({})", decision.reason),
            _ => format!(
                "released {} ({})",
                decision.outcome().as_str(),
                decision.reason
            ),
        };
        let escalated = decision.reason == PlacementReason::EscalationTimeout;
        if escalated {
            metrics
                .placement_escalations
                .get_or_create(&labels(self.ph))
                .inc();
        }
        let reason = if escalated {
            "PlacementEscalated"
        } else {
            "Placed"
        };
        self.notices.push(Notice::pod(pod, escalated, reason, note));
    }
}

/// The merge patch releasing the pod's gate as decided, and its outcome label; `None` for a
/// wait (the gate stays).
pub fn release_patch(
    pod: &CachedPod,
    action: &PlacementAction,
    token: &str,
) -> Option<(Value, Release)> {
    Some(match action {
        PlacementAction::Pin { node } => (patch::pin(pod, node, token), Release::pinned),
        PlacementAction::Relax(c) => (patch::relax(pod, c, "Relaxed", token), Release::relaxed),
        PlacementAction::Anywhere(c) => {
            (patch::relax(pod, c, "Anywhere", token), Release::anywhere)
        }
        PlacementAction::Wait { .. } => return None,
    })
}

/// The span of one placement decision: `decision` is `pin`, `wait`, `relax` or `release`
/// (gate removed without a node), `node` the chosen (or awaited) node, `released` whether the
/// gate came off.
fn decision_span(pod: &CachedPod, role: &str, decision: &Decision) -> tracing::Span {
    let (kind, node) = match &decision.action {
        PlacementAction::Pin { node } => ("pin", node.as_str()),
        PlacementAction::Wait { node, .. } => ("wait", node.as_str()),
        PlacementAction::Relax(_) => ("relax", ""),
        PlacementAction::Anywhere(_) => ("release", ""),
    };
    tracing::info_span!(
        "placement",
        pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
        role,
        decision = kind,
        node,
        reason = %decision.reason,
        released = false,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::placement::RelaxedConstraints;

    #[test]
    fn a_release_patch_per_action_and_none_for_a_wait() {
        let pod: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "schedulingGates": [{"name": "ebb.dev/placement"}]}
        }))
        .unwrap();
        let pin = PlacementAction::Pin { node: "n1".into() };
        let (body, outcome) = release_patch(&pod, &pin, "tok").unwrap();
        assert_eq!(outcome, Release::pinned);
        assert_eq!(body["metadata"]["annotations"]["ebb.dev/placed-on"], "n1");
        let relaxed = PlacementAction::Relax(RelaxedConstraints::default());
        assert_eq!(
            release_patch(&pod, &relaxed, "tok").unwrap().1,
            Release::relaxed
        );
        let anywhere = PlacementAction::Anywhere(RelaxedConstraints::default());
        let (body, outcome) = release_patch(&pod, &anywhere, "tok").unwrap();
        assert_eq!(outcome, Release::anywhere);
        assert_eq!(
            body["metadata"]["annotations"]["ebb.dev/placement"],
            "Anywhere"
        );
        let wait = PlacementAction::Wait {
            node: "n1".into(),
            until: None,
        };
        assert!(release_patch(&pod, &wait, "tok").is_none());
    }
}
