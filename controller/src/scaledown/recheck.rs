//! The re-check before a drain starts, on the shared cluster model: fork it, take ebb's
//! to-be-deleted taint off the node, plan for that node alone, revert. Nothing is rebuilt.

use ebb_api::names::TAINT_TO_BE_DELETED;
use jiff::Timestamp;

use std::collections::BTreeSet;

use super::config::PlannerConfig;
use super::decisions::Unremovable;
use super::memory::PlannerState;
use super::planner::{deleting, plan};
use super::stopwatch::Stopwatch;
use crate::cluster::{ClusterSnapshot, PredicateChecker};

/// The policy narrowed to `node`: group minimums were checked when its drain was selected, and
/// the node is evaluated whatever the time bound.
pub fn recheck_config(cfg: &PlannerConfig, node: &str) -> PlannerConfig {
    let mut cfg = cfg.clone();
    // By name: a node's hostname label may differ from its name (Karpenter sets it to the
    // NodeClaim's name, and names may be too long for a label value).
    cfg.only_node = Some(node.to_string());
    cfg.limits.min_nodes_per_group = 0;
    cfg.limits.annotated_group_min = false;
    cfg.min_nodes_evaluated = 1;
    cfg
}

/// Why the re-check refused a node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The planner, restricted to the node, keeps it (the reason, and the pod and detail that
    /// name the cause when there is one).
    #[error("{}", describe(.0))]
    Unremovable(Unremovable),
    /// The node is no longer one the policy governs, or is gone.
    #[error("no longer in the candidate set")]
    NotACandidate,
}

fn describe(u: &Unremovable) -> String {
    let mut s = u.reason.to_string();
    if let Some(pod) = &u.pod {
        s.push_str(&format!(" (pod {pod}"));
        if let Some(r) = u.pod_reason {
            s.push_str(&format!(": {r}"));
        }
        s.push(')');
    }
    if let Some(d) = &u.detail {
        s.push_str(&format!(": {d}"));
    }
    s
}

impl Refusal {
    /// The unremovable reason, for events and metrics.
    pub fn reason(&self) -> Option<ebb_api::reasons::UnremovableReason> {
        match self {
            Refusal::Unremovable(u) => Some(u.reason),
            Refusal::NotACandidate => None,
        }
    }
}

/// What a plan restricted to `node` reads of `state`: the recent evictions, the node's own
/// candidacy, and the destination hints of the pods of `node`, of the nodes being deleted and
/// of the nodes the recent evictions left (the only sources the simulation looks hints up for).
/// The other hints and the non-candidates are not copied.
fn narrowed(state: &PlannerState, deleting: &BTreeSet<String>, node: &str) -> PlannerState {
    let evicted_from = state
        .recent_evictions
        .iter()
        .filter_map(|e| e.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()));
    let sources = deleting
        .iter()
        .map(String::as_str)
        .chain([node])
        .chain(evicted_from);
    PlannerState {
        candidates: state
            .candidates
            .get_key_value(node)
            .map(|(k, v)| (k.clone(), *v))
            .into_iter()
            .collect(),
        recent_evictions: state.recent_evictions.clone(),
        hints: state.hints.only_from(sources),
        ..PlannerState::default()
    }
}

/// Can all of `node`'s pods still go elsewhere, with the other deletions in flight (the nodes
/// tainted to-be-deleted and those in `in_flight`)? The node is simulated without its own
/// to-be-deleted taint. `snap` is forked and left exactly as it was.
pub fn recheck(
    snap: &mut ClusterSnapshot,
    cfg: &PlannerConfig,
    state: &PlannerState,
    in_flight: &BTreeSet<String>,
    node: &str,
    now: Timestamp,
    watch: &mut dyn Stopwatch,
) -> Result<(), Refusal> {
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
    let mut others = deleting(snap, in_flight);
    others.remove(node);
    let mut state = narrowed(state, &others, node);
    let p = plan(
        snap,
        &mut PredicateChecker::new(),
        &cfg,
        now,
        &mut state,
        &others,
        watch,
    );
    snap.revert();
    if p.candidates.iter().any(|c| c.node == node) {
        return Ok(());
    }
    Err(match p.unremovable.into_iter().find(|u| u.node == node) {
        Some(u) => Refusal::Unremovable(u),
        None => Refusal::NotACandidate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actuation::taints::EbbTaint;
    use crate::scaledown::StepStopwatch;
    use crate::testkit::{config_selecting, node, pod, snapshot};

    /// A drained node named unlike its hostname label (as Karpenter's are) and a pod that can
    /// or cannot go elsewhere.
    fn check(spare_cpu: &str) -> Result<(), Refusal> {
        let now = jiff::Timestamp::UNIX_EPOCH;
        let long = "kwok-general-abcde-chillebony-3-unnypc6htu-543910513";
        let mut snap = snapshot(
            [
                node(long)
                    .cpu("4")
                    .mem("8Gi")
                    .label("pool", "p")
                    .label("kubernetes.io/hostname", "general-abcde")
                    .taint(EbbTaint::ToBeDeleted.at(now)),
                node("other").cpu(spare_cpu).mem("8Gi").label("pool", "p"),
            ],
            [pod("web-1").on(long).cpu("1").mem("1Gi").owned_by_rs("web")],
        );
        let before = format!("{:?}", snap.node(0));
        let out = recheck(
            &mut snap,
            &config_selecting("pool", "p"),
            &PlannerState::default(),
            &BTreeSet::new(),
            long,
            now,
            &mut StepStopwatch::default(),
        );
        assert_eq!(
            format!("{:?}", snap.node(0)),
            before,
            "the snapshot is left as it was"
        );
        out
    }

    #[test]
    fn the_node_is_found_by_name_whatever_its_hostname_label() {
        assert_eq!(check("4"), Ok(()));
    }

    #[test]
    fn a_pod_with_nowhere_to_go_fails_the_recheck() {
        let err = check("500m").expect_err("no room for web-1");
        assert_eq!(
            err.reason(),
            Some(ebb_api::reasons::UnremovableReason::NoPlaceToMovePods)
        );
        assert!(err.to_string().contains("default/web-1"), "{err}");
    }
}
