//! StartDeletion limits: which removable nodes start now. Empty nodes up to
//! `maxScaleDownParallelism`, drains up to `maxDrainParallelism`, group minimum sizes,
//! time-windowed budgets (cron + duration, most restrictive active one wins, invalid → closed)
//! and the PodDisruptionBudgets' remaining disruptions.

use std::collections::BTreeMap;
use std::str::FromStr;

use ebb_api::reasons::{ThrottledReason, UnremovableReason};
use ebb_api::scaledown::Budget;

use super::pdb::{Needs, PdbPacing};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// How many nodes a budget allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetNodes {
    Count(i64),
    /// Percent of the selected nodes, rounded down.
    Percent(i64),
}

/// A parsed budget.
#[derive(Clone, Debug)]
pub struct ParsedBudget {
    pub nodes: BudgetNodes,
    /// Cron schedule and window length; `None`: always active.
    pub window: Option<(croner::Cron, jiff::SignedDuration)>,
}

/// The policy's budgets, or why they cannot be used (then every deletion is held).
#[derive(Clone, Debug)]
pub enum Budgets {
    Valid(Vec<ParsedBudget>),
    Invalid(String),
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets::Valid(Vec::new())
    }
}

/// Parses the budgets of a policy; the first invalid one makes the whole set invalid.
pub fn parse_budgets(budgets: &[Budget]) -> Budgets {
    let mut out = Vec::new();
    for (i, b) in budgets.iter().enumerate() {
        let nodes = match b.nodes.strip_suffix('%') {
            Some(p) => p
                .parse()
                .ok()
                .filter(|p| (0..=100).contains(p))
                .map(BudgetNodes::Percent),
            None => b
                .nodes
                .parse()
                .ok()
                .filter(|n| *n >= 0)
                .map(BudgetNodes::Count),
        };
        let Some(nodes) = nodes else {
            return Budgets::Invalid(format!(
                "budgets[{i}].nodes `{}` is neither a count nor a percentage",
                b.nodes
            ));
        };
        let window = match (&b.schedule, &b.duration) {
            (None, None) => None,
            (Some(s), Some(d)) => match croner::Cron::from_str(s) {
                Ok(c) => Some((c, d.as_span())),
                Err(e) => {
                    return Budgets::Invalid(format!("budgets[{i}].schedule `{s}`: {e}"));
                }
            },
            _ => {
                return Budgets::Invalid(format!(
                    "budgets[{i}]: schedule and duration must be set together"
                ));
            }
        };
        out.push(ParsedBudget { nodes, window });
    }
    Budgets::Valid(out)
}

impl Budgets {
    /// Most nodes that may be disrupted at once at `now` (`None`: no budget limits), given the
    /// number of nodes the policy selects. Invalid budgets allow nothing.
    pub fn allowed(&self, now: Timestamp, selected_nodes: usize) -> Option<i64> {
        let list = match self {
            Budgets::Invalid(_) => return Some(0),
            Budgets::Valid(l) => l,
        };
        let zoned = now.to_zoned(TimeZone::UTC);
        let mut min: Option<i64> = None;
        for b in list {
            let active = match &b.window {
                None => true,
                Some((cron, duration)) => match cron.find_previous_occurrence(&zoned, true) {
                    Ok(start) => start
                        .timestamp()
                        .saturating_add(*duration)
                        .is_ok_and(|end| now < end),
                    Err(_) => return Some(0), // cannot evaluate: fail closed
                },
            };
            if !active {
                continue;
            }
            let n = match b.nodes {
                BudgetNodes::Count(c) => c,
                BudgetNodes::Percent(p) => p * selected_nodes as i64 / 100,
            };
            min = Some(min.map_or(n, |m: i64| m.min(n)));
        }
        min
    }
}

/// A removable node as the selection sees it.
#[derive(Clone, Debug)]
pub struct Removable {
    pub node: String,
    pub empty: bool,
    pub ready: bool,
    /// When it entered the candidate set.
    pub since: Timestamp,
    /// Node group (value of `nodeGroupLabel`, or the machine's MachineDeployment or NodePool).
    pub group: Option<String>,
    /// Fewest nodes the group keeps ([`Limits::group_min`]).
    pub group_min: i64,
    /// Disruptions its drain needs, per PodDisruptionBudget.
    pub needs: Needs,
    /// Hourly cost saved per pod its drain evicts, when its price is known.
    pub saving: Option<f64>,
}

/// Limits that apply to one selection.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_scale_down_parallelism: i64,
    pub max_drain_parallelism: i64,
    pub unneeded_time: jiff::SignedDuration,
    pub unready_time: jiff::SignedDuration,
    pub min_nodes_per_group: i64,
    /// Honour a Cluster API node group's `cluster-api-autoscaler-node-group-min-size` too
    /// (off for the re-check of a drain, whose group minimum was checked when it started).
    pub annotated_group_min: bool,
}

impl Limits {
    /// Fewest nodes a group keeps: `minNodesPerGroup`, or the group's own minimum size
    /// annotation when larger.
    pub fn group_min(&self, annotated: Option<i64>) -> i64 {
        match annotated {
            Some(m) if self.annotated_group_min => self.min_nodes_per_group.max(m),
            _ => self.min_nodes_per_group,
        }
    }
}

/// Deletions already in flight.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    pub empty: i64,
    pub drains: i64,
    /// Per node group, both kinds.
    pub per_group: BTreeMap<Option<String>, i64>,
    /// What the PodDisruptionBudgets allow beyond what the drains in flight still need.
    pub pdbs: PdbPacing,
}

/// What StartDeletion does this loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    pub empty: Vec<String>,
    pub drain: Vec<String>,
    pub throttled: Vec<(String, ThrottledReason)>,
    /// Removable, but not for long enough yet.
    pub waiting: Vec<(String, UnremovableReason)>,
    /// Throttled by `WaitingForDisruptionBudget`: node → the budget (`namespace/name`).
    pub held_by_pdb: BTreeMap<String, String>,
    /// The earliest moment a waiting node will have been removable long enough.
    pub next_due: Option<Timestamp>,
}

/// Picks the nodes to start deleting: empty nodes first, each kind in the order given; when
/// any node's saving is known, the largest saving first (ties as without).
/// `group_sizes`: governed nodes per group; `selected`: nodes the policy selects (for percent
/// budgets); `ignore_unneeded_time`: treat every node as removable for long enough.
#[allow(clippy::too_many_arguments)]
pub fn select(
    removable: &[Removable],
    in_flight: &InFlight,
    limits: &Limits,
    budgets: &Budgets,
    now: Timestamp,
    group_sizes: &BTreeMap<Option<String>, i64>,
    selected: usize,
    ignore_unneeded_time: bool,
) -> Selection {
    let mut sel = Selection::default();
    let total_in_flight = in_flight.empty + in_flight.drains;
    let budget = budgets.allowed(now, selected);
    let mut per_group = in_flight.per_group.clone();
    let mut started = 0i64;
    let mut drains = 0i64;
    let mut pdbs = in_flight.pdbs.clone();
    let mut ordered: Vec<&Removable> = removable
        .iter()
        .filter(|r| r.empty)
        .chain(removable.iter().filter(|r| !r.empty))
        .collect();
    if ordered.iter().any(|r| r.saving.is_some()) {
        ordered.sort_by(|a, b| super::pricing::by_saving(a.saving, b.saving));
    }
    for r in ordered {
        if !ignore_unneeded_time {
            let (need, reason) = if r.ready {
                (
                    limits.unneeded_time,
                    UnremovableReason::NotUnneededLongEnough,
                )
            } else {
                (limits.unready_time, UnremovableReason::NotUnreadyLongEnough)
            };
            if now.duration_since(r.since) < need {
                sel.waiting.push((r.node.clone(), reason));
                if let Ok(due) = r.since.checked_add(need) {
                    sel.next_due = Some(sel.next_due.map_or(due, |d| d.min(due)));
                }
                continue;
            }
        }
        let in_group = per_group.get(&r.group).copied().unwrap_or(0);
        let size = group_sizes.get(&r.group).copied().unwrap_or(0);
        let reason = if budget.is_some_and(|b| total_in_flight + started >= b) {
            Some(ThrottledReason::Budget)
        } else if total_in_flight + started >= limits.max_scale_down_parallelism {
            Some(ThrottledReason::MaxScaleDownParallelism)
        } else if !r.empty && in_flight.drains + drains >= limits.max_drain_parallelism {
            Some(ThrottledReason::MaxDrainParallelism)
        } else if size - in_group - 1 < r.group_min {
            Some(ThrottledReason::NodeGroupMinSize)
        } else if let Some(pdb) = pdbs.holds(&r.needs) {
            sel.held_by_pdb
                .insert(r.node.clone(), pdbs.names[pdb].clone());
            Some(ThrottledReason::WaitingForDisruptionBudget)
        } else {
            None
        };
        if let Some(reason) = reason {
            sel.throttled.push((r.node.clone(), reason));
            continue;
        }
        started += 1;
        pdbs.take(&r.needs);
        *per_group.entry(r.group.clone()).or_insert(0) += 1;
        if r.empty {
            sel.empty.push(r.node.clone());
        } else {
            drains += 1;
            sel.drain.push(r.node.clone());
        }
    }
    sel
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removable(name: &str, empty: bool) -> Removable {
        Removable {
            node: name.into(),
            empty,
            ready: true,
            since: "2026-01-01T00:00:00Z".parse().unwrap(),
            group: None,
            group_min: 0,
            needs: Needs::new(),
            saving: None,
        }
    }

    fn limits(total: i64, drain: i64) -> Limits {
        Limits {
            max_scale_down_parallelism: total,
            max_drain_parallelism: drain,
            unneeded_time: jiff::SignedDuration::from_mins(10),
            unready_time: jiff::SignedDuration::from_mins(20),
            min_nodes_per_group: 0,
            annotated_group_min: true,
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn run(r: &[Removable], inf: &InFlight, l: &Limits, b: &Budgets, now: &str) -> Selection {
        let sizes = BTreeMap::from([(None, 100)]);
        select(r, inf, l, b, at(now), &sizes, 100, false)
    }

    const LATER: &str = "2026-01-01T01:00:00Z";

    #[test]
    fn empty_first_then_drains_within_both_limits() {
        let r = [
            removable("d1", false),
            removable("d2", false),
            removable("e1", true),
            removable("e2", true),
        ];
        let s = run(
            &r,
            &InFlight::default(),
            &limits(3, 1),
            &Budgets::default(),
            LATER,
        );
        assert_eq!(s.empty, ["e1", "e2"]);
        assert_eq!(s.drain, ["d1"]);
        assert_eq!(
            s.throttled,
            [("d2".to_string(), ThrottledReason::MaxScaleDownParallelism)]
        );
        // Drains in flight use up the drain limit but leave room for empty nodes.
        let inf = InFlight {
            drains: 1,
            ..Default::default()
        };
        let s = run(&r, &inf, &limits(10, 1), &Budgets::default(), LATER);
        assert_eq!(s.empty, ["e1", "e2"]);
        assert!(s.drain.is_empty());
        assert_eq!(s.throttled.len(), 2);
        assert!(
            s.throttled
                .iter()
                .all(|(_, r)| *r == ThrottledReason::MaxDrainParallelism)
        );
    }

    #[test]
    fn waits_for_unneeded_time_and_unready_time() {
        let mut unready = removable("u", false);
        unready.ready = false;
        let r = [removable("n", false), unready];
        let s = run(
            &r,
            &InFlight::default(),
            &limits(10, 10),
            &Budgets::default(),
            "2026-01-01T00:15:00Z",
        );
        assert_eq!(s.drain, ["n"]);
        assert_eq!(
            s.waiting,
            [("u".to_string(), UnremovableReason::NotUnreadyLongEnough)]
        );
        let s = run(
            &r,
            &InFlight::default(),
            &limits(10, 10),
            &Budgets::default(),
            "2026-01-01T00:05:00Z",
        );
        assert_eq!(s.waiting.len(), 2);
        assert_eq!(s.waiting[0].1, UnremovableReason::NotUnneededLongEnough);
    }

    #[test]
    fn group_minimum_counts_deletions_in_flight() {
        let mut a = removable("a", true);
        a.group = Some("pool".into());
        a.group_min = 2;
        let mut b = a.clone();
        b.node = "b".into();
        let sizes = BTreeMap::from([(Some("pool".to_string()), 4)]);
        let l = limits(10, 10);
        let inf = InFlight {
            empty: 1,
            per_group: BTreeMap::from([(Some("pool".to_string()), 1)]),
            ..Default::default()
        };
        let s = select(
            &[a, b],
            &inf,
            &l,
            &Budgets::default(),
            at(LATER),
            &sizes,
            4,
            false,
        );
        assert_eq!(s.empty, ["a"]);
        assert_eq!(
            s.throttled,
            [("b".to_string(), ThrottledReason::NodeGroupMinSize)]
        );
    }

    fn budget(nodes: &str, schedule: Option<&str>, duration: Option<&str>) -> Budget {
        Budget {
            nodes: nodes.into(),
            schedule: schedule.map(String::from),
            duration: duration.map(|d| d.parse().unwrap()),
        }
    }

    #[test]
    fn budgets_most_restrictive_active_wins() {
        // Always 10% of 100 = 10; during 09:00-10:00 UTC on weekdays, 1.
        let b = parse_budgets(&[
            budget("10%", None, None),
            budget("1", Some("0 9 * * 1-5"), Some("1h")),
        ]);
        // 2026-01-05 is a Monday.
        assert_eq!(b.allowed(at("2026-01-05T09:30:00Z"), 100), Some(1));
        assert_eq!(b.allowed(at("2026-01-05T10:00:00Z"), 100), Some(10));
        assert_eq!(
            b.allowed(at("2026-01-04T09:30:00Z"), 100),
            Some(10),
            "Sunday: window closed"
        );
        assert_eq!(parse_budgets(&[]).allowed(at(LATER), 100), None);
        let r = [removable("a", true), removable("b", true)];
        let inf = InFlight {
            empty: 9,
            ..Default::default()
        };
        let s = run(&r, &inf, &limits(100, 10), &b, "2026-01-05T12:00:00Z");
        assert_eq!(s.empty, ["a"]);
        assert_eq!(s.throttled, [("b".to_string(), ThrottledReason::Budget)]);
    }

    #[test]
    fn invalid_budgets_fail_closed() {
        for b in [
            budget("1", Some("not a cron"), Some("1h")),
            budget("lots", None, None),
            budget("1", Some("0 9 * * *"), None),
        ] {
            let parsed = parse_budgets(&[b]);
            assert!(matches!(parsed, Budgets::Invalid(_)), "{parsed:?}");
            assert_eq!(parsed.allowed(at(LATER), 100), Some(0));
            let s = run(
                &[removable("a", true)],
                &InFlight::default(),
                &limits(10, 10),
                &parsed,
                LATER,
            );
            assert_eq!(s.throttled, [("a".to_string(), ThrottledReason::Budget)]);
        }
    }
}
