//! Backend-independent translation between records and key/value pairs: `writes_for` turns a
//! transition into puts and deletes, the `decode_*` functions rebuild each subsystem from pairs.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::StoreError;
use super::keys::{self, AppField, ContainerField, LocalizationPhase};
use super::records::*;

/// One key/value change inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put {
        db: &'static str,
        key: String,
        value: Vec<u8>,
    },
    Delete {
        db: &'static str,
        key: String,
    },
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // postcard only fails on types it cannot represent (maps with non-string keys are fine;
    // our records contain nothing else), so this is an invariant of the record types.
    postcard::to_stdvec(value).unwrap_or_else(|e| unreachable!("record encodes: {e}"))
}

pub fn decode<T: DeserializeOwned>(db: &str, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt {
        db: db.to_string(),
        key: key.to_string(),
        message: e.to_string(),
    })
}

fn put<T: Serialize>(db: &'static str, key: String, value: &T) -> Write {
    Write::Put {
        db,
        key,
        value: encode(value),
    }
}

fn del(db: &'static str, key: String) -> Write {
    Write::Delete { db, key }
}

/// The puts and deletes that persist one transition.
pub fn writes_for(op: &Op, out: &mut Vec<Write>) {
    use ContainerField as F;
    use keys::{
        DB_APPLICATIONS as APPS, DB_CONTAINERS as C, DB_DELETION as D, DB_LOCALIZATION as L,
        DB_TOKENS as T,
    };
    match op {
        Op::ContainerRequested(id, req) => out.push(put(C, keys::container(id, F::Requested), req)),
        Op::ContainerLaunched(id, at) => out.push(put(C, keys::container(id, F::Launched), at)),
        Op::ContainerKilled(id, kill) => out.push(put(C, keys::container(id, F::Killed), kill)),
        Op::ContainerCompleted(id, done) => {
            out.push(put(C, keys::container(id, F::Completed), done))
        }
        Op::ContainerRelaunched(id, at) => {
            out.push(put(C, keys::container(id, F::Launched), at));
            out.push(del(C, keys::container(id, F::Killed)));
            out.push(del(C, keys::container(id, F::Completed)));
        }
        Op::ContainerRestarts(id, n) => out.push(put(C, keys::container(id, F::Restarts), n)),
        Op::ContainerDiagnostics(id, msg) => {
            out.push(put(C, keys::container(id, F::Diagnostics), msg))
        }
        Op::ContainerRemoved(id) => {
            out.extend(ContainerField::ALL.map(|f| del(C, keys::container(id, f))))
        }
        Op::LocalizationStarted {
            scope,
            local_path,
            request,
        } => out.push(put(
            L,
            keys::localization(scope, LocalizationPhase::Started, local_path),
            request,
        )),
        Op::LocalizationCompleted {
            scope,
            local_path,
            record,
        } => {
            out.push(del(
                L,
                keys::localization(scope, LocalizationPhase::Started, local_path),
            ));
            out.push(put(
                L,
                keys::localization(scope, LocalizationPhase::Completed, local_path),
                record,
            ));
        }
        Op::LocalizationRemoved { scope, local_path } => {
            for phase in [LocalizationPhase::Started, LocalizationPhase::Completed] {
                out.push(del(L, keys::localization(scope, phase, local_path)));
            }
        }
        Op::ApplicationStored(app, rec) => {
            out.push(put(
                APPS,
                keys::application(app, AppField::Init),
                &(rec.uid.as_str(), rec.init_at),
            ));
            match rec.finished_at {
                Some(at) => out.push(put(APPS, keys::application(app, AppField::Finished), &at)),
                None => out.push(del(APPS, keys::application(app, AppField::Finished))),
            }
        }
        Op::ApplicationFinished(app, at) => {
            out.push(put(APPS, keys::application(app, AppField::Finished), at))
        }
        Op::ApplicationRemoved(app) => {
            out.push(del(APPS, keys::application(app, AppField::Init)));
            out.push(del(APPS, keys::application(app, AppField::Finished)));
        }
        Op::CurrentMasterKey(key) => out.push(put(T, keys::TOKENS_CURRENT.to_string(), key)),
        Op::PreviousMasterKey(key) => out.push(put(T, keys::TOKENS_PREVIOUS.to_string(), key)),
        Op::ContainerTokenStored(uid, rec) => out.push(put(T, keys::container_token(uid), rec)),
        Op::ContainerTokenRemoved(uid) => out.push(del(T, keys::container_token(uid))),
        Op::DeletionTaskStored(task) => out.push(put(D, keys::deletion_task(task.id), task)),
        Op::DeletionTaskRemoved(id) => out.push(del(D, keys::deletion_task(*id))),
    }
}

/// A key/value pair read from one database.
pub type Pair<'a> = (&'a str, &'a [u8]);

fn bad_key(db: &str, key: &str) -> StoreError {
    StoreError::Corrupt {
        db: db.to_string(),
        key: key.to_string(),
        message: "key does not follow the documented layout".to_string(),
    }
}

pub fn decode_containers<'a>(
    pairs: impl IntoIterator<Item = Pair<'a>>,
) -> Result<ContainersState, StoreError> {
    let db = keys::DB_CONTAINERS;
    let mut all: BTreeMap<ContainerId, ContainerRecord> = BTreeMap::new();
    for (key, value) in pairs {
        let (id, field) = keys::parse_container(key).ok_or_else(|| bad_key(db, key))?;
        let rec = all.entry(id).or_default();
        match field {
            ContainerField::Requested => rec.requested = Some(decode(db, key, value)?),
            ContainerField::Launched => rec.launched_at = Some(decode(db, key, value)?),
            ContainerField::Killed => rec.killed = Some(decode(db, key, value)?),
            ContainerField::Completed => rec.completed = Some(decode(db, key, value)?),
            ContainerField::Restarts => rec.restart_count = decode(db, key, value)?,
            ContainerField::Diagnostics => rec.diagnostics = Some(decode(db, key, value)?),
        }
    }
    let mut state = ContainersState::default();
    for (id, rec) in all {
        if rec.requested.is_some() {
            state.containers.insert(id, rec);
        } else {
            state.discarded.push(id);
        }
    }
    Ok(state)
}

pub fn decode_localization<'a>(
    pairs: impl IntoIterator<Item = Pair<'a>>,
) -> Result<Vec<LocalizationEntry>, StoreError> {
    let db = keys::DB_LOCALIZATION;
    let mut out: BTreeMap<(CacheScope, String), LocalizationState> = BTreeMap::new();
    for (key, value) in pairs {
        let (scope, phase, path) = keys::parse_localization(key).ok_or_else(|| bad_key(db, key))?;
        let state = match phase {
            LocalizationPhase::Started => LocalizationState::Started(decode(db, key, value)?),
            LocalizationPhase::Completed => LocalizationState::Completed(decode(db, key, value)?),
        };
        // `completed` wins over a stale `started` (they are replaced atomically, so both are
        // present only if a writer outside this layout left them).
        match out.get(&(scope.clone(), path.clone())) {
            Some(LocalizationState::Completed(_)) => {}
            _ => {
                out.insert((scope, path), state);
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|((scope, local_path), state)| LocalizationEntry {
            scope,
            local_path,
            state,
        })
        .collect())
}

pub fn decode_applications<'a>(
    pairs: impl IntoIterator<Item = Pair<'a>>,
) -> Result<BTreeMap<AppId, AppRecord>, StoreError> {
    let db = keys::DB_APPLICATIONS;
    let mut inits: BTreeMap<AppId, (String, UnixMillis)> = BTreeMap::new();
    let mut finished: BTreeMap<AppId, UnixMillis> = BTreeMap::new();
    for (key, value) in pairs {
        let (app, field) = keys::parse_application(key).ok_or_else(|| bad_key(db, key))?;
        match field {
            AppField::Init => {
                inits.insert(app, decode(db, key, value)?);
            }
            AppField::Finished => {
                finished.insert(app, decode(db, key, value)?);
            }
        }
    }
    Ok(inits
        .into_iter()
        .map(|(app, (uid, init_at))| {
            let finished_at = finished.get(&app).copied();
            (
                app,
                AppRecord {
                    uid,
                    init_at,
                    finished_at,
                },
            )
        })
        .collect())
}

pub fn decode_tokens<'a>(
    pairs: impl IntoIterator<Item = Pair<'a>>,
) -> Result<TokenState, StoreError> {
    let db = keys::DB_TOKENS;
    let mut state = TokenState::default();
    for (key, value) in pairs {
        if key == keys::TOKENS_CURRENT {
            state.current = Some(decode(db, key, value)?);
        } else if key == keys::TOKENS_PREVIOUS {
            state.previous = Some(decode(db, key, value)?);
        } else if let Some(uid) = key.strip_prefix(keys::TOKENS_CONTAINER_PREFIX) {
            state
                .containers
                .insert(uid.to_string(), decode(db, key, value)?);
        } else {
            return Err(bad_key(db, key));
        }
    }
    Ok(state)
}

pub fn decode_deletion_tasks<'a>(
    pairs: impl IntoIterator<Item = Pair<'a>>,
) -> Result<BTreeMap<u64, DeletionTask>, StoreError> {
    let db = keys::DB_DELETION;
    let mut out = BTreeMap::new();
    for (key, value) in pairs {
        let id = keys::parse_deletion_task(key).ok_or_else(|| bad_key(db, key))?;
        let task: DeletionTask = decode(db, key, value)?;
        out.insert(id, task);
    }
    Ok(out)
}
