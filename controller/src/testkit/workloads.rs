//! Owners and budgets in namespace `default`: ReplicaSets, StatefulSets, DaemonSets and
//! PodDisruptionBudgets.

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, ReplicaSet, ReplicaSetSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::selector;

/// Metadata naming `name` in namespace `default`.
fn default_meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..Default::default()
    }
}

/// A PodDisruptionBudget in `default` selecting `key=value` with `minAvailable`.
pub fn pdb_min_available(name: &str, key: &str, value: &str, min: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: default_meta(name),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(min)),
            selector: Some(selector(key, value)),
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
