//! PodDisruptionBudgets into [`PdbInfo`]: the selector and the disruptions allowed now (the
//! status when the disruption controller has observed the budget, else computed from the pods).
//! A status older than the budget's generation is not trusted: the API server refuses every
//! eviction until the disruption controller catches up, so the allowance is computed instead.

use std::collections::BTreeSet;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::SnapshotError;
use super::selectors::selector_from;
use crate::cluster::model::{NodeId, PdbInfo, PodInfo, SchedClass, Selector};

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
        let ns = pdb.metadata.namespace.clone().unwrap_or_default();
        let name = pdb.metadata.name.clone().unwrap_or_default();
        let object = format!("{ns}/{name}");
        let selector = match pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) {
            Some(s) => selector_from(s, "PodDisruptionBudget", &object)?,
            None => continue, // selects nothing
        };
        let generation = pdb.metadata.generation.unwrap_or(0);
        let observed = pdb
            .status
            .as_ref()
            .filter(|s| s.observed_generation.is_some_and(|g| g >= generation));
        let (desired_healthy, disruptions_allowed, disrupted) = match observed {
            Some(s) => (
                i64::from(s.desired_healthy),
                i64::from(s.disruptions_allowed),
                s.disrupted_pods
                    .iter()
                    .flat_map(|m| m.keys().cloned())
                    .collect(),
            ),
            None => {
                let (desired, allowed) = computed_allowance(pdb, &ns, &selector, view, &object)?;
                (desired, allowed, BTreeSet::new())
            }
        };
        out.push(PdbInfo {
            namespace: ns,
            name,
            selector,
            disruptions_allowed,
            desired_healthy,
            disrupted,
        });
    }
    Ok(out)
}

/// The healthy pods the budget must keep, and the healthy selected pods beyond that (never
/// negative).
fn computed_allowance(
    pdb: &PodDisruptionBudget,
    ns: &str,
    selector: &Selector,
    view: &PodsView,
    object: &str,
) -> Result<(i64, i64), SnapshotError> {
    let (mut expected, mut healthy) = (0i64, 0i64);
    for (i, p) in view.pods.iter().enumerate() {
        if p.namespace == ns
            && !p.terminal
            && selector.matches(&view.classes[p.class as usize].req.labels)
        {
            expected += 1;
            if p.ready && view.placement[i].is_some() {
                healthy += 1;
            }
        }
    }
    let spec = pdb.spec.as_ref();
    let desired = if let Some(min) = spec.and_then(|s| s.min_available.as_ref()) {
        int_or_percent(min, expected, true)
    } else if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
        int_or_percent(max, expected, true).map(|m| expected - m)
    } else {
        Some(expected) // neither set: no disruptions
    };
    let desired = desired.ok_or_else(|| SnapshotError::Invalid {
        kind: "PodDisruptionBudget",
        object: object.to_string(),
        why: "minAvailable/maxUnavailable is neither a number nor a percentage".into(),
    })?;
    Ok((desired, (healthy - desired).max(0)))
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
