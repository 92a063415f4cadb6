//! The parallel-drain planner: each loop re-verifies nodes being deleted, re-injects recently
//! evicted pods, then greedily grows the candidate set (nodes removable all at once) on a forked
//! snapshot. Pure: no API calls, time comes from the caller (`now` and a [`Stopwatch`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use ebb_api::reasons::{BlockingPodReason, UnremovableReason};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::budgets::{self, InFlight, Removable, Selection};
use super::config::PlannerConfig;
use super::drainability::{PodDisposition, classify};
use super::eligibility::{self, being_deleted, check_node, utilization};
use super::pdb::{PdbTracker, PdbView};
use super::removal;
use super::simulation::{Greedy, Inputs, Sim};
use crate::cluster::model::TaintEffect;
use crate::cluster::{ClusterSnapshot, NodeId, PredicateChecker};

/// Elapsed time since the loop started; injected so tests control the time bound.
pub trait Stopwatch {
    fn elapsed(&mut self) -> Duration;
}

/// A [`Stopwatch`] on the monotonic clock, started by the caller.
#[derive(Clone, Copy, Debug)]
pub struct InstantStopwatch(Instant);

impl InstantStopwatch {
    pub fn start() -> Self {
        InstantStopwatch(Instant::now())
    }
}

impl Stopwatch for InstantStopwatch {
    fn elapsed(&mut self) -> Duration {
        self.0.elapsed()
    }
}

/// A [`Stopwatch`] that advances by `step` every time it is read (for tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepStopwatch {
    pub step: Duration,
    pub now: Duration,
}

impl Stopwatch for StepStopwatch {
    fn elapsed(&mut self) -> Duration {
        self.now += self.step;
        self.now
    }
}

/// A pod the actuator evicted, remembered for `recentEvictionWindow`.
#[derive(Clone, Debug)]
pub struct RecentEviction {
    pub pod: Pod,
    pub evicted_at: Timestamp,
}

/// A node whose drain simulation failed, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NonCandidate {
    pub at: Timestamp,
    pub reason: UnremovableReason,
}

/// `pod_destination_hints` in two generations: the last loop's and the one before. Hints not
/// refreshed for two loops are forgotten.
#[derive(Clone, Debug, Default)]
pub struct DestinationHints {
    current: HashMap<String, HashMap<String, String>>,
    previous: HashMap<String, HashMap<String, String>>,
}

impl DestinationHints {
    /// Destination remembered for pod `uid` of node `source`.
    pub fn get(&self, source: &str, uid: &str) -> Option<&str> {
        self.current
            .get(source)
            .and_then(|m| m.get(uid))
            .or_else(|| self.previous.get(source).and_then(|m| m.get(uid)))
            .map(String::as_str)
    }

    /// Number of hints in the newest generation.
    pub fn len(&self) -> usize {
        self.current.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Only the hints for pods of the `sources` nodes.
    pub fn only_from<'a>(&self, sources: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = DestinationHints::default();
        for s in sources {
            if let Some(m) = self.current.get(s) {
                out.current.insert(s.to_string(), m.clone());
            }
            if let Some(m) = self.previous.get(s) {
                out.previous.insert(s.to_string(), m.clone());
            }
        }
        out
    }

    fn rotate(&mut self, new: HashMap<String, HashMap<String, String>>) {
        self.previous = std::mem::replace(&mut self.current, new);
    }
}

/// What the planner remembers between loops. The actuator tells it which nodes are being
/// deleted ([`PlannerState::start_deleting`] / [`PlannerState::finish_deleting`], or
/// [`PlannerState::sync_deleting_from_taints`] after a restart) and which pods it evicted
/// ([`PlannerState::record_eviction`]).
#[derive(Clone, Debug, Default)]
pub struct PlannerState {
    /// `deleted_set`: nodes being deleted, with when that started.
    pub deleted: BTreeMap<String, Timestamp>,
    /// `candidate_set`: nodes removable together, with when each entered (reset on leaving).
    pub candidates: BTreeMap<String, Timestamp>,
    /// `non_candidate_set`: nodes whose drain simulation failed, with when.
    pub non_candidates: BTreeMap<String, NonCandidate>,
    /// `pod_destination_hints`.
    pub hints: DestinationHints,
    /// `recent_evictions`.
    pub recent_evictions: Vec<RecentEviction>,
}

impl PlannerState {
    /// The actuator started deleting `node` (it leaves the candidate set).
    pub fn start_deleting(&mut self, node: &str, at: Timestamp) {
        self.candidates.remove(node);
        self.deleted.entry(node.to_string()).or_insert(at);
    }

    /// The node is gone, or its deletion was abandoned.
    pub fn finish_deleting(&mut self, node: &str) {
        self.deleted.remove(node);
    }

    /// Re-derives the deleted set from the `ebb.dev/to-be-deleted` taint (after a restart).
    pub fn sync_deleting_from_taints(&mut self, snap: &ClusterSnapshot, now: Timestamp) {
        let tainted: BTreeSet<String> = (0..snap.node_count() as NodeId)
            .map(|n| snap.node(n))
            .filter(|n| n.has_taint(ebb_api::names::TAINT_TO_BE_DELETED))
            .map(|n| n.name.clone())
            .collect();
        self.deleted.retain(|n, _| tainted.contains(n));
        for n in tainted {
            self.start_deleting(&n, now);
        }
    }

    /// The actuator evicted this pod at `at`.
    pub fn record_eviction(&mut self, pod: Pod, at: Timestamp) {
        self.recent_evictions.push(RecentEviction {
            pod,
            evicted_at: at,
        });
    }
}

/// A pod move in the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    /// Destination node.
    pub to: String,
}

/// A node in the candidate set.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub node: String,
    pub since: Timestamp,
    /// No pods to move (only DaemonSet, mirror or finished pods).
    pub empty: bool,
    pub ready: bool,
    pub group: Option<String>,
    /// Fewest nodes its group keeps.
    pub group_min: i64,
    pub moves: Vec<Move>,
}

/// A governed node that is not a candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unremovable {
    pub node: String,
    pub reason: UnremovableReason,
    /// `namespace/name` of the pod that blocks, for `BlockedByPod` and `NoPlaceToMovePods`.
    pub pod: Option<String>,
    pub pod_reason: Option<BlockingPodReason>,
    /// What else names the cause, for a user to act on (the volume that pins a pod).
    pub detail: Option<String>,
}

/// Figures of one simulation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimulationStats {
    pub duration: Duration,
    pub nodes_evaluated: usize,
    pub timed_out: bool,
    pub predicate_checks: u64,
}

/// The decisions of one loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The candidate set, in evaluation order.
    pub candidates: Vec<Candidate>,
    /// Governed nodes that are not candidates, in node-name order.
    pub unremovable: Vec<Unremovable>,
    /// Pods of nodes being deleted, or recently evicted pods, found no place: no new candidates.
    pub pending_reschedule: bool,
    /// Governed nodes (selected by the policy).
    pub governed: usize,
    /// Governed nodes per node group.
    pub group_sizes: BTreeMap<Option<String>, i64>,
    pub simulation: SimulationStats,
}

/// What one loop knows of every node before it simulates: utilisation, node group, which
/// nodes the policy governs, and the governed nodes per group (all, and being deleted).
pub(super) struct NodeFacts {
    pub util: Vec<f64>,
    pub groups: Vec<Option<String>>,
    pub governed: Vec<NodeId>,
    pub group_sizes: BTreeMap<Option<String>, i64>,
    /// Fewest nodes each group keeps (`minNodesPerGroup`, or the group's own minimum).
    pub group_mins: BTreeMap<Option<String>, i64>,
    pub deleting_per_group: BTreeMap<Option<String>, i64>,
}

/// The node group of `n`: its `nodeGroupLabel` value when the policy sets one, else the
/// MachineDeployment, MachineSet or NodePool behind it (none for other nodes).
pub(super) fn group_key(snap: &ClusterSnapshot, cfg: &PlannerConfig, n: NodeId) -> Option<String> {
    let node = snap.node(n);
    match &cfg.node_group_label {
        Some(l) => node.labels.get(l).cloned(),
        None => node.machine.as_ref().and_then(|m| m.group.clone()),
    }
}

/// The minimum size annotated on `n`'s Cluster API node group (when groups come from it).
fn annotated_group_min(snap: &ClusterSnapshot, cfg: &PlannerConfig, n: NodeId) -> Option<i64> {
    match &cfg.node_group_label {
        Some(_) => None,
        None => snap.node(n).machine.as_ref().and_then(|m| m.group_min),
    }
}

impl NodeFacts {
    fn gather(snap: &ClusterSnapshot, cfg: &PlannerConfig, deleted: &BTreeSet<String>) -> Self {
        let nodes = 0..snap.node_count() as NodeId;
        let util = nodes
            .clone()
            .map(|n| utilization(snap, n, cfg.utilization))
            .collect();
        let governed: Vec<NodeId> = nodes
            .clone()
            .filter(|n| {
                let node = snap.node(*n);
                cfg.node_selector.matches(&node.labels)
                    && cfg.only_node.as_ref().is_none_or(|only| *only == node.name)
            })
            .collect();
        let groups: Vec<Option<String>> = nodes.map(|n| group_key(snap, cfg, n)).collect();
        let mut group_sizes = BTreeMap::new();
        let mut group_mins = BTreeMap::new();
        let mut deleting_per_group = BTreeMap::new();
        for &n in &governed {
            *group_sizes.entry(groups[n as usize].clone()).or_insert(0) += 1;
            let min = cfg.limits.group_min(annotated_group_min(snap, cfg, n));
            let at_least = group_mins.entry(groups[n as usize].clone()).or_insert(min);
            *at_least = (*at_least).max(min);
            if being_deleted(snap, n, deleted) {
                *deleting_per_group
                    .entry(groups[n as usize].clone())
                    .or_insert(0) += 1;
            }
        }
        NodeFacts {
            util,
            groups,
            governed,
            group_sizes,
            group_mins,
            deleting_per_group,
        }
    }

    pub fn group_of(&self, n: NodeId) -> Option<String> {
        self.groups[n as usize].clone()
    }

    /// Fewest nodes `group` keeps.
    pub fn group_min(&self, group: &Option<String>, cfg: &PlannerConfig) -> i64 {
        self.group_mins
            .get(group)
            .copied()
            .unwrap_or(cfg.limits.min_nodes_per_group)
    }

    /// Destinations: nodes with fewer PreferNoSchedule taints first (the scheduler's
    /// TaintToleration score steers pods away from them, ebb's own deletion-candidate taint
    /// included: most pods tolerate none); then nodes this policy will keep (not governed, or
    /// above the threshold) before underutilised ones it may remove next, so that pods do not
    /// land on a node only to hold it back for another round and another `unneededTime`; then
    /// fullest first (binpacking from the other end of the list).
    fn destination_order(&self, snap: &ClusterSnapshot, threshold: f64) -> Vec<NodeId> {
        let soft_taints: Vec<usize> = (0..snap.node_count() as NodeId)
            .map(|n| {
                snap.node(n)
                    .taints
                    .iter()
                    .filter(|t| t.effect == TaintEffect::PreferNoSchedule)
                    .count()
            })
            .collect();
        let util = &self.util;
        let mut removable_later = vec![false; snap.node_count()];
        for &n in &self.governed {
            removable_later[n as usize] = util[n as usize] < threshold;
        }
        // Sort keys side by side; names (unique) break ties, so the order is total.
        let mut keyed: Vec<(usize, bool, f64, NodeId)> = (0..snap.node_count() as NodeId)
            .map(|n| {
                let i = n as usize;
                (soft_taints[i], removable_later[i], util[i], n)
            })
            .collect();
        keyed.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.1.cmp(&b.1))
                .then_with(|| b.2.total_cmp(&a.2))
                .then_with(|| snap.node(a.3).name.cmp(&snap.node(b.3).name))
        });
        keyed.into_iter().map(|k| k.3).collect()
    }
}

/// Nodes no pod may move to: not ready, cordoned or being deleted.
fn not_destinations(snap: &ClusterSnapshot, deleted: &BTreeSet<String>) -> Vec<bool> {
    (0..snap.node_count() as NodeId)
        .map(|n| {
            let info = snap.node(n);
            !info.ready || info.unschedulable || being_deleted(snap, n, deleted)
        })
        .collect()
}

/// Candidate order: f64 utilisation compared totally; at equal utilisation, nodes holding warm
/// data for fewer workload roles first (they are cheaper to lose); then the name.
fn by_util(snap: &ClusterSnapshot, util: &[f64], a: NodeId, b: NodeId) -> std::cmp::Ordering {
    let (na, nb) = (snap.node(a), snap.node(b));
    util[a as usize]
        .total_cmp(&util[b as usize])
        .then_with(|| na.warm_roles.cmp(&nb.warm_roles))
        .then_with(|| na.name.cmp(&nb.name))
}

/// Step 3: the governed nodes that may be removed (node checks, then whether the policy's
/// removal method applies), previous candidates first, then least utilised. The others are recorded as unremovable (all of them while pods are pending).
fn eligible_nodes(
    snap: &ClusterSnapshot,
    facts: &NodeFacts,
    cfg: &PlannerConfig,
    deleted: &BTreeSet<String>,
    pending: bool,
    previous: &BTreeMap<String, Timestamp>,
    now: Timestamp,
) -> (Vec<NodeId>, Vec<Unremovable>) {
    let mut eligible: Vec<NodeId> = Vec::new();
    let mut unremovable = Vec::new();
    for &n in &facts.governed {
        let check = check_node(snap, n, deleted, cfg.utilization_threshold, cfg.utilization)
            .and_then(|()| match cfg.removal {
                Some(method) => removal::target(method, snap.node(n).machine.as_ref()).map(drop),
                None => Ok(()),
            });
        match check {
            Ok(()) if pending => unremovable.push(Unremovable::node(
                snap,
                n,
                UnremovableReason::PendingReschedule,
            )),
            Ok(()) => {
                let arriving = eligibility::arriving(snap, n, now);
                if arriving.is_empty() {
                    eligible.push(n);
                } else {
                    let mut u = Unremovable::node(snap, n, UnremovableReason::PodsArriving);
                    u.detail = Some(eligibility::arriving_message(&arriving));
                    unremovable.push(u);
                }
            }
            Err(reason) => unremovable.push(Unremovable::node(snap, n, reason)),
        }
    }
    eligible.sort_by(|a, b| {
        let was = |n: &NodeId| !previous.contains_key(&snap.node(*n).name);
        was(a)
            .cmp(&was(b))
            .then_with(|| by_util(snap, &facts.util, *a, *b))
    });
    (eligible, unremovable)
}

impl Unremovable {
    /// `node` is unremovable for `reason`, no pod to blame.
    pub(super) fn node(snap: &ClusterSnapshot, node: NodeId, reason: UnremovableReason) -> Self {
        Unremovable {
            node: snap.node(node).name.clone(),
            reason,
            pod: None,
            pod_reason: None,
            detail: None,
        }
    }
}

/// One planner loop (`UpdateUnneededNodes`). The snapshot is forked and left exactly as it was;
/// `checker` must belong to this snapshot. Updates `state` and returns the decisions.
pub fn plan(
    snap: &mut ClusterSnapshot,
    checker: &mut PredicateChecker,
    cfg: &PlannerConfig,
    now: Timestamp,
    state: &mut PlannerState,
    watch: &mut dyn Stopwatch,
) -> Plan {
    state.deleted.retain(|n, _| snap.node_id(n).is_some());
    let deleted: BTreeSet<String> = state.deleted.keys().cloned().collect();
    let facts = NodeFacts::gather(snap, cfg, &deleted);
    let dest_order = facts.destination_order(snap, cfg.utilization_threshold);
    let not_dest = not_destinations(snap, &deleted);

    snap.fork();
    let mut sim = Sim::new(snap, checker, not_dest, dest_order);
    let deleted_pending = sim.reverify_deleted(&deleted, &cfg.rules, &state.hints);
    let window = cfg.recent_eviction_window;
    state
        .recent_evictions
        .retain(|e| now.duration_since(e.evicted_at) < window);
    let evicted_pending = sim.reinject_evictions(&state.recent_evictions, &state.hints);
    let pending = deleted_pending || evicted_pending;

    let (eligible, unremovable) = eligible_nodes(
        sim.snap,
        &facts,
        cfg,
        &deleted,
        pending,
        &state.candidates,
        now,
    );
    let mut greedy = Greedy::new(sim.snap.node_count(), unremovable);
    let inputs = Inputs {
        facts: &facts,
        cfg,
        state,
        now,
    };
    greedy.run(&mut sim, &eligible, &inputs, watch);

    let simulation = SimulationStats {
        duration: watch.elapsed(),
        nodes_evaluated: greedy.evaluated,
        timed_out: greedy.timed_out,
        predicate_checks: sim.checker.stats().checks,
    };
    let new_hints = std::mem::take(&mut sim.new_hints);
    sim.snap.revert();
    drop(sim);

    greedy.unremovable.sort_by(|a, b| a.node.cmp(&b.node));
    let out = Plan {
        governed: facts.governed.len(),
        group_sizes: facts.group_sizes,
        pending_reschedule: pending,
        simulation,
        candidates: greedy.candidates,
        unremovable: greedy.unremovable,
    };
    state.remember(snap, &out, greedy.non_candidates, new_hints);
    tracing::debug!(
        candidates = out.candidates.len(),
        unremovable = out.unremovable.len(),
        evaluated = out.simulation.nodes_evaluated,
        timed_out = out.simulation.timed_out,
        "planner loop done"
    );
    out
}

impl PlannerState {
    /// State for the next loop: the new candidate set, the non-candidates (refreshed, forgotten
    /// once candidates or gone) and the hints.
    fn remember(
        &mut self,
        snap: &ClusterSnapshot,
        out: &Plan,
        non_candidates: BTreeMap<String, NonCandidate>,
        new_hints: HashMap<String, HashMap<String, String>>,
    ) {
        self.candidates = out
            .candidates
            .iter()
            .map(|c| (c.node.clone(), c.since))
            .collect();
        self.non_candidates
            .retain(|n, _| snap.node_id(n).is_some() && !non_candidates.contains_key(n));
        self.non_candidates.extend(non_candidates);
        for c in &out.candidates {
            self.non_candidates.remove(&c.node);
        }
        self.hints.rotate(new_hints);
    }
}

/// StartDeletion: which candidates start now, given the deletions in flight (the deleted set:
/// a node with pods left to move counts as a drain, else as empty) and what the
/// PodDisruptionBudgets allow beyond what those drains still need.
pub fn select_deletions(
    snap: &ClusterSnapshot,
    plan: &Plan,
    state: &PlannerState,
    cfg: &PlannerConfig,
    now: Timestamp,
    ignore_unneeded_time: bool,
) -> Selection {
    let evicted = state
        .recent_evictions
        .iter()
        .filter_map(|e| e.pod.metadata.uid.as_deref());
    let mut pdbs = PdbView::new(snap, evicted);
    let mut in_flight = InFlight {
        pdbs: pdbs.pacing(),
        ..InFlight::default()
    };
    let mut classes = PdbTracker::new(snap);
    for name in state.deleted.keys() {
        let Some(n) = snap.node_id(name) else {
            continue;
        };
        let movable = snap
            .pods_on(n)
            .iter()
            .any(|p| classify(snap, *p, &cfg.rules, &mut classes) != PodDisposition::Stays);
        if movable {
            in_flight.drains += 1;
        } else {
            in_flight.empty += 1;
        }
        in_flight.pdbs.take(&pdbs.needs(n, &cfg.rules));
        if cfg.node_selector.matches(&snap.node(n).labels) {
            *in_flight
                .per_group
                .entry(group_key(snap, cfg, n))
                .or_insert(0) += 1;
        }
    }
    let removable: Vec<Removable> = plan
        .candidates
        .iter()
        .map(|c| Removable {
            node: c.node.clone(),
            empty: c.empty,
            ready: c.ready,
            since: c.since,
            group: c.group.clone(),
            group_min: c.group_min,
            needs: snap
                .node_id(&c.node)
                .map(|n| pdbs.needs(n, &cfg.rules))
                .unwrap_or_default(),
        })
        .collect();
    budgets::select(
        &removable,
        &in_flight,
        &cfg.limits,
        &cfg.budgets,
        now,
        &plan.group_sizes,
        plan.governed,
        ignore_unneeded_time,
    )
}
