//! PodDisruptionBudgets into [`PdbInfo`]: the selector and the disruptions allowed now (the
//! status when the disruption controller has observed the budget, else computed from the pods).
//! A status older than the budget's generation is not trusted: the API server refuses every
//! eviction until the disruption controller catches up, so the allowance is computed instead.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::SnapshotError;
use super::selectors::selector_from;
use crate::cluster::types::{NodeId, PdbInfo, PodInfo, SchedClass};

/// The pods and classes a budget is evaluated against, with where each pod is placed.
pub(super) struct PodsView<'a> {
    pub pods: &'a [PodInfo],
    pub classes: &'a [SchedClass],
    pub placement: &'a [Option<NodeId>],
}

/// The budgets that select something (a budget without a selector selects nothing).
pub(super) fn pdb_infos(
    pdbs: &[PodDisruptionBudget],
    view: &PodsView,
) -> Result<Vec<PdbInfo>, SnapshotError> {
    let mut out = Vec::new();
    for pdb in pdbs {
        let Some(parsed) = parse_pdb(pdb)? else {
            continue;
        };
        let (expected, healthy) = if parsed.rule.is_some() {
            count_pods(&parsed.info, view)
        } else {
            (0, 0)
        };
        out.push(parsed.with_counts(expected, healthy));
    }
    Ok(out)
}

/// How many pods a budget must keep when its status cannot be trusted.
#[derive(Clone, Debug, PartialEq)]
pub enum PdbRule {
    MinAvailable(IntOrString),
    MaxUnavailable(IntOrString),
    /// Neither set: no disruptions.
    All,
}

/// A budget as its object says, before its pods are counted: the status's figures when the
/// disruption controller has observed it (`rule` None), else the rule to compute them by.
#[derive(Clone, Debug)]
pub struct ParsedPdb {
    pub info: PdbInfo,
    pub rule: Option<PdbRule>,
}

impl ParsedPdb {
    /// The budget given the pods it selects: `expected` (not finished) and `healthy` (ready
    /// and placed, among them). Ignored when the status is trusted.
    pub fn with_counts(&self, expected: i64, healthy: i64) -> PdbInfo {
        let mut info = self.info.clone();
        if let Some(rule) = &self.rule {
            let (desired, allowed) = rule.allowance(expected, healthy);
            info.desired_healthy = desired;
            info.disruptions_allowed = allowed;
        }
        info
    }
}

impl PdbRule {
    /// The healthy pods the budget must keep, and the healthy selected pods beyond that (never
    /// negative). A rule that is not a number or percentage was refused by [`parse_pdb`].
    pub fn allowance(&self, expected: i64, healthy: i64) -> (i64, i64) {
        let desired = match self {
            PdbRule::MinAvailable(min) => int_or_percent(min, expected, true),
            PdbRule::MaxUnavailable(max) => {
                int_or_percent(max, expected, true).map(|m| expected - m)
            }
            PdbRule::All => Some(expected),
        }
        .unwrap_or(expected);
        (desired, (healthy - desired).max(0))
    }
}

/// Parses a budget (`None` when it has no selector: it selects nothing).
pub fn parse_pdb(pdb: &PodDisruptionBudget) -> Result<Option<ParsedPdb>, SnapshotError> {
    let ns = pdb.metadata.namespace.clone().unwrap_or_default();
    let name = pdb.metadata.name.clone().unwrap_or_default();
    let object = format!("{ns}/{name}");
    let selector = match pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        Some(s) => selector_from(s, "PodDisruptionBudget", &object)?,
        None => return Ok(None),
    };
    let generation = pdb.metadata.generation.unwrap_or(0);
    let observed = pdb
        .status
        .as_ref()
        .filter(|s| s.observed_generation.is_some_and(|g| g >= generation));
    let mut info = PdbInfo {
        namespace: ns,
        name,
        selector,
        disruptions_allowed: 0,
        desired_healthy: 0,
        disrupted: BTreeSet::new(),
    };
    let rule = match observed {
        Some(s) => {
            info.desired_healthy = i64::from(s.desired_healthy);
            info.disruptions_allowed = i64::from(s.disruptions_allowed);
            info.disrupted = s
                .disrupted_pods
                .iter()
                .flat_map(|m| m.keys().cloned())
                .collect();
            None
        }
        None => {
            let spec = pdb.spec.as_ref();
            let rule = if let Some(min) = spec.and_then(|s| s.min_available.as_ref()) {
                PdbRule::MinAvailable(min.clone())
            } else if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
                PdbRule::MaxUnavailable(max.clone())
            } else {
                PdbRule::All
            };
            if let PdbRule::MinAvailable(v) | PdbRule::MaxUnavailable(v) = &rule
                && int_or_percent(v, 0, true).is_none()
            {
                return Err(SnapshotError::Invalid {
                    kind: "PodDisruptionBudget",
                    object,
                    why: "minAvailable/maxUnavailable is neither a number nor a percentage".into(),
                });
            }
            Some(rule)
        }
    };
    Ok(Some(ParsedPdb { info, rule }))
}

/// Whether the budget counts the pod (same namespace, not finished, selected), and whether it
/// is healthy (ready and placed).
pub fn counted(pdb: &PdbInfo, pod: &PodInfo, labels: &BTreeMap<String, String>) -> bool {
    pod.namespace == pdb.namespace && !pod.terminal && pdb.selector.matches(labels)
}

/// The pods the budget counts, and the healthy ones among them.
fn count_pods(pdb: &PdbInfo, view: &PodsView) -> (i64, i64) {
    let (mut expected, mut healthy) = (0i64, 0i64);
    for (i, p) in view.pods.iter().enumerate() {
        if counted(pdb, p, &view.classes[p.class as usize].req.labels) {
            expected += 1;
            if p.ready && view.placement[i].is_some() {
                healthy += 1;
            }
        }
    }
    (expected, healthy)
}

fn int_or_percent(v: &IntOrString, total: i64, round_up: bool) -> Option<i64> {
    match v {
        IntOrString::Int(i) => Some(i64::from(*i)),
        IntOrString::String(s) => {
            let p: i64 = s.strip_suffix('%')?.trim().parse().ok()?;
            Some(if round_up {
                (p * total + 99) / 100
            } else {
                p * total / 100
            })
        }
    }
}
