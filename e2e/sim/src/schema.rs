//! Structural schema handling for custom resources: pruning of unknown fields and the OpenAPI
//! checks (type, required, enum, bounds) the apiserver runs before CEL rules.

use serde_json::Value;

fn preserves(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
        || schema.get("x-kubernetes-int-or-string").is_some() && schema.get("properties").is_none()
}

/// Drops fields the schema does not declare (except under `x-kubernetes-preserve-unknown-fields`);
/// at the root, `apiVersion`, `kind` and `metadata` are kept.
pub fn prune(schema: &Value, obj: &mut Value) {
    prune_at(schema, obj, true);
}

fn prune_at(schema: &Value, obj: &mut Value, root: bool) {
    match obj {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                let keep_unknown = preserves(schema);
                m.retain(|k, _| {
                    props.contains_key(k)
                        || keep_unknown
                        || (root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                });
                for (k, v) in m.iter_mut() {
                    if let Some(s) = props.get(k) {
                        prune_at(s, v, false);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for v in m.values_mut() {
                    prune_at(ap, v, false);
                }
            } else if !preserves(schema)
                && !root
                && schema.get("type").and_then(Value::as_str) == Some("object")
            {
                m.clear();
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for v in a {
                    prune_at(items, v, false);
                }
            }
        }
        _ => {}
    }
}

/// OpenAPI validation: returns `(field path, message)` for each problem.
pub fn check(schema: &Value, obj: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(schema, obj, "", &mut out, true);
    out
}

fn type_ok(t: &str, v: &Value, schema: &Value) -> bool {
    if schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return v.is_string() || v.is_i64() || v.is_u64();
    }
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn walk(schema: &Value, v: &Value, path: &str, out: &mut Vec<(String, String)>, root: bool) {
    let here = if path.is_empty() {
        "<root>".to_string()
    } else {
        path.to_string()
    };
    if v.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) && !root {
            out.push((here, "Invalid value: \"null\": must not be null".into()));
        }
        return;
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str)
        && !type_ok(t, v, schema)
    {
        out.push((here, format!("Invalid value: {v}: must be of type {t}")));
        return;
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        let allowed: Vec<String> = e.iter().map(|x| x.to_string()).collect();
        out.push((
            here.clone(),
            format!(
                "Unsupported value: {v}: supported values: {}",
                allowed.join(", ")
            ),
        ));
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64())
        && n < min
    {
        out.push((
            here.clone(),
            format!("Invalid value: {v}: should be greater than or equal to {min}"),
        ));
    }
    if let (Some(max), Some(n)) = (schema.get("maximum").and_then(Value::as_f64), v.as_f64())
        && n > max
    {
        out.push((
            here.clone(),
            format!("Invalid value: {v}: should be less than or equal to {max}"),
        ));
    }
    match v {
        Value::Object(m) => {
            for r in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !m.contains_key(r) {
                    let p = if path.is_empty() {
                        r.to_string()
                    } else {
                        format!("{path}.{r}")
                    };
                    out.push((p, "Required value".into()));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, c) in m {
                if root && k == "metadata" {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    walk(s, c, &p, out, false);
                } else if let Some(ap) =
                    schema.get("additionalProperties").filter(|a| a.is_object())
                {
                    walk(ap, c, &p, out, false);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, c) in a.iter().enumerate() {
                    walk(items, c, &format!("{here}[{i}]"), out, false);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prune_and_check() {
        let s = json!({"type":"object","properties":{"spec":{"type":"object","required":["n"],
            "properties":{"n":{"type":"integer","minimum":1},"m":{"type":"string","enum":["A","B"]},
            "free":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}}});
        let mut o = json!({"apiVersion":"x/v1","kind":"K","metadata":{"name":"a"},
            "spec":{"n":0,"m":"C","junk":1,"free":{"any":1}},"other":2});
        prune(&s, &mut o);
        assert_eq!(
            o,
            json!({"apiVersion":"x/v1","kind":"K","metadata":{"name":"a"},"spec":{"n":0,"m":"C","free":{"any":1}}})
        );
        let errs = check(&s, &o);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            check(&s, &json!({"spec":{}}))
                .iter()
                .any(|(f, m)| f == "spec.n" && m == "Required value")
        );
    }
}
