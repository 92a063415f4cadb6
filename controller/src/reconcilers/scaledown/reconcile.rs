//! One loop of a ScaleDownPolicy: select nodes, check for bad input and overlaps, plan, soft-taint,
//! start drains, write status (server-side apply, only on change), emit Events on transitions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb_api::names::{FIELD_MANAGER_CONTROLLER, FINALIZER_SCALEDOWN};
use ebb_api::reasons::{ThrottledReason, UnremovableReason};
use ebb_api::{ScaleDownMode, ScaleDownPolicy, ScaleDownPolicyStatus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use super::context::Context;
use super::policy_loop;
use super::selection::{PolicyView, Selections};
use crate::actuation::taints::{self, EbbTaint};
use crate::metrics::{Function, PolicyLabels, PolicyReasonLabels, Reconciler};
use crate::scaledown::{InstantStopwatch, PlannerConfig};
use crate::state::Stores;

/// Requeue after an error.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// How long a deleted policy waits for its drains to roll back before cleaning taints anyway.
pub const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// A loop that failed; retried after [`ERROR_REQUEUE`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ScaleDownPolicy {policy}: the cluster snapshot cannot be built: {source}")]
    Snapshot {
        policy: String,
        #[source]
        source: crate::cluster::SnapshotError,
    },
    #[error("ScaleDownPolicy {policy}: writing status: {source}")]
    Status {
        policy: String,
        #[source]
        source: kube::Error,
    },
    #[error("ScaleDownPolicy {policy}: {source}")]
    Finalizer {
        policy: String,
        #[source]
        source: Box<finalizer::Error<Error>>,
    },
    #[error("ScaleDownPolicy has no name")]
    NoName,
}

impl Error {
    /// The `reason` label of `ebb_reconcile_errors`: the variant's name.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Snapshot { .. } => "Snapshot",
            Error::Status { .. } => "Status",
            Error::Finalizer { .. } => "Finalizer",
            Error::NoName => "NoName",
        }
    }
}

/// kube-runtime entry point: the finalizer around [`apply`] and [`cleanup`].
pub async fn reconcile(policy: Arc<ScaleDownPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.metadata.name.clone().ok_or(Error::NoName)?;
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let api: Api<ScaleDownPolicy> = Api::all(ctx.client.clone());
    let span = tracing::info_span!("loop", policy = %name);
    finalizer(&api, FINALIZER_SCALEDOWN, policy, |event| async {
        match event {
            finalizer::Event::Apply(p) => apply(p, ctx.clone()).await,
            finalizer::Event::Cleanup(p) => cleanup(p, ctx.clone()).await,
        }
    })
    .instrument(span)
    .await
    .map_err(|source| Error::Finalizer {
        policy: name,
        source: Box::new(source),
    })
}

/// Logs the failure and retries later.
pub fn error_policy(policy: Arc<ScaleDownPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(policy = %policy.name_any(), %error, "loop failed; retrying");
    ctx.metrics
        .reconcile_failed(Reconciler::scaledown, error.reason());
    Action::requeue(ERROR_REQUEUE)
}

/// Planner configs of every policy (for overlaps), with whether each may act.
pub(super) struct AllPolicies {
    configs: Vec<(String, Result<PlannerConfig, String>, bool)>,
}

impl AllPolicies {
    pub(super) fn from_store(ctx: &Context, current: &ScaleDownPolicy) -> Self {
        let mut policies: BTreeMap<String, Arc<ScaleDownPolicy>> = ctx
            .policies
            .state()
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        // The store may lag behind the object being reconciled.
        policies.insert(current.name_any(), Arc::new(current.clone()));
        Self::from_policies(policies.into_values())
    }

    pub(super) fn from_policies(policies: impl IntoIterator<Item = Arc<ScaleDownPolicy>>) -> Self {
        let configs = policies
            .into_iter()
            .map(|p| {
                let cfg = PlannerConfig::from_spec(&p.spec).map_err(|e| e.to_string());
                let acts = p.spec.mode != ScaleDownMode::DryRun
                    && p.metadata.deletion_timestamp.is_none()
                    && cfg.is_ok();
                (p.name_any(), cfg, acts)
            })
            .collect();
        Self { configs }
    }

    /// The planner configuration of `policy`, when its spec is valid.
    pub(super) fn config(&self, policy: &str) -> Option<&PlannerConfig> {
        let (_, cfg, _) = self.configs.iter().find(|(name, _, _)| name == policy)?;
        cfg.as_ref().ok()
    }

    pub(super) fn selections<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) -> Selections {
        let views: Vec<PolicyView<'_>> = self
            .configs
            .iter()
            .map(|(name, cfg, acts)| PolicyView {
                name,
                selector: cfg.as_ref().ok().map(|c| &c.node_selector),
                acts: *acts,
            })
            .collect();
        Selections::compute(&views, nodes)
    }
}

pub(super) fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

/// The planner's re-check of one node after its taint: can all its pods still go elsewhere, with
/// the other deletions in flight? [`crate::scaledown::recheck`] on the shared cluster model,
/// brought up to date first (it forks the model and leaves it as it was).
pub fn recheck_node(
    stores: &Stores,
    cfg: &PlannerConfig,
    state: &crate::scaledown::PlannerState,
    node: &str,
) -> Result<(), String> {
    let (mut live, _) = stores.model();
    let snap = live.snapshot_mut().map_err(|e| e.to_string())?;
    crate::scaledown::recheck(
        snap,
        cfg,
        state,
        node,
        jiff::Timestamp::now(),
        &mut InstantStopwatch::start(),
    )
}

/// The loop of one policy.
async fn apply(policy: Arc<ScaleDownPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let t0 = Instant::now();
    let now = jiff::Timestamp::now();
    let name = policy.name_any();
    let spec = &policy.spec;
    let mut memory = ctx.take_memory(&name);
    let result = policy_loop::run(&policy, &ctx, &mut memory, now, t0).await;
    ctx.put_memory(&name, memory);
    ctx.metrics.observe(Function::reconcile, t0.elapsed());
    let next_due = result?;
    Ok(Action::requeue(next_loop(
        spec.scan_interval.as_duration(),
        now,
        next_due,
    )))
}

/// When the policy runs again: after `scanInterval`, or sooner when a candidate's
/// `unneededTime` runs out before that (a little after, so that it has).
fn next_loop(scan: Duration, now: jiff::Timestamp, due: Option<jiff::Timestamp>) -> Duration {
    const AFTER_DUE: Duration = Duration::from_millis(50);
    match due {
        None => scan,
        Some(d) => {
            let until = Duration::try_from(d.duration_since(now)).unwrap_or(Duration::ZERO);
            scan.min(until + AFTER_DUE)
        }
    }
}

/// Server-side apply of the whole status (field manager `ebb-controller`).
pub async fn write_status(
    client: &kube::Client,
    name: &str,
    status: &ScaleDownPolicyStatus,
) -> Result<(), kube::Error> {
    let api: Api<ScaleDownPolicy> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// The policy is being deleted: stop its drains (they untaint their nodes), then remove every
/// ebb taint left on the nodes it selects.
async fn cleanup(policy: Arc<ScaleDownPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.name_any();
    ctx.forget(&name);
    let tracker = ctx.actuator.tracker().clone();
    let deadline = Instant::now() + CLEANUP_WAIT;
    while !tracker.draining(Some(&name)).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let in_flight = tracker.in_flight();
    let selector = PlannerConfig::from_spec(&policy.spec)
        .ok()
        .map(|c| c.node_selector);
    let writer = ctx.actuator.node_writer().clone();
    let mut removed = 0usize;
    for n in ctx.stores.nodes.state() {
        let nn = node_name(&n);
        let empty = BTreeMap::new();
        let selected = selector
            .as_ref()
            .is_some_and(|s| s.matches(n.metadata.labels.as_ref().unwrap_or(&empty)));
        if !selected || in_flight.contains(&nn) {
            continue;
        }
        for t in [EbbTaint::Candidate, EbbTaint::ToBeDeleted] {
            if taints::has(&n, t) {
                match writer.remove_taint(&nn, t).await {
                    Ok(_) => removed += 1,
                    Err(e) => tracing::warn!(node = %nn, error = %e, "cleanup: removing a taint"),
                }
            }
        }
    }
    let labels = PolicyLabels {
        policy: name.clone(),
    };
    ctx.metrics.unneeded_nodes.remove(&labels);
    ctx.metrics.drains_in_progress.remove(&labels);
    for reason in UnremovableReason::ALL {
        ctx.metrics.unremovable_nodes.remove(&PolicyReasonLabels {
            policy: name.clone(),
            reason: reason.to_string(),
        });
    }
    for reason in ThrottledReason::ALL {
        ctx.metrics.throttled.remove(&PolicyReasonLabels {
            policy: name.clone(),
            reason: reason.to_string(),
        });
    }
    tracing::info!(policy = %name, taints_removed = removed, "policy deleted; its taints are gone");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_loop_comes_when_a_candidate_is_due() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let scan = Duration::from_secs(10);
        let at = |s: i64| now + jiff::SignedDuration::from_secs(s);
        assert_eq!(next_loop(scan, now, None), scan);
        assert_eq!(
            next_loop(scan, now, Some(at(3))),
            Duration::from_millis(3050)
        );
        assert_eq!(next_loop(scan, now, Some(at(60))), scan);
        assert_eq!(
            next_loop(scan, now, Some(at(-2))),
            Duration::from_millis(50)
        );
    }
}
