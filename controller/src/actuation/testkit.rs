//! Builders of Nodes and Pods for the actuator's and controller's tests:
//! `node("n1").label("pool", "a").build()`, `pod("web-1").on("n1").owned_by("ReplicaSet", "web")`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, PodSpec, PodStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// A Node under construction.
pub struct NodeBuilder(Node);

/// Start a Node named `name`.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: None,
    })
}

impl NodeBuilder {
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
        self
    }
    pub fn taint(mut self, taint: Taint) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.taints.get_or_insert_with(Vec::new).push(taint);
        }
        self
    }
    pub fn unschedulable(mut self) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.unschedulable = Some(true);
        }
        self
    }
    pub fn build(self) -> Node {
        self.0
    }
}

/// A Pod under construction (namespace `default`, phase `Running`).
pub struct PodBuilder(Pod);

/// Start a Pod named `name` in namespace `default`.
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder(Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    })
}

impl PodBuilder {
    pub fn ns(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.to_string());
        self
    }
    pub fn on(mut self, node: &str) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.node_name = Some(node.to_string());
        }
        self
    }
    pub fn owned_by(mut self, kind: &str, name: &str) -> Self {
        self.0.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.to_string(),
            name: name.to_string(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            ..Default::default()
        }]);
        self
    }
    pub fn grace(mut self, seconds: i64) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.termination_grace_period_seconds = Some(seconds);
        }
        self
    }
    pub fn phase(mut self, phase: &str) -> Self {
        if let Some(status) = self.0.status.as_mut() {
            status.phase = Some(phase.to_string());
        }
        self
    }
    pub fn mirror(mut self) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert("kubernetes.io/config.mirror".into(), "x".into());
        self
    }
    pub fn build(self) -> Pod {
        self.0
    }
}
