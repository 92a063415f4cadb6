//! The roles of a PlacementHistory and their stable numeric ids. The name to id map is persisted
//! with the history so entries survive roles being reordered, added or removed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ebb_api::placement::{PlacementHistorySpec, PlacementPolicy, RoleSpec};
use jiff::SignedDuration;

use super::error::HistoryError;

/// A role's id: the key of its entries in the node map and in the persisted status.
pub type RoleId = u32;

/// A role's settings, taken from its [`RoleSpec`].
#[derive(Clone, Debug, PartialEq)]
pub struct RoleConfig {
    pub id: RoleId,
    pub name: String,
    pub policy: PlacementPolicy,
    /// How long a request may wait for its history node before it is relaxed.
    pub escalation_timeout: SignedDuration,
    /// Failures in the window a node may have before it is avoided; negative: never avoided.
    pub node_failure_threshold: i32,
    /// Labels every placement of the role must match.
    pub node_selector: BTreeMap<String, String>,
    /// Names of the role's `localResources`.
    pub local_resources: Vec<String>,
}

impl RoleConfig {
    fn from_spec(id: RoleId, spec: &RoleSpec) -> Self {
        Self {
            id,
            name: spec.name.clone(),
            policy: spec.policy,
            escalation_timeout: spec.escalation_timeout.as_span(),
            node_failure_threshold: spec.node_failure_threshold,
            node_selector: spec.node_selector.clone(),
            local_resources: spec
                .local_resources
                .iter()
                .map(|r| r.name.clone())
                .collect(),
        }
    }

    /// True when `failed_recently` failures are over the role's threshold (never when the
    /// threshold is negative: unlimited).
    pub fn over_threshold(&self, failed_recently: u32) -> bool {
        self.node_failure_threshold >= 0
            && i64::from(failed_recently) > i64::from(self.node_failure_threshold)
    }

    /// True when failures exclude nodes from pinned placement: `Strict` ignores failures.
    pub fn avoids_failing_nodes(&self) -> bool {
        self.policy != PlacementPolicy::Strict
    }

    /// True when a node with these labels satisfies the role's node selector.
    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The roles of one PlacementHistory, keyed by id, with a name index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoleTable {
    roles: BTreeMap<RoleId, RoleConfig>,
    by_name: HashMap<String, RoleId>,
}

impl RoleTable {
    /// Build the table for `spec`, keeping the ids of `persisted` (name → id) for roles that
    /// still exist and giving new roles ids never used before. Duplicate names are rejected.
    pub fn from_spec(
        spec: &PlacementHistorySpec,
        persisted: &BTreeMap<String, RoleId>,
    ) -> Result<Self, HistoryError> {
        let mut seen = BTreeSet::new();
        for role in &spec.roles {
            if !seen.insert(role.name.as_str()) {
                return Err(HistoryError::DuplicateRole {
                    name: role.name.clone(),
                });
            }
        }
        let mut next_id = persisted.values().map(|id| id + 1).max().unwrap_or(0);
        let mut table = RoleTable::default();
        for role in &spec.roles {
            let id = match persisted.get(&role.name) {
                Some(id) if !table.roles.contains_key(id) => *id,
                _ => {
                    let id = next_id;
                    next_id += 1;
                    id
                }
            };
            table.by_name.insert(role.name.clone(), id);
            table.roles.insert(id, RoleConfig::from_spec(id, role));
        }
        Ok(table)
    }

    /// The role with this id.
    pub fn get(&self, id: RoleId) -> Option<&RoleConfig> {
        self.roles.get(&id)
    }

    /// The role with this name.
    pub fn by_name(&self, name: &str) -> Option<&RoleConfig> {
        self.by_name.get(name).and_then(|id| self.roles.get(id))
    }

    /// Roles in id order.
    pub fn iter(&self) -> impl Iterator<Item = &RoleConfig> {
        self.roles.values()
    }

    /// The name → id map that is persisted.
    pub fn id_map(&self) -> BTreeMap<String, RoleId> {
        self.roles
            .values()
            .map(|r| (r.name.clone(), r.id))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.roles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(names: &[&str]) -> PlacementHistorySpec {
        let roles = names
            .iter()
            .map(|n| {
                serde_json::from_value(serde_json::json!({ "name": n })).expect("role spec literal")
            })
            .collect();
        serde_json::from_value::<PlacementHistorySpec>(serde_json::json!({
            "selector": {}, "roleLabel": "role", "roles": []
        }))
        .map(|mut s| {
            s.roles = roles;
            s
        })
        .expect("spec literal")
    }

    #[test]
    fn persisted_ids_are_kept_and_new_roles_get_fresh_ids() {
        let persisted = BTreeMap::from([("db".to_string(), 4), ("gone".to_string(), 7)]);
        let table = RoleTable::from_spec(&spec(&["web", "db"]), &persisted).unwrap();
        assert_eq!(table.by_name("db").map(|r| r.id), Some(4));
        // 7 was used by a removed role: never reused.
        assert_eq!(table.by_name("web").map(|r| r.id), Some(8));
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let err = RoleTable::from_spec(&spec(&["a", "b", "a"]), &BTreeMap::new()).unwrap_err();
        assert_eq!(err, HistoryError::DuplicateRole { name: "a".into() });
    }
}
