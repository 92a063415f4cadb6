//! `PlacementHistory` (namespaced): remembers where each role of a workload ran and steers gated,
//! re-created pods back to nodes holding their warm local data.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, Time};
use crate::duration::KubeDuration;

/// How strictly a role returns to its history nodes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum PlacementPolicy {
    /// Pin to the most recent available history node; relax after `escalationTimeout`.
    #[default]
    Default,
    /// Pin to history nodes only, ignoring failures; never relax.
    Strict,
    /// Never pin: release the gate at once (history is still recorded).
    Anywhere,
    /// Never place two live instances of the role on one node.
    AntiAffinity,
}

/// Longest `cacheRetention` accepted (30 days); the node agent never keeps an unused resource
/// longer, whatever the object says.
pub const MAX_CACHE_RETENTION_SECS: i64 = 30 * 86_400;

/// Largest `maxBytes` of a localized resource (1 TiB).
pub const MAX_RESOURCE_BYTES: i64 = 1 << 40;

/// Scope of a localized resource in the node cache.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ResourceScope {
    /// Shared node-wide by every pod that declares it.
    Public,
    /// Shared by pods of the same namespace.
    Namespace,
    /// Private to this PlacementHistory's pods.
    #[default]
    Application,
}

/// An artifact the node agent fetches into the node cache and keeps warm for a role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalResource {
    /// Name, unique within the role; pods find the resource by it.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Where to fetch it from: `http://` or `https://` (the node agent refuses loopback,
    /// link-local, private and cluster addresses unless its operator allows them), or
    /// `file:///<path>` under a directory the operator lists (none by default).
    #[schemars(length(max = 2048), regex(pattern = r"^(https?|file)://.+$"))]
    pub url: String,
    /// Expected SHA-256 of the content (64 lowercase hex digits); a mismatch is never served.
    #[schemars(regex(pattern = r"^[a-f0-9]{64}$"))]
    pub sha256: String,
    /// Cache scope.
    #[serde(default)]
    pub scope: ResourceScope,
    /// Largest size accepted, in bytes (0: the agent's limit). The agent reserves this much of
    /// the namespace's cache quota on the node while fetching.
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_RESOURCE_BYTES))]
    pub max_bytes: i64,
}

/// One role of the workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.localResources.all(r, self.localResources.filter(o, o.name == r.name).size() == 1)").message("localResources names must be unique within a role"))]
pub struct RoleSpec {
    /// Role name: the value of `roleLabel` on the role's pods.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    )]
    pub name: String,
    /// `Default`, `Strict`, `Anywhere` or `AntiAffinity`.
    #[serde(default)]
    pub policy: PlacementPolicy,
    /// How long a pinned pod may wait for its node before it is released with a relaxed request.
    #[serde(default = "defaults::escalation_timeout")]
    pub escalation_timeout: KubeDuration,
    /// A node is avoided for this role once its failures within `failureWindow` exceed this
    /// count (`0`: after the first failure); `-1` means never avoid.
    #[serde(default = "defaults::node_failure_threshold")]
    #[x_kube(validation = Rule::new("self >= -1").message("nodeFailureThreshold must be -1 (unlimited) or a non-negative count"))]
    pub node_failure_threshold: i32,
    /// Node labels every placement of the role must match, pinned or relaxed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Artifacts the node agent keeps warm on the role's nodes.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub local_resources: Vec<LocalResource>,
}

/// Which pods form the workload, their roles, and how long history is kept.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "ebb.dev",
    doc = "PlacementHistory remembers where each role of a workload ran and sends gated, re-created pods back to nodes holding their warm data.",
    version = "v1alpha1",
    kind = "PlacementHistory",
    plural = "placementhistories",
    namespaced,
    shortname = "ph",
    category = "ebb",
    status = "PlacementHistoryStatus",
    printcolumn(name = "Roles", type_ = "integer", json_path = ".status.roleCount"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodeCount"),
    printcolumn(name = "Gated", type_ = "integer", json_path = ".status.gatedPods"),
    printcolumn(name = "Hit Rate", type_ = "string", json_path = ".status.hitRate"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PlacementHistorySpec {
    /// Pods of the workload (in this namespace).
    pub selector: LabelSelector,
    /// Label key whose value names a pod's role.
    #[schemars(length(min = 1, max = 317))]
    pub role_label: String,
    /// The roles; names must be unique.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("size(self) > 0").message("roles must list at least one role"))]
    #[x_kube(validation = Rule::new("self.all(r, self.filter(o, o.name == r.name).size() == 1)").message("role names must be unique"))]
    pub roles: Vec<RoleSpec>,
    /// Failure counters reset on this fixed period (not a sliding window).
    #[serde(default = "defaults::failure_window")]
    pub failure_window: KubeDuration,
    /// History entries unused this long (and without recent failures) are purged.
    #[serde(default = "defaults::retention")]
    pub retention: KubeDuration,
    /// A pod that exits sooner than this after starting counts as a start failure.
    #[serde(default = "defaults::short_lived_threshold")]
    pub short_lived_threshold: KubeDuration,
    /// How long the node agent keeps a localized resource after its last pod is gone (at most
    /// 30d).
    #[serde(default = "defaults::cache_retention")]
    #[x_kube(validation = Rule::new("self.contains('d') ? self.matches('^([0-9]|[12][0-9]|30)d$') : duration(self) <= duration('720h')").message("cacheRetention must be at most 30d (720h): write whole days alone (\"7d\") or hours and smaller units (\"36h\", \"90m\")"))]
    pub cache_retention: KubeDuration,
}

/// Defaults of [`PlacementHistorySpec`] and [`RoleSpec`].
pub mod defaults {
    use crate::duration::KubeDuration;
    pub fn escalation_timeout() -> KubeDuration {
        KubeDuration::from_secs(30)
    }
    pub fn node_failure_threshold() -> i32 {
        3
    }
    pub fn failure_window() -> KubeDuration {
        KubeDuration::from_secs(6 * 3600)
    }
    pub fn retention() -> KubeDuration {
        KubeDuration::from_secs(7 * 86_400)
    }
    pub fn short_lived_threshold() -> KubeDuration {
        KubeDuration::from_secs(60)
    }
    pub fn cache_retention() -> KubeDuration {
        KubeDuration::from_secs(3600)
    }
}

/// A role's persisted id and live figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleStatus {
    /// Role name.
    pub name: String,
    /// Stable id used in `nodes[].entries`.
    pub id: i32,
    /// Live pods of the role.
    #[serde(default)]
    pub live: i32,
    /// Pods waiting behind the placement gate.
    #[serde(default)]
    pub gated: i32,
    /// Placements pinned to a history node since the controller started.
    #[serde(default)]
    pub pinned: i64,
    /// Placements released relaxed after the escalation timeout.
    #[serde(default)]
    pub relaxed: i64,
    /// Placements released without pinning (no usable history, or policy `Anywhere`).
    #[serde(default)]
    pub anywhere: i64,
}

/// One node's history, compactly encoded so 5,000 nodes x 10 roles fit well within an object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeHistory {
    /// Node name.
    pub node: String,
    /// Entries `<roleId>:<lastUsed, seconds before savedAt>[:a]`, comma-separated; `:a` marks a
    /// role active on the node at save time.
    pub entries: String,
}

/// The persisted role history and the workload's placement figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementHistoryStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Version of the history encoding.
    #[serde(default)]
    pub schema_version: i32,
    /// When the history was saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_at: Option<Time>,
    /// Roles with their persisted ids (the name to id map).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleStatus>,
    /// Per-node history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeHistory>,
    /// Number of roles (printer column).
    #[serde(default)]
    pub role_count: i32,
    /// Nodes with history (printer column).
    #[serde(default)]
    pub node_count: i32,
    /// Pods waiting behind the placement gate.
    #[serde(default)]
    pub gated_pods: i32,
    /// Share of placements that landed on a node with history or warm data, e.g. `"92%"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
}
