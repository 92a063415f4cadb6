//! Pod patches of placement (pure): pin to a node, release relaxed or unchanged. Each removes
//! the `ebb.dev/placement` gate and may only tighten the scheduling directives of a gated pod.

use crate::cluster::CachedPod;
use ebb_api::names;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PreferredSchedulingTerm,
};
use serde_json::{Value, json};

use crate::placement::RelaxedConstraints;

/// The field node affinity matches a node's name with.
const NODE_NAME_FIELD: &str = "metadata.name";

/// True when the pod carries the placement gate.
pub fn is_gated(pod: &CachedPod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == names::SCHEDULING_GATE_PLACEMENT))
}

/// The pod's gates without ours (a JSON list, for a merge patch that replaces the list).
fn remaining_gates(pod: &CachedPod) -> Value {
    let gates: Vec<Value> = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .into_iter()
        .flatten()
        .filter(|g| g.name != names::SCHEDULING_GATE_PLACEMENT)
        .map(|g| json!({"name": g.name}))
        .collect();
    Value::Array(gates)
}

fn req(key: &str, op: &str, values: Vec<String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: op.to_string(),
        values: Some(values),
    }
}

/// The pod's affinity with `exprs`/`fields` ANDed into every required term (one new term when
/// it has none) and `preferred` terms appended: the result is never looser than before.
fn tightened(
    pod: &CachedPod,
    exprs: Vec<NodeSelectorRequirement>,
    fields: Vec<NodeSelectorRequirement>,
    preferred: Vec<PreferredSchedulingTerm>,
) -> Affinity {
    let mut affinity = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_deref().cloned())
        .unwrap_or_default();
    let node = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    if !exprs.is_empty() || !fields.is_empty() {
        let required = node
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(NodeSelector::default);
        if required.node_selector_terms.is_empty() {
            required
                .node_selector_terms
                .push(NodeSelectorTerm::default());
        }
        for term in &mut required.node_selector_terms {
            if !exprs.is_empty() {
                term.match_expressions
                    .get_or_insert_with(Vec::new)
                    .extend(exprs.iter().cloned());
            }
            if !fields.is_empty() {
                term.match_fields
                    .get_or_insert_with(Vec::new)
                    .extend(fields.iter().cloned());
            }
        }
    }
    if !preferred.is_empty() {
        node.preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .extend(preferred);
    }
    affinity
}

/// The release patch: `annotations` set, our gate gone, `affinity` when given. It carries the
/// cached pod's resourceVersion, a precondition: a cache behind the API server (the pod already
/// released, or changed since) gets a Conflict instead of a second release built on old state.
fn release(pod: &CachedPod, affinity: Option<Affinity>, annotations: Value) -> Value {
    let mut spec = json!({"schedulingGates": remaining_gates(pod)});
    if let Some(a) = affinity {
        spec["affinity"] = json!(a);
    }
    let mut metadata = json!({"annotations": annotations});
    if let Some(rv) = pod.metadata.resource_version.as_deref() {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({"metadata": metadata, "spec": spec})
}

/// Merge patch pinning the pod to `node` (required affinity on the node's name), carrying its
/// token, and removing the gate.
pub fn pin(pod: &CachedPod, node: &str, token: &str) -> Value {
    let affinity = tightened(
        pod,
        Vec::new(),
        vec![req(NODE_NAME_FIELD, "In", vec![node.to_string()])],
        Vec::new(),
    );
    release(
        pod,
        Some(affinity),
        json!({
            names::ANNOTATION_TOKEN: token,
            names::ANNOTATION_PLACED_ON: node,
            names::ANNOTATION_PLACEMENT: "Pinned",
        }),
    )
}

/// Merge patch releasing the pod with relaxed constraints: the role's node labels, `NotIn` the
/// nodes to avoid, preferred affinity toward history nodes. `how` is `Relaxed` or `Anywhere`.
pub fn relax(pod: &CachedPod, c: &RelaxedConstraints, how: &str, token: &str) -> Value {
    let exprs: Vec<NodeSelectorRequirement> = c
        .node_selector
        .iter()
        .map(|(k, v)| req(k, "In", vec![v.clone()]))
        .collect();
    let fields = if c.avoid_nodes.is_empty() {
        Vec::new()
    } else {
        vec![req(NODE_NAME_FIELD, "NotIn", c.avoid_nodes.clone())]
    };
    let preferred: Vec<PreferredSchedulingTerm> = c
        .prefer_nodes
        .iter()
        .map(|(node, weight)| PreferredSchedulingTerm {
            weight: *weight,
            preference: NodeSelectorTerm {
                match_fields: Some(vec![req(NODE_NAME_FIELD, "In", vec![node.clone()])]),
                ..NodeSelectorTerm::default()
            },
        })
        .collect();
    let touched = !(exprs.is_empty() && fields.is_empty() && preferred.is_empty());
    let affinity = touched.then(|| tightened(pod, exprs, fields, preferred));
    release(
        pod,
        affinity,
        json!({names::ANNOTATION_TOKEN: token, names::ANNOTATION_PLACEMENT: how}),
    )
}

/// Merge patch releasing a pod no valid PlacementHistory governs: only the gate goes.
pub fn unchanged(pod: &CachedPod) -> Value {
    release(
        pod,
        None,
        json!({names::ANNOTATION_PLACEMENT: "Ungoverned"}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gated(extra: Value) -> CachedPod {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}],
                     "schedulingGates": [{"name": "ebb.dev/placement"}, {"name": "other"}]}
        });
        if let Some(o) = extra.as_object() {
            for (k, x) in o {
                v["spec"][k] = x.clone();
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pin_keeps_other_gates_and_requires_the_node_name() {
        let p = pin(&gated(json!({})), "n1", "tok");
        assert_eq!(p["spec"]["schedulingGates"], json!([{"name": "other"}]));
        assert_eq!(
            p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]})
        );
        assert_eq!(p["metadata"]["annotations"]["ebb.dev/token"], "tok");
        assert_eq!(p["metadata"]["annotations"]["ebb.dev/placed-on"], "n1");
    }

    #[test]
    fn pin_ands_into_every_existing_term() {
        let pod = gated(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}}),
        );
        let p = pin(&pod, "n1", "tok");
        let terms = &p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms.as_array().unwrap().len(), 2);
        for (t, zone) in terms.as_array().unwrap().iter().zip(["a", "b"]) {
            assert_eq!(t["matchExpressions"][0]["values"], json!([zone]));
            assert_eq!(t["matchFields"][0]["values"], json!(["n1"]));
        }
    }

    #[test]
    fn relax_selects_avoids_and_prefers() {
        let c = RelaxedConstraints {
            node_selector: [("pool".to_string(), "ssd".to_string())].into(),
            avoid_nodes: vec!["bad".into()],
            prefer_nodes: vec![("n1".into(), 100), ("n2".into(), 90)],
        };
        let p = relax(&gated(json!({})), &c, "Relaxed", "tok");
        let na = &p["spec"]["affinity"]["nodeAffinity"];
        assert_eq!(
            na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json!([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ssd"]}],
                    "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]}])
        );
        assert_eq!(
            na["preferredDuringSchedulingIgnoredDuringExecution"][1]["weight"],
            90
        );
        assert_eq!(p["metadata"]["annotations"]["ebb.dev/placement"], "Relaxed");
    }

    #[test]
    fn every_release_is_conditional_on_the_cached_resource_version() {
        let mut pod = gated(json!({}));
        pod.metadata.resource_version = Some("41".into());
        let c = RelaxedConstraints::default();
        for p in [
            pin(&pod, "n1", "tok"),
            relax(&pod, &c, "Relaxed", "tok"),
            unchanged(&pod),
        ] {
            assert_eq!(p["metadata"]["resourceVersion"], "41", "{p}");
        }
        // A pod without one (never from the API server) gets an unconditional patch.
        let p = pin(&gated(json!({})), "n1", "tok");
        assert!(p["metadata"].get("resourceVersion").is_none(), "{p}");
    }

    #[test]
    fn unchanged_only_removes_the_gate() {
        let p = unchanged(&gated(json!({})));
        assert!(p["spec"].get("affinity").is_none());
        assert_eq!(p["spec"]["schedulingGates"], json!([{"name": "other"}]));
        assert!(is_gated(&gated(json!({}))));
    }
}
