//! The records the state store keeps, per subsystem, and `Op`: one state transition to persist.
//! Records are plain serde data; the store encodes them compactly (postcard) under readable keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (compact and exact in the stored encoding).
pub type UnixMillis = i64;

/// Identifies one container of one pod: pod UID + container name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ContainerId {
    pub pod_uid: String,
    pub container: String,
}

impl ContainerId {
    pub fn new(pod_uid: impl Into<String>, container: impl Into<String>) -> Self {
        Self {
            pod_uid: pod_uid.into(),
            container: container.into(),
        }
    }
}

impl std::fmt::Display for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pod_uid, self.container)
    }
}

/// The pod facts the agent needs about a container, written when it first sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRequest {
    pub namespace: String,
    pub pod_name: String,
    pub image: String,
    /// The PlacementHistory (same namespace) the pod belongs to, if any.
    pub placement_history: Option<String>,
    /// The role within that PlacementHistory.
    pub role: Option<String>,
    pub requested_at: UnixMillis,
}

/// A kill the agent is about to act on (written before acting: write-ahead).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillRecord {
    pub at: UnixMillis,
    pub reason: String,
}

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    pub exit_code: i32,
    /// Kubernetes termination reason (`Completed`, `Error`, `OOMKilled`, `Lost`, ...).
    pub reason: String,
    /// Diagnostics message.
    pub message: String,
    pub finished_at: UnixMillis,
}

/// Exit code recorded for a container that vanished without an exit record (as YARN does).
pub const EXIT_CODE_LOST: i32 = 154;
/// Reason recorded for such a container.
pub const REASON_LOST: &str = "Lost";

/// Everything the store knows about one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub requested: Option<ContainerRequest>,
    pub launched_at: Option<UnixMillis>,
    pub killed: Option<KillRecord>,
    pub completed: Option<Completion>,
    pub restart_count: u32,
    pub diagnostics: Option<String>,
}

/// Where a localized resource lives in the node cache.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CacheScope {
    /// Shared by every pod on the node.
    Public,
    /// Shared by the pods of one namespace.
    Namespace { namespace: String },
    /// Private to the pods of one PlacementHistory.
    Application {
        namespace: String,
        placement_history: String,
    },
}

/// What was asked for when a fetch began.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRequest {
    pub name: String,
    pub url: String,
    pub sha256: String,
    pub started_at: UnixMillis,
}

/// A finished fetch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalizedRecord {
    pub name: String,
    pub url: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub completed_at: UnixMillis,
}

/// State of one resource in the localization subsystem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocalizationState {
    Started(ResourceRequest),
    Completed(LocalizedRecord),
}

/// One localized resource as loaded from the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalizationEntry {
    pub scope: CacheScope,
    /// Path of the resource relative to the cache root.
    pub local_path: String,
    pub state: LocalizationState,
}

/// One PlacementHistory seen on this node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AppId {
    pub namespace: String,
    pub placement_history: String,
}

impl AppId {
    pub fn new(namespace: impl Into<String>, placement_history: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            placement_history: placement_history.into(),
        }
    }

    /// Whether `scope` is this application's own cache scope.
    pub fn owns(&self, scope: &CacheScope) -> bool {
        matches!(scope, CacheScope::Application { namespace, placement_history }
            if *namespace == self.namespace && *placement_history == self.placement_history)
    }
}

/// Application state: when it was first seen, and whether it finished.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppRecord {
    pub uid: String,
    pub init_at: UnixMillis,
    pub finished_at: Option<UnixMillis>,
}

/// A token master key. The material never leaves the node (it is not reported nor dumped).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterKey {
    pub id: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterKey")
            .field("id", &self.id)
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .finish()
    }
}

/// Per-container token bookkeeping: which role the token was issued for and when it expires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub role: String,
    pub expires_at: UnixMillis,
}

/// The whole tokens subsystem.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenState {
    pub current: Option<MasterKey>,
    pub previous: Option<MasterKey>,
    /// Keyed by pod UID.
    pub containers: BTreeMap<String, TokenRecord>,
}

/// A deletion the agent will perform, and the tasks to run after it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionTask {
    pub id: u64,
    /// Paths relative to the cache root.
    pub paths: Vec<String>,
    pub scheduled_at: UnixMillis,
    pub successors: Vec<u64>,
    /// Why the deletion was scheduled (free text for operators).
    pub reason: String,
}

/// The containers subsystem as loaded, with the records that were discarded for lack of a
/// `requested` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainersState {
    pub containers: BTreeMap<ContainerId, ContainerRecord>,
    pub discarded: Vec<ContainerId>,
}

/// One state transition. A batch of them is committed atomically and durably by `StateStore::apply`.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    ContainerRequested(ContainerId, ContainerRequest),
    ContainerLaunched(ContainerId, UnixMillis),
    ContainerKilled(ContainerId, KillRecord),
    ContainerCompleted(ContainerId, Completion),
    ContainerRestarts(ContainerId, u32),
    /// The container started again in place: new launch time; the previous kill and completion
    /// records are cleared.
    ContainerRelaunched(ContainerId, UnixMillis),
    ContainerDiagnostics(ContainerId, String),
    ContainerRemoved(ContainerId),
    LocalizationStarted {
        scope: CacheScope,
        local_path: String,
        request: ResourceRequest,
    },
    /// Replaces the `started` entry atomically.
    LocalizationCompleted {
        scope: CacheScope,
        local_path: String,
        record: LocalizedRecord,
    },
    /// Removes both the `started` and the `completed` entry.
    LocalizationRemoved {
        scope: CacheScope,
        local_path: String,
    },
    ApplicationStored(AppId, AppRecord),
    ApplicationFinished(AppId, UnixMillis),
    ApplicationRemoved(AppId),
    CurrentMasterKey(MasterKey),
    PreviousMasterKey(MasterKey),
    ContainerTokenStored(String, TokenRecord),
    ContainerTokenRemoved(String),
    DeletionTaskStored(DeletionTask),
    DeletionTaskRemoved(u64),
}
