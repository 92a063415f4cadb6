//! What the caches keep of each object: every watched object is cut down to the fields some
//! reader of the caches uses before it is stored, so a cache costs what ebb reads, not the object.
//!
//! Every kind loses `metadata.managedFields` and the annotation
//! `kubectl.kubernetes.io/last-applied-configuration` (a copy of the whole object). Beyond that:
//!
//! | kind | kept | read by |
//! | --- | --- | --- |
//! | Pod | `metadata`: name, namespace, uid, resourceVersion, labels, annotations, ownerReferences, creationTimestamp, deletionTimestamp | everything that names a pod; annotations: drainability, placement tokens; owners: the model, drains; creation: whether the steering webhook was called for a new pod |
//! | | `spec`: nodeName, affinity (whole), nodeSelector, tolerations, topologySpreadConstraints, schedulingGates, overhead, resources, terminationGracePeriodSeconds | the model's scheduling requirements; placement's patches (they rewrite affinity and gates from the cached pod); evictions (grace) |
//! | | `spec.containers`, `spec.initContainers`: name, resources.requests, restartPolicy (sidecars), ports with a hostPort | effective requests, host ports |
//! | | `spec.volumes`: name with hostPath, emptyDir and persistentVolumeClaim; other volumes dropped | local storage, volumes pinned to a node |
//! | | `status`: phase, reason, nominatedNodeName, startTime, conditions Ready, PodScheduled and DisruptionTarget (type, status, reason; PodScheduled's time) | terminal and ready pods, nodes that just received pods, budgets' health, nominations, when a pod started, placement's end classification (DisruptionTarget, Evicted, NodeLost) |
//! | | `status.containerStatuses`, `status.initContainerStatuses` of terminated containers only: name, ready, state.terminated (exitCode, reason, startedAt, finishedAt) | placement's end classification (exit code, OOMKilled, how long it ran) |
//! | Node | `metadata`: name, uid, resourceVersion, labels, annotations, deletionTimestamp; `spec`: taints (whole), unschedulable, providerID; `status`: allocatable, capacity, conditions (type, status, reason) | the model; taint and cordon patches (resourceVersion preconditions, the whole taint list); readiness |
//! | ReplicaSet, StatefulSet, ReplicationController | `metadata` (name, namespace, uid, resourceVersion, ownerReferences); `spec.replicas` | the pods each owner wants |
//! | Job | the same metadata; `spec.parallelism` | the same |
//! | DaemonSet | the same metadata; `status.desiredNumberScheduled` | the same |
//! | PodDisruptionBudget | whole | budgets (selector, rule, status with disrupted pods); few objects |
//! | PersistentVolume, PersistentVolumeClaim, StorageClass | whole | local volumes, their claims and binding modes |
//! | NodeState | whole | placement reads its status broadly; one per node |
//! | providers (MachineSet, MachineDeployment, NodeClaim) | whole | the provider index; few objects |
//!
//! Dropped from pods, for example: container images, commands, env, probes, volume mounts,
//! security contexts, the service account's projected volume, pod and host IPs, QoS class, the
//! statuses of running containers, the conditions no reader uses (Initialized, ContainersReady,
//! PodReadyToStartContainers), condition messages and times. A new reader of a dropped field
//! must keep it here first; `trim_tests` checks that every reader of the caches sees the same on
//! a trimmed object as on the whole one.

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, ReplicaSet, ReplicaSetSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, Node, NodeCondition, NodeSpec, NodeStatus, Pod,
    PodCondition, PodSpec, PodStatus, ReplicationController, ReplicationControllerSpec,
    ResourceRequirements, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation `kubectl apply` keeps a copy of the whole object in.
use crate::cluster::build::LAST_APPLIED;

/// A kind the caches store trimmed.
pub trait Trim {
    /// Cuts the object down to what the readers of its cache use.
    fn trim(&mut self);
}

/// The metadata every reader uses: identity, labels, annotations, owners, deletion.
fn meta(m: &mut ObjectMeta) {
    let annotations = m.annotations.take().map(|mut a| {
        a.remove(LAST_APPLIED);
        a
    });
    *m = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        labels: m.labels.take(),
        annotations,
        owner_references: m.owner_references.take(),
        // Steering judges whether the webhook was called for a pod just created.
        creation_timestamp: m.creation_timestamp.take(),
        deletion_timestamp: m.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

/// A workload owner's metadata: identity and its own owners.
fn owner_meta(m: &mut ObjectMeta) {
    *m = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        owner_references: m.owner_references.take(),
        deletion_timestamp: m.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

/// A container's name, requests, restart policy (sidecars) and host ports.
fn container(c: &mut Container) {
    let requests = c.resources.as_mut().and_then(|r| r.requests.take());
    let ports = c
        .ports
        .take()
        .map(|p| {
            p.into_iter()
                .filter(|p| p.host_port.is_some_and(|h| h > 0))
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty());
    *c = Container {
        name: std::mem::take(&mut c.name),
        resources: requests.map(|r| ResourceRequirements {
            requests: Some(r),
            ..ResourceRequirements::default()
        }),
        restart_policy: c.restart_policy.take(),
        ports,
        ..Container::default()
    };
}

/// The volumes that say something about local storage or a claim; others are dropped.
fn volumes(v: Option<Vec<Volume>>) -> Option<Vec<Volume>> {
    let kept: Vec<Volume> = v
        .into_iter()
        .flatten()
        .filter(|v| {
            v.host_path.is_some() || v.empty_dir.is_some() || v.persistent_volume_claim.is_some()
        })
        .map(|v| Volume {
            name: v.name,
            host_path: v.host_path,
            empty_dir: v.empty_dir,
            persistent_volume_claim: v.persistent_volume_claim,
            ..Volume::default()
        })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

fn pod_spec(s: &mut PodSpec) {
    let mut containers = std::mem::take(&mut s.containers);
    containers.iter_mut().for_each(container);
    let init_containers = s.init_containers.take().map(|mut cs| {
        cs.iter_mut().for_each(container);
        cs
    });
    *s = PodSpec {
        node_name: s.node_name.take(),
        containers,
        init_containers,
        volumes: volumes(s.volumes.take()),
        affinity: s.affinity.take(),
        node_selector: s.node_selector.take(),
        tolerations: s.tolerations.take(),
        topology_spread_constraints: s.topology_spread_constraints.take(),
        scheduling_gates: s.scheduling_gates.take(),
        overhead: s.overhead.take(),
        resources: s.resources.take(),
        termination_grace_period_seconds: s.termination_grace_period_seconds.take(),
        ..PodSpec::default()
    };
}

/// A container status's name, readiness and how it terminated.
fn container_status(c: ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: c.name,
        ready: c.ready,
        state: c.state.and_then(|s| s.terminated).map(|t| ContainerState {
            terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                exit_code: t.exit_code,
                reason: t.reason,
                started_at: t.started_at,
                finished_at: t.finished_at,
                ..Default::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

/// The pod conditions some reader uses: readiness (budgets' health, placement), when the pod was
/// bound (`PodScheduled`), and whether a disruption ended it (`DisruptionTarget`).
const POD_CONDITIONS: [&str; 3] = ["Ready", "PodScheduled", "DisruptionTarget"];

fn pod_status(s: &mut PodStatus) {
    // Only terminated containers say anything to a reader (how a pod ended); a running pod's
    // statuses (752 bytes each in memory, before their strings) are dropped.
    let statuses = |v: Option<Vec<ContainerStatus>>| {
        v.map(|v| {
            v.into_iter()
                .filter(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
                .map(container_status)
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty())
    };
    *s = PodStatus {
        phase: s.phase.take(),
        reason: s.reason.take(),
        nominated_node_name: s.nominated_node_name.take(),
        start_time: s.start_time.take(),
        conditions: s.conditions.take().map(|cs| {
            cs.into_iter()
                .filter(|c| POD_CONDITIONS.contains(&c.type_.as_str()))
                .map(|c| PodCondition {
                    // When the scheduler bound the pod: nodes that just received pods stay.
                    last_transition_time: (c.type_ == "PodScheduled")
                        .then_some(c.last_transition_time)
                        .flatten(),
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    ..PodCondition::default()
                })
                .collect()
        }),
        container_statuses: statuses(s.container_statuses.take()),
        init_container_statuses: statuses(s.init_container_statuses.take()),
        ..PodStatus::default()
    };
}

impl Trim for Pod {
    fn trim(&mut self) {
        meta(&mut self.metadata);
        if let Some(s) = self.spec.as_mut() {
            pod_spec(s);
        }
        if let Some(s) = self.status.as_mut() {
            pod_status(s);
        }
    }
}

impl Trim for Node {
    fn trim(&mut self) {
        meta(&mut self.metadata);
        if let Some(s) = self.spec.as_mut() {
            *s = NodeSpec {
                taints: s.taints.take(),
                unschedulable: s.unschedulable.take(),
                provider_id: s.provider_id.take(),
                ..NodeSpec::default()
            };
        }
        if let Some(s) = self.status.as_mut() {
            *s = NodeStatus {
                allocatable: s.allocatable.take(),
                capacity: s.capacity.take(),
                conditions: s.conditions.take().map(|cs| {
                    cs.into_iter()
                        .map(|c| NodeCondition {
                            type_: c.type_,
                            status: c.status,
                            reason: c.reason,
                            ..NodeCondition::default()
                        })
                        .collect()
                }),
                ..NodeStatus::default()
            };
        }
    }
}

impl Trim for ReplicaSet {
    fn trim(&mut self) {
        owner_meta(&mut self.metadata);
        self.spec = self.spec.take().map(|s| ReplicaSetSpec {
            replicas: s.replicas,
            ..ReplicaSetSpec::default()
        });
        self.status = None;
    }
}

impl Trim for StatefulSet {
    fn trim(&mut self) {
        owner_meta(&mut self.metadata);
        self.spec = self.spec.take().map(|s| StatefulSetSpec {
            replicas: s.replicas,
            ..StatefulSetSpec::default()
        });
        self.status = None;
    }
}

impl Trim for ReplicationController {
    fn trim(&mut self) {
        owner_meta(&mut self.metadata);
        self.spec = self.spec.take().map(|s| ReplicationControllerSpec {
            replicas: s.replicas,
            ..ReplicationControllerSpec::default()
        });
        self.status = None;
    }
}

impl Trim for Job {
    fn trim(&mut self) {
        owner_meta(&mut self.metadata);
        self.spec = self.spec.take().map(|s| JobSpec {
            parallelism: s.parallelism,
            ..JobSpec::default()
        });
        self.status = None;
    }
}

impl Trim for DaemonSet {
    fn trim(&mut self) {
        owner_meta(&mut self.metadata);
        self.spec = None;
        self.status = self.status.take().map(|s| DaemonSetStatus {
            desired_number_scheduled: s.desired_number_scheduled,
            ..DaemonSetStatus::default()
        });
    }
}

/// Kinds kept whole but for managed fields and the last-applied copy.
macro_rules! whole {
    ($($kind:ty),*) => {$(
        impl Trim for $kind {
            fn trim(&mut self) {
                let m = &mut self.metadata;
                m.managed_fields = None;
                if let Some(a) = m.annotations.as_mut() {
                    a.remove(LAST_APPLIED);
                }
            }
        }
    )*};
}

whole!(
    k8s_openapi::api::policy::v1::PodDisruptionBudget,
    k8s_openapi::api::core::v1::PersistentVolume,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
    k8s_openapi::api::storage::v1::StorageClass,
    ebb_api::nodestate::NodeState,
    kube::api::DynamicObject
);
