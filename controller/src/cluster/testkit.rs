//! Short builders of Kubernetes objects for tests, benchmarks and examples:
//! `node("n1").cpu("4").mem("16Gi")`, `pod("web-1").on("n1").cpu("500m").owned_by_rs("web")`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, ReplicaSet, ReplicaSetSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, HostPathVolumeSource, Node,
    NodeCondition, NodeSpec, NodeStatus, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm,
    PodAntiAffinity, PodCondition, PodSpec, PodStatus, ResourceRequirements, Taint, Toleration,
    Volume,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Builder of a Ready, schedulable Node (defaults: 110 pods, no cpu or memory).
#[derive(Clone, Debug)]
pub struct NodeBuilder(Node);

pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels(&[("kubernetes.io/hostname", name)])),
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
        self.0
            .metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.taints.get_or_insert_default().push(Taint {
                key: key.into(),
                value: Some(value.into()).filter(|v: &String| !v.is_empty()),
                effect: effect.into(),
                time_added: None,
            });
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
    pub fn build(self) -> Node {
        self.0
    }
}

impl From<NodeBuilder> for Node {
    fn from(b: NodeBuilder) -> Node {
        b.0
    }
}

/// Builder of a Running, Ready pod in namespace `default` (uid: `uid-<namespace>-<name>`).
#[derive(Clone, Debug)]
pub struct PodBuilder(Pod);

pub fn pod(name: &str) -> PodBuilder {
    PodBuilder(Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-default-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::new()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    })
}

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_default()
    }
    fn request(mut self, k: &str, v: &str) -> Self {
        if let Some(r) = self.spec().containers[0]
            .resources
            .get_or_insert_default()
            .requests
            .as_mut()
        {
            r.insert(k.into(), Quantity(v.into()));
        }
        self
    }
    pub fn ns(mut self, ns: &str) -> Self {
        let name = self.0.metadata.name.clone().unwrap_or_default();
        self.0.metadata.namespace = Some(ns.into());
        self.0.metadata.uid = Some(format!("uid-{ns}-{name}"));
        self
    }
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }
    pub fn on(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }
    pub fn cpu(self, v: &str) -> Self {
        self.request("cpu", v)
    }
    pub fn mem(self, v: &str) -> Self {
        self.request("memory", v)
    }
    pub fn resource(self, name: &str, v: &str) -> Self {
        self.request(name, v)
    }
    /// Adds an init container requesting this cpu (and nothing else).
    pub fn init_cpu(mut self, v: &str, sidecar: bool) -> Self {
        let n = self.spec().init_containers.get_or_insert_default().len();
        self.spec()
            .init_containers
            .get_or_insert_default()
            .push(Container {
                name: format!("init-{n}"),
                restart_policy: sidecar.then(|| "Always".to_string()),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".to_string(), Quantity(v.into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            });
        self
    }
    pub fn overhead_cpu(mut self, v: &str) -> Self {
        self.spec().overhead = Some(BTreeMap::from([("cpu".to_string(), Quantity(v.into()))]));
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    pub fn owned_by(mut self, kind: &str, name: &str) -> Self {
        let api_version = match kind {
            "Job" => "batch/v1",
            "ReplicationController" => "v1",
            _ => "apps/v1",
        };
        self.0.metadata.owner_references = Some(vec![OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{kind}-{name}"),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        self
    }
    pub fn owned_by_rs(self, name: &str) -> Self {
        self.owned_by("ReplicaSet", name)
    }
    pub fn owned_by_ds(self, name: &str) -> Self {
        self.owned_by("DaemonSet", name)
    }
    pub fn mirror(self) -> Self {
        self.annotation("kubernetes.io/config.mirror", "hash")
    }
    pub fn phase(mut self, phase: &str) -> Self {
        if let Some(s) = self.0.status.as_mut() {
            s.phase = Some(phase.into());
        }
        self
    }
    pub fn not_ready(mut self) -> Self {
        if let Some(c) = self.0.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].status = "False".into();
        }
        self
    }
    pub fn terminating(mut self) -> Self {
        self.0.metadata.deletion_timestamp =
            Some(Time("2026-01-01T00:00:00Z".parse().unwrap_or_default()));
        self
    }
    pub fn node_selector(mut self, k: &str, v: &str) -> Self {
        self.spec()
            .node_selector
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    /// Required node affinity with one term holding one expression.
    pub fn node_affinity(mut self, key: &str, op: &str, values: &[&str]) -> Self {
        use k8s_openapi::api::core::v1::{
            NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        };
        let req = NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        let term = if key == "metadata.name" {
            NodeSelectorTerm {
                match_fields: Some(vec![req]),
                ..Default::default()
            }
        } else {
            NodeSelectorTerm {
                match_expressions: Some(vec![req]),
                ..Default::default()
            }
        };
        self.spec().affinity.get_or_insert_default().node_affinity = Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![term],
            }),
            ..Default::default()
        });
        self
    }
    pub fn tolerate(mut self, key: &str, effect: &str) -> Self {
        self.spec()
            .tolerations
            .get_or_insert_default()
            .push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()).filter(|e: &String| !e.is_empty()),
                ..Default::default()
            });
        self
    }
    pub fn host_port(mut self, port: i32) -> Self {
        self.spec().containers[0]
            .ports
            .get_or_insert_default()
            .push(ContainerPort {
                container_port: port,
                host_port: Some(port),
                ..Default::default()
            });
        self
    }
    /// Required anti-affinity against pods with label `key=value`, by `topology_key`.
    pub fn anti_affinity(mut self, key: &str, value: &str, topology_key: &str) -> Self {
        let term = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(labels(&[(key, value)])),
                ..Default::default()
            }),
            topology_key: topology_key.into(),
            ..Default::default()
        };
        let aff: &mut Affinity = self.spec().affinity.get_or_insert_default();
        aff.pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(term);
        self
    }
    /// Required affinity to pods with label `key=value`, by `topology_key`.
    pub fn affinity(mut self, key: &str, value: &str, topology_key: &str) -> Self {
        let term = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(labels(&[(key, value)])),
                ..Default::default()
            }),
            topology_key: topology_key.into(),
            ..Default::default()
        };
        self.spec()
            .affinity
            .get_or_insert_default()
            .pod_affinity
            .get_or_insert_default()
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(term);
        self
    }
    /// Hard topology spread over pods with label `key=value`.
    pub fn spread(mut self, key: &str, value: &str, topology_key: &str, max_skew: i32) -> Self {
        self.spec()
            .topology_spread_constraints
            .get_or_insert_default()
            .push(k8s_openapi::api::core::v1::TopologySpreadConstraint {
                label_selector: Some(LabelSelector {
                    match_labels: Some(labels(&[(key, value)])),
                    ..Default::default()
                }),
                max_skew,
                topology_key: topology_key.into(),
                when_unsatisfiable: "DoNotSchedule".into(),
                ..Default::default()
            });
        self
    }
    pub fn empty_dir(mut self, memory: bool) -> Self {
        self.spec().volumes.get_or_insert_default().push(Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: memory.then(|| "Memory".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        });
        self
    }
    pub fn host_path(mut self, path: &str) -> Self {
        self.spec().volumes.get_or_insert_default().push(Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.into(),
                type_: None,
            }),
            ..Default::default()
        });
        self
    }
    pub fn pvc(mut self, claim: &str) -> Self {
        self.spec().volumes.get_or_insert_default().push(Volume {
            name: claim.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Default::default()
        });
        self
    }
    pub fn build(self) -> Pod {
        self.0
    }
}

impl From<PodBuilder> for Pod {
    fn from(b: PodBuilder) -> Pod {
        b.0
    }
}

/// A PodDisruptionBudget in `default` selecting `key=value` with `minAvailable`.
pub fn pdb_min_available(name: &str, key: &str, value: &str, min: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: default_meta(name),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(min)),
            selector: Some(LabelSelector {
                match_labels: Some(labels(&[(key, value)])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A ReplicaSet in `default` wanting `replicas`.
pub fn replica_set(name: &str, replicas: i32) -> ReplicaSet {
    ReplicaSet {
        metadata: default_meta(name),
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            ..Default::default()
        }),
        status: None,
    }
}

/// A StatefulSet in `default` wanting `replicas`.
pub fn stateful_set(name: &str, replicas: i32) -> StatefulSet {
    StatefulSet {
        metadata: default_meta(name),
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            ..Default::default()
        }),
        status: None,
    }
}

/// A DaemonSet in `default` scheduled on `desired` nodes.
pub fn daemon_set(name: &str, desired: i32) -> DaemonSet {
    DaemonSet {
        metadata: default_meta(name),
        spec: None,
        status: Some(DaemonSetStatus {
            desired_number_scheduled: desired,
            ..Default::default()
        }),
    }
}

/// Objects from nodes and pods, with every owner the pods reference created wanting as many
/// replicas as reference it (DaemonSets: as many as scheduled).
pub fn objects(
    nodes: impl IntoIterator<Item = impl Into<Node>>,
    pods: impl IntoIterator<Item = impl Into<Pod>>,
) -> super::ClusterObjects {
    let nodes: Vec<Node> = nodes.into_iter().map(Into::into).collect();
    let pods: Vec<Pod> = pods.into_iter().map(Into::into).collect();
    let mut owners: BTreeMap<(String, String, String), i32> = BTreeMap::new();
    for p in &pods {
        for o in p.metadata.owner_references.iter().flatten() {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            *owners
                .entry((o.kind.clone(), ns, o.name.clone()))
                .or_insert(0) += 1;
        }
    }
    let mut out = super::ClusterObjects {
        nodes,
        pods,
        ..Default::default()
    };
    for ((kind, ns, name), n) in owners {
        let meta = ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            ..Default::default()
        };
        match kind.as_str() {
            "ReplicaSet" => out.replica_sets.push(ReplicaSet {
                metadata: meta,
                ..replica_set(&name, n)
            }),
            "StatefulSet" => out.stateful_sets.push(StatefulSet {
                metadata: meta,
                ..stateful_set(&name, n)
            }),
            "DaemonSet" => out.daemon_sets.push(DaemonSet {
                metadata: meta,
                ..daemon_set(&name, n)
            }),
            "Job" => out.jobs.push(k8s_openapi::api::batch::v1::Job {
                metadata: meta,
                spec: Some(k8s_openapi::api::batch::v1::JobSpec {
                    parallelism: Some(n),
                    ..Default::default()
                }),
                status: None,
            }),
            _ => {}
        }
    }
    out
}

/// Builds a snapshot from [`objects`]; panics on invalid input (tests only).
pub fn snapshot(
    nodes: impl IntoIterator<Item = impl Into<Node>>,
    pods: impl IntoIterator<Item = impl Into<Pod>>,
) -> super::ClusterSnapshot {
    match super::build_snapshot(&objects(nodes, pods)) {
        Ok(s) => s,
        Err(e) => panic!("test snapshot is invalid: {e}"),
    }
}

/// Metadata naming `name` in namespace `default`.
fn default_meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..Default::default()
    }
}

/// A NodeState for `node` whose agent reports `roles` (PlacementHistory name, role) of
/// namespace `default` localized, plus one fetch still running (not warm).
pub fn node_state_warm(node: &str, roles: &[(&str, &str)]) -> ebb_api::nodestate::NodeState {
    use ebb_api::nodestate::{LocalizedResource, NodeState, NodeStateSpec, NodeStateStatus};
    let res = |ph: &str, role: &str, state: &str| LocalizedResource {
        namespace: "default".into(),
        placement_history: ph.into(),
        role: role.into(),
        name: "data".into(),
        size_bytes: 1 << 20,
        state: state.into(),
        message: None,
    };
    let mut localized: Vec<LocalizedResource> = roles
        .iter()
        .map(|(ph, role)| res(ph, role, "Localized"))
        .collect();
    localized.push(res("other", "fetching", "Fetching"));
    let mut st = NodeState::new(
        node,
        NodeStateSpec {
            node_name: node.into(),
        },
    );
    st.status = Some(NodeStateStatus {
        localized,
        ..Default::default()
    });
    st
}
