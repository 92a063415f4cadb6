//! The disruption controller's PodDisruptionBudget status: expected pods (from the owning
//! controllers' scale), desired and current healthy, and the disruptions allowed.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{World, active, controller_uid, name, namespace, terminating};
use crate::api::{Api, pod_ready, set_condition};
use crate::clock::format_time;
use crate::selector::LabelSelector;

fn int_or_percent(v: &Value, of: i64, round_up: bool) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let p: f64 = s.trim_end_matches('%').parse().ok()?;
            let x = p * of as f64 / 100.0;
            Some(if round_up {
                x.ceil() as i64
            } else {
                x.floor() as i64
            })
        }
        _ => None,
    }
}

/// Recomputes every PodDisruptionBudget's status.
pub fn statuses(api: &Api, w: &World) {
    let Some(ri) = api.resolve("policy", "v1", "poddisruptionbudgets") else {
        return;
    };
    let pdbs = api.snapshot("policy", "poddisruptionbudgets");
    if pdbs.is_empty() {
        return;
    }
    // Scale of the controllers pods belong to.
    let mut scale: HashMap<String, i64> = HashMap::new();
    for (g, p) in [
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
        ("batch", "jobs"),
    ] {
        for o in api.snapshot(g, p) {
            let r = o
                .pointer("/spec/replicas")
                .or_else(|| o.pointer("/spec/parallelism"))
                .and_then(Value::as_i64)
                .unwrap_or(1);
            scale.insert(super::uid(&o).to_string(), r);
        }
    }
    let now = format_time(w.now);
    for pdb in pdbs {
        let Ok(sel) = LabelSelector::from_object(pdb.pointer("/spec/selector")) else {
            continue;
        };
        let ns = namespace(&pdb);
        let pods: Vec<_> = w
            .pods
            .iter()
            .filter(|p| namespace(p) == ns && sel.matches_object(p))
            .collect();
        let mut controllers: HashMap<String, i64> = HashMap::new();
        let mut bare = 0i64;
        for p in &pods {
            if !active(p) && !terminating(p) {
                continue;
            }
            match controller_uid(p) {
                Some(u) => {
                    controllers.insert(u.to_string(), scale.get(u).copied().unwrap_or(1));
                }
                None => bare += 1,
            }
        }
        let expected = controllers.values().sum::<i64>() + bare;
        let healthy = pods.iter().filter(|p| active(p) && pod_ready(p)).count() as i64;
        let desired = if let Some(m) = pdb.pointer("/spec/minAvailable") {
            int_or_percent(m, expected, true).unwrap_or(0)
        } else if let Some(m) = pdb.pointer("/spec/maxUnavailable") {
            (expected - int_or_percent(m, expected, true).unwrap_or(0)).max(0)
        } else {
            0
        };
        // Pods evicted but not yet terminating still hold their disruption.
        let mut disrupted = pdb
            .pointer("/status/disruptedPods")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        disrupted.retain(|podname, _| pods.iter().any(|p| name(p) == podname && !terminating(p)));
        let allowed = (healthy - desired - disrupted.len() as i64).max(0);
        let mut n = (*pdb).clone();
        n["status"]["observedGeneration"] = json!(
            pdb.pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1)
        );
        n["status"]["expectedPods"] = json!(expected);
        n["status"]["currentHealthy"] = json!(healthy);
        n["status"]["desiredHealthy"] = json!(desired);
        n["status"]["disruptionsAllowed"] = json!(allowed);
        n["status"]["disruptedPods"] = Value::Object(disrupted);
        if allowed > 0 {
            set_condition(
                &mut n,
                "DisruptionAllowed",
                "True",
                "SufficientPods",
                "",
                &now,
            );
        } else {
            set_condition(
                &mut n,
                "DisruptionAllowed",
                "False",
                "InsufficientPods",
                "",
                &now,
            );
        }
        if n.get("status") != pdb.get("status") {
            let _ = api.system_status("disruption-controller", &ri, &pdb, n);
        }
    }
}
