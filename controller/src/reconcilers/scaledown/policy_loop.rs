//! One loop of a ScaleDownPolicy as its phases: observe (nodes, overlaps, bad input), account for
//! finished drains, plan, act (soft taints, stray taints, drains), then status, Events, metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use ebb_api::reasons::{DegradedReason, ThrottledReason, UnremovableReason};
use ebb_api::{ScaleDownMode, ScaleDownPolicy, ScaleDownPolicyStatus};
use k8s_openapi::api::core::v1::Node;
use kube::{Resource, ResourceExt};

use super::context::{Context, PolicyMemory};
use super::events::{self, Facts};
use super::reconcile::{AllPolicies, Error, node_name, recheck_node, write_status};
use super::selection::{self, Degraded};
use super::status::{self, LoopFacts};
use crate::actuation::taints::{self, EbbTaint, plan_soft_taints};
use crate::actuation::tracker::Finished;
use crate::actuation::{Drain, DrainOrder, EvictionSettings, Outcome, Recheck};
use crate::cluster::providers::ProviderIndex;
use crate::cluster::{ClusterSnapshot, PredicateChecker};
use crate::metrics::{Function, LoopPhase, PolicyLabels, PolicyReasonLabels, ScaleDownKind};
use crate::scaledown::budgets::Selection;
use crate::scaledown::removal::drain_target;
use crate::scaledown::{InstantStopwatch, Plan, PlannerConfig, plan, select_deletions};

/// Runs one loop of `policy`. Returns when the next candidate will have been removable long
/// enough (the loop should run again then), if one waits for that.
pub async fn run(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    now: jiff::Timestamp,
    t0: Instant,
) -> Result<Option<jiff::Timestamp>, Error> {
    let mut l = PolicyLoop::observe(policy, ctx, now, t0).await;
    l.account_finished_drains(ctx, memory);
    l.plan(ctx, memory);
    let t = Instant::now();
    if l.acts(ctx) {
        l.update_soft_taints(ctx).await;
        l.roll_back_stray_taints(ctx).await;
        l.start_drains(ctx, memory).await;
    } else if ctx.leadership.is_leader() {
        l.stand_down(ctx, memory).await;
    }
    ctx.metrics
        .observe_phase(&l.name, LoopPhase::act, t.elapsed());
    let t = Instant::now();
    let status = l.write_status(ctx, memory).await?;
    ctx.metrics
        .observe_phase(&l.name, LoopPhase::status_write, t.elapsed());
    l.publish_events(ctx, memory).await;
    update_metrics(ctx, &l.name, &status, l.selection.as_ref());
    tracing::info!(
        selected = l.mine.len(),
        candidates = status.candidates,
        draining = status.draining,
        removed = status.removed_total,
        took_ms = t0.elapsed().as_millis() as u64,
        "loop done"
    );
    Ok(l.selection.and_then(|s| s.next_due))
}

/// What one loop knows, filled phase by phase.
struct PolicyLoop<'a> {
    policy: &'a ScaleDownPolicy,
    name: String,
    now: jiff::Timestamp,
    t0: Instant,
    nodes: Vec<Arc<Node>>,
    /// The nodes this policy selects.
    mine: BTreeSet<String>,
    /// Nodes this policy shares with other acting policies: left alone.
    overlaps: BTreeMap<String, Vec<String>>,
    cfg: Result<PlannerConfig, String>,
    degraded: Option<Degraded>,
    /// Bad input: the policy acts on nothing.
    stopped: bool,
    finished: Vec<Finished>,
    removed: i64,
    /// Evictions refused by a PodDisruptionBudget since the policy was created.
    refused: i64,
    /// The pods (UIDs) the model had on each node selected to start: a pod not among them on a
    /// node being drained landed after the plan.
    planned: BTreeMap<String, BTreeSet<String>>,
    /// The Cluster API and Karpenter objects of the plan's model (for the drains' targets).
    providers: ProviderIndex,
    plan: Option<Plan>,
    selection: Option<Selection>,
    draining_now: BTreeSet<String>,
    candidates: BTreeSet<String>,
    /// This policy's drains after the loop acted (what status and Events report).
    drains: Vec<Drain>,
}

impl<'a> PolicyLoop<'a> {
    /// Selects the policy's nodes, finds overlaps and bad input.
    async fn observe(
        policy: &'a ScaleDownPolicy,
        ctx: &Context,
        now: jiff::Timestamp,
        t0: Instant,
    ) -> Self {
        let name = policy.name_any();
        let spec = &policy.spec;
        let nodes: Vec<Arc<Node>> = ctx.stores.nodes.state();
        let selections =
            AllPolicies::from_store(ctx, policy).selections(nodes.iter().map(|n| &**n));
        let mine = selections.nodes_of(&name);
        let overlaps = selections.overlaps_of(&name);
        let cfg = PlannerConfig::from_spec(spec).map_err(|e| e.to_string());
        let deletion_forbidden = spec.mode == ScaleDownMode::DrainAndDelete
            && ctx.node_deletion.allowed(&ctx.client).await == Some(false);
        let method_not_enabled =
            spec.removal.as_ref().map(|r| r.method).filter(|m| {
                spec.mode != ScaleDownMode::Drain && !ctx.actuator.remover().enabled(*m)
            });
        let degraded = selection::degraded(
            cfg.as_ref().err().cloned(),
            selection::removal_refusal(deletion_forbidden, method_not_enabled),
            cfg.as_ref().ok().map(|c| &c.budgets),
            spec.node_group_label.as_deref(),
            nodes
                .iter()
                .map(|n| &**n)
                .filter(|n| mine.contains(&node_name(n))),
            &overlaps,
        );
        let stopped = degraded.as_ref().is_some_and(|d| d.stops_policy);
        Self {
            policy,
            name,
            now,
            t0,
            nodes,
            mine,
            overlaps,
            cfg,
            degraded,
            stopped,
            finished: Vec::new(),
            removed: 0,
            refused: 0,
            planned: BTreeMap::new(),
            providers: ProviderIndex::default(),
            plan: None,
            selection: None,
            draining_now: BTreeSet::new(),
            candidates: BTreeSet::new(),
            drains: Vec::new(),
        }
    }

    /// The policy's nodes that no other acting policy selects.
    fn free_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().map(|n| &**n).filter(|n| {
            let nn = node_name(n);
            self.mine.contains(&nn) && !self.overlaps.contains_key(&nn)
        })
    }

    /// What the drains did since the last loop: the removed total, the planner's record of
    /// deletions in flight and of evictions.
    fn account_finished_drains(&mut self, ctx: &Context, memory: &mut PolicyMemory) {
        let tracker = ctx.actuator.tracker();
        self.finished = tracker.take_finished(&self.name);
        let mut removed = match memory.removed_total {
            Some(r) => r,
            None => self.removed_before_this_process(ctx),
        };
        for f in &self.finished {
            memory.planner.finish_deleting(&f.drain.node);
            if f.outcome == Outcome::Removed {
                removed += 1;
            }
        }
        memory.removed_total = Some(removed);
        self.removed = removed;
        let refused_before = memory.refused_total.unwrap_or_else(|| {
            self.policy
                .status
                .as_ref()
                .map_or(0, |s| s.evictions_refused_total)
        });
        self.refused = refused_before + tracker.take_refused(&self.name);
        memory.refused_total = Some(self.refused);
        for e in tracker.take_evictions(&self.name) {
            if let Some(pod) = e.object {
                memory.planner.record_eviction((*pod).clone(), e.at);
            }
        }
    }

    /// First loop of this process: drains the written status lists as in flight that ended since
    /// (a previous process stopped before writing that down) count too.
    fn removed_before_this_process(&self, ctx: &Context) -> i64 {
        let in_flight = ctx.actuator.tracker().in_flight();
        let by_name: BTreeMap<String, &Node> =
            self.nodes.iter().map(|n| (node_name(n), &**n)).collect();
        status::removed_at_start(self.policy.status.as_ref(), |n| {
            if in_flight.contains(n) || self.finished.iter().any(|f| f.drain.node == n) {
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

    /// Brings the shared cluster model up to date, runs the planner on it (which forks and
    /// reverts it) and selects the deletions to start now. A cluster object the model cannot
    /// read stops the policy like bad input does.
    fn plan(&mut self, ctx: &Context, memory: &mut PolicyMemory) {
        let t = Instant::now();
        let (mut live, caught) = ctx.stores.model();
        ctx.metrics
            .observe_phase(&self.name, LoopPhase::apply_events, t.elapsed());
        tracing::debug!(
            changes = caught.changes,
            rebuilt = caught.rebuilt,
            "cluster model up to date"
        );
        let tracker = ctx.actuator.tracker();
        self.draining_now = tracker.in_flight();
        if let (Ok(cfg), false) = (&self.cfg, self.stopped) {
            let t = Instant::now();
            let model = live.snapshot_mut();
            ctx.metrics
                .observe_phase(&self.name, LoopPhase::fork, t.elapsed());
            match model {
                Ok(snap) => {
                    let t = Instant::now();
                    memory.planner.sync_deleting_from_taints(snap, self.now);
                    for d in tracker.draining(Some(&self.name)) {
                        memory.planner.start_deleting(&d.node, d.started);
                    }
                    let sim = tracing::info_span!("simulate", policy = %self.name, nodes = self.mine.len());
                    let p = sim.in_scope(|| {
                        let t = Instant::now();
                        let p = plan(
                            snap,
                            &mut PredicateChecker::new(),
                            cfg,
                            self.now,
                            &mut memory.planner,
                            &mut InstantStopwatch::start(),
                        );
                        ctx.metrics.observe(Function::simulate, t.elapsed());
                        p
                    });
                    let sel = select_deletions(snap, &p, &memory.planner, cfg, self.now, false);
                    self.planned = planned_pods(snap, &sel);
                    ctx.metrics.observe(Function::plan, self.t0.elapsed());
                    ctx.metrics
                        .observe_phase(&self.name, LoopPhase::plan, t.elapsed());
                    self.plan = Some(p);
                    self.selection = Some(sel);
                }
                Err(e) => self.stop_on_bad_object(e),
            }
            if !self.planned.is_empty() {
                self.providers = live.providers().clone();
            }
        }
        drop(live);
        self.candidates = self
            .plan
            .iter()
            .flat_map(|p| p.candidates.iter())
            .map(|c| c.node.clone())
            .filter(|n| !self.overlaps.contains_key(n) && !self.draining_now.contains(n))
            .collect();
    }

    fn stop_on_bad_object(&mut self, e: crate::cluster::SnapshotError) {
        let err = Error::Snapshot {
            policy: self.name.clone(),
            source: e,
        };
        tracing::warn!(error = %err, "cannot plan");
        self.degraded = Some(Degraded {
            reason: DegradedReason::InvalidClusterObject,
            message: format!("{err}; fix or delete that object. Nothing is done until then."),
            stops_policy: true,
        });
        self.stopped = true;
    }

    /// Whether this loop writes to nodes: not stopped, not DryRun, and the leader.
    fn acts(&self, ctx: &Context) -> bool {
        !self.stopped
            && self.policy.spec.mode != ScaleDownMode::DryRun
            && ctx.leadership.is_leader()
    }

    /// Soft taints (`ebb.dev/candidate`), removals first, within the per-loop cap and time limit.
    async fn update_soft_taints(&self, ctx: &Context) {
        let spec = &self.policy.spec;
        let writer = ctx.actuator.node_writer();
        let t = Instant::now();
        let soft = plan_soft_taints(
            self.free_nodes(),
            &self.candidates,
            &self.draining_now,
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
                let left = soft.remove.len() + soft.add.len() - done;
                tracing::info!(
                    done,
                    left,
                    "soft-taint time limit reached; the rest waits for the next loop"
                );
                break;
            }
            let r = if add {
                writer.add_taint(node, EbbTaint::Candidate, self.now).await
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
    }

    /// Never leak: a to-be-deleted taint with no drain behind it is rolled back.
    async fn roll_back_stray_taints(&self, ctx: &Context) {
        let writer = ctx.actuator.node_writer();
        for n in self.free_nodes() {
            let nn = node_name(n);
            if taints::has(n, EbbTaint::ToBeDeleted) && !self.draining_now.contains(&nn) {
                tracing::info!(node = %nn, "to-be-deleted taint without a drain; removing it");
                if let Err(e) = writer.remove_taint(&nn, EbbTaint::ToBeDeleted).await {
                    tracing::warn!(error = %e, "removing a stray taint");
                }
            }
        }
    }

    /// Starts the drains the selection allows now (empty nodes first).
    async fn start_drains(&self, ctx: &Context, memory: &mut PolicyMemory) {
        let (Some(sel), Some(p), Ok(cfg)) = (&self.selection, &self.plan, &self.cfg) else {
            return;
        };
        let cancel = ctx.live_token(memory);
        let starts = sel
            .empty
            .iter()
            .map(|n| (n, true))
            .chain(sel.drain.iter().map(|n| (n, false)));
        for (node, empty) in starts {
            if self.overlaps.contains_key(node) || self.draining_now.contains(node) {
                continue;
            }
            let Some(order) = self.drain_order(ctx, memory, cfg, p, node, empty, cancel.clone())
            else {
                continue;
            };
            match ctx.actuator.start(order).await {
                Ok(Some(_)) => {
                    memory.planner.start_deleting(node, self.now);
                    // Where the simulation put each pod (its destination hint), to compare with
                    // where the scheduler puts the replacement.
                    let moves = p.candidates.iter().filter(|c| &c.node == node);
                    for m in moves.flat_map(|c| c.moves.iter()) {
                        tracing::info!(node = %node, pod = %m.pod, to = %m.to, "planned destination");
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(node = %node, error = %e, "could not start the drain"),
            }
        }
    }

    /// The actuator's order for one node: its kind, eviction settings, the pods planned on it,
    /// the re-check against a fresh snapshot and what removing it acts on (`None` when that
    /// changed since the plan: the node waits for the next loop).
    #[allow(clippy::too_many_arguments)]
    fn drain_order(
        &self,
        ctx: &Context,
        memory: &PolicyMemory,
        cfg: &PlannerConfig,
        p: &Plan,
        node: &str,
        empty: bool,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Option<DrainOrder> {
        let spec = &self.policy.spec;
        let object = self
            .nodes
            .iter()
            .map(|n| &**n)
            .find(|n| n.metadata.name.as_deref() == Some(node));
        let target = match drain_target(spec.mode, cfg.removal, object, &self.providers) {
            Ok(t) => t,
            Err(why) => {
                tracing::info!(node, %why, "not drained");
                return None;
            }
        };
        let ready = p
            .candidates
            .iter()
            .find(|c| c.node == node)
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
        let recheck: Recheck = Arc::new(move |n: &str| recheck_node(&stores, &rcfg, &state, n));
        Some(DrainOrder {
            policy: self.name.clone(),
            node: node.to_string(),
            kind,
            mode: spec.mode,
            settings: EvictionSettings::from_spec(spec),
            planned_pods: self.planned.get(node).cloned().unwrap_or_default(),
            resume_from: None,
            recheck,
            cancel,
            target,
            group_min: spec.min_nodes_per_group,
            removal_timeout: spec.removal_or_default().timeout.as_duration(),
        })
    }

    /// DryRun or stopped: drains of this policy stop, and its soft taints go.
    async fn stand_down(&self, ctx: &Context, memory: &PolicyMemory) {
        if let Some(c) = &memory.cancel
            && !ctx.actuator.tracker().draining(Some(&self.name)).is_empty()
        {
            tracing::info!("policy no longer acts; cancelling its drains");
            c.cancel();
        }
        let writer = ctx.actuator.node_writer();
        for n in self.free_nodes() {
            if taints::has(n, EbbTaint::Candidate)
                && let Err(e) = writer
                    .remove_taint(&node_name(n), EbbTaint::Candidate)
                    .await
            {
                tracing::warn!(error = %e, "removing a soft taint");
            }
        }
    }

    /// Builds the status and writes it (server-side apply) when it changed.
    async fn write_status(
        &mut self,
        ctx: &Context,
        memory: &mut PolicyMemory,
    ) -> Result<ScaleDownPolicyStatus, Error> {
        self.drains = ctx.actuator.tracker().draining(Some(&self.name));
        let last = memory.last_written.as_ref().or(self.policy.status.as_ref());
        let next = status::build(&LoopFacts {
            generation: self.policy.metadata.generation,
            now: self.now,
            mode: self.policy.spec.mode,
            nodes_selected: self.mine.len(),
            plan: self.plan.as_ref(),
            selection: self.selection.as_ref(),
            drains: &self.drains,
            overlapping: &self.overlaps,
            degraded: self.degraded.as_ref(),
            removed_total: self.removed,
            evictions_refused_total: self.refused,
            loop_duration: self.t0.elapsed(),
            previous: last,
        });
        if status::needs_write(last, &next, self.now) {
            write_status(&ctx.client, &self.name, &next)
                .await
                .map_err(|source| Error::Status {
                    policy: self.name.clone(),
                    source,
                })?;
            memory.last_written = Some(next.clone());
        }
        Ok(next)
    }

    /// Events on transitions since the last loop's facts.
    async fn publish_events(&self, ctx: &Context, memory: &mut PolicyMemory) {
        let drains = &self.drains;
        let facts = Facts {
            candidates: self.candidates.clone(),
            draining: drains.iter().map(|d| d.node.clone()).collect(),
            blocked: drains
                .iter()
                .filter(|d| d.evictions_blocked > 0)
                .map(|d| d.node.clone())
                .collect(),
            removals: drains
                .iter()
                .filter_map(|d| {
                    let r = d.removal.as_ref().filter(|r| r.handed_off.is_some())?;
                    Some((d.node.clone(), events::RemovalFact::of(r)))
                })
                .collect(),
            throttled: if self.stopped {
                None
            } else {
                status::main_throttle(self.selection.as_ref())
            },
            degraded: self
                .degraded
                .as_ref()
                .map(|d| (d.reason, d.message.clone())),
        };
        let planned = events::transitions(&self.name, &memory.facts, &facts, &self.finished);
        if !planned.is_empty() {
            let uids: BTreeMap<String, String> = self
                .nodes
                .iter()
                .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.uid.clone()?)))
                .collect();
            let policy_ref = self.policy.object_ref(&());
            events::publish(&ctx.recorder, &policy_ref, &planned, &uids).await;
        }
        memory.facts = facts;
    }
}

/// The policy's gauges: candidates, drains in progress, throttled and unremovable nodes by reason.
fn update_metrics(
    ctx: &Context,
    policy: &str,
    s: &ScaleDownPolicyStatus,
    selection: Option<&Selection>,
) {
    let labels = |reason: String| PolicyReasonLabels {
        policy: policy.to_string(),
        reason,
    };
    for reason in ThrottledReason::ALL {
        let n = selection.map_or(0, |sel| {
            sel.throttled.iter().filter(|(_, r)| r == reason).count()
        });
        let gauge = ctx
            .metrics
            .throttled
            .get_or_create(&labels(reason.to_string()));
        gauge.set(n as i64);
    }
    let p = PolicyLabels {
        policy: policy.to_string(),
    };
    let m = &ctx.metrics;
    m.unneeded_nodes
        .get_or_create(&p)
        .set(i64::from(s.candidates));
    m.drains_in_progress
        .get_or_create(&p)
        .set(i64::from(s.draining));
    for reason in UnremovableReason::ALL {
        let count = s
            .unremovable
            .iter()
            .find(|r| r.reason == *reason)
            .map_or(0, |r| r.count);
        let gauge = m
            .unremovable_nodes
            .get_or_create(&labels(reason.to_string()));
        gauge.set(i64::from(count));
    }
}

/// The UIDs of the pods the model has on each node the selection starts now.
fn planned_pods(snap: &ClusterSnapshot, sel: &Selection) -> BTreeMap<String, BTreeSet<String>> {
    sel.empty
        .iter()
        .chain(&sel.drain)
        .filter_map(|n| {
            let id = snap.node_id(n)?;
            let uids = snap.pods_on(id).iter().map(|p| snap.pod(*p).uid.clone());
            Some((n.clone(), uids.collect()))
        })
        .collect()
}
