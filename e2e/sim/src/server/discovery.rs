//! Discovery documents: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/{group}[/{version}]`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::registry::ResourceInfo;

pub fn version() -> Value {
    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-ebb-sim", "gitCommit": "ebb-sim",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64"})
}

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

/// group → versions (in first-registered order).
fn groups(all: &[std::sync::Arc<ResourceInfo>]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in all.iter().filter(|r| !r.group.is_empty()) {
        let v = out.entry(r.group.clone()).or_default();
        if !v.contains(&r.version) {
            v.push(r.version.clone());
        }
    }
    out
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": vs, "preferredVersion": preferred})
}

pub fn group_list(all: &[std::sync::Arc<ResourceInfo>]) -> Value {
    let gs: Vec<Value> = groups(all).iter().map(|(g, v)| group_doc(g, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

pub fn group(all: &[std::sync::Arc<ResourceInfo>], group: &str) -> Option<Value> {
    let gs = groups(all);
    let vs = gs.get(group)?;
    let mut d = group_doc(group, vs);
    d["kind"] = json!("APIGroup");
    d["apiVersion"] = json!("v1");
    Some(d)
}

pub fn resource_list(
    all: &[std::sync::Arc<ResourceInfo>],
    group: &str,
    version: &str,
) -> Option<Value> {
    let rs: Vec<&std::sync::Arc<ResourceInfo>> = all
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let resources: Vec<Value> = rs.iter().flat_map(|r| r.discovery_entries()).collect();
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
