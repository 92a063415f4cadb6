//! The node agent's state store: a `StateStore` trait over which every state transition is
//! committed durably, with an LMDB implementation (`LmdbStore`) and a no-op one (`NullStore`).

pub mod codec;
pub mod keys;
pub mod lmdb;
pub mod null;
pub mod records;
pub mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use lmdb::{LmdbStore, OpenOptions, Opened, reset_state_dir};
pub use null::NullStore;
pub use records::*;
pub use writer::{GroupWriter, WriterHealth};

/// Schema version of the stored data. Same major: load and re-stamp. Other major: refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SchemaVersion {
    pub major: u32,
    pub minor: u32,
}

impl SchemaVersion {
    /// The version this build writes.
    pub const CURRENT: SchemaVersion = SchemaVersion { major: 1, minor: 0 };

    pub fn parse(text: &str) -> Option<SchemaVersion> {
        let (major, minor) = text.trim().split_once('.')?;
        Some(SchemaVersion {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

impl std::fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "state store {dir} has schema version {found}, this agent supports {supported}: \
         run an agent of major version {} against it, or start with --reset-state to move it aside and start empty",
        found.major
    )]
    IncompatibleSchema {
        dir: PathBuf,
        found: SchemaVersion,
        supported: SchemaVersion,
    },
    #[error(
        "cannot open state store in {dir}: {message}; the store is left untouched: check the \
         directory (permissions, disk), or start with --reset-state to move it aside and start empty"
    )]
    Open { dir: PathBuf, message: String },
    #[error("state store: database {db}, key {key:?} cannot be read: {message}")]
    Corrupt {
        db: String,
        key: String,
        message: String,
    },
    #[error("state store write failed: {0}")]
    Write(String),
    #[error("state store read failed: {0}")]
    Read(String),
    #[error("no state directory is configured (null store): there is nothing to load")]
    NotRecoverable,
    #[error("the state store writer has stopped; the store is unhealthy")]
    WriterStopped,
}

/// Everything loaded from a store, per subsystem, in recovery order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadedState {
    pub localization: Vec<LocalizationEntry>,
    pub applications: BTreeMap<AppId, AppRecord>,
    pub containers: ContainersState,
    pub tokens: TokenState,
    pub deletion_tasks: BTreeMap<u64, DeletionTask>,
}

/// Durable node-agent state. `apply` commits a batch of transitions in one durable transaction;
/// the `load_*` functions read one subsystem each. The helpers below name the YARN operations.
pub trait StateStore: Send + Sync {
    /// False for the null store: nothing can be recovered from it.
    fn can_recover(&self) -> bool;
    /// Commits all `ops` atomically and durably (fsync) before returning.
    fn apply(&self, ops: &[Op]) -> Result<(), StoreError>;
    fn load_containers(&self) -> Result<ContainersState, StoreError>;
    fn load_localization(&self) -> Result<Vec<LocalizationEntry>, StoreError>;
    fn load_applications(&self) -> Result<BTreeMap<AppId, AppRecord>, StoreError>;
    fn load_tokens(&self) -> Result<TokenState, StoreError>;
    fn load_deletion_tasks(&self) -> Result<BTreeMap<u64, DeletionTask>, StoreError>;

    /// Loads every subsystem, in recovery order.
    fn load_all(&self) -> Result<LoadedState, StoreError> {
        Ok(LoadedState {
            localization: self.load_localization()?,
            applications: self.load_applications()?,
            containers: self.load_containers()?,
            tokens: self.load_tokens()?,
            deletion_tasks: self.load_deletion_tasks()?,
        })
    }

    fn store_container(&self, id: &ContainerId, req: &ContainerRequest) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerRequested(id.clone(), req.clone())])
    }
    fn store_container_launched(&self, id: &ContainerId, at: UnixMillis) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerLaunched(id.clone(), at)])
    }
    fn store_container_killed(
        &self,
        id: &ContainerId,
        kill: &KillRecord,
    ) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerKilled(id.clone(), kill.clone())])
    }
    fn store_container_completed(
        &self,
        id: &ContainerId,
        done: &Completion,
    ) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerCompleted(id.clone(), done.clone())])
    }
    fn store_container_diagnostics(&self, id: &ContainerId, msg: &str) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerDiagnostics(id.clone(), msg.to_string())])
    }
    fn remove_container(&self, id: &ContainerId) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerRemoved(id.clone())])
    }
    fn start_resource_localization(
        &self,
        scope: &CacheScope,
        local_path: &str,
        request: &ResourceRequest,
    ) -> Result<(), StoreError> {
        self.apply(&[Op::LocalizationStarted {
            scope: scope.clone(),
            local_path: local_path.to_string(),
            request: request.clone(),
        }])
    }
    fn finish_resource_localization(
        &self,
        scope: &CacheScope,
        local_path: &str,
        record: &LocalizedRecord,
    ) -> Result<(), StoreError> {
        self.apply(&[Op::LocalizationCompleted {
            scope: scope.clone(),
            local_path: local_path.to_string(),
            record: record.clone(),
        }])
    }
    fn remove_localized_resource(
        &self,
        scope: &CacheScope,
        local_path: &str,
    ) -> Result<(), StoreError> {
        self.apply(&[Op::LocalizationRemoved {
            scope: scope.clone(),
            local_path: local_path.to_string(),
        }])
    }
    fn store_application(&self, app: &AppId, rec: &AppRecord) -> Result<(), StoreError> {
        self.apply(&[Op::ApplicationStored(app.clone(), rec.clone())])
    }
    fn finish_application(&self, app: &AppId, at: UnixMillis) -> Result<(), StoreError> {
        self.apply(&[Op::ApplicationFinished(app.clone(), at)])
    }
    fn remove_application(&self, app: &AppId) -> Result<(), StoreError> {
        self.apply(&[Op::ApplicationRemoved(app.clone())])
    }
    fn store_current_master_key(&self, key: &MasterKey) -> Result<(), StoreError> {
        self.apply(&[Op::CurrentMasterKey(key.clone())])
    }
    fn store_previous_master_key(&self, key: &MasterKey) -> Result<(), StoreError> {
        self.apply(&[Op::PreviousMasterKey(key.clone())])
    }
    fn store_container_token(&self, pod_uid: &str, rec: &TokenRecord) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerTokenStored(pod_uid.to_string(), rec.clone())])
    }
    fn remove_container_token(&self, pod_uid: &str) -> Result<(), StoreError> {
        self.apply(&[Op::ContainerTokenRemoved(pod_uid.to_string())])
    }
    fn store_deletion_task(&self, task: &DeletionTask) -> Result<(), StoreError> {
        self.apply(&[Op::DeletionTaskStored(task.clone())])
    }
    fn remove_deletion_task(&self, id: u64) -> Result<(), StoreError> {
        self.apply(&[Op::DeletionTaskRemoved(id)])
    }
}

#[cfg(test)]
mod tests;
