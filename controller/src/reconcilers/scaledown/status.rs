//! Builds a ScaleDownPolicy's status from the loop's decisions and the drains in flight, and
//! decides whether it is worth a write. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use ebb_api::ScaleDownMode;
use ebb_api::conditions::{self, Condition, Time};
use ebb_api::reasons::{ThrottledReason, UnremovableReason};
use ebb_api::scaledown::{
    CandidateStatus, CostStatus, DrainingNodeStatus, FallbackCount, LoopStatus, ReasonCount,
    ReplacementsStatus, STATUS_LIST_CAP, ScaleDownPolicyStatus, UnremovableNodeStatus,
};

use super::selection::Degraded;
use crate::actuation::Drain;
use crate::scaledown::Plan;
use crate::scaledown::budgets::Selection;

/// A status older than this is rewritten even when nothing else changed, so `lastLoop` stays
/// a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(300);

/// Everything one loop knows about a policy.
pub struct LoopFacts<'a> {
    pub generation: Option<i64>,
    pub now: jiff::Timestamp,
    pub mode: ScaleDownMode,
    pub nodes_selected: usize,
    /// The planner's decisions; `None` when bad input stopped the policy.
    pub plan: Option<&'a Plan>,
    pub selection: Option<&'a Selection>,
    pub drains: &'a [Drain],
    /// Nodes shared with other policies (left alone).
    pub overlapping: &'a BTreeMap<String, Vec<String>>,
    pub degraded: Option<&'a Degraded>,
    pub removed_total: i64,
    pub evictions_refused_total: i64,
    pub loop_duration: Duration,
    pub previous: Option<&'a ScaleDownPolicyStatus>,
    /// Where this policy's replacements went (`None` in DryRun: nothing is evicted).
    pub replacements: Option<ReplacementsStatus>,
}

/// The replacements' figures: the steering book's tally of the policy, the slots still waiting
/// for their replacement, and whether steering is on (`Ok`) or why not.
pub fn replacements(
    tally: &crate::steering::Tally,
    waiting: usize,
    steering: Result<(), &str>,
) -> ReplacementsStatus {
    ReplacementsStatus {
        steering: match steering {
            Ok(()) => "Enabled".to_string(),
            Err(why) => format!("Disabled: {why}"),
        },
        steered: tally.steered as i64,
        on_plan: tally.on_plan as i64,
        fell_back: tally.fell_back_total() as i64,
        waiting: waiting as i64,
        not_created: tally.not_created as i64,
        on_plan_percent: tally.on_plan_percent().map(|p| p.round() as i32),
        fallbacks: tally
            .fell_back
            .iter()
            .map(|(r, n)| FallbackCount {
                reason: r.as_str().to_string(),
                count: *n as i64,
            })
            .collect(),
    }
}

/// The reason most nodes are throttled for (ties: declaration order).
pub fn main_throttle(selection: Option<&Selection>) -> Option<ThrottledReason> {
    let mut counts: BTreeMap<ThrottledReason, usize> = BTreeMap::new();
    for (_, r) in selection.map(|s| s.throttled.as_slice()).unwrap_or(&[]) {
        *counts.entry(*r).or_insert(0) += 1;
    }
    let max = counts.values().copied().max()?;
    counts.into_iter().find(|(_, c)| *c == max).map(|(r, _)| r)
}

/// The removed count to start from when this process first loops over a policy: the written
/// `removedTotal`, plus the drains the written status lists as in flight that have finished
/// since (`finished(node)`: node gone, or marked drained) — a process stopped between removing
/// a node and writing the status leaves exactly those uncounted.
pub fn removed_at_start(
    written: Option<&ScaleDownPolicyStatus>,
    finished: impl Fn(&str) -> bool,
) -> i64 {
    written.map_or(0, |s| {
        let uncounted = s
            .draining_nodes
            .iter()
            .filter(|d| finished(&d.node))
            .count();
        s.removed_total + uncounted as i64
    })
}

/// The status for these facts. Conditions keep their transition times from `previous`.
pub fn build(f: &LoopFacts<'_>) -> ScaleDownPolicyStatus {
    let draining: BTreeMap<&str, &Drain> = f.drains.iter().map(|d| (d.node.as_str(), d)).collect();
    let candidates = candidate_rows(f, &draining);
    let unremovable = unremovable_rows(f, &draining);
    let mut by_reason: BTreeMap<UnremovableReason, i32> = BTreeMap::new();
    for u in &unremovable {
        *by_reason.entry(u.reason).or_insert(0) += 1;
    }
    let stats = f.plan.map(|p| p.simulation).unwrap_or_default();
    let mut candidate_nodes = candidates.clone();
    candidate_nodes.truncate(STATUS_LIST_CAP);
    let mut unremovable_nodes = unremovable;
    unremovable_nodes.truncate(STATUS_LIST_CAP);
    ScaleDownPolicyStatus {
        observed_generation: f.generation,
        conditions: conditions_for(f),
        nodes_selected: f.nodes_selected as i32,
        candidates: candidates.len() as i32,
        draining: f.drains.len() as i32,
        removed_total: f.removed_total,
        removals_stuck: f
            .drains
            .iter()
            .filter(|d| d.removal.as_ref().is_some_and(|r| r.stuck))
            .count() as i32,
        evictions_refused_total: f.evictions_refused_total,
        unremovable: by_reason
            .into_iter()
            .map(|(reason, count)| ReasonCount { reason, count })
            .collect(),
        candidate_nodes,
        draining_nodes: f.drains.iter().map(draining_row).collect(),
        unremovable_nodes,
        last_loop: LoopStatus {
            time: Some(Time(f.now)),
            duration_ms: f.loop_duration.as_millis() as i64,
            nodes_evaluated: stats.nodes_evaluated as i32,
            timed_out: stats.timed_out,
        },
        replacements: f.replacements.clone(),
        cost: f.plan.and_then(|p| p.cost.as_ref()).map(cost_row),
    }
}

/// The plan's hourly costs as the status shows them (rounded to 1/10000: the status is not
/// rewritten for noise).
fn cost_row(c: &crate::scaledown::pricing::CostSummary) -> CostStatus {
    let round = |v: f64| (v * 10_000.0).round() / 10_000.0;
    let mut invalid = c.invalid_annotations.clone();
    invalid.truncate(STATUS_LIST_CAP);
    CostStatus {
        removed_per_hour: round(c.removed_per_hour),
        kept_per_hour: round(c.kept_per_hour),
        unpriced_nodes: c.unpriced as i32,
        invalid_cost_annotations: invalid,
    }
}

/// Candidates not being drained and not shared with another policy, each with what it waits for.
fn candidate_rows(f: &LoopFacts<'_>, draining: &BTreeMap<&str, &Drain>) -> Vec<CandidateStatus> {
    let mut waiting: BTreeMap<&str, String> = BTreeMap::new();
    if let Some(sel) = f.selection {
        for (n, r) in &sel.waiting {
            waiting.insert(n, r.to_string());
        }
        for (n, r) in &sel.throttled {
            waiting.insert(n, r.to_string());
        }
    }
    f.plan
        .map(|p| p.candidates.as_slice())
        .unwrap_or(&[])
        .iter()
        .filter(|c| !draining.contains_key(c.node.as_str()) && !f.overlapping.contains_key(&c.node))
        .map(|c| CandidateStatus {
            node: c.node.clone(),
            since: Some(Time(c.since)),
            empty: c.empty,
            pods_to_move: c.moves.len() as i32,
            waiting_for: match f.mode {
                ScaleDownMode::DryRun => Some("DryRun".to_string()),
                _ => waiting.get(c.node.as_str()).cloned(),
            },
            disruption_budget: f
                .selection
                .and_then(|s| s.held_by_pdb.get(&c.node))
                .filter(|_| f.mode != ScaleDownMode::DryRun)
                .cloned(),
        })
        .collect()
}

/// Nodes that stay, by name: the planner's reasons, and the nodes shared with another policy.
fn unremovable_rows(
    f: &LoopFacts<'_>,
    draining: &BTreeMap<&str, &Drain>,
) -> Vec<UnremovableNodeStatus> {
    let mut rows: Vec<UnremovableNodeStatus> = f
        .plan
        .map(|p| p.unremovable.as_slice())
        .unwrap_or(&[])
        .iter()
        .filter(|u| !f.overlapping.contains_key(&u.node))
        .filter(|u| {
            // Our own drains show under drainingNodes, not as "being deleted".
            !(u.reason == UnremovableReason::CurrentlyBeingDeleted
                && draining.contains_key(u.node.as_str()))
        })
        .map(|u| UnremovableNodeStatus {
            node: u.node.clone(),
            reason: u.reason,
            pod: u.pod.clone(),
            pod_reason: u.pod_reason,
            message: u.detail.clone(),
        })
        .collect();
    rows.extend(f.overlapping.keys().map(|n| UnremovableNodeStatus {
        node: n.clone(),
        reason: UnremovableReason::OverlappingPolicies,
        pod: None,
        pod_reason: None,
        message: None,
    }));
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    rows
}

fn draining_row(d: &Drain) -> DrainingNodeStatus {
    DrainingNodeStatus {
        node: d.node.clone(),
        phase: d.phase,
        started: Some(Time(d.started)),
        pods_remaining: d.pods_remaining,
        evictions_blocked: d.evictions_blocked,
        removal: d.removal.clone(),
    }
}

/// Ready, Throttled and Degraded, keeping transition times from the previous status.
fn conditions_for(f: &LoopFacts<'_>) -> Vec<Condition> {
    let mut conds: Vec<Condition> = f.previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let cond = |type_: &str, status: bool, reason: &str, message: String| {
        conditions::condition(type_, status, reason, message, f.generation, f.now)
    };
    let stopped = f.degraded.is_some_and(|d| d.stops_policy);
    let ready = match f.degraded {
        Some(d) if d.stops_policy => cond(
            conditions::READY,
            false,
            d.reason.as_str(),
            d.message.clone(),
        ),
        _ => cond(
            conditions::READY,
            true,
            "Reconciled",
            ready_message(f.mode).to_string(),
        ),
    };
    conditions::set_condition(&mut conds, ready);
    let throttled = match main_throttle(f.selection).filter(|_| !stopped) {
        Some(r) => {
            let n = f.selection.map(|s| s.throttled.len()).unwrap_or(0);
            let message = format!("{n} removable node(s) held back; most by {r}");
            cond(conditions::THROTTLED, true, r.as_str(), message)
        }
        None => cond(conditions::THROTTLED, false, "NotThrottled", String::new()),
    };
    conditions::set_condition(&mut conds, throttled);
    let degraded = match f.degraded {
        Some(d) => cond(
            conditions::DEGRADED,
            true,
            d.reason.as_str(),
            d.message.clone(),
        ),
        None => cond(conditions::DEGRADED, false, "AsExpected", String::new()),
    };
    conditions::set_condition(&mut conds, degraded);
    conds
}

fn ready_message(mode: ScaleDownMode) -> &'static str {
    match mode {
        ScaleDownMode::DryRun => {
            "planning every loop; DryRun: nothing is tainted, evicted or deleted"
        }
        ScaleDownMode::Drain => {
            "planning every loop; removable nodes are drained and kept cordoned"
        }
        ScaleDownMode::DrainAndDelete => {
            "planning every loop; removable nodes are drained and deleted"
        }
    }
}

/// True when `next` says something `last` (the status last written) does not, or `last` is
/// older than [`HEARTBEAT`]. The figures of the loop itself (`lastLoop`) alone do not count.
pub fn needs_write(
    last: Option<&ScaleDownPolicyStatus>,
    next: &ScaleDownPolicyStatus,
    now: jiff::Timestamp,
) -> bool {
    let Some(last) = last else {
        return true;
    };
    let strip = |s: &ScaleDownPolicyStatus| {
        let mut s = s.clone();
        s.last_loop = LoopStatus::default();
        s
    };
    if strip(last) != strip(next) {
        return true;
    }
    match &last.last_loop.time {
        Some(Time(t)) => now.duration_since(*t).unsigned_abs() >= HEARTBEAT,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_listed_in_flight_that_finished_since_are_counted_at_start() {
        let written = ScaleDownPolicyStatus {
            removed_total: 7,
            evictions_refused_total: 0,
            draining_nodes: ["gone", "drained", "still-draining", "rolled-back"]
                .map(|n| DrainingNodeStatus {
                    node: n.into(),
                    phase: ebb_api::reasons::DrainPhase::Evicting,
                    started: None,
                    pods_remaining: 1,
                    evictions_blocked: 0,
                    removal: None,
                })
                .to_vec(),
            ..ScaleDownPolicyStatus::default()
        };
        let finished = |n: &str| n == "gone" || n == "drained";
        assert_eq!(removed_at_start(Some(&written), finished), 9);
        assert_eq!(removed_at_start(None, finished), 0);
        let counted = ScaleDownPolicyStatus {
            removed_total: 3,
            evictions_refused_total: 0,
            ..ScaleDownPolicyStatus::default()
        };
        assert_eq!(removed_at_start(Some(&counted), |_| true), 3);
    }
    use crate::metrics::ScaleDownKind;
    use crate::scaledown::{Candidate, Move, Unremovable};
    use ebb_api::reasons::{DegradedReason, DrainPhase};

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn candidate(name: &str, moves: usize) -> Candidate {
        Candidate {
            group_min: 0,
            hourly_cost: None,
            node: name.into(),
            since: ts(100),
            empty: moves == 0,
            ready: true,
            group: None,
            moves: (0..moves)
                .map(|i| Move {
                    pod: format!("default/p{i}").into(),
                    uid: format!("u{i}").into(),
                    to: "x".into(),
                })
                .collect(),
        }
    }

    fn facts<'a>(
        plan: &'a Plan,
        sel: &'a Selection,
        drains: &'a [Drain],
        overlapping: &'a BTreeMap<String, Vec<String>>,
    ) -> LoopFacts<'a> {
        LoopFacts {
            generation: Some(3),
            now: ts(1000),
            mode: ScaleDownMode::DrainAndDelete,
            nodes_selected: 70,
            plan: Some(plan),
            selection: Some(sel),
            drains,
            overlapping,
            degraded: None,
            removed_total: 4,
            evictions_refused_total: 0,
            loop_duration: Duration::from_millis(42),
            previous: None,
            replacements: None,
        }
    }

    #[test]
    fn status_lists_candidates_drains_and_reasons_capped() {
        let mut plan = Plan {
            candidates: (0..60)
                .map(|i| candidate(&format!("c{i:02}"), i % 3))
                .collect(),
            unremovable: vec![
                Unremovable {
                    node: "u1".into(),
                    reason: UnremovableReason::NotUnderutilized,
                    pod: None,
                    pod_reason: None,
                    detail: None,
                },
                Unremovable {
                    node: "u2".into(),
                    reason: UnremovableReason::NotUnderutilized,
                    pod: None,
                    pod_reason: None,
                    detail: None,
                },
                Unremovable {
                    node: "d1".into(),
                    reason: UnremovableReason::CurrentlyBeingDeleted,
                    pod: None,
                    pod_reason: None,
                    detail: None,
                },
            ],
            ..Plan::default()
        };
        plan.simulation.nodes_evaluated = 63;
        let sel = Selection {
            throttled: vec![("c01".into(), ThrottledReason::MaxDrainParallelism)],
            waiting: vec![("c02".into(), UnremovableReason::NotUnneededLongEnough)],
            ..Selection::default()
        };
        let mut d = Drain::new("p", "d1", ScaleDownKind::underutilized, ts(900));
        d.phase = DrainPhase::Evicting;
        d.pods_remaining = 2;
        let drains = vec![d];
        let overlapping: BTreeMap<String, Vec<String>> =
            [("c00".to_string(), vec!["other".to_string()])].into();
        let s = build(&facts(&plan, &sel, &drains, &overlapping));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.nodes_selected, 70);
        assert_eq!(s.candidates, 59, "the overlapping node is not a candidate");
        assert_eq!(s.candidate_nodes.len(), STATUS_LIST_CAP);
        assert_eq!(s.candidate_nodes[0].node, "c01");
        assert_eq!(
            s.candidate_nodes[0].waiting_for.as_deref(),
            Some("MaxDrainParallelism")
        );
        assert_eq!(
            s.candidate_nodes[1].waiting_for.as_deref(),
            Some("NotUnneededLongEnough")
        );
        assert_eq!(s.candidate_nodes[1].pods_to_move, 2);
        assert_eq!(s.draining, 1);
        assert_eq!(s.draining_nodes[0].phase, DrainPhase::Evicting);
        assert_eq!(s.draining_nodes[0].pods_remaining, 2);
        assert_eq!(
            s.unremovable,
            vec![
                ReasonCount {
                    reason: UnremovableReason::NotUnderutilized,
                    count: 2
                },
                ReasonCount {
                    reason: UnremovableReason::OverlappingPolicies,
                    count: 1
                },
            ]
        );
        assert_eq!(s.removed_total, 4);
        assert_eq!(s.last_loop.duration_ms, 42);
        assert_eq!(s.last_loop.nodes_evaluated, 63);
        assert!(conditions::is_true(&s.conditions, conditions::READY));
        assert!(conditions::is_true(&s.conditions, conditions::THROTTLED));
        assert_eq!(
            conditions::find(&s.conditions, conditions::THROTTLED)
                .unwrap()
                .reason,
            "MaxDrainParallelism"
        );
        assert!(!conditions::is_true(&s.conditions, conditions::DEGRADED));
    }

    #[test]
    fn hourly_costs_show_rounded_and_only_when_known() {
        let sel = Selection::default();
        let overlapping = BTreeMap::new();
        let plan = Plan::default();
        assert_eq!(build(&facts(&plan, &sel, &[], &overlapping)).cost, None);
        let plan = Plan {
            cost: Some(crate::scaledown::pricing::CostSummary {
                removed_per_hour: 32.77 + 0.096 + 0.000_04,
                kept_per_hour: 1.0 / 3.0,
                unpriced: 2,
                invalid_annotations: (0..60).map(|i| format!("n{i:02}")).collect(),
            }),
            ..Plan::default()
        };
        let cost = build(&facts(&plan, &sel, &[], &overlapping)).cost.unwrap();
        assert_eq!(cost.removed_per_hour, 32.866);
        assert_eq!(cost.kept_per_hour, 0.3333);
        assert_eq!(cost.unpriced_nodes, 2);
        assert_eq!(cost.invalid_cost_annotations.len(), STATUS_LIST_CAP);
        assert_eq!(cost.invalid_cost_annotations[0], "n00");
    }

    #[test]
    fn bad_input_makes_the_policy_not_ready_and_degraded() {
        let plan = Plan::default();
        let sel = Selection::default();
        let none = BTreeMap::new();
        let d = Degraded {
            reason: DegradedReason::SelectorMatchesNothing,
            message: "spec.nodeSelector matches no node".into(),
            stops_policy: true,
        };
        let mut f = facts(&plan, &sel, &[], &none);
        f.plan = None;
        f.selection = None;
        f.degraded = Some(&d);
        let s = build(&f);
        let ready = conditions::find(&s.conditions, conditions::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SelectorMatchesNothing")
        );
        let deg = conditions::find(&s.conditions, conditions::DEGRADED).unwrap();
        assert_eq!(deg.status, "True");
        assert!(deg.message.contains("matches no node"));
        assert_eq!(s.candidates, 0);
    }

    #[test]
    fn writes_only_when_something_changed_or_the_heartbeat_is_due() {
        let plan = Plan {
            candidates: vec![candidate("a", 1)],
            ..Plan::default()
        };
        let sel = Selection::default();
        let none = BTreeMap::new();
        let first = build(&facts(&plan, &sel, &[], &none));
        assert!(needs_write(None, &first, ts(1000)));
        let mut f = facts(&plan, &sel, &[], &none);
        f.now = ts(1010);
        f.loop_duration = Duration::from_millis(99);
        f.previous = Some(&first);
        let same = build(&f);
        assert_eq!(
            conditions::find(&same.conditions, conditions::READY)
                .unwrap()
                .last_transition_time,
            Time(ts(1000)),
            "transition time kept"
        );
        assert!(!needs_write(Some(&first), &same, ts(1010)));
        assert!(needs_write(Some(&first), &same, ts(1000 + 300)));
        let plan2 = Plan {
            candidates: vec![candidate("a", 1), candidate("b", 0)],
            ..Plan::default()
        };
        let mut f = facts(&plan2, &sel, &[], &none);
        f.previous = Some(&first);
        assert!(needs_write(Some(&first), &build(&f), ts(1010)));
    }
}
