//! Node facts for placement from the Node cache: Ready and schedulable, drained or candidate
//! of a ScaleDownPolicy (ebb's taints), labels; and which pods a PlacementHistory selects.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cluster::CachedPod;
use ebb_api::names;
use ebb_api::placement::PlacementHistory;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::cluster::build::selector_from;
use crate::placement::{NodeFacts, NodeView};

/// The node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A ScaleDownPolicy has the node in its candidate set, is deleting it, or has drained it
/// (`Drain` mode: cordoned and labelled `ebb.dev/drained`; a pod must not wait for it).
pub fn is_draining(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        || node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(names::LABEL_DRAINED))
        || node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| {
                t.key == names::TAINT_TO_BE_DELETED || t.key == names::TAINT_DELETION_CANDIDATE
            })
}

pub fn view(node: &Node) -> NodeView {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    NodeView {
        name: node.name_any(),
        schedulable_ready: is_ready(node) && !cordoned,
        draining_or_candidate: is_draining(node),
        labels: node.labels().clone(),
        warm_roles: Default::default(),
    }
}

pub fn node_facts(nodes: &[Arc<Node>]) -> NodeFacts {
    NodeFacts::new(nodes.iter().map(|n| view(n)))
}

/// The pods of `ph` (its namespace, its selector, carrying the role label), with their role.
/// An unreadable selector selects nothing (the caller reports it).
pub fn selected<'a>(
    ph: &PlacementHistory,
    pods: &'a [Arc<CachedPod>],
) -> Result<Vec<(&'a Arc<CachedPod>, String)>, crate::cluster::SnapshotError> {
    let ns = ph.namespace().unwrap_or_default();
    let selector = selector_from(&ph.spec.selector, "PlacementHistory", &ph.name_any())?;
    Ok(pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| selector.matches(p.labels()))
        .filter_map(|p| {
            let role = p.labels().get(&ph.spec.role_label)?.clone();
            Some((p, role))
        })
        .collect())
}

/// Node names by readiness, for classifying terminations (`true`: gone or NotReady).
pub fn lost_nodes(nodes: &[Arc<Node>]) -> BTreeMap<String, bool> {
    nodes.iter().map(|n| (n.name_any(), !is_ready(n))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ebb_taints_mark_a_node_draining_and_readiness_comes_from_the_condition() {
        let ready = json!({"metadata": {"name": "a"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let n = node(ready.clone());
        assert!(is_ready(&n) && !is_draining(&n) && view(&n).schedulable_ready);
        let mut tainted = ready.clone();
        tainted["spec"] = json!({"taints": [{"key": "ebb.dev/deletion-candidate", "effect": "PreferNoSchedule"}]});
        assert!(is_draining(&node(tainted)));
        let mut cordoned = ready;
        cordoned["spec"] = json!({"unschedulable": true});
        assert!(!view(&node(cordoned.clone())).schedulable_ready);
        assert!(
            !is_draining(&node(cordoned.clone())),
            "cordoned by someone else: wait"
        );
        cordoned["metadata"]["labels"] = json!({"ebb.dev/drained": "true"});
        assert!(
            is_draining(&node(cordoned)),
            "drained by ebb: do not wait for it"
        );
        assert!(!is_ready(&node(json!({"metadata": {"name": "b"}}))));
    }
}
