//! The planner's simulation on a forked snapshot: re-placing pods of nodes being deleted and
//! recently evicted pods, then greedily growing the set of nodes removable all at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ebb_api::reasons::{BlockingPodReason, UnremovableReason};
use jiff::Timestamp;

use super::config::PlannerConfig;
use super::decisions::{Candidate, Move, Unremovable};
use super::drainability::{DrainRules, PodDisposition, block_detail, classify, pods_to_move};
use super::eligibility::Accelerators;
use super::fit_memory::FitMemory;
use super::memory::{
    DestinationHints, HintMap, NonCandidate, PlannerState, RecentEviction, SourceHints,
};
use super::node_facts::NodeFacts;
use super::pdb_coverage::PdbTracker;
use super::stopwatch::Stopwatch;
use crate::cluster::build::{VolumeIndex, parse_pod};
use crate::cluster::snapshot::NameHasher;
use crate::cluster::{ClassId, ClusterSnapshot, NodeId, PodId, PredicateChecker};

/// Working data of one loop.
pub(super) struct Sim<'a> {
    pub snap: &'a mut ClusterSnapshot,
    pub checker: &'a mut PredicateChecker,
    pub pdbs: PdbTracker,
    not_dest: Vec<bool>,
    dest_order: Vec<NodeId>,
    /// Each node's position in `dest_order` (`None`: never a destination).
    position: Vec<Option<usize>>,
    cursor: HashMap<ClassId, usize, NameHasher>,
    /// While a drain is simulated, each kind of pod's pointer before it and the first position
    /// at which the drain placed that kind, so that a refused drain sets the pointer back to the
    /// first node with room for them: not past nodes whose room that drain only borrowed, and
    /// not before nodes scanned in vain (they had no room before the drain either).
    cursor_undo: Option<Vec<CursorUndo>>,
    fits: FitMemory,
    pub new_hints: HintMap,
    /// Destination names as the plan shares them (made once per destination, not per move).
    dest_names: Vec<Option<Arc<str>>>,
}

/// One kind of pod's pointer as a drain simulation moved it.
struct CursorUndo {
    class: ClassId,
    /// The pointer before the drain (`None`: the start of the order).
    was: Option<usize>,
    /// The first position at which the drain placed this kind.
    first: usize,
    /// Whether this kind's fit depends on other pods (inter-pod terms): then a node the drain
    /// found full may have room once its pods are gone, and the pointer goes back as it was.
    inter: bool,
}

impl CursorUndo {
    /// Where the pointer goes when the drain is refused. `freed`: the positions whose room the
    /// revert gave back (the drained node and where its pods had been placed). Every other node between the old pointer and `first` was tried for
    /// this kind in vain and has no more room now, so the scan restarts at the first freed
    /// position among them, else at `first`.
    fn reset(&self, freed: &[usize], len: usize) -> usize {
        let was = self.was.unwrap_or(0);
        if self.inter || len == 0 {
            return was;
        }
        let ahead = |i: usize| (i + len - was) % len;
        freed
            .iter()
            .copied()
            .filter(|&f| ahead(f) < ahead(self.first))
            .min_by_key(|&f| ahead(f))
            .unwrap_or(self.first)
    }
}

/// A pod that could not be moved off a node: why, which pod, and the pod's own reason.
type Blocked = (UnremovableReason, PodId, Option<BlockingPodReason>);

impl<'a> Sim<'a> {
    pub fn new(
        snap: &'a mut ClusterSnapshot,
        checker: &'a mut PredicateChecker,
        not_dest: Vec<bool>,
        dest_order: Vec<NodeId>,
    ) -> Self {
        let mut position = vec![None; snap.node_count()];
        for (i, &n) in dest_order.iter().enumerate() {
            position[n as usize] = Some(i);
        }
        Sim {
            pdbs: PdbTracker::new(snap),
            snap,
            checker,
            not_dest,
            dest_order,
            position,
            cursor: HashMap::default(),
            cursor_undo: None,
            fits: FitMemory::new(),
            new_hints: HintMap::default(),
            dest_names: Vec::new(),
        }
    }

    /// A destination for `pod`: its hint first, then the first fitting node from the class's
    /// cyclic pointer. Classes that fit nowhere are remembered until capacity is freed.
    fn find_place(&mut self, pod: PodId, hints: SourceHints) -> Option<NodeId> {
        let uid = &self.snap.pod(pod).uid;
        if let Some(dest) = hints.get(uid).and_then(|d| self.snap.node_id(d))
            && !self.not_dest[dest as usize]
            && self.checker.check(self.snap, pod, dest).is_ok()
        {
            return Some(dest);
        }
        let class = self.snap.pod(pod).class;
        let inter = self.snap.class(class).is_inter_pod();
        let len = self.dest_order.len();
        let start = self.cursor.get(&class).copied().unwrap_or(0);
        // A class that fitted nowhere is tried only where room came back since.
        let positions: Box<dyn Iterator<Item = usize>> = match (!inter)
            .then(|| self.fits.positions(self.snap, class, start))
            .flatten()
        {
            Some(few) => Box::new(few.into_iter()),
            None => Box::new((0..len).map(move |i| (start + i) % len)),
        };
        for idx in positions {
            let n = self.dest_order[idx];
            if self.not_dest[n as usize] {
                continue;
            }
            if self.checker.check(self.snap, pod, n).is_ok() {
                let was = self.cursor.insert(class, idx);
                if let Some(undo) = &mut self.cursor_undo
                    && !undo.iter().any(|u| u.class == class)
                {
                    undo.push(CursorUndo {
                        class,
                        was,
                        first: idx,
                        inter,
                    });
                }
                return Some(n);
            }
        }
        if !inter {
            self.fits.fitted_nowhere(self.snap, class);
        }
        None
    }

    /// Remembers `dest` for `pod` of `source`; returns the pod's uid and the destination's
    /// name as the hint holds them, for the plan to share.
    fn hint(&mut self, source: &str, pod: PodId, dest: NodeId) -> (Arc<str>, Arc<str>) {
        let uid = self.snap.pod(pod).uid.clone();
        let i = dest as usize;
        if self.dest_names.len() <= i {
            self.dest_names.resize(i + 1, None);
        }
        let to = self.dest_names[i]
            .get_or_insert_with(|| Arc::from(self.snap.node(dest).name.as_str()))
            .clone();
        // Looked up by `&str` first: the source's name is copied once, not per move.
        match self.new_hints.get_mut(source) {
            Some(m) => m,
            None => self.new_hints.entry(source.to_string()).or_default(),
        }
        .insert(uid.clone(), to.clone());
        (uid, to)
    }

    /// Step 1: pods left on nodes being deleted must still fit elsewhere. True when one fits
    /// nowhere.
    pub fn reverify_deleted(
        &mut self,
        deleted: &BTreeSet<String>,
        rules: &DrainRules,
        hints: &DestinationHints,
    ) -> bool {
        let mut pending = false;
        for name in deleted {
            let Some(node) = self.snap.node_id(name) else {
                continue;
            };
            // In name order, as drains list them: not in the order the pods reached the
            // snapshot, which the watches decide.
            let hints = hints.of(Some(name));
            for pod in self.snap.pods_by_name(node).into_owned() {
                if classify(self.snap, pod, rules, &mut self.pdbs) == PodDisposition::Stays {
                    continue;
                }
                match self.find_place(pod, hints) {
                    Some(d) => {
                        self.snap.place(pod, Some(d));
                        self.hint(name, pod, d);
                    }
                    None => {
                        tracing::info!(node = %name, pod = %self.snap.pod(pod).key(), "pod of a node being deleted fits nowhere");
                        pending = true;
                    }
                }
            }
        }
        pending
    }

    /// Live (not finished, not terminating) pods per owner (kind, namespace, name).
    fn live_pods_per_owner(&self) -> HashMap<(String, String, String), i64> {
        let mut live = HashMap::new();
        for p in 0..self.snap.pod_count() as PodId {
            let info = self.snap.pod(p);
            if let Some(o) = &info.owner
                && !info.terminal
                && !info.terminating
            {
                *live
                    .entry((o.kind.clone(), info.namespace.clone(), o.name.clone()))
                    .or_insert(0) += 1;
            }
        }
        live
    }

    /// Step 2: recently evicted pods whose owners have not replaced them yet are placed again,
    /// oldest first. True when one fits nowhere.
    pub fn reinject_evictions(
        &mut self,
        evictions: &[RecentEviction],
        hints: &DestinationHints,
    ) -> bool {
        if evictions.is_empty() {
            return false;
        }
        let mut live = self.live_pods_per_owner();
        let mut evictions: Vec<&RecentEviction> = evictions.iter().collect();
        evictions.sort_by(|a, b| {
            a.evicted_at
                .cmp(&b.evicted_at)
                .then_with(|| a.pod.metadata.uid.cmp(&b.pod.metadata.uid))
        });
        let mut pending = false;
        let no_volumes = VolumeIndex::new();
        for e in evictions {
            let Ok((mut info, req)) = parse_pod(&e.pod, &no_volumes, None) else {
                tracing::warn!(pod = ?e.pod.metadata.name, "recently evicted pod cannot be parsed; ignored");
                continue;
            };
            if self.snap.pod_by_uid(&info.uid).is_some() {
                continue; // still there (terminating): already accounted for
            }
            if let Some(o) = &info.owner
                && let Some(owner) = self.snap.owner(&o.kind, &info.namespace, &o.name)
            {
                let key = (o.kind.clone(), info.namespace.clone(), o.name.clone());
                let current = live.get(&key).copied().unwrap_or(0);
                if current >= owner.desired {
                    continue; // replaced
                }
                *live.entry(key).or_insert(0) += 1;
            }
            let source = info.node_name.take();
            let pod = self.snap.add_pod(info, req);
            match self.find_place(pod, hints.of(source.as_deref())) {
                Some(d) => self.snap.place(pod, Some(d)),
                None => {
                    tracing::info!(pod = %self.snap.pod(pod).key(), "recently evicted pod fits nowhere");
                    pending = true;
                }
            }
        }
        pending
    }

    /// Moves each of `pods` off node `name`, stopping at the first that fits nowhere. Capacity
    /// only: what PodDisruptionBudgets allow paces the drains, it does not make nodes needed.
    fn move_pods(
        &mut self,
        name: &str,
        pods: &[PodId],
        hints: &DestinationHints,
        moves: &mut Vec<(PodId, NodeId)>,
    ) -> Result<(), Blocked> {
        let hints = hints.of(Some(name));
        for &pod in pods {
            match self.find_place(pod, hints) {
                Some(d) => {
                    self.snap.place(pod, Some(d));
                    moves.push((pod, d));
                }
                None => return Err((UnremovableReason::NoPlaceToMovePods, pod, None)),
            }
        }
        Ok(())
    }

    /// Drains `node` in a nested fork: kept when every pod found a place, reverted (and the
    /// node a destination again) when one did not.
    fn simulate_drain(
        &mut self,
        node: NodeId,
        name: &str,
        pods: &[PodId],
        hints: &DestinationHints,
    ) -> Result<Vec<(PodId, NodeId)>, Refusal> {
        let was_not_dest = self.not_dest[node as usize];
        self.not_dest[node as usize] = true;
        self.snap.fork();
        self.fits.fork();
        self.cursor_undo = Some(Vec::new());
        let mut moves = Vec::with_capacity(pods.len());
        let result = self.move_pods(name, pods, hints, &mut moves);
        let undo = self.cursor_undo.take().unwrap_or_default();
        match result {
            Ok(()) => {
                self.snap.commit();
                self.fits.committed();
                Ok(moves)
            }
            Err((reason, pod, pod_reason)) => {
                self.snap.revert();
                self.not_dest[node as usize] = was_not_dest;
                // Room is back on the node and where its pods had been placed, nowhere else.
                let position = &self.position;
                let freed: Vec<usize> = std::iter::once(node)
                    .chain(moves.iter().map(|&(_, d)| d))
                    .filter_map(|n| position[n as usize])
                    .collect();
                let len = self.dest_order.len();
                for u in undo {
                    self.cursor.insert(u.class, u.reset(&freed, len));
                }
                self.fits.reverted(freed.iter().copied());
                Err(Refusal::simulated(
                    reason,
                    self.snap.pod(pod).key(),
                    pod_reason,
                ))
            }
        }
    }
}

/// Orders a node's pods for its drain simulation largest first: most accelerators, then most
/// cpu, then most memory; equal pods keep their order (by name). Big pods placed first find the
/// holes only they fit, before small ones split them (a 2-GPU pod needs two free GPUs on one
/// node; 1-GPU pods placed first may take one of each pair).
fn largest_first(snap: &ClusterSnapshot, pods: &mut [PodId], acc: &Accelerators) {
    let size = |p: PodId| {
        let r = &snap.class_of(p).req.requests;
        let gpus: i64 = acc.resources.iter().map(|a| r.extended(a)).sum();
        (gpus, r.cpu_milli, r.memory)
    };
    pods.sort_by_key(|&p| std::cmp::Reverse(size(p)));
}

/// Why the greedy step keeps a node: the reason, the pod to blame, and whether its drain
/// simulation failed (the node then joins the non-candidate set).
struct Refusal {
    reason: UnremovableReason,
    pod: Option<String>,
    pod_reason: Option<BlockingPodReason>,
    /// What else names the cause (the volume that pins the pod).
    detail: Option<String>,
    simulated: bool,
}

impl Refusal {
    fn limit(reason: UnremovableReason) -> Self {
        Refusal {
            reason,
            pod: None,
            pod_reason: None,
            detail: None,
            simulated: false,
        }
    }

    fn simulated(
        reason: UnremovableReason,
        pod: String,
        pod_reason: Option<BlockingPodReason>,
    ) -> Self {
        Refusal {
            reason,
            pod: Some(pod),
            pod_reason,
            detail: None,
            simulated: true,
        }
    }

    fn with_detail(mut self, detail: Option<String>) -> Self {
        self.detail = detail;
        self
    }
}

/// What the greedy step reads: the loop's node facts, the config, the last loop's state and
/// the time.
pub(super) struct Inputs<'c> {
    pub facts: &'c NodeFacts,
    pub cfg: &'c PlannerConfig,
    pub state: &'c PlannerState,
    pub now: Timestamp,
}

/// A node whose drain simulation succeeded: whether it had no pods to move, and the moves.
struct Drained {
    empty: bool,
    moves: Vec<(PodId, NodeId)>,
}

/// Step 4, the greedy simulation: the candidate set grown over the eligible nodes in order,
/// and what kept the others.
pub(super) struct Greedy {
    pub candidates: Vec<Candidate>,
    pub unremovable: Vec<Unremovable>,
    pub non_candidates: BTreeMap<String, NonCandidate>,
    pub evaluated: usize,
    pub timed_out: bool,
    used_as_dest: Vec<bool>,
    candidates_per_group: BTreeMap<Option<String>, i64>,
    /// Where each planned move is: candidate index and move index, by the pod moved.
    planned: HashMap<PodId, (usize, usize), NameHasher>,
    /// Nodes kept before any simulation for the replacements they received: the look-ahead
    /// does not try them, since those pods were moved already.
    received: BTreeSet<String>,
    /// Destinations of planned moves whose drain was tried in the pass and failed: the
    /// look-ahead does not try them again.
    tried_as_destination: BTreeSet<String>,
}

/// Most look-ahead rounds per loop ([`Greedy::look_ahead`]).
pub(super) const LOOKAHEAD_ROUNDS: usize = 3;

impl Greedy {
    pub fn new(node_count: usize, unremovable: Vec<Unremovable>) -> Self {
        let received = unremovable
            .iter()
            .filter(|u| u.reason == UnremovableReason::DestinationOfMovedPods)
            .map(|u| u.node.clone())
            .collect();
        Greedy {
            received,
            tried_as_destination: BTreeSet::new(),
            candidates: Vec::new(),
            unremovable,
            non_candidates: BTreeMap::new(),
            evaluated: 0,
            timed_out: false,
            used_as_dest: vec![false; node_count],
            candidates_per_group: BTreeMap::new(),
            planned: HashMap::default(),
        }
    }

    /// Evaluates `eligible` in order until the time bound (after `min_nodes_evaluated`); the
    /// rest are `NotEvaluated`.
    pub fn run(
        &mut self,
        sim: &mut Sim,
        eligible: &[NodeId],
        inputs: &Inputs,
        watch: &mut dyn Stopwatch,
    ) {
        let cfg = inputs.cfg;
        for (i, &node) in eligible.iter().enumerate() {
            if self.evaluated >= cfg.min_nodes_evaluated
                && watch.elapsed() >= cfg.simulation_timeout
            {
                self.timed_out = true;
                for &rest in &eligible[i..] {
                    self.unremovable.push(Unremovable::node(
                        sim.snap,
                        rest,
                        UnremovableReason::NotEvaluated,
                    ));
                }
                break;
            }
            self.evaluated += 1;
            let name = sim.snap.node(node).name.clone();
            // Priced, removals are tried dearest first, and a node the pods of a dearer one were
            // planned onto is tried in its turn, as the look-ahead tries it, not after the
            // cheaper nodes have taken the room its pods would need.
            if self.used_as_dest[node as usize] && inputs.facts.priced {
                if self.drain_destination(sim, node, &name, inputs).is_err() {
                    self.tried_as_destination.insert(name.clone());
                    let r = Refusal::limit(UnremovableReason::DestinationOfMovedPods);
                    self.refuse(name, r, inputs.now);
                }
                continue;
            }
            match self.evaluate(sim, node, &name, inputs) {
                Ok(drained) => self.accept(sim, node, name, inputs, drained),
                Err(r) => self.refuse(name, r, inputs.now),
            }
        }
    }

    /// Drains `node`, which pods of the candidates were planned onto, as the next loop would
    /// once they had landed: when it can go, it joins the candidates, and the pods planned onto
    /// it are planned straight to where its drain puts them, so that nothing is moved twice.
    fn drain_destination(
        &mut self,
        sim: &mut Sim,
        node: NodeId,
        name: &str,
        inputs: &Inputs,
    ) -> Result<(), Refusal> {
        // The next loop judges the node with the pods planned onto it.
        let load = inputs.facts.load(sim.snap, node, inputs.cfg);
        if !load.underutilized() {
            return Err(Refusal::limit(load.busy_reason()));
        }
        let was = std::mem::replace(&mut self.used_as_dest[node as usize], false);
        match self.evaluate(sim, node, name, inputs) {
            Ok(drained) => {
                let (own, arrived): (Vec<_>, Vec<_>) = drained
                    .moves
                    .into_iter()
                    .partition(|(pod, _)| !self.planned.contains_key(pod));
                for (pod, to) in arrived {
                    self.used_as_dest[to as usize] = true;
                    self.replan(sim, pod, to);
                }
                let drained = Drained {
                    empty: own.is_empty(),
                    moves: own,
                };
                self.accept(sim, node, name.to_string(), inputs, drained);
                Ok(())
            }
            Err(r) => {
                self.used_as_dest[node as usize] = was;
                Err(r)
            }
        }
    }

    /// Look-ahead, so that a plan is final: a node refused only because the candidates' pods
    /// were placed on it is tried again as the next loop would try it once those pods had
    /// landed. When it can go then, it goes now: it joins the candidates, and the pods planned
    /// onto it are planned straight to where its drain puts them, so that nothing is moved
    /// twice and the final node count is reached in one wave. Repeats while a round adds
    /// candidates (at most [`LOOKAHEAD_ROUNDS`]), within the simulation time bound. A node that
    /// still cannot go keeps its refusal (a hypothetical loop leaves no memory).
    pub fn look_ahead(&mut self, sim: &mut Sim, inputs: &Inputs, watch: &mut dyn Stopwatch) {
        let cfg = inputs.cfg;
        // Nodes whose drain did not fit in a round (or in the pass): more pods placed does not
        // make them fit.
        let mut failed: BTreeSet<String> = self
            .received
            .union(&self.tried_as_destination)
            .cloned()
            .collect();
        for _ in 0..LOOKAHEAD_ROUNDS {
            let (retry, keep): (Vec<Unremovable>, Vec<Unremovable>) =
                std::mem::take(&mut self.unremovable)
                    .into_iter()
                    .partition(|u| {
                        u.reason == UnremovableReason::DestinationOfMovedPods
                            && !failed.contains(&u.node)
                    });
            self.unremovable = keep;
            if retry.is_empty() {
                return;
            }
            // The pods planned so far have landed: their destinations are not destinations of
            // this round's moves.
            self.used_as_dest.iter_mut().for_each(|d| *d = false);
            let mut added = false;
            for u in retry {
                let Some(node) = sim.snap.node_id(&u.node) else {
                    self.unremovable.push(u);
                    continue;
                };
                if watch.elapsed() >= cfg.simulation_timeout {
                    self.unremovable.push(u);
                    continue;
                }
                // Now a destination of this round's moves: tried again next round.
                if self.used_as_dest[node as usize] {
                    self.unremovable.push(u);
                    continue;
                }
                if inputs.facts.load(sim.snap, node, cfg).underutilized() {
                    self.evaluated += 1;
                }
                let name = u.node.clone();
                match self.drain_destination(sim, node, &name, inputs) {
                    Ok(()) => added = true,
                    Err(_) => {
                        failed.insert(u.node.clone());
                        self.unremovable.push(u);
                    }
                }
            }
            if !added {
                return;
            }
        }
    }

    /// A pod planned onto a node that is now a candidate too goes straight to `to`.
    fn replan(&mut self, sim: &mut Sim, pod: PodId, to: NodeId) {
        let Some(&(c, m)) = self.planned.get(&pod) else {
            return;
        };
        let source = self.candidates[c].node.clone();
        let (_, dest) = sim.hint(&source, pod, to);
        self.candidates[c].moves[m].to = dest;
    }

    /// Whether `node` can go with the candidates so far: group minimum, not a destination,
    /// drainable pods, and every pod placed elsewhere.
    fn evaluate(
        &self,
        sim: &mut Sim,
        node: NodeId,
        name: &str,
        inputs: &Inputs,
    ) -> Result<Drained, Refusal> {
        let (facts, cfg) = (inputs.facts, inputs.cfg);
        let group = facts.group_of(node);
        let size = facts.group_sizes.get(&group).copied().unwrap_or(0);
        let taken = facts.deleting_per_group.get(&group).copied().unwrap_or(0)
            + self.candidates_per_group.get(&group).copied().unwrap_or(0);
        if size - taken - 1 < facts.group_min(&group, cfg) {
            return Err(Refusal::limit(UnremovableReason::NodeGroupMinSizeReached));
        }
        if self.used_as_dest[node as usize] {
            return Err(Refusal::limit(UnremovableReason::DestinationOfMovedPods));
        }
        let mut pods =
            pods_to_move(sim.snap, node, &cfg.rules, &mut sim.pdbs).map_err(|(pod, r)| {
                Refusal::simulated(
                    UnremovableReason::BlockedByPod,
                    sim.snap.pod(pod).key(),
                    Some(r),
                )
                .with_detail(block_detail(sim.snap, pod, r))
            })?;
        largest_first(sim.snap, &mut pods, &cfg.accelerators);
        let moves = sim.simulate_drain(node, name, &pods, &inputs.state.hints)?;
        Ok(Drained {
            empty: pods.is_empty(),
            moves,
        })
    }

    /// `node` joins the candidate set (since it first entered it); its destinations can no
    /// longer be candidates.
    fn accept(&mut self, sim: &mut Sim, node: NodeId, name: String, inputs: &Inputs, d: Drained) {
        let group = inputs.facts.group_of(node);
        *self.candidates_per_group.entry(group.clone()).or_insert(0) += 1;
        let mut candidate = Candidate {
            since: inputs
                .state
                .candidates
                .get(&name)
                .copied()
                .unwrap_or(inputs.now),
            empty: d.empty,
            ready: sim.snap.node(node).ready,
            group_min: inputs.facts.group_min(&group, inputs.cfg),
            group,
            moves: Vec::with_capacity(d.moves.len()),
            hourly_cost: inputs.facts.cost[node as usize],
            node: name,
        };
        if !d.moves.is_empty() && !sim.new_hints.contains_key(&candidate.node) {
            let hints = HashMap::with_capacity_and_hasher(d.moves.len(), NameHasher::default());
            sim.new_hints.insert(candidate.node.clone(), hints);
        }
        let index = self.candidates.len();
        for (pod, to) in d.moves {
            self.used_as_dest[to as usize] = true;
            let (uid, to) = sim.hint(&candidate.node, pod, to);
            self.planned.insert(pod, (index, candidate.moves.len()));
            candidate.moves.push(Move {
                pod: sim.snap.pod(pod).shared_key.clone(),
                uid,
                to,
            });
        }
        self.candidates.push(candidate);
    }

    /// `name` stays: recorded as unremovable (and as a non-candidate when its drain failed).
    fn refuse(&mut self, name: String, r: Refusal, now: Timestamp) {
        if r.simulated {
            self.non_candidates.insert(
                name.clone(),
                NonCandidate {
                    at: now,
                    reason: r.reason,
                },
            );
        }
        self.unremovable.push(Unremovable {
            node: name,
            reason: r.reason,
            pod: r.pod,
            pod_reason: r.pod_reason,
            detail: r.detail,
        });
    }
}
