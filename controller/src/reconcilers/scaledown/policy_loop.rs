//! One loop of a ScaleDownPolicy as its phases, each a function returning a value the next
//! reads: observe → plan → act → report. Timing wraps each phase from here.

use std::future::Future;
use std::time::Instant;

use ebb_api::ScaleDownPolicy;
use kube::ResourceExt;

use super::context::{Context, PolicyMemory};
use super::error::Error;
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
    Ok(planned.selection.and_then(|s| s.next_due))
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
