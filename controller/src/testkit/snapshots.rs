//! Whole inputs of the planner: [`objects`] (nodes, pods and the owners the pods reference)
//! and [`snapshot`] (those objects built into a `ClusterSnapshot`).

use std::collections::BTreeMap;

use crate::cluster::CachedPod;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::workloads::{daemon_set, replica_set, stateful_set};
use crate::cluster::{ClusterObjects, ClusterSnapshot, build_snapshot};

/// Objects from nodes and pods, with every owner the pods reference created wanting as many
/// replicas as reference it (DaemonSets: as many as scheduled).
pub fn objects(
    nodes: impl IntoIterator<Item = impl Into<Node>>,
    pods: impl IntoIterator<Item = impl Into<CachedPod>>,
) -> ClusterObjects {
    let mut out = ClusterObjects {
        nodes: nodes.into_iter().map(Into::into).collect(),
        pods: pods.into_iter().map(Into::into).collect(),
        ..Default::default()
    };
    for ((kind, ns, name), n) in owner_references(&out.pods) {
        add_owner(&mut out, &kind, ns, &name, n);
    }
    out
}

/// How many pods reference each owner, by (kind, namespace, name).
fn owner_references(pods: &[CachedPod]) -> BTreeMap<(String, String, String), i32> {
    let mut owners = BTreeMap::new();
    for p in pods {
        for o in p.metadata.owner_references.iter().flatten() {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            *owners
                .entry((o.kind.clone(), ns, o.name.clone()))
                .or_insert(0) += 1;
        }
    }
    owners
}

/// Adds the owner `kind` `ns/name` wanting `n` replicas (unknown kinds are left out).
fn add_owner(out: &mut ClusterObjects, kind: &str, ns: String, name: &str, n: i32) {
    let metadata = ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns),
        ..Default::default()
    };
    match kind {
        "ReplicaSet" => out.replica_sets.push(ReplicaSet {
            metadata,
            ..replica_set(name, n)
        }),
        "StatefulSet" => out.stateful_sets.push(StatefulSet {
            metadata,
            ..stateful_set(name, n)
        }),
        "DaemonSet" => out.daemon_sets.push(DaemonSet {
            metadata,
            ..daemon_set(name, n)
        }),
        "Job" => out.jobs.push(Job {
            metadata,
            spec: Some(JobSpec {
                parallelism: Some(n),
                ..Default::default()
            }),
            status: None,
        }),
        _ => {}
    }
}

/// Builds a snapshot from [`objects`]; panics on invalid input (tests only).
pub fn snapshot(
    nodes: impl IntoIterator<Item = impl Into<Node>>,
    pods: impl IntoIterator<Item = impl Into<CachedPod>>,
) -> ClusterSnapshot {
    match build_snapshot(&objects(nodes, pods)) {
        Ok(s) => s,
        Err(e) => panic!("test snapshot is invalid: {e}"),
    }
}

/// The planner's view of a policy that selects the nodes labelled `key=value` (defaults
/// otherwise).
pub fn config_selecting(key: &str, value: &str) -> crate::scaledown::PlannerConfig {
    let spec: ebb_api::ScaleDownPolicySpec = match serde_json::from_value(
        serde_json::json!({"nodeSelector": {"matchLabels": {key: value}}}),
    ) {
        Ok(s) => s,
        Err(e) => panic!("test policy spec: {e}"),
    };
    match crate::scaledown::PlannerConfig::from_spec(&spec) {
        Ok(c) => c,
        Err(e) => panic!("test policy: {e}"),
    }
}
