//! Kubernetes Events only on transitions: the facts of one loop are compared with the last
//! loop's, and only what changed becomes an Event (pure); `publish` sends them (events.k8s.io/v1).

use std::collections::{BTreeMap, BTreeSet};

use ebb_api::reasons::{DegradedReason, ThrottledReason};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use crate::actuation::Outcome;
use crate::actuation::status::Finished;

/// Event reasons.
pub const SCALE_DOWN_CANDIDATE: &str = "ScaleDownCandidate";
pub const DRAIN_STARTED: &str = "DrainStarted";
pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
pub const DRAIN_FAILED: &str = "DrainFailed";
pub const NODE_REMOVED: &str = "NodeRemoved";
pub const THROTTLED: &str = "Throttled";
pub const DEGRADED: &str = "Degraded";
pub const MACHINE_HANDED_OFF: &str = "MachineHandedOff";
pub const REMOVAL_STUCK: &str = "RemovalStuck";
pub const REPLACEMENTS_OFF_PLAN: &str = "ReplacementsOffPlan";

/// At most this many nodes that joined the candidate set in one loop get an Event of their own
/// (in name order); the rest are in the policy's summary and its status. A freshly started
/// controller on a large cluster would otherwise write one Event per candidate at once (1,500
/// writes at 5,000 nodes).
pub const CANDIDATE_EVENTS_PER_LOOP: usize = 10;

/// What one loop saw, as far as Events are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub candidates: BTreeSet<String>,
    pub draining: BTreeSet<String>,
    /// Drains with at least one eviction refused by a PodDisruptionBudget.
    pub blocked: BTreeSet<String>,
    pub throttled: Option<ThrottledReason>,
    pub degraded: Option<(DegradedReason, String)>,
    /// Drains whose machine was handed off, by node.
    pub removals: BTreeMap<String, RemovalFact>,
    /// Replacements not on their planned node so far, by fallback reason.
    pub fallbacks: BTreeMap<String, i64>,
}

/// A handed-off removal as far as Events go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovalFact {
    /// What was acted on, and the group scaled down (`Machine ns/m, MachineDeployment ns/md`).
    pub what: String,
    /// Why it is stuck, once it is.
    pub stuck: Option<String>,
}

impl RemovalFact {
    pub fn of(r: &ebb_api::scaledown::RemovalStatus) -> Self {
        let what = match &r.scaled {
            Some(group) => format!("{} marked for deletion and {group} scaled down", r.object),
            None => format!("{} deleted", r.object),
        };
        RemovalFact {
            what: format!("{} ({})", what, r.method),
            stuck: r.stuck.then(|| r.message.clone().unwrap_or_default()),
        }
    }
}

/// The object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Regarding {
    Policy,
    Node(String),
}

/// An Event to publish. Repeats of an Event with the same type, reason, regarding and related
/// object become one Event with a growing `series.count` and the note of the first: notes that
/// vary are only used where `related` tells the repeats apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub regarding: Regarding,
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// For an Event regarding the policy, the node it concerns (its `related` object).
    pub related: Option<String>,
}

fn ev(regarding: Regarding, warning: bool, reason: &'static str, note: String) -> Planned {
    Planned {
        regarding,
        warning,
        reason,
        note,
        related: None,
    }
}

/// An Event regarding the policy about one node.
fn about(node: &str, warning: bool, reason: &'static str, note: String) -> Planned {
    Planned {
        related: Some(node.to_string()),
        ..ev(Regarding::Policy, warning, reason, note)
    }
}

/// Events for what changed from `prev` to `next`, plus one per finished drain.
pub fn transitions(
    policy: &str,
    prev: &Facts,
    next: &Facts,
    finished: &[Finished],
) -> Vec<Planned> {
    let mut out = Vec::new();
    if next.degraded != prev.degraded
        && let Some((reason, message)) = &next.degraded
    {
        let note = format!("{reason}: {message}");
        out.push(ev(Regarding::Policy, true, DEGRADED, note));
    }
    out.extend(joined_candidates(policy, prev, next));
    out.extend(started_drains(policy, prev, next));
    for n in next.blocked.difference(&prev.blocked) {
        out.push(ev(
            Regarding::Node(n.clone()),
            true,
            EVICTION_BLOCKED,
            "a PodDisruptionBudget refused an eviction; retrying every evictionRetryInterval until maxPodEvictionTime".into(),
        ));
    }
    out.extend(handed_off(prev, next));
    out.extend(off_plan(prev, next));
    out.extend(finished.iter().flat_map(finished_drain));
    if next.throttled != prev.throttled
        && let Some(r) = next.throttled
    {
        let note = format!("removable nodes held back by {r}");
        out.push(ev(Regarding::Policy, false, THROTTLED, note));
    }
    out
}

/// One Event per node that joined the candidate set (at most [`CANDIDATE_EVENTS_PER_LOOP`]),
/// and one on the policy.
fn joined_candidates(policy: &str, prev: &Facts, next: &Facts) -> Vec<Planned> {
    let mut out: Vec<Planned> = next
        .candidates
        .difference(&prev.candidates)
        .take(CANDIDATE_EVENTS_PER_LOOP)
        .map(|n| {
            let note =
                format!("removable together with the other candidates of ScaleDownPolicy {policy}");
            ev(
                Regarding::Node(n.clone()),
                false,
                SCALE_DOWN_CANDIDATE,
                note,
            )
        })
        .collect();
    if !out.is_empty() {
        let note = "nodes joined the candidate set (status.candidates counts them; status.candidateNodes lists the first 50)";
        // The same note for every repeat, so that repeats fold into one Event's series.
        out.push(ev(
            Regarding::Policy,
            false,
            SCALE_DOWN_CANDIDATE,
            note.into(),
        ));
    }
    out
}

/// One Event per node whose drain started, and one on the policy.
fn started_drains(policy: &str, prev: &Facts, next: &Facts) -> Vec<Planned> {
    let mut out: Vec<Planned> = next
        .draining
        .difference(&prev.draining)
        .map(|n| {
            let note = format!(
                "tainted ebb.dev/to-be-deleted by ScaleDownPolicy {policy}; evicting its pods"
            );
            ev(Regarding::Node(n.clone()), false, DRAIN_STARTED, note)
        })
        .collect();
    if !out.is_empty() {
        let note = "drains started (status.drainingNodes lists them)";
        out.push(ev(Regarding::Policy, false, DRAIN_STARTED, note.into()));
    }
    out
}

/// Per node: one Event when its machine is handed off, a Warning when the removal is stuck.
fn handed_off(prev: &Facts, next: &Facts) -> Vec<Planned> {
    let mut out = Vec::new();
    for (node, r) in &next.removals {
        let before = prev.removals.get(node);
        if before.is_none() {
            let note = format!("{}; waiting for the machine and the Node to go", r.what);
            out.push(about(node, false, MACHINE_HANDED_OFF, note));
        }
        if let Some(why) = &r.stuck
            && before.is_none_or(|b| b.stuck.is_none())
        {
            let note = format!(
                "{}: {why}; see the Troubleshooting section \"A removal is stuck\"",
                r.what
            );
            out.push(about(node, true, REMOVAL_STUCK, note));
        }
    }
    out
}

/// One Event per fallback reason whose count grew: replacements the scheduler placed (or had to
/// place) off their planned node. Not a warning: nothing failed, the plan was not followed. The
/// note is the same for every repeat of a reason, so repeats become one Event's series.
fn off_plan(prev: &Facts, next: &Facts) -> Vec<Planned> {
    next.fallbacks
        .iter()
        .filter(|(reason, n)| **n > prev.fallbacks.get(*reason).copied().unwrap_or(0))
        .map(|(reason, _)| {
            let note = format!(
                "replacements not on their planned node: {reason} \
                 (status.replacements.fallbacks counts them; see docs/steering.md)"
            );
            ev(Regarding::Policy, false, REPLACEMENTS_OFF_PLAN, note)
        })
        .collect()
}

/// A removed node: one Event on the policy; an abandoned drain: one on the node and the policy.
fn finished_drain(f: &Finished) -> Vec<Planned> {
    let node = &f.drain.node;
    match &f.outcome {
        Outcome::Removed => {
            let how = match &f.drain.removal {
                Some(r) => format!(" through {}: {}", r.method, r.object),
                None => String::new(),
            };
            let note = format!("node {node} removed ({}){how}", kind_name(f.drain.kind));
            vec![about(node, false, NODE_REMOVED, note)]
        }
        Outcome::GaveUp(reason) => {
            let note = format!("drain of node {node} abandoned, node untainted: {reason}");
            vec![
                ev(
                    Regarding::Node(node.clone()),
                    true,
                    DRAIN_FAILED,
                    note.clone(),
                ),
                about(node, true, DRAIN_FAILED, note),
            ]
        }
    }
}

fn kind_name(kind: crate::metrics::ScaleDownKind) -> &'static str {
    match kind {
        crate::metrics::ScaleDownKind::empty => "empty",
        crate::metrics::ScaleDownKind::underutilized => "underutilized",
        crate::metrics::ScaleDownKind::unready => "unready",
    }
}

/// Sends planned Events; failures are logged, never fatal.
pub async fn publish(
    recorder: &Recorder,
    policy: &ObjectReference,
    planned: &[Planned],
    node_uids: &BTreeMap<String, String>,
) {
    let node_ref = |n: &String| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(n.clone()),
        uid: node_uids.get(n).cloned(),
        ..Default::default()
    };
    for p in planned {
        let (reference, secondary) = match &p.regarding {
            Regarding::Policy => (policy.clone(), p.related.as_ref().map(node_ref)),
            Regarding::Node(n) => (node_ref(n), Some(policy.clone())),
        };
        let event = Event {
            type_: if p.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: p.reason.into(),
            note: Some(p.note.clone()),
            action: "ScaleDown".into(),
            secondary,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::warn!(reason = p.reason, error = %e, "could not publish an Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actuation::{Drain, GiveUpReason};
    use crate::metrics::ScaleDownKind;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn reasons(events: &[Planned]) -> Vec<(&'static str, Regarding)> {
        events
            .iter()
            .map(|e| (e.reason, e.regarding.clone()))
            .collect()
    }

    #[test]
    fn nothing_changes_nothing_is_said() {
        let f = Facts {
            candidates: set(&["a", "b"]),
            draining: set(&["c"]),
            blocked: set(&["c"]),
            throttled: Some(ThrottledReason::MaxDrainParallelism),
            degraded: Some((DegradedReason::OverlappingPolicies, "x".into())),
            removals: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
        };
        assert!(transitions("p", &f, &f, &[]).is_empty());
    }

    #[test]
    fn transitions_become_events_once() {
        let prev = Facts {
            candidates: set(&["a"]),
            ..Facts::default()
        };
        let next = Facts {
            candidates: set(&["a", "b"]),
            draining: set(&["c"]),
            blocked: set(&["c"]),
            throttled: Some(ThrottledReason::Budget),
            degraded: None,
            removals: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
        };
        let t0 = jiff::Timestamp::UNIX_EPOCH;
        let finished = vec![
            Finished {
                drain: Drain::new("p", "d", ScaleDownKind::empty, t0),
                outcome: Outcome::Removed,
                at: t0,
            },
            Finished {
                drain: Drain::new("p", "e", ScaleDownKind::underutilized, t0),
                outcome: Outcome::GaveUp(GiveUpReason::PodsLanded(vec!["default/x".into()])),
                at: t0,
            },
        ];
        let events = transitions("p", &prev, &next, &finished);
        assert_eq!(
            reasons(&events),
            vec![
                (SCALE_DOWN_CANDIDATE, Regarding::Node("b".into())),
                (SCALE_DOWN_CANDIDATE, Regarding::Policy),
                (DRAIN_STARTED, Regarding::Node("c".into())),
                (DRAIN_STARTED, Regarding::Policy),
                (EVICTION_BLOCKED, Regarding::Node("c".into())),
                (NODE_REMOVED, Regarding::Policy),
                (DRAIN_FAILED, Regarding::Node("e".into())),
                (DRAIN_FAILED, Regarding::Policy),
                (THROTTLED, Regarding::Policy),
            ]
        );
        assert!(events[6].warning && events[6].note.contains("default/x"));
        assert!(events[5].note.contains("node d removed (empty)"));
        // Per-node Events on the policy name their node as the related object, so repeats for
        // other nodes are not folded into the first one's series.
        assert_eq!(events[5].related.as_deref(), Some("d"));
        assert_eq!(events[7].related.as_deref(), Some("e"));
        assert_eq!(events[1].related, None);
        // The next loop with the same facts is silent.
        assert!(transitions("p", &next, &next, &[]).is_empty());
    }

    #[test]
    fn a_crowd_of_new_candidates_gets_a_bounded_number_of_node_events() {
        let names: Vec<String> = (0..1500).map(|i| format!("n{i:04}")).collect();
        let next = Facts {
            candidates: names.iter().cloned().collect(),
            ..Facts::default()
        };
        let events = transitions("p", &Facts::default(), &next, &[]);
        let per_node: Vec<&Regarding> = events
            .iter()
            .filter(|e| e.reason == SCALE_DOWN_CANDIDATE)
            .map(|e| &e.regarding)
            .filter(|r| matches!(r, Regarding::Node(_)))
            .collect();
        assert_eq!(per_node.len(), CANDIDATE_EVENTS_PER_LOOP);
        assert_eq!(per_node[0], &Regarding::Node("n0000".into()));
        let on_policy = events
            .iter()
            .filter(|e| e.reason == SCALE_DOWN_CANDIDATE && e.regarding == Regarding::Policy)
            .count();
        assert_eq!(on_policy, 1, "the summary is said once");
        // The nodes not announced are not announced later either: they were in the set.
        assert!(transitions("p", &next, &next, &[]).is_empty());
    }

    #[test]
    fn a_hand_off_is_announced_once_and_a_stuck_removal_warns_once() {
        let status = ebb_api::scaledown::RemovalStatus {
            method: ebb_api::RemovalMethod::ClusterApi,
            object: "Machine infra/m1".into(),
            scaled: Some("MachineDeployment infra/md".into()),
            handed_off: None,
            stuck: false,
            message: None,
        };
        let handed = Facts {
            removals: [("n1".to_string(), RemovalFact::of(&status))].into(),
            ..Facts::default()
        };
        let out = transitions("p", &Facts::default(), &handed, &[]);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].reason, MACHINE_HANDED_OFF);
        assert!(!out[0].warning);
        assert!(
            out[0].note.contains("Machine infra/m1 marked for deletion and MachineDeployment infra/md scaled down (ClusterAPI)"),
            "{}",
            out[0].note
        );
        assert!(transitions("p", &handed, &handed, &[]).is_empty());
        let stuck_status = ebb_api::scaledown::RemovalStatus {
            stuck: true,
            message: Some("Machine infra/m1 still there 900s after the hand-off".into()),
            ..status
        };
        let stuck = Facts {
            removals: [("n1".to_string(), RemovalFact::of(&stuck_status))].into(),
            ..Facts::default()
        };
        let out = transitions("p", &handed, &stuck, &[]);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].reason, REMOVAL_STUCK);
        assert!(out[0].warning && out[0].note.contains("still there 900s"));
        assert!(transitions("p", &stuck, &stuck, &[]).is_empty());
    }

    #[test]
    fn degraded_is_announced_when_it_starts_or_changes() {
        let ok = Facts::default();
        let bad = Facts {
            degraded: Some((DegradedReason::SelectorMatchesNothing, "no node".into())),
            ..Facts::default()
        };
        let e = transitions("p", &ok, &bad, &[]);
        assert_eq!(reasons(&e), vec![(DEGRADED, Regarding::Policy)]);
        assert!(e[0].warning && e[0].note.contains("SelectorMatchesNothing: no node"));
        assert!(transitions("p", &bad, &ok, &[]).is_empty());
    }

    #[test]
    fn a_fallback_reason_that_grows_is_one_event_and_an_unchanged_one_none() {
        let prev = Facts {
            fallbacks: BTreeMap::from([
                ("NodeGone".to_string(), 2),
                ("SchedulerChoseAnother".to_string(), 1),
            ]),
            ..Facts::default()
        };
        let next = Facts {
            fallbacks: BTreeMap::from([
                ("NodeGone".to_string(), 2),
                ("SchedulerChoseAnother".to_string(), 3),
                ("Expired".to_string(), 1),
            ]),
            ..Facts::default()
        };
        let evs = transitions("p", &prev, &next, &[]);
        let notes: Vec<&str> = evs
            .iter()
            .filter(|e| e.reason == REPLACEMENTS_OFF_PLAN)
            .map(|e| e.note.as_str())
            .collect();
        assert_eq!(notes.len(), 2, "{evs:?}");
        assert!(notes.iter().any(|n| n.contains(": Expired ")));
        assert!(notes.iter().any(|n| n.contains(": SchedulerChoseAnother ")));
        assert!(evs.iter().all(|e| !e.warning));
        assert!(transitions("p", &next, &next, &[]).is_empty());
    }
}
