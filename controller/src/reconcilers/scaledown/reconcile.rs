//! One loop of a ScaleDownPolicy: select nodes, check for bad input and overlaps, plan, soft-taint,
//! start drains, write status (server-side apply, only on change), emit Events on transitions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebb_api::names::{FIELD_MANAGER_CONTROLLER, FINALIZER_SCALEDOWN};
use ebb_api::reasons::{ThrottledReason, UnremovableReason};
use ebb_api::{ScaleDownMode, ScaleDownPolicy, ScaleDownPolicyStatus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use super::context::{Context, PolicyMemory};
use super::events::{self, Facts};
use super::selection::{self, PolicyView, Selections};
use super::status::{self, LoopFacts};
use crate::actuation::pods::uids_on;
use crate::actuation::taints::{self, EbbTaint, plan_soft_taints};
use crate::actuation::{DrainOrder, EvictionSettings, Outcome, Recheck};
use crate::cluster::build::HOSTNAME_LABEL;
use crate::cluster::model::{Operator, Requirement, Selector};
use crate::cluster::{ClusterObjects, PredicateChecker, build_snapshot};
use crate::metrics::{Function, PolicyLabels, PolicyReasonLabels, Reconciler, ScaleDownKind};
use crate::scaledown::budgets::Selection;
use crate::scaledown::{InstantStopwatch, Plan, PlannerConfig, plan, select_deletions};

/// Requeue after an error.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// How long a deleted policy waits for its drains to roll back before cleaning taints anyway.
pub const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// A loop that failed; retried after [`ERROR_REQUEUE`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ScaleDownPolicy {policy}: the cluster snapshot cannot be built: {source}")]
    Snapshot {
        policy: String,
        #[source]
        source: crate::cluster::SnapshotError,
    },
    #[error("ScaleDownPolicy {policy}: writing status: {source}")]
    Status {
        policy: String,
        #[source]
        source: kube::Error,
    },
    #[error("ScaleDownPolicy {policy}: {source}")]
    Finalizer {
        policy: String,
        #[source]
        source: Box<finalizer::Error<Error>>,
    },
    #[error("ScaleDownPolicy has no name")]
    NoName,
}

impl Error {
    /// The `reason` label of `ebb_reconcile_errors`: the variant's name.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Snapshot { .. } => "Snapshot",
            Error::Status { .. } => "Status",
            Error::Finalizer { .. } => "Finalizer",
            Error::NoName => "NoName",
        }
    }
}

/// kube-runtime entry point: the finalizer around [`apply`] and [`cleanup`].
pub async fn reconcile(policy: Arc<ScaleDownPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.metadata.name.clone().ok_or(Error::NoName)?;
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let api: Api<ScaleDownPolicy> = Api::all(ctx.client.clone());
    let span = tracing::info_span!("loop", policy = %name);
    finalizer(&api, FINALIZER_SCALEDOWN, policy, |event| async {
        match event {
            finalizer::Event::Apply(p) => apply(p, ctx.clone()).await,
            finalizer::Event::Cleanup(p) => cleanup(p, ctx.clone()).await,
        }
    })
    .instrument(span)
    .await
    .map_err(|source| Error::Finalizer {
        policy: name,
        source: Box::new(source),
    })
}

/// Logs the failure and retries later.
pub fn error_policy(policy: Arc<ScaleDownPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(policy = %policy.name_any(), %error, "loop failed; retrying");
    ctx.metrics
        .reconcile_failed(Reconciler::scaledown, error.reason());
    Action::requeue(ERROR_REQUEUE)
}

/// Planner configs of every policy (for overlaps), with whether each may act.
struct AllPolicies {
    configs: Vec<(String, Result<PlannerConfig, String>, bool)>,
}

impl AllPolicies {
    fn from_store(ctx: &Context, current: &ScaleDownPolicy) -> Self {
        let mut policies: BTreeMap<String, Arc<ScaleDownPolicy>> = ctx
            .policies
            .state()
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        // The store may lag behind the object being reconciled.
        policies.insert(current.name_any(), Arc::new(current.clone()));
        let configs = policies
            .into_iter()
            .map(|(name, p)| {
                let cfg = PlannerConfig::from_spec(&p.spec).map_err(|e| e.to_string());
                let acts = p.spec.mode != ScaleDownMode::DryRun
                    && p.metadata.deletion_timestamp.is_none()
                    && cfg.is_ok();
                (name, cfg, acts)
            })
            .collect();
        Self { configs }
    }

    fn selections<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) -> Selections {
        let views: Vec<PolicyView<'_>> = self
            .configs
            .iter()
            .map(|(name, cfg, acts)| PolicyView {
                name,
                selector: cfg.as_ref().ok().map(|c| &c.node_selector),
                acts: *acts,
            })
            .collect();
        Selections::compute(&views, nodes)
    }
}

fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

/// The planner's re-check of one node after its taint: can all its pods still go elsewhere, with
/// the other deletions in flight? Runs the planner on a fresh snapshot restricted to that node.
pub fn recheck_node(
    objects: ClusterObjects,
    cfg: &PlannerConfig,
    state: &crate::scaledown::PlannerState,
    node: &str,
) -> Result<(), String> {
    let mut objects = objects;
    for n in objects
        .nodes
        .iter_mut()
        .filter(|n| n.metadata.name.as_deref() == Some(node))
    {
        if let Some(spec) = n.spec.as_mut()
            && let Some(t) =
                taints::without(spec.taints.as_deref().unwrap_or(&[]), EbbTaint::ToBeDeleted)
        {
            spec.taints = Some(t);
        }
    }
    let mut snap = build_snapshot(&objects).map_err(|e| e.to_string())?;
    let mut cfg = cfg.clone();
    cfg.node_selector = Selector {
        requirements: vec![Requirement {
            key: HOSTNAME_LABEL.into(),
            operator: Operator::In,
            values: vec![node.to_string()],
        }],
    };
    cfg.limits.min_nodes_per_group = 0; // checked when the drain was selected
    cfg.min_nodes_evaluated = 1;
    let mut state = state.clone();
    let now = jiff::Timestamp::now();
    state.sync_deleting_from_taints(&snap, now);
    state.finish_deleting(node);
    let p = plan(
        &mut snap,
        &mut PredicateChecker::new(),
        &cfg,
        now,
        &mut state,
        &mut InstantStopwatch::start(),
    );
    if p.candidates.iter().any(|c| c.node == node) {
        return Ok(());
    }
    Err(match p.unremovable.iter().find(|u| u.node == node) {
        Some(u) => match &u.pod {
            Some(pod) => format!("{} (pod {pod})", u.reason),
            None => u.reason.to_string(),
        },
        None => "no longer in the candidate set".to_string(),
    })
}

/// The loop of one policy.
async fn apply(policy: Arc<ScaleDownPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let t0 = Instant::now();
    let now = jiff::Timestamp::now();
    let name = policy.name_any();
    let spec = &policy.spec;
    let mut memory = ctx.take_memory(&name);
    let result = run_loop(&policy, &ctx, &mut memory, now, t0).await;
    ctx.put_memory(&name, memory);
    ctx.metrics.observe(Function::reconcile, t0.elapsed());
    result?;
    Ok(Action::requeue(spec.scan_interval.as_duration()))
}

async fn run_loop(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    now: jiff::Timestamp,
    t0: Instant,
) -> Result<(), Error> {
    let name = policy.name_any();
    let spec = &policy.spec;
    let tracker = ctx.actuator.tracker().clone();
    let nodes: Vec<Arc<Node>> = ctx.stores.nodes.state();
    let all = AllPolicies::from_store(ctx, policy);
    let selections = all.selections(nodes.iter().map(|n| &**n));
    let mine = selections.nodes_of(&name);
    let overlaps = selections.overlaps_of(&name);
    let my_nodes: Vec<&Node> = nodes
        .iter()
        .map(|n| &**n)
        .filter(|n| mine.contains(&node_name(n)))
        .collect();
    let cfg = PlannerConfig::from_spec(spec);
    let deletion_forbidden = spec.mode == ScaleDownMode::DrainAndDelete
        && ctx.node_deletion.allowed(&ctx.client).await == Some(false);
    let degraded = selection::degraded(
        cfg.as_ref().err().map(|e| e.to_string()),
        deletion_forbidden,
        cfg.as_ref().ok().map(|c| &c.budgets),
        spec.node_group_label.as_deref(),
        my_nodes.iter().copied(),
        &overlaps,
    );
    let stopped = degraded.as_ref().is_some_and(|d| d.stops_policy);

    // What the drains did since the last loop.
    let finished = tracker.take_finished(&name);
    let mut removed = match memory.removed_total {
        Some(r) => r,
        None => {
            // First loop of this process: drains the written status lists as in flight that
            // ended since (a previous process stopped before writing that down) count too.
            let in_flight = tracker.in_flight();
            let by_name: BTreeMap<String, &Node> =
                nodes.iter().map(|n| (node_name(n), &**n)).collect();
            status::removed_at_start(policy.status.as_ref(), |n| {
                if in_flight.contains(n) || finished.iter().any(|f| f.drain.node == n) {
                    return false;
                }
                by_name.get(n).is_none_or(|node| {
                    node.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(ebb_api::names::LABEL_DRAINED))
                        && !taints::has(node, EbbTaint::ToBeDeleted)
                })
            })
        }
    };
    for f in &finished {
        memory.planner.finish_deleting(&f.drain.node);
        if f.outcome == Outcome::Removed {
            removed += 1;
        }
    }
    memory.removed_total = Some(removed);
    for e in tracker.take_evictions(&name) {
        if let Some(pod) = e.object {
            memory.planner.record_eviction((*pod).clone(), e.at);
        }
    }

    // Plan. A cluster object the snapshot cannot read stops the policy like bad input does.
    let mut degraded = degraded;
    let mut stopped = stopped;
    // The pods the plan is made from: a pod not among them on a node being drained landed after.
    let objects = ctx.stores.objects();
    let snapshot = match (&cfg, stopped) {
        (Ok(_), false) => match build_snapshot(&objects) {
            Ok(snap) => Some(snap),
            Err(e) => {
                let err = Error::Snapshot {
                    policy: name.clone(),
                    source: e,
                };
                tracing::warn!(error = %err, "cannot plan");
                degraded = Some(selection::Degraded {
                    reason: ebb_api::reasons::DegradedReason::InvalidClusterObject,
                    message: format!(
                        "{err}; fix or delete that object. Nothing is done until then."
                    ),
                    stops_policy: true,
                });
                stopped = true;
                None
            }
        },
        _ => None,
    };
    let (plan_out, selection): (Option<Plan>, Option<Selection>) = match (&cfg, snapshot) {
        (Ok(cfg), Some(mut snap)) => {
            memory.planner.sync_deleting_from_taints(&snap, now);
            for d in tracker.draining(Some(&name)) {
                memory.planner.start_deleting(&d.node, d.started);
            }
            let sim = tracing::info_span!("simulate", policy = %name, nodes = mine.len());
            let p = sim.in_scope(|| {
                let t = Instant::now();
                let p = plan(
                    &mut snap,
                    &mut PredicateChecker::new(),
                    cfg,
                    now,
                    &mut memory.planner,
                    &mut InstantStopwatch::start(),
                );
                ctx.metrics.observe(Function::simulate, t.elapsed());
                p
            });
            let sel = select_deletions(&snap, &p, &memory.planner, cfg, now, false);
            ctx.metrics.observe(Function::plan, t0.elapsed());
            (Some(p), Some(sel))
        }
        _ => (None, None),
    };

    let draining_now: BTreeSet<String> = tracker.in_flight();
    let candidates: BTreeSet<String> = plan_out
        .iter()
        .flat_map(|p| p.candidates.iter())
        .map(|c| c.node.clone())
        .filter(|n| !overlaps.contains_key(n) && !draining_now.contains(n))
        .collect();
    let acting = !stopped && spec.mode != ScaleDownMode::DryRun && ctx.leadership.is_leader();
    let writer = ctx.actuator.node_writer().clone();
    let free_nodes: Vec<&Node> = my_nodes
        .iter()
        .copied()
        .filter(|n| !overlaps.contains_key(&node_name(n)))
        .collect();

    if acting {
        // Soft taints, removals first, within the per-loop cap and time limit.
        let t = Instant::now();
        let soft = plan_soft_taints(
            free_nodes.iter().copied(),
            &candidates,
            &draining_now,
            spec.max_bulk_soft_taint_count.max(0) as usize,
        );
        let limit = spec.max_bulk_soft_taint_time.as_duration();
        let mut done = 0usize;
        let changes = soft
            .remove
            .iter()
            .map(|n| (n, false))
            .chain(soft.add.iter().map(|n| (n, true)));
        for (node, add) in changes {
            if t.elapsed() >= limit {
                tracing::info!(
                    done,
                    left = soft.remove.len() + soft.add.len() - done,
                    "soft-taint time limit reached; the rest waits for the next loop"
                );
                break;
            }
            let r = if add {
                writer.add_taint(node, EbbTaint::Candidate, now).await
            } else {
                writer.remove_taint(node, EbbTaint::Candidate).await
            };
            match r {
                Ok(_) => done += 1,
                Err(e) => tracing::warn!(error = %e, "soft taint"),
            }
        }
        if !soft.is_empty() {
            tracing::info!(
                added = soft.add.len(),
                removed = soft.remove.len(),
                deferred = soft.deferred,
                done,
                "soft taints updated"
            );
        }
        ctx.metrics.observe(Function::soft_taint, t.elapsed());

        // Never leak: a to-be-deleted taint with no drain behind it is rolled back.
        for n in &free_nodes {
            let nn = node_name(n);
            if taints::has(n, EbbTaint::ToBeDeleted) && !draining_now.contains(&nn) {
                tracing::info!(node = %nn, "to-be-deleted taint without a drain; removing it");
                if let Err(e) = writer.remove_taint(&nn, EbbTaint::ToBeDeleted).await {
                    tracing::warn!(error = %e, "removing a stray taint");
                }
            }
        }

        // Start drains.
        if let (Some(sel), Some(p), Ok(cfg)) = (&selection, &plan_out, &cfg) {
            let cancel = ctx.live_token(memory);
            let planned = &objects.pods;
            let starts = sel
                .empty
                .iter()
                .map(|n| (n, true))
                .chain(sel.drain.iter().map(|n| (n, false)));
            for (node, empty) in starts {
                if overlaps.contains_key(node) || draining_now.contains(node) {
                    continue;
                }
                let ready = p
                    .candidates
                    .iter()
                    .find(|c| &c.node == node)
                    .is_none_or(|c| c.ready);
                let kind = if !ready {
                    ScaleDownKind::unready
                } else if empty {
                    ScaleDownKind::empty
                } else {
                    ScaleDownKind::underutilized
                };
                let stores = ctx.stores.clone();
                let rcfg = cfg.clone();
                let state = memory.planner.clone();
                let recheck: Recheck =
                    Arc::new(move |n: &str| recheck_node(stores.objects(), &rcfg, &state, n));
                let order = DrainOrder {
                    policy: name.clone(),
                    node: node.clone(),
                    kind,
                    mode: spec.mode,
                    settings: EvictionSettings::from_spec(spec),
                    planned_pods: uids_on(node, planned),
                    resume_from: None,
                    recheck,
                    cancel: cancel.clone(),
                };
                match ctx.actuator.start(order).await {
                    Ok(Some(_)) => {
                        memory.planner.start_deleting(node, now);
                        // Where the simulation put each pod (its destination hint), to compare
                        // with where the scheduler puts the replacement.
                        for m in p
                            .candidates
                            .iter()
                            .filter(|c| &c.node == node)
                            .flat_map(|c| c.moves.iter())
                        {
                            tracing::info!(node = %node, pod = %m.pod, to = %m.to, "planned destination");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(node = %node, error = %e, "could not start the drain"),
                }
            }
        }
    } else if ctx.leadership.is_leader() {
        // DryRun or stopped: drains of this policy stop, and its soft taints go.
        if let Some(c) = &memory.cancel
            && !tracker.draining(Some(&name)).is_empty()
        {
            tracing::info!("policy no longer acts; cancelling its drains");
            c.cancel();
        }
        for n in &free_nodes {
            if taints::has(n, EbbTaint::Candidate)
                && let Err(e) = writer
                    .remove_taint(&node_name(n), EbbTaint::Candidate)
                    .await
            {
                tracing::warn!(error = %e, "removing a soft taint");
            }
        }
    }

    // Status.
    let drains = tracker.draining(Some(&name));
    let next = status::build(&LoopFacts {
        generation: policy.metadata.generation,
        now,
        mode: spec.mode,
        nodes_selected: mine.len(),
        plan: plan_out.as_ref(),
        selection: selection.as_ref(),
        drains: &drains,
        overlapping: &overlaps,
        degraded: degraded.as_ref(),
        removed_total: removed,
        loop_duration: t0.elapsed(),
        previous: memory.last_written.as_ref().or(policy.status.as_ref()),
    });
    let last = memory.last_written.as_ref().or(policy.status.as_ref());
    if status::needs_write(last, &next, now) {
        write_status(&ctx.client, &name, &next)
            .await
            .map_err(|source| Error::Status {
                policy: name.clone(),
                source,
            })?;
        memory.last_written = Some(next.clone());
    }

    // Events on transitions.
    let facts = Facts {
        candidates: candidates.clone(),
        draining: drains.iter().map(|d| d.node.clone()).collect(),
        blocked: drains
            .iter()
            .filter(|d| d.evictions_blocked > 0)
            .map(|d| d.node.clone())
            .collect(),
        throttled: if stopped {
            None
        } else {
            status::main_throttle(selection.as_ref())
        },
        degraded: degraded.as_ref().map(|d| (d.reason, d.message.clone())),
    };
    let planned = events::transitions(&name, &memory.facts, &facts, &finished);
    if !planned.is_empty() {
        let uids: BTreeMap<String, String> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.uid.clone()?)))
            .collect();
        events::publish(&ctx.recorder, &policy.object_ref(&()), &planned, &uids).await;
    }
    memory.facts = facts;

    // Metrics.
    update_metrics(ctx, &name, &next, selection.as_ref());
    tracing::info!(
        selected = mine.len(),
        candidates = next.candidates,
        draining = next.draining,
        removed = next.removed_total,
        took_ms = t0.elapsed().as_millis() as u64,
        "loop done"
    );
    Ok(())
}

fn update_metrics(
    ctx: &Context,
    policy: &str,
    s: &ScaleDownPolicyStatus,
    selection: Option<&Selection>,
) {
    for reason in ThrottledReason::ALL {
        let n = selection.map_or(0, |sel| {
            sel.throttled.iter().filter(|(_, r)| r == reason).count()
        });
        ctx.metrics
            .throttled
            .get_or_create(&PolicyReasonLabels {
                policy: policy.to_string(),
                reason: reason.to_string(),
            })
            .set(n as i64);
    }
    let p = || PolicyLabels {
        policy: policy.to_string(),
    };
    ctx.metrics
        .unneeded_nodes
        .get_or_create(&p())
        .set(i64::from(s.candidates));
    ctx.metrics
        .drains_in_progress
        .get_or_create(&p())
        .set(i64::from(s.draining));
    for reason in UnremovableReason::ALL {
        let count = s
            .unremovable
            .iter()
            .find(|r| r.reason == *reason)
            .map_or(0, |r| r.count);
        ctx.metrics
            .unremovable_nodes
            .get_or_create(&PolicyReasonLabels {
                policy: policy.to_string(),
                reason: reason.to_string(),
            })
            .set(i64::from(count));
    }
}

/// Server-side apply of the whole status (field manager `ebb-controller`).
pub async fn write_status(
    client: &kube::Client,
    name: &str,
    status: &ScaleDownPolicyStatus,
) -> Result<(), kube::Error> {
    let api: Api<ScaleDownPolicy> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// The policy is being deleted: stop its drains (they untaint their nodes), then remove every
/// ebb taint left on the nodes it selects.
async fn cleanup(policy: Arc<ScaleDownPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.name_any();
    ctx.forget(&name);
    let tracker = ctx.actuator.tracker().clone();
    let deadline = Instant::now() + CLEANUP_WAIT;
    while !tracker.draining(Some(&name)).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let in_flight = tracker.in_flight();
    let selector = PlannerConfig::from_spec(&policy.spec)
        .ok()
        .map(|c| c.node_selector);
    let writer = ctx.actuator.node_writer().clone();
    let mut removed = 0usize;
    for n in ctx.stores.nodes.state() {
        let nn = node_name(&n);
        let empty = BTreeMap::new();
        let selected = selector
            .as_ref()
            .is_some_and(|s| s.matches(n.metadata.labels.as_ref().unwrap_or(&empty)));
        if !selected || in_flight.contains(&nn) {
            continue;
        }
        for t in [EbbTaint::Candidate, EbbTaint::ToBeDeleted] {
            if taints::has(&n, t) {
                match writer.remove_taint(&nn, t).await {
                    Ok(_) => removed += 1,
                    Err(e) => tracing::warn!(node = %nn, error = %e, "cleanup: removing a taint"),
                }
            }
        }
    }
    let labels = PolicyLabels {
        policy: name.clone(),
    };
    ctx.metrics.unneeded_nodes.remove(&labels);
    ctx.metrics.drains_in_progress.remove(&labels);
    for reason in UnremovableReason::ALL {
        ctx.metrics.unremovable_nodes.remove(&PolicyReasonLabels {
            policy: name.clone(),
            reason: reason.to_string(),
        });
    }
    for reason in ThrottledReason::ALL {
        ctx.metrics.throttled.remove(&PolicyReasonLabels {
            policy: name.clone(),
            reason: reason.to_string(),
        });
    }
    tracing::info!(policy = %name, taints_removed = removed, "policy deleted; its taints are gone");
    Ok(Action::await_change())
}
