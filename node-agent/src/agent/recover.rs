//! Recovery at start, off the async runtime, in one `recover` trace span that carries what each
//! subsystem found; then its log lines, metrics and the NodeState recovery status.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use ebb_api::conditions::Time;
use ebb_api::nodestate::{RecoveryResult, RecoveryStatus};

use crate::cache::CacheLimits;
use crate::cli::RunArgs;
use crate::core::{AgentCore, CoreConfig, Recovered};
use crate::livepod::LivePod;
use crate::metrics::AgentMetrics;
use crate::store::{StateStore, UnixMillis};

/// Recovers the core from `store` against the `live` pods.
pub(super) async fn recover(
    args: &RunArgs,
    store: Arc<dyn StateStore>,
    live: BTreeMap<String, LivePod>,
    now: UnixMillis,
) -> anyhow::Result<(AgentCore, Recovered)> {
    tracing::info!(node = %args.node_name, live_pods = live.len(), "recovering state");
    let cfg = core_config(args);
    let span = recover_span(&args.node_name, live.len());
    let recovery_span = span.clone();
    let (core, recovered) = tokio::task::spawn_blocking(move || {
        recovery_span.in_scope(|| AgentCore::recover(cfg, store.as_ref(), live, now))
    })
    .await
    .context("recovery task")?
    .context("recovery failed; the store is left as it was")?;
    log_recovery(&span, &recovered);
    Ok((core, recovered))
}

fn core_config(args: &RunArgs) -> CoreConfig {
    CoreConfig {
        cache_root: args.cache_dir.clone(),
        max_resource_bytes: args.max_resource_bytes,
        limits: CacheLimits {
            namespace_quota: args.namespace_quota_bytes,
            node_capacity: args.cache_max_bytes,
            ..CacheLimits::default()
        },
    }
}

/// One trace per recovery: the fields are filled in when it finishes.
fn recover_span(node: &str, live_pods: usize) -> tracing::Span {
    tracing::info_span!(
        "recover",
        node = %node,
        live_pods = live_pods,
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
    )
}

/// Records what recovery found on its span, and logs it with its warnings.
fn log_recovery(span: &tracing::Span, recovered: &Recovered) {
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
        parent: span,
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
        tracing::warn!(parent: span, "{w}");
    }
}

pub(super) fn record_recovery_metrics(metrics: &AgentMetrics, recovered: &Recovered) {
    metrics
        .recovery_seconds
        .set(recovered.duration_ms as f64 / 1000.0);
    metrics.recovery_lost.set(recovered.summary.lost as i64);
}

pub(super) fn recovery_status(
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
