//! Pure container bookkeeping: which store transitions a pod's status implies for a container,
//! what happened to a container whose pod is gone, and how an ending is classified.

use crate::livepod::{LiveContainer, LivePod};
use crate::store::{
    Completion, ContainerId, ContainerRecord, ContainerRequest, EXIT_CODE_LOST, KillRecord, Op,
    REASON_LOST, UnixMillis,
};

/// The PlacementHistory role a pod belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    pub placement_history: String,
    pub role: String,
}

/// Reason recorded for a container killed before it was launched.
pub const REASON_KILLED_BEFORE_LAUNCH: &str = "KilledBeforeLaunch";
/// Reason recorded for a launched container whose kill completed while the agent was down.
pub const REASON_KILLED: &str = "Killed";
/// Reason recorded when the pod had a `DisruptionTarget` condition (eviction, preemption).
pub const REASON_PREEMPTED: &str = "Preempted";
/// Kill reason written (ahead) when the agent sees its pod being deleted.
pub const KILL_POD_DELETED: &str = "PodDeleted";

/// The transitions that bring `existing` in line with what the pod status says now.
pub fn container_ops(
    id: &ContainerId,
    existing: Option<&ContainerRecord>,
    pod: &LivePod,
    membership: Option<&Membership>,
    now: UnixMillis,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let empty = ContainerRecord::default();
    let rec = existing.unwrap_or(&empty);
    if existing.is_none() {
        ops.push(requested_op(id, pod, membership, now));
    }
    ops.extend(restarts_op(id, rec, pod));
    ops.extend(status_ops(id, rec, pod));
    ops.extend(kill_op(id, rec, pod, &ops, now));
    ops
}

/// The first record of a container: what was asked for, and by which role.
fn requested_op(
    id: &ContainerId,
    pod: &LivePod,
    membership: Option<&Membership>,
    now: UnixMillis,
) -> Op {
    Op::ContainerRequested(
        id.clone(),
        ContainerRequest {
            namespace: pod.namespace.clone(),
            pod_name: pod.name.clone(),
            image: pod.images.get(&id.container).cloned().unwrap_or_default(),
            placement_history: membership.map(|m| m.placement_history.clone()),
            role: membership.map(|m| m.role.clone()),
            requested_at: now,
        },
    )
}

/// A changed restart count.
fn restarts_op(id: &ContainerId, rec: &ContainerRecord, pod: &LivePod) -> Option<Op> {
    let &restarts = pod.restart_counts.get(&id.container)?;
    (restarts != rec.restart_count).then(|| Op::ContainerRestarts(id.clone(), restarts))
}

/// Launches, relaunches and endings the container's status shows that are not recorded yet.
fn status_ops(id: &ContainerId, rec: &ContainerRecord, pod: &LivePod) -> Vec<Op> {
    match pod.containers.get(&id.container) {
        None | Some(LiveContainer::Waiting) => vec![],
        Some(LiveContainer::Running { started_at }) => {
            let restarted = rec.completed.is_some() && rec.launched_at != Some(*started_at);
            if restarted {
                vec![Op::ContainerRelaunched(id.clone(), *started_at)]
            } else if rec.launched_at.is_none() {
                vec![Op::ContainerLaunched(id.clone(), *started_at)]
            } else {
                vec![]
            }
        }
        Some(LiveContainer::Terminated {
            exit_code,
            reason,
            message,
            started_at,
            finished_at,
        }) => {
            let recorded = rec
                .completed
                .as_ref()
                .is_some_and(|c| c.finished_at == *finished_at);
            if recorded {
                return vec![];
            }
            let mut ops = Vec::new();
            if let Some(s) = started_at
                && rec.launched_at != Some(*s)
            {
                ops.push(Op::ContainerLaunched(id.clone(), *s));
            }
            let reason = if pod.disrupted && *exit_code != 0 {
                REASON_PREEMPTED.to_string()
            } else {
                reason.clone()
            };
            ops.push(Op::ContainerCompleted(
                id.clone(),
                Completion {
                    exit_code: *exit_code,
                    reason,
                    message: message.clone(),
                    finished_at: *finished_at,
                },
            ));
            ops
        }
    }
}

/// The kill written ahead when the pod is being deleted and the container has not ended (nor
/// ends with `ops`).
fn kill_op(
    id: &ContainerId,
    rec: &ContainerRecord,
    pod: &LivePod,
    ops: &[Op],
    now: UnixMillis,
) -> Option<Op> {
    let ended = ops.iter().any(|o| matches!(o, Op::ContainerCompleted(..)))
        || (rec.completed.is_some()
            && !ops.iter().any(|o| matches!(o, Op::ContainerRelaunched(..))));
    (pod.deleting && rec.killed.is_none() && !ended).then(|| {
        Op::ContainerKilled(
            id.clone(),
            KillRecord {
                at: now,
                reason: KILL_POD_DELETED.to_string(),
            },
        )
    })
}

/// What became of a container whose pod no longer exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoneOutcome {
    /// Its ending was already recorded.
    AlreadyDone,
    /// Launched, never completed, not killed: lost (exit code 154).
    Lost,
    /// Killed before it was ever launched: done without launch.
    KilledBeforeLaunch,
    /// Launched and killed: the kill finished.
    Killed,
    /// Never launched and never killed: nothing happened; the record is dropped.
    NeverLaunched,
}

/// Decides what a container of a vanished pod ended as, and the transitions to record it.
pub fn gone_ops(
    id: &ContainerId,
    rec: &ContainerRecord,
    now: UnixMillis,
) -> (GoneOutcome, Vec<Op>) {
    if rec.completed.is_some() {
        return (GoneOutcome::AlreadyDone, vec![]);
    }
    let complete = |code: i32, reason: &str, message: String| {
        Op::ContainerCompleted(
            id.clone(),
            Completion {
                exit_code: code,
                reason: reason.to_string(),
                message,
                finished_at: now,
            },
        )
    };
    match (rec.launched_at.is_some(), &rec.killed) {
        (true, None) => (
            GoneOutcome::Lost,
            vec![complete(
                EXIT_CODE_LOST,
                REASON_LOST,
                "container was running when its pod disappeared and left no exit status".into(),
            )],
        ),
        (true, Some(k)) => (
            GoneOutcome::Killed,
            vec![complete(
                137,
                REASON_KILLED,
                format!("killed: {}", k.reason),
            )],
        ),
        (false, Some(k)) => (
            GoneOutcome::KilledBeforeLaunch,
            vec![complete(
                0,
                REASON_KILLED_BEFORE_LAUNCH,
                format!("killed before launch: {}", k.reason),
            )],
        ),
        (false, None) => (
            GoneOutcome::NeverLaunched,
            vec![Op::ContainerRemoved(id.clone())],
        ),
    }
}

/// How a container ended, as PlacementHistory counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OutcomeClass {
    /// Exit 0, or stopped by its owner.
    Completed,
    /// Non-zero exit sooner than the short-lived threshold after start.
    StartFailure,
    /// Other non-zero exit.
    ApplicationFailure,
    /// OOMKilled.
    LimitsExceeded,
    /// Lost with the node or while the agent was down.
    NodeFailure,
    /// Evicted or preempted.
    Preempted,
}

/// Classifies a recorded ending.
pub fn classify(rec: &ContainerRecord, short_lived_ms: i64) -> Option<OutcomeClass> {
    let done = rec.completed.as_ref()?;
    Some(match done.reason.as_str() {
        REASON_LOST | "NodeLost" => OutcomeClass::NodeFailure,
        REASON_PREEMPTED | "Evicted" | "Preempting" => OutcomeClass::Preempted,
        "OOMKilled" => OutcomeClass::LimitsExceeded,
        REASON_KILLED | REASON_KILLED_BEFORE_LAUNCH => OutcomeClass::Completed,
        _ if done.exit_code == 0 => OutcomeClass::Completed,
        _ => match rec.launched_at {
            Some(start) if done.finished_at - start < short_lived_ms => OutcomeClass::StartFailure,
            _ => OutcomeClass::ApplicationFailure,
        },
    })
}

#[cfg(test)]
pub mod build {
    //! `ended("Error", 1, 0, 500)`: a requested container launched at 0 that exited 1 at 500.
    use super::*;

    pub fn ended(reason: &str, code: i32, start: UnixMillis, end: UnixMillis) -> ContainerRecord {
        ContainerRecord {
            requested: Some(ContainerRequest::default()),
            launched_at: Some(start),
            completed: Some(Completion {
                exit_code: code,
                reason: reason.into(),
                message: String::new(),
                finished_at: end,
            }),
            ..ContainerRecord::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::livepod::build::pod;

    fn id() -> ContainerId {
        ContainerId::new("uid-web-1", "main")
    }

    use crate::state::apply_container_ops as apply;

    #[test]
    fn status_changes_become_transitions_once() {
        let m = Membership {
            placement_history: "hbase".into(),
            role: "region".into(),
        };
        let mut rec = ContainerRecord::default();
        let ops = container_ops(&id(), None, &pod("web-1").waiting("main"), Some(&m), 5);
        assert!(
            matches!(&ops[..], [Op::ContainerRequested(_, r)] if r.role.as_deref() == Some("region") && r.requested_at == 5)
        );
        apply(&mut rec, &ops);

        let running = pod("web-1").running("main", 10);
        let ops = container_ops(&id(), Some(&rec), &running, Some(&m), 11);
        assert_eq!(ops, vec![Op::ContainerLaunched(id(), 10)]);
        apply(&mut rec, &ops);
        assert!(container_ops(&id(), Some(&rec), &running, Some(&m), 12).is_empty());

        let exited = pod("web-1").exited("main", 3, "Error", 10, 500);
        let ops = container_ops(&id(), Some(&rec), &exited, Some(&m), 501);
        assert!(
            matches!(&ops[..], [Op::ContainerCompleted(_, c)] if c.exit_code == 3 && c.finished_at == 500)
        );
        apply(&mut rec, &ops);
        assert!(container_ops(&id(), Some(&rec), &exited, Some(&m), 502).is_empty());

        // restarted in place: a new launch clears the previous ending
        let mut again = pod("web-1").running("main", 600);
        again.restart_counts.insert("main".into(), 1);
        let ops = container_ops(&id(), Some(&rec), &again, Some(&m), 601);
        assert_eq!(
            ops,
            vec![
                Op::ContainerRestarts(id(), 1),
                Op::ContainerRelaunched(id(), 600)
            ]
        );
    }

    #[test]
    fn deletion_is_written_ahead_as_a_kill_and_disruption_as_preemption() {
        let mut rec = ContainerRecord::default();
        apply(
            &mut rec,
            &container_ops(&id(), None, &pod("web-1").running("main", 1), None, 1),
        );
        let ops = container_ops(
            &id(),
            Some(&rec),
            &pod("web-1").running("main", 1).deleting(),
            None,
            9,
        );
        assert!(
            matches!(&ops[..], [Op::ContainerKilled(_, k)] if k.reason == KILL_POD_DELETED && k.at == 9)
        );
        apply(&mut rec, &ops);
        let evicted = pod("web-1").exited("main", 137, "Error", 1, 20).disrupted();
        let ops = container_ops(&id(), Some(&rec), &evicted, None, 21);
        assert!(matches!(&ops[..], [Op::ContainerCompleted(_, c)] if c.reason == REASON_PREEMPTED));
        apply(&mut rec, &ops);
        assert_eq!(classify(&rec, 60_000), Some(OutcomeClass::Preempted));
    }

    #[test]
    fn vanished_pods_end_as_lost_killed_or_never_launched() {
        let launched = ContainerRecord {
            requested: Some(ContainerRequest::default()),
            launched_at: Some(100),
            ..ContainerRecord::default()
        };
        let (outcome, ops) = gone_ops(&id(), &launched, 900);
        assert_eq!(outcome, GoneOutcome::Lost);
        let mut rec = launched.clone();
        apply(&mut rec, &ops);
        assert_eq!(rec.completed.as_ref().unwrap().exit_code, 154);
        assert_eq!(classify(&rec, 60_000), Some(OutcomeClass::NodeFailure));

        let kill = Some(KillRecord {
            at: 50,
            reason: "PodDeleted".into(),
        });
        let killed_early = ContainerRecord {
            requested: Some(ContainerRequest::default()),
            killed: kill.clone(),
            ..ContainerRecord::default()
        };
        let (outcome, ops) = gone_ops(&id(), &killed_early, 900);
        assert_eq!(outcome, GoneOutcome::KilledBeforeLaunch);
        let mut rec = killed_early.clone();
        apply(&mut rec, &ops);
        assert_eq!(rec.launched_at, None);
        assert_eq!(classify(&rec, 60_000), Some(OutcomeClass::Completed));

        let killed_late = ContainerRecord {
            killed: kill,
            ..launched.clone()
        };
        assert_eq!(gone_ops(&id(), &killed_late, 900).0, GoneOutcome::Killed);

        let requested_only = ContainerRecord {
            requested: Some(ContainerRequest::default()),
            ..ContainerRecord::default()
        };
        assert_eq!(
            gone_ops(&id(), &requested_only, 900),
            (GoneOutcome::NeverLaunched, vec![Op::ContainerRemoved(id())])
        );
        assert_eq!(
            gone_ops(&id(), &rec, 900),
            (GoneOutcome::AlreadyDone, vec![])
        );
    }

    #[test]
    fn classification_follows_reason_exit_code_and_lifetime() {
        let rec = build::ended;
        let short = 60_000;
        assert_eq!(
            classify(&rec("Completed", 0, 0, 10), short),
            Some(OutcomeClass::Completed)
        );
        assert_eq!(
            classify(&rec("Error", 1, 0, 59_999), short),
            Some(OutcomeClass::StartFailure)
        );
        assert_eq!(
            classify(&rec("Error", 1, 0, 60_000), short),
            Some(OutcomeClass::ApplicationFailure)
        );
        assert_eq!(
            classify(&rec("OOMKilled", 137, 0, 5), short),
            Some(OutcomeClass::LimitsExceeded)
        );
        assert_eq!(
            classify(&rec("Evicted", 137, 0, 5), short),
            Some(OutcomeClass::Preempted)
        );
        assert_eq!(classify(&ContainerRecord::default(), short), None);
    }
}
