//! What the caches keep of each object: every watched object is cut down to the fields some
//! reader of the caches uses before it is stored, so a cache costs what ebb reads, not the object.
//!
//! Every kind loses `metadata.managedFields` and the annotation
//! `kubectl.kubernetes.io/last-applied-configuration` (a copy of the whole object). Beyond that:
//!
//! | kind | kept | read by |
//! | --- | --- | --- |
//! | Pod | decoded into [`CachedPod`], which has fields only for what ebb reads; [`CachedPod::trim`] drops the rest (its module lists what is kept) | |
//! | Node | `metadata`: name, uid, resourceVersion, labels, annotations, deletionTimestamp; `spec`: taints (whole), unschedulable, providerID; `status`: allocatable, capacity, conditions (type, status, reason) | the model; taint and cordon patches (resourceVersion preconditions, the whole taint list); readiness |
//! | ReplicaSet, StatefulSet, ReplicationController | `metadata` (name, namespace, uid, resourceVersion, ownerReferences); `spec.replicas` | the pods each owner wants |
//! | Job | the same metadata; `spec.parallelism` | the same |
//! | DaemonSet | the same metadata; `status.desiredNumberScheduled` | the same |
//! | PodDisruptionBudget | whole | budgets (selector, rule, status with disrupted pods); few objects |
//! | PersistentVolume, PersistentVolumeClaim, StorageClass | whole | local volumes, their claims and binding modes |
//! | NodeState | whole | placement reads its status broadly; one per node |
//! | providers (MachineSet, MachineDeployment, NodeClaim) | whole | the provider index; few objects |
//!
//! A new reader of a dropped field must keep it here first; `trim_tests` checks that every
//! reader of the caches sees the same on a trimmed object as on the whole one.

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, ReplicaSet, ReplicaSetSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeSpec, NodeStatus, ReplicationController, ReplicationControllerSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation `kubectl apply` keeps a copy of the whole object in.
use crate::cluster::CachedPod;
use crate::cluster::build::LAST_APPLIED;
use crate::cluster::cached_pod::trim_meta;

/// A kind the caches store trimmed.
pub trait Trim {
    /// Cuts the object down to what the readers of its cache use.
    fn trim(&mut self);

    /// Brings the object's times that ebb compares with its own clock to that clock, `now`
    /// being when the watch delivered it. Nothing by default.
    fn seen_at(&mut self, _now: jiff::Timestamp) {}
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

impl Trim for CachedPod {
    fn trim(&mut self) {
        CachedPod::trim(self);
    }

    fn seen_at(&mut self, now: jiff::Timestamp) {
        self.scheduled_no_later_than(now);
    }
}

impl Trim for Node {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata);
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
