//! `ebb-node-agent dump`: the whole state store as JSON for operators and tests. Opens the store
//! read-only (safe while the agent runs) and never prints key material, only key ids.

use std::path::Path;

use serde_json::{Value, json};

use crate::store::{LmdbStore, OpenOptions, StateStore, StoreError};

/// Opens `dir` read-only and renders it.
pub fn dump_dir(dir: &Path) -> Result<Value, StoreError> {
    let store = LmdbStore::open(
        dir,
        &OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )?;
    dump_store(&store)
}

/// Renders every subsystem of an open store.
pub fn dump_store(store: &LmdbStore) -> Result<Value, StoreError> {
    let state = store.load_all()?;
    let schema = match store.schema_version()? {
        Some(v) => Value::String(v.to_string()),
        None => Value::Null,
    };
    let containers: Vec<Value> = state
        .containers
        .containers
        .iter()
        .map(|(id, rec)| {
            json!({
                "podUid": id.pod_uid,
                "container": id.container,
                "requested": rec.requested,
                "launchedAt": rec.launched_at,
                "killed": rec.killed,
                "completed": rec.completed,
                "restartCount": rec.restart_count,
                "diagnostics": rec.diagnostics,
            })
        })
        .collect();
    let discarded: Vec<String> = state
        .containers
        .discarded
        .iter()
        .map(|id| id.to_string())
        .collect();
    let applications: Vec<Value> = state
        .applications
        .iter()
        .map(|(app, rec)| {
            json!({
                "namespace": app.namespace,
                "placementHistory": app.placement_history,
                "uid": rec.uid,
                "initAt": rec.init_at,
                "finishedAt": rec.finished_at,
            })
        })
        .collect();
    let deletion_tasks: Vec<&crate::store::DeletionTask> = state.deletion_tasks.values().collect();
    Ok(json!({
        "stateDir": store.dir().display().to_string(),
        "schemaVersion": schema,
        "containers": containers,
        "discardedContainers": discarded,
        "localization": state.localization,
        "applications": applications,
        "tokens": {
            "currentKeyId": state.tokens.current.as_ref().map(|k| k.id.clone()),
            "previousKeyId": state.tokens.previous.as_ref().map(|k| k.id.clone()),
            "containers": state.tokens.containers,
        },
        "deletionTasks": deletion_tasks,
    }))
}
