//! Table output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`): the columns
//! `kubectl get` prints for built-in kinds and for CRDs from `additionalPrinterColumns`.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::clock::parse_time;
use crate::registry::{Column, ResourceInfo};

/// Kubernetes' short age format (`5s`, `3m2s`, `4h`, `2d`).
pub fn human_age(from: &str, now: Timestamp) -> String {
    let Some(t) = parse_time(from) else {
        return "<unknown>".into();
    };
    let s = now.duration_since(t).as_secs().max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 600 {
        format!("{}m{}s", s / 60, s % 60)
    } else if s < 3 * 3600 {
        format!("{}m", s / 60)
    } else if s < 8 * 3600 {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    } else if s < 2 * 86400 {
        format!("{}h", s / 3600)
    } else {
        format!("{}d", s / 86400)
    }
}

/// Evaluates the JSONPath subset printer columns use: `.a.b`, `.a[0]`, `.a[?(@.k=="v")].b`.
fn path_value<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let p = path.trim_start_matches('.');
    if p.is_empty() {
        return Some(obj);
    }
    let mut cur = obj;
    let mut rest = p;
    while !rest.is_empty() {
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let name = &rest[..end];
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        rest = &rest[end..];
        if let Some(r) = rest.strip_prefix('[') {
            let close = r.find(']')?;
            let inner = &r[..close];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, v) = filter.split_once("==")?;
                let v = v.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|e| e.get(k.trim()).and_then(Value::as_str) == Some(v))?;
            } else {
                cur = cur.get(inner.parse::<usize>().ok()?)?;
            }
            rest = &r[close + 1..];
        }
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(cur)
}

fn pod_cells(pod: &Value) -> (String, String, String) {
    let total = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0);
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
        .sum();
    let mut status = pod
        .pointer("/status/reason")
        .and_then(Value::as_str)
        .or_else(|| pod.pointer("/status/phase").and_then(Value::as_str))
        .unwrap_or("Pending")
        .to_string();
    if pod
        .pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        status = "SchedulingGated".into();
    }
    for s in &statuses {
        if let Some(r) = s.pointer("/state/waiting/reason").and_then(Value::as_str) {
            status = r.to_string();
        } else if let Some(r) = s
            .pointer("/state/terminated/reason")
            .and_then(Value::as_str)
        {
            status = r.to_string();
        }
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        status = "Terminating".into();
    }
    (format!("{ready}/{total}"), status, restarts.to_string())
}

fn computed(name: &str, obj: &Value) -> Value {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    match name {
        "@pod-ready" => json!(pod_cells(obj).0),
        "@pod-status" => json!(pod_cells(obj).1),
        "@pod-restarts" => json!(pod_cells(obj).2),
        "@node-status" => {
            let ready = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
                .and_then(|c| c.get("status").and_then(Value::as_str))
                .unwrap_or("Unknown");
            let mut st = if ready == "True" {
                "Ready".to_string()
            } else {
                "NotReady".to_string()
            };
            if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                st.push_str(",SchedulingDisabled");
            }
            json!(st)
        }
        "@node-roles" => {
            let roles: Vec<String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| {
                    k.strip_prefix("node-role.kubernetes.io/")
                        .map(str::to_string)
                })
                .collect();
            json!(if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            })
        }
        "@node-ip" => json!(
            obj.pointer("/status/addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))
                .and_then(|a| a.get("address").and_then(Value::as_str))
                .unwrap_or("<none>")
        ),
        "@ready-of-replicas" => json!(format!(
            "{}/{}",
            obj.pointer("/status/readyReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            obj.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        )),
        "@data-count" => json!(
            obj.get("data")
                .and_then(Value::as_object)
                .map(|m| m.len())
                .unwrap_or(0)
                + obj
                    .get("binaryData")
                    .and_then(Value::as_object)
                    .map(|m| m.len())
                    .unwrap_or(0)
        ),
        "@secrets-count" => json!(
            obj.get("secrets")
                .and_then(Value::as_array)
                .map(Vec::len)
                .unwrap_or(0)
        ),
        "@svc-ports" => {
            let ports: Vec<String> = obj
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p.get("port").map(|v| v.to_string()).unwrap_or_default(),
                        p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                    )
                })
                .collect();
            json!(if ports.is_empty() {
                "<none>".to_string()
            } else {
                ports.join(",")
            })
        }
        "@svc-selector" => {
            let sel: Vec<String> = obj
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect();
            json!(if sel.is_empty() {
                "<none>".to_string()
            } else {
                sel.join(",")
            })
        }
        "@pdb-min" | "@pdb-max" => {
            let f = if name == "@pdb-min" {
                "/spec/minAvailable"
            } else {
                "/spec/maxUnavailable"
            };
            match obj.pointer(f) {
                Some(Value::String(s)) => json!(s),
                Some(v @ Value::Number(_)) => json!(v.to_string()),
                _ => json!("N/A"),
            }
        }
        "@event-object" => json!(format!(
            "{}/{}",
            s("/involvedObject/kind").to_lowercase(),
            s("/involvedObject/name")
        )),
        "@roleref" => json!(format!("{}/{}", s("/roleRef/kind"), s("/roleRef/name"))),
        "@job-status" => {
            let done = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| {
                    c.get("status").and_then(Value::as_str) == Some("True")
                        && matches!(
                            c.get("type").and_then(Value::as_str),
                            Some("Complete" | "Failed")
                        )
                })
                .and_then(|c| c.get("type").and_then(Value::as_str))
                .unwrap_or("Running");
            json!(done)
        }
        "@job-completions" => json!(format!(
            "{}/{}",
            obj.pointer("/status/succeeded")
                .and_then(Value::as_i64)
                .unwrap_or(0),
            obj.pointer("/spec/completions")
                .and_then(Value::as_i64)
                .unwrap_or(1)
        )),
        _ => json!("<none>"),
    }
}

fn cell(c: &Column, obj: &Value, now: Timestamp) -> Value {
    if c.json_path.starts_with('@') {
        return computed(&c.json_path, obj);
    }
    match path_value(obj, &c.json_path) {
        None | Some(Value::Null) => Value::Null,
        Some(v) if c.type_ == "date" => match v.as_str() {
            Some(t) => json!(human_age(t, now)),
            None => v.clone(),
        },
        Some(v) => v.clone(),
    }
}

/// The Table for `items`; `include` is `None`, `Metadata` (default) or `Object`.
pub fn table(
    ri: &ResourceInfo,
    items: &[std::sync::Arc<Value>],
    include: &str,
    now: Timestamp,
    rv: Option<&str>,
    cont: Option<&str>,
) -> Value {
    let mut defs = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for c in &ri.columns {
        let t = if c.type_ == "date" {
            "string"
        } else {
            c.type_.as_str()
        };
        defs.push(json!({"name": c.name, "type": t, "format": "", "description": "", "priority": c.priority}));
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(json!(""))];
            cells.extend(ri.columns.iter().map(|c| cell(c, o, now)));
            let object = match include {
                "None" => Value::Null,
                "Object" => (**o).clone(),
                _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}),
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv);
    }
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::builtins;

    #[test]
    fn pod_table_columns() {
        let pods = builtins().into_iter().find(|r| r.plural == "pods").unwrap();
        let now: Timestamp = "2024-01-01T00:10:00Z".parse().unwrap();
        let pod = std::sync::Arc::new(
            json!({"metadata":{"name":"p","creationTimestamp":"2024-01-01T00:00:00Z"},
            "spec":{"containers":[{"name":"a"},{"name":"b"}],"nodeName":"n1"},
            "status":{"phase":"Running","podIP":"10.0.0.1","containerStatuses":[{"ready":true,"restartCount":2},{"ready":false,"restartCount":1}]}}),
        );
        let t = table(&pods, &[pod], "Metadata", now, None, None);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], json!("p"));
        assert_eq!(cells[1], json!("1/2"));
        assert_eq!(cells[2], json!("Running"));
        assert_eq!(cells[3], json!("3"));
        assert_eq!(cells[4], json!("10m"));
        assert_eq!(cells[6], json!("n1"));
        assert_eq!(t["columnDefinitions"][6]["priority"], json!(1));
    }

    #[test]
    fn jsonpath_filters() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "x"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(
            path_value(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(
            path_value(&o, ".status.conditions[0].type"),
            Some(&json!("A"))
        );
        assert_eq!(
            path_value(&o, ".status.conditions[?(@.type==\"B\")].status"),
            None
        );
    }
}
