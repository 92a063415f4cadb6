//! The act phase of a policy's loop: soft taints on candidates, stray `to-be-deleted` taints
//! rolled back, the selected drains started; or, when the policy stops acting, standing down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ebb_api::{ScaleDownMode, ScaleDownPolicy};
use futures::StreamExt;
use kube::ResourceExt;

use super::context::{Context, PolicyMemory};
use super::observe::Observed;
use super::orders::{NodeToDrain, drain_kind, drain_order};
use super::plan_phase::Planned;
use crate::actuation::RecheckInputs;
use crate::actuation::taints::{self, EbbTaint, plan_soft_taints};
use crate::metrics::Function;

/// Whether this loop writes to nodes: not stopped, not DryRun, and the leader.
pub fn acts(policy: &ScaleDownPolicy, ctx: &Context, observed: &Observed) -> bool {
    !observed.stopped && policy.spec.mode != ScaleDownMode::DryRun && ctx.leadership.is_leader()
}

/// The phase: act when the policy may, else stand down if this replica leads.
pub async fn act(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    observed: &Observed,
    planned: &Planned,
) {
    if acts(policy, ctx, observed) {
        let unmarked = update_soft_taints(policy, ctx, observed, planned).await;
        roll_back_stray_taints(ctx, observed).await;
        // Pods evicted now would be placed by the scheduler on the emptiest nodes: the other
        // candidates, unless they carry the soft taint. A candidate that receives them is held
        // for `recentEvictionWindow` (nothing is moved twice), so drains wait for the marks (at
        // most `SoftTaintWait::MAX`).
        if memory
            .soft_taint_wait
            .drains_may_start(unmarked, observed.now)
        {
            start_drains(policy, ctx, memory, observed, planned).await;
        } else {
            tracing::info!(
                unmarked,
                "drains wait until every candidate carries the soft taint"
            );
        }
    } else if ctx.leadership.is_leader() {
        stand_down(ctx, memory, observed).await;
    }
}

/// Soft taints (`ebb.dev/deletion-candidate`), removals first, within the per-loop cap and time
/// limit. Returns how many candidates the cap or the time limit left without it (0 when soft
/// tainting is off: a cap or a time limit of 0; a failed write is not waited for).
async fn update_soft_taints(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    observed: &Observed,
    planned: &Planned,
) -> usize {
    let spec = &policy.spec;
    let writer = ctx.actuator.node_writer();
    let t = Instant::now();
    let soft = plan_soft_taints(
        observed.free_nodes(),
        &planned.candidates,
        &observed.actuation.in_flight(),
        spec.max_bulk_soft_taint_count.max(0) as usize,
    );
    let limit = spec.max_bulk_soft_taint_time.as_duration();
    let off = spec.max_bulk_soft_taint_count <= 0 || limit.is_zero();
    let mut unmarked = soft.deferred_adds;
    let (mut done, mut tried) = (0usize, 0usize);
    let changes: Vec<(&String, bool)> = soft
        .remove
        .iter()
        .map(|n| (n, false))
        .chain(soft.add.iter().map(|n| (n, true)))
        .collect();
    // A few writes at a time, the time limit checked between them.
    for chunk in changes.chunks(CONCURRENT_STARTS) {
        if t.elapsed() >= limit {
            let left = changes.len() - tried;
            // Adds come last: those not tried yet.
            unmarked += soft.add.len().min(left);
            tracing::info!(
                done,
                left,
                "soft-taint time limit reached; the rest waits for the next loop"
            );
            break;
        }
        tried += chunk.len();
        let writes = chunk.iter().map(|&(node, add)| async move {
            if add {
                writer
                    .add_taint(node, EbbTaint::Candidate, observed.now)
                    .await
            } else {
                writer.remove_taint(node, EbbTaint::Candidate).await
            }
        });
        for r in futures::future::join_all(writes).await {
            match r {
                Ok(_) => done += 1,
                Err(e) => tracing::warn!(error = %e, "soft taint"),
            }
        }
    }
    if !soft.is_empty() {
        tracing::info!(
            added = soft.add.len(),
            removed = soft.remove.len(),
            deferred = soft.deferred,
            done,
            "soft taints updated"
        );
    }
    ctx.metrics.observe(Function::soft_taint, t.elapsed());
    if off { 0 } else { unmarked }
}

/// Never leak: a to-be-deleted taint with no drain behind it is rolled back.
async fn roll_back_stray_taints(ctx: &Context, observed: &Observed) {
    let writer = ctx.actuator.node_writer();
    let draining = observed.actuation.in_flight();
    for n in observed.free_nodes() {
        let nn = n.name_any();
        if taints::has(n, EbbTaint::ToBeDeleted) && !draining.contains(&nn) {
            tracing::info!(node = %nn, "to-be-deleted taint without a drain; removing it");
            if let Err(e) = writer.remove_taint(&nn, EbbTaint::ToBeDeleted).await {
                tracing::warn!(error = %e, "removing a stray taint");
            }
        }
    }
}

/// How many node writes (a drain's start: a node read and a taint write; a soft taint) are in
/// flight at once: a wave of 50 drains on a busy API server took a loop over a minute one after
/// the other.
const CONCURRENT_STARTS: usize = 16;

/// Starts the drains the selection allows now (empty nodes first), [`CONCURRENT_STARTS`] at a
/// time.
async fn start_drains(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    observed: &Observed,
    planned: &Planned,
) {
    let (Some(sel), Some(p), Some(cfg)) = (&planned.selection, &planned.plan, &observed.cfg) else {
        return;
    };
    let cancel = ctx.live_token(memory);
    let draining = observed.actuation.in_flight();
    let starts = sel
        .empty
        .iter()
        .map(|n| (n, true))
        .chain(sel.drain.iter().map(|n| (n, false)));
    let mut orders = Vec::new();
    // Made for the first drain, shared by all this loop starts.
    let mut recheck: Option<RecheckInputs> = None;
    for (node, empty) in starts {
        if observed.overlaps.contains_key(node) || draining.contains(node) {
            continue;
        }
        let candidate = p.candidates.iter().find(|c| &c.node == node);
        let destinations: BTreeMap<String, String> = candidate
            .iter()
            .flat_map(|c| c.moves.iter())
            .map(|m| (m.uid.to_string(), m.to.to_string()))
            .collect();
        let to_drain = NodeToDrain {
            name: node,
            object: observed
                .nodes
                .iter()
                .map(|n| &**n)
                .find(|n| n.metadata.name.as_deref() == Some(node.as_str())),
            kind: drain_kind(candidate.is_none_or(|c| c.ready), empty),
            planned_pods: planned.planned_pods.get(node).cloned().unwrap_or_default(),
            destinations,
            resume_from: None,
        };
        let recheck = recheck.get_or_insert_with(|| {
            RecheckInputs::new(Arc::new(cfg.clone()), Arc::new(memory.planner.clone()))
        });
        match drain_order(
            policy,
            cfg,
            recheck,
            &planned.providers,
            to_drain,
            cancel.clone(),
        ) {
            Ok(order) => orders.push((node, candidate, order)),
            Err(why) => tracing::info!(node = %node, %why, "not drained"),
        }
    }
    // Futures made first: a stream mapping with a closure over `ctx` is not provably `Send`.
    let starts: Vec<_> = orders
        .into_iter()
        .map(|(node, candidate, order)| async move {
            (node, candidate, ctx.actuator.start(order).await)
        })
        .collect();
    let mut started = futures::stream::iter(starts).buffer_unordered(CONCURRENT_STARTS);
    while let Some((node, candidate, result)) = started.next().await {
        match result {
            Ok(Some(_)) => {
                // Where the simulation put each pod, to compare with where its replacement goes.
                for m in candidate.iter().flat_map(|c| c.moves.iter()) {
                    tracing::info!(node = %node, pod = %m.pod, to = %m.to, "planned destination");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(node = %node, error = %e, "could not start the drain"),
        }
    }
}

/// DryRun or stopped: drains of this policy stop, and its soft taints go.
async fn stand_down(ctx: &Context, memory: &PolicyMemory, observed: &Observed) {
    if let Some(c) = &memory.cancel
        && observed
            .actuation
            .draining_of(&observed.name)
            .next()
            .is_some()
    {
        tracing::info!("policy no longer acts; cancelling its drains");
        c.cancel();
    }
    let writer = ctx.actuator.node_writer();
    for n in observed.free_nodes() {
        if taints::has(n, EbbTaint::Candidate)
            && let Err(e) = writer
                .remove_taint(&n.name_any(), EbbTaint::Candidate)
                .await
        {
            tracing::warn!(error = %e, "removing a soft taint");
        }
    }
}
