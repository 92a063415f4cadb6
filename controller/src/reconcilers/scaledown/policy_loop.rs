//! One loop of a ScaleDownPolicy as its phases, each a function returning a value the next
//! reads: observe → plan → act → report. Timing wraps each phase from here.

use std::future::Future;
use std::time::Instant;

use ebb_api::ScaleDownPolicy;
use kube::ResourceExt;

use super::context::{Context, PolicyMemory};
use super::error::Error;
use super::plan_phase::Planned;
use super::{act, observe, plan_phase, report};
use crate::metrics::LoopPhase;

/// Runs one loop of `policy`. Returns when the next candidate will have been removable long
/// enough (the loop should run again then), if one waits for that.
pub async fn run(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    now: jiff::Timestamp,
    t0: Instant,
) -> Result<Option<jiff::Timestamp>, Error> {
    let name = policy.name_any();
    let mut observed = observe::observe(policy, ctx, memory, now).await;
    let planned = plan_phase::plan(ctx, &observed, memory).await;
    if let Some(d) = &planned.unreadable {
        observed.degraded = Some(d.clone());
        observed.stopped = true;
    }
    timed(
        ctx,
        &name,
        LoopPhase::act,
        act::act(policy, ctx, memory, &observed, &planned),
    )
    .await;
    let status = timed(
        ctx,
        &name,
        LoopPhase::status_write,
        report::write_status(policy, ctx, memory, &observed, &planned, t0),
    )
    .await?;
    report::publish_events(policy, ctx, memory, &observed, &planned).await;
    report::update_metrics(ctx, &name, &status, planned.selection.as_ref());
    tracing::info!(
        selected = observed.mine.len(),
        candidates = status.candidates,
        draining = status.draining,
        removed = status.removed_total,
        took_ms = t0.elapsed().as_millis() as u64,
        "loop done"
    );
    Ok(next_loop(&planned, now))
}

/// When the loop should run again before its scan interval: when the next candidate has been
/// unneeded long enough, or, for nodes kept only because pods just arrived on them
/// (`PodsArriving`), when that window has passed. The earlier of the two.
fn next_loop(planned: &Planned, now: jiff::Timestamp) -> Option<jiff::Timestamp> {
    let due = planned.selection.as_ref().and_then(|s| s.next_due);
    let arriving = planned.plan.as_ref().is_some_and(|p| {
        p.unremovable
            .iter()
            .any(|u| u.reason == ebb_api::reasons::UnremovableReason::PodsArriving)
    });
    let window_end = arriving.then(|| now + crate::scaledown::eligibility::ARRIVAL_WINDOW);
    match (due, window_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs `phase` and records how long it took.
pub async fn timed<T>(
    ctx: &Context,
    policy: &str,
    phase: LoopPhase,
    fut: impl Future<Output = T>,
) -> T {
    let t = Instant::now();
    let out = fut.await;
    ctx.metrics.observe_phase(policy, phase, t.elapsed());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaledown::decisions::{Plan, Unremovable};
    use ebb_api::reasons::UnremovableReason;

    fn kept(reason: UnremovableReason) -> Unremovable {
        Unremovable {
            node: "n1".into(),
            reason,
            pod: None,
            pod_reason: None,
            detail: None,
        }
    }

    #[test]
    fn a_node_kept_for_arriving_pods_brings_the_next_loop_to_the_window_end() {
        let now = jiff::Timestamp::UNIX_EPOCH;
        let with = |reason| Planned {
            plan: Some(Plan {
                unremovable: vec![kept(reason)],
                ..Plan::default()
            }),
            ..Planned::default()
        };
        assert_eq!(
            next_loop(&with(UnremovableReason::PodsArriving), now),
            Some(now + crate::scaledown::eligibility::ARRIVAL_WINDOW)
        );
        assert_eq!(
            next_loop(&with(UnremovableReason::NotUnderutilized), now),
            None,
            "other reasons wait for the scan interval"
        );
    }
}
