//! Outcome of a terminated pod: classifies why it ended (from pod status and the node agent's
//! records) and what that means for the node's history of the role.

use crate::cluster::CachedPod;
use jiff::{SignedDuration, Timestamp};

/// Why a pod of a role ended. Appears verbatim in events and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TerminationClass {
    /// Exited 0: a release.
    Completed,
    /// Deleted by its owner (scale-in, rollout): a release.
    DeletedByOwner,
    /// OOMKilled: the pod's limits were exceeded; not the node's fault.
    LimitsExceeded,
    /// Evicted or preempted (`DisruptionTarget` condition): not a failure.
    Preempted,
    /// The node was lost or NotReady: a node failure.
    NodeLost,
    /// Failed before running `shortLivedThreshold`: a start failure; the node is not requeued.
    StartFailure,
    /// Any other non-zero exit: a failure.
    ApplicationFailure,
}

impl TerminationClass {
    pub const ALL: &'static [TerminationClass] = &[
        Self::Completed,
        Self::DeletedByOwner,
        Self::LimitsExceeded,
        Self::Preempted,
        Self::NodeLost,
        Self::StartFailure,
        Self::ApplicationFailure,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Completed => "Completed",
            Self::DeletedByOwner => "DeletedByOwner",
            Self::LimitsExceeded => "LimitsExceeded",
            Self::Preempted => "Preempted",
            Self::NodeLost => "NodeLost",
            Self::StartFailure => "StartFailure",
            Self::ApplicationFailure => "ApplicationFailure",
        }
    }

    /// True when it counts against the node in the failure window.
    pub fn is_node_failure(&self) -> bool {
        matches!(
            self,
            Self::NodeLost | Self::StartFailure | Self::ApplicationFailure
        )
    }
}

impl std::fmt::Display for TerminationClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the node goes in the role's available list after the pod ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// At the head, with `lastUsed = now` (a long-lived pod ended: its data is warm).
    Head,
    /// At its place by its previous `lastUsed` (a short-lived release warmed nothing).
    Sorted,
    /// Not put back (start failure: the node is not trusted until the failure window resets).
    Dropped,
    /// Other pods of the role still use the node: it is not available yet.
    StillBusy,
}

/// What is known about a pod's end, as plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Termination {
    /// Exit code of the failing container (the first non-zero), 0 when all exited 0, `None`
    /// when no container reported an exit.
    pub exit_code: Option<i32>,
    /// A container was OOMKilled.
    pub oom_killed: bool,
    /// The pod has a `DisruptionTarget` condition (eviction, preemption).
    pub disruption_target: bool,
    /// The node was lost or NotReady when the pod ended, or the node agent recorded it as lost.
    pub node_lost: bool,
    /// The pod was deleted (by its owner, a user, a force delete) before it ended on its own,
    /// while its node was up.
    pub deleted_by_owner: bool,
    /// When its containers started running, if known.
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
}

impl Termination {
    /// Read a terminated pod's status. `node_lost` comes from the Node's readiness or the node
    /// agent's records, `deleted_by_owner` from whether the pod went without a terminal phase.
    pub fn from_pod(pod: &CachedPod, node_lost: bool, deleted_by_owner: bool) -> Self {
        let status = pod.status.as_ref();
        let terminated: Vec<_> = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref().and_then(|s| s.terminated.as_ref()))
            .collect();
        // A failed init container ends the pod before its containers ever run.
        let failed_init: Vec<_> = status
            .and_then(|s| s.init_container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref().and_then(|s| s.terminated.as_ref()))
            .filter(|t| t.exit_code != 0)
            .collect();
        let exit_code = if terminated.is_empty() && failed_init.is_empty() {
            None
        } else {
            Some(
                failed_init
                    .iter()
                    .chain(terminated.iter())
                    .map(|t| t.exit_code)
                    .find(|c| *c != 0)
                    .unwrap_or(0),
            )
        };
        let disruption_target = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            || status.and_then(|s| s.reason.as_deref()) == Some("Evicted");
        Self {
            exit_code,
            oom_killed: failed_init
                .iter()
                .chain(terminated.iter())
                .any(|t| t.reason.as_deref() == Some("OOMKilled")),
            disruption_target,
            node_lost: node_lost || status.and_then(|s| s.reason.as_deref()) == Some("NodeLost"),
            deleted_by_owner,
            started_at: terminated
                .iter()
                .filter_map(|t| t.started_at.as_ref().map(|s| s.0))
                .min(),
            finished_at: terminated
                .iter()
                .filter_map(|t| t.finished_at.as_ref().map(|s| s.0))
                .max(),
        }
    }

    /// How long the pod ran, when both ends are known.
    pub fn ran_for(&self, started_at: Option<Timestamp>, now: Timestamp) -> Option<SignedDuration> {
        let start = self.started_at.or(started_at)?;
        Some(self.finished_at.unwrap_or(now).duration_since(start))
    }
}

/// True when the pod's deletion was requested before its containers ended: it was stopped by
/// whoever deleted it (its exit, often 137 or 143 and a `Failed` phase since Kubernetes 1.27,
/// says nothing about the node). A pod that ended on its own and was deleted afterwards (a Job's
/// clean-up, garbage collection) is not. Without a deletion timestamp: false.
pub fn deleted_before_it_ended(pod: &CachedPod) -> bool {
    let Some(deleted) = pod.metadata.deletion_timestamp.as_ref().map(|t| t.0) else {
        return false;
    };
    // The request came the grace period before the deletion timestamp.
    let grace = pod
        .metadata
        .deletion_grace_period_seconds
        .unwrap_or(0)
        .max(0);
    let requested = deleted
        .checked_sub(SignedDuration::from_secs(grace))
        .unwrap_or(deleted);
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0)
        .max();
    finished.is_none_or(|f| f >= requested)
}

/// Classify a termination. `running_since` is when the history saw the pod running (used when
/// the termination does not say), `short_lived` the spec's `shortLivedThreshold`.
/// Order matters: disruption, then OOM, then node loss, then owner deletion, then exit codes.
pub fn classify(
    t: &Termination,
    running_since: Option<Timestamp>,
    short_lived: SignedDuration,
    now: Timestamp,
) -> TerminationClass {
    if t.disruption_target {
        return TerminationClass::Preempted;
    }
    if t.oom_killed {
        return TerminationClass::LimitsExceeded;
    }
    if t.node_lost {
        return TerminationClass::NodeLost;
    }
    if t.deleted_by_owner {
        return TerminationClass::DeletedByOwner;
    }
    match t.exit_code {
        Some(0) => TerminationClass::Completed,
        // No exit was recorded and nobody deleted it: the pod was lost with its node.
        None => TerminationClass::NodeLost,
        Some(_) => match t.ran_for(running_since, now) {
            Some(ran) if ran >= short_lived => TerminationClass::ApplicationFailure,
            // Never seen running, or ran shorter than the threshold.
            _ => TerminationClass::StartFailure,
        },
    }
}

/// True when a pod that ran this long counts as long-lived (it warmed its node's data).
pub fn long_lived(ran: Option<SignedDuration>, short_lived: SignedDuration) -> bool {
    ran.is_some_and(|r| r >= short_lived)
}
