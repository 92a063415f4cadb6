//! The parallel-drain planner: each loop re-verifies nodes being deleted, re-injects recently
//! evicted pods, then greedily grows the candidate set (nodes removable all at once) on a forked
//! snapshot. Pure: no API calls, time comes from the caller (`now` and a [`Stopwatch`]).

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::reasons::UnremovableReason;
use jiff::Timestamp;

use super::budgets::{self, InFlight, Removable, Selection};
use super::config::PlannerConfig;
use super::decisions::{Plan, SimulationStats, Unremovable};
use super::drainability::{PodDisposition, classify};
use super::eligibility::{self, check_node};
use super::memory::PlannerState;
use super::node_facts::{NodeFacts, by_util, not_destinations};
use super::pdb::{PdbTracker, PdbView};
use super::pricing::{CostSummary, by_saving, saving_per_pod};
use super::removal_method;
use super::simulation::{Greedy, Inputs, Sim};
use super::stopwatch::Stopwatch;
use crate::cluster::{ClusterSnapshot, NodeId, PredicateChecker};

/// The nodes being deleted: tainted `ebb.dev/to-be-deleted` (by this controller or one before
/// it), or drained by the actuator now (`in_flight`), among the nodes of `snap`.
pub fn deleting(snap: &ClusterSnapshot, in_flight: &BTreeSet<String>) -> BTreeSet<String> {
    (0..snap.node_count() as NodeId)
        .map(|n| snap.node(n))
        .filter(|n| n.has_taint(ebb_api::names::TAINT_TO_BE_DELETED) || in_flight.contains(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// Step 3: the governed nodes that may be removed (node checks, then whether the policy's
/// removal method applies), less those with pods arriving or replacements ebb just moved there.
/// The others are recorded as unremovable (all of them while pods are pending). Order: without
/// prices, previous candidates first, then least utilised; with prices, the dearest first, then
/// the largest hourly saving per pod to evict, then as without.
fn eligible_nodes(
    snap: &ClusterSnapshot,
    facts: &NodeFacts,
    cfg: &PlannerConfig,
    deleted: &BTreeSet<String>,
    pending: bool,
    state: &PlannerState,
    now: Timestamp,
) -> (Vec<NodeId>, Vec<Unremovable>) {
    let previous = &state.candidates;
    let evicted = eligibility::RecentlyEvicted::new(&state.recent_evictions);
    let mut eligible: Vec<NodeId> = Vec::new();
    let mut unremovable = Vec::new();
    for &n in &facts.governed {
        // On the snapshot as re-placed (pods of nodes being deleted, recent evictions).
        let load = facts.load(snap, n, cfg);
        let check = check_node(snap, n, deleted, load).and_then(|()| match cfg.removal {
            Some(method) => removal_method::target(method, snap.node(n).machine.as_ref()).map(drop),
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
                // Replacements are looked up only when no pod is arriving.
                let held = if !arriving.is_empty() {
                    let detail = eligibility::arriving_message(&arriving);
                    Some((UnremovableReason::PodsArriving, detail))
                } else {
                    let since = previous.get(&snap.node(n).name).copied();
                    let received = evicted.received(snap, n, since);
                    (!received.is_empty()).then(|| {
                        let detail = eligibility::received_message(&received);
                        (UnremovableReason::DestinationOfMovedPods, detail)
                    })
                };
                match held {
                    Some((reason, detail)) => {
                        let mut u = Unremovable::node(snap, n, reason);
                        u.detail = Some(detail);
                        unremovable.push(u);
                    }
                    None => eligible.push(n),
                }
            }
            Err(reason) => unremovable.push(Unremovable::node(snap, n, reason)),
        }
    }
    // Whether each node was no candidate last loop, looked up once (not per comparison).
    let mut new_candidate = vec![false; snap.node_count()];
    for &n in &eligible {
        new_candidate[n as usize] = !previous.contains_key(&snap.node(n).name);
    }
    let was = |n: &NodeId| new_candidate[*n as usize];
    if facts.priced {
        let saving: BTreeMap<NodeId, Option<f64>> = eligible
            .iter()
            .map(|&n| {
                (
                    n,
                    saving_per_pod(facts.cost[n as usize], pods_to_evict(snap, n)),
                )
            })
            .collect();
        // Dearest first: when two nodes compete for the same room, the one whose removal saves
        // more per hour wins it (a cost-first packing); then more per evicted pod.
        let cost = |n: &NodeId| facts.cost[*n as usize];
        eligible.sort_by(|a, b| {
            by_saving(cost(a), cost(b))
                .then_with(|| by_saving(saving[a], saving[b]))
                .then_with(|| was(a).cmp(&was(b)))
                .then_with(|| by_util(snap, &facts.util, *a, *b))
        });
    } else {
        eligible.sort_by(|a, b| {
            was(a)
                .cmp(&was(b))
                .then_with(|| by_util(snap, &facts.util, *a, *b))
        });
    }
    (eligible, unremovable)
}

/// Pods a drain of `node` would evict, as far as known before simulating: all but DaemonSet,
/// mirror, finished and terminating pods.
fn pods_to_evict(snap: &ClusterSnapshot, node: NodeId) -> usize {
    snap.pods_on(node)
        .iter()
        .map(|p| snap.pod(*p))
        .filter(|p| !p.mirror && !p.is_daemonset() && !p.terminal && !p.terminating)
        .count()
}

/// Hourly cost of the candidate set and of the governed nodes that stay (not candidates, not
/// being deleted), or `None` when no governed node has a known price (nor an unreadable one).
fn cost_summary(
    snap: &ClusterSnapshot,
    facts: &NodeFacts,
    candidates: &[super::Candidate],
    deleted: &BTreeSet<String>,
) -> Option<CostSummary> {
    if !facts.priced {
        return None;
    }
    let removed: BTreeSet<&str> = candidates.iter().map(|c| c.node.as_str()).collect();
    let mut sum = CostSummary {
        invalid_annotations: facts.invalid_cost.clone(),
        ..CostSummary::default()
    };
    for &n in &facts.governed {
        let name = snap.node(n).name.as_str();
        match facts.cost[n as usize] {
            None => sum.unpriced += 1,
            Some(c) if removed.contains(name) => sum.removed_per_hour += c,
            Some(_) if eligibility::being_deleted(snap, n, deleted) => {}
            Some(c) => sum.kept_per_hour += c,
        }
    }
    Some(sum)
}

/// One planner loop (`UpdateUnneededNodes`). The snapshot is forked and left exactly as it was;
/// `checker` must belong to this snapshot; `in_flight` names the nodes the actuator is draining
/// (with the `to-be-deleted` taints, the deleted set). Updates `state` and returns the decisions.
pub fn plan(
    snap: &mut ClusterSnapshot,
    checker: &mut PredicateChecker,
    cfg: &PlannerConfig,
    now: Timestamp,
    state: &mut PlannerState,
    in_flight: &BTreeSet<String>,
    watch: &mut dyn Stopwatch,
) -> Plan {
    let deleted = deleting(snap, in_flight);
    let facts = NodeFacts::gather(snap, cfg, &deleted);
    let dest_order = facts.destination_order(snap);
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

    let (eligible, unremovable) =
        eligible_nodes(sim.snap, &facts, cfg, &deleted, pending, state, now);
    let mut greedy = Greedy::new(sim.snap.node_count(), unremovable);
    let inputs = Inputs {
        facts: &facts,
        cfg,
        state,
        now,
    };
    greedy.run(&mut sim, &eligible, &inputs, watch);
    greedy.look_ahead(&mut sim, &inputs, watch);

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
    let cost = cost_summary(snap, &facts, &greedy.candidates, &deleted);
    let out = Plan {
        cost,
        governed: facts.governed.len(),
        group_sizes: facts.group_sizes,
        pending_reschedule: pending,
        simulation,
        candidates: greedy.candidates,
        unremovable: greedy.unremovable,
        deleting: deleted,
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

/// StartDeletion: which candidates start now, given the deletions in flight (the deleted set:
/// a node with pods left to move counts as a drain, else as empty, until the API server has
/// accepted its deletion) and what the PodDisruptionBudgets allow beyond what those drains
/// still need.
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
    for name in &plan.deleting {
        let Some(n) = snap.node_id(name) else {
            continue;
        };
        let movable = snap
            .pods_on(n)
            .iter()
            .any(|p| classify(snap, *p, &cfg.rules, &mut classes) != PodDisposition::Stays);
        // Handed off: the API server accepted the Node's deletion and nothing is left to move;
        // its provider finishes it (Karpenter's termination, a cloud's finalizer). It leaves its
        // group as before, but no longer counts against the parallelism, as in Cluster
        // Autoscaler, whose count ends when the provider accepts the deletion.
        let handed_off = snap.node(n).deleting && !movable;
        if movable {
            in_flight.drains += 1;
        } else if !handed_off {
            in_flight.empty += 1;
        }
        in_flight.pdbs.take(&pdbs.needs(n, &cfg.rules));
        if cfg.node_selector.matches(&snap.node(n).labels) {
            *in_flight
                .per_group
                .entry(super::node_facts::group_key(snap, cfg, n))
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
            saving: saving_per_pod(c.hourly_cost, c.moves.len()),
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
