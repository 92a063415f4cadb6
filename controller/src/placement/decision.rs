//! What the placement history tells the controller to do with a gated pod, and why. Every
//! decision carries a reason enum that appears verbatim in events and metric labels.

use std::collections::BTreeMap;

use jiff::Timestamp;

/// How a pod was (or will be) released from its gate; the metric label of placements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlacementOutcome {
    /// Released with required node affinity to a history node.
    Pinned,
    /// Kept behind the gate, waiting for its history node.
    Waiting,
    /// Released with relaxed constraints after waiting too long, or after a lost race.
    Relaxed,
    /// Released without pinning: policy `Anywhere` or no usable history node.
    Anywhere,
}

impl PlacementOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Pinned => "Pinned",
            Self::Waiting => "Waiting",
            Self::Relaxed => "Relaxed",
            Self::Anywhere => "Anywhere",
        }
    }
}

/// Why a decision was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlacementReason {
    /// The most recently used available history node takes the pod now.
    MostRecentNode,
    /// Among equally recent nodes, one with the role's resources already cached was chosen.
    WarmDataTieBreak,
    /// The history node is NotReady or cordoned; wait for it until the escalation deadline.
    NodeNotReady,
    /// The pod does not fit on the history node now; wait until the escalation deadline.
    DoesNotFit,
    /// The history node did not become usable before the escalation deadline.
    EscalationTimeout,
    /// The previous pod of this instance was pinned but never scheduled; it was deleted.
    PreviousAttemptLostRace,
    /// A pinned pod is still pending past its deadline: delete it so its owner re-creates it.
    PinnedPodStillPending,
    /// The role's policy is `Anywhere`.
    PolicyAnywhere,
    /// No history node is available, eligible and under the failure threshold.
    NoAvailableHistoryNode,
}

impl PlacementReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::MostRecentNode => "MostRecentNode",
            Self::WarmDataTieBreak => "WarmDataTieBreak",
            Self::NodeNotReady => "NodeNotReady",
            Self::DoesNotFit => "DoesNotFit",
            Self::EscalationTimeout => "EscalationTimeout",
            Self::PreviousAttemptLostRace => "PreviousAttemptLostRace",
            Self::PinnedPodStillPending => "PinnedPodStillPending",
            Self::PolicyAnywhere => "PolicyAnywhere",
            Self::NoAvailableHistoryNode => "NoAvailableHistoryNode",
        }
    }
}

impl std::fmt::Display for PlacementReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Scheduling constraints of a pod released without pinning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelaxedConstraints {
    /// The role's node labels: kept even when relaxed.
    pub node_selector: BTreeMap<String, String>,
    /// Nodes to keep the pod off (`NotIn`): over the failure threshold for the role, and for
    /// `AntiAffinity` nodes already running the role. Sorted.
    pub avoid_nodes: Vec<String>,
    /// Preferred node affinity toward history nodes, most recent first, weight 1..=100.
    pub prefer_nodes: Vec<(String, i32)>,
}

/// What to do with the gated pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Add required node affinity to `node` and remove the gate.
    Pin { node: String },
    /// Keep the gate; ask again later. `until` is the escalation deadline (`None`: `Strict`
    /// waits for its node forever).
    Wait {
        node: String,
        until: Option<Timestamp>,
    },
    /// Remove the gate with relaxed constraints.
    Relax(RelaxedConstraints),
    /// Remove the gate without pinning (the role's node labels are still applied).
    Anywhere(RelaxedConstraints),
}

/// A decision and its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub reason: PlacementReason,
}

impl Decision {
    pub fn outcome(&self) -> PlacementOutcome {
        match self.action {
            Action::Pin { .. } => PlacementOutcome::Pinned,
            Action::Wait { .. } => PlacementOutcome::Waiting,
            Action::Relax(_) => PlacementOutcome::Relaxed,
            Action::Anywhere(_) => PlacementOutcome::Anywhere,
        }
    }

    /// The node the pod is pinned to, if any.
    pub fn pinned_node(&self) -> Option<&str> {
        match &self.action {
            Action::Pin { node } => Some(node),
            _ => None,
        }
    }
}

/// A pinned pod still unscheduled past its deadline: the controller deletes it, and the next
/// pod of the same name is released relaxed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overdue {
    pub uid: String,
    pub pod_name: String,
    pub role: String,
    pub node: String,
    pub reason: PlacementReason,
}
