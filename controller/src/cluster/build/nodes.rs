//! Nodes into [`NodeInfo`]: allocatable resources, taints, readiness and labels (the hostname
//! label added when missing), and the warm workload roles the node agents report.

use std::collections::{BTreeSet, HashMap};

use ebb_api::nodestate::NodeState;
use k8s_openapi::api::core::v1::Node;

use super::{HOSTNAME_LABEL, SnapshotError, resources_from};
use crate::cluster::types::{NodeInfo, Taint, TaintEffect};

/// Parses a Node.
pub fn parse_node(node: &Node) -> Result<NodeInfo, SnapshotError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(SnapshotError::Invalid {
            kind: "Node",
            object: "(unnamed)".into(),
            why: "metadata.name is empty".into(),
        });
    }
    let status = node.status.as_ref();
    let (allocatable, pods) = resources_from(
        status
            .and_then(|s| s.allocatable.as_ref())
            .or(status.and_then(|s| s.capacity.as_ref()))
            .into_iter()
            .flatten(),
        "Node",
        &name,
        "status.allocatable",
    )?;
    let spec = node.spec.as_ref();
    let mut taints = Vec::new();
    for t in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        let effect = TaintEffect::parse(&t.effect).ok_or_else(|| SnapshotError::Invalid {
            kind: "Node",
            object: name.clone(),
            why: format!("taint `{}` has unknown effect `{}`", t.key, t.effect),
        })?;
        taints.push(Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect,
        });
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    labels
        .entry(HOSTNAME_LABEL.to_string())
        .or_insert_with(|| name.clone());
    Ok(NodeInfo {
        labels,
        annotations: super::kept_annotations(node.metadata.annotations.as_ref()),
        allocatable,
        max_pods: pods.unwrap_or(110),
        taints,
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
        deleting: node.metadata.deletion_timestamp.is_some(),
        warm_roles: 0,
        machine: None,
        name,
    })
}

/// Per node, how many workload roles (PlacementHistory namespace, name and role) have at least
/// one resource in state `Localized` there, as the node agents report in their NodeStates.
pub fn warm_roles_by_node<'a>(
    states: impl IntoIterator<Item = &'a NodeState>,
) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for st in states {
        let Some(status) = &st.status else { continue };
        let roles: BTreeSet<(&str, &str, &str)> = status
            .localized
            .iter()
            .filter(|l| l.state == "Localized")
            .map(|l| {
                (
                    l.namespace.as_str(),
                    l.placement_history.as_str(),
                    l.role.as_str(),
                )
            })
            .collect();
        if !roles.is_empty() {
            *out.entry(st.spec.node_name.clone()).or_insert(0) +=
                u32::try_from(roles.len()).unwrap_or(u32::MAX);
        }
    }
    out
}
