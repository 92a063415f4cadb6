//! PodDisruptionBudgets in the planner: which budgets cover a pod, how many disruptions each
//! allows now, and the pacing of drains by them (what each node needs, what may start).

use std::collections::{BTreeMap, HashSet};

use super::drainability::{DrainRules, PodDisposition, classify};
pub use super::pdb_coverage::PdbTracker;
use crate::cluster::{ClusterSnapshot, NodeId, PodId};

/// Disruptions a budget allows now: its status's allowance, lowered when the pods show fewer
/// healthy than the status counted (an eviction the status does not reflect yet). Never negative.
pub fn allowance(status_allowed: i64, desired_healthy: i64, healthy_now: i64) -> i64 {
    status_allowed.min(healthy_now - desired_healthy).max(0)
}

/// Disruptions a drain needs, per budget index.
pub type Needs = BTreeMap<usize, i64>;

/// The pacing of drains by PodDisruptionBudgets for one selection: what each budget allows now
/// and what is left of that once the drains in flight have their pods evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PdbPacing {
    /// `namespace/name` per budget index.
    pub names: Vec<String>,
    /// Disruptions each budget allows now.
    pub allowance: Vec<i64>,
    /// What is left for drains not started yet (may be negative: a drain in flight needs more
    /// than the budget allows now and waits for it).
    pub remaining: Vec<i64>,
    /// Budgets some drain in flight or started this selection still needs.
    pub claimed: Vec<bool>,
}

impl PdbPacing {
    /// A budget of `needs` that keeps it from starting now, if any. A drain starts when every
    /// budget it touches has room for all of its pods, or when it would be the only drain of
    /// that budget and the budget allows at least one disruption (its evictions then follow one
    /// another as the budget allows: a node holding more pods of a budget than it ever allows
    /// at once still drains).
    pub fn holds(&self, needs: &Needs) -> Option<usize> {
        needs.iter().find_map(|(&i, &n)| {
            let fits = n <= self.remaining[i];
            let alone = !self.claimed[i] && self.allowance[i] >= 1;
            (n > 0 && !fits && !alone).then_some(i)
        })
    }

    /// A drain with `needs` starts (or is in flight): its disruptions are taken.
    pub fn take(&mut self, needs: &Needs) {
        for (&i, &n) in needs {
            if n > 0 {
                self.remaining[i] -= n;
                self.claimed[i] = true;
            }
        }
    }
}

/// Whether evicting the pod now costs its budgets a disruption (see [`PdbView::healthy`]).
fn healthy_pod(snap: &ClusterSnapshot, evicted: &HashSet<&str>, pod: PodId) -> bool {
    let p = snap.pod(pod);
    p.ready
        && !p.terminating
        && !p.terminal
        && snap.node_of(pod).is_some()
        && (evicted.is_empty() || !evicted.contains(&*p.uid))
}

/// Reads a snapshot's budgets: what each allows now and what each node's drain needs.
pub struct PdbView<'a> {
    snap: &'a ClusterSnapshot,
    tracker: PdbTracker,
    evicted: HashSet<&'a str>,
}

impl<'a> PdbView<'a> {
    /// `evicted`: uids of pods ebb evicted recently; the snapshot may still show them healthy.
    pub fn new(snap: &'a ClusterSnapshot, evicted: impl IntoIterator<Item = &'a str>) -> Self {
        PdbView {
            snap,
            tracker: PdbTracker::new(snap),
            evicted: evicted.into_iter().collect(),
        }
    }

    /// Whether evicting the pod now costs its budgets a disruption: ready, not terminating, not
    /// evicted by us (budgets also skip the pods their status records as disrupted).
    fn healthy(&self, pod: PodId) -> bool {
        healthy_pod(self.snap, &self.evicted, pod)
    }

    /// The pacing before any drain is counted: each budget's allowance now.
    pub fn pacing(&mut self) -> PdbPacing {
        let pdbs = self.snap.pdbs();
        let mut healthy = vec![0i64; pdbs.len()];
        for pod in 0..self.snap.pod_count() as PodId {
            let snap = self.snap;
            let covering = self.tracker.covering(snap, pod);
            if covering.is_empty() || !healthy_pod(snap, &self.evicted, pod) {
                continue;
            }
            let name = &snap.pod(pod).name;
            for &i in covering {
                if !pdbs[i].disrupted.contains(name) {
                    healthy[i] += 1;
                }
            }
        }
        let allowance: Vec<i64> = pdbs
            .iter()
            .zip(&healthy)
            .map(|(p, h)| allowance(p.disruptions_allowed, p.desired_healthy, *h))
            .collect();
        PdbPacing {
            names: pdbs
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect(),
            remaining: allowance.clone(),
            claimed: vec![false; pdbs.len()],
            allowance,
        }
    }

    /// Disruptions draining `node` still needs: its pods that must leave and are healthy now
    /// (a pod no budget covers needs none, and is not classified).
    pub fn needs(&mut self, node: NodeId, rules: &DrainRules) -> Needs {
        let mut needs = Needs::new();
        for &pod in self.snap.pods_on(node) {
            if self.tracker.covering(self.snap, pod).is_empty()
                || !self.healthy(pod)
                || classify(self.snap, pod, rules, &mut self.tracker) == PodDisposition::Stays
            {
                continue;
            }
            let name = &self.snap.pod(pod).name;
            let pdbs = self.snap.pdbs();
            for &i in self.tracker.covering(self.snap, pod) {
                if !pdbs[i].disrupted.contains(name) {
                    *needs.entry(i).or_insert(0) += 1;
                }
            }
        }
        needs
    }
}
