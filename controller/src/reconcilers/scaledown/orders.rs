//! The actuator's order for one node, built in one place for the policy loop and for drains
//! resumed at start-up: its kind, eviction settings, planned pods and destinations, re-check
//! inputs, and what removing the node acts on.

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::ScaleDownPolicy;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use crate::actuation::{DrainOrder, EvictionSettings, RecheckInputs};
use crate::cluster::machines::ProviderIndex;
use crate::metrics::ScaleDownKind;
use crate::scaledown::PlannerConfig;
use crate::scaledown::removal_method::{NotDrained, drain_target};

/// A drain's kind: unready nodes first, then empty ones, else underutilised.
pub fn drain_kind(ready: bool, empty: bool) -> ScaleDownKind {
    if !ready {
        ScaleDownKind::unready
    } else if empty {
        ScaleDownKind::empty
    } else {
        ScaleDownKind::underutilized
    }
}

/// What the caller knows of the node to drain.
pub struct NodeToDrain<'a> {
    pub name: &'a str,
    /// The Node object (`None`: gone from the cache).
    pub object: Option<&'a Node>,
    pub kind: ScaleDownKind,
    /// Uids of the pods on the node when it was planned (pods not among them landed since).
    pub planned_pods: BTreeSet<String>,
    /// Where the plan put each of its pods (uid → node), for steering their replacements.
    pub destinations: BTreeMap<String, String>,
    /// Set when picking up a drain found tainted at start.
    pub resume_from: Option<jiff::Timestamp>,
}

/// The order for `node` under `policy`; `Err` when what removing it acts on cannot be told
/// (the node waits for the next loop).
pub fn drain_order(
    policy: &ScaleDownPolicy,
    cfg: &PlannerConfig,
    recheck: &RecheckInputs,
    providers: &ProviderIndex,
    node: NodeToDrain<'_>,
    cancel: CancellationToken,
) -> Result<DrainOrder, NotDrained> {
    let spec = &policy.spec;
    let target = drain_target(spec.mode, cfg.removal, node.object, providers)?;
    Ok(DrainOrder {
        policy: policy.name_any(),
        node: node.name.to_string(),
        kind: node.kind,
        mode: spec.mode,
        settings: EvictionSettings::from_spec(spec),
        planned_pods: node.planned_pods,
        destinations: node.destinations,
        resume_from: node.resume_from,
        recheck: recheck.clone(),
        cancel,
        target,
        group_min: spec.min_nodes_per_group,
        removal_timeout: spec.removal_or_default().timeout.as_duration(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drains_of_one_loop_share_its_planner_state() {
        // A wave's planner state holds every destination hint and recent eviction: a copy per
        // drain was hundreds of MiB at 5,000 nodes.
        let spec: ebb_api::ScaleDownPolicySpec =
            serde_json::from_value(serde_json::json!({"mode": "DryRun"})).expect("a DryRun spec");
        let policy = ScaleDownPolicy::new("p", spec);
        let cfg = PlannerConfig::from_spec(&policy.spec).expect("the spec's config");
        let mut state = crate::scaledown::PlannerState::default();
        let pod = crate::testkit::pod("evicted").on("n0").build();
        state.record_eviction(std::sync::Arc::new(pod), jiff::Timestamp::UNIX_EPOCH);
        let shared =
            RecheckInputs::new(std::sync::Arc::new(cfg.clone()), std::sync::Arc::new(state));
        let providers = ProviderIndex::default();
        let order = |name: &'static str| {
            let node = NodeToDrain {
                name,
                object: None,
                kind: ScaleDownKind::underutilized,
                planned_pods: BTreeSet::new(),
                destinations: BTreeMap::new(),
                resume_from: None,
            };
            drain_order(
                &policy,
                &cfg,
                &shared,
                &providers,
                node,
                CancellationToken::new(),
            )
            .expect("a DryRun order needs no removal target")
        };
        let (a, b) = (order("n1"), order("n2"));
        assert!(std::sync::Arc::ptr_eq(&a.recheck.state, &b.recheck.state));
        assert!(std::sync::Arc::ptr_eq(&a.recheck.state, &shared.state));
        assert!(std::sync::Arc::ptr_eq(&a.recheck.cfg, &b.recheck.cfg));
        assert_eq!(a.recheck.state.recent_evictions.len(), 1);
    }

    #[test]
    fn kinds_put_unready_before_empty() {
        assert_eq!(drain_kind(false, true), ScaleDownKind::unready);
        assert_eq!(drain_kind(true, true), ScaleDownKind::empty);
        assert_eq!(drain_kind(true, false), ScaleDownKind::underutilized);
    }
}
