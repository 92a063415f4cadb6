//! The re-check before a drain starts, on the shared cluster model: fork it, take ebb's
//! to-be-deleted taint off the node, plan for that node alone, revert. Nothing is rebuilt.

use ebb_api::names::TAINT_TO_BE_DELETED;
use jiff::Timestamp;

use super::config::PlannerConfig;
use super::planner::{PlannerState, Stopwatch, plan};
use crate::cluster::build::HOSTNAME_LABEL;
use crate::cluster::model::{Operator, Requirement, Selector};
use crate::cluster::{ClusterSnapshot, PredicateChecker};

/// The policy narrowed to `node`: group minimums were checked when its drain was selected, and
/// the node is evaluated whatever the time bound.
pub fn recheck_config(cfg: &PlannerConfig, node: &str) -> PlannerConfig {
    let mut cfg = cfg.clone();
    cfg.node_selector = Selector {
        requirements: vec![Requirement {
            key: HOSTNAME_LABEL.into(),
            operator: Operator::In,
            values: vec![node.to_string()],
        }],
    };
    cfg.limits.min_nodes_per_group = 0;
    cfg.limits.annotated_group_min = false;
    cfg.min_nodes_evaluated = 1;
    cfg
}

/// Can all of `node`'s pods still go elsewhere, with the other deletions in flight (the nodes
/// tainted to-be-deleted and the deleted set of `state`)? The node is simulated without its own
/// to-be-deleted taint. `snap` is forked and left exactly as it was. The error says why not.
pub fn recheck(
    snap: &mut ClusterSnapshot,
    cfg: &PlannerConfig,
    state: &PlannerState,
    node: &str,
    now: Timestamp,
    watch: &mut dyn Stopwatch,
) -> Result<(), String> {
    let cfg = recheck_config(cfg, node);
    snap.fork();
    if let Some(id) = snap.node_id(node)
        && snap.node(id).has_taint(TAINT_TO_BE_DELETED)
    {
        let kept = snap
            .node(id)
            .taints
            .iter()
            .filter(|t| t.key != TAINT_TO_BE_DELETED)
            .cloned()
            .collect();
        snap.set_taints(id, kept);
    }
    let mut state = state.clone();
    state.sync_deleting_from_taints(snap, now);
    state.finish_deleting(node);
    let p = plan(
        snap,
        &mut PredicateChecker::new(),
        &cfg,
        now,
        &mut state,
        watch,
    );
    snap.revert();
    if p.candidates.iter().any(|c| c.node == node) {
        return Ok(());
    }
    Err(match p.unremovable.iter().find(|u| u.node == node) {
        Some(u) => match &u.pod {
            Some(pod) => format!("{} (pod {pod})", u.reason),
            None => u.reason.to_string(),
        },
        None => "no longer in the candidate set".to_string(),
    })
}
