//! Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902, with Kubernetes'
//! missing-path-tests-as-null rule) and strategic merge patch for the built-in kinds.

use serde_json::{Map, Value};

/// A patch that cannot be applied, with what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("the patch is not valid JSON: {0}")]
    Decode(String),
    #[error("the JSON patch failed: {0}")]
    JsonPatch(String),
    #[error("the strategic merge patch is invalid: {0}")]
    Strategic(String),
}

/// RFC 7386 merge patch.
pub fn merge(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// RFC 6902 JSON patch. As the Kubernetes apiserver does, a `test` of `null` against a path that
/// does not exist succeeds.
pub fn json(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops: Vec<json_patch::PatchOperation> =
        serde_json::from_value(patch.clone()).map_err(|e| PatchError::Decode(e.to_string()))?;
    let mut work = doc.clone();
    for op in &ops {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && work.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut work, std::slice::from_ref(op))
            .map_err(|e| PatchError::JsonPatch(e.to_string()))?;
    }
    *doc = work;
    Ok(())
}

/// Merge key of a list field in the built-in kinds, or `None` for lists replaced as a whole.
/// `Some("")` marks a list of primitives merged as a set (`finalizers`).
fn merge_key(parent: &str, field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "volumeClaimTemplates" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "addresses" if parent == "status" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "ports" if parent == "spec" => "port",
        "ports" => "containerPort",
        "taints" => "key",
        "finalizers" => "",
        _ => return None,
    })
}

/// Strategic merge patch as `kubectl` and client-go send it, for built-in kinds: maps merge,
/// lists with a merge key merge by key, `$patch: delete|replace`, `$retainKeys`,
/// `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (ignored) and `null` deletes.
pub fn strategic(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::Strategic(
            "the patch must be a JSON object".into(),
        ));
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Value::Object(d) = doc {
        merge_map(d, p, "")?;
    }
    Ok(())
}

fn merge_map(
    d: &mut Map<String, Value>,
    p: &Map<String, Value>,
    parent: &str,
) -> Result<(), PatchError> {
    if let Some(Value::String(directive)) = p.get("$patch") {
        match directive.as_str() {
            "replace" => {
                let mut clean = p.clone();
                clean.remove("$patch");
                *d = clean;
                return Ok(());
            }
            "delete" => {
                d.clear();
                return Ok(());
            }
            "merge" => {}
            other => {
                return Err(PatchError::Strategic(format!(
                    "unknown $patch directive {other:?}"
                )));
            }
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        d.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (d.get_mut(field), pv) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if pv.is_null() {
            d.remove(k);
            continue;
        }
        match (d.get_mut(k), pv) {
            (Some(Value::Object(dm)), Value::Object(pm)) => merge_map(dm, pm, k)?,
            (Some(Value::Array(dl)), Value::Array(pl)) => match merge_key(parent, k) {
                Some("") => {
                    for x in pl {
                        if !dl.contains(x) {
                            dl.push(x.clone());
                        }
                    }
                }
                Some(key) => merge_list(dl, pl, key)?,
                None => {
                    d.insert(k.clone(), strip_directives(pv));
                }
            },
            _ => {
                d.insert(k.clone(), strip_directives(pv));
            }
        }
    }
    Ok(())
}

fn merge_list(dl: &mut Vec<Value>, pl: &[Value], key: &str) -> Result<(), PatchError> {
    if pl
        .iter()
        .any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *dl = pl
            .iter()
            .filter(|x| x.get("$patch").is_none())
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    for item in pl {
        let Some(kv) = item.get(key) else {
            return Err(PatchError::Strategic(format!(
                "list item has no merge key {key:?}: {item}"
            )));
        };
        let pos = dl.iter().position(|x| x.get(key) == Some(kv));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                dl.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let (Value::Object(dm), Value::Object(pm)) = (&mut dl[i], item) {
                    merge_map(dm, pm, key)?;
                }
            }
            (None, false) => dl.push(strip_directives(item)),
        }
    }
    Ok(())
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patch_test_missing_path_is_null() {
        let mut d = json!({"metadata":{"name":"a"}});
        json(
            &mut d,
            &json!([{"op":"test","path":"/metadata/finalizers","value":null},
            {"op":"add","path":"/metadata/finalizers","value":["x"]}]),
        )
        .unwrap();
        assert_eq!(d.pointer("/metadata/finalizers"), Some(&json!(["x"])));
        let before = d.clone();
        assert!(
            json(
                &mut d,
                &json!([{"op":"test","path":"/metadata/name","value":"b"},
            {"op":"remove","path":"/metadata/finalizers"}])
            )
            .is_err()
        );
        assert_eq!(d, before, "a failed patch leaves the document unchanged");
    }

    #[test]
    fn strategic_merges_conditions_by_type_and_taints_by_key() {
        let mut d = json!({"status":{"conditions":[{"type":"Ready","status":"False"},{"type":"X","status":"True"}]},
            "spec":{"taints":[{"key":"a","effect":"NoSchedule"}]}});
        strategic(
            &mut d,
            &json!({"status":{"conditions":[{"type":"Ready","status":"True"}]},
            "spec":{"taints":[{"key":"b","effect":"NoSchedule"}]}}),
        )
        .unwrap();
        assert_eq!(
            d.pointer("/status/conditions/0/status"),
            Some(&json!("True"))
        );
        assert_eq!(d.pointer("/status/conditions/1/type"), Some(&json!("X")));
        assert_eq!(
            d.pointer("/spec/taints")
                .and_then(Value::as_array)
                .map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn strategic_directives() {
        let mut d = json!({"metadata":{"finalizers":["a","b"],"labels":{"x":"1","y":"2"}},
            "spec":{"containers":[{"name":"c","image":"i"},{"name":"d","image":"j"}]}});
        strategic(
            &mut d,
            &json!({"metadata":{"$deleteFromPrimitiveList/finalizers":["a"],
            "finalizers":["c"],"labels":{"x":null}},
            "spec":{"$setElementOrder/containers":[{"name":"c"}],
                "containers":[{"name":"d","$patch":"delete"},{"name":"c","image":"k"}]}}),
        )
        .unwrap();
        assert_eq!(d.pointer("/metadata/finalizers"), Some(&json!(["b", "c"])));
        assert_eq!(d.pointer("/metadata/labels"), Some(&json!({"y":"2"})));
        assert_eq!(
            d.pointer("/spec/containers"),
            Some(&json!([{"name":"c","image":"k"}]))
        );
    }
}
