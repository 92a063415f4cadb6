//! Server-side apply and `managedFields`: field ownership per manager at the granularity of map
//! leaves (lists are owned whole), apply conflicts, `force`, and ownership moves on updates.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A field path such as `["spec", "replicas"]`.
pub type Path = Vec<String>;
/// The fields one manager owns.
pub type FieldSet = BTreeSet<Path>;

/// Fields the server owns; never tracked.
fn ignored(path: &[String]) -> bool {
    match path {
        [a] => a == "apiVersion" || a == "kind",
        [m, f, ..] if m == "metadata" => matches!(
            f.as_str(),
            "name"
                | "namespace"
                | "uid"
                | "resourceVersion"
                | "generation"
                | "creationTimestamp"
                | "managedFields"
                | "deletionTimestamp"
                | "deletionGracePeriodSeconds"
                | "selfLink"
                | "generateName"
        ),
        _ => false,
    }
}

/// The leaf paths of an object (maps recurse; scalars, lists and empty maps are leaves).
pub fn leaf_paths(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    fn walk(v: &Value, path: &mut Path, out: &mut FieldSet) {
        if ignored(path) {
            return;
        }
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, c) in m {
                    path.push(k.clone());
                    walk(c, path, out);
                    path.pop();
                }
            }
            _ if path.is_empty() => {}
            _ => {
                out.insert(path.clone());
            }
        }
    }
    walk(v, &mut Vec::new(), &mut out);
    out
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(m) = cur {
        m.remove(last);
    }
}

/// Encodes a field set as `fieldsV1` (`{"f:spec":{"f:replicas":{}}}`).
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for k in path {
            let entry = cur.entry(format!("f:{k}")).or_insert_with(|| json!({}));
            match entry {
                Value::Object(m) => cur = m,
                _ => break,
            }
        }
    }
    Value::Object(root)
}

/// Decodes `fieldsV1` into leaf paths (keys other than `f:` are skipped).
pub fn from_fields_v1(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    fn walk(v: &Value, path: &mut Path, out: &mut FieldSet) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, c) in children {
            path.push(k[2..].to_string());
            walk(c, path, out);
            path.pop();
        }
    }
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub subresource: String,
    pub api_version: String,
    pub time: String,
    pub fields: FieldSet,
}

pub fn read_entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: e
                .get("manager")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            operation: e
                .get("operation")
                .and_then(Value::as_str)
                .unwrap_or("Update")
                .to_string(),
            subresource: e
                .get("subresource")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            api_version: e
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            time: e
                .get("time")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
        })
        .collect()
}

pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let arr: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut m = json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)});
            if !e.subresource.is_empty() {
                m["subresource"] = json!(e.subresource);
            }
            m
        })
        .collect();
    if obj.is_object() && !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if arr.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

/// Whether two paths overlap (one is a prefix of the other).
fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// An apply that conflicts with other managers' fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflicts(pub Vec<(String, String)>);

impl Conflicts {
    /// The apiserver's message: `Apply failed with 1 conflict: conflict with "m": .spec.replicas`.
    pub fn message(&self) -> String {
        let n = self.0.len();
        let list: Vec<String> = self
            .0
            .iter()
            .map(|(m, f)| format!("conflict with \"{m}\": {f}"))
            .collect();
        format!(
            "Apply failed with {n} conflict{}: {}",
            if n == 1 { "" } else { "s" },
            list.join("\n")
        )
    }
}

fn dotted(p: &[String]) -> String {
    p.iter().map(|s| format!(".{s}")).collect()
}

/// Who is writing, for `managedFields`.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub subresource: &'a str,
    pub api_version: &'a str,
    pub time: &'a str,
}

/// Server-side apply of `applied` onto `live` (or onto nothing for a create). Returns the merged
/// object with its `managedFields` updated, or the conflicts when `force` is false.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    w: &Writer,
    force: bool,
) -> Result<Value, Conflicts> {
    let base = live.cloned().unwrap_or_else(|| json!({}));
    let mut entries = read_entries(&base);
    let set = leaf_paths(applied);
    let mut conflicts = Vec::new();
    for e in &entries {
        if e.manager == w.manager && e.operation == "Apply" && e.subresource == w.subresource {
            continue;
        }
        for p in &set {
            let same = match (get_path(applied, p), get_path(&base, p)) {
                (Some(a), Some(b)) => subset(a, b),
                (None, None) => true,
                _ => false,
            };
            if e.fields.iter().any(|q| overlaps(p, q)) && !same {
                conflicts.push((e.manager.clone(), dotted(p)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort();
        conflicts.dedup();
        return Err(Conflicts(conflicts));
    }
    let mut out = base.clone();
    let idx = entries.iter().position(|e| {
        e.manager == w.manager && e.operation == "Apply" && e.subresource == w.subresource
    });
    let previous = idx.map(|i| entries[i].fields.clone()).unwrap_or_default();
    for gone in previous.difference(&set) {
        let owned_by_other = entries
            .iter()
            .enumerate()
            .any(|(i, e)| Some(i) != idx && e.fields.iter().any(|q| overlaps(q, gone)));
        if !owned_by_other {
            remove_path(&mut out, gone);
        }
    }
    deep_merge(&mut out, applied);
    if force {
        for (i, e) in entries.iter_mut().enumerate() {
            if Some(i) != idx {
                e.fields.retain(|q| {
                    !set.iter().any(|p| {
                        overlaps(p, q)
                            && !matches!((get_path(applied, q), get_path(&base, q)), (Some(a), Some(b)) if subset(a, b))
                    })
                });
            }
        }
    }
    let entry = Entry {
        manager: w.manager.to_string(),
        operation: "Apply".into(),
        subresource: w.subresource.to_string(),
        api_version: w.api_version.to_string(),
        time: w.time.to_string(),
        fields: set,
    };
    match idx {
        Some(i) => entries[i] = entry,
        None => entries.push(entry),
    }
    write_entries(&mut out, &entries);
    Ok(out)
}

/// Whether `a` is contained in `b`: maps by key, lists element-wise, scalars equal. Fields the
/// server defaulted inside `b` are not a difference.
pub fn subset(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x
            .iter()
            .all(|(k, v)| y.get(k).is_some_and(|w| subset(v, w))),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| subset(v, w))
        }
        _ => a == b,
    }
}

/// The key list elements are matched by when merging (`name`, `type`, `key`, ...).
fn element_key(items: &[Value]) -> Option<&'static str> {
    [
        "name",
        "type",
        "key",
        "containerPort",
        "port",
        "mountPath",
        "uid",
    ]
    .into_iter()
    .find(|k| !items.is_empty() && items.iter().all(|i| i.get(*k).is_some()))
}

/// Merges `src` into `dst`: maps recurse; lists of keyed maps merge element-wise by key (in the
/// order of `src`); everything else replaces.
pub fn deep_merge(dst: &mut Value, src: &Value) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                match d.get_mut(k) {
                    Some(dv)
                        if (dv.is_object() && v.is_object()) || (dv.is_array() && v.is_array()) =>
                    {
                        deep_merge(dv, v)
                    }
                    _ => {
                        d.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(d), Value::Array(s)) => match element_key(s) {
            Some(key) if s.iter().all(Value::is_object) => {
                let merged: Vec<Value> = s
                    .iter()
                    .map(
                        |item| match d.iter().find(|x| x.get(key) == item.get(key)) {
                            Some(live) => {
                                let mut l = live.clone();
                                deep_merge(&mut l, item);
                                l
                            }
                            None => item.clone(),
                        },
                    )
                    .collect();
                *d = merged;
            }
            _ => *d = s.clone(),
        },
        (d, s) => *d = s.clone(),
    }
}

/// Records an update (create, PUT, non-apply patch): the writer takes ownership of the fields it
/// changed; fields it removed leave every manager.
pub fn record_update(old: Option<&Value>, new: &mut Value, w: &Writer) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_paths = leaf_paths(new);
    let empty = json!({});
    let old_v = old.unwrap_or(&empty);
    let changed: FieldSet = new_paths
        .iter()
        .filter(|p| get_path(old_v, p) != get_path(new, p))
        .cloned()
        .collect();
    let removed: FieldSet = leaf_paths(old_v).difference(&new_paths).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for e in entries.iter_mut() {
        e.fields.retain(|q| !removed.iter().any(|r| overlaps(q, r)));
        if !(e.manager == w.manager && e.operation == "Update" && e.subresource == w.subresource) {
            e.fields.retain(|q| !changed.contains(q));
        }
    }
    match entries.iter_mut().find(|e| {
        e.manager == w.manager && e.operation == "Update" && e.subresource == w.subresource
    }) {
        Some(e) => {
            e.fields.extend(changed);
            e.time = w.time.to_string();
        }
        None => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: "Update".into(),
            subresource: w.subresource.to_string(),
            api_version: w.api_version.to_string(),
            time: w.time.to_string(),
            fields: changed,
        }),
    }
    write_entries(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(m: &str) -> Writer<'_> {
        Writer {
            manager: m,
            subresource: "",
            api_version: "v1",
            time: "t",
        }
    }

    #[test]
    fn fields_v1_round_trip() {
        let obj = json!({"apiVersion":"v1","metadata":{"name":"x","labels":{"a":"1"}},"spec":{"r":2,"l":[1]}});
        let set = leaf_paths(&obj);
        assert_eq!(set.len(), 3);
        assert_eq!(from_fields_v1(&to_fields_v1(&set)), set);
    }

    #[test]
    fn apply_conflicts_unless_forced_and_removes_dropped_fields() {
        let a = apply(
            None,
            &json!({"metadata":{"name":"x"},"spec":{"r":2,"s":1}}),
            &w("a"),
            false,
        )
        .unwrap();
        assert!(
            apply(Some(&a), &json!({"spec":{"r":2}}), &w("b"), false).is_ok(),
            "same value shares"
        );
        let err = apply(Some(&a), &json!({"spec":{"r":3}}), &w("b"), false).unwrap_err();
        assert_eq!(
            err.message(),
            "Apply failed with 1 conflict: conflict with \"a\": .spec.r"
        );
        let b = apply(Some(&a), &json!({"spec":{"r":3}}), &w("b"), true).unwrap();
        assert_eq!(b.pointer("/spec/r"), Some(&json!(3)));
        // a re-applies without s: s goes; r is now b's, so a's old value does not come back.
        let a2 = apply(Some(&b), &json!({"metadata":{"name":"x"}}), &w("a"), false).unwrap();
        assert_eq!(a2.get("spec"), Some(&json!({"r":3})));
    }

    #[test]
    fn update_moves_ownership() {
        let a = apply(None, &json!({"spec":{"r":2}}), &w("a"), false).unwrap();
        let mut n = a.clone();
        n["spec"]["r"] = json!(5);
        record_update(Some(&a), &mut n, &w("kubectl-edit"));
        let e = read_entries(&n);
        assert!(
            e.iter().all(|e| e.manager != "a"),
            "a lost its only field: {e:?}"
        );
        assert!(apply(Some(&n), &json!({"spec":{"r":2}}), &w("a"), false).is_err());
    }
}
