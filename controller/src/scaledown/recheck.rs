//! The re-check before a drain starts, on the shared cluster model: fork it, take ebb's
//! to-be-deleted taint off the node, plan for that node alone, revert. Nothing is rebuilt.

use ebb_api::names::TAINT_TO_BE_DELETED;
use jiff::Timestamp;

use super::config::PlannerConfig;
use super::planner::{PlannerState, Stopwatch, plan};
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

/// What a plan restricted to `node` reads of `state`: the deletions in flight (synced with the
/// to-be-deleted taints, without `node`), the recent evictions, the node's own candidacy, and the
/// destination hints of the pods of `node`, of the nodes being deleted and of the nodes the
/// recent evictions left (the only sources the simulation looks hints up for). The other hints and the non-candidates are not copied.
fn narrowed(
    state: &PlannerState,
    snap: &ClusterSnapshot,
    node: &str,
    now: Timestamp,
) -> PlannerState {
    let mut out = PlannerState {
        deleted: state.deleted.clone(),
        candidates: state
            .candidates
            .get_key_value(node)
            .map(|(k, v)| (k.clone(), *v))
            .into_iter()
            .collect(),
        recent_evictions: state.recent_evictions.clone(),
        ..PlannerState::default()
    };
    out.sync_deleting_from_taints(snap, now);
    out.finish_deleting(node);
    let evicted_from = state
        .recent_evictions
        .iter()
        .filter_map(|e| e.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()));
    let sources = out
        .deleted
        .keys()
        .map(String::as_str)
        .chain([node])
        .chain(evicted_from);
    out.hints = state.hints.only_from(sources);
    out
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
    let mut state = narrowed(state, snap, node, now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actuation::taints::EbbTaint;
    use crate::scaledown::StepStopwatch;
    use crate::testkit::{config_selecting, node, pod, snapshot};

    /// A drained node named unlike its hostname label (as Karpenter's are) and a pod that can
    /// or cannot go elsewhere.
    fn check(spare_cpu: &str) -> Result<(), String> {
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
        assert!(err.contains("NoPlaceToMovePods"), "{err}");
    }
}
