//! Label selectors, node selector terms and pod affinity terms converted into the model's
//! [`Selector`], [`NodeSelectorTerm`] and [`PodAffinityTerm`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::SnapshotError;
use crate::cluster::types::{
    NamespaceScope, NodeSelectorTerm, Operator, PodAffinityTerm, Requirement, Selector,
};

fn requirement(key: &str, op: &str, values: Vec<String>) -> Option<Requirement> {
    let operator = match op {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        _ => return None,
    };
    Some(Requirement {
        key: key.to_string(),
        operator,
        values,
    })
}

/// Converts a `LabelSelector`. `None` → `None` (selects nothing in most APIs).
pub fn selector_from(
    sel: &LabelSelector,
    kind: &'static str,
    object: &str,
) -> Result<Selector, SnapshotError> {
    let mut requirements = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        requirements.push(Requirement {
            key: k.clone(),
            operator: Operator::In,
            values: vec![v.clone()],
        });
    }
    for e in sel.match_expressions.iter().flatten() {
        let r = requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
            .filter(|r| !matches!(r.operator, Operator::Gt | Operator::Lt))
            .ok_or_else(|| SnapshotError::Invalid {
                kind,
                object: object.to_string(),
                why: format!(
                    "label selector operator `{}` on key `{}` is not In, NotIn, Exists or DoesNotExist",
                    e.operator, e.key
                ),
            })?;
        requirements.push(r);
    }
    Ok(Selector { requirements })
}

/// Converts a required node selector (of a pod or a PersistentVolume).
pub(super) fn node_terms(
    sel: &NodeSelector,
    kind: &'static str,
    object: &str,
) -> Result<Vec<NodeSelectorTerm>, SnapshotError> {
    let bad = |op: &str, key: &str| SnapshotError::Invalid {
        kind,
        object: object.to_string(),
        why: format!("node selector operator `{op}` on key `{key}` is unknown"),
    };
    let mut terms = Vec::new();
    for t in &sel.node_selector_terms {
        let mut term = NodeSelectorTerm::default();
        for e in t.match_expressions.iter().flatten() {
            term.match_expressions.push(
                requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
                    .ok_or_else(|| bad(&e.operator, &e.key))?,
            );
        }
        for e in t.match_fields.iter().flatten() {
            term.match_fields.push(
                requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
                    .ok_or_else(|| bad(&e.operator, &e.key))?,
            );
        }
        terms.push(term);
    }
    Ok(terms)
}

/// Converts required pod (anti-)affinity terms of a pod in `namespace` with `labels`.
pub(super) fn affinity_terms(
    terms: Option<&Vec<k8s_openapi::api::core::v1::PodAffinityTerm>>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    object: &str,
) -> Result<Vec<PodAffinityTerm>, SnapshotError> {
    let mut out = Vec::new();
    for t in terms.into_iter().flatten() {
        let mut selector = match &t.label_selector {
            Some(s) => selector_from(s, "Pod", object)?,
            // A null selector matches no pods: represent it by an impossible requirement.
            None => Selector {
                requirements: vec![Requirement {
                    key: String::new(),
                    operator: Operator::In,
                    values: vec![],
                }],
            },
        };
        add_match_label_keys(&mut selector, t.match_label_keys.as_deref(), labels);
        let namespaces = if t.namespace_selector.is_some() {
            NamespaceScope::All
        } else {
            match t.namespaces.as_ref().filter(|n| !n.is_empty()) {
                Some(n) => NamespaceScope::Listed(n.clone()),
                None => NamespaceScope::Listed(vec![namespace.to_string()]),
            }
        };
        out.push(PodAffinityTerm {
            selector,
            namespaces,
            topology_key: t.topology_key.clone(),
        });
    }
    Ok(out)
}

/// `matchLabelKeys`: for each key the pod has, the selector also requires the pod's value.
pub(super) fn add_match_label_keys(
    selector: &mut Selector,
    keys: Option<&[String]>,
    labels: &BTreeMap<String, String>,
) {
    for key in keys.into_iter().flatten() {
        if let Some(v) = labels.get(key) {
            selector.requirements.push(Requirement {
                key: key.clone(),
                operator: Operator::In,
                values: vec![v.clone()],
            });
        }
    }
}
