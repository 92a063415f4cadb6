//! Scenarios: a small YAML format describing a cluster — objects to preload plus generators for
//! nodes and deployments (with PodDisruptionBudgets) — loaded into a running simulator.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{Api, Ctx};
use crate::error::ApiError;

/// A scenario file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Any objects, created in order (put CustomResourceDefinitions before their objects).
    #[serde(default)]
    pub objects: Vec<Value>,
    /// Node generators.
    #[serde(default)]
    pub nodes: OneOrMany<NodeGen>,
    /// Deployment generators.
    #[serde(default)]
    pub deployments: OneOrMany<DeploymentGen>,
}

/// A single generator or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> Default for OneOrMany<T> {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl<T: Clone> OneOrMany<T> {
    pub fn to_vec(&self) -> Vec<T> {
        match self {
            Self::One(t) => vec![t.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

fn default_prefix_node() -> String {
    "node-".into()
}
fn default_prefix_deploy() -> String {
    "app-".into()
}
fn default_cpu() -> String {
    "4".into()
}
fn default_memory() -> String {
    "16Gi".into()
}
fn default_pods() -> i64 {
    110
}
fn default_ns() -> String {
    "default".into()
}
fn one() -> i64 {
    1
}

/// `count` nodes named `<namePrefix><i>` with the given allocatable resources.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGen {
    pub count: usize,
    #[serde(default = "default_prefix_node")]
    pub name_prefix: String,
    #[serde(default = "default_cpu")]
    pub cpu: String,
    #[serde(default = "default_memory")]
    pub memory: String,
    #[serde(default = "default_pods")]
    pub pods: i64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<Value>,
}

/// `count` Deployments named `<namePrefix><i>` with `replicas` pods requesting `requests`, and
/// optionally a PodDisruptionBudget (`{minAvailable: N}` or `{maxUnavailable: N}`) each.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeploymentGen {
    pub count: usize,
    #[serde(default = "default_prefix_deploy")]
    pub name_prefix: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
    #[serde(default = "one")]
    pub replicas: i64,
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub pdb: Option<Value>,
    /// Extra pod annotations (for scripted kubelet outcomes).
    #[serde(default)]
    pub pod_annotations: BTreeMap<String, String>,
}

/// Why a scenario did not load.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("the scenario is not valid YAML for the scenario format: {0}")]
    Parse(String),
    #[error(
        "objects[{index}] has no apiVersion/kind the simulator serves ({api_version} {kind}); create its CRD first"
    )]
    UnknownKind {
        index: usize,
        api_version: String,
        kind: String,
    },
    #[error("cannot create {what}: {source}")]
    Create { what: String, source: ApiError },
}

impl Scenario {
    pub fn from_yaml(text: &str) -> Result<Self, ScenarioError> {
        serde_saphyr::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))
    }

    /// A scenario of plain manifests: a multi-document YAML stream of objects (as for
    /// `kubectl apply -f`); empty documents are skipped.
    pub fn from_manifests(text: &str) -> Result<Self, ScenarioError> {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        Ok(Self {
            objects: docs.into_iter().filter(|d| d.is_object()).collect(),
            ..Self::default()
        })
    }

    /// Creates everything; returns the number of objects created.
    pub fn load(&self, api: &Api) -> Result<usize, ScenarioError> {
        let ctx = Ctx::system("scenario");
        let mut n = 0;
        for (i, o) in self.objects.iter().enumerate() {
            let av = o.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            let kind = o.get("kind").and_then(Value::as_str).unwrap_or("");
            let (g, v) = av.rsplit_once('/').unwrap_or(("", av));
            let ri = api
                .all_resources()
                .into_iter()
                .find(|r| r.group == g && r.version == v && r.kind == kind)
                .ok_or_else(|| ScenarioError::UnknownKind {
                    index: i,
                    api_version: av.into(),
                    kind: kind.into(),
                })?;
            let ns = o
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or(if ri.namespaced { "default" } else { "" });
            let name = o
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            api.create(&ctx, &ri, ns, o.clone())
                .map_err(|source| ScenarioError::Create {
                    what: format!("objects[{i}] {kind} {name}"),
                    source,
                })?;
            n += 1;
        }
        let nodes = api.resolve("", "v1", "nodes");
        let deploys = api.resolve("apps", "v1", "deployments");
        let pdbs = api.resolve("policy", "v1", "poddisruptionbudgets");
        let namespaces = api.resolve("", "v1", "namespaces");
        let (Some(nodes), Some(deploys), Some(pdbs), Some(namespaces)) =
            (nodes, deploys, pdbs, namespaces)
        else {
            return Ok(n);
        };
        let mut made = 0usize;
        for g in self.nodes.to_vec() {
            for i in 0..g.count {
                let name = format!("{}{i}", g.name_prefix);
                api.create(&ctx, &nodes, "", node_object(&name, &g, made))
                    .map_err(|source| ScenarioError::Create {
                        what: format!("node {name}"),
                        source,
                    })?;
                made += 1;
                n += 1;
                if made.is_multiple_of(1000) {
                    tracing::info!(nodes = made, "scenario: creating nodes");
                }
            }
        }
        for g in self.deployments.to_vec() {
            if api.get(&namespaces, "", &g.namespace).is_err() {
                api.create(
                    &ctx,
                    &namespaces,
                    "",
                    json!({"metadata": {"name": g.namespace}}),
                )
                .map_err(|source| ScenarioError::Create {
                    what: format!("namespace {}", g.namespace),
                    source,
                })?;
            }
            for i in 0..g.count {
                let name = format!("{}{i}", g.name_prefix);
                let mut labels: serde_json::Map<String, Value> = g
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                labels.insert("app".into(), json!(name));
                let d = json!({"metadata": {"name": name, "namespace": g.namespace, "labels": labels},
                    "spec": {"replicas": g.replicas, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": labels, "annotations": g.pod_annotations},
                            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": g.requests}}]}}}});
                api.create(&ctx, &deploys, &g.namespace, d)
                    .map_err(|source| ScenarioError::Create {
                        what: format!("deployment {}/{name}", g.namespace),
                        source,
                    })?;
                n += 1;
                if let Some(p) = &g.pdb {
                    let mut spec = p.clone();
                    spec["selector"] = json!({"matchLabels": {"app": name}});
                    api.create(
                        &ctx,
                        &pdbs,
                        &g.namespace,
                        json!({"metadata": {"name": name, "namespace": g.namespace}, "spec": spec}),
                    )
                    .map_err(|source| ScenarioError::Create {
                        what: format!("pdb {}/{name}", g.namespace),
                        source,
                    })?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

/// A Ready node with capacity and allocatable set.
pub fn node_object(name: &str, g: &NodeGen, index: usize) -> Value {
    let mut labels: serde_json::Map<String, Value> = g
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    labels.insert("kubernetes.io/hostname".into(), json!(name));
    labels.insert("kubernetes.io/os".into(), json!("linux"));
    let res = json!({"cpu": g.cpu, "memory": g.memory, "pods": g.pods.to_string(), "ephemeral-storage": "100Gi"});
    json!({"metadata": {"name": name, "labels": labels},
        "spec": {"taints": g.taints},
        "status": {"capacity": res, "allocatable": res,
            "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", 1 + index / 65536, (index / 256) % 256, index % 256)},
                {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-ebb-sim", "osImage": "ebb-sim", "architecture": "amd64",
                "operatingSystem": "linux", "containerRuntimeVersion": "sim://1", "kernelVersion": "6.0",
                "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
            "conditions": []}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_and_list_generators() {
        let s = Scenario::from_yaml("nodes: {count: 2, cpu: '8', labels: {pool: a}}\ndeployments:\n- {count: 1, replicas: 3, requests: {cpu: 100m}, pdb: {minAvailable: 2}}\n").unwrap();
        assert_eq!(s.nodes.to_vec()[0].count, 2);
        assert_eq!(s.nodes.to_vec()[0].cpu, "8");
        assert_eq!(s.deployments.to_vec()[0].replicas, 3);
        assert!(Scenario::from_yaml("nodes: {count: 1, colour: red}").is_err());
    }
}
