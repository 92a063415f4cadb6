//! Restart safety at start: with caches synced and leadership held, re-derive in-flight drains
//! from taints, resume those an acting policy still governs, and roll back every other ebb taint.

use std::sync::Arc;

use ebb_api::ScaleDownPolicy;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::context::Context;
use super::orders::{NodeToDrain, drain_kind, drain_order};
use super::selection::AllPolicies;
use crate::actuation::pods::{classify, uids_on};
use crate::actuation::recover::{Resume, recover};
use crate::actuation::{EbbTaint, RecheckInputs};
use crate::scaledown::PlannerConfig;

/// What start-up recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub resumed: usize,
    pub rolled_back: usize,
    pub soft_untainted: usize,
}

/// Run once before the controller starts acting.
pub async fn recover_at_start(ctx: &Context) -> Recovered {
    let nodes = ctx.stores.nodes.state();
    let policies = ctx.policies.state();
    let all = AllPolicies::from_policies(policies.iter().cloned());
    let selections = all.selections(nodes.iter().map(|n| &**n));
    let plan = recover(
        nodes.iter().map(|n| &**n),
        &selections.governors(),
        &ctx.actuator.tracker().in_flight(),
    );
    let mut out = Recovered {
        rolled_back: untaint(ctx, &plan.untaint_hard, EbbTaint::ToBeDeleted).await,
        soft_untainted: untaint(ctx, &plan.untaint_soft, EbbTaint::Candidate).await,
        ..Recovered::default()
    };
    for r in &plan.resume {
        let policy = policies.iter().find(|p| p.name_any() == r.policy);
        if let (Some(policy), Some(cfg)) = (policy, all.config(&r.policy))
            && resume(ctx, policy, cfg.clone(), &nodes, r).await
        {
            out.resumed += 1;
        }
    }
    tracing::info!(
        resumed = out.resumed,
        rolled_back = out.rolled_back,
        soft_untainted = out.soft_untainted,
        "start-up recovery done"
    );
    out
}

/// Removes `taint` from `nodes`; returns how many writes succeeded.
async fn untaint(ctx: &Context, nodes: &[String], taint: EbbTaint) -> usize {
    let writer = ctx.actuator.node_writer();
    let mut done = 0;
    for n in nodes {
        if !ctx.leadership.may_write() {
            tracing::warn!("start-up: the Lease may be another replica's; no more taints removed");
            break;
        }
        match writer.remove_taint(n, taint).await {
            Ok(_) => done += 1,
            Err(e) => {
                tracing::warn!(node = %n, ?taint, error = %e, "start-up: could not remove a taint")
            }
        }
    }
    done
}

/// Resumes the drain of one node an acting policy still governs; true when it was started.
async fn resume(
    ctx: &Context,
    policy: &ScaleDownPolicy,
    cfg: PlannerConfig,
    nodes: &[Arc<Node>],
    r: &Resume,
) -> bool {
    let pods = ctx.stores.pods.state();
    let node = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(r.node.as_str()));
    let ready = node
        .and_then(|n| n.status.as_ref()?.conditions.as_ref())
        .is_none_or(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let empty = classify(&r.node, pods.iter().map(|p| &**p))
        .evict
        .is_empty();
    let to_drain = NodeToDrain {
        name: &r.node,
        object: node.map(|n| &**n),
        kind: drain_kind(ready, empty),
        planned_pods: uids_on(&r.node, pods.iter().map(|p| &**p)),
        // The plan that chose the node died with the process that made it.
        destinations: Default::default(),
        resume_from: Some(r.started.unwrap_or_else(jiff::Timestamp::now)),
    };
    let order = match drain_order(
        policy,
        &cfg,
        &RecheckInputs::new(std::sync::Arc::new(cfg.clone()), Default::default()),
        &ctx.stores.providers.index(),
        to_drain,
        ctx.cancel_token(&r.policy),
    ) {
        Ok(o) => o,
        Err(why) => {
            tracing::warn!(node = %r.node, %why, "start-up: not resuming a drain");
            return false;
        }
    };
    match ctx.actuator.start(order).await {
        Ok(started) => started.is_some(),
        Err(e) => {
            tracing::warn!(node = %r.node, error = %e, "start-up: could not resume a drain");
            false
        }
    }
}
