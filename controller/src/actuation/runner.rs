//! Runs drains: taints synchronously, then per node in its own task re-checks, evicts, waits for
//! the pods to be gone (watching the pod cache), and deletes or marks the node; rolls back on failure.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ebb_api::ScaleDownMode;
use k8s_openapi::api::core::v1::Pod;
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
use super::taints::EbbTaint;
use super::tracker::{Evicted, Tracker};
use crate::metrics::{
    DrainResult, Function, Metrics, RemovalLabels, RemovalOutcome, ScaleDownKind, ScaleDownLabels,
};
use crate::scaledown::eligibility::ARRIVAL_WINDOW;
use crate::scaledown::removal_method::Target;
use crate::state::Stores;

/// Default extra wait, after the node watch shows the `to-be-deleted` taint, before the
/// re-check. Nothing: what protects the plan is the taint seen by the watch (the scheduler's
/// watch sees it as soon), the re-check refusing nodes with pods on their way, a drain giving
/// up when a pod lands after all, and no node deleted within [`ARRIVAL_WINDOW`] of its taint.
pub const DEFAULT_RECHECK_DELAY: Duration = Duration::ZERO;
/// Longest wait for the node watch to show the taint ebb wrote (the re-check runs then anyway).
const TAINT_SEEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the node cache is looked at while waiting for the taint to show.
const TAINT_SEEN_POLL: Duration = Duration::from_millis(10);
/// How often a drain waiting for its pods looks at the cache without a change tick.
const POD_GONE_RECHECK: Duration = Duration::from_secs(5);
/// Extra time, beyond the capped grace period, that evicted pods get to disappear.
pub const POD_GONE_SLACK: Duration = Duration::from_secs(30);
/// Attempts at removing the taint when a drain is rolled back.
const ROLLBACK_ATTEMPTS: u32 = 5;
/// Attempts at a hand-off failing with a retryable error (it is idempotent).
const HAND_OFF_ATTEMPTS: u32 = 5;
/// How often a handed-off removal looks whether the machine and the Node are gone.
const REMOVAL_POLL: Duration = Duration::from_secs(2);

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
    pods: Store<Pod>,
    /// The shared caches and cluster model: a drain waits for its taint to show in the node
    /// cache, and re-checks on the model.
    stores: Stores,
    pod_changes: watch::Receiver<u64>,
    gate: DisruptionGate,
    remover: Remover,
    tracker: Tracker,
    metrics: Metrics,
    recheck_delay: Duration,
    /// Where evicted pods' replacements are steered (their planned destinations).
    steering: crate::steering::Steering,
    finished: Option<mpsc::UnboundedSender<String>>,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    shutdown: Shutdown,
}

/// How the controller's stop reaches its drains. `stopping` is the controller's stop: no drain
/// starts after it, and a drain not yet past its point of no return (every eviction accepted)
/// rolls back. `deadline` is the end of the shutdown bound: every drain still running stops where
/// it is and rolls back unless its machine was handed off.
#[derive(Clone, Default)]
struct Shutdown {
    stopping: CancellationToken,
    deadline: CancellationToken,
    counts: Arc<ShutdownCounts>,
}

/// Drains that ended after the stop, by how.
#[derive(Default)]
struct ShutdownCounts {
    finished: std::sync::atomic::AtomicUsize,
    rolled_back: std::sync::atomic::AtomicUsize,
    handed_off: std::sync::atomic::AtomicUsize,
}

/// What became of the drains in flight at a stop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Finished within the bound (node deleted, handed off and gone, or marked drained).
    pub finished: usize,
    /// Rolled back: `to-be-deleted` removed (ebb cordons only a finished `Drain`-mode node).
    pub rolled_back: usize,
    /// Stopped while its machine was going (handed off): the node is left to go.
    pub handed_off: usize,
    /// Still running when the bound and the roll-back reserve were spent: aborted where they
    /// were (the next leader picks them up from their taints).
    pub aborted: usize,
}

/// Of the shutdown bound, what is kept for roll-backs after the drains' time is up.
pub const SHUTDOWN_ROLLBACK_RESERVE: Duration = Duration::from_secs(4);
/// How often a stop logs its progress.
const SHUTDOWN_PROGRESS: Duration = Duration::from_secs(1);

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
            gate: DisruptionGate::new(pods.clone(), pod_changes.clone()),
            pods,
            stores,
            pod_changes,
            tracker,
            metrics,
            recheck_delay: DEFAULT_RECHECK_DELAY,
            steering: Default::default(),
            finished: None,
            tasks: Arc::default(),
            shutdown: Shutdown::default(),
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

    /// After the stop token was cancelled: wait up to `bound` for the drains in flight to finish
    /// or roll back, logging progress. Drains past their point of no return get the bound less
    /// [`SHUTDOWN_ROLLBACK_RESERVE`] to finish; then every drain left is stopped and rolled back
    /// within the reserve; what still runs after that is aborted.
    pub async fn stop_drains(&self, bound: Duration) -> ShutdownReport {
        let t0 = tokio::time::Instant::now();
        let rollback_at = t0 + bound.saturating_sub(SHUTDOWN_ROLLBACK_RESERVE);
        let end = t0 + bound;
        let in_flight = self.running();
        tracing::info!(
            in_flight,
            bound_ms = bound.as_millis() as u64,
            "stopping: no new drains; drains in flight finish or roll back"
        );
        let mut last_log = t0;
        loop {
            let running = self.running();
            let now = tokio::time::Instant::now();
            if running == 0 || now >= end {
                break;
            }
            if now >= rollback_at && !self.shutdown.deadline.is_cancelled() {
                tracing::warn!(
                    running,
                    "shutdown bound nearly spent: rolling back the drains still running"
                );
                self.shutdown.deadline.cancel();
            }
            if now.duration_since(last_log) >= SHUTDOWN_PROGRESS {
                last_log = now;
                let r = self.report(running);
                tracing::info!(
                    running,
                    finished = r.finished,
                    rolled_back = r.rolled_back,
                    handed_off = r.handed_off,
                    "stopping: drains in flight"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.shutdown.deadline.cancel();
        let aborted = self.running();
        self.abort_all();
        let report = self.report(aborted);
        tracing::info!(
            finished = report.finished,
            rolled_back = report.rolled_back,
            handed_off = report.handed_off,
            aborted = report.aborted,
            took_ms = t0.elapsed().as_millis() as u64,
            "stopped: drains finished or rolled back"
        );
        report
    }

    fn report(&self, aborted: usize) -> ShutdownReport {
        use std::sync::atomic::Ordering::SeqCst;
        let c = &self.shutdown.counts;
        ShutdownReport {
            finished: c.finished.load(SeqCst),
            rolled_back: c.rolled_back.load(SeqCst),
            handed_off: c.handed_off.load(SeqCst),
            aborted,
        }
    }

    /// Drain tasks still running.
    fn running(&self) -> usize {
        self.tasks
            .lock()
            .map(|t| t.iter().filter(|t| !t.is_finished()).count())
            .unwrap_or(0)
    }

    /// Stop every drain task where it is, without rolling back (as a killed process would):
    /// the next leader picks them up from their taints. A lost Lease takes this path: another
    /// leader may already act on these nodes.
    pub fn abort_all(&self) {
        if let Ok(mut tasks) = self.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
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
        if self.tracker.get(&order.node).is_some() || self.shutdown.stopping.is_cancelled() {
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

    async fn run(self, order: DrainOrder) -> Outcome {
        let t0 = std::time::Instant::now();
        tracing::info!(resumed = order.resume_from.is_some(), "drain started");
        let mut handed_off = false;
        let began = tokio::time::Instant::now();
        let outcome = match self.drive(&order, began).await {
            Ok(()) => Outcome::Removed,
            Err(reason) => {
                // A machine handed off is going: its node is never made schedulable again.
                handed_off = self
                    .tracker
                    .get(&order.node)
                    .is_some_and(|d| d.phase == ebb_api::reasons::DrainPhase::WaitingForRemoval);
                if !handed_off {
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

    /// Apply an event to the tracked drain; invalid transitions are bugs, logged loudly.
    fn step(&self, node: &str, event: DrainEvent) {
        match self.tracker.apply(node, event, jiff::Timestamp::now()) {
            Some(Ok(Step::Continue(phase))) => tracing::debug!(%phase, "drain phase"),
            Some(Ok(Step::Done(_))) | None => {}
            Some(Err(e)) => tracing::error!(error = %e, "drain state machine"),
        }
    }

    fn pods_now(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    async fn drive(
        &self,
        order: &DrainOrder,
        began: tokio::time::Instant,
    ) -> Result<(), GiveUpReason> {
        let node = order.node.as_str();
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
            return self.remove(order).await;
        }
        // Tainted: once the watch shows the taint (the scheduler's watch sees it as soon, so no
        // new pod is placed here after), re-check that nothing changed under the plan.
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
        let snapshot = self.pods_now();
        let landed =
            pods::landed_since_plan(node, &order.planned_pods, snapshot.iter().map(|p| &**p));
        if !landed.is_empty() {
            return Err(GiveUpReason::PodsLanded(landed));
        }
        let (stores, inputs, owned) = (
            self.stores.clone(),
            order.recheck.clone(),
            order.node.clone(),
        );
        let in_flight = self.tracker.in_flight();
        tokio::task::spawn_blocking(move || recheck(&stores, &inputs, &in_flight, &owned))
            .await
            .map_err(|e| GiveUpReason::ApiError(format!("re-check crashed: {e}")))?
            .map_err(GiveUpReason::NoLongerRemovable)?;
        self.step(node, DrainEvent::RecheckPassed);

        // Evicting.
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
            client: self.client.clone(),
            gate: &self.gate,
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
            let call = evict_once(&self.client, ds, order.settings.grace_cap).await;
            tracing::debug!(pod = %ds.key(), ?call, "DaemonSet pod evicted best-effort");
        }
        let remaining = pods::remaining(node, self.pods_now().iter().map(|p| &**p)).len();
        self.step(
            node,
            DrainEvent::EvictionsAccepted {
                remaining: remaining as i32,
            },
        );

        // WaitingForPods.
        self.wait_pods_gone(order).await?;
        self.step(node, DrainEvent::PodsGone);
        // Nothing may be on its way here when the node goes (a binding the scheduler began
        // before it saw the taint).
        self.settle_arrivals(order, began).await?;

        // Deleting.
        if order.mode == ScaleDownMode::DrainAndDelete {
            return self.remove(order).await;
        }
        self.nodes
            .mark_drained(node)
            .await
            .map_err(|e| GiveUpReason::ApiError(e.to_string()))?;
        Ok(())
    }

    /// `DrainAndDelete` once the pods are gone: delete the Node, or hand its machine off and
    /// wait for it and the Node to go.
    async fn remove(&self, order: &DrainOrder) -> Result<(), GiveUpReason> {
        let node = order.node.as_str();
        let target = order.target.clone().unwrap_or(Target::Node);
        self.step(
            node,
            DrainEvent::Removing(super::removal::status_for(node, &target)),
        );
        let node_uid = self.remover.node_uid(node).await.ok().flatten();
        let handed = self.hand_off(order, &target).await.inspect_err(|_| {
            self.count_removal(order, &target, RemovalOutcome::failed);
        })?;
        if target == Target::Node {
            self.count_removal(order, &target, RemovalOutcome::removed);
            return Ok(());
        }
        tracing::info!(
            method = %target.method(),
            object = %handed.status.object,
            scaled = handed.status.scaled.as_deref().unwrap_or(""),
            replicas = ?handed.replicas,
            "machine handed off"
        );
        if let Some(r) = &handed.status.scaled
            && let Some(d) = self.tracker.get(node)
            && let Some(mut status) = d.removal
        {
            status.scaled = Some(r.clone());
            self.step(node, DrainEvent::Removing(status));
        }
        self.step(node, DrainEvent::HandedOff(jiff::Timestamp::now()));
        self.count_removal(order, &target, RemovalOutcome::handed_off);
        self.wait_removed(order, &target, &handed, node_uid.as_deref())
            .await?;
        self.count_removal(order, &target, RemovalOutcome::removed);
        Ok(())
    }

    /// The hand-off, retried while it fails in a way worth retrying (it is idempotent).
    async fn hand_off(
        &self,
        order: &DrainOrder,
        target: &Target,
    ) -> Result<HandedOff, GiveUpReason> {
        let mut attempt = 1;
        loop {
            match self
                .remover
                .hand_off(&order.node, target, order.group_min)
                .await
            {
                Ok(h) => return Ok(h),
                Err(e) if e.retryable() && attempt < HAND_OFF_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "hand-off failed; trying again");
                    tokio::select! {
                        _ = self.abandoned(order) => return Err(GiveUpReason::Cancelled),
                        _ = tokio::time::sleep(Duration::from_secs(u64::from(attempt))) => {}
                    }
                    attempt += 1;
                }
                Err(e) => return Err(GiveUpReason::RemovalFailed(e.to_string())),
            }
        }
    }

    /// Waits until the Machine or NodeClaim and the Node are gone; past `removal.timeout` the
    /// drain is marked stuck (once) and keeps waiting.
    async fn wait_removed(
        &self,
        order: &DrainOrder,
        target: &Target,
        handed: &HandedOff,
        node_uid: Option<&str>,
    ) -> Result<(), GiveUpReason> {
        let deadline = tokio::time::Instant::now() + order.removal_timeout;
        let mut stuck = false;
        loop {
            match self
                .remover
                .remaining(&order.node, node_uid, target, handed.uid.as_deref())
                .await
            {
                Ok(left) if left.is_empty() => return Ok(()),
                Ok(left) if !stuck && tokio::time::Instant::now() >= deadline => {
                    stuck = true;
                    let message = format!(
                        "{} still there {}s after the hand-off",
                        left.join(" and "),
                        order.removal_timeout.as_secs()
                    );
                    tracing::warn!(%message, "removal stuck");
                    self.step(&order.node, DrainEvent::RemovalStuck(message));
                    self.count_removal(order, target, RemovalOutcome::stuck);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot check the removal"),
            }
            // A stop leaves a handed-off machine to go; the next leader watches it.
            tokio::select! {
                _ = order.cancel.cancelled() => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep(REMOVAL_POLL) => {}
            }
        }
    }

    fn count_removal(&self, order: &DrainOrder, target: &Target, outcome: RemovalOutcome) {
        self.metrics
            .removals
            .get_or_create(&RemovalLabels {
                policy: order.policy.clone(),
                method: target.method().as_str().to_string(),
                outcome,
            })
            .inc();
    }

    /// Waits until the node cache shows ebb's `to-be-deleted` taint on `node` (or the node is
    /// gone from it), at most [`TAINT_SEEN_TIMEOUT`].
    async fn taint_seen(&self, node: &str) {
        let cache = &self.stores.nodes;
        let deadline = tokio::time::Instant::now() + TAINT_SEEN_TIMEOUT;
        let key = kube::runtime::reflector::ObjectRef::new(node);
        loop {
            let seen = cache
                .get(&key)
                .is_none_or(|n| super::taints::has(&n, EbbTaint::ToBeDeleted));
            if seen {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    node,
                    "the node watch has not shown the taint; re-checking all the same"
                );
                return;
            }
            tokio::time::sleep(TAINT_SEEN_POLL).await;
        }
    }

    /// Before a drained node goes: [`ARRIVAL_WINDOW`] has passed since its taint (a binding the
    /// scheduler began before it saw the taint has landed by then), no pod is nominated to it,
    /// and no pod landed on it since the plan; else the drain gives up (the node stays).
    async fn settle_arrivals(
        &self,
        order: &DrainOrder,
        began: tokio::time::Instant,
    ) -> Result<(), GiveUpReason> {
        let node = order.node.as_str();
        let window = Duration::try_from(ARRIVAL_WINDOW).unwrap_or_default();
        // Since the taint: as long as this task has run, or since the taint's own time for a
        // drain resumed after a restart, whichever is longer.
        let mut tainted_for = began.elapsed();
        if let Some(started) = self.tracker.get(node).map(|d| d.started) {
            let wall = jiff::Timestamp::now().duration_since(started);
            tainted_for = tainted_for.max(Duration::try_from(wall).unwrap_or_default());
        }
        if let Some(wait) = window.checked_sub(tainted_for).filter(|w| !w.is_zero()) {
            tokio::select! {
                _ = order.cancel.cancelled() => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let now = self.pods_now();
        let mut arriving = pods::nominated_to(node, now.iter().map(|p| &**p));
        arriving.extend(pods::landed_since_plan(
            node,
            &order.planned_pods,
            now.iter().map(|p| &**p),
        ));
        if arriving.is_empty() {
            Ok(())
        } else {
            arriving.sort();
            Err(GiveUpReason::PodsLanded(arriving))
        }
    }

    async fn wait_pods_gone(&self, order: &DrainOrder) -> Result<(), GiveUpReason> {
        let deadline = tokio::time::Instant::now() + order.settings.grace_cap + POD_GONE_SLACK;
        let mut changes = self.pod_changes.clone();
        loop {
            changes.mark_unchanged();
            let now = self.pods_now();
            // A pod placed here after the re-check (a binding already under way when the taint
            // was written): the node stays rather than move that pod again.
            let landed =
                pods::landed_since_plan(&order.node, &order.planned_pods, now.iter().map(|p| &**p));
            if !landed.is_empty() {
                return Err(GiveUpReason::PodsLanded(landed));
            }
            let left = pods::remaining(&order.node, now.iter().map(|p| &**p));
            if left.is_empty() {
                return Ok(());
            }
            self.step(&order.node, DrainEvent::PodsRemaining(left.len() as i32));
            tokio::select! {
                _ = self.abandoned(order) => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(GiveUpReason::PodsDidNotTerminate { pods: left });
                }
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The pod watch is gone (shutting down); look again shortly.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                // The cache may change without a tick (a re-list after a failed watch): look
                // again now and then.
                _ = tokio::time::sleep(POD_GONE_RECHECK) => {}
            }
        }
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

struct Observer {
    objects: std::collections::HashMap<String, Arc<Pod>>,
    tracker: Tracker,
    policy: String,
    node: String,
    steering: crate::steering::Steering,
    /// Planned destination per pod uid.
    destinations: std::collections::BTreeMap<String, String>,
}

impl Observer {
    /// Withdraws the slot `open_slot` opened for `pod`, if no replacement took it.
    fn close_slot(&self, pod: &PodRef) {
        let Some(owner) = self
            .objects
            .get(&pod.uid)
            .and_then(|o| crate::steering::owner_of(o))
        else {
            return;
        };
        self.steering.withdraw(&owner, &pod.key());
    }

    /// The plan put `pod` on a node: its replacement will prefer that node.
    fn open_slot(&self, pod: &PodRef, at: jiff::Timestamp) {
        let (Some(dest), Some(object)) =
            (self.destinations.get(&pod.uid), self.objects.get(&pod.uid))
        else {
            return;
        };
        let Some(owner) = crate::steering::owner_of(object) else {
            return;
        };
        tracing::debug!(pod = %pod.key(), planned = %dest, "replacement will prefer its planned node");
        self.steering.open(
            owner,
            crate::steering::Slot {
                node: dest.clone(),
                policy: self.policy.clone(),
                from: self.node.clone(),
                evicted: pod.key(),
                opened: at,
                trace: ebb_telemetry::TraceParent::current(),
            },
        );
    }
}

impl EvictionObserver for Observer {
    /// The slot opens before the call: the owner's controller may create the replacement
    /// before the API server's answer reaches the drain.
    fn before_call(&self, pod: &PodRef) {
        self.open_slot(pod, jiff::Timestamp::now());
    }

    fn on_call(&self, pod: &PodRef, call: &EvictionCall) {
        let now = jiff::Timestamp::now();
        if !matches!(call, EvictionCall::Accepted) {
            // Not evicted (refused, gone or failed): no replacement follows from this call.
            self.close_slot(pod);
        }
        match call {
            EvictionCall::Blocked => {
                self.tracker
                    .apply(&self.node, DrainEvent::EvictionBlocked, now);
                self.tracker.record_refusal(&self.policy);
            }
            EvictionCall::Accepted => self.tracker.record_eviction(Evicted {
                policy: self.policy.clone(),
                node: self.node.clone(),
                pod: pod.clone(),
                object: self.objects.get(&pod.uid).cloned(),
                at: now,
            }),
            EvictionCall::Gone | EvictionCall::Failed(_) => {}
        }
    }
}
