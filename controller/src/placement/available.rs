//! A role's available-node list: nodes that may take a new pod of the role, most recently used
//! first. Unlike Slider's list it can never hold a node twice.

use std::cmp::Ordering;

use jiff::Timestamp;

use super::node_map::newer_first;

/// Nodes ordered most recently used first, without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AvailableList {
    nodes: Vec<String>,
}

impl AvailableList {
    /// Build from (node, last used) pairs; duplicates keep their first occurrence.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, Option<Timestamp>)>,
    ) -> Self {
        let mut all: Vec<(&str, Option<Timestamp>)> = entries.into_iter().collect();
        all.sort_by(|a, b| newer_first(*a, *b));
        let mut list = Self::default();
        for (node, _) in all {
            if !list.contains(node) {
                list.nodes.push(node.to_string());
            }
        }
        list
    }

    /// Put `node` at the head (it was just released).
    pub fn push_front(&mut self, node: &str) {
        self.remove(node);
        self.nodes.insert(0, node.to_string());
    }

    /// Put `node` at its place in recency order; `last_used` gives every node's key.
    pub fn insert_sorted(&mut self, node: &str, last_used: impl Fn(&str) -> Option<Timestamp>) {
        self.remove(node);
        let key = (node, last_used(node));
        let at = self
            .nodes
            .iter()
            .position(|n| newer_first(key, (n.as_str(), last_used(n))) == Ordering::Less)
            .unwrap_or(self.nodes.len());
        self.nodes.insert(at, node.to_string());
    }

    /// Remove `node`; true when it was there.
    pub fn remove(&mut self, node: &str) -> bool {
        match self.nodes.iter().position(|n| n == node) {
            Some(i) => {
                self.nodes.remove(i);
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n == node)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Option<Timestamp> {
        Timestamp::from_second(s).ok()
    }

    #[test]
    fn insert_sorted_keeps_recency_and_no_duplicates() {
        let key = |n: &str| match n {
            "a" => at(30),
            "b" => at(20),
            "c" => at(10),
            _ => None,
        };
        let mut list = AvailableList::from_entries([("c", key("c")), ("a", key("a"))]);
        list.insert_sorted("b", key);
        list.insert_sorted("b", key);
        list.insert_sorted("z", key);
        assert_eq!(list.iter().collect::<Vec<_>>(), ["a", "b", "c", "z"]);
        list.push_front("c");
        assert_eq!(list.iter().collect::<Vec<_>>(), ["c", "a", "b", "z"]);
    }
}
