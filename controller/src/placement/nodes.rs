//! Node facts the placement history needs at pick time: readiness, drain state, labels and
//! which roles have warm data there (from the node agent's NodeState).

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::nodestate::NodeStateStatus;
use ebb_api::placement::PlacementHistorySpec;

/// One node as placement sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// Ready and not cordoned: it can take a pod now.
    pub schedulable_ready: bool,
    /// A ScaleDownPolicy has it in its candidate set or is deleting it: never pin to it.
    pub draining_or_candidate: bool,
    pub labels: BTreeMap<String, String>,
    /// Roles (of this PlacementHistory) whose local resources are all cached on the node.
    pub warm_roles: BTreeSet<String>,
}

impl NodeView {
    /// A ready, schedulable node with no labels and no warm data.
    pub fn ready(name: &str) -> Self {
        Self {
            name: name.to_string(),
            schedulable_ready: true,
            ..Self::default()
        }
    }
}

/// The nodes of the cluster by name. Nodes absent here no longer exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    nodes: BTreeMap<String, NodeView>,
}

impl NodeFacts {
    pub fn new(nodes: impl IntoIterator<Item = NodeView>) -> Self {
        Self {
            nodes: nodes.into_iter().map(|n| (n.name.clone(), n)).collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&NodeView> {
        self.nodes.get(name)
    }

    /// Insert or replace a node.
    pub fn upsert(&mut self, node: NodeView) {
        self.nodes.insert(node.name.clone(), node);
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut NodeView> {
        self.nodes.get_mut(name)
    }

    pub fn remove(&mut self, name: &str) -> Option<NodeView> {
        self.nodes.remove(name)
    }
}

/// Roles of the PlacementHistory `namespace/name` whose declared local resources are all
/// reported `Localized` in a node's NodeState. Roles without local resources are never warm.
pub fn warm_roles(
    status: &NodeStateStatus,
    namespace: &str,
    name: &str,
    spec: &PlacementHistorySpec,
) -> BTreeSet<String> {
    spec.roles
        .iter()
        .filter(|role| {
            !role.local_resources.is_empty()
                && role.local_resources.iter().all(|res| {
                    status.localized.iter().any(|l| {
                        l.namespace == namespace
                            && l.placement_history == name
                            && l.role == role.name
                            && l.name == res.name
                            && l.state == "Localized"
                    })
                })
        })
        .map(|role| role.name.clone())
        .collect()
}
