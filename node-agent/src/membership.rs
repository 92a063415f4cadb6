//! Which PlacementHistory role a pod belongs to: a PlacementHistory of the pod's namespace whose
//! label selector matches the pod and that declares the role named by the pod's `roleLabel`.

use std::collections::BTreeMap;

use ebb_api::PlacementHistory;
use ebb_api::placement::RoleSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::transitions::Membership;

/// Label selector semantics of Kubernetes (`matchLabels` AND every `matchExpressions` entry).
/// An empty selector matches everything.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .as_ref()
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let exprs_ok = sel.match_expressions.as_ref().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let values = e.values.as_deref().unwrap_or(&[]);
            let have = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
    });
    labels_ok && exprs_ok
}

/// The role of a pod, with the PlacementHistory and role spec it comes from. The first
/// PlacementHistory by name wins when several match (the controller reports such overlaps).
pub fn find<'a>(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    histories: &'a [PlacementHistory],
) -> Option<(Membership, &'a PlacementHistory, &'a RoleSpec)> {
    let mut candidates: Vec<&PlacementHistory> = histories
        .iter()
        .filter(|ph| ph.metadata.namespace.as_deref() == Some(namespace))
        .filter(|ph| selector_matches(&ph.spec.selector, labels))
        .collect();
    candidates.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    candidates.into_iter().find_map(|ph| {
        let role_name = labels.get(&ph.spec.role_label)?;
        let role = ph.spec.roles.iter().find(|r| &r.name == role_name)?;
        Some((
            Membership {
                placement_history: ph.metadata.name.clone()?,
                role: role.name.clone(),
            },
            ph,
            role,
        ))
    })
}

#[cfg(test)]
pub mod build {
    //! `history("hbase").selects("app", "hbase").role("region")`.
    use ebb_api::PlacementHistorySpec;

    use super::*;

    pub fn history(name: &str) -> PlacementHistory {
        let spec: PlacementHistorySpec = serde_json::from_value(serde_json::json!({
            "selector": {}, "roleLabel": "role", "roles": []
        }))
        .unwrap_or_else(|e| panic!("spec: {e}"));
        let mut ph = PlacementHistory::new(name, spec);
        ph.metadata.namespace = Some("ns".into());
        ph
    }

    pub trait HistoryBuilder {
        fn selects(self, k: &str, v: &str) -> Self;
        fn role(self, name: &str) -> Self;
        fn resource(self, role: &str, name: &str, url: &str, sha256: &str) -> Self;
    }

    impl HistoryBuilder for PlacementHistory {
        fn selects(mut self, k: &str, v: &str) -> Self {
            self.spec
                .selector
                .match_labels
                .get_or_insert_default()
                .insert(k.into(), v.into());
            self
        }
        fn role(mut self, name: &str) -> Self {
            let role: RoleSpec = serde_json::from_value(serde_json::json!({ "name": name }))
                .unwrap_or_else(|e| panic!("role: {e}"));
            self.spec.roles.push(role);
            self
        }
        fn resource(mut self, role: &str, name: &str, url: &str, sha256: &str) -> Self {
            let res = serde_json::from_value(serde_json::json!({
                "name": name, "url": url, "sha256": sha256
            }))
            .unwrap_or_else(|e| panic!("resource: {e}"));
            if let Some(r) = self.spec.roles.iter_mut().find(|r| r.name == role) {
                r.local_resources.push(res);
            }
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_semantics() {
        let mut sel = LabelSelector::default();
        assert!(selector_matches(&sel, &labels(&[])));
        sel.match_labels = Some(labels(&[("app", "db")]).into_iter().collect());
        assert!(selector_matches(
            &sel,
            &labels(&[("app", "db"), ("x", "y")])
        ));
        assert!(!selector_matches(&sel, &labels(&[("app", "web")])));
        let req = |op: &str, vals: &[&str]| LabelSelectorRequirement {
            key: "tier".into(),
            operator: op.into(),
            values: Some(vals.iter().map(|s| s.to_string()).collect()),
        };
        sel.match_expressions = Some(vec![req("In", &["a", "b"])]);
        assert!(selector_matches(
            &sel,
            &labels(&[("app", "db"), ("tier", "b")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("app", "db"), ("tier", "c")])
        ));
        sel.match_expressions = Some(vec![req("NotIn", &["a"])]);
        assert!(selector_matches(&sel, &labels(&[("app", "db")])));
        sel.match_expressions = Some(vec![req("Exists", &[])]);
        assert!(!selector_matches(&sel, &labels(&[("app", "db")])));
        sel.match_expressions = Some(vec![req("DoesNotExist", &[])]);
        assert!(selector_matches(&sel, &labels(&[("app", "db")])));
        sel.match_expressions = Some(vec![req("Bogus", &[])]);
        assert!(!selector_matches(&sel, &labels(&[("app", "db")])));
    }

    #[test]
    fn role_comes_from_the_matching_history() {
        let phs = vec![
            history("kafka").selects("app", "kafka").role("broker"),
            history("hbase").selects("app", "hbase").role("region"),
        ];
        let (m, ph, role) =
            find("ns", &labels(&[("app", "hbase"), ("role", "region")]), &phs).unwrap();
        assert_eq!(m.placement_history, "hbase");
        assert_eq!(m.role, "region");
        assert_eq!(ph.metadata.name.as_deref(), Some("hbase"));
        assert_eq!(role.name, "region");
        // undeclared role, other namespace, no role label: no membership
        assert!(find("ns", &labels(&[("app", "hbase"), ("role", "master")]), &phs).is_none());
        assert!(
            find(
                "other",
                &labels(&[("app", "hbase"), ("role", "region")]),
                &phs
            )
            .is_none()
        );
        assert!(find("ns", &labels(&[("app", "hbase")]), &phs).is_none());
    }
}
