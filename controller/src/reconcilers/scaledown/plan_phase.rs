//! The plan phase of a policy's loop, off the async workers: the shared model brought up to
//! date, the planner run on it (forked and reverted, never copied), the deletions to start.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ebb_api::reasons::DegradedReason;

use super::context::{Context, PolicyMemory};
use super::error::Error;
use super::observe::Observed;
use super::selection::Degraded;
use crate::cluster::machines::ProviderIndex;
use crate::cluster::{ClusterSnapshot, PredicateChecker};
use crate::metrics::{Function, LoopPhase};
use crate::scaledown::budgets::Selection;
use crate::scaledown::{
    self, InstantStopwatch, Plan, PlannerConfig, PlannerState, select_deletions,
};
use crate::state::Stores;

/// What the planner decided this loop (nothing when the policy is stopped).
#[derive(Default)]
pub struct Planned {
    pub plan: Option<Plan>,
    pub selection: Option<Selection>,
    /// The pods (uids) the model had on each node selected to start.
    pub planned_pods: BTreeMap<String, BTreeSet<String>>,
    /// The Cluster API and Karpenter objects of the model (for the drains' targets).
    pub providers: ProviderIndex,
    /// A cluster object the model cannot read: the policy stops like on bad input.
    pub unreadable: Option<Degraded>,
    /// Candidates this loop may act on (not shared, not being drained).
    pub candidates: BTreeSet<String>,
}

/// How long each step of the phase took.
struct Timings {
    apply_events: Duration,
    fork: Duration,
    plan: Duration,
}

/// Plans `policy` on the shared model in a blocking task (the model's lock is a plain mutex;
/// placement passes and watches keep their async workers meanwhile).
pub async fn plan(ctx: &Context, observed: &Observed, memory: &mut PolicyMemory) -> Planned {
    let Some(cfg) = observed.cfg.clone().filter(|_| !observed.stopped) else {
        return Planned::default();
    };
    let stores = ctx.stores.clone();
    let state = std::mem::take(&mut memory.planner);
    let in_flight = observed.actuation.in_flight();
    let (name, now) = (observed.name.clone(), observed.now);
    let span = tracing::info_span!("simulate", policy = %name, nodes = observed.mine.len());
    let task = tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        plan_on_model(&stores, &cfg, state, &in_flight, &name, now)
    });
    let (planned, state, timings) = match task.await {
        Ok(out) => out,
        Err(e) => {
            // The planner panicked: its memory is lost (the next loop starts afresh) and the
            // model is rebuilt by its next reader (the lock was poisoned).
            tracing::error!(error = %e, "the planner failed; this loop acts on nothing");
            (Planned::default(), PlannerState::default(), None)
        }
    };
    memory.planner = state;
    if let Some(t) = timings {
        let m = &ctx.metrics;
        m.observe_phase(&observed.name, LoopPhase::apply_events, t.apply_events);
        m.observe_phase(&observed.name, LoopPhase::fork, t.fork);
        m.observe_phase(&observed.name, LoopPhase::plan, t.plan);
        m.observe(Function::simulate, t.plan);
    }
    let mut planned = planned;
    let draining = observed.actuation.in_flight();
    planned.candidates = planned
        .plan
        .iter()
        .flat_map(|p| p.candidates.iter())
        .map(|c| c.node.clone())
        .filter(|n| !observed.overlaps.contains_key(n) && !draining.contains(n))
        .collect();
    planned
}

/// The phase's work, on the model under its lock: catch up, fork, plan, select.
fn plan_on_model(
    stores: &Stores,
    cfg: &PlannerConfig,
    mut state: PlannerState,
    in_flight: &BTreeSet<String>,
    policy: &str,
    now: jiff::Timestamp,
) -> (Planned, PlannerState, Option<Timings>) {
    let ((mut live, caught), apply_events) = timed_sync(|| stores.model());
    tracing::debug!(
        changes = caught.changes,
        rebuilt = caught.rebuilt,
        "cluster model up to date"
    );
    let (model, fork) = timed_sync(|| live.snapshot_mut().map_err(|e| e.clone()));
    let snap = match model {
        Ok(s) => s,
        Err(e) => {
            let err = Error::Snapshot {
                policy: policy.to_string(),
                source: e,
            };
            tracing::warn!(error = %err, "cannot plan");
            let unreadable = Degraded {
                reason: DegradedReason::InvalidClusterObject,
                message: format!("{err}; fix or delete that object. Nothing is done until then."),
                stops_policy: true,
            };
            let planned = Planned {
                unreadable: Some(unreadable),
                ..Planned::default()
            };
            return (planned, state, None);
        }
    };
    let ((p, sel), plan_took) = timed_sync(|| {
        let p = scaledown::plan(
            snap,
            &mut PredicateChecker::new(),
            cfg,
            now,
            &mut state,
            in_flight,
            &mut InstantStopwatch::start(),
        );
        let sel = select_deletions(snap, &p, &state, cfg, now, false);
        (p, sel)
    });
    let planned_pods = planned_pods(snap, &sel);
    let providers = if planned_pods.is_empty() {
        Default::default()
    } else {
        live.providers().clone()
    };
    let planned = Planned {
        plan: Some(p),
        selection: Some(sel),
        planned_pods,
        providers,
        ..Planned::default()
    };
    let timings = Timings {
        apply_events,
        fork,
        plan: plan_took,
    };
    (planned, state, Some(timings))
}

/// The UIDs of the pods the model has on each node the selection starts now.
fn planned_pods(snap: &ClusterSnapshot, sel: &Selection) -> BTreeMap<String, BTreeSet<String>> {
    sel.empty
        .iter()
        .chain(&sel.drain)
        .filter_map(|n| {
            let id = snap.node_id(n)?;
            let uids = snap
                .pods_on(id)
                .iter()
                .map(|p| snap.pod(*p).uid.to_string());
            Some((n.clone(), uids.collect()))
        })
        .collect()
}

/// Runs `step` and returns what it took, for phases that run off the async workers.
fn timed_sync<T>(step: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let out = step();
    (out, t.elapsed())
}
