//! Whether a node may be considered for removal at all (before any simulation), and its
//! utilisation: the larger of requested cpu and memory over allocatable.

use std::collections::BTreeSet;

use ebb_api::names;
use ebb_api::reasons::UnremovableReason;

use crate::cluster::{ClusterSnapshot, NodeId};

/// How utilisation counts special pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UtilizationRules {
    pub ignore_daemon_sets: bool,
    pub ignore_mirror_pods: bool,
}

/// max(cpu requested / allocatable, memory requested / allocatable) of the pods on the node.
/// A node with no allocatable cpu or memory counts as fully used for that resource.
pub fn utilization(snap: &ClusterSnapshot, node: NodeId, rules: UtilizationRules) -> f64 {
    let (mut cpu, mut mem) = (0i64, 0i64);
    for pod in snap.pods_on(node) {
        let p = snap.pod(*pod);
        if rules.ignore_daemon_sets && p.is_daemonset() || rules.ignore_mirror_pods && p.mirror {
            continue;
        }
        let r = &snap.class_of(*pod).req.requests;
        cpu += r.cpu_milli;
        mem += r.memory;
    }
    let alloc = &snap.node(node).allocatable;
    let ratio = |used: i64, total: i64| {
        if total <= 0 {
            if used > 0 { f64::INFINITY } else { 0.0 }
        } else {
            used as f64 / total as f64
        }
    };
    ratio(cpu, alloc.cpu_milli).max(ratio(mem, alloc.memory))
}

/// Whether the node is being deleted: in the deleted set, tainted `ebb.dev/to-be-deleted`, or
/// with a deletion timestamp.
pub fn being_deleted(snap: &ClusterSnapshot, node: NodeId, deleted: &BTreeSet<String>) -> bool {
    let n = snap.node(node);
    n.deleting || deleted.contains(&n.name) || n.has_taint(names::TAINT_TO_BE_DELETED)
}

/// Node-level reasons, in order: being deleted, scale-down disabled by annotation (ebb's, Cluster
/// Autoscaler's or Karpenter's), cordoned by someone else, utilisation at or above the
/// threshold (skipped for unready nodes, which are removable whatever they request).
pub fn check_node(
    snap: &ClusterSnapshot,
    node: NodeId,
    deleted: &BTreeSet<String>,
    threshold: f64,
    rules: UtilizationRules,
) -> Result<(), UnremovableReason> {
    let n = snap.node(node);
    if being_deleted(snap, node, deleted) {
        return Err(UnremovableReason::CurrentlyBeingDeleted);
    }
    let ann = &n.annotations;
    if names::is_true(ann.get(names::ANNOTATION_SCALE_DOWN_DISABLED))
        || names::is_true(ann.get(names::CA_ANNOTATION_SCALE_DOWN_DISABLED))
        || names::is_true(ann.get(names::KARPENTER_DO_NOT_DISRUPT))
    {
        return Err(UnremovableReason::ScaleDownDisabledAnnotation);
    }
    if n.unschedulable {
        return Err(UnremovableReason::Unschedulable);
    }
    if n.ready && utilization(snap, node, rules) >= threshold {
        return Err(UnremovableReason::NotUnderutilized);
    }
    Ok(())
}
