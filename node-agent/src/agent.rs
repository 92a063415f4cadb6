//! `ebb-node-agent run`: opens the store (or the null store), recovers against the live pods,
//! then reacts to pod and PlacementHistory changes, finished fetches and timers, committing every
//! transition through the group writer before acting on it, and reports NodeState.

mod recover;
mod report;
mod reporting;
mod running;
mod start;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use ebb_api::nodestate::RecoveryResult;
use kube::Client;

use crate::cli::RunArgs;
use crate::store::{
    LmdbStore, NullStore, OpenOptions, Opened, SchemaVersion, StateStore, StoreError,
    reset_state_dir,
};
use start::start;

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// How the store came up.
pub struct OpenedStore {
    pub store: Arc<dyn StateStore>,
    pub result: RecoveryResult,
    /// `None` for the null store.
    pub schema: Option<SchemaVersion>,
}

/// Opens the store in `dir` (the null store without one). An unreadable or incompatible store
/// fails the start unless `reset` is set: then it is moved aside (timestamped) and a new one made.
pub fn open_store(dir: Option<&Path>, reset: bool) -> anyhow::Result<OpenedStore> {
    let Some(dir) = dir else {
        tracing::warn!("no --state-dir: using the null store; nothing survives a restart");
        return Ok(OpenedStore {
            store: Arc::new(NullStore),
            result: RecoveryResult::NotPersistent,
            schema: None,
        });
    };
    let store = match LmdbStore::open(dir, &OpenOptions::default()) {
        Ok(s) => s,
        Err(e @ (StoreError::Open { .. } | StoreError::IncompatibleSchema { .. })) if reset => {
            let aside = reset_state_dir(dir, jiff::Timestamp::now())?;
            tracing::warn!(error = %e, moved_to = %aside.display(), "--reset-state: moved the old state store aside; starting empty");
            LmdbStore::open(dir, &OpenOptions::default())?
        }
        Err(e) => return Err(e.into()),
    };
    let result = match store.opened() {
        Opened::New => RecoveryResult::New,
        Opened::Existing { previous } => {
            if previous != SchemaVersion::CURRENT {
                tracing::info!(from = %previous, to = %SchemaVersion::CURRENT, "state store schema re-stamped");
            }
            RecoveryResult::Recovered
        }
    };
    Ok(OpenedStore {
        store: Arc::new(store),
        result,
        schema: Some(SchemaVersion::CURRENT),
    })
}

/// Binds the node-local API's socket with mode 0660 from the start: bound under a temporary
/// name, given its mode, then renamed over `path` (replacing a stale socket, never following a
/// link placed there).
pub fn bind_socket(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create the socket directory {}", parent.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("--socket {} names no file", path.display()))?;
    let tmp = parent.join(format!(
        ".{}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let unix = tokio::net::UnixListener::bind(&tmp)
        .with_context(|| format!("cannot bind the Unix socket --socket {}", path.display()))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o660))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot place the socket at {}", path.display()));
    }
    Ok(unix)
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    // the store is checked before anything else, so a bad one fails fast with its own message
    let opened = open_store(args.state_dir.as_deref(), args.reset_state)?;
    let client = Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    run_with(args, opened, client, std::future::pending()).await
}

/// The agent over an opened store and a client, until SIGTERM, Ctrl-C or `stop` resolves.
pub async fn run_with(
    args: RunArgs,
    opened: OpenedStore,
    client: Client,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (mut agent, fetch_results) = start(args, opened, client).await?;
    agent.run_until_stopped(fetch_results, stop).await?;
    agent.shut_down();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::start::parse_secret_ref;
    use super::*;

    #[test]
    fn unreadable_store_fails_the_start_unless_reset() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("data.mdb"), vec![1u8; 8192]).unwrap();
        let err = open_store(Some(&state), false).err().unwrap();
        assert!(format!("{err:#}").contains("--reset-state"), "{err:#}");
        assert!(state.join("data.mdb").exists());

        let opened = open_store(Some(&state), true).unwrap();
        assert_eq!(opened.result, RecoveryResult::New);
        assert!(opened.store.can_recover());
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("state.reset-"))
            .collect();
        assert_eq!(aside.len(), 1, "the old store is kept aside");
    }

    #[test]
    fn no_state_dir_means_the_null_store() {
        let opened = open_store(None, false).unwrap();
        assert_eq!(opened.result, RecoveryResult::NotPersistent);
        assert!(!opened.store.can_recover());
        assert_eq!(opened.schema, None);
    }

    #[test]
    fn existing_store_is_reported_recovered() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_store(Some(dir.path()), false).unwrap());
        let opened = open_store(Some(dir.path()), false).unwrap();
        assert_eq!(opened.result, RecoveryResult::Recovered);
        assert_eq!(opened.schema, Some(SchemaVersion::CURRENT));
    }

    #[tokio::test]
    async fn the_socket_is_created_with_mode_0660_over_a_stale_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/agent.sock");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"stale").unwrap();
        let listener = bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660, "{mode:o}");
        let (client, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        assert!(client.is_ok() && accepted.is_ok(), "reachable at its path");
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary socket left");
    }

    #[test]
    fn token_secret_reference_is_namespace_slash_name() {
        assert_eq!(
            parse_secret_ref("ebb-system/keys").unwrap(),
            ("ebb-system".to_string(), "keys".to_string())
        );
        assert!(parse_secret_ref("keys").is_err());
        assert!(parse_secret_ref("/keys").is_err());
    }
}
