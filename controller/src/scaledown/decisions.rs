//! What one planner loop decided: the candidate set with each pod's planned destination, the
//! nodes that stay with their reasons, and the figures of the simulation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ebb_api::reasons::{BlockingPodReason, UnremovableReason};
use jiff::Timestamp;

use crate::cluster::{ClusterSnapshot, NodeId};

/// A pod move in the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// `namespace/name`, shared with the cluster model.
    pub pod: Arc<str>,
    /// Shared with the planner's destination hints (written for every move of every loop).
    pub uid: Arc<str>,
    /// Destination node, shared likewise.
    pub to: Arc<str>,
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
    /// Its hourly cost, when known.
    pub hourly_cost: Option<f64>,
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
    /// Nodes being deleted (tainted `to-be-deleted`, or drained by the actuator) when it planned.
    pub deleting: BTreeSet<String>,
    /// Governed nodes (selected by the policy).
    pub governed: usize,
    /// Governed nodes per node group.
    pub group_sizes: BTreeMap<Option<String>, i64>,
    pub simulation: SimulationStats,
    /// Hourly cost removed and kept, when some governed node has a known price.
    pub cost: Option<super::pricing::CostSummary>,
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
