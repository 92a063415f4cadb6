//! Restart safety at start: with caches synced and leadership held, re-derive in-flight drains
//! from taints, resume those an acting policy still governs, and roll back every other ebb taint.

use std::sync::Arc;

use ebb_api::ScaleDownMode;
use kube::ResourceExt;

use super::context::Context;
use super::reconcile::recheck_node;
use crate::actuation::pods::{classify, uids_on};
use crate::actuation::recover::recover;
use crate::actuation::{DrainOrder, EbbTaint, EvictionSettings, Recheck};
use crate::metrics::ScaleDownKind;
use crate::scaledown::{PlannerConfig, PlannerState};

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
    let views: Vec<(String, Option<PlannerConfig>, bool)> = policies
        .iter()
        .map(|p| {
            let cfg = PlannerConfig::from_spec(&p.spec).ok();
            let acts = p.spec.mode != ScaleDownMode::DryRun
                && p.metadata.deletion_timestamp.is_none()
                && cfg.is_some();
            (p.name_any(), cfg, acts)
        })
        .collect();
    let selection_views: Vec<super::selection::PolicyView<'_>> = views
        .iter()
        .map(|(name, cfg, acts)| super::selection::PolicyView {
            name,
            selector: cfg.as_ref().map(|c| &c.node_selector),
            acts: *acts,
        })
        .collect();
    let selections =
        super::selection::Selections::compute(&selection_views, nodes.iter().map(|n| &**n));
    let plan = recover(
        nodes.iter().map(|n| &**n),
        &selections.governors(),
        &ctx.actuator.tracker().in_flight(),
    );
    let writer = ctx.actuator.node_writer().clone();
    let mut out = Recovered::default();
    for n in &plan.untaint_hard {
        match writer.remove_taint(n, EbbTaint::ToBeDeleted).await {
            Ok(_) => out.rolled_back += 1,
            Err(e) => {
                tracing::warn!(node = %n, error = %e, "start-up: could not roll a drain back")
            }
        }
    }
    for n in &plan.untaint_soft {
        match writer.remove_taint(n, EbbTaint::Candidate).await {
            Ok(_) => out.soft_untainted += 1,
            Err(e) => {
                tracing::warn!(node = %n, error = %e, "start-up: could not remove a soft taint")
            }
        }
    }
    let pods = ctx.stores.pods.state();
    for r in &plan.resume {
        let Some(policy) = policies.iter().find(|p| p.name_any() == r.policy) else {
            continue;
        };
        let Some(cfg) = views
            .iter()
            .find(|v| v.0 == r.policy)
            .and_then(|v| v.1.clone())
        else {
            continue;
        };
        let stores = ctx.stores.clone();
        let recheck: Recheck = Arc::new(move |n: &str| {
            recheck_node(stores.objects(), &cfg, &PlannerState::default(), n)
        });
        let ready = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(r.node.as_str()))
            .and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .is_none_or(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let kind = if !ready {
            ScaleDownKind::unready
        } else if classify(&r.node, pods.iter().map(|p| &**p))
            .evict
            .is_empty()
        {
            ScaleDownKind::empty
        } else {
            ScaleDownKind::underutilized
        };
        let order = DrainOrder {
            policy: r.policy.clone(),
            node: r.node.clone(),
            kind,
            mode: policy.spec.mode,
            settings: EvictionSettings::from_spec(&policy.spec),
            planned_pods: uids_on(&r.node, pods.iter().map(|p| &**p)),
            resume_from: Some(r.started.unwrap_or_else(jiff::Timestamp::now)),
            recheck,
            cancel: ctx.cancel_token(&r.policy),
        };
        match ctx.actuator.start(order).await {
            Ok(Some(_)) => out.resumed += 1,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(node = %r.node, error = %e, "start-up: could not resume a drain")
            }
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
