//! `NodeState` (cluster-scoped, one per node, owned by its Node): what the node agent recovered,
//! how its store is, and what happened to the containers and cached resources of each role.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, Time};

/// The node a NodeState describes.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "ebb.dev",
    doc = "NodeState is written by the ebb node agent of one node: recovery of its state store, container outcomes and cached resources per role.",
    version = "v1alpha1",
    kind = "NodeState",
    plural = "nodestates",
    shortname = "nst",
    category = "ebb",
    status = "NodeStateStatus",
    printcolumn(
        name = "Recovery",
        type_ = "string",
        json_path = ".status.recovery.result"
    ),
    printcolumn(
        name = "Store",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"StoreHealthy\")].status"
    ),
    printcolumn(
        name = "Containers",
        type_ = "integer",
        json_path = ".status.containersTracked"
    ),
    printcolumn(
        name = "Cached",
        type_ = "integer",
        json_path = ".status.localizedCount"
    ),
    printcolumn(
        name = "Deletions",
        type_ = "integer",
        json_path = ".status.pendingDeletions"
    ),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".status.agentVersion",
        priority = "1"
    ),
    printcolumn(name = "Reported", type_ = "date", json_path = ".status.reportedAt"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeStateSpec {
    /// The Node this state belongs to (same as the object's name). Immutable.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeName is immutable"))]
    pub node_name: String,
}

/// How the agent's state came back at its last start.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum RecoveryResult {
    /// The store was created empty at this start.
    #[default]
    New,
    /// State was recovered from an existing store.
    Recovered,
    /// No state directory: nothing survives a restart.
    NotPersistent,
}

/// The last start's recovery.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryStatus {
    /// `New` (created empty at this start, also after `--reset-state`), `Recovered`, or
    /// `NotPersistent` (no state directory).
    pub result: RecoveryResult,
    /// When recovery finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How long it took.
    #[serde(default)]
    pub duration_ms: i64,
    /// Containers recovered from the store.
    #[serde(default)]
    pub containers: i64,
    /// Containers found lost (launched, never completed, pod gone).
    #[serde(default)]
    pub lost: i64,
    /// Completed localized resources re-registered.
    #[serde(default)]
    pub localized: i64,
    /// In-progress fetches discarded.
    #[serde(default)]
    pub discarded_fetches: i64,
    /// Deletion tasks resumed.
    #[serde(default)]
    pub deletions_resumed: i64,
}

/// Container outcomes of one role on this node within the failure window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleOutcomes {
    /// Namespace of the PlacementHistory.
    pub namespace: String,
    /// The PlacementHistory the role belongs to.
    pub placement_history: String,
    /// Role name (from the PlacementHistory's `roles`).
    pub role: String,
    /// Containers that exited 0 or were stopped by their owner.
    #[serde(default)]
    pub completed: i64,
    /// Exited before `shortLivedThreshold`.
    #[serde(default)]
    pub start_failures: i64,
    /// Other non-zero exits.
    #[serde(default)]
    pub application_failures: i64,
    /// OOMKilled.
    #[serde(default)]
    pub limits_exceeded: i64,
    /// Lost with the node, or lost while the agent was down.
    #[serde(default)]
    pub node_failures: i64,
    /// Evicted or preempted.
    #[serde(default)]
    pub preempted: i64,
    /// When the last outcome was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_outcome_at: Option<Time>,
}

/// A resource held in the node cache for a role.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalizedResource {
    /// Namespace of the PlacementHistory.
    pub namespace: String,
    /// The PlacementHistory whose role declares the resource.
    pub placement_history: String,
    /// Role name (from the PlacementHistory's `roles`).
    pub role: String,
    /// Resource name from the role's `localResources`.
    pub name: String,
    /// Size on disk in bytes.
    #[serde(default)]
    pub size_bytes: i64,
    /// `Localized`, `Fetching` or `Failed`.
    pub state: String,
    /// Why a fetch failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Ids of the master keys the agent validates tokens with (never the key material).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyIds {
    /// Id of the key new tokens are checked with first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Id of the key before the last rotation (tokens minted with it stay valid until expiry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

/// What the node agent reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStateStatus {
    /// `metadata.generation` this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `StoreHealthy`, `Recovered`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Version of the agent binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Schema version of the state store (`major.minor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_schema_version: Option<String>,
    /// The last start's recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryStatus>,
    /// Containers the store tracks.
    #[serde(default)]
    pub containers_tracked: i64,
    /// Outcomes per role within the failure window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleOutcomes>,
    /// Resources in the node cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub localized: Vec<LocalizedResource>,
    /// Number of resources in the node cache (printer column).
    #[serde(default)]
    pub localized_count: i64,
    /// Deletion tasks waiting to run.
    #[serde(default)]
    pub pending_deletions: i64,
    /// Token master key ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_ids: Option<KeyIds>,
    /// When the agent last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<Time>,
}
