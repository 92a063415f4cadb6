//! One loop of a ScaleDownPolicy: select nodes, check for bad input and overlaps, plan, soft-taint,
//! start drains, write status (server-side apply, only on change), emit Events on transitions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb_api::ScaleDownPolicy;
use ebb_api::names::FINALIZER_SCALEDOWN;
use ebb_api::reasons::{DegradedReason, ThrottledReason, UnremovableReason};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, ResourceExt};
use tracing::Instrument;

use super::context::Context;
pub use super::error::Error;
use super::policy_loop;
use super::selection::node_name;
use crate::actuation::taints::{self, EbbTaint};
use crate::metrics::{Function, PolicyLabels, PolicyReasonLabels, Reconciler};
use crate::scaledown::PlannerConfig;

/// Requeue after an error.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// How long a deleted policy waits for its drains to roll back before cleaning taints anyway.
pub const CLEANUP_WAIT: Duration = Duration::from_secs(30);

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
    ctx.metrics.cost_removed_per_hour.remove(&labels);
    ctx.metrics.cost_kept_per_hour.remove(&labels);
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
    for reason in DegradedReason::ALL {
        ctx.metrics.degraded.remove(&PolicyReasonLabels {
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
