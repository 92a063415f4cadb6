//! The observe phase of a policy's loop: which nodes it selects, which it shares with another
//! acting policy, bad input, and what the actuator reported since the last loop.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ebb_api::{ScaleDownMode, ScaleDownPolicy};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::context::{Context, PolicyMemory};
use super::selection::{self, AllPolicies, Degraded, node_name};
use super::status;
use crate::actuation::status::Finished;
use crate::actuation::taints::{self, EbbTaint};
use crate::actuation::{ActuationStatus, Outcome};
use crate::scaledown::PlannerConfig;

/// What the loop saw before planning: the policy's nodes, overlaps, bad input, and what the
/// actuator reported since the last loop.
pub struct Observed {
    pub name: String,
    pub now: jiff::Timestamp,
    pub nodes: Vec<Arc<Node>>,
    /// The nodes this policy selects.
    pub mine: BTreeSet<String>,
    /// Nodes this policy shares with other acting policies: left alone.
    pub overlaps: BTreeMap<String, Vec<String>>,
    pub cfg: Option<PlannerConfig>,
    pub degraded: Option<Degraded>,
    /// Bad input: the policy acts on nothing.
    pub stopped: bool,
    pub actuation: ActuationStatus,
    /// Drains of this policy that ended since the last loop.
    pub finished: Vec<Finished>,
    /// Nodes removed since the policy was created.
    pub removed: i64,
    /// Evictions refused by a PodDisruptionBudget since the policy was created.
    pub refused: i64,
}

impl Observed {
    /// The policy's nodes that no other acting policy selects.
    pub fn free_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().map(|n| &**n).filter(|n| {
            let nn = n.name_any();
            self.mine.contains(&nn) && !self.overlaps.contains_key(&nn)
        })
    }
}

/// Selects the policy's nodes, finds overlaps and bad input, and takes the actuator's report:
/// finished drains (removed total), evictions (into the planner's memory), refusals.
pub async fn observe(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    now: jiff::Timestamp,
) -> Observed {
    let name = policy.name_any();
    let spec = &policy.spec;
    let nodes: Vec<Arc<Node>> = ctx.stores.nodes.state();
    let selections =
        AllPolicies::from_store(&ctx.policies, policy).selections(nodes.iter().map(|n| &**n));
    let mine = selections.nodes_of(&name);
    let overlaps = selections.overlaps_of(&name);
    let cfg = PlannerConfig::from_spec(spec);
    let deletion_forbidden = spec.mode == ScaleDownMode::DrainAndDelete
        && ctx.node_deletion.allowed(&ctx.client).await == Some(false);
    let method_not_enabled = spec
        .removal
        .as_ref()
        .map(|r| r.method)
        .filter(|m| spec.mode != ScaleDownMode::Drain && !ctx.actuator.remover().enabled(*m));
    let degraded = selection::degraded(
        cfg.as_ref().err().map(|e| e.to_string()),
        selection::removal_refusal(deletion_forbidden, method_not_enabled),
        cfg.as_ref().ok().map(|c| &c.budgets),
        spec.node_group_label.as_deref(),
        nodes
            .iter()
            .map(|n| &**n)
            .filter(|n| mine.contains(&node_name(n))),
        &overlaps,
    );
    let stopped = degraded.as_ref().is_some_and(|d| d.stops_policy);
    ctx.steering.expire(now);
    let mut actuation = ctx.actuator.tracker().status(&name);
    let finished = std::mem::take(&mut actuation.finished);
    let mut removed = match memory.removed_total {
        Some(r) => r,
        None => removed_before_this_process(policy, &nodes, &actuation, &finished),
    };
    removed += finished
        .iter()
        .filter(|f| f.outcome == Outcome::Removed)
        .count() as i64;
    memory.removed_total = Some(removed);
    let refused = memory.refused_total.unwrap_or_else(|| {
        policy
            .status
            .as_ref()
            .map_or(0, |s| s.evictions_refused_total)
    }) + actuation.refused;
    memory.refused_total = Some(refused);
    for e in std::mem::take(&mut actuation.evicted) {
        if let Some(pod) = e.object {
            memory.planner.record_eviction(pod, e.at);
        }
    }
    Observed {
        name,
        now,
        nodes,
        mine,
        overlaps,
        cfg: cfg.ok(),
        degraded,
        stopped,
        actuation,
        finished,
        removed,
        refused,
    }
}

/// First loop of this process: drains the written status lists as in flight that ended since
/// (a previous process stopped before writing that down) count too.
fn removed_before_this_process(
    policy: &ScaleDownPolicy,
    nodes: &[Arc<Node>],
    actuation: &crate::actuation::ActuationStatus,
    finished: &[crate::actuation::status::Finished],
) -> i64 {
    let in_flight = actuation.in_flight();
    let by_name: BTreeMap<String, &Node> = nodes.iter().map(|n| (node_name(n), &**n)).collect();
    status::removed_at_start(policy.status.as_ref(), |n| {
        if in_flight.contains(n) || finished.iter().any(|f| f.drain.node == n) {
            return false;
        }
        by_name.get(n).is_none_or(|node| {
            node.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(ebb_api::names::LABEL_DRAINED))
                && !taints::has(node, EbbTaint::ToBeDeleted)
        })
    })
}
