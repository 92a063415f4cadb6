//! Markdown reference of every field of ebb's custom resources (type, default, meaning, rules),
//! generated from the CRD schemas; `docs/reference.md` is this output and a test fails when stale.

use serde_json::Value;

use crate::duration::DURATION_PATTERN;

/// Kinds in the order the reference lists them.
const ORDER: [&str; 3] = ["ScaleDownPolicy", "PlacementHistory", "NodeState"];

/// One row of a field table.
struct Row {
    path: String,
    kind: String,
    default: String,
    meaning: String,
}

/// A CEL rule with the field it sits on.
struct Rule {
    path: String,
    message: String,
}

/// The whole reference document.
pub fn markdown() -> String {
    let mut crds = crate::crdgen::crds();
    crds.sort_by_key(|c| {
        ORDER
            .iter()
            .position(|k| *k == c.spec.names.kind)
            .unwrap_or(ORDER.len())
    });
    let mut out = String::from(
        "# ebb custom resource reference\n\n\
         Generated from the CRD schemas (`crds/`); regenerate with\n\
         `EBB_UPDATE_REFERENCE=1 cargo test -p ebb-api --test reference`.\n\
         Every field with its type, its default (applied by the API server when the field is left\n\
         out) and its meaning. Durations are written like `30s`, `5m`, `1h30m` or `1.5h`\n\
         (units `ms`, `s`, `m`, `h`, `d`).\n",
    );
    for crd in &crds {
        let names = &crd.spec.names;
        for version in &crd.spec.versions {
            let Some(schema) = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok())
            else {
                continue;
            };
            out.push_str(&format!(
                "\n## {kind}\n\n`{group}/{version}`, {scope}, plural `{plural}`{short}.\n\n{desc}\n",
                kind = names.kind,
                group = crd.spec.group,
                version = version.name,
                scope = if crd.spec.scope == "Cluster" {
                    "cluster-scoped"
                } else {
                    "namespaced"
                },
                plural = names.plural,
                short = names
                    .short_names
                    .as_ref()
                    .filter(|s| !s.is_empty())
                    .map(|s| format!(", short name `{}`", s.join("`, `")))
                    .unwrap_or_default(),
                desc = one_line(str_of(&schema, "description")),
            ));
            for part in ["spec", "status"] {
                let Some(sub) = schema.pointer(&format!("/properties/{part}")) else {
                    continue;
                };
                let mut rows = vec![];
                let mut rules = vec![];
                walk(part, sub, &mut rows, &mut rules);
                out.push_str(&format!(
                    "\n### {kind} `{part}`\n\n{desc}\n\n",
                    kind = names.kind,
                    desc = one_line(str_of(sub, "description")),
                ));
                out.push_str("| field | type | default | meaning |\n|---|---|---|---|\n");
                for row in rows {
                    out.push_str(&format!(
                        "| `{}` | {} | {} | {} |\n",
                        row.path, row.kind, row.default, row.meaning
                    ));
                }
                if !rules.is_empty() {
                    out.push_str(
                        "\nThe API server rejects an object that breaks one of these rules:\n\n",
                    );
                    for rule in rules {
                        out.push_str(&format!("- `{}`: {}\n", rule.path, rule.message));
                    }
                }
            }
        }
    }
    out
}

/// Rows for the properties of the object `schema` at `path`, depth first, fields sorted by name.
fn walk(path: &str, schema: &Value, rows: &mut Vec<Row>, rules: &mut Vec<Rule>) {
    collect_rules(path, schema, rules);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, prop) in props {
        let field = format!("{path}.{name}");
        rows.push(Row {
            path: field.clone(),
            kind: type_of(prop),
            default: default_of(prop, required.contains(&name.as_str())),
            meaning: escape(&one_line(str_of(prop, "description"))),
        });
        match shape(prop) {
            Shape::Object => walk(&field, prop, rows, rules),
            Shape::ArrayOfObjects => {
                collect_rules(&field, prop, rules);
                if let Some(items) = prop.get("items") {
                    walk(&format!("{field}[]"), items, rows, rules);
                }
            }
            Shape::Leaf => collect_rules(&field, prop, rules),
        }
    }
}

enum Shape {
    /// An object of ebb's own whose fields get rows of their own.
    Object,
    /// An array of such objects.
    ArrayOfObjects,
    /// Anything else (scalars, maps, label selectors, conditions).
    Leaf,
}

fn shape(schema: &Value) -> Shape {
    let own_object =
        |s: &Value| s.get("properties").is_some() && !is_label_selector(s) && !is_condition(s);
    match str_of(schema, "type") {
        "object" if own_object(schema) => Shape::Object,
        "array" if schema.get("items").is_some_and(own_object) => Shape::ArrayOfObjects,
        _ => Shape::Leaf,
    }
}

fn has_props(schema: &Value, names: &[&str]) -> bool {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.len() == names.len() && names.iter().all(|n| p.contains_key(*n)))
}

fn is_label_selector(schema: &Value) -> bool {
    has_props(schema, &["matchExpressions", "matchLabels"])
}

fn is_condition(schema: &Value) -> bool {
    has_props(
        schema,
        &[
            "lastTransitionTime",
            "message",
            "observedGeneration",
            "reason",
            "status",
            "type",
        ],
    )
}

/// The type column: base type plus the constraints a user must know.
fn type_of(schema: &Value) -> String {
    let base = match str_of(schema, "type") {
        "object" if is_label_selector(schema) => "label selector".to_string(),
        "object" => match schema.get("additionalProperties") {
            Some(v) => format!("map of {}", type_of(v)),
            None => "object".to_string(),
        },
        "array" => match schema.get("items") {
            Some(i) if is_condition(i) => "list of conditions".to_string(),
            Some(i) => format!("list of {}", type_of(i)),
            None => "list".to_string(),
        },
        "string" if str_of(schema, "pattern") == DURATION_PATTERN => "duration".to_string(),
        "string" if str_of(schema, "format") == "date-time" => "time (RFC 3339)".to_string(),
        "" => "any".to_string(),
        other => other.to_string(),
    };
    let mut notes = vec![];
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .filter_map(Value::as_str)
            .map(|v| format!("`{v}`"))
            .collect();
        notes.push(format!("one of {}", values.join(", ")));
    }
    match (number(schema, "minimum"), number(schema, "maximum")) {
        (Some(lo), Some(hi)) => notes.push(format!("{lo} to {hi}")),
        (Some(lo), None) => notes.push(format!("≥ {lo}")),
        (None, Some(hi)) => notes.push(format!("≤ {hi}")),
        (None, None) => {}
    }
    if let Some(max) = number(schema, "maxItems") {
        notes.push(format!("at most {max} items"));
    }
    if let Some(max) = number(schema, "maxLength") {
        notes.push(format!("at most {max} characters"));
    }
    let pattern = str_of(schema, "pattern");
    if !pattern.is_empty() && pattern != DURATION_PATTERN {
        notes.push(format!("matches `{}`", escape(pattern)));
    }
    if notes.is_empty() {
        base
    } else {
        format!("{base} ({})", notes.join("; "))
    }
}

fn default_of(schema: &Value, required: bool) -> String {
    match schema.get("default") {
        Some(Value::String(s)) => format!("`{s}`"),
        Some(v) => format!("`{v}`"),
        None if required => "required".to_string(),
        None => "—".to_string(),
    }
}

fn collect_rules(path: &str, schema: &Value, rules: &mut Vec<Rule>) {
    let Some(list) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    else {
        return;
    };
    for rule in list {
        let message = match str_of(rule, "message") {
            "" => format!("`{}`", str_of(rule, "rule")),
            m => one_line(m),
        };
        rules.push(Rule {
            path: path.to_string(),
            message,
        });
    }
}

/// A JSON number as an integer when it is one (`1.0` prints as `1`).
fn number(schema: &Value, key: &str) -> Option<String> {
    let n = schema.get(key)?.as_f64()?;
    Some(if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    })
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Collapses line breaks and runs of spaces of a schema description into single spaces.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Escapes the table separator.
fn escape(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_carry_their_constraints() {
        let s = json!({"type": "integer", "minimum": 1.0, "maximum": 10000.0});
        assert_eq!(type_of(&s), "integer (1 to 10000)");
        let s = json!({"type": "string", "enum": ["A", "B"]});
        assert_eq!(type_of(&s), "string (one of `A`, `B`)");
        let s = json!({"type": "string", "pattern": DURATION_PATTERN});
        assert_eq!(type_of(&s), "duration");
        let s = json!({"type": "object", "additionalProperties": {"type": "string"}});
        assert_eq!(type_of(&s), "map of string");
        let s = json!({"type": "string", "pattern": "^(a|b)$"});
        assert_eq!(type_of(&s), "string (matches `^(a\\|b)$`)");
    }

    #[test]
    fn defaults_and_required_fields() {
        assert_eq!(default_of(&json!({"default": "10s"}), false), "`10s`");
        assert_eq!(default_of(&json!({"default": 3}), false), "`3`");
        assert_eq!(default_of(&json!({"default": {}}), false), "`{}`");
        assert_eq!(default_of(&json!({}), true), "required");
        assert_eq!(default_of(&json!({}), false), "—");
    }

    #[test]
    fn nested_objects_and_lists_get_rows_but_selectors_do_not() {
        let spec = json!({"type": "object", "required": ["a"], "properties": {
            "a": {"type": "array", "items": {"type": "object", "properties": {
                "b": {"type": "string", "description": "the\n  b"}}}},
            "sel": {"type": "object", "properties": {
                "matchLabels": {"type": "object"}, "matchExpressions": {"type": "array"}}},
        }});
        let (mut rows, mut rules) = (vec![], vec![]);
        walk("spec", &spec, &mut rows, &mut rules);
        let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, ["spec.a", "spec.a[].b", "spec.sel"]);
        assert_eq!(rows[0].default, "required");
        assert_eq!(rows[1].meaning, "the b");
        assert_eq!(rows[2].kind, "label selector");
    }
}
