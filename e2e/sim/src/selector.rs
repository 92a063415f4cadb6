//! Label and field selectors: the query-string syntax of `labelSelector`/`fieldSelector` and the
//! structured `LabelSelector` (`matchLabels`/`matchExpressions`) of workloads and PDBs.

use serde_json::{Map, Value};

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq)]
pub enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(pub Vec<Req>);

/// A selector that could not be parsed, with the offending text.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid selector {input:?}: {reason}")]
pub struct SelectorError {
    pub input: String,
    pub reason: String,
}

fn err(input: &str, reason: &str) -> SelectorError {
    SelectorError {
        input: input.to_string(),
        reason: reason.to_string(),
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl LabelSelector {
    /// Parses the `labelSelector` query syntax: `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top(trimmed) {
            let p = part.trim();
            if p.is_empty() {
                return Err(err(input, "empty requirement"));
            }
            let lower = p.to_string();
            if let Some(k) = p.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(err(input, "invalid label key after '!'"));
                }
                reqs.push(Req::NotExists(k.to_string()));
            } else if let Some(idx) = find_word(&lower, " notin ") {
                let (k, set) = (p[..idx].trim(), parse_set(input, &p[idx + 7..])?);
                reqs.push(Req::NotIn(checked_key(input, k)?, set));
            } else if let Some(idx) = find_word(&lower, " in ") {
                let (k, set) = (p[..idx].trim(), parse_set(input, &p[idx + 4..])?);
                reqs.push(Req::In(checked_key(input, k)?, set));
            } else if let Some((k, v)) = p.split_once("!=") {
                reqs.push(Req::NotEq(
                    checked_key(input, k.trim())?,
                    v.trim().to_string(),
                ));
            } else if let Some((k, v)) = p.split_once("==") {
                reqs.push(Req::Eq(checked_key(input, k.trim())?, v.trim().to_string()));
            } else if let Some((k, v)) = p.split_once('=') {
                reqs.push(Req::Eq(checked_key(input, k.trim())?, v.trim().to_string()));
            } else {
                reqs.push(Req::Exists(checked_key(input, p)?));
            }
        }
        Ok(Self(reqs))
    }

    /// Builds a selector from a structured `LabelSelector` object. `None` or `{}` matches all.
    pub fn from_object(sel: Option<&Value>) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        let Some(sel) = sel else {
            return Ok(Self(reqs));
        };
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                reqs.push(Req::Eq(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let op = e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            reqs.push(match op {
                "In" => Req::In(key, values),
                "NotIn" => Req::NotIn(key, values),
                "Exists" => Req::Exists(key),
                "DoesNotExist" => Req::NotExists(key),
                other => {
                    return Err(err(
                        &sel.to_string(),
                        &format!("unknown operator {other:?}"),
                    ));
                }
            });
        }
        Ok(Self(reqs))
    }

    /// Whether labels (a JSON object or absent) satisfy every requirement.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(obj.pointer("/metadata/labels").and_then(Value::as_object))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn find_word(s: &str, w: &str) -> Option<usize> {
    s.find(w)
}

fn checked_key(input: &str, k: &str) -> Result<String, SelectorError> {
    if valid_key(k) {
        Ok(k.to_string())
    } else {
        Err(err(input, &format!("invalid label key {k:?}")))
    }
}

fn parse_set(input: &str, s: &str) -> Result<Vec<String>, SelectorError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| err(input, "expected a parenthesised set of values"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// A parsed `fieldSelector` over the fields Kubernetes supports for the served kinds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// The fields a `fieldSelector` may name.
const FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
    "spec.unschedulable",
    "involvedObject.name",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.uid",
    "regarding.name",
    "regarding.kind",
    "type",
    "reason",
];

impl FieldSelector {
    /// Parses `a=b,c!=d` (and `==`); unknown fields are an error as in Kubernetes.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut out = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(err(input, "field selectors need '=', '==' or '!='"));
            };
            let k = k.trim();
            if !FIELDS.contains(&k) {
                return Err(err(input, &format!("field label not supported: {k}")));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let ptr = format!("/{}", k.replace('.', "/"));
            let actual = match obj.pointer(&ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Null) | None => {
                    if k == "spec.unschedulable" {
                        "false".to_string()
                    } else {
                        String::new()
                    }
                }
                Some(other) => other.to_string(),
            };
            (actual == *v) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn full_label_syntax() {
        let s = LabelSelector::parse(
            "app=web,tier!=db,env in (prod, staging),zone notin (a),team,!legacy",
        )
        .unwrap();
        assert_eq!(s.0.len(), 6);
        let ok = labels(json!({"app":"web","tier":"fe","env":"prod","zone":"b","team":"x"}));
        assert!(s.matches(Some(&ok)));
        let mut bad = ok.clone();
        bad.insert("legacy".into(), json!("1"));
        assert!(!s.matches(Some(&bad)));
        let mut bad_env = ok.clone();
        bad_env.insert("env".into(), json!("dev"));
        assert!(!s.matches(Some(&bad_env)));
        let mut bad_zone = ok;
        bad_zone.insert("zone".into(), json!("a"));
        assert!(!s.matches(Some(&bad_zone)));
    }

    #[test]
    fn notin_and_noteq_match_missing_labels() {
        let s = LabelSelector::parse("a notin (x),b!=y").unwrap();
        assert!(s.matches(None));
    }

    #[test]
    fn bad_selectors_are_errors() {
        assert!(LabelSelector::parse("a in x").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
        assert!(FieldSelector::parse("spec.foo=bar").is_err());
    }

    #[test]
    fn structured_selector() {
        let s = LabelSelector::from_object(Some(&json!({"matchLabels":{"app":"a"},
            "matchExpressions":[{"key":"t","operator":"In","values":["1","2"]}]})))
        .unwrap();
        assert!(s.matches(Some(&labels(json!({"app":"a","t":"2"})))));
        assert!(!s.matches(Some(&labels(json!({"app":"a","t":"3"})))));
        assert!(
            LabelSelector::from_object(Some(
                &json!({"matchExpressions":[{"key":"t","operator":"Nope"}]})
            ))
            .is_err()
        );
    }

    #[test]
    fn field_selector() {
        let f = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed").unwrap();
        assert!(f.matches(&json!({"spec":{"nodeName":"n1"},"status":{"phase":"Running"}})));
        assert!(!f.matches(&json!({"spec":{"nodeName":"n1"},"status":{"phase":"Failed"}})));
        assert!(!f.matches(&json!({"spec":{},"status":{"phase":"Running"}})));
        let empty = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(empty.matches(&json!({"spec":{}})));
    }
}
