//! Which pods of a node must move, stay, or block the node, following Cluster Autoscaler's
//! drainability rules in its order; each block carries a `BlockingPodReason`.

use ebb_api::names;
use ebb_api::reasons::BlockingPodReason;

use super::pdb::PdbTracker;
use crate::cluster::{ClusterSnapshot, NodeId, PodId};

/// Controller kinds whose pods are re-created elsewhere when evicted.
pub const KNOWN_CONTROLLERS: [&str; 5] = [
    "ReplicaSet",
    "StatefulSet",
    "Job",
    "ReplicationController",
    "DaemonSet",
];

/// The policy switches that change the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainRules {
    pub skip_nodes_with_local_storage: bool,
    pub skip_nodes_with_system_pods: bool,
    pub skip_nodes_with_custom_controller_pods: bool,
}

impl Default for DrainRules {
    fn default() -> Self {
        DrainRules {
            skip_nodes_with_local_storage: true,
            skip_nodes_with_system_pods: true,
            skip_nodes_with_custom_controller_pods: true,
        }
    }
}

/// What draining a node does with one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDisposition {
    /// Not moved: mirror, DaemonSet, terminal or already terminating pods.
    Stays,
    /// Evicted and re-created elsewhere: it needs a place. Its PDBs are checked in simulation.
    Moves,
    /// Keeps the node.
    Blocks(BlockingPodReason),
}

/// Classifies a pod by the rules, in order: mirror, terminal, terminating, DaemonSet → stays;
/// `safe-to-evict: "true"` → moves; `safe-to-evict: "false"` or `do-not-disrupt` → blocks;
/// no controller, unknown controller kind, missing controller; kube-system without PDB; local
/// storage; pinned by a local volume.
pub fn classify(
    snap: &ClusterSnapshot,
    pod: PodId,
    rules: &DrainRules,
    pdbs: &mut PdbTracker,
) -> PodDisposition {
    let p = snap.pod(pod);
    if p.mirror || p.terminal || p.terminating || p.is_daemonset() {
        return PodDisposition::Stays;
    }
    let ann = &p.annotations;
    if names::is_true(ann.get(names::ANNOTATION_SAFE_TO_EVICT))
        || names::is_true(ann.get(names::CA_ANNOTATION_SAFE_TO_EVICT))
    {
        return PodDisposition::Moves;
    }
    if names::is_false(ann.get(names::ANNOTATION_SAFE_TO_EVICT))
        || names::is_false(ann.get(names::CA_ANNOTATION_SAFE_TO_EVICT))
        || names::is_true(ann.get(names::KARPENTER_DO_NOT_DISRUPT))
    {
        return PodDisposition::Blocks(BlockingPodReason::NotSafeToEvictAnnotation);
    }
    match &p.owner {
        None => return PodDisposition::Blocks(BlockingPodReason::NotReplicated),
        Some(o) if !KNOWN_CONTROLLERS.contains(&o.kind.as_str()) => {
            if rules.skip_nodes_with_custom_controller_pods {
                return PodDisposition::Blocks(BlockingPodReason::CustomControllerPod);
            }
        }
        Some(o) => {
            if snap.owner(&o.kind, &p.namespace, &o.name).is_none() {
                return PodDisposition::Blocks(BlockingPodReason::ControllerNotFound);
            }
        }
    }
    if rules.skip_nodes_with_system_pods && p.namespace == "kube-system" && !pdbs.has_pdb(snap, pod)
    {
        return PodDisposition::Blocks(BlockingPodReason::UnmovableKubeSystemPod);
    }
    if rules.skip_nodes_with_local_storage && p.local_storage {
        return PodDisposition::Blocks(BlockingPodReason::LocalStorageRequested);
    }
    if p.pinned_by_volume {
        return PodDisposition::Blocks(BlockingPodReason::PinnedToNode);
    }
    PodDisposition::Moves
}

/// The pods that must move off `node`, sorted by `namespace/name`; or the first blocking pod.
pub fn pods_to_move(
    snap: &ClusterSnapshot,
    node: NodeId,
    rules: &DrainRules,
    pdbs: &mut PdbTracker,
) -> Result<Vec<PodId>, (PodId, BlockingPodReason)> {
    let mut pods: Vec<PodId> = snap.pods_on(node).to_vec();
    pods.sort_by(|a, b| {
        let (a, b) = (snap.pod(*a), snap.pod(*b));
        (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
    });
    let mut out = Vec::new();
    for pod in pods {
        match classify(snap, pod, rules, pdbs) {
            PodDisposition::Stays => {}
            PodDisposition::Moves => out.push(pod),
            PodDisposition::Blocks(r) => return Err((pod, r)),
        }
    }
    Ok(out)
}
