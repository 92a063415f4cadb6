//! What steering adds to a pod (a preferred node affinity term for its planned node and an
//! annotation naming it) and which nodes cannot take it. Pure functions of API objects.

use crate::cluster::CachedPod;
use ebb_api::names;
use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use serde_json::{Value, json};

/// Weight of the preferred term: the most a term can have. It is a preference: a node that
/// cannot take the pod (no room, tainted, gone) is passed over by the scheduler at once.
pub const PREFERENCE_WEIGHT: i32 = 100;

/// Escapes a key for a JSON pointer (RFC 6901).
fn pointer_key(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The patch that makes `pod` prefer `node` and says so in annotations (the node, and the
/// `ticket` of the destination). It only adds: the pod's own affinity and annotations are kept.
pub fn prefer_node(pod: &CachedPod, node: &str, ticket: &str) -> json_patch::Patch {
    let term = json!({
        "weight": PREFERENCE_WEIGHT,
        "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]},
    });
    let mut ops: Vec<Value> = Vec::new();
    match pod.metadata.annotations.as_ref() {
        None => ops.push(json!({"op": "add", "path": "/metadata/annotations",
            "value": {names::ANNOTATION_PLANNED_NODE: node,
                      names::ANNOTATION_STEERING_TICKET: ticket}})),
        Some(_) => {
            // `add` replaces a value the pod's creator may have set: ebb's own values win.
            for (key, value) in [
                (names::ANNOTATION_PLANNED_NODE, node),
                (names::ANNOTATION_STEERING_TICKET, ticket),
            ] {
                ops.push(json!({"op": "add",
                    "path": format!("/metadata/annotations/{}", pointer_key(key)),
                    "value": value}));
            }
        }
    }
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let preferred = node_affinity.and_then(|n| {
        n.preferred_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let op = match (affinity, node_affinity, preferred) {
        (None, _, _) => json!({"op": "add", "path": "/spec/affinity",
            "value": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}}),
        (Some(_), None, _) => json!({"op": "add", "path": "/spec/affinity/nodeAffinity",
            "value": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}),
        (Some(_), Some(_), None) => json!({"op": "add",
            "path": "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution",
            "value": [term]}),
        (Some(_), Some(_), Some(_)) => json!({"op": "add",
            "path": "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-",
            "value": term}),
    };
    ops.push(op);
    // Built from literals above: always a valid patch document.
    serde_json::from_value(Value::Array(ops)).unwrap_or_default()
}

/// Whether `pod` waits for any scheduling gate (it is not on its way to any node).
pub fn gated(pod: &CachedPod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// Whether `pod` waits for a PlacementHistory (its scheduling gate `ebb.dev/placement`).
pub fn gated_by_placement(pod: &CachedPod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == names::SCHEDULING_GATE_PLACEMENT))
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = match t.key.as_deref() {
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(k) => k == taint.key,
    };
    let value = match t.operator.as_deref() {
        Some("Exists") => true,
        _ => t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
    };
    effect && key && value
}

/// Whether `node` takes no new pods: cordoned, being deleted, tainted `to-be-deleted` by ebb, or
/// with a `NoSchedule`/`NoExecute` taint `pod` does not tolerate (any such taint without a pod).
pub fn node_refuses(node: &Node, pod: Option<&CachedPod>) -> bool {
    if node.metadata.deletion_timestamp.is_some() {
        return true;
    }
    let Some(spec) = node.spec.as_ref() else {
        return false;
    };
    if spec.unschedulable == Some(true) {
        return true;
    }
    let tolerations: &[Toleration] = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    spec.taints.iter().flatten().any(|taint| {
        taint.key == names::TAINT_TO_BE_DELETED
            || (matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
                && !tolerations.iter().any(|t| tolerates(t, taint)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{node, pod, taint};

    fn applied(p: &CachedPod, patch: &json_patch::Patch) -> CachedPod {
        let mut doc = serde_json::to_value(p).unwrap_or_default();
        json_patch::patch(&mut doc, patch).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_value(doc).unwrap_or_else(|e| panic!("{e}"))
    }

    fn preferred(p: &CachedPod) -> Vec<(i32, String)> {
        p.spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.preferred_during_scheduling_ignored_during_execution
                    .clone()
            })
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                let f = t.preference.match_fields.unwrap_or_default();
                let v = f.first().and_then(|r| r.values.clone()).unwrap_or_default();
                (t.weight, v.join(","))
            })
            .collect()
    }

    #[test]
    fn the_patch_adds_a_preference_and_the_annotation_and_keeps_what_is_there() {
        let bare = pod("web-1").build();
        let p = applied(&bare, &prefer_node(&bare, "keep-0", "t0"));
        assert_eq!(preferred(&p), vec![(100, "keep-0".to_string())]);
        let ann = p.metadata.annotations.unwrap_or_default();
        assert_eq!(ann[names::ANNOTATION_PLANNED_NODE], "keep-0");
        assert_eq!(ann[names::ANNOTATION_STEERING_TICKET], "t0");
        // A pod with its own preference and annotations keeps them.
        // A creator's own (forged) ticket and planned node are overwritten by ebb's.
        let mut own = pod("web-2")
            .annotation("team", "a")
            .annotation(names::ANNOTATION_STEERING_TICKET, "forged")
            .annotation(names::ANNOTATION_PLANNED_NODE, "elsewhere")
            .build();
        let mine = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "preference": {"matchExpressions": [
                {"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}});
        if let Some(s) = own.spec.as_mut() {
            s.affinity = serde_json::from_value(mine).ok();
        }
        let p = applied(&own, &prefer_node(&own, "keep-1", "t1"));
        let terms = preferred(&p);
        assert_eq!(terms.len(), 2, "{terms:?}");
        assert_eq!(terms[1], (100, "keep-1".to_string()));
        let ann = p.metadata.annotations.unwrap_or_default();
        assert_eq!(ann["team"], "a");
        assert_eq!(ann[names::ANNOTATION_PLANNED_NODE], "keep-1");
        assert_eq!(ann[names::ANNOTATION_STEERING_TICKET], "t1");
        // Affinity without node affinity (pod anti-affinity only).
        let mut anti = pod("web-3").build();
        if let Some(s) = anti.spec.as_mut() {
            s.affinity = serde_json::from_value(json!({"podAntiAffinity": {}})).ok();
        }
        let p = applied(&anti, &prefer_node(&anti, "keep-2", "t2"));
        assert_eq!(preferred(&p), vec![(100, "keep-2".to_string())]);
        assert!(
            p.spec
                .and_then(|s| s.affinity)
                .and_then(|a| a.pod_anti_affinity)
                .is_some()
        );
    }

    #[test]
    fn nodes_that_take_no_new_pods() {
        let web = pod("web").build();
        assert!(!node_refuses(&node("n").build(), Some(&web)));
        assert!(node_refuses(&node("n").unschedulable().build(), Some(&web)));
        let tbd = node("n")
            .taint(taint(names::TAINT_TO_BE_DELETED, "1", "NoSchedule"))
            .build();
        assert!(node_refuses(&tbd, Some(&web)));
        let soft = node("n")
            .taint(taint("retiring", "true", "PreferNoSchedule"))
            .build();
        assert!(
            !node_refuses(&soft, Some(&web)),
            "a preference is not a refusal"
        );
        let gpu = node("n").taint(taint("gpu", "true", "NoSchedule")).build();
        assert!(node_refuses(&gpu, Some(&web)));
        assert!(node_refuses(&gpu, None));
        let mut tolerant = pod("ml").build();
        if let Some(s) = tolerant.spec.as_mut() {
            s.tolerations = serde_json::from_value(json!([
                {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]))
            .ok();
        }
        assert!(!node_refuses(&gpu, Some(&tolerant)));
    }

    #[test]
    fn pods_a_placement_history_places_are_recognised() {
        let mut p = pod("db-0").build();
        assert!(!gated_by_placement(&p));
        if let Some(s) = p.spec.as_mut() {
            s.scheduling_gates =
                serde_json::from_value(json!([{"name": "ebb.dev/placement"}])).ok();
        }
        assert!(gated_by_placement(&p));
        assert!(gated(&p));
        let mut other = pod("x").build();
        assert!(!gated(&other));
        if let Some(s) = other.spec.as_mut() {
            s.scheduling_gates = serde_json::from_value(json!([{"name": "tenant/hold"}])).ok();
        }
        assert!(gated(&other) && !gated_by_placement(&other));
    }
}
