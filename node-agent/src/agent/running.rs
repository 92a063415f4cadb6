//! The running agent: the main loop over pod events, finished fetches, housekeeping and report
//! ticks and signals; each reaction is committed through the writer before its fetches start.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ebb_api::PlacementHistory;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::now_ms;
use crate::api::ApiState;
use crate::cli::RunArgs;
use crate::core::{AgentCore, Step};
use crate::fetch_policy::FetchPolicy;
use crate::kube_edge;
use crate::livepod::LivePod;
use crate::localizer::{FetchRequest, Fetcher};
use crate::metrics::AgentMetrics;
use crate::store::{GroupWriter, LocalizedRecord, StateStore, UnixMillis};
use crate::tokens::keys_from_secret;

pub(super) use super::reporting::Reporting;

/// A finished fetch, as its task reports it.
pub(super) type FetchResult = (FetchRequest, Result<LocalizedRecord, String>);
/// Where finished fetches arrive.
pub(super) type FetchResults = mpsc::UnboundedReceiver<FetchResult>;

/// The core, the writer that commits its transitions and what acts on them.
pub(super) struct Runtime {
    pub core: AgentCore,
    pub writer: GroupWriter,
    pub fetcher: Fetcher,
    pub fetch_tx: mpsc::UnboundedSender<FetchResult>,
    pub api: ApiState,
}

impl Runtime {
    /// Starts the writer over `store`; finished fetches arrive on the returned channel.
    pub fn start(
        store: Arc<dyn StateStore>,
        core: AgentCore,
        fetcher: Fetcher,
        api: ApiState,
    ) -> (Runtime, FetchResults) {
        let (fetch_tx, fetch_results) = mpsc::unbounded_channel();
        let rt = Runtime {
            writer: GroupWriter::spawn(store, 256),
            core,
            fetcher,
            fetch_tx,
            api,
        };
        (rt, fetch_results)
    }

    /// Commits the step's transitions, then starts its fetches and refreshes the API view.
    pub async fn apply(&mut self, step: Step) {
        let commit_span = tracing::info_span!("commit", transitions = step.ops.len());
        if !step.ops.is_empty()
            && let Err(e) = self.writer.commit(step.ops).instrument(commit_span).await
        {
            tracing::error!(error = %e, "could not record transitions; the store is unhealthy");
        }
        for req in step.fetches {
            self.spawn_fetch(req);
        }
        let pods = self.core.api_pods();
        let keys = self.core.keys.clone();
        self.api.update(|v| {
            v.pods = pods;
            v.keys = keys;
        });
    }

    /// Runs one fetch in its own task; its result comes back through `fetch_tx`.
    fn spawn_fetch(&self, req: FetchRequest) {
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
}

/// The agent once started: its runtime, the cluster it talks to and what it tracks between
/// events.
pub(super) struct Agent {
    pub args: RunArgs,
    pub client: Client,
    /// The token key Secret, as namespace and name.
    pub secret: (String, String),
    pub policy: Arc<FetchPolicy>,
    pub metrics: Arc<AgentMetrics>,
    pub histories: Store<PlacementHistory>,
    pub _history_task: tokio::task::JoinHandle<()>,
    pub rt: Runtime,
    pub reporting: Reporting,
    /// The PlacementHistories last given to the core (UID and resource version of each).
    pub history_sig: Vec<(Option<String>, Option<String>)>,
    /// Pods seen since the pod watch started a re-list.
    pub relist: Option<BTreeSet<String>>,
}

/// Every PlacementHistory in the cache.
pub(super) fn current_histories(store: &Store<PlacementHistory>) -> Vec<PlacementHistory> {
    store.state().iter().map(|p| (**p).clone()).collect()
}

fn history_signature(store: &Store<PlacementHistory>) -> Vec<(Option<String>, Option<String>)> {
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

impl Agent {
    /// Reacts to pods, finished fetches and timers until the pod watch ends, SIGTERM, Ctrl-C or
    /// `stop`.
    pub async fn run_until_stopped(
        &mut self,
        mut fetch_results: FetchResults,
        stop: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        self.history_sig = history_signature(&self.histories);
        let pod_events = kube_edge::watch_node_pods(&self.client, &self.args.node_name);
        futures::pin_mut!(pod_events);
        let mut housekeeping = tokio::time::interval(Duration::from_secs(2));
        let mut report_tick =
            tokio::time::interval(Duration::from_secs(self.args.report_interval_secs.max(1)));
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        self.reporting.started = Instant::now();
        tracing::info!(node = %self.args.node_name, "agent ready");
        futures::pin_mut!(stop);
        loop {
            tokio::select! {
                ev = pod_events.next() => {
                    let Some(ev) = ev else { break };
                    self.on_pod_event(ev).await;
                }
                Some((req, result)) = fetch_results.recv() => {
                    let step = self.rt.core.fetch_done(&req, result, now_ms());
                    self.rt.apply(step).await;
                }
                _ = housekeeping.tick() => self.housekeeping().await,
                _ = report_tick.tick() => self.report().await,
                _ = &mut stop => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = sigterm.recv() => break,
            }
        }
        Ok(())
    }

    /// Lets the writer finish committed work and removes the socket.
    pub fn shut_down(self) {
        tracing::info!("stopping: waiting for the writer to finish committed work");
        let Agent { rt, args, .. } = self;
        drop(rt);
        if !args.no_socket {
            let _ = std::fs::remove_file(&args.socket);
        }
    }

    async fn on_pod_event(&mut self, ev: Result<Event<Pod>, watcher::Error>) {
        let now = now_ms();
        match ev {
            Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => {
                if let Some(live) = LivePod::from_pod(&p, now) {
                    if let Some(seen) = self.relist.as_mut() {
                        seen.insert(live.uid.clone());
                    }
                    let step = self.rt.core.observe_pod(live, now);
                    self.rt.apply(step).await;
                }
            }
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    let step = self.rt.core.pod_gone(uid, now);
                    self.rt.apply(step).await;
                }
            }
            Ok(Event::Init) => self.relist = Some(BTreeSet::new()),
            Ok(Event::InitDone) => self.relist_done(now).await,
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying with backoff"),
        }
    }

    /// A re-list finished: the pods it did not return are gone.
    async fn relist_done(&mut self, now: UnixMillis) {
        let Some(seen) = self.relist.take() else {
            return;
        };
        let gone: Vec<String> = self
            .rt
            .core
            .live_pods()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            let step = self.rt.core.pod_gone(&uid, now);
            self.rt.apply(step).await;
        }
    }

    /// Follows PlacementHistory changes, retries due fetches, runs due deletions and expires
    /// tokens.
    async fn housekeeping(&mut self) {
        let now = now_ms();
        self.follow_histories(now).await;
        let retries = self.rt.core.retry_due(now);
        if !retries.ops.is_empty() || !retries.fetches.is_empty() {
            self.rt.apply(retries).await;
        }
        let (mut ops, problems) = self.rt.core.run_due_deletions(now);
        for p in problems {
            tracing::warn!("{p}");
        }
        ops.extend(self.rt.core.expire(now));
        if !ops.is_empty() {
            tracing::info!(
                transitions = ops.len(),
                pending_deletions = self.rt.core.deletions.pending(),
                "housekeeping"
            );
            self.rt
                .apply(Step {
                    ops,
                    fetches: vec![],
                })
                .await;
        }
    }

    /// Gives the core the PlacementHistories again when any changed, and observes every pod
    /// against them.
    async fn follow_histories(&mut self, now: UnixMillis) {
        let sig = history_signature(&self.histories);
        if sig == self.history_sig {
            return;
        }
        self.history_sig = sig;
        let mut step = self
            .rt
            .core
            .set_histories(current_histories(&self.histories), now);
        step.extend(self.rt.core.reobserve_all(now));
        self.rt.apply(step).await;
    }

    /// Reads the token key Secret and records keys that changed; the stored keys stay when the
    /// Secret cannot be read or used.
    pub async fn refresh_keys(&mut self) {
        let (namespace, name) = &self.secret;
        let secret = format!("{namespace}/{name}");
        let data = match kube_edge::read_secret(&self.client, namespace, name).await {
            Ok(Some(data)) => data,
            Ok(None) => {
                tracing::warn!(secret = %secret, "token key Secret not found; keeping the keys in the store");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the token key Secret; keeping the keys in the store");
                return;
            }
        };
        let from_secret = match keys_from_secret(&data) {
            Ok(keys) => keys,
            Err(e) => {
                tracing::warn!(secret = %secret, error = %e, "token key Secret is unusable; keeping the keys in the store");
                return;
            }
        };
        let ops = self.rt.core.keys.reconcile(&from_secret);
        if ops.is_empty() {
            return;
        }
        self.rt.core.keys.apply(&ops);
        tracing::info!(
            current = ?self.rt.core.keys.current.as_ref().map(|k| &k.id),
            previous = ?self.rt.core.keys.previous.as_ref().map(|k| &k.id),
            "token keys updated"
        );
        self.rt
            .apply(Step {
                ops,
                fetches: vec![],
            })
            .await;
    }

    /// Creates this node's NodeState when missing, learning the node's addresses on the way.
    pub async fn ensure_node_state(&self) {
        match kube_edge::ensure_node_state(&self.client, &self.args.node_name).await {
            Ok(node) => self
                .policy
                .set_node_addresses(kube_edge::node_addresses(&node)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot create the NodeState yet; will retry with the next report")
            }
        }
    }
}
