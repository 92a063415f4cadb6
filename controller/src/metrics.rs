//! Prometheus metrics of the controller (prefix `ebb_`), with trace-id exemplars on durations.
//! Every reason label is the name of an `ebb_api::reasons` enum value.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A timed function of the controller.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Function {
    plan,
    simulate,
    soft_taint,
    actuate,
    reconcile,
    placement,
}

/// Why a node was scaled down.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ScaleDownKind {
    empty,
    underutilized,
    unready,
}

/// Result of one eviction call.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum EvictionResult {
    /// Accepted (201/200).
    evicted,
    /// A PodDisruptionBudget said wait (429).
    blocked_by_pdb,
    /// The pod was already gone (404).
    gone,
    /// Any other error.
    error,
    /// Not sent: a PodDisruptionBudget allowed no more disruptions (counted once per wait).
    deferred,
    /// Not sent yet: `--max-starting-replacements` replacements of earlier evictions were still
    /// starting (counted once per wait).
    paced,
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DrainResult {
    /// Every pod left and the node was deleted or marked drained.
    removed,
    /// The drain was abandoned and the node untainted.
    gave_up,
}

/// A phase of one policy loop (the `phase` label of `ebb_loop_phase_duration_seconds`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum LoopPhase {
    /// Bringing the cluster model up to date with what the watches saw.
    apply_events,
    /// Making the snapshot this loop plans on.
    fork,
    /// The planner: candidate set and the deletions to start.
    plan,
    /// Soft taints, rollbacks and starting drains.
    act,
    /// Writing the policy's status.
    status_write,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoopPhaseLabels {
    pub policy: String,
    pub phase: LoopPhase,
}

/// A step of a drained node's removal (the `outcome` label of `ebb_removals`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RemovalOutcome {
    /// The Machine was marked and its group scaled down, or the NodeClaim deleted.
    handed_off,
    /// The Node (and its Machine or NodeClaim) is gone.
    removed,
    /// Still there past `removal.timeout` (counted once per removal).
    stuck,
    /// The hand-off failed; the node was untainted.
    failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RemovalLabels {
    pub policy: String,
    /// `Node`, `ClusterAPI` or `Karpenter`.
    pub method: String,
    pub outcome: RemovalOutcome,
}

/// How a gated pod was released (the `outcome` label of `ebb_placements`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Release {
    pinned,
    relaxed,
    anywhere,
    ungoverned,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyReasonLabels {
    pub policy: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleDownLabels {
    pub policy: String,
    pub reason: ScaleDownKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    pub policy: String,
    pub result: EvictionResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    pub policy: String,
    pub outcome: DrainResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FunctionLabels {
    pub function: Function,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    pub namespace: String,
    pub placement_history: String,
    pub outcome: Release,
}

/// A pod of a PlacementHistory that ended, by why (`TerminationClass`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodEndLabels {
    pub namespace: String,
    pub placement_history: String,
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementHistoryLabels {
    pub namespace: String,
    pub placement_history: String,
}

/// Which reconciler failed a reconcile (the `controller` label of `ebb_reconcile_errors`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reconciler {
    scaledown,
    placement,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    pub controller: Reconciler,
    /// The error's reason: the name of its variant (`Kube`, `Store`, ...).
    pub reason: &'static str,
}

/// What became of one call of the steering admission webhook (the `result` label of
/// `ebb_steering_admissions`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SteeringAdmission {
    /// Answered with a patch (the pod is steered).
    patched,
    /// Answered without one (not a pod to steer, or not the leader).
    unchanged,
    /// A request the webhook could not read (answered 4xx; the API server fails open).
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SteeringAdmissionLabels {
    pub result: SteeringAdmission,
}

/// What became of a replacement pod of an evicted one (the `outcome` label of
/// `ebb_replacements`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReplacementOutcome {
    /// Given its planned node at creation (a preferred node affinity).
    steered,
    /// Bound to its planned node.
    on_plan,
    /// Not steered although planned, or bound elsewhere; `reason` says why.
    fell_back,
    /// Handed out at admission, but no such pod appeared (refused later in admission, or a
    /// request that was not the API server's): offered again.
    not_created,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplacementLabels {
    pub policy: String,
    pub outcome: ReplacementOutcome,
    /// For `fell_back`: `NodeGone`, `NodeUnavailable`, `SchedulerChoseAnother`, `Expired`.
    pub reason: String,
}

/// Why the pacing stopped waiting for an eviction's replacement (the `reason` label of
/// `ebb_replacement_start_timeouts`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StartTimeoutReason {
    /// None of its namespace's replacements started for 15 s while others' did.
    namespace_not_starting,
    /// 2 minutes after the eviction, the control plane not stalled.
    longest_start,
    /// 10 minutes after the eviction, kept that long because the control plane stalled.
    longest_queued,
}

impl StartTimeoutReason {
    /// Every reason: each one's series is exported at 0 from the start, so a dashboard's
    /// rate of it reads 0 rather than "no data" until the first give-up.
    pub const ALL: [Self; 3] = [
        Self::namespace_not_starting,
        Self::longest_start,
        Self::longest_queued,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartTimeoutLabels {
    pub reason: StartTimeoutReason,
}

/// Exemplar carrying the trace id of the span that was measured.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    pub trace_id: String,
}

/// All controller metrics. Cheap to clone (every metric is an `Arc` inside).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub unneeded_nodes: Family<PolicyLabels, Gauge>,
    pub unremovable_nodes: Family<PolicyReasonLabels, Gauge>,
    pub nodes_scaled_down: Family<ScaleDownLabels, Counter>,
    pub removals: Family<RemovalLabels, Counter>,
    pub evictions: Family<EvictionLabels, Counter>,
    pub drains_in_progress: Family<PolicyLabels, Gauge>,
    /// Eviction calls sent and not yet answered (bounded by `--max-evictions-in-flight`).
    pub evictions_in_flight: Gauge,
    /// Replacements of the controller's evictions not Running yet, with the evictions being
    /// sent (evictions wait at `starting_replacements_limit`).
    pub replacements_starting: Gauge,
    /// The pacing's bound now: from `--min-starting-replacements`, following the cluster's
    /// start rate, up to `--max-starting-replacements`.
    pub starting_replacements_limit: Gauge,
    /// Evictions whose replacement was not Running within the pacing's wait; no longer counted.
    pub replacement_start_timeouts: Family<StartTimeoutLabels, Counter>,
    /// Evictions counted past 2 minutes because the control plane stalled.
    pub replacement_waits_kept: Counter,
    pub throttled: Family<PolicyReasonLabels, Gauge>,
    pub degraded: Family<PolicyReasonLabels, Gauge>,
    pub function_duration: Family<FunctionLabels, HistogramWithExemplars<TraceExemplar>>,
    pub drain_duration: Family<DrainLabels, HistogramWithExemplars<TraceExemplar>>,
    pub loop_phases: Family<LoopPhaseLabels, Histogram>,
    pub placements: Family<PlacementLabels, Counter>,
    pub placement_escalations: Family<PlacementHistoryLabels, Counter>,
    pub placement_hits: Family<PlacementHistoryLabels, Counter>,
    pub placement_pod_ends: Family<PodEndLabels, Counter>,
    pub gate_wait: Family<PlacementHistoryLabels, Histogram>,
    pub reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    pub steering_admissions: Family<SteeringAdmissionLabels, Counter>,
    pub replacements: Family<ReplacementLabels, Counter>,
    pub cost_removed_per_hour: Family<PolicyLabels, Gauge<f64, AtomicU64>>,
    pub cost_kept_per_hour: Family<PolicyLabels, Gauge<f64, AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Self {
            registry: Arc::default(),
            unneeded_nodes: Family::<PolicyLabels, Gauge>::default(),
            unremovable_nodes: Family::<PolicyReasonLabels, Gauge>::default(),
            nodes_scaled_down: Family::<ScaleDownLabels, Counter>::default(),
            removals: Family::<RemovalLabels, Counter>::default(),
            evictions: Family::<EvictionLabels, Counter>::default(),
            drains_in_progress: Family::<PolicyLabels, Gauge>::default(),
            evictions_in_flight: Gauge::default(),
            replacements_starting: Gauge::default(),
            starting_replacements_limit: Gauge::default(),
            replacement_start_timeouts: Family::<StartTimeoutLabels, Counter>::default(),
            replacement_waits_kept: Counter::default(),
            throttled: Family::<PolicyReasonLabels, Gauge>::default(),
            degraded: Family::<PolicyReasonLabels, Gauge>::default(),
            function_duration: Family::<FunctionLabels, HistogramWithExemplars<TraceExemplar>>::new_with_constructor(|| HistogramWithExemplars::new(exponential_buckets(0.001, 2.0, 16)),),
            drain_duration: Family::<DrainLabels, HistogramWithExemplars<TraceExemplar>>::new_with_constructor(|| HistogramWithExemplars::new(exponential_buckets(0.5, 2.0, 14)),),
            loop_phases: Family::<LoopPhaseLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            placements: Family::<PlacementLabels, Counter>::default(),
            placement_escalations: Family::<PlacementHistoryLabels, Counter>::default(),
            placement_hits: Family::<PlacementHistoryLabels, Counter>::default(),
            placement_pod_ends: Family::<PodEndLabels, Counter>::default(),
            gate_wait: Family::<PlacementHistoryLabels, Histogram>::new_with_constructor(|| {Histogram::new(exponential_buckets(0.05, 2.0, 14))}),
            reconcile_errors: Family::<ReconcileErrorLabels, Counter>::default(),
            steering_admissions: Family::<SteeringAdmissionLabels, Counter>::default(),
            replacements: Family::<ReplacementLabels, Counter>::default(),
            cost_removed_per_hour: Family::default(),
            cost_kept_per_hour: Family::default(),
        };
        for reason in StartTimeoutReason::ALL {
            let _ = m
                .replacement_start_timeouts
                .get_or_create(&StartTimeoutLabels { reason });
        }
        let mut registry = Registry::with_prefix("ebb");
        m.register_all(&mut registry);
        m.registry = Arc::new(registry);
        m
    }

    /// Every metric's name and help text.
    fn register_all(&self, r: &mut Registry) {
        r.register(
            "unneeded_nodes",
            "Nodes in the candidate set (removable together)",
            self.unneeded_nodes.clone(),
        );
        r.register(
            "unremovable_nodes",
            "Nodes that cannot be removed, by reason",
            self.unremovable_nodes.clone(),
        );
        r.register(
            "nodes_scaled_down",
            "Nodes removed (or drained in Drain mode), by kind",
            self.nodes_scaled_down.clone(),
        );
        r.register(
            "removals",
            "Removal steps of drained nodes (DrainAndDelete), by method and outcome",
            self.removals.clone(),
        );
        r.register(
            "evictions",
            "Eviction API calls, by result",
            self.evictions.clone(),
        );
        r.register(
            "drains_in_progress",
            "Nodes being drained now",
            self.drains_in_progress.clone(),
        );
        r.register(
            "evictions_in_flight",
            "Eviction API calls sent and not yet answered, all policies (at most --max-evictions-in-flight)",
            self.evictions_in_flight.clone(),
        );
        r.register(
            "replacements_starting",
            "Replacements of the controller's evictions not Running yet, with evictions being sent, all policies (evictions wait at ebb_starting_replacements_limit)",
            self.replacements_starting.clone(),
        );
        r.register(
            "starting_replacements_limit",
            "Replacements of the controller's evictions allowed to start at once: from --min-starting-replacements, following the rate the cluster starts them at, up to --max-starting-replacements",
            self.starting_replacements_limit.clone(),
        );
        r.register(
            "replacement_start_timeouts",
            "Evictions whose replacement was given up on, by reason: none of the namespace's replacements started for 15 s while others did, or 2 minutes passed since the eviction with the control plane not stalled (both leave the namespace, or only the controller where the namespace started others meanwhile, not paced for 10 minutes), or 10 minutes with the control plane stalled",
            self.replacement_start_timeouts.clone(),
        );
        r.register(
            "replacement_waits_kept",
            "Evictions counted 2 minutes more, their replacement not Running yet, because the control plane stalled (a replacement waited 10 s in the scheduler's queue or for its kubelet); 10 minutes at most",
            self.replacement_waits_kept.clone(),
        );
        r.register(
            "throttled_nodes",
            "Removable nodes held back by a limit, by reason",
            self.throttled.clone(),
        );
        r.register(
            "policy_degraded",
            "1 for the reason a policy's Degraded condition is True with, 0 for the other reasons",
            self.degraded.clone(),
        );
        r.register(
            "function_duration_seconds",
            "Duration of controller functions",
            self.function_duration.clone(),
        );
        r.register("drain_duration_seconds", "Duration of node drains from the to-be-deleted taint to the node's removal or rollback, by outcome", self.drain_duration.clone());
        r.register(
            "loop_phase_duration_seconds",
            "Duration of each phase of a policy loop (apply_events, fork, plan, act, status_write)",
            self.loop_phases.clone(),
        );
        r.register(
            "placements",
            "Gated pods released, by outcome",
            self.placements.clone(),
        );
        r.register(
            "placement_escalations",
            "Pinned requests relaxed after their escalation timeout",
            self.placement_escalations.clone(),
        );
        r.register(
            "placement_hits",
            "Pods that landed on a node with history or warm data",
            self.placement_hits.clone(),
        );
        r.register(
            "placement_pod_ends",
            "Pods of a PlacementHistory that ended, by class (NodeLost, StartFailure and ApplicationFailure count against their node)",
            self.placement_pod_ends.clone(),
        );
        r.register(
            "placement_gate_wait_seconds",
            "Time pods spent behind the placement gate",
            self.gate_wait.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles (retried with back-off), by controller and reason",
            self.reconcile_errors.clone(),
        );
        r.register(
            "steering_admissions",
            "Calls of the steering admission webhook, by result (patched, unchanged, error)",
            self.steering_admissions.clone(),
        );
        r.register(
            "replacements",
            "Replacements of evicted pods: steered to their planned node, bound there (on_plan), or not (fell_back, with the reason), by policy",
            self.replacements.clone(),
        );
        r.register(
            "cost_removed_per_hour",
            "Hourly cost of the candidate set (what removing it saves), by policy; 0 without prices",
            self.cost_removed_per_hour.clone(),
        );
        r.register(
            "cost_kept_per_hour",
            "Hourly cost of the governed nodes that stay (priced ones), by policy; 0 without prices",
            self.cost_kept_per_hour.clone(),
        );
    }

    /// Count one replacement of `policy` with `outcome` (`reason` for a fallback, else empty).
    pub fn replacement(&self, policy: &str, outcome: ReplacementOutcome, reason: &str) {
        self.replacements
            .get_or_create(&ReplacementLabels {
                policy: policy.to_string(),
                outcome,
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Count one call of the steering admission webhook.
    pub fn steering_admitted(&self, result: SteeringAdmission) {
        self.steering_admissions
            .get_or_create(&SteeringAdmissionLabels { result })
            .inc();
    }

    /// Starts the failed-reconcile series of `controller` at 0 for each of `reasons`, so a
    /// dashboard shows 0 rather than no data, and the first failure is a visible increase.
    pub fn known_reconcile_errors(&self, controller: Reconciler, reasons: &[&'static str]) {
        for &reason in reasons {
            self.reconcile_errors
                .get_or_create(&ReconcileErrorLabels { controller, reason })
                .inc_by(0);
        }
    }

    /// Count one failed reconcile of `controller`, by the error's reason.
    pub fn reconcile_failed(&self, controller: Reconciler, reason: &'static str) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels { controller, reason })
            .inc();
    }

    /// Record how long a phase of `policy`'s loop took.
    pub fn observe_phase(&self, policy: &str, phase: LoopPhase, took: Duration) {
        self.loop_phases
            .get_or_create(&LoopPhaseLabels {
                policy: policy.to_string(),
                phase,
            })
            .observe(took.as_secs_f64());
    }

    /// Record how long a function took, with the current trace id as exemplar when exporting.
    pub fn observe(&self, function: Function, took: Duration) {
        let exemplar =
            crate::telemetry::current_trace_id().map(|trace_id| TraceExemplar { trace_id });
        self.function_duration
            .get_or_create(&FunctionLabels { function })
            .observe(took.as_secs_f64(), exemplar, None);
    }

    /// Record a drain's duration, with the drain's trace id as exemplar when exporting (call it
    /// inside the drain span).
    pub fn observe_drain(&self, policy: &str, outcome: DrainResult, took: Duration) {
        let exemplar =
            crate::telemetry::current_trace_id().map(|trace_id| TraceExemplar { trace_id });
        self.drain_duration
            .get_or_create(&DrainLabels {
                policy: policy.to_string(),
                outcome,
            })
            .observe(took.as_secs_f64(), exemplar, None);
    }

    /// The registry in OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_reconcile_error_reasons_start_at_zero_and_count_on() {
        let m = Metrics::new();
        m.known_reconcile_errors(
            Reconciler::scaledown,
            crate::reconcilers::scaledown::error::Error::REASONS,
        );
        m.reconcile_failed(Reconciler::scaledown, "Status");
        let text = m.encode();
        assert!(
            text.contains(
                "ebb_reconcile_errors_total{controller=\"scaledown\",reason=\"Snapshot\"} 0"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ebb_reconcile_errors_total{controller=\"scaledown\",reason=\"Status\"} 1"
            ),
            "{text}"
        );
        // Every variant's reason is among the known ones.
        assert!(
            crate::reconcilers::scaledown::error::Error::REASONS
                .contains(&crate::reconcilers::scaledown::error::Error::NoName.reason())
        );
    }

    #[test]
    fn every_start_timeout_reason_is_exported_before_its_first_give_up() {
        let m = Metrics::new();
        let text = m.encode();
        for reason in ["namespace_not_starting", "longest_start", "longest_queued"] {
            assert!(
                text.contains(&format!(
                    "ebb_replacement_start_timeouts_total{{reason=\"{reason}\"}} 0"
                )),
                "{reason} missing:\n{text}"
            );
        }
    }

    #[test]
    fn encoded_metrics_carry_prefix_labels_and_values() {
        let m = Metrics::new();
        m.unneeded_nodes
            .get_or_create(&PolicyLabels {
                policy: "workers".into(),
            })
            .set(7);
        m.evictions
            .get_or_create(&EvictionLabels {
                policy: "workers".into(),
                result: EvictionResult::blocked_by_pdb,
            })
            .inc_by(3);
        m.observe(Function::plan, Duration::from_millis(12));
        m.reconcile_failed(Reconciler::placement, "Status");
        m.reconcile_failed(Reconciler::placement, "Status");
        m.steering_admitted(SteeringAdmission::unchanged);
        let text = m.encode();
        assert!(
            text.contains(
                "ebb_reconcile_errors_total{controller=\"placement\",reason=\"Status\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("ebb_unneeded_nodes{policy=\"workers\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("ebb_evictions_total{policy=\"workers\",result=\"blocked_by_pdb\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("ebb_function_duration_seconds_count{function=\"plan\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ebb_steering_admissions_total{result=\"unchanged\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn exemplars_carry_the_trace_id() {
        let m = Metrics::new();
        m.function_duration
            .get_or_create(&FunctionLabels {
                function: Function::actuate,
            })
            .observe(
                0.5,
                Some(TraceExemplar {
                    trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                }),
                None,
            );
        assert!(
            m.encode()
                .contains("# {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 0.5")
        );
    }
}
