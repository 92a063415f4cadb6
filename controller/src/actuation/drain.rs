//! The drain state machine of one node (`Tainted → Evicting → WaitingForPods → Deleting`) and the
//! per-pod eviction retry rule. Pure: the runner feeds it what happened and does what it says.

use std::time::Duration;

use ebb_api::reasons::DrainPhase;
use ebb_api::scaledown::RemovalStatus;

use crate::metrics::{DrainResult, ScaleDownKind};

/// Why a drain was abandoned; the node is untainted and the reason recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiveUpReason {
    /// The re-check after tainting found the node no longer removable (the planner's reason).
    NoLongerRemovable(super::recheck::RecheckError),
    /// Pods landed on the node between the plan and the taint.
    PodsLanded(Vec<String>),
    /// Some pods could not be evicted within `maxPodEvictionTime` (PodDisruptionBudgets).
    EvictionTimeout { pods: Vec<String> },
    /// Evicted pods did not terminate within their (capped) grace period.
    PodsDidNotTerminate { pods: Vec<String> },
    /// The Kubernetes API failed in a way the drain cannot recover from.
    ApiError(String),
    /// The machine could not be handed off (its group is at its minimum, the Machine or
    /// NodeClaim names another node, ...); the node is untainted.
    RemovalFailed(String),
    /// The policy was deleted, or the controller is stopping.
    Cancelled,
}

impl GiveUpReason {
    /// Short machine-readable name, for events and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            GiveUpReason::NoLongerRemovable(_) => "NoLongerRemovable",
            GiveUpReason::PodsLanded(_) => "PodsLanded",
            GiveUpReason::EvictionTimeout { .. } => "EvictionTimeout",
            GiveUpReason::PodsDidNotTerminate { .. } => "PodsDidNotTerminate",
            GiveUpReason::ApiError(_) => "ApiError",
            GiveUpReason::RemovalFailed(_) => "RemovalFailed",
            GiveUpReason::Cancelled => "Cancelled",
        }
    }
}

impl std::fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn list(pods: &[String]) -> String {
            const SHOWN: usize = 5;
            let mut s = pods
                .iter()
                .take(SHOWN)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if pods.len() > SHOWN {
                s.push_str(&format!(" and {} more", pods.len() - SHOWN));
            }
            s
        }
        match self {
            GiveUpReason::NoLongerRemovable(why) => {
                write!(f, "the node is no longer removable: {why}")
            }
            GiveUpReason::PodsLanded(pods) => write!(
                f,
                "pods landed on the node after it was planned for removal: {}",
                list(pods)
            ),
            GiveUpReason::EvictionTimeout { pods } => write!(
                f,
                "evictions still refused at maxPodEvictionTime (check the PodDisruptionBudgets of {})",
                list(pods)
            ),
            GiveUpReason::PodsDidNotTerminate { pods } => write!(
                f,
                "evicted pods did not terminate within their grace period: {}",
                list(pods)
            ),
            GiveUpReason::ApiError(e) => write!(f, "Kubernetes API error: {e}"),
            GiveUpReason::RemovalFailed(e) => write!(f, "the machine was not removed: {e}"),
            GiveUpReason::Cancelled => {
                write!(f, "cancelled (policy deleted or controller stopping)")
            }
        }
    }
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every pod is gone and the node was deleted (`DrainAndDelete`) or cordoned and labelled
    /// drained (`Drain`).
    Removed,
    /// Abandoned: the node was untainted.
    GaveUp(GiveUpReason),
}

/// The `outcome` label of `ebb_drain_duration_seconds`.
impl From<&Outcome> for DrainResult {
    fn from(o: &Outcome) -> Self {
        match o {
            Outcome::Removed => DrainResult::removed,
            Outcome::GaveUp(_) => DrainResult::gave_up,
        }
    }
}

impl Outcome {
    /// `removed` or `gave_up`, as on the drain span and the drain-duration histogram.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Removed => "removed",
            Outcome::GaveUp(_) => "gave_up",
        }
    }
}

/// What happened, as reported by the runner.
#[derive(Clone, Debug, PartialEq)]
pub enum DrainEvent {
    /// The re-check after the taint passed.
    RecheckPassed,
    /// An eviction was refused by a PodDisruptionBudget (429); the runner retries it.
    EvictionBlocked,
    /// Every eviction was accepted (or the pod was already gone); `remaining` pods to wait for.
    EvictionsAccepted { remaining: i32 },
    /// Pods still on the node.
    PodsRemaining(i32),
    /// No pod that must go is left on the node.
    PodsGone,
    /// The node is being removed this way (method and object), in `Deleting`.
    Removing(RemovalStatus),
    /// The machine was handed off (Machine marked and its group scaled down, or NodeClaim
    /// deleted) at this time; waiting for it and the Node to go.
    HandedOff(jiff::Timestamp),
    /// The Machine or NodeClaim, or the Node, is still there past `removal.timeout`.
    RemovalStuck(String),
    /// The node was deleted (or is gone with its machine) or labelled drained.
    Finished,
    /// The drain cannot go on.
    GiveUp(GiveUpReason),
}

/// The state machine's answer to an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Go on, in this phase.
    Continue(DrainPhase),
    /// The drain is over.
    Done(Outcome),
}

/// An event that makes no sense in the current phase (a bug in the runner).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("drain of node {node}: event {event} is not valid in phase {phase}")]
pub struct InvalidTransition {
    pub node: String,
    pub phase: DrainPhase,
    pub event: String,
}

/// One node being drained.
#[derive(Clone, Debug, PartialEq)]
pub struct Drain {
    pub node: String,
    pub policy: String,
    pub kind: ScaleDownKind,
    pub phase: DrainPhase,
    /// When the `to-be-deleted` taint was set.
    pub started: jiff::Timestamp,
    pub pods_remaining: i32,
    pub evictions_blocked: i32,
    /// How the node is being removed, from `Deleting` on (`DrainAndDelete`).
    pub removal: Option<RemovalStatus>,
}

impl Drain {
    /// A drain that has just tainted its node.
    pub fn new(policy: &str, node: &str, kind: ScaleDownKind, started: jiff::Timestamp) -> Self {
        Self {
            node: node.to_string(),
            policy: policy.to_string(),
            kind,
            phase: DrainPhase::Tainted,
            started,
            pods_remaining: 0,
            evictions_blocked: 0,
            removal: None,
        }
    }

    /// Apply an event; the phase changes only on valid transitions.
    pub fn apply(&mut self, event: DrainEvent) -> Result<Step, InvalidTransition> {
        use DrainPhase::*;
        let step = match (self.phase, &event) {
            (_, DrainEvent::GiveUp(reason)) => Step::Done(Outcome::GaveUp(reason.clone())),
            (Tainted, DrainEvent::RecheckPassed) => Step::Continue(Evicting),
            (Evicting, DrainEvent::EvictionBlocked) => {
                self.evictions_blocked += 1;
                Step::Continue(Evicting)
            }
            (Evicting, DrainEvent::EvictionsAccepted { remaining }) => {
                self.pods_remaining = *remaining;
                Step::Continue(WaitingForPods)
            }
            (Evicting | WaitingForPods, DrainEvent::PodsRemaining(n)) => {
                self.pods_remaining = *n;
                Step::Continue(self.phase)
            }
            (Evicting | WaitingForPods, DrainEvent::PodsGone) => {
                self.pods_remaining = 0;
                Step::Continue(Deleting)
            }
            (Deleting, DrainEvent::Removing(r)) => {
                self.removal = Some(r.clone());
                Step::Continue(Deleting)
            }
            (Deleting, DrainEvent::HandedOff(at)) if self.removal.is_some() => {
                if let Some(r) = self.removal.as_mut() {
                    r.handed_off = Some(ebb_api::conditions::Time(*at));
                }
                Step::Continue(WaitingForRemoval)
            }
            (WaitingForRemoval, DrainEvent::RemovalStuck(message)) => {
                if let Some(r) = self.removal.as_mut() {
                    r.stuck = true;
                    r.message = Some(message.clone());
                }
                Step::Continue(WaitingForRemoval)
            }
            (Deleting | WaitingForRemoval, DrainEvent::Finished) => Step::Done(Outcome::Removed),
            (phase, event) => {
                return Err(InvalidTransition {
                    node: self.node.clone(),
                    phase,
                    event: format!("{event:?}"),
                });
            }
        };
        if let Step::Continue(phase) = step {
            self.phase = phase;
        }
        Ok(step)
    }
}

/// Result of one eviction call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictionCall {
    /// Accepted (HTTP 200/201).
    Accepted,
    /// The pod no longer exists (HTTP 404).
    Gone,
    /// A PodDisruptionBudget says wait (HTTP 429).
    Blocked,
    /// Any other failure.
    Failed(String),
}

/// What to do after an eviction call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retry {
    /// The pod is on its way out.
    Done,
    /// Call again after this wait.
    After(Duration),
    /// `maxPodEvictionTime` is used up.
    GiveUp,
}

/// Retry rule: 429 and other failures are retried every `retry_interval` until `max_time` has
/// passed since the first call; a retry that would start after `max_time` is not made.
pub fn after_eviction(
    call: &EvictionCall,
    elapsed: Duration,
    retry_interval: Duration,
    max_time: Duration,
) -> Retry {
    match call {
        EvictionCall::Accepted | EvictionCall::Gone => Retry::Done,
        EvictionCall::Blocked | EvictionCall::Failed(_) => {
            if elapsed + retry_interval > max_time {
                Retry::GiveUp
            } else {
                Retry::After(retry_interval)
            }
        }
    }
}

/// Grace period for an evicted pod: its own (Kubernetes' default 30s when unset), capped at
/// `maxGracefulTermination`.
pub fn grace_seconds(pod_grace: Option<i64>, cap: Duration) -> u32 {
    let own = pod_grace.unwrap_or(30).max(0) as u64;
    own.min(cap.as_secs()).min(u32::MAX as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain() -> Drain {
        Drain::new(
            "p",
            "n1",
            ScaleDownKind::underutilized,
            jiff::Timestamp::UNIX_EPOCH,
        )
    }

    #[test]
    fn a_drain_walks_the_phases_in_order() {
        let mut d = drain();
        assert_eq!(d.phase, DrainPhase::Tainted);
        assert_eq!(
            d.apply(DrainEvent::RecheckPassed),
            Ok(Step::Continue(DrainPhase::Evicting))
        );
        d.apply(DrainEvent::EvictionBlocked).unwrap();
        d.apply(DrainEvent::EvictionBlocked).unwrap();
        assert_eq!(d.evictions_blocked, 2);
        assert_eq!(
            d.apply(DrainEvent::EvictionsAccepted { remaining: 3 }),
            Ok(Step::Continue(DrainPhase::WaitingForPods))
        );
        assert_eq!(d.pods_remaining, 3);
        d.apply(DrainEvent::PodsRemaining(1)).unwrap();
        assert_eq!(d.pods_remaining, 1);
        assert_eq!(
            d.apply(DrainEvent::PodsGone),
            Ok(Step::Continue(DrainPhase::Deleting))
        );
        assert_eq!(d.pods_remaining, 0);
        assert_eq!(
            d.apply(DrainEvent::Finished),
            Ok(Step::Done(Outcome::Removed))
        );
    }

    #[test]
    fn a_machine_removal_waits_after_the_hand_off() {
        let mut d = drain();
        d.apply(DrainEvent::RecheckPassed).unwrap();
        d.apply(DrainEvent::PodsGone).unwrap();
        assert!(
            d.apply(DrainEvent::HandedOff(jiff::Timestamp::UNIX_EPOCH))
                .is_err(),
            "no hand-off before the method is known"
        );
        let removal = RemovalStatus {
            method: ebb_api::RemovalMethod::ClusterApi,
            object: "Machine infra/m1".into(),
            scaled: Some("MachineDeployment infra/md".into()),
            handed_off: None,
            stuck: false,
            message: None,
        };
        d.apply(DrainEvent::Removing(removal)).unwrap();
        assert_eq!(
            d.apply(DrainEvent::HandedOff(jiff::Timestamp::UNIX_EPOCH)),
            Ok(Step::Continue(DrainPhase::WaitingForRemoval))
        );
        assert!(d.removal.as_ref().is_some_and(|r| r.handed_off.is_some()));
        d.apply(DrainEvent::RemovalStuck(
            "Machine infra/m1 still there".into(),
        ))
        .unwrap();
        let r = d.removal.clone().expect("removal");
        assert!(r.stuck);
        assert_eq!(r.message.as_deref(), Some("Machine infra/m1 still there"));
        assert!(d.apply(DrainEvent::PodsGone).is_err());
        assert_eq!(
            d.apply(DrainEvent::Finished),
            Ok(Step::Done(Outcome::Removed))
        );
    }

    #[test]
    fn phases_cannot_be_skipped() {
        let mut d = drain();
        let err = d.apply(DrainEvent::Finished).unwrap_err();
        assert_eq!(err.phase, DrainPhase::Tainted);
        assert_eq!(d.phase, DrainPhase::Tainted, "phase unchanged on error");
        assert!(d.apply(DrainEvent::PodsGone).is_err());
        d.apply(DrainEvent::RecheckPassed).unwrap();
        assert!(d.apply(DrainEvent::RecheckPassed).is_err());
        assert!(d.apply(DrainEvent::Finished).is_err());
    }

    #[test]
    fn giving_up_ends_the_drain_from_any_phase() {
        for steps in 0..3 {
            let mut d = drain();
            let events = [
                DrainEvent::RecheckPassed,
                DrainEvent::EvictionsAccepted { remaining: 1 },
                DrainEvent::PodsGone,
            ];
            for e in events.into_iter().take(steps) {
                d.apply(e).unwrap();
            }
            assert_eq!(
                d.apply(DrainEvent::GiveUp(GiveUpReason::Cancelled)),
                Ok(Step::Done(Outcome::GaveUp(GiveUpReason::Cancelled)))
            );
        }
    }

    #[test]
    fn evictions_retry_until_the_max_time_then_give_up() {
        let every = Duration::from_secs(10);
        let max = Duration::from_secs(120);
        assert_eq!(
            after_eviction(&EvictionCall::Accepted, Duration::ZERO, every, max),
            Retry::Done
        );
        assert_eq!(
            after_eviction(&EvictionCall::Gone, Duration::from_secs(500), every, max),
            Retry::Done
        );
        assert_eq!(
            after_eviction(&EvictionCall::Blocked, Duration::ZERO, every, max),
            Retry::After(every)
        );
        assert_eq!(
            after_eviction(&EvictionCall::Blocked, Duration::from_secs(110), every, max),
            Retry::After(every),
            "a retry landing exactly at the max time is still made"
        );
        assert_eq!(
            after_eviction(&EvictionCall::Blocked, Duration::from_secs(111), every, max),
            Retry::GiveUp
        );
        assert_eq!(
            after_eviction(
                &EvictionCall::Failed("boom".into()),
                Duration::from_secs(115),
                every,
                max
            ),
            Retry::GiveUp
        );
    }

    #[test]
    fn grace_is_capped() {
        let cap = Duration::from_secs(600);
        assert_eq!(grace_seconds(None, cap), 30);
        assert_eq!(grace_seconds(Some(5), cap), 5);
        assert_eq!(grace_seconds(Some(3600), cap), 600);
        assert_eq!(grace_seconds(Some(-1), cap), 0);
        assert_eq!(grace_seconds(Some(45), Duration::from_secs(10)), 10);
    }

    #[test]
    fn give_up_messages_name_the_pods() {
        let r = GiveUpReason::EvictionTimeout {
            pods: (0..7).map(|i| format!("default/web-{i}")).collect(),
        };
        let msg = r.to_string();
        assert!(msg.contains("default/web-0"), "{msg}");
        assert!(msg.contains("and 2 more"), "{msg}");
        assert!(msg.contains("PodDisruptionBudget"), "{msg}");
    }
}
