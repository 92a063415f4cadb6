//! The agent's start, in order: fetch policy and cache directory, the API, the PlacementHistory
//! watch and the node's pods, recovery, the first observation, the token keys and the NodeState.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use ebb_api::PlacementHistory;
use kube::Client;
use kube::runtime::reflector::Store;

use super::recover::{record_recovery_metrics, recover, recovery_status};
use super::running::{Agent, FetchResults, Reporting, Runtime};
use super::{OpenedStore, now_ms};
use crate::api::{ApiState, ApiView};
use crate::cli::RunArgs;
use crate::core::{AgentCore, Step};
use crate::fetch_policy::{FetchPolicy, PolicyConfig};
use crate::kube_edge;
use crate::livepod::LivePod;
use crate::localizer::{Fetcher, FetcherConfig};
use crate::metrics::AgentMetrics;
use crate::store::{StateStore, UnixMillis};

/// Everything up to "agent ready". Returns the agent and the channel its fetches report to.
pub(super) async fn start(
    args: RunArgs,
    opened: OpenedStore,
    client: Client,
) -> anyhow::Result<(Agent, FetchResults)> {
    let secret = parse_secret_ref(&args.token_secret)?;
    let policy = Arc::new(FetchPolicy::new(policy_config(&args))?);
    prepare_cache(&args, opened.store.as_ref())?;
    let metrics = Arc::new(AgentMetrics::default());
    let api = start_api(&args, metrics.clone()).await?;
    let (histories, history_task) = watch_histories(&client).await?;
    let (live, now) = list_live_pods(&client, &args.node_name).await?;
    let (mut core, recovered) = recover(&args, opened.store.clone(), live.clone(), now).await?;
    let recovery = recovery_status(opened.result, &recovered, jiff::Timestamp::now());
    record_recovery_metrics(&metrics, &recovered);
    learn_node_addresses(&client, &args.node_name, &policy).await;
    let fetcher = Fetcher::new(fetcher_config(&args), policy.clone())?;
    let first = first_observation(&mut core, &histories, live, now);
    opened
        .store
        .apply(&first.ops)
        .context("recording the first observation after recovery")?;
    let (rt, fetch_results) = Runtime::start(opened.store.clone(), core, fetcher, api.clone());
    let mut agent = Agent {
        reporting: Reporting::new(rt.writer.health(), recovery, opened.schema),
        rt,
        args,
        client,
        secret,
        policy,
        metrics,
        histories,
        _history_task: history_task,
        history_sig: Vec::new(),
        relist: None,
    };
    let fetches = Step {
        ops: vec![],
        fetches: first.fetches,
    };
    agent.rt.apply(fetches).await;
    agent.refresh_keys().await;
    api.update(|v| v.ready = true);
    agent.ensure_node_state().await;
    Ok((agent, fetch_results))
}

pub(super) fn parse_secret_ref(s: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => anyhow::bail!("--token-secret {s:?} must be namespace/name"),
    }
}

/// The fetch policy from the flags; the agent's own directories are never fetched from.
fn policy_config(args: &RunArgs) -> PolicyConfig {
    let mut own_dirs = vec![args.cache_dir.clone()];
    own_dirs.extend(args.state_dir.clone());
    own_dirs.extend(args.socket.parent().map(Path::to_path_buf));
    PolicyConfig {
        file_roots: args.file_roots.clone(),
        allow_hosts: args.fetch_allow_hosts.clone(),
        allow_cidrs: args.fetch_allow_cidrs.clone(),
        cluster_cidrs: args.cluster_cidrs.clone(),
        own_dirs,
    }
}

/// A cache directory with files ebb did not put there is refused before anything is deleted.
fn prepare_cache(args: &RunArgs, store: &dyn StateStore) -> anyhow::Result<()> {
    let adopt = store.can_recover()
        && !store
            .load_localization()
            .context("reading the state store's localized resources")?
            .is_empty();
    crate::cache_fs::prepare_root(&args.cache_dir, adopt)?;
    Ok(())
}

/// Serves the probes, metrics and node-local API (not ready yet).
async fn start_api(args: &RunArgs, metrics: Arc<AgentMetrics>) -> anyhow::Result<ApiState> {
    let api = ApiState::new(ApiView {
        ready: false,
        cache_root: args.cache_dir.clone(),
        ..ApiView::default()
    })
    .with_metrics(metrics);
    serve_api(args, api.clone()).await?;
    Ok(api)
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
        let unix = super::bind_socket(&args.socket)?;
        let router = crate::api::api_router(state);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(unix, router).await {
                tracing::error!(error = %e, "node-local API (Unix socket) stopped");
            }
        });
    }
    Ok(())
}

/// The PlacementHistory cache, once its first list is in.
async fn watch_histories(
    client: &Client,
) -> anyhow::Result<(Store<PlacementHistory>, tokio::task::JoinHandle<()>)> {
    let (histories, task) = kube_edge::watch_histories(client);
    histories
        .wait_until_ready()
        .await
        .context("the PlacementHistory watch stopped before its first list")?;
    Ok((histories, task))
}

/// The pods bound to this node now, by UID, and the time they were listed.
async fn list_live_pods(
    client: &Client,
    node: &str,
) -> anyhow::Result<(BTreeMap<String, LivePod>, UnixMillis)> {
    let pods = kube_edge::list_node_pods(client, node)
        .await
        .with_context(|| format!("cannot list the pods of node {node}"))?;
    let now = now_ms();
    let live = pods
        .iter()
        .filter_map(|p| LivePod::from_pod(p, now))
        .map(|p| (p.uid.clone(), p))
        .collect();
    Ok((live, now))
}

/// This node's addresses, which the fetch policy refuses like private ranges.
async fn learn_node_addresses(client: &Client, node: &str, policy: &FetchPolicy) {
    match kube_edge::get_node(client, node).await {
        Ok(node) => policy.set_node_addresses(kube_edge::node_addresses(&node)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this node's addresses yet; private ranges stay refused, retrying with the next report")
        }
    }
}

fn fetcher_config(args: &RunArgs) -> FetcherConfig {
    FetcherConfig {
        concurrency: args.fetch_concurrency,
        ..FetcherConfig::new(args.cache_dir.clone())
    }
}

/// The recovered core meets the current histories and every live pod, then ends its initial
/// sync; the result is committed before the agent acts on anything.
fn first_observation(
    core: &mut AgentCore,
    histories: &Store<PlacementHistory>,
    live: BTreeMap<String, LivePod>,
    now: UnixMillis,
) -> Step {
    let mut first = core.set_histories(super::running::current_histories(histories), now);
    for p in live.into_values() {
        first.extend(core.observe_pod(p, now));
    }
    first.extend(core.after_initial_sync(now));
    first
}
