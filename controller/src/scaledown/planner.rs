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
use super::drainability::{PodDisposition, classify, pods_to_move};
use super::eligibility::{being_deleted, check_node, utilization};
use super::pdb::PdbTracker;
use crate::cluster::build::{VolumeIndex, parse_pod};
use crate::cluster::model::TaintEffect;
use crate::cluster::{ClassId, ClusterSnapshot, NodeId, PodId, PredicateChecker};

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
    /// `pdbs_remaining_disruptions` after the last loop (`namespace/name` → count).
    pub pdbs_remaining: BTreeMap<String, i64>,
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

/// Working data of one loop.
struct Sim<'a> {
    snap: &'a mut ClusterSnapshot,
    checker: &'a mut PredicateChecker,
    pdbs: PdbTracker,
    not_dest: Vec<bool>,
    dest_order: Vec<NodeId>,
    cursor: HashMap<ClassId, usize>,
    failed: HashMap<ClassId, u64>,
    epoch: u64,
    new_hints: HashMap<String, HashMap<String, String>>,
}

impl Sim<'_> {
    /// A destination for `pod`: its hint first, then the first fitting node from the class's
    /// cyclic pointer. Classes that fit nowhere are remembered until capacity is freed.
    fn find_place(
        &mut self,
        pod: PodId,
        source: Option<&str>,
        hints: &DestinationHints,
    ) -> Option<NodeId> {
        let uid = &self.snap.pod(pod).uid;
        if let Some(dest) = source
            .and_then(|s| hints.get(s, uid))
            .and_then(|d| self.snap.node_id(d))
            && !self.not_dest[dest as usize]
            && self.checker.check(self.snap, pod, dest).is_ok()
        {
            return Some(dest);
        }
        let class = self.snap.pod(pod).class;
        let inter = self.snap.class(class).is_inter_pod();
        if !inter && self.failed.get(&class) == Some(&self.epoch) {
            return None;
        }
        let len = self.dest_order.len();
        let start = self.cursor.get(&class).copied().unwrap_or(0);
        for i in 0..len {
            let idx = (start + i) % len;
            let n = self.dest_order[idx];
            if self.not_dest[n as usize] {
                continue;
            }
            if self.checker.check(self.snap, pod, n).is_ok() {
                self.cursor.insert(class, idx);
                return Some(n);
            }
        }
        if !inter {
            self.failed.insert(class, self.epoch);
        }
        None
    }

    fn hint(&mut self, source: &str, pod: PodId, dest: NodeId) {
        let uid = self.snap.pod(pod).uid.clone();
        let to = self.snap.node(dest).name.clone();
        self.new_hints
            .entry(source.to_string())
            .or_default()
            .insert(uid, to);
    }
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
    let node_count = snap.node_count();
    state.deleted.retain(|n, _| snap.node_id(n).is_some());
    let deleted: BTreeSet<String> = state.deleted.keys().cloned().collect();
    let util: Vec<f64> = (0..node_count as NodeId)
        .map(|n| utilization(snap, n, cfg.utilization))
        .collect();

    // Destinations: nodes with fewer PreferNoSchedule taints first (the scheduler's
    // TaintToleration score steers pods away from them, ebb's own deletion-candidate taint
    // included: most pods tolerate none), then fullest first (binpacking from the other end of
    // the list).
    let soft_taints: Vec<usize> = (0..node_count as NodeId)
        .map(|n| {
            snap.node(n)
                .taints
                .iter()
                .filter(|t| t.effect == TaintEffect::PreferNoSchedule)
                .count()
        })
        .collect();
    let mut dest_order: Vec<NodeId> = (0..node_count as NodeId).collect();
    dest_order.sort_by(|a, b| {
        soft_taints[*a as usize]
            .cmp(&soft_taints[*b as usize])
            .then_with(|| util[*b as usize].total_cmp(&util[*a as usize]))
            .then_with(|| snap.node(*a).name.cmp(&snap.node(*b).name))
    });
    let not_dest: Vec<bool> = (0..node_count as NodeId)
        .map(|n| {
            let info = snap.node(n);
            !info.ready || info.unschedulable || being_deleted(snap, n, &deleted)
        })
        .collect();

    let governed: Vec<NodeId> = (0..node_count as NodeId)
        .filter(|n| cfg.node_selector.matches(&snap.node(*n).labels))
        .collect();
    let groups: Vec<Option<String>> = (0..node_count as NodeId)
        .map(|n| {
            cfg.node_group_label
                .as_ref()
                .and_then(|l| snap.node(n).labels.get(l).cloned())
        })
        .collect();
    let group_of = |n: NodeId| groups[n as usize].clone();
    let mut group_sizes: BTreeMap<Option<String>, i64> = BTreeMap::new();
    let mut deleting_per_group: BTreeMap<Option<String>, i64> = BTreeMap::new();
    for n in &governed {
        *group_sizes.entry(group_of(*n)).or_insert(0) += 1;
        if being_deleted(snap, *n, &deleted) {
            *deleting_per_group.entry(group_of(*n)).or_insert(0) += 1;
        }
    }

    snap.fork();
    let mut sim = Sim {
        pdbs: PdbTracker::new(snap),
        snap,
        checker,
        not_dest,
        dest_order,
        cursor: HashMap::new(),
        failed: HashMap::new(),
        epoch: 0,
        new_hints: HashMap::new(),
    };
    let mut pending = false;

    // 1. Pods left on nodes being deleted must still fit elsewhere (PDBs counted, not checked).
    for name in &deleted {
        let Some(node) = sim.snap.node_id(name) else {
            continue;
        };
        let pods: Vec<PodId> = sim.snap.pods_on(node).to_vec();
        for pod in pods {
            if classify(sim.snap, pod, &cfg.rules, &mut sim.pdbs) == PodDisposition::Stays {
                continue;
            }
            match sim.find_place(pod, Some(name), &state.hints) {
                Some(d) => {
                    sim.snap.place(pod, Some(d));
                    sim.pdbs.evict(sim.snap, pod);
                    sim.hint(name, pod, d);
                }
                None => {
                    tracing::info!(node = %name, pod = %sim.snap.pod(pod).key(), "pod of a node being deleted fits nowhere");
                    pending = true;
                }
            }
        }
    }

    // 2. Recently evicted pods whose owners have not replaced them yet.
    let window = cfg.recent_eviction_window;
    state
        .recent_evictions
        .retain(|e| now.duration_since(e.evicted_at) < window);
    if !state.recent_evictions.is_empty() {
        let mut live: HashMap<(String, String, String), i64> = HashMap::new();
        for p in 0..sim.snap.pod_count() as PodId {
            let info = sim.snap.pod(p);
            if let Some(o) = &info.owner
                && !info.terminal
                && !info.terminating
            {
                *live
                    .entry((o.kind.clone(), info.namespace.clone(), o.name.clone()))
                    .or_insert(0) += 1;
            }
        }
        let mut evictions: Vec<&RecentEviction> = state.recent_evictions.iter().collect();
        evictions.sort_by(|a, b| {
            a.evicted_at
                .cmp(&b.evicted_at)
                .then_with(|| a.pod.metadata.uid.cmp(&b.pod.metadata.uid))
        });
        let no_volumes = VolumeIndex::new();
        for e in evictions {
            let Ok((mut info, req)) = parse_pod(&e.pod, &no_volumes) else {
                tracing::warn!(pod = ?e.pod.metadata.name, "recently evicted pod cannot be parsed; ignored");
                continue;
            };
            if sim.snap.pod_by_uid(&info.uid).is_some() {
                continue; // still there (terminating): already accounted for
            }
            if let Some(o) = &info.owner
                && let Some(owner) = sim.snap.owner(&o.kind, &info.namespace, &o.name)
            {
                let key = (o.kind.clone(), info.namespace.clone(), o.name.clone());
                let current = live.get(&key).copied().unwrap_or(0);
                if current >= owner.desired {
                    continue; // replaced
                }
                *live.entry(key).or_insert(0) += 1;
            }
            let source = info.node_name.take();
            let pod = sim.snap.add_pod(info, req);
            match sim.find_place(pod, source.as_deref(), &state.hints) {
                Some(d) => sim.snap.place(pod, Some(d)),
                None => {
                    tracing::info!(pod = %sim.snap.pod(pod).key(), "recently evicted pod fits nowhere");
                    pending = true;
                }
            }
        }
    }

    let mut out = Plan {
        governed: governed.len(),
        group_sizes: group_sizes.clone(),
        pending_reschedule: pending,
        ..Plan::default()
    };
    let mut unremovable: Vec<Unremovable> = Vec::new();
    let mut non_candidates: BTreeMap<String, NonCandidate> = BTreeMap::new();

    // 3. Eligible nodes, previous candidates first, then least utilised.
    let mut eligible: Vec<NodeId> = Vec::new();
    for &n in &governed {
        match check_node(
            sim.snap,
            n,
            &deleted,
            cfg.utilization_threshold,
            cfg.utilization,
        ) {
            Ok(()) if pending => unremovable.push(Unremovable {
                node: sim.snap.node(n).name.clone(),
                reason: UnremovableReason::PendingReschedule,
                pod: None,
                pod_reason: None,
            }),
            Ok(()) => eligible.push(n),
            Err(reason) => unremovable.push(Unremovable {
                node: sim.snap.node(n).name.clone(),
                reason,
                pod: None,
                pod_reason: None,
            }),
        }
    }
    eligible.sort_by(|a, b| {
        let was = |n: &NodeId| !state.candidates.contains_key(&sim.snap.node(*n).name);
        was(a)
            .cmp(&was(b))
            .then_with(|| by_util(sim.snap, &util, *a, *b))
    });

    // 4. Greedy simulation.
    let mut used_as_dest = vec![false; node_count];
    let mut candidates_per_group: BTreeMap<Option<String>, i64> = BTreeMap::new();
    let mut evaluated = 0usize;
    let mut timed_out = false;
    for (i, &node) in eligible.iter().enumerate() {
        if evaluated >= cfg.min_nodes_evaluated && watch.elapsed() >= cfg.simulation_timeout {
            timed_out = true;
            for &rest in &eligible[i..] {
                unremovable.push(Unremovable {
                    node: sim.snap.node(rest).name.clone(),
                    reason: UnremovableReason::NotEvaluated,
                    pod: None,
                    pod_reason: None,
                });
            }
            break;
        }
        evaluated += 1;
        let name = sim.snap.node(node).name.clone();
        let group = group_of(node);
        let size = group_sizes.get(&group).copied().unwrap_or(0);
        let taken = deleting_per_group.get(&group).copied().unwrap_or(0)
            + candidates_per_group.get(&group).copied().unwrap_or(0);
        let mut fail = |reason, pod: Option<String>, pod_reason| {
            unremovable.push(Unremovable {
                node: name.clone(),
                reason,
                pod,
                pod_reason,
            });
        };
        if size - taken - 1 < cfg.limits.min_nodes_per_group {
            fail(UnremovableReason::NodeGroupMinSizeReached, None, None);
            continue;
        }
        if used_as_dest[node as usize] {
            fail(UnremovableReason::DestinationOfMovedPods, None, None);
            continue;
        }
        let pods = match pods_to_move(sim.snap, node, &cfg.rules, &mut sim.pdbs) {
            Ok(p) => p,
            Err((pod, r)) => {
                let key = sim.snap.pod(pod).key();
                fail(UnremovableReason::BlockedByPod, Some(key), Some(r));
                non_candidates.insert(
                    name.clone(),
                    NonCandidate {
                        at: now,
                        reason: UnremovableReason::BlockedByPod,
                    },
                );
                continue;
            }
        };
        let was_not_dest = sim.not_dest[node as usize];
        sim.not_dest[node as usize] = true;
        sim.snap.fork();
        sim.pdbs.fork();
        let mut moves: Vec<(PodId, NodeId)> = Vec::with_capacity(pods.len());
        let mut failure: Option<(UnremovableReason, PodId, Option<BlockingPodReason>)> = None;
        for &pod in &pods {
            if !sim.pdbs.can_evict(sim.snap, pod) {
                failure = Some((
                    UnremovableReason::BlockedByPod,
                    pod,
                    Some(BlockingPodReason::NotEnoughPdb),
                ));
                break;
            }
            match sim.find_place(pod, Some(&name), &state.hints) {
                Some(d) => {
                    sim.snap.place(pod, Some(d));
                    sim.pdbs.evict(sim.snap, pod);
                    moves.push((pod, d));
                }
                None => {
                    failure = Some((UnremovableReason::NoPlaceToMovePods, pod, None));
                    break;
                }
            }
        }
        if let Some((reason, pod, pod_reason)) = failure {
            sim.snap.revert();
            sim.pdbs.revert();
            sim.epoch += 1;
            sim.not_dest[node as usize] = was_not_dest;
            let key = sim.snap.pod(pod).key();
            fail(reason, Some(key), pod_reason);
            non_candidates.insert(name.clone(), NonCandidate { at: now, reason });
            continue;
        }
        sim.snap.commit();
        sim.pdbs.commit();
        *candidates_per_group.entry(group.clone()).or_insert(0) += 1;
        let mut candidate = Candidate {
            since: state.candidates.get(&name).copied().unwrap_or(now),
            empty: pods.is_empty(),
            ready: sim.snap.node(node).ready,
            group,
            moves: Vec::with_capacity(moves.len()),
            node: name.clone(),
        };
        for (pod, d) in moves {
            used_as_dest[d as usize] = true;
            sim.hint(&name, pod, d);
            let p = sim.snap.pod(pod);
            candidate.moves.push(Move {
                pod: p.key(),
                uid: p.uid.clone(),
                to: sim.snap.node(d).name.clone(),
            });
        }
        out.candidates.push(candidate);
    }

    out.simulation = SimulationStats {
        duration: watch.elapsed(),
        nodes_evaluated: evaluated,
        timed_out,
        predicate_checks: sim.checker.stats().checks,
    };
    let remaining = sim.pdbs.remaining(sim.snap);
    let new_hints = std::mem::take(&mut sim.new_hints);
    sim.snap.revert();
    drop(sim);

    // State for the next loop.
    state.candidates = out
        .candidates
        .iter()
        .map(|c| (c.node.clone(), c.since))
        .collect();
    state
        .non_candidates
        .retain(|n, _| snap.node_id(n).is_some() && !non_candidates.contains_key(n));
    state.non_candidates.extend(non_candidates);
    for c in &out.candidates {
        state.non_candidates.remove(&c.node);
    }
    state.hints.rotate(new_hints);
    state.pdbs_remaining = remaining;
    unremovable.sort_by(|a, b| a.node.cmp(&b.node));
    out.unremovable = unremovable;
    tracing::debug!(
        candidates = out.candidates.len(),
        unremovable = out.unremovable.len(),
        evaluated,
        timed_out,
        "planner loop done"
    );
    out
}

/// StartDeletion: which candidates start now, given the deletions in flight (the deleted set:
/// a node with pods left to move counts as a drain, else as empty).
pub fn select_deletions(
    snap: &ClusterSnapshot,
    plan: &Plan,
    state: &PlannerState,
    cfg: &PlannerConfig,
    now: Timestamp,
    ignore_unneeded_time: bool,
) -> Selection {
    let mut in_flight = InFlight::default();
    let no_pdbs_needed = &mut PdbTracker::new(snap);
    for name in state.deleted.keys() {
        let Some(n) = snap.node_id(name) else {
            continue;
        };
        let movable = snap
            .pods_on(n)
            .iter()
            .any(|p| classify(snap, *p, &cfg.rules, no_pdbs_needed) != PodDisposition::Stays);
        if movable {
            in_flight.drains += 1;
        } else {
            in_flight.empty += 1;
        }
        if cfg.node_selector.matches(&snap.node(n).labels) {
            let group = cfg
                .node_group_label
                .as_ref()
                .and_then(|l| snap.node(n).labels.get(l).cloned());
            *in_flight.per_group.entry(group).or_insert(0) += 1;
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
