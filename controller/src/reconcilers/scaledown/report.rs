//! The report phase of a policy's loop: its status (server-side apply, only on change), Events
//! on transitions since the last loop, and its gauges.

use std::collections::BTreeMap;

use ebb_api::names::FIELD_MANAGER_CONTROLLER;
use ebb_api::reasons::{DegradedReason, ThrottledReason, UnremovableReason};
use ebb_api::{ScaleDownPolicy, ScaleDownPolicyStatus};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::json;

use super::context::{Context, PolicyMemory};
use super::error::Error;
use super::events::{self, Facts};
use super::observe::Observed;
use super::plan_phase::Planned;
use super::status::{self, LoopFacts};
use crate::actuation::Drain;
use crate::metrics::{PolicyLabels, PolicyReasonLabels};
use crate::scaledown::budgets::Selection;

/// Builds the status and writes it (server-side apply) when it changed.
pub async fn write_status(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    observed: &Observed,
    planned: &Planned,
    t0: std::time::Instant,
) -> Result<ScaleDownPolicyStatus, Error> {
    // Drains read now (this loop's new ones are listed at once) with the removals since the
    // loop observed: a drain that ended meanwhile is counted here instead of listed (the next
    // loop takes it and adds it to the total, so the written count never goes back).
    let (drains, removed_since) = ctx
        .actuator
        .tracker()
        .draining_and_removed_since(&observed.name);
    let last = memory.last_written.as_ref().or(policy.status.as_ref());
    let replacements = (policy.spec.mode != ebb_api::ScaleDownMode::DryRun).then(|| {
        let (tally, waiting) = ctx.steering.tally(&observed.name);
        let availability = ctx.steering_availability.borrow().clone();
        // Registered is not enough: the API server must really call the webhook.
        let off = match availability {
            crate::admission::SteeringAvailability::Enabled => ctx.steering.unreached(),
            crate::admission::SteeringAvailability::Disabled { reason } => Some(reason),
        };
        status::replacements(&tally, waiting, off.as_deref().map_or(Ok(()), Err))
    });
    let next = status::build(&LoopFacts {
        generation: policy.metadata.generation,
        now: observed.now,
        mode: policy.spec.mode,
        nodes_selected: observed.mine.len(),
        plan: planned.plan.as_ref(),
        selection: planned.selection.as_ref(),
        drains: &drains,
        overlapping: &observed.overlaps,
        degraded: observed.degraded.as_ref(),
        removed_total: observed.removed + removed_since,
        evictions_refused_total: observed.refused,
        loop_duration: t0.elapsed(),
        previous: last,
        replacements,
    });
    if status::needs_write(last, &next, observed.now) {
        apply_status(&ctx.client, &observed.name, &next)
            .await
            .map_err(|source| Error::Status {
                policy: observed.name.clone(),
                source,
            })?;
        memory.last_written = Some(next.clone());
    }
    // Written, or already there: a drain listed here may now remove its node (a process started
    // after that counts the removal from this list).
    ctx.actuator
        .tracker()
        .mark_recorded(next.draining_nodes.iter().map(|d| d.node.as_str()));
    Ok(next)
}

/// Server-side apply of the whole status (field manager `ebb-controller`).
pub async fn apply_status(
    client: &kube::Client,
    name: &str,
    status: &ScaleDownPolicyStatus,
) -> Result<(), kube::Error> {
    let api: Api<ScaleDownPolicy> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Events on transitions since the last loop's facts.
pub async fn publish_events(
    policy: &ScaleDownPolicy,
    ctx: &Context,
    memory: &mut PolicyMemory,
    observed: &Observed,
    planned: &Planned,
) {
    ctx.actuator.refresh_pacing();
    let drains: Vec<Drain> = ctx.actuator.tracker().draining(Some(&observed.name));
    let facts = Facts {
        candidates: planned.candidates.clone(),
        draining: drains.iter().map(|d| d.node.clone()).collect(),
        blocked: drains
            .iter()
            .filter(|d| d.evictions_blocked > 0)
            .map(|d| d.node.clone())
            .collect(),
        removals: drains
            .iter()
            .filter_map(|d| {
                let r = d.removal.as_ref().filter(|r| r.handed_off.is_some())?;
                Some((d.node.clone(), events::RemovalFact::of(r)))
            })
            .collect(),
        throttled: if observed.stopped {
            None
        } else {
            status::main_throttle(planned.selection.as_ref())
        },
        degraded: observed
            .degraded
            .as_ref()
            .map(|d| (d.reason, d.message.clone())),
        fallbacks: ctx
            .steering
            .tally(&observed.name)
            .0
            .fell_back
            .iter()
            .map(|(r, n)| (r.as_str().to_string(), *n as i64))
            .collect(),
    };
    let planned_events =
        events::transitions(&observed.name, &memory.facts, &facts, &observed.finished);
    if !planned_events.is_empty() {
        let uids: BTreeMap<String, String> = observed
            .nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.uid.clone()?)))
            .collect();
        let policy_ref = policy.object_ref(&());
        events::publish(&ctx.recorder, &policy_ref, &planned_events, &uids).await;
    }
    memory.facts = facts;
}

/// The policy's gauges: candidates, drains in progress, throttled and unremovable nodes by reason,
/// and the reason of its Degraded condition (1 for it, 0 for every other reason).
pub fn update_metrics(
    ctx: &Context,
    policy: &str,
    s: &ScaleDownPolicyStatus,
    selection: Option<&Selection>,
) {
    let labels = |reason: String| PolicyReasonLabels {
        policy: policy.to_string(),
        reason,
    };
    for reason in ThrottledReason::ALL {
        let n = selection.map_or(0, |sel| {
            sel.throttled.iter().filter(|(_, r)| r == reason).count()
        });
        let gauge = ctx
            .metrics
            .throttled
            .get_or_create(&labels(reason.to_string()));
        gauge.set(n as i64);
    }
    let p = PolicyLabels {
        policy: policy.to_string(),
    };
    let m = &ctx.metrics;
    m.unneeded_nodes
        .get_or_create(&p)
        .set(i64::from(s.candidates));
    m.drains_in_progress
        .get_or_create(&p)
        .set(i64::from(s.draining));
    let cost = s.cost.clone().unwrap_or_default();
    m.cost_removed_per_hour
        .get_or_create(&p)
        .set(cost.removed_per_hour);
    m.cost_kept_per_hour
        .get_or_create(&p)
        .set(cost.kept_per_hour);
    for reason in UnremovableReason::ALL {
        let count = s
            .unremovable
            .iter()
            .find(|r| r.reason == *reason)
            .map_or(0, |r| r.count);
        let gauge = m
            .unremovable_nodes
            .get_or_create(&labels(reason.to_string()));
        gauge.set(i64::from(count));
    }
    for (reason, value) in degraded_gauge(s) {
        let gauge = m.degraded.get_or_create(&labels(reason.to_string()));
        gauge.set(value);
    }
}

/// `ebb_policy_degraded` of a status: 1 for the reason its Degraded condition is True with, 0 for
/// every other reason (all 0 when it is not Degraded).
fn degraded_gauge(s: &ScaleDownPolicyStatus) -> Vec<(DegradedReason, i64)> {
    let degraded = s
        .conditions
        .iter()
        .find(|c| c.type_ == ebb_api::conditions::DEGRADED && c.status == "True")
        .map(|c| c.reason.as_str());
    DegradedReason::ALL
        .iter()
        .map(|r| (*r, i64::from(degraded == Some(r.as_str()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_with(degraded: Option<(bool, DegradedReason)>) -> ScaleDownPolicyStatus {
        let mut s = ScaleDownPolicyStatus::default();
        if let Some((on, reason)) = degraded {
            s.conditions.push(ebb_api::conditions::condition(
                ebb_api::conditions::DEGRADED,
                on,
                reason.as_str(),
                "m",
                None,
                jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        s
    }

    fn ones(s: &ScaleDownPolicyStatus) -> Vec<DegradedReason> {
        let gauge = degraded_gauge(s);
        assert_eq!(
            gauge.len(),
            DegradedReason::ALL.len(),
            "every reason has a value"
        );
        gauge
            .into_iter()
            .filter(|(_, v)| *v == 1)
            .map(|(r, _)| r)
            .collect()
    }

    #[test]
    fn degraded_gauge_is_one_for_the_true_conditions_reason_only() {
        let reason = DegradedReason::SelectorMatchesNothing;
        assert_eq!(ones(&status_with(Some((true, reason)))), vec![reason]);
        assert_eq!(ones(&status_with(Some((false, reason)))), vec![]);
        assert_eq!(ones(&status_with(None)), vec![]);
    }
}
