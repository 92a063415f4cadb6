//! Runs drains: taints synchronously, then per node in its own task re-checks, evicts, waits for
//! the pods to be gone (watching the pod cache), and deletes or marks the node; rolls back on failure.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::CachedPod;
use ebb_api::ScaleDownMode;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::Store;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::budget_gate::DisruptionGate;
use super::drain::{Drain, DrainEvent, EvictionCall, GiveUpReason, Outcome, Step};
use super::evict::{EvictionObserver, EvictionSettings, Evictor, evict_all, evict_once};
use super::nodes::{NodeWriteError, NodeWriter, Written};
use super::pods::{self, PodRef};
use super::recheck::{RecheckInputs, recheck};
use super::removal::{HandedOff, Remover};
use super::status::Evicted;
use super::taints::EbbTaint;
use super::tracker::Tracker;
use crate::metrics::{
    DrainResult, Function, Metrics, RemovalLabels, RemovalOutcome, ScaleDownKind, ScaleDownLabels,
};
use crate::scaledown::eligibility::ARRIVAL_WINDOW;
use crate::scaledown::removal_method::Target;
use crate::state::Stores;

mod hand_off;
mod observer;
mod shutdown;
mod waits;

use observer::Observer;
use shutdown::Shutdown;
pub use shutdown::{SHUTDOWN_ROLLBACK_RESERVE, ShutdownReport};
pub use waits::{POD_GONE_SLACK, RECORDED_TIMEOUT};

/// Default extra wait, after the node watch shows the `to-be-deleted` taint, before the
/// re-check. Nothing: what protects the plan is the taint seen by the watch (the scheduler's
/// watch sees it as soon), the re-check refusing nodes with pods on their way, a drain giving
/// up when a pod lands after all, and no node deleted within [`ARRIVAL_WINDOW`] of its taint.
pub const DEFAULT_RECHECK_DELAY: Duration = Duration::ZERO;
/// Attempts at removing the taint when a drain is rolled back.
const ROLLBACK_ATTEMPTS: u32 = 5;

/// One node to drain.
pub struct DrainOrder {
    pub policy: String,
    pub node: String,
    pub kind: ScaleDownKind,
    /// `Drain` or `DrainAndDelete` (`DryRun` is refused).
    pub mode: ScaleDownMode,
    pub settings: EvictionSettings,
    /// Uids of the pods on the node when the planner decided (pods not in it landed since).
    pub planned_pods: BTreeSet<String>,
    /// Where the plan put each pod (uid → node): its replacement is steered there.
    pub destinations: std::collections::BTreeMap<String, String>,
    /// Set when picking up a drain found tainted at start: no new taint is written.
    pub resume_from: Option<jiff::Timestamp>,
    /// What the re-check plans with (see [`super::recheck`]).
    pub recheck: RecheckInputs,
    /// Cancelled when the policy is deleted or the controller stops.
    pub cancel: CancellationToken,
    /// `DrainAndDelete`: what removing the node acts on (`None`: the Node object).
    pub target: Option<Target>,
    /// The policy's `minNodesPerGroup`, which a Cluster API group keeps too.
    pub group_min: i32,
    /// `removal.timeout`: how long a handed-off machine may take to go before it is reported
    /// stuck.
    pub removal_timeout: Duration,
}

/// Why a drain did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("policy {policy}: mode DryRun never drains (node {node})")]
    DryRun { policy: String, node: String },
    #[error(transparent)]
    Taint(#[from] NodeWriteError),
}

/// Carries drains out. Cheap to clone.
#[derive(Clone)]
pub struct Actuator {
    /// Sends evictions: a PDB's 429 must reach the drain, so no automatic retry here.
    client: kube::Client,
    nodes: NodeWriter,
    pods: Store<CachedPod>,
    /// The shared caches and cluster model: a drain waits for its taint to show in the node
    /// cache, and re-checks on the model.
    stores: Stores,
    pod_changes: watch::Receiver<u64>,
    gate: DisruptionGate,
    /// The bound on eviction calls in flight, shared by every drain of every policy.
    in_flight: super::evict::InFlight,
    /// The bound on replacements starting, shared by every drain of every policy.
    pacer: super::pacing::Pacer,
    remover: Remover,
    tracker: Tracker,
    metrics: Metrics,
    recheck_delay: Duration,
    /// One re-check at a time. They take the cluster model's lock anyway; each on a blocking
    /// thread of its own, a wave's 50 made 50 threads, and the allocator kept every thread's
    /// memory of the plan it ran (the controller's RSS 240 MiB over its live heap at 5,000
    /// nodes). Waiting here costs no thread.
    rechecks: Arc<tokio::sync::Semaphore>,
    /// Where evicted pods' replacements are steered (their planned destinations).
    steering: crate::steering::Steering,
    finished: Option<mpsc::UnboundedSender<String>>,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    shutdown: Shutdown,
    /// The Lease's fence: no taint, eviction or removal is written outside it.
    leadership: crate::state::Leadership,
}

impl Actuator {
    /// `client` writes nodes and, unless [`Self::with_eviction_client`] says otherwise, sends
    /// the evictions; `stores` are the shared caches and model; `pod_changes` ticks on every pod
    /// event.
    pub fn new(
        client: kube::Client,
        stores: Stores,
        pod_changes: watch::Receiver<u64>,
        tracker: Tracker,
        metrics: Metrics,
    ) -> Self {
        let pods = stores.pods.clone();
        Self {
            nodes: NodeWriter::new(client.clone()),
            remover: Remover::new(client.clone()),
            client,
            gate: DisruptionGate::new(pods.clone(), pod_changes.clone())
                .with_index(stores.pod_index.clone()),
            in_flight: Default::default(),
            pacer: super::pacing::Pacer::new(
                super::pacing::DEFAULT_MIN_STARTING,
                super::pacing::DEFAULT_MAX_STARTING,
                pods.clone(),
                stores.pod_index.clone(),
                pod_changes.clone(),
            )
            .with_metrics(metrics.clone()),
            pods,
            stores,
            pod_changes,
            tracker,
            metrics,
            recheck_delay: DEFAULT_RECHECK_DELAY,
            rechecks: Arc::new(tokio::sync::Semaphore::new(1)),
            steering: Default::default(),
            finished: None,
            tasks: Arc::default(),
            shutdown: Shutdown::default(),
            leadership: Default::default(),
        }
    }

    /// Writes only within `leadership`'s fence (the Lease held and not possibly passed on).
    pub fn with_leadership(mut self, leadership: crate::state::Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    /// `Err(Fenced)` once this replica may no longer write (its Lease may be another's).
    fn fenced(&self) -> Result<(), GiveUpReason> {
        if self.leadership.may_write() {
            Ok(())
        } else {
            Err(GiveUpReason::Cancelled)
        }
    }

    /// Drains stop with the controller's `stop` (see [`Actuator::stop_drains`]).
    pub fn with_stop(mut self, stop: CancellationToken) -> Self {
        self.shutdown.stopping = stop;
        self
    }

    /// Send an eviction only when the PodDisruptionBudgets in `pdbs` allow it (`pdb_changes`
    /// ticks on every budget event). Without it every eviction is sent and a refusal retried.
    pub fn with_budgets(
        mut self,
        pdbs: Store<PodDisruptionBudget>,
        pdb_changes: watch::Receiver<u64>,
    ) -> Self {
        self.gate = self.gate.with_budgets(pdbs, pdb_changes);
        self
    }

    /// Send evictions through `client` (one without kube's automatic retry of 429s, so that a
    /// PodDisruptionBudget's refusal reaches the drain; see `run::Clients`).
    pub fn with_eviction_client(mut self, client: kube::Client) -> Self {
        self.client = client;
        self
    }

    /// Remove drained nodes with `remover` (which methods it carries out).
    pub fn with_remover(mut self, remover: Remover) -> Self {
        self.remover = remover;
        self
    }

    pub fn remover(&self) -> &Remover {
        &self.remover
    }

    /// At most `limit` eviction calls in flight at once, all drains together.
    pub fn with_max_evictions_in_flight(mut self, limit: usize) -> Self {
        self.in_flight = super::evict::InFlight::new(limit);
        self
    }

    /// Replacements of the controller's evictions starting at once, all drains together: `min`
    /// at first and at least, more as the cluster's start rate allows, at most `max` (0:
    /// evictions are not paced by their replacements).
    pub fn with_starting_replacements(mut self, min: usize, max: usize) -> Self {
        self.pacer = super::pacing::Pacer::new(
            min,
            max,
            self.pods.clone(),
            self.stores.pod_index.clone(),
            self.pod_changes.clone(),
        )
        .with_metrics(self.metrics.clone());
        self
    }

    /// Extra wait between the taint showing in the node cache and the re-check.
    pub fn with_recheck_delay(mut self, delay: Duration) -> Self {
        self.recheck_delay = delay;
        self
    }

    /// Open a steering slot for each evicted pod with a planned destination, in `steering`
    /// (the one the admission webhook asks).
    pub fn with_steering(mut self, steering: crate::steering::Steering) -> Self {
        self.steering = steering;
        self
    }

    /// Send the policy's name here when one of its drains ends (to reconcile it at once).
    pub fn notify_finished(mut self, tx: mpsc::UnboundedSender<String>) -> Self {
        self.finished = Some(tx);
        self
    }

    /// Brings the pacing's counts and metrics up to date (once a policy loop).
    pub fn refresh_pacing(&self) {
        self.pacer.refresh();
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    pub fn node_writer(&self) -> &NodeWriter {
        &self.nodes
    }

    /// Taint the node `to-be-deleted` now (unless resuming) and drain it in a task. `Ok(None)`
    /// when the node is already being drained or no longer exists.
    pub async fn start(
        &self,
        order: DrainOrder,
    ) -> Result<Option<JoinHandle<Outcome>>, StartError> {
        if order.mode == ScaleDownMode::DryRun {
            return Err(StartError::DryRun {
                policy: order.policy,
                node: order.node,
            });
        }
        if self.tracker.get(&order.node).is_some()
            || self.shutdown.stopping.is_cancelled()
            || !self.leadership.may_write()
        {
            return Ok(None);
        }
        let now = jiff::Timestamp::now();
        let started = match order.resume_from {
            Some(at) => at,
            None => {
                let t0 = std::time::Instant::now();
                let written = self
                    .nodes
                    .add_taint(&order.node, EbbTaint::ToBeDeleted, now)
                    .await?;
                self.metrics.observe(Function::actuate, t0.elapsed());
                if written == Written::NotFound {
                    return Ok(None);
                }
                now
            }
        };
        if !self
            .tracker
            .begin(Drain::new(&order.policy, &order.node, order.kind, started))
        {
            return Ok(None);
        }
        let span = tracing::info_span!(
            "drain",
            policy = %order.policy,
            node = %order.node,
            mode = ?order.mode,
            kind = ?order.kind,
            resumed = order.resume_from.is_some(),
            pods = tracing::field::Empty,
            outcome = tracing::field::Empty,
            reason = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let this = self.clone();
        let handle = tokio::spawn(async move { this.run(order).await }.instrument(span));
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(handle.abort_handle());
        }
        Ok(Some(handle))
    }

    async fn run(self, mut order: DrainOrder) -> Outcome {
        let t0 = std::time::Instant::now();
        tracing::info!(resumed = order.resume_from.is_some(), "drain started");
        let mut handed_off = false;
        let began = tokio::time::Instant::now();
        let outcome = match self.drive(&mut order, began).await {
            Ok(()) => Outcome::Removed,
            Err(reason) => {
                // A machine handed off is going: its node is never made schedulable again.
                handed_off = self
                    .tracker
                    .get(&order.node)
                    .is_some_and(|d| d.phase == ebb_api::reasons::DrainPhase::WaitingForRemoval);
                if !self.leadership.may_write() {
                    // Fenced: another replica may hold the Lease and act on this node; leave it
                    // as a killed process would (tainted, for the next leader).
                    tracing::warn!(
                        "the Lease may be another replica's; node left for the next leader"
                    );
                } else if !handed_off {
                    self.roll_back(&order.node).await;
                }
                Outcome::GaveUp(reason)
            }
        };
        if self.shutdown.stopping.is_cancelled() {
            let c = &self.shutdown.counts;
            let n = match (&outcome, handed_off) {
                (Outcome::Removed, _) => &c.finished,
                (Outcome::GaveUp(_), true) => &c.handed_off,
                (Outcome::GaveUp(_), false) => &c.rolled_back,
            };
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let now = jiff::Timestamp::now();
        match &outcome {
            Outcome::Removed => {
                self.step(&order.node, DrainEvent::Finished);
                self.metrics
                    .nodes_scaled_down
                    .get_or_create(&ScaleDownLabels {
                        policy: order.policy.clone(),
                        reason: order.kind,
                    })
                    .inc();
                tracing::info!(took_ms = t0.elapsed().as_millis() as u64, "drain finished");
            }
            Outcome::GaveUp(reason) => {
                self.tracker
                    .apply(&order.node, DrainEvent::GiveUp(reason.clone()), now);
                if handed_off {
                    tracing::warn!(reason = reason.as_str(), %reason, "drain stopped while its machine is going; node left to go");
                } else {
                    tracing::warn!(reason = reason.as_str(), %reason, "drain abandoned; node untainted");
                }
            }
        }
        let took = t0.elapsed();
        let span = tracing::Span::current();
        span.record("outcome", outcome.as_str());
        if let Outcome::GaveUp(reason) = &outcome {
            span.record("reason", reason.as_str());
        }
        span.record("duration_ms", took.as_millis() as u64);
        self.metrics.observe(Function::actuate, took);
        self.metrics
            .observe_drain(&order.policy, DrainResult::from(&outcome), took);
        if let Some(tx) = &self.finished {
            let _ = tx.send(order.policy.clone());
        }
        outcome
    }

    /// Tainted: once the watch shows the taint (the scheduler's watch sees it as soon, so no new
    /// pod is placed here after), re-checks that nothing changed under the plan. Returns the
    /// pods on the node then. The order's planner state is released here: a drain runs for
    /// minutes after its re-check, and the loop's state it shares is not needed again.
    async fn rechecked(&self, order: &mut DrainOrder) -> Result<Vec<Arc<CachedPod>>, GiveUpReason> {
        let node = order.node.as_str();
        tokio::select! {
            _ = order.cancel.cancelled() => return Err(GiveUpReason::Cancelled),
            _ = self.taint_seen(node) => {}
        }
        if !self.recheck_delay.is_zero() {
            tokio::select! {
                _ = order.cancel.cancelled() => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep(self.recheck_delay) => {}
            }
        }
        // The pods and the model as they are when this drain's turn comes.
        let _one = tokio::select! {
            _ = order.cancel.cancelled() => return Err(GiveUpReason::Cancelled),
            permit = self.rechecks.acquire() => permit
                .map_err(|e| GiveUpReason::ApiError(format!("re-check not run: {e}")))?,
        };
        let snapshot = self.pods_on(node);
        let landed =
            pods::landed_since_plan(node, &order.planned_pods, snapshot.iter().map(|p| &**p));
        if !landed.is_empty() {
            return Err(GiveUpReason::PodsLanded(landed));
        }
        let (stores, inputs, owned) = (
            self.stores.clone(),
            order.recheck.take(),
            order.node.clone(),
        );
        let in_flight = self.tracker.in_flight();
        tokio::task::spawn_blocking(move || recheck(&stores, &inputs, &in_flight, &owned))
            .await
            .map_err(|e| GiveUpReason::ApiError(format!("re-check crashed: {e}")))?
            .map_err(GiveUpReason::NoLongerRemovable)?;
        Ok(snapshot)
    }

    /// Evicts every pod of the node (DaemonSet pods best-effort) within the drain's settings.
    async fn evict_pods(
        &self,
        order: &DrainOrder,
        snapshot: &[Arc<CachedPod>],
    ) -> Result<(), GiveUpReason> {
        let node = order.node.as_str();
        let on_node = pods::classify(node, snapshot.iter().map(|p| &**p));
        tracing::Span::current().record("pods", on_node.evict.len() as u64);
        let observer = Observer {
            objects: snapshot
                .iter()
                .filter_map(|p| Some((p.metadata.uid.clone()?, p.clone())))
                .collect(),
            tracker: self.tracker.clone(),
            policy: order.policy.clone(),
            node: order.node.clone(),
            steering: self.steering.clone(),
            destinations: order.destinations.clone(),
        };
        let evictor = Evictor {
            fence: &self.leadership,
            client: self.client.clone(),
            gate: &self.gate,
            in_flight: &self.in_flight,
            pacer: &self.pacer,
            drain: self.pacer.drain_place(),
            metrics: &self.metrics,
            policy: &order.policy,
            observer: &observer,
        };
        let failed = evict_all(
            &evictor,
            on_node.evict.clone(),
            &order.settings,
            &order.cancel,
        )
        .await;
        // Stopped with every eviction accepted: past the point of no return, the drain finishes
        // within the shutdown bound (see `stop_drains`).
        if order.cancel.is_cancelled()
            && !(failed.is_empty() && self.shutdown.stopping.is_cancelled())
        {
            return Err(GiveUpReason::Cancelled);
        }
        if !failed.is_empty() {
            return Err(GiveUpReason::EvictionTimeout { pods: failed });
        }
        for ds in &on_node.daemon_set {
            self.fenced()?;
            let call = evict_once(&self.client, ds, order.settings.grace_cap).await;
            tracing::debug!(pod = %ds.key(), ?call, "DaemonSet pod evicted best-effort");
        }
        let remaining = pods::remaining(node, self.pods_on(node).iter().map(|p| &**p)).len();
        self.step(
            node,
            DrainEvent::EvictionsAccepted {
                remaining: remaining as i32,
            },
        );
        Ok(())
    }

    /// Apply an event to the tracked drain; invalid transitions are bugs, logged loudly.
    fn step(&self, node: &str, event: DrainEvent) {
        match self.tracker.apply(node, event, jiff::Timestamp::now()) {
            Some(Ok(Step::Continue(phase))) => tracing::debug!(%phase, "drain phase"),
            Some(Ok(Step::Done(_))) | None => {}
            Some(Err(e)) => tracing::error!(error = %e, "drain state machine"),
        }
    }

    fn pods_now(&self) -> Vec<Arc<CachedPod>> {
        self.pods.state()
    }

    /// The cached pods bound to `node` (from the index: a pass over every pod cost 50 drains a
    /// core at 5,000 nodes).
    fn pods_on(&self, node: &str) -> Vec<Arc<CachedPod>> {
        self.stores.pod_index.on_node(node, &self.pods)
    }

    async fn drive(
        &self,
        order: &mut DrainOrder,
        began: tokio::time::Instant,
    ) -> Result<(), GiveUpReason> {
        let node = order.node.clone();
        let node = node.as_str();
        if order.resume_from.is_some()
            && order.mode == ScaleDownMode::DrainAndDelete
            && let Some(target) = &order.target
            && self
                .remover
                .committed(node, target)
                .await
                .map_err(|e| GiveUpReason::ApiError(e.to_string()))?
        {
            // Handed off before a restart: finish the removal, nothing to re-check or evict.
            tracing::info!(
                node,
                "removal was handed off before a restart; waiting for it"
            );
            self.step(node, DrainEvent::RecheckPassed);
            self.step(node, DrainEvent::PodsGone);
            self.recorded(order).await;
            self.fenced()?;
            return self.remove(order).await;
        }
        let snapshot = self.rechecked(order).await?;
        self.step(node, DrainEvent::RecheckPassed);
        self.evict_pods(order, &snapshot).await?;

        // WaitingForPods.
        self.wait_pods_gone(order).await?;
        self.step(node, DrainEvent::PodsGone);
        // Nothing may be on its way here when the node goes (a binding the scheduler began
        // before it saw the taint).
        self.settle_arrivals(order, began).await?;

        // Deleting.
        self.recorded(order).await;
        self.fenced()?;
        if order.mode == ScaleDownMode::DrainAndDelete {
            return self.remove(order).await;
        }
        self.nodes
            .mark_drained(node)
            .await
            .map_err(|e| GiveUpReason::ApiError(e.to_string()))?;
        Ok(())
    }

    /// Resolves when a drain past its point of no return stops: its policy's drains were
    /// cancelled (policy deleted or switched to DryRun), or the shutdown bound is spent. The
    /// controller's stop alone does not stop it: it finishes within the bound.
    async fn abandoned(&self, order: &DrainOrder) {
        let policy = async {
            order.cancel.cancelled().await;
            if self.shutdown.stopping.is_cancelled() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = self.shutdown.deadline.cancelled() => {}
            _ = policy => {}
        }
    }

    /// Remove the `to-be-deleted` taint; retried, then left to the start-up sweep.
    async fn roll_back(&self, node: &str) {
        for attempt in 1..=ROLLBACK_ATTEMPTS {
            match self.nodes.remove_taint(node, EbbTaint::ToBeDeleted).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "could not untaint node");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
            }
        }
        tracing::error!(
            node,
            "node left tainted to-be-deleted; the next loop of its policy removes the taint"
        );
    }
}
