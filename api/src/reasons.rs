//! Reasons as enums: why a node cannot be removed, why a pod blocks its node, why deletions wait,
//! why a resource is degraded. They appear verbatim in status, events and metric labels.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

macro_rules! reason_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name as it appears in status, events and metrics.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant)),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reason_enum! {
    /// Why a node governed by a ScaleDownPolicy is not (yet) removable.
    UnremovableReason {
        /// The node carries `ebb.dev/scale-down-disabled`, Cluster Autoscaler's
        /// `scale-down-disabled` or Karpenter's `do-not-disrupt` annotation.
        ScaleDownDisabledAnnotation,
        /// Removing it would take its node group below `minNodesPerGroup`.
        NodeGroupMinSizeReached,
        /// Requested cpu or memory is above `utilizationThreshold` (a node without accelerators).
        NotUnderutilized,
        /// The node is removable but has not been so for `unneededTime` yet.
        NotUnneededLongEnough,
        /// The node is unready and removable but not for `unreadyTime` yet.
        NotUnreadyLongEnough,
        /// The node is already being deleted (by ebb or someone else).
        CurrentlyBeingDeleted,
        /// A pod on the node cannot be evicted; see the blocking pod reason.
        BlockedByPod,
        /// Some pod of the node fits on no other node.
        NoPlaceToMovePods,
        /// The simulation's time bound was reached before this node was evaluated.
        NotEvaluated,
        /// The node is selected by more than one ScaleDownPolicy.
        OverlappingPolicies,
        /// A node is being deleted whose pods no longer fit elsewhere, or recently evicted pods
        /// have not found a home yet: no new candidates until that settles.
        PendingReschedule,
        /// The node is marked unschedulable by someone other than ebb.
        Unschedulable,
        /// Pods of other candidates are planned to move onto this node, or it received
        /// replacements of pods ebb evicted within `recentEvictionWindow`, so it stays.
        DestinationOfMovedPods,
        /// Something unexpected happened while evaluating the node; see the message.
        UnexpectedError,
        /// The policy's `removal.method` (`ClusterAPI` or `Karpenter`) does not apply to the
        /// node: it has no Machine (`cluster.x-k8s.io/machine` annotation) or no NodeClaim
        /// names it. Draining it would leave its machine running.
        NoMachineToRemove,
        /// The node's machine is managed by Cluster API or Karpenter (`removal.method: Auto`),
        /// but the controller was not started with that removal enabled (`--cluster-api`,
        /// `--karpenter`; chart `removal.clusterAPI.enabled`, `removal.karpenter.enabled`).
        RemovalMethodNotEnabled,
        /// Karpenter is disrupting the node (it carries Karpenter's `karpenter.sh/disrupted`
        /// taint): ebb leaves it to Karpenter.
        DisruptedByKarpenter,
        /// Pods are on their way to the node: nominated to it by the scheduler (preemption, or a
        /// binding in progress), or bound to it in the last few seconds. The status message
        /// names them. It is not removed until they have settled.
        PodsArriving,
        /// The node has accelerators (`acceleratorResources`, for example `nvidia.com/gpu`) and
        /// their requested share is above `acceleratorUtilizationThreshold`. Its cpu and
        /// memory do not count: the node is kept for what it is for.
        AcceleratorsInUse,
    }
}

reason_enum! {
    /// Why a pod keeps its node from being drained.
    BlockingPodReason {
        /// The pod has no controller that would re-create it.
        NotReplicated,
        /// The pod's controller is not a kind ebb knows (and custom-controller pods are skipped).
        CustomControllerPod,
        /// The pod's owner could not be found.
        ControllerNotFound,
        /// `safe-to-evict: "false"` or `karpenter.sh/do-not-disrupt` on the pod (`"true"`, or a
        /// duration the pod has not yet run for).
        NotSafeToEvictAnnotation,
        /// The pod uses node-local storage (hostPath, disk-backed emptyDir).
        LocalStorageRequested,
        /// A kube-system pod without a PodDisruptionBudget.
        UnmovableKubeSystemPod,
        /// Not reported any more: a PodDisruptionBudget paces a candidate's drain
        /// (`WaitingForDisruptionBudget`) rather than making its node unremovable. Kept so that
        /// statuses written by older versions still read.
        NotEnoughPdb,
        /// A volume pins the pod to this node (local PersistentVolume node affinity).
        PinnedToNode,
        /// Something unexpected happened while checking the pod.
        UnexpectedError,
        /// `safe-to-evict: "on-completion"` on the pod: the node waits until the pod has
        /// finished (Succeeded or Failed).
        RunsToCompletion,
    }
}

reason_enum! {
    /// Why a removable node was not started this loop.
    ThrottledReason {
        /// `maxScaleDownParallelism` deletions are already in flight.
        MaxScaleDownParallelism,
        /// `maxDrainParallelism` drains are already in flight.
        MaxDrainParallelism,
        /// An active time-windowed budget allows no more disruptions.
        Budget,
        /// The node group would go below `minNodesPerGroup` counting deletions in flight.
        NodeGroupMinSize,
        /// A PodDisruptionBudget covering pods of the node allows no more disruptions now, once
        /// the drains in flight have theirs (the status names it). The node stays a candidate
        /// and starts as soon as replacements are ready and the budget allows it.
        WaitingForDisruptionBudget,
    }
}

reason_enum! {
    /// Why a resource has a `Degraded` condition. The controller acts on nothing it cannot trust.
    DegradedReason {
        /// The spec is invalid in a way the schema could not catch; see the message.
        InvalidSpec,
        /// Nodes are selected by more than one ScaleDownPolicy; neither acts on them.
        OverlappingPolicies,
        /// The node selector matches no node.
        SelectorMatchesNothing,
        /// Selected nodes lack the `nodeGroupLabel`.
        GroupLabelMissing,
        /// A budget's schedule or duration cannot be parsed; all deletions are held (fail closed).
        InvalidBudget,
        /// Calls to the Kubernetes API fail; see the message.
        ApiError,
        /// An object in the cluster cannot be read (for example a malformed quantity on a pod);
        /// the message names it and the field. Nothing is done until it is fixed.
        InvalidClusterObject,
        /// `mode: DrainAndDelete`, but the controller may not delete Nodes (RBAC): nothing is
        /// drained rather than evicting pods from nodes it cannot remove.
        NodeDeletionForbidden,
        /// `removal.method` is `ClusterAPI` or `Karpenter` but the controller was not started
        /// with that removal enabled, or may not act on its objects (RBAC), or the kinds are
        /// not served: nothing is drained.
        RemovalMethodNotEnabled,
    }
}

reason_enum! {
    /// Phase of a node being drained.
    DrainPhase {
        /// `ebb.dev/to-be-deleted` is set; re-checking that the node is still removable.
        Tainted,
        /// Evicting pods through the Eviction API.
        Evicting,
        /// Evictions accepted; waiting for the pods to terminate.
        WaitingForPods,
        /// All pods gone; deleting the Node object, marking its Machine and scaling its group
        /// down, or deleting its NodeClaim (DrainAndDelete), or labelling it drained (Drain).
        Deleting,
        /// The machine was handed off (Machine marked and its group scaled down, or NodeClaim
        /// deleted); waiting for the Machine or NodeClaim and the Node to go.
        WaitingForRemoval,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_serialization() {
        for r in UnremovableReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        for r in BlockingPodReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        for r in ThrottledReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        assert_eq!(DrainPhase::WaitingForPods.to_string(), "WaitingForPods");
        assert_eq!(
            ThrottledReason::WaitingForDisruptionBudget.to_string(),
            "WaitingForDisruptionBudget"
        );
    }
}
