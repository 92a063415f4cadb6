//! The escalation step of a pass: pinned pods still unscheduled past their deadline (their
//! node is gone or full) are deleted so their replacements are placed relaxed.

use crate::cluster::CachedPod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, ResourceExt};

use super::events::Notice;
use super::pass::Pass;
use crate::placement::Overdue;

impl Pass<'_> {
    /// Delete the overdue pinned pods, then purge the history of entries past retention.
    pub async fn escalate_overdue(&mut self) {
        for o in self.state.history.overdue(self.now) {
            self.ctx
                .metrics
                .placement_escalations
                .get_or_create(&self.labels)
                .inc();
            self.delete_overdue(&o).await;
        }
        self.state.history.purge(self.now);
    }

    /// Delete one overdue pod (only that UID), with a warning Event.
    async fn delete_overdue(&mut self, o: &Overdue) {
        let ns = self.ph.namespace().unwrap_or_default();
        let api: Api<CachedPod> = Api::namespaced(self.ctx.client.clone(), &ns);
        match api.delete(&o.pod_name, &uid_precondition(&o.uid)).await {
            Ok(_) => {
                tracing::info!(pod = %o.pod_name, node = %o.node, "pinned pod still pending past its deadline; deleted")
            }
            Err(e) => {
                tracing::warn!(pod = %o.pod_name, error = %e, "could not delete an overdue pinned pod")
            }
        }
        self.notices.push(
            Notice::ph(
                self.ph,
                true,
                "PlacementEscalated",
                format!(
                    "pod {} was pinned to {} but not scheduled before its deadline ({}); deleted, its replacement is placed relaxed",
                    o.pod_name, o.node, o.reason
                ),
            )
            .about_pod(&ns, &o.pod_name),
        );
    }
}

/// Delete parameters that only delete the pod with this UID.
fn uid_precondition(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}
