//! A role's available-node list: nodes that may take a new pod of the role, most recently used
//! first (never-used last, then by name). Unlike Slider's list it can never hold a node twice.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use jiff::Timestamp;

type Key = (Reverse<Option<Timestamp>>, String);

/// Nodes ordered most recently used first, without duplicates. A node just released gets
/// `lastUsed = now`, which puts it at the head.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AvailableList {
    order: BTreeSet<Key>,
    keys: HashMap<String, Option<Timestamp>>,
}

impl AvailableList {
    /// Build from (node, last used) pairs; a repeated node keeps its last pair.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, Option<Timestamp>)>,
    ) -> Self {
        let mut list = Self::default();
        for (node, last_used) in entries {
            list.insert(node, last_used);
        }
        list
    }

    /// Put `node` at its place for `last_used` (replacing any previous place).
    pub fn insert(&mut self, node: &str, last_used: Option<Timestamp>) {
        self.remove(node);
        self.order.insert((Reverse(last_used), node.to_string()));
        self.keys.insert(node.to_string(), last_used);
    }

    /// Remove `node`; true when it was there.
    pub fn remove(&mut self, node: &str) -> bool {
        match self.keys.remove(node) {
            Some(last_used) => self.order.remove(&(Reverse(last_used), node.to_string())),
            None => false,
        }
    }

    pub fn contains(&self, node: &str) -> bool {
        self.keys.contains_key(node)
    }

    /// Most recently used first.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|(_, n)| n.as_str())
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Option<Timestamp> {
        Timestamp::from_second(s).ok()
    }

    #[test]
    fn ordered_by_recency_never_used_last_and_no_duplicates() {
        let mut list = AvailableList::from_entries([("c", at(10)), ("z", None), ("a", at(30))]);
        list.insert("b", at(20));
        list.insert("b", at(20));
        assert_eq!(list.iter().collect::<Vec<_>>(), ["a", "b", "c", "z"]);
        list.insert("c", at(40));
        assert_eq!(list.iter().collect::<Vec<_>>(), ["c", "a", "b", "z"]);
        assert!(list.remove("a") && !list.remove("a"));
        assert_eq!(list.len(), 3);
    }
}
