//! One pass over a PlacementHistory: rebuild or update its RoleHistory, feed it the lifecycle of
//! its pods, place its gated pods (pin, wait, relax), delete overdue pins, and save the status.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ebb_api::conditions::{READY, condition, find, set_condition};
use ebb_api::names::FIELD_MANAGER_CONTROLLER;
use ebb_api::placement::{PlacementHistory, PlacementHistoryStatus};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action as Requeue;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use super::context::{Ctx, Notice};
use super::facts::{lost_nodes, node_facts, selected};
use super::patch;
use crate::cluster::build::build_snapshot;
use crate::cluster::predicates::PredicateChecker;
use crate::metrics::{PlacementHistoryLabels, PlacementLabels, Release};
use crate::placement::{
    Action, Decision, PlacementReason, PodRef, RoleHistory, Termination, warm_roles,
};

/// What the controller keeps of one PlacementHistory between passes.
pub struct PhState {
    pub history: RoleHistory,
    generation: Option<i64>,
    /// Selected pods as last seen, by UID (a deleted pod's last state classifies its end).
    last_seen: HashMap<String, Pod>,
    /// Pods already reported terminated.
    ended: HashSet<String>,
    /// Pods announced as waiting for their node.
    waiting: HashSet<String>,
    last_write: Option<Instant>,
    last_figures: Option<PlacementHistoryStatus>,
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("writing the status of PlacementHistory {0}: {1}")]
    Status(String, #[source] kube::Error),
}

fn labels(ph: &PlacementHistory) -> PlacementHistoryLabels {
    PlacementHistoryLabels {
        namespace: ph.namespace().unwrap_or_default(),
        placement_history: ph.name_any(),
    }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

fn terminal(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

/// One pass. Returns when to look again.
pub async fn pass(ph: Arc<PlacementHistory>, ctx: Arc<Ctx>) -> Result<Requeue, PassError> {
    let key = format!("{}/{}", ph.namespace().unwrap_or_default(), ph.name_any());
    if ph.metadata.deletion_timestamp.is_some() {
        ctx.forget(&key);
        return Ok(Requeue::await_change());
    }
    if !ctx.leadership.is_leader() {
        return Ok(Requeue::requeue(Duration::from_secs(2)));
    }
    let started = Instant::now();
    let now = Timestamp::now();
    let mut notices = Vec::new();
    let taken = ctx.take_state(&key);
    let fresh = taken.is_none();
    let mut state = match taken {
        Some(mut s) => {
            if s.generation != ph.metadata.generation {
                match s.history.update_spec(&ph.spec, now) {
                    Ok((removed, dropped)) => {
                        if !removed.is_empty() {
                            tracing::info!(ph = %key, ?removed, dropped, "roles removed from the spec");
                        }
                        s.generation = ph.metadata.generation;
                    }
                    Err(e) => return Ok(ctx.invalid(&ph, &key, e.to_string()).await),
                }
            }
            s
        }
        None => match RoleHistory::rebuild(&ph.spec, ph.status.as_ref(), now) {
            Ok((history, report)) => {
                tracing::info!(ph = %key, ?report, "placement history rebuilt");
                PhState {
                    history,
                    generation: ph.metadata.generation,
                    last_seen: HashMap::new(),
                    ended: HashSet::new(),
                    waiting: HashSet::new(),
                    last_write: None,
                    last_figures: ph.status.clone(),
                }
            }
            Err(e) => return Ok(ctx.invalid(&ph, &key, e.to_string()).await),
        },
    };
    ctx.set_valid(&key);

    let pods = ctx.stores.pods.state();
    let nodes = ctx.stores.nodes.state();
    let mut facts = node_facts(&nodes);
    let (ns, name) = (ph.namespace().unwrap_or_default(), ph.name_any());
    for state in ctx.node_states.state() {
        if let (Some(status), Some(view)) =
            (state.status.as_ref(), facts.get_mut(&state.name_any()))
        {
            view.warm_roles = warm_roles(status, &ns, &name, &ph.spec);
        }
    }
    let lost = lost_nodes(&nodes);
    let mine = match selected(&ph, &pods) {
        Ok(m) => m,
        Err(why) => {
            ctx.put_state(&key, state);
            return Ok(ctx.invalid(&ph, &key, why).await);
        }
    };
    let m = labels(&ph);

    // Lifecycle.
    let mut gated: Vec<(&Arc<Pod>, &str)> = Vec::new();
    let mut seen_now: HashMap<String, Pod> = HashMap::new();
    for (pod, role) in &mine {
        let uid = pod.uid().unwrap_or_default();
        let name = pod.name_any();
        let r = PodRef {
            uid: &uid,
            name: &name,
            role,
        };
        seen_now.insert(uid.clone(), (***pod).clone());
        if state.history.roles().by_name(role).is_none() {
            continue; // an unknown role: released by the ungoverned sweep
        }
        if terminal(pod) {
            ctx.terminal.take(&uid);
            if state.ended.insert(uid.clone()) {
                let node_lost = node_of(pod).is_none_or(|n| lost.get(n).copied().unwrap_or(true));
                let t = Termination::from_pod(pod, node_lost, false);
                report_end(&mut state, &ph, &uid, &t, now, &mut notices);
            }
            continue;
        }
        if let Some(node) = node_of(pod) {
            let known = if fresh {
                state
                    .history
                    .replay_pod(r, node, phase(pod) == "Running", now)
            } else {
                let before = state.history.counters(role).hits;
                let added = state.history.on_bound(r, node, &facts, now);
                if matches!(added, Ok(true)) && state.history.counters(role).hits > before {
                    ctx.metrics.placement_hits.get_or_create(&m).inc();
                }
                added
            };
            if let Err(e) = known {
                tracing::debug!(pod = %name, error = %e, "pod not tracked");
            }
            if phase(pod) == "Running" {
                state.history.on_running(&uid, now);
            }
            if pod.metadata.deletion_timestamp.is_some() {
                state.history.on_releasing(&uid);
            }
        } else if patch::is_gated(pod) {
            gated.push((pod, role.as_str()));
        }
    }
    // Pods gone from the cache.
    let gone: Vec<(String, Pod)> = state
        .last_seen
        .iter()
        .filter(|(uid, _)| !seen_now.contains_key(*uid))
        .map(|(u, p)| (u.clone(), p.clone()))
        .collect();
    for (uid, last) in gone {
        if state.ended.remove(&uid) {
            continue;
        }
        // Its terminal state, when the pass did not see it before it went.
        let last = ctx.terminal.take(&uid).unwrap_or(last);
        state.waiting.remove(&uid);
        ctx.ungated(&uid);
        if node_of(&last).is_none() {
            state.history.cancel(&uid);
            continue;
        }
        let node_lost = node_of(&last).is_none_or(|n| lost.get(n).copied().unwrap_or(true));
        let by_owner = last.metadata.deletion_timestamp.is_some() && phase(&last) == "Running";
        let t = Termination::from_pod(&last, node_lost, by_owner && !node_lost);
        report_end(&mut state, &ph, &uid, &t, now, &mut notices);
    }
    state.last_seen = seen_now;

    // Placement of gated pods.
    let mut any_waiting = false;
    if !gated.is_empty() {
        let snapshot = build_snapshot(&ctx.stores.objects());
        if let Err(e) = &snapshot {
            tracing::warn!(error = %e, "cluster snapshot failed; placing without the fit check");
        }
        let snapshot = Mutex::new(snapshot.ok());
        let checker = Mutex::new(PredicateChecker::new());
        for (pod, role) in gated {
            let uid = pod.uid().unwrap_or_default();
            ctx.gated_for(&uid);
            let name = pod.name_any();
            let r = PodRef {
                uid: &uid,
                name: &name,
                role,
            };
            let fits = |node: &str| -> bool {
                let snap = snapshot.lock().unwrap_or_else(|p| p.into_inner());
                let Some(snap) = snap.as_ref() else {
                    return true;
                };
                let (Some(p), Some(n)) = (snap.pod_by_uid(&uid), snap.node_id(node)) else {
                    return false;
                };
                checker
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .check(snap, p, n)
                    .is_ok()
            };
            let decision = match state.history.place(r, &facts, &fits, now) {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(pod = %name, error = %e, "not placed");
                    continue;
                }
            };
            // One span per decision (a pod that keeps waiting gets one for its first wait).
            let first_wait =
                matches!(decision.action, Action::Wait { .. }) && !state.waiting.contains(&uid);
            let span = if first_wait || !matches!(decision.action, Action::Wait { .. }) {
                decision_span(pod, role, &decision)
            } else {
                tracing::Span::none()
            };
            if let Action::Wait { node, .. } = &decision.action {
                any_waiting = true;
                if state.waiting.insert(uid.clone()) {
                    notices.push(Notice::pod(
                        pod,
                        false,
                        "PlacementWaiting",
                        format!(
                            "waiting for node {node} ({}) until the escalation timeout",
                            decision.reason
                        ),
                    ));
                }
                continue;
            }
            let Some(token) = ctx.keys.mint(&uid, role, now, ctx.settings.token_ttl) else {
                span.record("released", false);
                tracing::info!(parent: &span, pod = %name, "no token key yet; placement waits for it");
                any_waiting = true;
                continue;
            };
            let (body, outcome) = match &decision.action {
                Action::Pin { node } => (patch::pin(pod, node, &token), Release::pinned),
                Action::Relax(c) => (patch::relax(pod, c, "Relaxed", &token), Release::relaxed),
                Action::Anywhere(c) => {
                    (patch::relax(pod, c, "Anywhere", &token), Release::anywhere)
                }
                Action::Wait { .. } => continue,
            };
            let api: Api<Pod> =
                Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
            let patched = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .instrument(span.clone())
                .await;
            span.record("released", patched.is_ok());
            match patched {
                Ok(_) => {
                    state.waiting.remove(&uid);
                    released(&ctx, &ph, pod, &decision, outcome, &mut notices);
                    if let (Some(node), Some(snap)) = (
                        decision.pinned_node(),
                        snapshot.lock().unwrap_or_else(|p| p.into_inner()).as_mut(),
                    ) && let (Some(p), Some(n)) = (snap.pod_by_uid(&uid), snap.node_id(node))
                    {
                        snap.place(p, Some(n));
                    }
                }
                Err(e) => {
                    tracing::warn!(parent: &span, pod = %name, error = %e, "could not release the pod's gate; retrying");
                    any_waiting = true;
                }
            }
        }
    }

    // Pinned pods that lost their node.
    for o in state.history.overdue(now) {
        ctx.metrics.placement_escalations.get_or_create(&m).inc();
        let api: Api<Pod> =
            Api::namespaced(ctx.client.clone(), &ph.namespace().unwrap_or_default());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(o.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&o.pod_name, &dp).await {
            Ok(_) => {
                tracing::info!(pod = %o.pod_name, node = %o.node, "pinned pod still pending past its deadline; deleted")
            }
            Err(e) => {
                tracing::warn!(pod = %o.pod_name, error = %e, "could not delete an overdue pinned pod")
            }
        }
        notices.push(Notice::ph(
            &ph,
            true,
            "PlacementEscalated",
            format!(
                "pod {} was pinned to {} but not scheduled before its deadline ({}); deleted, its replacement is placed relaxed",
                o.pod_name, o.node, o.reason
            ),
        )
        .about_pod(&ns, &o.pod_name));
    }
    state.history.purge(now);

    // Status: at most once per interval, only on change.
    let due = state
        .last_write
        .is_none_or(|t| t.elapsed() >= ctx.settings.status_interval);
    let mut result = Ok(());
    if due {
        let dirty = state.history.is_dirty();
        let mut status = ph.status.clone().unwrap_or_default();
        state.history.write_status(&mut status, now);
        status.observed_generation = ph.metadata.generation;
        set_condition(
            &mut status.conditions,
            condition(
                READY,
                true,
                "Placing",
                format!(
                    "{} role(s), history on {} node(s), {} pod(s) gated",
                    status.role_count, status.node_count, status.gated_pods
                ),
                ph.metadata.generation,
                now,
            ),
        );
        let changed = dirty
            || state
                .last_figures
                .as_ref()
                .is_none_or(|l| figures_differ(l, &status));
        if changed {
            match write_status(&ctx.client, &ph, &status).await {
                Ok(()) => {
                    state.last_write = Some(Instant::now());
                    state.last_figures = Some(status);
                }
                Err(e) => {
                    state.history.mark_dirty();
                    result = Err(PassError::Status(key.clone(), e));
                }
            }
        }
    }
    ctx.metrics
        .observe(crate::metrics::Function::placement, started.elapsed());
    let requeue = if any_waiting || state.history.is_dirty() {
        ctx.settings.retry
    } else {
        ctx.settings.status_interval.max(ctx.settings.retry)
    };
    ctx.put_state(&key, state);
    ctx.notify(notices).await;
    result.map(|()| Requeue::requeue(requeue))
}

/// The span of one placement decision: `decision` is `pin`, `wait`, `relax` or `release`
/// (gate removed without a node), `node` the chosen (or awaited) node, `released` whether the
/// gate came off.
fn decision_span(pod: &Pod, role: &str, decision: &Decision) -> tracing::Span {
    let (kind, node) = match &decision.action {
        Action::Pin { node } => ("pin", node.as_str()),
        Action::Wait { node, .. } => ("wait", node.as_str()),
        Action::Relax(_) => ("relax", ""),
        Action::Anywhere(_) => ("release", ""),
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

/// The figures a status shows besides the history entries.
fn figures_differ(a: &PlacementHistoryStatus, b: &PlacementHistoryStatus) -> bool {
    a.roles != b.roles
        || a.gated_pods != b.gated_pods
        || a.hit_rate != b.hit_rate
        || a.node_count != b.node_count
        || a.role_count != b.role_count
        || find(&a.conditions, READY).map(|c| (&c.status, &c.message))
            != find(&b.conditions, READY).map(|c| (&c.status, &c.message))
}

fn report_end(
    state: &mut PhState,
    ph: &PlacementHistory,
    uid: &str,
    t: &Termination,
    now: Timestamp,
    notices: &mut Vec<Notice>,
) {
    let Some(report) = state.history.on_terminated(uid, t, now) else {
        return;
    };
    tracing::info!(node = %report.node, role = %report.role, class = report.class.as_str(), "pod ended");
    if report.node_excluded {
        let until = state.history.next_failure_reset(now);
        notices.push(Notice::ph(
            ph,
            true,
            "NodeExcluded",
            format!(
                "node {} failed role {} too often; not pinned to until the failure window resets at {until}",
                report.node, report.role
            ),
        )
        .about_node(&report.node));
    }
}

fn released(
    ctx: &Ctx,
    ph: &PlacementHistory,
    pod: &Pod,
    decision: &Decision,
    outcome: Release,
    notices: &mut Vec<Notice>,
) {
    let pl = PlacementLabels {
        namespace: ph.namespace().unwrap_or_default(),
        placement_history: ph.name_any(),
        outcome,
    };
    ctx.metrics.placements.get_or_create(&pl).inc();
    if let Some(waited) = ctx.ungated(&pod.uid().unwrap_or_default()) {
        ctx.metrics
            .gate_wait
            .get_or_create(&labels(ph))
            .observe(waited.as_secs_f64());
    }
    let note = match &decision.action {
        Action::Pin { node } => format!("pinned to node {node} ({})", decision.reason),
        _ => format!(
            "released {} ({})",
            decision.outcome().as_str(),
            decision.reason
        ),
    };
    let escalated = decision.reason == PlacementReason::EscalationTimeout;
    if escalated {
        ctx.metrics
            .placement_escalations
            .get_or_create(&labels(ph))
            .inc();
    }
    notices.push(Notice::pod(
        pod,
        escalated,
        if escalated {
            "PlacementEscalated"
        } else {
            "Placed"
        },
        note,
    ));
}

/// Server-side apply of the status (field manager `ebb-controller`).
pub async fn write_status(
    client: &kube::Client,
    ph: &PlacementHistory,
    status: &PlacementHistoryStatus,
) -> Result<(), kube::Error> {
    let api: Api<PlacementHistory> =
        Api::namespaced(client.clone(), &ph.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "PlacementHistory",
        "status": status,
    });
    api.patch_status(
        &ph.name_any(),
        &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
