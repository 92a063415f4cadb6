//! The documented output of `ebb-controller plan`: a stable JSON document (fields in a fixed
//! order) and an aligned table for people.

use ebb_api::reasons::ThrottledReason;
use serde::Serialize;

use crate::scaledown::Plan;
use crate::scaledown::budgets::Selection;

/// `{"pod": "ns/name", "to": "node"}`
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct MoveOut {
    pub pod: String,
    pub to: String,
}

/// A node of the candidate set.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CandidateOut {
    pub node: String,
    pub empty: bool,
    /// Its hourly cost, when known (`prices`, or the `ebb.dev/hourly-cost` annotation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hourly_cost: Option<f64>,
    pub moves: Vec<MoveOut>,
    /// The limit that holds this candidate back now (`ebb_api::reasons::ThrottledReason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled: Option<String>,
    /// For `WaitingForDisruptionBudget`: the PodDisruptionBudget (`namespace/name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdb: Option<String>,
    /// Why this candidate is not deleted yet although it is removable (its unneeded or unready
    /// time is still running: `ebb_api::reasons::UnremovableReason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// Nodes whose deletion would start now.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ToDeleteOut {
    pub empty: Vec<String>,
    pub drain: Vec<String>,
}

/// A node that stays, and why.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UnremovableOut {
    pub node: String,
    pub reason: String,
    /// The pod that blocks the node (`ns/name`), when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Why that pod blocks it (`NotReplicated`, `LocalStorage`, ...: `BlockingPodReason`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_reason: Option<String>,
    /// What else names the cause (the volume that pins a pod, the pods on their way).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Figures of the simulation.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SimulationOut {
    pub duration_ms: u64,
    pub nodes_evaluated: usize,
    pub timed_out: bool,
}

/// Hourly cost removed (the candidate set) and kept (the other governed nodes, those being
/// deleted aside), where prices are known.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CostOut {
    pub removed_per_hour: f64,
    pub kept_per_hour: f64,
    pub unpriced_nodes: usize,
    /// Nodes whose `ebb.dev/hourly-cost` annotation is not a number of at least 0 (ignored).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub invalid_cost_annotations: Vec<String>,
}

/// The whole document.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlanOut {
    pub candidates: Vec<CandidateOut>,
    pub to_delete: ToDeleteOut,
    pub unremovable: Vec<UnremovableOut>,
    pub throttled: bool,
    pub simulation: SimulationOut,
    /// Only when some governed node has a known price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostOut>,
}

impl PlanOut {
    pub fn new(plan: &Plan, sel: &Selection) -> Self {
        PlanOut {
            candidates: plan
                .candidates
                .iter()
                .map(|c| CandidateOut {
                    node: c.node.clone(),
                    empty: c.empty,
                    hourly_cost: c.hourly_cost,
                    moves: c
                        .moves
                        .iter()
                        .map(|m| MoveOut {
                            pod: m.pod.to_string(),
                            to: m.to.to_string(),
                        })
                        .collect(),
                    throttled: sel
                        .throttled
                        .iter()
                        .find(|(n, _)| n == &c.node)
                        .map(|(_, r)| r.to_string()),
                    pdb: sel.held_by_pdb.get(&c.node).cloned(),
                    waiting: sel
                        .waiting
                        .iter()
                        .find(|(n, _)| n == &c.node)
                        .map(|(_, r)| r.to_string()),
                })
                .collect(),
            to_delete: ToDeleteOut {
                empty: sel.empty.clone(),
                drain: sel.drain.clone(),
            },
            unremovable: plan
                .unremovable
                .iter()
                .map(|u| UnremovableOut {
                    node: u.node.clone(),
                    reason: u.reason.to_string(),
                    pod: u.pod.clone(),
                    pod_reason: u.pod_reason.map(|r| r.to_string()),
                    message: u.detail.clone(),
                })
                .collect(),
            throttled: !sel.throttled.is_empty(),
            simulation: SimulationOut {
                duration_ms: plan.simulation.duration.as_millis() as u64,
                nodes_evaluated: plan.simulation.nodes_evaluated,
                timed_out: plan.simulation.timed_out,
            },
            cost: plan.cost.as_ref().map(|c| CostOut {
                removed_per_hour: c.removed_per_hour,
                kept_per_hour: c.kept_per_hour,
                unpriced_nodes: c.unpriced,
                invalid_cost_annotations: c.invalid_annotations.clone(),
            }),
        }
    }
}

/// The table: one line per governed node, then the simulation figures.
pub fn table(plan: &Plan, sel: &Selection) -> String {
    let mut rows: Vec<[String; 3]> = vec![["NODE".into(), "DECISION".into(), "DETAIL".into()]];
    for c in &plan.candidates {
        let (decision, detail) = if sel.empty.contains(&c.node) {
            ("delete".to_string(), "empty".to_string())
        } else if sel.drain.contains(&c.node) {
            let mut dests: Vec<&str> = c.moves.iter().map(|m| &*m.to).collect();
            dests.sort();
            dests.dedup();
            (
                "drain".to_string(),
                format!("{} pods → {}", c.moves.len(), dests.join(", ")),
            )
        } else if let Some(pdb) = sel.held_by_pdb.get(&c.node) {
            (
                "candidate".to_string(),
                format!(
                    "throttled: {} ({pdb})",
                    ThrottledReason::WaitingForDisruptionBudget
                ),
            )
        } else if let Some((_, r)) = sel.throttled.iter().find(|(n, _)| n == &c.node) {
            ("candidate".to_string(), format!("throttled: {r}"))
        } else if let Some((_, r)) = sel.waiting.iter().find(|(n, _)| n == &c.node) {
            ("candidate".to_string(), r.to_string())
        } else {
            ("candidate".to_string(), String::new())
        };
        rows.push([c.node.clone(), decision, detail]);
    }
    for u in &plan.unremovable {
        let mut detail = match (&u.pod, u.pod_reason) {
            (Some(p), Some(r)) => format!("{} {p} ({r})", u.reason),
            (Some(p), None) => format!("{} {p}", u.reason),
            _ => u.reason.to_string(),
        };
        if let Some(m) = &u.detail {
            detail.push_str(": ");
            detail.push_str(m);
        }
        rows.push([u.node.clone(), "keep".into(), detail]);
    }
    let w0 = rows.iter().map(|r| r[0].chars().count()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r[1].chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for r in &rows {
        let line = format!("{:w0$}  {:w1$}  {}", r[0], r[1], r[2]);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "\n{} candidates ({} empty, {} to drain now), {} kept; simulation {} ms, {} nodes evaluated{}{}\n",
        plan.candidates.len(),
        sel.empty.len(),
        sel.drain.len(),
        plan.unremovable.len(),
        plan.simulation.duration.as_millis(),
        plan.simulation.nodes_evaluated,
        if plan.simulation.timed_out { ", timed out" } else { "" },
        if sel.throttled.is_empty() { "" } else { "; throttled" },
    ));
    if let Some(c) = &plan.cost {
        out.push_str(&format!(
            "hourly cost: {:.2} removed, {:.2} kept{}\n",
            c.removed_per_hour,
            c.kept_per_hour,
            if c.unpriced > 0 {
                format!(" ({} nodes unpriced)", c.unpriced)
            } else {
                String::new()
            },
        ));
        if !c.invalid_annotations.is_empty() {
            out.push_str(&format!(
                "ebb.dev/hourly-cost is not a number of at least 0 on {} (ignored)\n",
                c.invalid_annotations.join(", ")
            ));
        }
    }
    out
}
