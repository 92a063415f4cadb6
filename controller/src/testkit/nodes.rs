//! Node builder: a Ready, schedulable Node (110 pods, no cpu or memory, resourceVersion `1`,
//! the hostname label set) refined with `.cpu("4").mem("16Gi").label(..).taint(..)`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{labels, put};

/// Builder of a Ready, schedulable Node.
#[derive(Clone, Debug)]
pub struct NodeBuilder(Node);

/// Start a Node named `name`.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels(&[("kubernetes.io/hostname", name)])),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([(
                "pods".to_string(),
                Quantity("110".into()),
            )])),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    })
}

/// A taint `key=value:effect` without a time (an empty value is no value).
pub fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: Some(value.into()).filter(|v: &String| !v.is_empty()),
        effect: effect.into(),
        time_added: None,
    }
}

impl NodeBuilder {
    fn alloc(mut self, k: &str, v: &str) -> Self {
        if let Some(a) = self.0.status.as_mut().and_then(|s| s.allocatable.as_mut()) {
            a.insert(k.to_string(), Quantity(v.to_string()));
        }
        self
    }
    pub fn cpu(self, v: &str) -> Self {
        self.alloc("cpu", v)
    }
    pub fn mem(self, v: &str) -> Self {
        self.alloc("memory", v)
    }
    pub fn pods(self, n: u32) -> Self {
        self.alloc("pods", &n.to_string())
    }
    pub fn resource(self, name: &str, v: &str) -> Self {
        self.alloc(name, v)
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        put(&mut self.0.metadata.labels, k, v);
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        put(&mut self.0.metadata.annotations, k, v);
        self
    }
    /// Adds `taint` as given (see [`taint`] for one from key, value and effect).
    pub fn taint(mut self, taint: Taint) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.taints.get_or_insert_default().push(taint);
        }
        self
    }
    pub fn unschedulable(mut self) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.unschedulable = Some(true);
        }
        self
    }
    pub fn not_ready(mut self) -> Self {
        if let Some(c) = self.0.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].status = "False".into();
        }
        self
    }
    /// Its deletion accepted (a `deletionTimestamp`), held by a finalizer of its provider.
    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        self.0.metadata.finalizers = Some(vec!["karpenter.sh/termination".into()]);
        self
    }
    pub fn build(self) -> Node {
        self.0
    }
    /// The node as the snapshot parses it (no machine behind it).
    pub fn info(self) -> crate::cluster::NodeInfo {
        crate::cluster::build::parse_node(&self.0).expect("test node parses")
    }
}

impl From<NodeBuilder> for Node {
    fn from(b: NodeBuilder) -> Node {
        b.0
    }
}
