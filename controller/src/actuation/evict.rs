//! Evictions through the policy/v1 Eviction API: per pod, sent once the disruption gate allows it,
//! with the retry rule of [`after_eviction`](super::drain::after_eviction); per node in parallel.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::budget_gate::{Admission, DisruptionGate, Reservation};
use super::drain::{EvictionCall, Retry, after_eviction, grace_seconds};
use super::pacing::{PACING, Pacer, Taken};
use super::pods::PodRef;
use crate::metrics::{EvictionLabels, EvictionResult, Metrics};

/// How a policy evicts (from its spec).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionSettings {
    /// `maxGracefulTermination`.
    pub grace_cap: Duration,
    /// `evictionRetryInterval`.
    pub retry_interval: Duration,
    /// `maxPodEvictionTime`.
    pub max_time: Duration,
    /// Evictions in flight at once on one node.
    pub parallelism: usize,
}

impl EvictionSettings {
    pub fn from_spec(spec: &ebb_api::ScaleDownPolicySpec) -> Self {
        Self {
            grace_cap: spec.max_graceful_termination.as_duration(),
            retry_interval: spec.eviction_retry_interval.as_duration(),
            max_time: spec.max_pod_eviction_time.as_duration(),
            parallelism: DEFAULT_PARALLELISM,
        }
    }
}

/// Evictions in flight at once per node unless configured otherwise.
pub const DEFAULT_PARALLELISM: usize = 8;

/// Eviction calls in flight at once in the whole controller unless configured otherwise
/// (`--max-evictions-in-flight`): 50 drains of 8 would otherwise send 400 at once, and an API
/// server slow to answer them gets more, not fewer.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// The controller's eviction calls in flight, bounded: a call takes a slot once its budgets
/// allowed it (a pod waiting for its budget holds none) and gives it back with its answer.
#[derive(Clone, Debug)]
pub struct InFlight {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
}

/// One call's slot; counted in `ebb_evictions_in_flight` until dropped (answered or cancelled).
struct Slot<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    gauge: &'a prometheus_client::metrics::gauge::Gauge,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl InFlight {
    /// At most `limit` calls at once (at least 1).
    pub fn new(limit: usize) -> Self {
        Self {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(limit.max(1))),
        }
    }

    /// A slot, counted in `gauge`, or `None` when cancelled first.
    async fn slot<'a>(
        &'a self,
        cancel: &CancellationToken,
        gauge: &'a prometheus_client::metrics::gauge::Gauge,
    ) -> Option<Slot<'a>> {
        let permit = tokio::select! {
            _ = cancel.cancelled() => None,
            permit = self.slots.acquire() => permit.ok(),
        }?;
        gauge.inc();
        Some(Slot {
            _permit: permit,
            gauge,
        })
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_IN_FLIGHT)
    }
}

/// Observer of eviction calls (the drain counts 429s, the tracker remembers evictions).
pub trait EvictionObserver: Send + Sync {
    /// Just before an Eviction call for `pod` is sent (the pod's replacement may be created
    /// before its answer arrives).
    fn before_call(&self, _pod: &PodRef) {}
    fn on_call(&self, pod: &PodRef, call: &EvictionCall);
}

fn classify(result: Result<kube::core::Status, kube::Error>) -> EvictionCall {
    match result {
        Ok(_) => EvictionCall::Accepted,
        Err(kube::Error::Api(status)) if status.code == 404 => EvictionCall::Gone,
        Err(kube::Error::Api(status)) if status.code == 429 => EvictionCall::Blocked,
        Err(e) => EvictionCall::Failed(e.to_string()),
    }
}

/// One Eviction call: grace capped, precondition on the pod's uid (never evict a replacement
/// that reused the name).
///
/// The request is built here rather than with `Api::evict`: kube-core 5.0 serializes the delete
/// options as `delete_options`, a field the API server ignores, which would drop the grace cap.
pub async fn evict_once(client: &kube::Client, pod: &PodRef, grace_cap: Duration) -> EvictionCall {
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            grace_period_seconds: Some(i64::from(grace_seconds(pod.grace, grace_cap))),
            preconditions: (!pod.uid.is_empty()).then(|| Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        }),
    };
    let request = serde_json::to_vec(&eviction)
        .map_err(|e| e.to_string())
        .and_then(|body| {
            axum::http::Request::post(format!(
                "/api/v1/namespaces/{}/pods/{}/eviction",
                pod.namespace, pod.name
            ))
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| e.to_string())
        });
    match request {
        Ok(req) => classify(client.request::<kube::core::Status>(req).await),
        Err(e) => EvictionCall::Failed(format!("building the eviction of {}: {e}", pod.key())),
    }
}

/// What the Eviction API answered, as span events and attributes name it: `accepted`,
/// `refused` (a PodDisruptionBudget said 429), `gone` (404) or `error`.
pub fn pdb_answer(call: &EvictionCall) -> &'static str {
    match call {
        EvictionCall::Accepted => "accepted",
        EvictionCall::Blocked => "refused",
        EvictionCall::Gone => "gone",
        EvictionCall::Failed(_) => "error",
    }
}

/// Where an eviction is sent from: the client, the gate of the budgets, and who is told.
pub struct Evictor<'a> {
    /// No Eviction is sent outside this fence (the Lease may be another replica's).
    pub fence: &'a crate::state::Leadership,
    pub client: kube::Client,
    pub gate: &'a DisruptionGate,
    /// The controller-wide bound on calls in flight.
    pub in_flight: &'a InFlight,
    /// The controller-wide bound on replacements starting.
    pub pacer: &'a Pacer,
    /// This drain's place in the pacing's line ([`Pacer::drain_place`]).
    pub drain: u64,
    pub metrics: &'a Metrics,
    pub policy: &'a str,
    pub observer: &'a dyn EvictionObserver,
}

/// The time a pod's eviction has left: `maxPodEvictionTime` from its first try, started again
/// each time the budget it waits for lets another of this process's evictions through. A wave
/// of drains paced by a budget that keeps moving is not stuck; one that lets nothing through
/// for `maxPodEvictionTime` is.
#[derive(Debug)]
struct Window {
    start: tokio::time::Instant,
    max_time: Duration,
    /// The budget waited for and how far it had moved when last looked at.
    waiting: Option<(String, u64)>,
}

impl Window {
    fn new(max_time: Duration) -> Self {
        Self {
            start: tokio::time::Instant::now(),
            max_time,
            waiting: None,
        }
    }

    fn deadline(&self) -> tokio::time::Instant {
        self.start + self.max_time
    }

    /// Time used since the window last started (the retry rule's `elapsed`).
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The eviction waits for `pdb`, which has let `moved` evictions through; when it is the
    /// budget seen before and it moved since, the window starts again.
    fn observe(&mut self, pdb: &str, moved: u64) -> Seen {
        let seen = match &self.waiting {
            Some((p, m)) if p == pdb && moved > *m => Seen::Moved,
            Some((p, _)) if p == pdb => Seen::Still,
            _ => Seen::New,
        };
        if seen == Seen::Moved {
            self.start = tokio::time::Instant::now();
        }
        self.waiting = Some((pdb.to_string(), moved));
        seen
    }
}

/// What a look at the budget a pod waits for found.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A budget this eviction was not waiting for yet.
    New,
    /// The same budget, which let another eviction through since.
    Moved,
    /// The same budget, not moved.
    Still,
}

/// Waits until the budgets over `pod` allow its eviction (a budget change or `retry_interval`
/// wakes it), holding its disruptions. `None` when cancelled or the window closed.
async fn admitted(
    ev: &Evictor<'_>,
    pod: &PodRef,
    settings: &EvictionSettings,
    cancel: &CancellationToken,
    window: &mut Window,
) -> Option<Reservation> {
    loop {
        match ev.gate.admit(pod) {
            Admission::Send(r) => return Some(r),
            Admission::Wait { pdb } => {
                let seen = window.observe(&pdb, ev.gate.moved(&pdb));
                if seen == Seen::Moved {
                    tracing::debug!(pod = %pod.key(), %pdb, "the budget moved: maxPodEvictionTime starts again");
                }
                if seen == Seen::New {
                    tracing::info!(pod = %pod.key(), %pdb, "eviction waits for its disruption budget");
                    count(ev, EvictionResult::deferred);
                }
            }
        }
        if !wait_in(window, settings, cancel, |wait| ev.gate.changed(wait)).await {
            return None;
        }
    }
}

/// Counts one eviction call's `result`, or one wait of an eviction held back (once per wait).
fn count(ev: &Evictor<'_>, result: EvictionResult) {
    ev.metrics
        .evictions
        .get_or_create(&EvictionLabels {
            policy: ev.policy.to_string(),
            result,
        })
        .inc();
}

/// Waits for `changed` (given at most `retry_interval` and what is left of the window); false
/// when cancelled or the window closed.
async fn wait_in<F: std::future::Future<Output = ()>>(
    window: &Window,
    settings: &EvictionSettings,
    cancel: &CancellationToken,
    changed: impl FnOnce(Duration) -> F,
) -> bool {
    let now = tokio::time::Instant::now();
    let deadline = window.deadline();
    if now >= deadline {
        return false;
    }
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = changed(settings.retry_interval.min(deadline - now)) => true,
    }
}

/// Waits until fewer replacements of the controller's evictions are starting than the pacing's
/// bound (a pod event, a count given back or running out wakes it). The
/// window starts again each time a count ends: a wave paced by replacements that keep starting
/// is not stuck. `None` when cancelled or the window closed.
async fn paced(
    ev: &Evictor<'_>,
    pod: &PodRef,
    settings: &EvictionSettings,
    cancel: &CancellationToken,
    window: &mut Window,
) -> Option<Taken> {
    let mut turn = ev.pacer.turn(ev.drain);
    loop {
        if let Some(taken) = turn.take(pod) {
            return Some(taken);
        }
        if window.observe(PACING, ev.pacer.progress()) == Seen::New {
            tracing::debug!(pod = %pod.key(), starting = ev.pacer.starting(), "eviction waits for replacements to start");
            count(ev, EvictionResult::paced);
        }
        let seen = turn.seen();
        if !wait_in(window, settings, cancel, |wait| {
            ev.pacer.changed(seen, wait)
        })
        .await
        {
            return None;
        }
    }
}

/// Evict `pod` once its budgets allow it, retrying 429s and errors every `retry_interval` until
/// `max_time` (a wait for a budget that lets other evictions through starts it again). True
/// when the pod is on its way out; false when it gave up or was cancelled.
pub async fn evict_with_retry(
    ev: &Evictor<'_>,
    pod: &PodRef,
    settings: &EvictionSettings,
    cancel: &CancellationToken,
) -> bool {
    let mut window = Window::new(settings.max_time);
    let mut attempts: u32 = 0;
    loop {
        let Some(reservation) = admitted(ev, pod, settings, cancel, &mut window).await else {
            return false;
        };
        // The budgets first, then the replacements starting: a pod its budget holds back takes
        // no place among the replacements, which other drains' pods could use.
        let Some(taken) = paced(ev, pod, settings, cancel, &mut window).await else {
            ev.gate.settle(reservation, false);
            return false;
        };
        let Some(slot) = ev
            .in_flight
            .slot(cancel, &ev.metrics.evictions_in_flight)
            .await
        else {
            ev.gate.settle(reservation, false);
            ev.pacer.settle(taken, false);
            return false;
        };
        // Checked once the slot is taken: the wait for it may have outlasted the Lease.
        if !ev.fence.may_write() {
            ev.gate.settle(reservation, false);
            ev.pacer.settle(taken, false);
            tracing::warn!(pod = %pod.key(), "not evicting: the Lease may be another replica's");
            return false;
        }
        ev.observer.before_call(pod);
        let call = evict_once(&ev.client, pod, settings.grace_cap).await;
        drop(slot);
        let accepted = matches!(call, EvictionCall::Accepted);
        ev.gate.settle(reservation, accepted);
        ev.pacer.settle(taken, accepted);
        attempts += 1;
        let result = match &call {
            EvictionCall::Accepted => EvictionResult::evicted,
            EvictionCall::Gone => EvictionResult::gone,
            EvictionCall::Blocked => EvictionResult::blocked_by_pdb,
            EvictionCall::Failed(e) => {
                tracing::warn!(pod = %pod.key(), error = %e, "eviction failed; will retry");
                EvictionResult::error
            }
        };
        // One span event per call: the pod and what the API server (its PDB check) answered.
        let answer = pdb_answer(&call);
        tracing::info!(pod = %pod.key(), pdb = answer, "eviction");
        let span = tracing::Span::current();
        span.record("pdb", answer);
        span.record("attempts", u64::from(attempts));
        count(ev, result);
        ev.observer.on_call(pod, &call);
        match after_eviction(
            &call,
            window.elapsed(),
            settings.retry_interval,
            settings.max_time,
        ) {
            Retry::Done => return true,
            Retry::GiveUp => return false,
            Retry::After(wait) => {
                tokio::select! {
                    _ = cancel.cancelled() => return false,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Evict every pod, at most `settings.parallelism` at once. Returns the pods that could not be
/// evicted (`namespace/name`, sorted).
pub async fn evict_all(
    ev: &Evictor<'_>,
    pods: Vec<PodRef>,
    settings: &EvictionSettings,
    cancel: &CancellationToken,
) -> Vec<String> {
    let parallelism = settings.parallelism.max(1);
    let mut failed: Vec<String> = futures::stream::iter(pods)
        .map(|pod| {
            let span = tracing::info_span!(
                "evict",
                pod = %pod.key(),
                pdb = tracing::field::Empty,
                attempts = tracing::field::Empty,
            );
            async move {
                let t0 = std::time::Instant::now();
                let ok = evict_with_retry(ev, &pod, settings, cancel).await;
                tracing::debug!(
                    ok,
                    took_ms = t0.elapsed().as_millis() as u64,
                    "eviction done"
                );
                (!ok).then(|| pod.key())
            }
            .instrument(span)
        })
        .buffer_unordered(parallelism)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    failed.sort();
    failed
}
