//! Every generated CRD schema obeys the apiserver's structural-schema rules.
//! The checker is written here, independent of kube's generator, and proven able to fail.

use serde_json::{Value, json};

/// Check a schema node against the structural rules of apiextensions.k8s.io/v1.
/// `in_junctor` is true inside allOf/anyOf/oneOf/not; `is_metadata` marks `metadata` at the root.
fn check(schema: &Value, path: &str, in_junctor: bool, errors: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        errors.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in ["$ref", "definitions", "$defs", "$schema", "id"] {
        if obj.contains_key(forbidden) {
            errors.push(format!(
                "{path}: `{forbidden}` is not allowed in a structural schema"
            ));
        }
    }
    if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
        errors.push(format!("{path}: uniqueItems: true is not allowed"));
    }
    if obj.get("additionalProperties") == Some(&Value::Bool(false)) {
        errors.push(format!(
            "{path}: additionalProperties: false is not allowed"
        ));
    }
    if obj.contains_key("additionalProperties") && obj.contains_key("properties") {
        errors.push(format!(
            "{path}: properties and additionalProperties are mutually exclusive"
        ));
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if in_junctor {
        for key in [
            "description",
            "type",
            "default",
            "additionalProperties",
            "nullable",
        ] {
            if obj.contains_key(key) {
                errors.push(format!(
                    "{path}: `{key}` must not be set inside allOf/anyOf/oneOf/not"
                ));
            }
        }
    } else if !int_or_string && !preserve {
        match obj.get("type").and_then(Value::as_str) {
            Some(t) if !t.is_empty() => {
                if !["object", "array", "string", "integer", "number", "boolean"].contains(&t) {
                    errors.push(format!("{path}: unknown type {t:?}"));
                }
            }
            _ => errors.push(format!("{path}: every node needs a non-empty `type`")),
        }
    }
    if let Some(items) = obj.get("items") {
        if items.is_array() {
            errors.push(format!("{path}: items must be a single schema, not a list"));
        } else {
            check(items, &format!("{path}[]"), in_junctor, errors);
        }
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, sub) in props {
            check(sub, &format!("{path}.{name}"), in_junctor, errors);
        }
    }
    if let Some(ap) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        check(ap, &format!("{path}.*"), in_junctor, errors);
    }
    // Fields named inside a junctor must also be specified outside it.
    for junctor in ["allOf", "anyOf", "oneOf", "not"] {
        let Some(j) = obj.get(junctor) else { continue };
        let branches: Vec<&Value> = match j {
            Value::Array(list) => list.iter().collect(),
            other => vec![other],
        };
        let is_int_or_string_pattern = int_or_string && junctor == "anyOf";
        for (i, branch) in branches.into_iter().enumerate() {
            let bpath = format!("{path}.{junctor}[{i}]");
            if is_int_or_string_pattern {
                continue;
            }
            check(branch, &bpath, true, errors);
            if let Some(Value::Object(bprops)) = branch.get("properties") {
                for name in bprops.keys() {
                    let outside = obj.get("properties").and_then(|p| p.get(name)).is_some();
                    if !outside {
                        errors.push(format!(
                            "{bpath}: field `{name}` is only specified inside {junctor}"
                        ));
                    }
                }
            }
            if branch.get("items").is_some() && obj.get("items").is_none() {
                errors.push(format!("{bpath}: items only specified inside {junctor}"));
            }
        }
    }
    match obj.get("x-kubernetes-list-type").and_then(Value::as_str) {
        None => {
            if obj.contains_key("x-kubernetes-list-map-keys") {
                errors.push(format!("{path}: list-map-keys without list-type map"));
            }
        }
        Some("atomic") => {}
        Some("set") => {
            let item_type = schema.pointer("/items/type").and_then(Value::as_str);
            if matches!(item_type, Some("object") | Some("array")) {
                errors.push(format!("{path}: list-type set needs scalar items"));
            }
        }
        Some("map") => {
            let keys = obj
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if keys.is_empty() {
                errors.push(format!(
                    "{path}: list-type map needs x-kubernetes-list-map-keys"
                ));
            }
            if schema.pointer("/items/type").and_then(Value::as_str) != Some("object") {
                errors.push(format!("{path}: list-type map needs object items"));
            }
            let required: Vec<&Value> = schema
                .pointer("/items/required")
                .and_then(Value::as_array)
                .map(|r| r.iter().collect())
                .unwrap_or_default();
            for key in &keys {
                let Some(k) = key.as_str() else { continue };
                let has_default = schema
                    .pointer(&format!("/items/properties/{k}/default"))
                    .is_some();
                if !required.contains(&key) && !has_default {
                    errors.push(format!(
                        "{path}: list-map key `{k}` must be required or defaulted"
                    ));
                }
            }
        }
        Some(other) => errors.push(format!("{path}: unknown x-kubernetes-list-type {other:?}")),
    }
}

/// Check a CRD version's `openAPIV3Schema` (root rules included).
fn check_root(schema: &Value) -> Vec<String> {
    let mut errors = vec![];
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        errors.push("root: type must be object".to_string());
    }
    if let Some(meta) = schema.pointer("/properties/metadata") {
        // Only name and generateName may be restricted, and only by string restrictions.
        let allowed_top = ["type", "description"];
        if let Some(o) = meta.as_object() {
            for k in o.keys() {
                if k != "properties" && !allowed_top.contains(&k.as_str()) {
                    errors.push(format!("metadata: `{k}` is not allowed on metadata"));
                }
            }
        }
        if let Some(Value::Object(props)) = meta.get("properties") {
            for name in props.keys() {
                if name != "name" && name != "generateName" {
                    errors.push(format!(
                        "metadata.{name}: only name and generateName may be restricted"
                    ));
                }
            }
        }
    }
    for field in ["apiVersion", "kind"] {
        if let Some(f) = schema.pointer(&format!("/properties/{field}"))
            && f.get("type").and_then(Value::as_str) != Some("string")
        {
            errors.push(format!("{field}: must be a string"));
        }
    }
    check(schema, "root", false, &mut errors);
    errors
}

fn generated_schemas() -> Vec<(String, Value)> {
    ebb_api::crdgen::crds()
        .into_iter()
        .flat_map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crd.spec.versions.into_iter().map(move |v| {
                let schema = v
                    .schema
                    .and_then(|s| s.open_api_v3_schema)
                    .expect("every version has a schema");
                (
                    format!("{name}/{}", v.name),
                    serde_json::to_value(schema).expect("json"),
                )
            })
        })
        .collect()
}

#[test]
fn every_generated_schema_is_structural() {
    let schemas = generated_schemas();
    assert_eq!(schemas.len(), 3, "one schema per kind");
    for (name, schema) in schemas {
        let errors = check_root(&schema);
        assert!(
            errors.is_empty(),
            "{name} is not structural:\n{}",
            errors.join("\n")
        );
    }
}

#[test]
fn every_crd_has_status_subresource_printer_columns_and_category() {
    for crd in ebb_api::crdgen::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert_eq!(crd.spec.group, "ebb.dev");
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["ebb".to_string()][..]),
            "{name}"
        );
        assert_eq!(
            crd.spec.names.short_names.as_ref().map(Vec::len),
            Some(1),
            "{name}"
        );
        for v in &crd.spec.versions {
            assert_eq!(v.name, "v1alpha1");
            assert!(
                v.subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{name}: status subresource"
            );
            let cols = v.additional_printer_columns.as_deref().unwrap_or_default();
            assert!(cols.len() >= 4, "{name}: printer columns");
            assert_eq!(
                cols.last().map(|c| c.name.as_str()),
                Some("Age"),
                "{name}: Age column last"
            );
            let schema = serde_json::to_value(
                v.schema
                    .as_ref()
                    .unwrap()
                    .open_api_v3_schema
                    .as_ref()
                    .unwrap(),
            )
            .unwrap();
            // Every printer column points at a field that exists in the schema.
            for c in cols {
                if c.json_path.starts_with(".metadata") {
                    continue;
                }
                let field = c
                    .json_path
                    .trim_start_matches('.')
                    .split(['.', '['])
                    .take(2)
                    .collect::<Vec<_>>();
                let pointer = format!("/properties/{}/properties/{}", field[0], field[1]);
                assert!(
                    schema.pointer(&pointer).is_some(),
                    "{name}: column {} -> {} not in schema",
                    c.name,
                    c.json_path
                );
            }
            assert!(
                schema
                    .pointer("/properties/status/properties/observedGeneration")
                    .is_some(),
                "{name}: observedGeneration"
            );
            assert_eq!(
                schema.pointer("/properties/status/properties/conditions/x-kubernetes-list-type"),
                Some(&json!("map")),
                "{name}: conditions are a list-map by type"
            );
        }
    }
}

#[test]
fn scale_down_policy_printer_columns_are_the_useful_ones() {
    let crd = ebb_api::crdgen::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "ScaleDownPolicy")
        .unwrap();
    let names: Vec<String> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.clone())
        .collect();
    for wanted in [
        "Mode",
        "Candidates",
        "Draining",
        "Removed",
        "Last Loop",
        "Age",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "missing column {wanted}: {names:?}"
        );
    }
}

/// Each case is a schema that breaks one rule; the checker must flag it.
#[test]
fn checker_rejects_non_structural_schemas() {
    let cases = vec![
        (
            "missing type",
            json!({"type": "object", "properties": {"a": {"description": "x"}}}),
            "non-empty `type`",
        ),
        (
            "$ref",
            json!({"type": "object", "properties": {"a": {"$ref": "#/definitions/A", "type": "object"}}}),
            "`$ref`",
        ),
        (
            "definitions",
            json!({"type": "object", "definitions": {}}),
            "`definitions`",
        ),
        (
            "field only in anyOf",
            json!({"type": "object", "anyOf": [{"properties": {"a": {}}}]}),
            "only specified inside anyOf",
        ),
        (
            "type inside oneOf",
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "oneOf": [{"properties": {"a": {"type": "string"}}}]}),
            "must not be set inside",
        ),
        (
            "description inside not",
            json!({"type": "string", "not": {"description": "nope"}}),
            "must not be set inside",
        ),
        (
            "metadata labels",
            json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
            "only name and generateName",
        ),
        (
            "list map without keys",
            json!({"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object"}}),
            "needs x-kubernetes-list-map-keys",
        ),
        (
            "list map key optional",
            json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"], "items": {"type": "object", "properties": {"k": {"type": "string"}}}}),
            "must be required or defaulted",
        ),
        (
            "list set of objects",
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object"}}),
            "scalar items",
        ),
        (
            "uniqueItems",
            json!({"type": "array", "uniqueItems": true, "items": {"type": "string"}}),
            "uniqueItems",
        ),
        (
            "additionalProperties false",
            json!({"type": "object", "additionalProperties": false}),
            "additionalProperties: false",
        ),
        (
            "both properties kinds",
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
            "mutually exclusive",
        ),
        (
            "tuple items",
            json!({"type": "array", "items": [{"type": "string"}]}),
            "single schema",
        ),
        (
            "untyped array item",
            json!({"type": "array", "items": {}}),
            "non-empty `type`",
        ),
    ];
    for (what, schema, expected) in cases {
        let root = json!({"type": "object", "properties": {"spec": schema}});
        let root = if what == "metadata labels" {
            schema
        } else {
            root
        };
        let errors = check_root(&root);
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "case {what:?}: expected an error containing {expected:?}, got {errors:?}"
        );
    }
}

#[test]
fn checker_accepts_the_allowed_exceptions() {
    let ok = json!({
        "type": "object",
        "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 63}}},
            "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "anything": {"x-kubernetes-preserve-unknown-fields": true},
            "list": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                     "items": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string"}}}},
            "choice": {"type": "object", "properties": {"a": {"type": "string"}},
                       "oneOf": [{"required": ["a"]}, {"properties": {"a": {"pattern": "^x"}}}]}
        }
    });
    assert_eq!(check_root(&ok), Vec::<String>::new());
}
