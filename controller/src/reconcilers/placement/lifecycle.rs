//! The lifecycle step of a pass: feeds the RoleHistory the pods it selects (bound, running,
//! releasing, terminated, gone) and collects the gated ones for placement.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cluster::CachedPod;
use kube::ResourceExt;

use super::events::Notice;
use super::pass::{Pass, node_of, phase, terminal};
use super::patch;
use crate::metrics::PodEndLabels;
use crate::placement::{PodRef, Termination, TerminationClass, deleted_before_it_ended};

/// A selected pod with its role.
pub type Selected<'p> = (&'p Arc<CachedPod>, String);
/// A gated pod with its role.
pub type Gated<'p> = (&'p Arc<CachedPod>, &'p str);

impl Pass<'_> {
    /// Feed the history every selected pod and the pods gone since the last pass; returns the
    /// gated pods (of known roles) to place.
    pub fn observe_pods<'p>(&mut self, mine: &'p [Selected<'p>], fresh: bool) -> Vec<Gated<'p>> {
        let mut gated = Vec::new();
        let mut seen_now: HashMap<String, CachedPod> = HashMap::new();
        for (pod, role) in mine {
            let uid = pod.uid().unwrap_or_default();
            seen_now.insert(uid.clone(), (***pod).clone());
            if self.state.history.roles().by_name(role).is_none() {
                continue; // an unknown role: released by the ungoverned sweep
            }
            if terminal(pod) {
                self.observe_terminal(pod, &uid);
            } else if let Some(node) = node_of(pod) {
                self.observe_bound(pod, &uid, role, node, fresh);
            } else if patch::is_gated(pod) {
                gated.push((*pod, role.as_str()));
            }
        }
        self.observe_gone(&seen_now);
        self.state.last_seen = seen_now;
        gated
    }

    /// A pod in a terminal phase: its end is reported once.
    fn observe_terminal(&mut self, pod: &CachedPod, uid: &str) {
        self.ctx.ended.take(uid);
        if self.state.ended.insert(uid.to_string()) {
            let node_lost = self.node_lost(pod);
            let by_owner = !node_lost && deleted_before_it_ended(pod);
            let t = Termination::from_pod(pod, node_lost, by_owner);
            self.report_end(&pod.name_any(), uid, &t);
        }
    }

    /// A pod bound to `node`: replayed on the first pass, else recorded as bound (a hit when
    /// it landed on a history node); then running and releasing.
    fn observe_bound(&mut self, pod: &CachedPod, uid: &str, role: &str, node: &str, fresh: bool) {
        let name = pod.name_any();
        let r = PodRef {
            uid,
            name: &name,
            role,
        };
        let history = &mut self.state.history;
        let known = if fresh {
            history.replay_pod(r, node, phase(pod) == "Running", self.now)
        } else {
            let before = history.counters(role).hits;
            let added = history.on_bound(r, node, &self.facts, self.now);
            if matches!(added, Ok(true)) && history.counters(role).hits > before {
                self.ctx
                    .metrics
                    .placement_hits
                    .get_or_create(&self.labels)
                    .inc();
            }
            added
        };
        if let Err(e) = known {
            tracing::debug!(pod = %name, error = %e, "pod not tracked");
        }
        if phase(pod) == "Running" {
            history.on_running(uid, self.now);
        }
        if pod.metadata.deletion_timestamp.is_some() {
            history.on_releasing(uid);
        }
    }

    /// Pods gone from the cache since the last pass: an unbound one is cancelled, a bound one
    /// ended (classified by its terminal state when it was seen, else its last state).
    fn observe_gone(&mut self, seen_now: &HashMap<String, CachedPod>) {
        let gone: Vec<(String, CachedPod)> = self
            .state
            .last_seen
            .iter()
            .filter(|(uid, _)| !seen_now.contains_key(*uid))
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect();
        for (uid, last) in gone {
            if self.state.ended.remove(&uid) {
                continue;
            }
            // Its last state (ended, deleted) when the pass did not see it before it went.
            let last = self.ctx.ended.take(&uid).unwrap_or(last);
            self.state.waiting.remove(&uid);
            self.ctx.gone(&uid);
            let Some(node) = node_of(&last).map(str::to_string) else {
                self.state.history.cancel(&uid);
                continue;
            };
            // Bound, run and gone between two passes: the history learns where it ran (a
            // no-op for a pod it knows) before it learns how it ended.
            if let Some(role) = last.labels().get(&self.ph.spec.role_label).cloned()
                && self.state.history.roles().by_name(&role).is_some()
            {
                self.observe_bound(&last, &uid, &role, &node, false);
            }
            let node_lost = self.node_lost(&last);
            // Gone while its node is up, without ending on its own first: someone deleted it
            // (its owner, a user, a force delete between two passes), no fault of the node.
            let by_owner = !node_lost && (!terminal(&last) || deleted_before_it_ended(&last));
            let t = Termination::from_pod(&last, node_lost, by_owner);
            self.report_end(&last.name_any(), &uid, &t);
        }
    }

    /// Report a pod's end to the history; a warning Event when its node is now excluded.
    fn report_end(&mut self, pod: &str, uid: &str, t: &Termination) {
        let Some(report) = self.state.history.on_terminated(uid, t, self.now) else {
            return;
        };
        tracing::info!(%pod, %uid, node = %report.node, role = %report.role, class = report.class.as_str(), "pod ended");
        count_end(&self.ctx.metrics, &self.labels, Some(report.class));
        if report.node_excluded {
            let until = self.state.history.next_failure_reset(self.now);
            self.notices.push(
                Notice::ph(
                    self.ph,
                    true,
                    "NodeExcluded",
                    format!(
                        "node {} failed role {} too often; not pinned to until the failure window resets at {until}",
                        report.node, report.role
                    ),
                )
                .about_node(&report.node),
            );
        }
    }
}

/// Counts a pod's end (`None`: none, the series only start) in `ebb_placement_pod_ends_total`;
/// every class's series of the history starts at 0 with its first release or end.
pub(super) fn count_end(
    metrics: &crate::metrics::Metrics,
    labels: &crate::metrics::PlacementHistoryLabels,
    ended: Option<TerminationClass>,
) {
    for class in TerminationClass::ALL {
        let series = metrics.placement_pod_ends.get_or_create(&PodEndLabels {
            namespace: labels.namespace.clone(),
            placement_history: labels.placement_history.clone(),
            class: class.as_str().to_string(),
        });
        series.inc_by(u64::from(Some(*class) == ended));
    }
}
