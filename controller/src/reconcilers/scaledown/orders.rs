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
use crate::scaledown::removal_method::{NotDrained, drain_target};
use crate::scaledown::{PlannerConfig, PlannerState};

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
    state: &PlannerState,
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
        recheck: RecheckInputs::new(cfg.clone(), state.clone()),
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
    fn kinds_put_unready_before_empty() {
        assert_eq!(drain_kind(false, true), ScaleDownKind::unready);
        assert_eq!(drain_kind(true, true), ScaleDownKind::empty);
        assert_eq!(drain_kind(true, false), ScaleDownKind::underutilized);
    }
}
