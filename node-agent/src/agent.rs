//! `ebb-node-agent run`: opens the store (or the null store), recovers against the live pods,
//! then reacts to pod and PlacementHistory changes, finished fetches and timers, committing every
//! transition through the group writer before acting on it, and reports NodeState.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ebb_api::conditions::Time;
use ebb_api::nodestate::{KeyIds, RecoveryResult, RecoveryStatus};
use futures::StreamExt;
use kube::Client;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::api::{ApiState, ApiView};
use crate::cache::CacheLimits;
use crate::cli::RunArgs;
use crate::core::{AgentCore, CoreConfig, Recovered, Step};
use crate::fetch_policy::{FetchPolicy, PolicyConfig};
use crate::kube_edge;
use crate::livepod::LivePod;
use crate::localizer::{FetchRequest, Fetcher, FetcherConfig};
use crate::report::{ReportInput, Reporter, StoreHealth, build_status};
use crate::store::{
    GroupWriter, LmdbStore, LocalizedRecord, NullStore, OpenOptions, Opened, SchemaVersion,
    StateStore, StoreError, reset_state_dir,
};
use crate::tokens::keys_from_secret;

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

async fn serve_api(args: &RunArgs, state: ApiState) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpListener::bind(args.listen_addr)
        .await
        .with_context(|| format!("cannot listen on --listen-addr {}", args.listen_addr))?;
    if let Ok(bound) = tcp.local_addr() {
        tracing::info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    }
    let router = crate::api::probe_router(state.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(tcp, router).await {
            tracing::error!(error = %e, "probes and metrics (TCP) stopped");
        }
    });
    if !args.no_socket {
        let unix = bind_socket(&args.socket)?;
        let router = crate::api::api_router(state);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(unix, router).await {
                tracing::error!(error = %e, "node-local API (Unix socket) stopped");
            }
        });
    }
    Ok(())
}

struct Runtime {
    core: AgentCore,
    writer: GroupWriter,
    fetcher: Fetcher,
    fetch_tx: mpsc::UnboundedSender<(FetchRequest, Result<LocalizedRecord, String>)>,
    api: ApiState,
}

impl Runtime {
    /// Commits the step's transitions, then starts its fetches and refreshes the API view.
    async fn apply(&mut self, step: Step) {
        let commit_span = tracing::info_span!("commit", transitions = step.ops.len());
        if !step.ops.is_empty()
            && let Err(e) = self.writer.commit(step.ops).instrument(commit_span).await
        {
            tracing::error!(error = %e, "could not record transitions; the store is unhealthy");
        }
        for req in step.fetches {
            let fetcher = self.fetcher.clone();
            let tx = self.fetch_tx.clone();
            let shown = req.shown_url();
            let span = tracing::info_span!("fetch", url = %shown, name = %req.name);
            tokio::spawn(
                async move {
                    tracing::info!(url = %shown, path = %req.local_path, "fetch started");
                    let result = fetcher.fetch(&req, now_ms).await.map_err(|e| e.to_string());
                    match &result {
                        Ok(r) => {
                            tracing::info!(url = %shown, bytes = r.size_bytes, "fetch finished")
                        }
                        Err(e) => tracing::warn!(url = %shown, namespace = %req.namespace, error = %e, "fetch failed"),
                    }
                    let _ = tx.send((req, result));
                }
                .instrument(span),
            );
        }
        let pods = self.core.api_pods();
        let keys = self.core.keys.clone();
        self.api.update(|v| {
            v.pods = pods;
            v.keys = keys;
        });
    }
}

fn parse_secret_ref(s: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => anyhow::bail!("--token-secret {s:?} must be namespace/name"),
    }
}

async fn refresh_keys(client: &Client, secret: &(String, String), rt: &mut Runtime) {
    match kube_edge::read_secret(client, &secret.0, &secret.1).await {
        Ok(Some(data)) => match keys_from_secret(&data) {
            Ok(from_secret) => {
                let ops = rt.core.keys.reconcile(&from_secret);
                if !ops.is_empty() {
                    rt.core.keys.apply(&ops);
                    tracing::info!(
                        current = ?rt.core.keys.current.as_ref().map(|k| &k.id),
                        previous = ?rt.core.keys.previous.as_ref().map(|k| &k.id),
                        "token keys updated"
                    );
                    rt.apply(Step {
                        ops,
                        fetches: vec![],
                    })
                    .await;
                }
            }
            Err(e) => {
                tracing::warn!(secret = %format!("{}/{}", secret.0, secret.1), error = %e, "token key Secret is unusable; keeping the keys in the store")
            }
        },
        Ok(None) => {
            tracing::warn!(secret = %format!("{}/{}", secret.0, secret.1), "token key Secret not found; keeping the keys in the store")
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the token key Secret; keeping the keys in the store")
        }
    }
}

fn recovery_status(
    result: RecoveryResult,
    rec: &Recovered,
    finished: jiff::Timestamp,
) -> RecoveryStatus {
    RecoveryStatus {
        result,
        finished_at: Some(Time(finished)),
        duration_ms: rec.duration_ms,
        containers: rec.summary.containers as i64,
        lost: rec.summary.lost as i64,
        localized: rec.summary.localized as i64,
        discarded_fetches: rec.summary.discarded_fetches as i64,
        deletions_resumed: rec.summary.deletions_resumed as i64,
    }
}

fn history_signature(
    store: &kube::runtime::reflector::Store<ebb_api::PlacementHistory>,
) -> Vec<(Option<String>, Option<String>)> {
    let mut sig: Vec<_> = store
        .state()
        .iter()
        .map(|ph| {
            (
                ph.metadata.uid.clone(),
                ph.metadata.resource_version.clone(),
            )
        })
        .collect();
    sig.sort();
    sig
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
    let secret = parse_secret_ref(&args.token_secret)?;
    let store = opened.store.clone();
    let mut own_dirs = vec![args.cache_dir.clone()];
    own_dirs.extend(args.state_dir.clone());
    own_dirs.extend(args.socket.parent().map(Path::to_path_buf));
    let policy = Arc::new(FetchPolicy::new(PolicyConfig {
        file_roots: args.file_roots.clone(),
        allow_hosts: args.fetch_allow_hosts.clone(),
        allow_cidrs: args.fetch_allow_cidrs.clone(),
        cluster_cidrs: args.cluster_cidrs.clone(),
        own_dirs,
    })?);
    // A cache directory with files ebb did not put there is refused before anything is deleted.
    let adopt = store.can_recover()
        && !store
            .load_localization()
            .context("reading the state store's localized resources")?
            .is_empty();
    crate::cache_fs::prepare_root(&args.cache_dir, adopt)?;

    let metrics = Arc::new(crate::metrics::AgentMetrics::default());
    let api = ApiState::new(ApiView {
        ready: false,
        cache_root: args.cache_dir.clone(),
        ..ApiView::default()
    })
    .with_metrics(metrics.clone());
    serve_api(&args, api.clone()).await?;

    let (histories, _history_task) = kube_edge::watch_histories(&client);
    histories
        .wait_until_ready()
        .await
        .context("the PlacementHistory watch stopped before its first list")?;
    let pods = kube_edge::list_node_pods(&client, &args.node_name)
        .await
        .with_context(|| format!("cannot list the pods of node {}", args.node_name))?;
    let now = now_ms();
    let live: BTreeMap<String, LivePod> = pods
        .iter()
        .filter_map(|p| LivePod::from_pod(p, now))
        .map(|p| (p.uid.clone(), p))
        .collect();

    tracing::info!(node = %args.node_name, live_pods = live.len(), "recovering state");
    let cfg = CoreConfig {
        cache_root: args.cache_dir.clone(),
        max_resource_bytes: args.max_resource_bytes,
        limits: CacheLimits {
            namespace_quota: args.namespace_quota_bytes,
            node_capacity: args.cache_max_bytes,
            ..CacheLimits::default()
        },
    };
    let recovery_store = store.clone();
    let recovery_live = live.clone();
    // One trace per recovery: the `recover` span carries what each subsystem found.
    let span = tracing::info_span!(
        "recover",
        node = %args.node_name,
        live_pods = live.len(),
        duration_ms = tracing::field::Empty,
        containers = tracing::field::Empty,
        containers_lost = tracing::field::Empty,
        completed_while_down = tracing::field::Empty,
        killed_before_launch = tracing::field::Empty,
        localized_resources = tracing::field::Empty,
        discarded_fetches = tracing::field::Empty,
        files_deleted = tracing::field::Empty,
        finished_applications = tracing::field::Empty,
        expired_tokens = tracing::field::Empty,
        deletions_resumed = tracing::field::Empty,
    );
    let recovery_span = span.clone();
    let (mut core, recovered) = tokio::task::spawn_blocking(move || {
        recovery_span
            .in_scope(|| AgentCore::recover(cfg, recovery_store.as_ref(), recovery_live, now))
    })
    .await
    .context("recovery task")?
    .context("recovery failed; the store is left as it was")?;
    let s = &recovered.summary;
    span.record("duration_ms", recovered.duration_ms);
    span.record("containers", s.containers as u64);
    span.record("containers_lost", s.lost as u64);
    span.record("completed_while_down", s.completed_while_down as u64);
    span.record("killed_before_launch", s.killed_before_launch as u64);
    span.record("localized_resources", s.localized as u64);
    span.record("discarded_fetches", s.discarded_fetches as u64);
    span.record("files_deleted", recovered.files_deleted as u64);
    span.record("finished_applications", s.finished_applications as u64);
    span.record("expired_tokens", s.expired_tokens as u64);
    span.record("deletions_resumed", s.deletions_resumed as u64);
    tracing::info!(
        parent: &span,
        duration_ms = recovered.duration_ms,
        containers = s.containers,
        lost = s.lost,
        completed_while_down = s.completed_while_down,
        killed_before_launch = s.killed_before_launch,
        localized = s.localized,
        discarded_fetches = s.discarded_fetches,
        files_deleted = recovered.files_deleted,
        finished_applications = s.finished_applications,
        expired_tokens = s.expired_tokens,
        deletions_resumed = s.deletions_resumed,
        "recovery finished"
    );
    for w in &recovered.warnings {
        tracing::warn!(parent: &span, "{w}");
    }
    drop(span);
    let recovery = recovery_status(opened.result, &recovered, jiff::Timestamp::now());
    metrics
        .recovery_seconds
        .set(recovered.duration_ms as f64 / 1000.0);
    metrics.recovery_lost.set(recovered.summary.lost as i64);

    match kube_edge::get_node(&client, &args.node_name).await {
        Ok(node) => policy.set_node_addresses(kube_edge::node_addresses(&node)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this node's addresses yet; private ranges stay refused, retrying with the next report")
        }
    }
    let fetcher = Fetcher::new(
        FetcherConfig {
            concurrency: args.fetch_concurrency,
            ..FetcherConfig::new(args.cache_dir.clone())
        },
        policy.clone(),
    )?;
    let (fetch_tx, mut fetch_rx) = mpsc::unbounded_channel();
    let mut first = core.set_histories(
        histories.state().iter().map(|p| (**p).clone()).collect(),
        now,
    );
    for p in live.into_values() {
        first.extend(core.observe_pod(p, now));
    }
    first.extend(core.after_initial_sync(now));
    store
        .apply(&first.ops)
        .context("recording the first observation after recovery")?;
    let mut rt = Runtime {
        writer: GroupWriter::spawn(store.clone(), 256),
        core,
        fetcher,
        fetch_tx,
        api: api.clone(),
    };
    rt.apply(Step {
        ops: vec![],
        fetches: first.fetches,
    })
    .await;
    refresh_keys(&client, &secret, &mut rt).await;
    api.update(|v| v.ready = true);
    match kube_edge::ensure_node_state(&client, &args.node_name).await {
        Ok(node) => policy.set_node_addresses(kube_edge::node_addresses(&node)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create the NodeState yet; will retry with the next report")
        }
    }

    let health = rt.writer.health();
    let null_store = opened.schema.is_none();
    let mut reporter = Reporter::default();
    let mut history_sig = history_signature(&histories);
    let mut relist: Option<BTreeSet<String>> = None;
    let pod_events = kube_edge::watch_node_pods(&client, &args.node_name);
    futures::pin_mut!(pod_events);
    let mut housekeeping = tokio::time::interval(Duration::from_secs(2));
    let mut report_tick =
        tokio::time::interval(Duration::from_secs(args.report_interval_secs.max(1)));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let started = Instant::now();
    tracing::info!(node = %args.node_name, "agent ready");
    futures::pin_mut!(stop);

    loop {
        tokio::select! {
            ev = pod_events.next() => {
                let Some(ev) = ev else { break };
                let now = now_ms();
                match ev {
                    Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => {
                        if let Some(live) = LivePod::from_pod(&p, now) {
                            if let Some(seen) = relist.as_mut() {
                                seen.insert(live.uid.clone());
                            }
                            let step = rt.core.observe_pod(live, now);
                            rt.apply(step).await;
                        }
                    }
                    Ok(Event::Delete(p)) => {
                        if let Some(uid) = p.metadata.uid.as_deref() {
                            let step = rt.core.pod_gone(uid, now);
                            rt.apply(step).await;
                        }
                    }
                    Ok(Event::Init) => relist = Some(BTreeSet::new()),
                    Ok(Event::InitDone) => {
                        if let Some(seen) = relist.take() {
                            let gone: Vec<String> = rt.core.live_pods().filter(|u| !seen.contains(*u)).cloned().collect();
                            for uid in gone {
                                let step = rt.core.pod_gone(&uid, now);
                                rt.apply(step).await;
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying with backoff"),
                }
            }
            Some((req, result)) = fetch_rx.recv() => {
                let step = rt.core.fetch_done(&req, result, now_ms());
                rt.apply(step).await;
            }
            _ = housekeeping.tick() => {
                let now = now_ms();
                let sig = history_signature(&histories);
                if sig != history_sig {
                    history_sig = sig;
                    let mut step = rt.core.set_histories(histories.state().iter().map(|p| (**p).clone()).collect(), now);
                    step.extend(rt.core.reobserve_all(now));
                    rt.apply(step).await;
                }
                let retries = rt.core.retry_due(now);
                if !retries.ops.is_empty() || !retries.fetches.is_empty() {
                    rt.apply(retries).await;
                }
                let (ops, problems) = rt.core.run_due_deletions(now);
                for p in problems {
                    tracing::warn!("{p}");
                }
                let mut ops = ops;
                ops.extend(rt.core.expire(now));
                if !ops.is_empty() {
                    tracing::info!(transitions = ops.len(), pending_deletions = rt.core.deletions.pending(), "housekeeping");
                    rt.apply(Step { ops, fetches: vec![] }).await;
                }
            }
            _ = report_tick.tick() => {
                refresh_keys(&client, &secret, &mut rt).await;
                let now = jiff::Timestamp::now();
                let store_health = if null_store {
                    StoreHealth { healthy: true, message: "no state directory: the null store keeps nothing across restarts".into() }
                } else if health.healthy() {
                    StoreHealth { healthy: true, message: "the state store accepts and commits writes".into() }
                } else {
                    StoreHealth { healthy: false, message: health.last_error().unwrap_or_default() }
                };
                let localized = rt.core.cache.report();
                metrics.store_healthy.set(store_health.healthy as i64);
                metrics.commits.set(health.commits() as i64);
                metrics.transitions.set(health.transitions() as i64);
                metrics.containers_tracked.set(rt.core.containers.len() as i64);
                metrics.cached_resources.set(rt.core.cache.len() as i64);
                metrics.failed_resources.set(localized.iter().filter(|l| l.state == "Failed").count() as i64);
                metrics.pending_deletions.set(rt.core.deletions.pending() as i64);
                let policies = rt.core.policies();
                let status = build_status(ReportInput {
                    agent_version: env!("CARGO_PKG_VERSION"),
                    schema_version: opened.schema,
                    recovery: recovery.clone(),
                    ready: true,
                    store: store_health,
                    containers: &rt.core.containers,
                    policies: &policies,
                    localized,
                    pending_deletions: rt.core.deletions.pending(),
                    key_ids: KeyIds {
                        current: rt.core.keys.current.as_ref().map(|k| k.id.clone()),
                        previous: rt.core.keys.previous.as_ref().map(|k| k.id.clone()),
                    },
                    now,
                }, reporter.conditions());
                if let Some(status) = reporter.next(status, now) {
                    let write = async {
                        let node = kube_edge::ensure_node_state(&client, &args.node_name).await?;
                        policy.set_node_addresses(kube_edge::node_addresses(&node));
                        kube_edge::write_status(&client, &args.node_name, &status).await
                    };
                    match write.instrument(tracing::info_span!("report", node = %args.node_name)).await {
                        Ok(()) => tracing::debug!(uptime_s = started.elapsed().as_secs(), "NodeState reported"),
                        Err(e) => {
                            reporter.forget();
                            tracing::warn!(error = %e, "cannot write NodeState; will retry");
                        }
                    }
                }
            }
            _ = &mut stop => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        }
    }
    tracing::info!("stopping: waiting for the writer to finish committed work");
    drop(rt);
    if !args.no_socket {
        let _ = std::fs::remove_file(&args.socket);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
