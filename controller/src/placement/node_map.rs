//! The node map: for every node that ever hosted a role, one entry per role with its live,
//! starting and releasing counts, when it was last used, and its failure counters.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use jiff::Timestamp;

use super::roles::RoleId;

/// What the history knows about one role on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeEntry {
    /// Pods bound to the node that are not running yet.
    pub starting: u32,
    /// Running pods.
    pub live: u32,
    /// Pods whose owner is deleting them.
    pub releasing: u32,
    /// Outstanding requests targeting this node (transient).
    pub requested: u32,
    /// When the role last stopped using the node (`None`: never released).
    pub last_used: Option<Timestamp>,
    /// Failures in the current failure window (transient).
    pub failed_recently: u32,
    /// Failures since the controller started (transient).
    pub failed: u32,
    /// Start failures since the controller started (transient).
    pub start_failed: u32,
    /// Preemptions and evictions since the controller started (transient).
    pub preempted: u32,
}

impl NodeEntry {
    /// Pods of the role bound to the node: starting plus live.
    pub fn active(&self) -> u32 {
        self.starting + self.live
    }

    /// Slider's availability: no pod that is not being released, no outstanding request.
    pub fn available(&self) -> bool {
        self.active().saturating_sub(self.releasing) == 0 && self.requested == 0
    }

    /// Nothing refers to this entry any more: it can be forgotten once it is old enough.
    pub fn idle(&self) -> bool {
        self.active() == 0
            && self.releasing == 0
            && self.requested == 0
            && self.failed_recently == 0
    }
}

/// Order of recency: more recently used first, never-used last, then by node name.
pub fn newer_first(a: (&str, Option<Timestamp>), b: (&str, Option<Timestamp>)) -> Ordering {
    match (a.1, b.1) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
    .then_with(|| a.0.cmp(b.0))
}

/// Node name → role id → entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeMap {
    nodes: BTreeMap<String, BTreeMap<RoleId, NodeEntry>>,
}

impl NodeMap {
    pub fn get(&self, node: &str, role: RoleId) -> Option<&NodeEntry> {
        self.nodes.get(node).and_then(|e| e.get(&role))
    }

    pub fn get_mut(&mut self, node: &str, role: RoleId) -> Option<&mut NodeEntry> {
        self.nodes.get_mut(node).and_then(|e| e.get_mut(&role))
    }

    pub fn get_or_create(&mut self, node: &str, role: RoleId) -> &mut NodeEntry {
        self.nodes
            .entry(node.to_string())
            .or_default()
            .entry(role)
            .or_default()
    }

    /// Entries of one node by role id.
    pub fn node(&self, node: &str) -> Option<&BTreeMap<RoleId, NodeEntry>> {
        self.nodes.get(node)
    }

    /// Every node with its entries, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &BTreeMap<RoleId, NodeEntry>)> {
        self.nodes.iter().map(|(n, e)| (n.as_str(), e))
    }

    /// Every entry of a role.
    pub fn role_entries(&self, role: RoleId) -> impl Iterator<Item = (&str, &NodeEntry)> {
        self.nodes
            .iter()
            .filter_map(move |(n, e)| e.get(&role).map(|e| (n.as_str(), e)))
    }

    /// Every entry, mutably.
    pub fn entries_mut(&mut self) -> impl Iterator<Item = (&str, RoleId, &mut NodeEntry)> {
        self.nodes
            .iter_mut()
            .flat_map(|(n, e)| e.iter_mut().map(move |(r, e)| (n.as_str(), *r, e)))
    }

    /// Every node of the map ordered by recency for `role`: nodes without an entry for the role
    /// come last. Failures do not change the order; they only make picks skip a node.
    pub fn nodes_by_recency(&self, role: RoleId) -> Vec<&str> {
        let mut nodes: Vec<(&str, Option<Timestamp>)> = self
            .nodes
            .iter()
            .map(|(n, e)| (n.as_str(), e.get(&role).and_then(|e| e.last_used)))
            .collect();
        nodes.sort_by(|a, b| {
            let a_has = self.get(a.0, role).is_some();
            let b_has = self.get(b.0, role).is_some();
            b_has.cmp(&a_has).then_with(|| newer_first(*a, *b))
        });
        nodes.into_iter().map(|(n, _)| n).collect()
    }

    /// Remove every entry matching `drop`; nodes left without entries are removed too.
    /// Returns the (node, role) pairs removed.
    pub fn remove_where(
        &mut self,
        mut drop: impl FnMut(&str, RoleId, &NodeEntry) -> bool,
    ) -> Vec<(String, RoleId)> {
        let mut removed = Vec::new();
        for (node, entries) in self.nodes.iter_mut() {
            entries.retain(|role, entry| {
                let d = drop(node, *role, entry);
                if d {
                    removed.push((node.clone(), *role));
                }
                !d
            });
        }
        self.nodes.retain(|_, e| !e.is_empty());
        removed
    }

    /// Number of nodes with at least one entry.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
