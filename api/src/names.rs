//! Well-known labels, annotations, taints and scheduling gates that ebb reads and writes.
//! ebb's own keys live under `ebb.dev/`; Cluster Autoscaler's and Karpenter's are honoured too.

/// API group of every ebb resource.
pub const GROUP: &str = "ebb.dev";
/// API version of every ebb resource.
pub const VERSION: &str = "v1alpha1";

/// Soft taint (`PreferNoSchedule`) on nodes in the candidate set; value is the unix time it was set.
pub const TAINT_DELETION_CANDIDATE: &str = "ebb.dev/deletion-candidate";
/// Hard taint (`NoSchedule`) on nodes being drained; value is the unix time the drain started.
pub const TAINT_TO_BE_DELETED: &str = "ebb.dev/to-be-deleted";
/// Label left on nodes drained by a policy in `Drain` mode.
pub const LABEL_DRAINED: &str = "ebb.dev/drained";

/// Node annotation that keeps a node out of scale-down (`"true"`).
pub const ANNOTATION_SCALE_DOWN_DISABLED: &str = "ebb.dev/scale-down-disabled";
/// Node annotation: the node's hourly cost, a decimal number of at least 0 (`"3.06"`), in the
/// unit of the policy's `prices`. It takes precedence over `prices`.
pub const ANNOTATION_HOURLY_COST: &str = "ebb.dev/hourly-cost";
/// Cluster Autoscaler's node annotation with the same meaning.
pub const CA_ANNOTATION_SCALE_DOWN_DISABLED: &str =
    "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Karpenter's annotation: on a node it keeps the node, on a pod it blocks its eviction.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Karpenter's node label naming the NodePool that provisioned the node.
pub const KARPENTER_NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
/// Karpenter's taint on nodes it is disrupting (consolidating, expiring, terminating).
pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// Cluster API's node annotation naming the node's Machine.
pub const CAPI_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
/// Cluster API's node annotation naming the namespace of the node's Cluster and Machine.
pub const CAPI_CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";
/// Cluster API's node annotations naming the Machine's owner (`MachineSet`, name).
pub const CAPI_OWNER_KIND_ANNOTATION: &str = "cluster.x-k8s.io/owner-kind";
pub const CAPI_OWNER_NAME_ANNOTATION: &str = "cluster.x-k8s.io/owner-name";
/// Machine annotation that makes Cluster API delete this Machine first when its MachineSet
/// scales down (what Cluster Autoscaler's `clusterapi` provider sets).
pub const CAPI_DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
/// MachineSet/MachineDeployment annotation: the node group's minimum size (Cluster
/// Autoscaler's `clusterapi` provider reads it too).
pub const CAPI_MIN_SIZE_ANNOTATION: &str =
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// ebb's Machine annotation: the drained node it removes, and the owner's generation before
/// ebb lowered its replicas (`<node>@<Kind>/<name>@<generation>`), so that a restart between
/// marking and scaling lowers them exactly once.
pub const ANNOTATION_MACHINE_REMOVAL: &str = "ebb.dev/removal";

/// Pod annotation: `"true"` lets ebb evict a pod that would otherwise block, `"false"` blocks.
pub const ANNOTATION_SAFE_TO_EVICT: &str = "ebb.dev/safe-to-evict";
/// Cluster Autoscaler's pod annotation with the same meaning.
pub const CA_ANNOTATION_SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The value of either safe-to-evict annotation that lets a pod run to completion: its node is
/// not drained until the pod has finished (Succeeded or Failed).
pub const SAFE_TO_EVICT_ON_COMPLETION: &str = "on-completion";
/// Cluster Autoscaler's pod annotation listing volumes (comma-separated names) whose local
/// storage (emptyDir, hostPath) may be lost: they do not keep the node.
pub const CA_ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES: &str =
    "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";
/// The kubelet's annotation naming where a pod came from (`api`, or `file`/`http` for a static
/// pod).
pub const ANNOTATION_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// The kubelet's annotation on the API object of a static pod.
pub const ANNOTATION_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// Whether pod metadata says the kubelet made the pod from a static manifest: the mirror
/// annotation, a config source other than `api`, or an owner reference to its Node. Nothing can
/// evict such a pod; it stays with its node.
pub fn is_static_pod(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    owner_kinds: impl IntoIterator<Item = impl AsRef<str>>,
) -> bool {
    let ann = |k: &str| annotations.and_then(|a| a.get(k));
    ann(ANNOTATION_CONFIG_MIRROR).is_some()
        || ann(ANNOTATION_CONFIG_SOURCE).is_some_and(|s| !s.is_empty() && s != "api")
        || owner_kinds.into_iter().any(|k| k.as_ref() == "Node")
}

/// Scheduling gate that opts a pod into placement by a PlacementHistory.
pub const SCHEDULING_GATE_PLACEMENT: &str = "ebb.dev/placement";
/// Pod annotation carrying the pod's node-local API token.
pub const ANNOTATION_TOKEN: &str = "ebb.dev/token";
/// Pod annotation naming the node a placement pinned the pod to.
pub const ANNOTATION_PLACED_ON: &str = "ebb.dev/placed-on";
/// Pod annotation telling how a placement was made (`Pinned`, `Relaxed`, `Anywhere`, `Ungoverned`).
pub const ANNOTATION_PLACEMENT: &str = "ebb.dev/placement";
/// On a replacement pod steered at its creation: the node the plan put the pod it replaces on
/// (the pod prefers it). For people and tools to read: ebb itself trusts only the ticket
/// ([`ANNOTATION_STEERING_TICKET`]) it handed out, never this value.
pub const ANNOTATION_PLANNED_NODE: &str = "ebb.dev/planned-node";
/// On a replacement pod steered at its creation: the unguessable ticket of the destination the
/// webhook handed out. The controller counts the pod on its planned node, while it waits, only
/// if it handed this ticket out, to a pod of this owner, and this pod is the first seen with it.
pub const ANNOTATION_STEERING_TICKET: &str = "ebb.dev/steering-ticket";

/// Field manager name used by the controller for server-side apply.
pub const FIELD_MANAGER_CONTROLLER: &str = "ebb-controller";
/// Field manager name used by the node agent for server-side apply.
pub const FIELD_MANAGER_NODE_AGENT: &str = "ebb-node-agent";
/// Finalizer the controller puts on ScaleDownPolicies so their taints never leak.
pub const FINALIZER_SCALEDOWN: &str = "ebb.dev/cleanup-taints";

/// True when an annotation value means "yes" (`"true"`, case-insensitive).
pub fn is_true(value: Option<&String>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// True when an annotation value means "no" (`"false"`, case-insensitive).
pub fn is_false(value: Option<&String>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("false"))
}
