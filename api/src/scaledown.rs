//! `ScaleDownPolicy` (cluster-scoped): which nodes ebb may remove, how fast, and how it reports.
//! Defaults follow Cluster Autoscaler where it has one; the planner and actuator read this spec.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, Time};
use crate::duration::KubeDuration;
use crate::reasons::{BlockingPodReason, DrainPhase, UnremovableReason};

/// What a policy does with nodes it finds removable.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ScaleDownMode {
    /// Plan and report only: nothing is tainted, evicted or deleted.
    #[default]
    DryRun,
    /// Cordon and evict; the node is kept, labelled `ebb.dev/drained=true`.
    Drain,
    /// Cordon, evict, then delete the Node object.
    DrainAndDelete,
}

/// How a node drained by a `DrainAndDelete` policy is given back.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum RemovalMethod {
    /// Per node: `ClusterAPI` when the Node carries the `cluster.x-k8s.io/machine` and
    /// `cluster.x-k8s.io/cluster-namespace` annotations, `Karpenter` when it carries the
    /// `karpenter.sh/nodepool` label and a NodeClaim names it, otherwise `Node`.
    #[default]
    Auto,
    /// Delete the Node object only. The machine behind it keeps running until something else
    /// (a cloud provider's node group, a person) removes it.
    Node,
    /// Mark the node's Machine `cluster.x-k8s.io/delete-machine` and scale its MachineSet (or
    /// the MachineDeployment owning that) down by one; Cluster API deletes the machine.
    #[serde(rename = "ClusterAPI")]
    ClusterApi,
    /// Delete the node's NodeClaim; Karpenter terminates the instance and the Node.
    Karpenter,
}

impl RemovalMethod {
    /// The name as in the spec, status, events and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            RemovalMethod::Auto => "Auto",
            RemovalMethod::Node => "Node",
            RemovalMethod::ClusterApi => "ClusterAPI",
            RemovalMethod::Karpenter => "Karpenter",
        }
    }
}

impl std::fmt::Display for RemovalMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How drained nodes are removed (`mode: DrainAndDelete`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Removal {
    /// `Auto` (default), `Node`, `ClusterAPI` or `Karpenter`.
    #[serde(default)]
    pub method: RemovalMethod,
    /// How long after the hand-off (Machine marked and its group scaled down, NodeClaim
    /// deleted) the Machine or NodeClaim and the Node may take to go before a Warning Event
    /// and the drain's `removal.stuck` say so. ebb keeps waiting; nothing is undone.
    #[serde(default = "defaults::removal_timeout")]
    pub timeout: KubeDuration,
}

impl ScaleDownPolicySpec {
    /// `removal`, or its defaults when unset.
    pub fn removal_or_default(&self) -> Removal {
        self.removal.clone().unwrap_or_default()
    }
}

impl Default for Removal {
    fn default() -> Self {
        Removal {
            method: RemovalMethod::Auto,
            timeout: defaults::removal_timeout(),
        }
    }
}

/// A time-windowed limit on how many nodes may be disrupted at once (Karpenter-style).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.schedule) == has(self.duration)").message("a budget's schedule and duration must be set together (a schedule opens a window of that duration)"))]
pub struct Budget {
    /// Most nodes that may be disrupted at once while this budget is active: a count (`"5"`) or a
    /// percentage of the selected nodes (`"10%"`, rounded down). `"0"` stops all scale-down.
    #[schemars(regex(pattern = r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    /// Cron schedule (5 fields, UTC, or `@daily`-style macros) at which the budget's window opens.
    /// Without a schedule the budget is always active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|(\S+\s+){4}\S+)$"
    ))]
    pub schedule: Option<String>,
    /// How long the window stays open after each scheduled start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<KubeDuration>,
}

/// Which nodes ebb may remove, how fast, and in which mode.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "ebb.dev",
    doc = "ScaleDownPolicy governs which nodes ebb may remove in parallel, how fast, and in which mode; its status reports candidates, drains and reasons.",
    version = "v1alpha1",
    kind = "ScaleDownPolicy",
    plural = "scaledownpolicies",
    shortname = "sdp",
    category = "ebb",
    status = "ScaleDownPolicyStatus",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Selected",
        type_ = "integer",
        json_path = ".status.nodesSelected",
        priority = "1"
    ),
    printcolumn(
        name = "Candidates",
        type_ = "integer",
        json_path = ".status.candidates"
    ),
    printcolumn(name = "Draining", type_ = "integer", json_path = ".status.draining"),
    printcolumn(
        name = "Removed",
        type_ = "integer",
        json_path = ".status.removedTotal"
    ),
    printcolumn(
        name = "Last Loop",
        type_ = "date",
        json_path = ".status.lastLoop.time"
    ),
    printcolumn(
        name = "Loop ms",
        type_ = "integer",
        json_path = ".status.lastLoop.durationMs",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maxDrainParallelism <= self.maxScaleDownParallelism").message("maxDrainParallelism cannot exceed maxScaleDownParallelism: drains count toward the total number of deletions in flight"))]
#[x_kube(validation = Rule::new("!has(self.removal) || self.mode != 'Drain'").message("removal applies to mode DrainAndDelete (and is previewed in DryRun); mode Drain keeps its nodes, so it cannot have a removal"))]
pub struct ScaleDownPolicySpec {
    /// Nodes this policy governs. Empty selects every node. A node selected by two policies is
    /// left alone by both (Degraded: OverlappingPolicies).
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// Label key that groups nodes (for example a node pool label); `minNodesPerGroup` applies per
    /// group. Without it all selected nodes form one group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    pub node_group_label: Option<String>,
    /// Fewest nodes each group keeps, counting deletions in flight.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_nodes_per_group: i32,
    /// How often the planner runs for this policy.
    #[serde(default = "defaults::scan_interval")]
    pub scan_interval: KubeDuration,
    /// How long a node must stay removable before it is drained.
    #[serde(default = "defaults::unneeded_time")]
    pub unneeded_time: KubeDuration,
    /// How long an unready node must stay removable before it is drained.
    #[serde(default = "defaults::unready_time")]
    pub unready_time: KubeDuration,
    /// A node is underutilized when the larger of its requested cpu and memory, over allocatable,
    /// is at or below this fraction (as Cluster Autoscaler's `--scale-down-utilization-threshold`).
    /// `1` (the default) simulates every node, as Karpenter's consolidation does; `0` considers
    /// empty nodes only.
    #[serde(default = "defaults::utilization_threshold")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub utilization_threshold: f64,
    /// Count DaemonSet pods' requests in utilization (false: ignore them, as CA's
    /// `--ignore-daemonsets-utilization` does when set).
    #[serde(default)]
    pub ignore_daemon_sets_utilization: bool,
    /// Ignore mirror (static) pods' requests in utilization.
    #[serde(default)]
    pub ignore_mirror_pods_utilization: bool,
    /// Most nodes being removed at once, empty and non-empty together. A node counts from its
    /// drain's start until the API server has accepted its Node's deletion and nothing is left
    /// to move; its provider finishing it (an instance terminating) does not count.
    #[serde(default = "defaults::parallelism")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_scale_down_parallelism: i32,
    /// Most non-empty nodes being drained at once. Cannot exceed `maxScaleDownParallelism`.
    #[serde(default = "defaults::parallelism")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_drain_parallelism: i32,
    /// Time bound of one planning simulation; the rest of the nodes wait for the next loop.
    #[serde(default = "defaults::simulation_timeout")]
    pub simulation_timeout: KubeDuration,
    /// Nodes evaluated per loop even when the time bound is reached.
    #[serde(default = "defaults::min_nodes_evaluated")]
    #[schemars(range(min = 0))]
    pub min_nodes_evaluated: i32,
    /// How long evicted pods are remembered and re-injected into the simulation until their owner
    /// has replaced them.
    #[serde(default = "defaults::recent_eviction_window")]
    pub recent_eviction_window: KubeDuration,
    /// Upper bound on the grace period given to evicted pods.
    #[serde(default = "defaults::max_graceful_termination")]
    pub max_graceful_termination: KubeDuration,
    /// Wait between eviction retries when a PodDisruptionBudget says wait (HTTP 429).
    #[serde(default = "defaults::eviction_retry_interval")]
    pub eviction_retry_interval: KubeDuration,
    /// Give up on a node whose pods could not all be evicted within this time; it is untainted.
    /// A pod waiting for a PodDisruptionBudget that lets another of ebb's evictions through
    /// starts this time again: a drain paced by a budget that keeps moving is not stuck.
    #[serde(default = "defaults::max_pod_eviction_time")]
    pub max_pod_eviction_time: KubeDuration,
    /// Keep nodes with pods using local storage (hostPath, disk-backed emptyDir).
    #[serde(default = "defaults::yes")]
    pub skip_nodes_with_local_storage: bool,
    /// Keep nodes with kube-system pods that have no PodDisruptionBudget.
    #[serde(default = "defaults::yes")]
    pub skip_nodes_with_system_pods: bool,
    /// Keep nodes with pods owned by controllers ebb does not know.
    #[serde(default = "defaults::yes")]
    pub skip_nodes_with_custom_controller_pods: bool,
    /// Most nodes soft-tainted (or untainted) per loop (`maxBulkSoftTaintTime` bounds the loop's
    /// writes too). Drains start once every candidate carries the soft taint (or after waiting a
    /// minute for it); 0 turns soft tainting off.
    #[serde(default = "defaults::max_bulk_soft_taint_count")]
    #[schemars(range(min = 0))]
    pub max_bulk_soft_taint_count: i32,
    /// Time bound of soft-tainting per loop.
    #[serde(default = "defaults::max_bulk_soft_taint_time")]
    pub max_bulk_soft_taint_time: KubeDuration,
    /// `DryRun` (default: report only), `Drain` (cordon and evict, keep the node) or
    /// `DrainAndDelete` (also delete the Node object).
    #[serde(default)]
    pub mode: ScaleDownMode,
    /// How drained nodes are given back (`mode: DrainAndDelete`; previewed in `DryRun`, refused
    /// with `Drain`). Absent means `method: Auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<Removal>,
    /// Time-windowed disruption limits; the most restrictive active one wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub budgets: Vec<Budget>,
    /// Extended resources that make a node an accelerator node (GPUs and the like). A node
    /// with allocatable of any of them is judged by their requested share alone, against
    /// `acceleratorUtilizationThreshold`; its cpu and memory do not count. Empty: every node is
    /// judged by cpu and memory.
    #[serde(default = "defaults::accelerator_resources")]
    #[schemars(
        length(max = 16),
        inner(regex(
            pattern = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
        ))
    )]
    pub accelerator_resources: Vec<String>,
    /// An accelerator node is underutilized when the largest requested share of its
    /// `acceleratorResources`, over allocatable, is at or below this fraction (Cluster Autoscaler's
    /// `--scale-down-gpu-utilization-threshold`, whose default is 0.5). The default, 1, simulates
    /// every accelerator node: one whose GPUs are all in use goes when its pods fit on idle GPUs
    /// elsewhere.
    #[serde(default = "defaults::accelerator_utilization_threshold")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub accelerator_utilization_threshold: f64,
    /// Hourly prices of nodes by the value of a node label. A node's `ebb.dev/hourly-cost`
    /// annotation takes precedence. With prices, removals that save the most per hour (and per
    /// evicted pod) go first, and the status shows the hourly cost removed and kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
}

/// Hourly node prices by the value of a node label.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Prices {
    /// Node label whose value names the price (for example the instance type).
    #[serde(default = "defaults::price_label")]
    #[schemars(length(min = 1, max = 317))]
    pub label: String,
    /// Price per hour of a node, by label value: a number of at least 0 (any currency, the
    /// same for every node). Nodes whose value is not listed (and which have no
    /// `ebb.dev/hourly-cost` annotation) are unpriced.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 1000, "additionalProperties" = {"type": "number", "minimum": 0.0, "maximum": 1000000.0}))]
    pub per_hour: std::collections::BTreeMap<String, f64>,
}

/// Defaults of [`ScaleDownPolicySpec`], shared by serde and the CRD schema.
pub mod defaults {
    use crate::duration::KubeDuration;
    pub fn scan_interval() -> KubeDuration {
        KubeDuration::from_secs(10)
    }
    pub fn unneeded_time() -> KubeDuration {
        KubeDuration::from_secs(600)
    }
    pub fn unready_time() -> KubeDuration {
        KubeDuration::from_secs(1200)
    }
    pub fn utilization_threshold() -> f64 {
        1.0
    }
    pub fn parallelism() -> i32 {
        10
    }
    pub fn simulation_timeout() -> KubeDuration {
        KubeDuration::from_secs(30)
    }
    pub fn min_nodes_evaluated() -> i32 {
        50
    }
    pub fn recent_eviction_window() -> KubeDuration {
        KubeDuration::from_secs(300)
    }
    pub fn max_graceful_termination() -> KubeDuration {
        KubeDuration::from_secs(600)
    }
    pub fn eviction_retry_interval() -> KubeDuration {
        KubeDuration::from_secs(10)
    }
    pub fn max_pod_eviction_time() -> KubeDuration {
        KubeDuration::from_secs(120)
    }
    pub fn yes() -> bool {
        true
    }
    pub fn max_bulk_soft_taint_count() -> i32 {
        1000
    }
    pub fn max_bulk_soft_taint_time() -> KubeDuration {
        KubeDuration::from_secs(3)
    }
    pub fn removal_timeout() -> KubeDuration {
        KubeDuration::from_secs(900)
    }
    pub fn accelerator_resources() -> Vec<String> {
        vec!["nvidia.com/gpu".to_string(), "amd.com/gpu".to_string()]
    }
    pub fn accelerator_utilization_threshold() -> f64 {
        1.0
    }
    pub fn price_label() -> String {
        "node.kubernetes.io/instance-type".to_string()
    }
}

impl Default for ScaleDownPolicySpec {
    fn default() -> Self {
        // An empty object deserializes to all defaults; this cannot fail.
        serde_json::from_value(serde_json::json!({})).unwrap_or_else(|_| unreachable!())
    }
}

/// A node in the candidate set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CandidateStatus {
    /// Node name.
    pub node: String,
    /// When the node entered the candidate set (reset if it leaves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// No pods to move.
    #[serde(default)]
    pub empty: bool,
    /// Pods to move off the node.
    #[serde(default)]
    pub pods_to_move: i32,
    /// Why it is not being drained yet (for example `NotUnneededLongEnough`), if anything holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// For `WaitingForDisruptionBudget`: the PodDisruptionBudget (`namespace/name`) that allows
    /// no more disruptions now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<String>,
}

/// A node being drained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainingNodeStatus {
    /// Node name.
    pub node: String,
    /// Current phase.
    pub phase: DrainPhase,
    /// When the drain started (the `ebb.dev/to-be-deleted` taint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// Pods still on the node that must go.
    #[serde(default)]
    pub pods_remaining: i32,
    /// Evictions refused by a PodDisruptionBudget so far.
    #[serde(default)]
    pub evictions_blocked: i32,
    /// How the node is being removed, once its pods are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<RemovalStatus>,
}

/// The removal of one drained node: the method used and the object acted on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemovalStatus {
    /// `Node`, `ClusterAPI` or `Karpenter` (never `Auto`: the method chosen for this node).
    pub method: RemovalMethod,
    /// What ebb acted on: `Machine <namespace>/<name>` (scaling `MachineDeployment
    /// <namespace>/<name>` or `MachineSet ...` down), `NodeClaim <name>` or `Node <name>`.
    pub object: String,
    /// The node group scaled down (`MachineDeployment <namespace>/<name>` or `MachineSet ...`),
    /// for `ClusterAPI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaled: Option<String>,
    /// When the hand-off was done (Machine marked and group scaled down, NodeClaim deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_off: Option<Time>,
    /// The Machine or NodeClaim and the Node have not gone within `removal.timeout`.
    #[serde(default)]
    pub stuck: bool,
    /// What is still there, when stuck.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A node that cannot be removed, with the reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnremovableNodeStatus {
    /// Node name.
    pub node: String,
    /// Why the node stays.
    pub reason: UnremovableReason,
    /// The pod that blocks it (`namespace/name`), for `BlockedByPod` and `NoPlaceToMovePods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Why that pod blocks, for `BlockedByPod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_reason: Option<BlockingPodReason>,
    /// What else names the cause, when there is more to say (for `PinnedToNode`: the claim
    /// and the PersistentVolume whose node affinity only this node satisfies; for
    /// `PodsArriving`: the pods on their way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How many nodes are unremovable for one reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReasonCount {
    pub reason: UnremovableReason,
    pub count: i32,
}

/// Figures of the last planning loop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoopStatus {
    /// When the loop ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// How long it took, in milliseconds.
    #[serde(default)]
    pub duration_ms: i64,
    /// Nodes simulated.
    #[serde(default)]
    pub nodes_evaluated: i32,
    /// The simulation stopped at `simulationTimeout`.
    #[serde(default)]
    pub timed_out: bool,
}

/// What the policy sees and does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleDownPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Throttled` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Nodes matched by `nodeSelector`.
    #[serde(default)]
    pub nodes_selected: i32,
    /// Nodes in the candidate set (removable together).
    #[serde(default)]
    pub candidates: i32,
    /// Nodes being drained now.
    #[serde(default)]
    pub draining: i32,
    /// Nodes removed (or drained, in `Drain` mode) since the policy was created.
    #[serde(default)]
    pub removed_total: i64,
    /// Removals whose Machine or NodeClaim and Node have not gone within `removal.timeout`
    /// (listed in `drainingNodes` with `removal.stuck`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removals_stuck: i32,
    /// Evictions a PodDisruptionBudget refused (HTTP 429) since the policy was created. ebb
    /// sends an eviction only when the budgets it sees allow it, so this stays near zero; a
    /// growing count means another actor is disrupting the same pods.
    #[serde(default)]
    pub evictions_refused_total: i64,
    /// Unremovable nodes counted by reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unremovable: Vec<ReasonCount>,
    /// The candidate set (at most 50 listed; `candidates` has the full count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidate_nodes: Vec<CandidateStatus>,
    /// Nodes being drained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining_nodes: Vec<DrainingNodeStatus>,
    /// Unremovable nodes with reasons (at most 50 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unremovable_nodes: Vec<UnremovableNodeStatus>,
    /// The last planning loop.
    #[serde(default)]
    pub last_loop: LoopStatus,
    /// Where the replacements of evicted pods went, against where the plan put them (since the
    /// controller started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacements: Option<ReplacementsStatus>,
    /// Hourly cost of the governed nodes, when a price is known for any (`prices`, or the
    /// `ebb.dev/hourly-cost` annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostStatus>,
}

/// Hourly cost of a policy's nodes, from the last loop, in the prices' unit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostStatus {
    /// Hourly cost of the candidate set: what removing the nodes the plan removes saves.
    pub removed_per_hour: f64,
    /// Hourly cost of the governed nodes that stay (neither candidates nor being deleted).
    pub kept_per_hour: f64,
    /// Governed nodes without a known price, counted in neither figure.
    #[serde(default)]
    pub unpriced_nodes: i32,
    /// Governed nodes whose `ebb.dev/hourly-cost` annotation is not a number of at least 0 (at
    /// most 50 listed): it is ignored until fixed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid_cost_annotations: Vec<String>,
}

/// The replacements of a policy's evicted pods: steered to the node the plan put them on (a
/// preferred node affinity added when they are created), bound there or not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementsStatus {
    /// `Enabled`, or `Disabled: <why>` (the controller's `--steering=false`, the webhook not
    /// installed, or its registration refused): then the scheduler alone places replacements.
    pub steering: String,
    /// Replacements given their planned node when created.
    #[serde(default)]
    pub steered: i64,
    /// Steered replacements bound to their planned node.
    #[serde(default)]
    pub on_plan: i64,
    /// Replacements not steered although planned, or bound elsewhere (`fallbacks` says why).
    #[serde(default)]
    pub fell_back: i64,
    /// Planned destinations whose replacement has not been created yet.
    #[serde(default)]
    pub waiting: i64,
    /// Destinations handed out when a replacement was being created, whose pod never appeared
    /// (refused later in admission, for example by a quota, or a request that was not the API
    /// server's); each was offered again.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub not_created: i64,
    /// Share of the decided replacements that landed on plan, in whole percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_plan_percent: Option<i32>,
    /// Fallbacks counted by reason (`NodeGone`, `NodeUnavailable`, `SchedulerChoseAnother`,
    /// `Expired`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<FallbackCount>,
}

/// How many replacements fell back for one reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FallbackCount {
    pub reason: String,
    pub count: i64,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

/// Most entries listed in `candidateNodes` and `unremovableNodes`.
pub const STATUS_LIST_CAP: usize = 50;
