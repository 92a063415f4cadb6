//! Workload owners (ReplicaSets, StatefulSets, ReplicationControllers, Jobs, DaemonSets) and
//! how many pods each wants, by (kind, namespace, name).

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ClusterObjects;
use crate::cluster::model::OwnerInfo;

/// Owners by (kind, namespace, name).
pub(super) type OwnerIndex = HashMap<(String, String, String), OwnerInfo>;

/// Every owner in `objects` with the pods it wants: replicas (1 when unset), a Job's
/// parallelism (1 when unset), a DaemonSet's scheduled count (0 without status).
pub(super) fn owner_index(objects: &ClusterObjects) -> OwnerIndex {
    let replicas = |r: Option<i32>| i64::from(r.unwrap_or(1));
    let mut owners = HashMap::new();
    for o in &objects.replica_sets {
        let want = replicas(o.spec.as_ref().and_then(|s| s.replicas));
        add_owner(&mut owners, "ReplicaSet", &o.metadata, want);
    }
    for o in &objects.stateful_sets {
        let want = replicas(o.spec.as_ref().and_then(|s| s.replicas));
        add_owner(&mut owners, "StatefulSet", &o.metadata, want);
    }
    for o in &objects.replication_controllers {
        let want = replicas(o.spec.as_ref().and_then(|s| s.replicas));
        add_owner(&mut owners, "ReplicationController", &o.metadata, want);
    }
    for o in &objects.jobs {
        let want = replicas(o.spec.as_ref().and_then(|s| s.parallelism));
        add_owner(&mut owners, "Job", &o.metadata, want);
    }
    for o in &objects.daemon_sets {
        let want = o.status.as_ref().map_or(0, |s| s.desired_number_scheduled);
        add_owner(&mut owners, "DaemonSet", &o.metadata, i64::from(want));
    }
    owners
}

fn add_owner(owners: &mut OwnerIndex, kind: &str, meta: &ObjectMeta, desired: i64) {
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    owners.insert(
        (kind.to_string(), ns.clone(), name.clone()),
        OwnerInfo {
            kind: kind.to_string(),
            namespace: ns,
            name,
            desired,
        },
    );
}
