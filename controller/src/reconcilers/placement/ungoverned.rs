//! Gated pods that no valid PlacementHistory governs (none selects them, theirs is invalid, or
//! their role is not in its spec) are released unchanged after a grace period, with an Event.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::CachedPod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::context::Context;
use super::events::Notice;
use super::facts::selected;
use super::patch;
use crate::metrics::{PlacementHistoryLabels, PlacementLabels, Release};

/// True when a valid PlacementHistory of the pod's namespace selects it with a known role.
fn governed(ctx: &Context, pod: &Arc<CachedPod>) -> bool {
    let ns = pod.namespace().unwrap_or_default();
    ctx.valid_in(&ns).iter().any(|ph| {
        selected(ph, std::slice::from_ref(pod)).is_ok_and(|s| {
            s.iter()
                .any(|(_, role)| ph.spec.roles.iter().any(|r| &r.name == role))
        })
    })
}

/// Gated, not bound to a node, not being deleted.
fn waits_at_gate(pod: &CachedPod) -> bool {
    patch::is_gated(pod)
        && pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        && pod.metadata.deletion_timestamp.is_none()
}

/// One sweep; returns how many pods were released.
pub async fn sweep(ctx: &Context) -> usize {
    if !ctx.leadership.is_leader() {
        return 0;
    }
    // The gated pods only (the pod watch keeps them indexed): not a copy of every cached pod
    // every sweep.
    let pods = ctx.stores.pod_index.gated(&ctx.stores.pods);
    let gated: HashSet<String> = pods
        .iter()
        .filter(|p| patch::is_gated(p))
        .filter_map(|p| p.uid())
        .collect();
    ctx.retain_gated(&gated);
    let mut released = 0;
    for pod in pods {
        if !waits_at_gate(&pod) {
            continue;
        }
        let uid = pod.uid().unwrap_or_default();
        let waited = ctx.gated_for(&uid);
        if waited < ctx.settings.grace || governed(ctx, &pod) {
            continue;
        }
        if release(ctx, &pod, uid, waited).await {
            released += 1;
        }
    }
    released
}

/// Remove the gate of an ungoverned pod; returns whether it was released.
async fn release(ctx: &Context, pod: &CachedPod, uid: String, waited: Duration) -> bool {
    let name = pod.name_any();
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<CachedPod> = Api::namespaced(ctx.client.clone(), &ns);
    let body = patch::unchanged(pod);
    if let Err(e) = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        match &e {
            // Released already, or changed since the cache saw it: the next sweep looks again.
            kube::Error::Api(s) if s.code == 409 => {
                tracing::debug!(pod = %name, "ungoverned gated pod changed since the cache saw it");
            }
            _ => {
                tracing::warn!(pod = %name, error = %e, "could not release an ungoverned gated pod")
            }
        }
        return false;
    }
    count_release(ctx, &ns, uid, waited);
    tracing::info!(pod = %format!("{ns}/{name}"), "gated pod governed by no valid PlacementHistory; released unchanged");
    ctx.notify(vec![Notice::pod(
        pod,
        true,
        "PlacementUngoverned",
        format!(
            "no valid PlacementHistory selects this pod with a known role; scheduling gate {} removed without placement",
            ebb_api::names::SCHEDULING_GATE_PLACEMENT
        ),
    )])
    .await;
    true
}

/// The gate wait of a released pod, and the release itself once per pod.
fn count_release(ctx: &Context, ns: &str, uid: String, waited: Duration) {
    let waited = ctx.ungated(&uid, waited);
    let first = ctx
        .released
        .lock()
        .map(|mut r| r.insert(uid))
        .unwrap_or(true);
    if !first {
        return;
    }
    let labels = PlacementHistoryLabels {
        namespace: ns.to_string(),
        placement_history: String::new(),
    };
    ctx.metrics
        .gate_wait
        .get_or_create(&labels)
        .observe(waited.as_secs_f64());
    ctx.metrics
        .placements
        .get_or_create(&PlacementLabels {
            namespace: labels.namespace,
            placement_history: labels.placement_history,
            outcome: Release::ungoverned,
        })
        .inc();
}
