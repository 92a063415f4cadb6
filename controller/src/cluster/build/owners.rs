//! Workload owners (ReplicaSets, StatefulSets, ReplicationControllers, Jobs, DaemonSets) and
//! how many pods each wants, by (kind, namespace, name).

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ReplicationController;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::ClusterObjects;
use crate::cluster::types::OwnerInfo;

/// Owners by (kind, namespace, name).
pub type OwnerIndex = HashMap<(String, String, String), OwnerInfo>;

/// A workload controller whose pods the planner counts.
pub trait Workload {
    /// Its kind, namespace, name and the pods it wants: replicas (1 when unset), a Job's
    /// parallelism (1 when unset), a DaemonSet's scheduled count (0 without status).
    fn owner_info(&self) -> OwnerInfo;
}

fn replicas(r: Option<i32>) -> i64 {
    i64::from(r.unwrap_or(1))
}

fn info(kind: &str, meta: &ObjectMeta, desired: i64) -> OwnerInfo {
    OwnerInfo {
        kind: kind.to_string(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        desired,
    }
}

impl Workload for ReplicaSet {
    fn owner_info(&self) -> OwnerInfo {
        let want = replicas(self.spec.as_ref().and_then(|s| s.replicas));
        info("ReplicaSet", &self.metadata, want)
    }
}

impl Workload for StatefulSet {
    fn owner_info(&self) -> OwnerInfo {
        let want = replicas(self.spec.as_ref().and_then(|s| s.replicas));
        info("StatefulSet", &self.metadata, want)
    }
}

impl Workload for ReplicationController {
    fn owner_info(&self) -> OwnerInfo {
        let want = replicas(self.spec.as_ref().and_then(|s| s.replicas));
        info("ReplicationController", &self.metadata, want)
    }
}

impl Workload for Job {
    fn owner_info(&self) -> OwnerInfo {
        let want = replicas(self.spec.as_ref().and_then(|s| s.parallelism));
        info("Job", &self.metadata, want)
    }
}

impl Workload for DaemonSet {
    fn owner_info(&self) -> OwnerInfo {
        let want = self
            .status
            .as_ref()
            .map_or(0, |s| s.desired_number_scheduled);
        info("DaemonSet", &self.metadata, i64::from(want))
    }
}

/// Every owner in `objects` with the pods it wants.
pub fn owner_index(objects: &ClusterObjects) -> OwnerIndex {
    let mut owners = HashMap::new();
    let all = objects
        .replica_sets
        .iter()
        .map(Workload::owner_info)
        .chain(objects.stateful_sets.iter().map(Workload::owner_info))
        .chain(
            objects
                .replication_controllers
                .iter()
                .map(Workload::owner_info),
        )
        .chain(objects.jobs.iter().map(Workload::owner_info))
        .chain(objects.daemon_sets.iter().map(Workload::owner_info));
    for o in all {
        owners.insert((o.kind.clone(), o.namespace.clone(), o.name.clone()), o);
    }
    owners
}
