//! Whether a replacement that has not started waits only in the cluster's own queues (the
//! default scheduler's, a kubelet's), where nothing in its tenant's pod spec can keep it.
//!
//! The pacing keeps counting an eviction past its usual longest wait while its replacement waits
//! there: a control plane that stalls (a burst of node heartbeats, an overloaded API server)
//! starts nothing for minutes, which a tenant's stuck replacement cannot be mistaken for. What a
//! tenant can hold a pod in (a scheduling gate, another scheduler, a claim's volume that is never
//! provisioned, an image that never pulls, an init container that never ends, a node that does
//! not exist) is never such a wait.

use crate::cluster::CachedPod;
use crate::cluster::cached_pod::{DEFAULT_SCHEDULER, PodCondition};

/// A pod not started yet that waits for the cluster, not for its tenant: not being deleted,
/// Pending, and either
/// - not bound, for the default scheduler, with no scheduling gate, no volume claim (the
///   scheduler waits up to 10 minutes for a claim's volume to be provisioned, from a storage
///   class the tenant picks, before it says anything) and no failed scheduling attempt
///   (`PodScheduled=False`: unschedulable, gated, a scheduler error), or
/// - bound by the scheduler (`PodScheduled=True`) to a node whose kubelet has not reported it
///   yet (no `Ready` condition, no container that ended): a pod given a `nodeName` that no
///   kubelet serves has no `PodScheduled` condition.
pub fn waits_for_the_cluster(pod: &CachedPod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    if pod.metadata.deletion_timestamp.is_some() || !matches!(pod.phase(), None | Some("Pending")) {
        return false;
    }
    let status = pod.status.as_ref();
    let condition = |type_: &str| -> Option<&PodCondition> {
        status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == type_)
    };
    let scheduled = condition("PodScheduled").map(|c| c.status.as_str());
    match spec.node_name.as_deref() {
        None => {
            spec.scheduler_name
                .as_deref()
                .is_none_or(|s| s == DEFAULT_SCHEDULER)
                && spec.scheduling_gates.as_ref().is_none_or(Vec::is_empty)
                && !spec.volumes.iter().flatten().any(|v| v.claims())
                && scheduled.is_none_or(|s| s == "True")
        }
        Some(_) => {
            let ended = |v: Option<&Vec<_>>| v.is_some_and(|v: &Vec<_>| !v.is_empty());
            scheduled == Some("True")
                && condition("Ready").is_none()
                && !ended(status.and_then(|s| s.container_statuses.as_ref()))
                && !ended(status.and_then(|s| s.init_container_statuses.as_ref()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(spec: Value, status: Value) -> CachedPod {
        let mut p: CachedPod = serde_json::from_value(json!({
            "metadata": {"namespace": "t", "name": "p", "uid": "u"},
            "spec": spec,
            "status": status,
        }))
        .expect("a pod");
        p.trim();
        p
    }

    fn containers() -> Value {
        json!([{"name": "main"}])
    }

    #[test]
    fn a_pod_the_default_scheduler_has_not_got_to_waits_for_the_cluster() {
        let p = pod(
            json!({"containers": containers(), "schedulerName": "default-scheduler"}),
            json!({"phase": "Pending"}),
        );
        assert!(waits_for_the_cluster(&p));
        let no_status = pod(json!({"containers": containers()}), json!(null));
        assert!(waits_for_the_cluster(&no_status));
    }

    #[test]
    fn a_bound_pod_no_kubelet_reported_yet_waits_for_the_cluster() {
        let p = pod(
            json!({"containers": containers(), "nodeName": "n1"}),
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}),
        );
        assert!(waits_for_the_cluster(&p));
    }

    #[test]
    fn what_a_tenant_can_hold_a_pod_in_is_not_the_clusters_queue() {
        let pending = json!({"phase": "Pending"});
        let cases = [
            (
                "another scheduler",
                json!({"containers": containers(), "schedulerName": "never-runs"}),
                pending.clone(),
            ),
            (
                "a scheduling gate",
                json!({"containers": containers(), "schedulingGates": [{"name": "hold"}]}),
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
            ),
            (
                "unschedulable (quota of a node pool, a selector nothing matches)",
                json!({"containers": containers()}),
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
            ),
            (
                "a volume claim (provisioning a class the tenant picked)",
                json!({"containers": containers(), "volumes": [
                    {"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]}),
                pending.clone(),
            ),
            (
                "an ephemeral volume",
                json!({"containers": containers(), "volumes": [
                    {"name": "d", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}),
                pending.clone(),
            ),
            (
                "a nodeName no kubelet serves (no PodScheduled)",
                json!({"containers": containers(), "nodeName": "no-such-node"}),
                pending.clone(),
            ),
            (
                "reported by its kubelet (an image pulling, an init container running)",
                json!({"containers": containers(), "nodeName": "n1"}),
                json!({"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]}),
            ),
            (
                "an init container that ended",
                json!({"containers": containers(), "nodeName": "n1"}),
                json!({"phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "initContainerStatuses": [{"name": "init", "ready": false,
                        "state": {"terminated": {"exitCode": 1}}}]}),
            ),
            (
                "running",
                json!({"containers": containers(), "nodeName": "n1"}),
                json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}),
            ),
        ];
        for (what, spec, status) in cases {
            assert!(!waits_for_the_cluster(&pod(spec, status)), "{what}");
        }
    }

    #[test]
    fn a_pod_being_deleted_waits_for_nothing() {
        let mut p = pod(
            json!({"containers": containers()}),
            json!({"phase": "Pending"}),
        );
        assert!(waits_for_the_cluster(&p));
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!waits_for_the_cluster(&p));
    }
}
