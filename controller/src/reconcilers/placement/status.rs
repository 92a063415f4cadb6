//! The PlacementHistory status a pass writes: the history's figures with the Ready condition,
//! whether they changed since the last write, and the server-side apply that writes them.

use ebb_api::conditions::{READY, condition, find, set_condition};
use ebb_api::names::FIELD_MANAGER_CONTROLLER;
use ebb_api::placement::{PlacementHistory, PlacementHistoryStatus};
use jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::placement::RoleHistory;

/// The status of `ph` with `history` written into it and Ready `Placing` (clears the
/// history's dirty flag).
pub fn placing(
    ph: &PlacementHistory,
    history: &mut RoleHistory,
    now: Timestamp,
) -> PlacementHistoryStatus {
    let mut status = ph.status.clone().unwrap_or_default();
    history.write_status(&mut status, now);
    status.observed_generation = ph.metadata.generation;
    set_condition(
        &mut status.conditions,
        condition(
            READY,
            true,
            "Placing",
            format!(
                "{} role(s), history on {} node(s), {} pod(s) gated",
                status.role_count, status.node_count, status.gated_pods
            ),
            ph.metadata.generation,
            now,
        ),
    );
    status
}

/// The figures a status shows besides the history entries.
pub fn figures_differ(a: &PlacementHistoryStatus, b: &PlacementHistoryStatus) -> bool {
    a.roles != b.roles
        || a.gated_pods != b.gated_pods
        || a.hit_rate != b.hit_rate
        || a.node_count != b.node_count
        || a.role_count != b.role_count
        || find(&a.conditions, READY).map(|c| (&c.status, &c.message))
            != find(&b.conditions, READY).map(|c| (&c.status, &c.message))
}

/// Server-side apply of the status (field manager `ebb-controller`).
pub async fn write_status(
    client: &kube::Client,
    ph: &PlacementHistory,
    status: &PlacementHistoryStatus,
) -> Result<(), kube::Error> {
    let api: Api<PlacementHistory> =
        Api::namespaced(client.clone(), &ph.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "PlacementHistory",
        "status": status,
    });
    api.patch_status(
        &ph.name_any(),
        &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
