//! Which pods of a node a drain evicts, which it waits for, and which landed after the plan.
//! Pure functions over Pod objects (from the reflector store).

use std::collections::BTreeSet;

use crate::cluster::CachedPod;

/// A pod the drain deals with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace: Option<i64>,
}

impl PodRef {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The pods of one node, sorted by how the drain treats them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePods {
    /// Evicted, then waited for.
    pub evict: Vec<PodRef>,
    /// Evicted best-effort, never waited for (their controller puts them back on every node).
    pub daemon_set: Vec<PodRef>,
    /// Already terminating: not evicted again, but waited for.
    pub terminating: Vec<PodRef>,
}

fn pod_ref(pod: &CachedPod) -> PodRef {
    PodRef {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        grace: pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds),
    }
}

/// Mirror and other static pods: the kubelet owns them, the Eviction API cannot move them.
fn is_mirror(pod: &CachedPod) -> bool {
    ebb_api::names::is_static_pod(
        pod.metadata.annotations.as_ref(),
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.kind.as_str()),
    )
}

fn is_terminal(pod: &CachedPod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn is_daemon_set(pod: &CachedPod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
}

/// The node `pod` is bound to.
pub(crate) fn node_of(pod: &CachedPod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Sort the pods bound to `node` (mirror and finished pods are ignored: nothing to evict).
pub fn classify<'a>(node: &str, pods: impl IntoIterator<Item = &'a CachedPod>) -> NodePods {
    let mut out = NodePods::default();
    for pod in pods {
        if node_of(pod) != Some(node) || is_mirror(pod) || is_terminal(pod) {
            continue;
        }
        let r = pod_ref(pod);
        if is_daemon_set(pod) {
            out.daemon_set.push(r);
        } else if pod.metadata.deletion_timestamp.is_some() {
            out.terminating.push(r);
        } else {
            out.evict.push(r);
        }
    }
    out.evict.sort();
    out.daemon_set.sort();
    out.terminating.sort();
    out
}

/// How long past its deletion deadline (`deletionTimestamp`, which includes the grace period) a
/// terminating pod is still waited for; later it counts as stuck (a finalizer, a lost kubelet)
/// and no longer keeps its node's drain waiting, as Cluster Autoscaler's long-terminating rule
/// and Karpenter's stuck-terminating rule do.
pub const LONG_TERMINATING_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `pod` is terminating and its deletion deadline passed more than
/// [`LONG_TERMINATING_AFTER`] before `now`.
pub fn long_terminating(pod: &CachedPod, now: jiff::Timestamp) -> bool {
    pod.metadata.deletion_timestamp.as_ref().is_some_and(|t| {
        let after = jiff::SignedDuration::try_from(LONG_TERMINATING_AFTER).unwrap_or_default();
        t.0.checked_add(after).is_ok_and(|stuck| stuck < now)
    })
}

/// Pods the drain still waits for on `node` (`namespace/name`, sorted).
pub fn remaining<'a>(node: &str, pods: impl IntoIterator<Item = &'a CachedPod>) -> Vec<String> {
    remaining_at(node, pods, jiff::Timestamp::now())
}

/// [`remaining`] at `now`: long-terminating pods ([`long_terminating`]) are not waited for.
pub fn remaining_at<'a>(
    node: &str,
    pods: impl IntoIterator<Item = &'a CachedPod>,
    now: jiff::Timestamp,
) -> Vec<String> {
    let pods: Vec<&CachedPod> = pods
        .into_iter()
        .filter(|p| !long_terminating(p, now))
        .collect();
    let c = classify(node, pods);
    let mut keys: Vec<String> = c
        .evict
        .iter()
        .chain(c.terminating.iter())
        .map(PodRef::key)
        .collect();
    keys.sort();
    keys
}

/// Pods on `node` now that were not there when the node was planned for removal (by uid),
/// DaemonSet pods excepted (they are on every node).
pub fn landed_since_plan<'a>(
    node: &str,
    planned: &BTreeSet<String>,
    pods: impl IntoIterator<Item = &'a CachedPod>,
) -> Vec<String> {
    let c = classify(node, pods);
    c.evict
        .iter()
        .filter(|p| !planned.contains(&p.uid))
        .map(PodRef::key)
        .collect()
}

/// Pods not bound yet that the scheduler nominated to `node` (`status.nominatedNodeName`:
/// preemption, or a binding in progress), finished and terminating pods excepted.
pub fn nominated_to<'a>(node: &str, pods: impl IntoIterator<Item = &'a CachedPod>) -> Vec<String> {
    pods.into_iter()
        .filter(|p| node_of(p).is_none_or(str::is_empty))
        .filter(|p| !is_terminal(p) && p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.nominated_node_name.as_deref())
                == Some(node)
        })
        .map(|p| pod_ref(p).key())
        .collect()
}

/// The uids of the pods on `node` now (what a plan knew), DaemonSet pods included.
pub fn uids_on<'a>(node: &str, pods: impl IntoIterator<Item = &'a CachedPod>) -> BTreeSet<String> {
    let c = classify(node, pods);
    c.evict
        .into_iter()
        .chain(c.daemon_set)
        .chain(c.terminating)
        .map(|p| p.uid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn terminating(mut p: CachedPod) -> CachedPod {
        p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        p
    }

    #[test]
    fn pods_are_sorted_by_how_the_drain_treats_them() {
        let pods = vec![
            pod("web-2").on("n1").owned_by("ReplicaSet", "web").build(),
            pod("web-1").on("n1").owned_by("ReplicaSet", "web").build(),
            pod("logs").on("n1").owned_by("DaemonSet", "logs").build(),
            pod("static").on("n1").mirror().build(),
            pod("done").on("n1").phase("Succeeded").build(),
            terminating(pod("leaving").on("n1").build()),
            pod("elsewhere").on("n2").build(),
        ];
        let c = classify("n1", &pods);
        let names = |v: &[PodRef]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&c.evict), vec!["web-1", "web-2"]);
        assert_eq!(names(&c.daemon_set), vec!["logs"]);
        assert_eq!(names(&c.terminating), vec!["leaving"]);
        // Ten seconds after the deletion deadline the terminating pod is still waited for.
        let soon = jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(10);
        assert_eq!(
            remaining_at("n1", &pods, soon),
            vec!["default/leaving", "default/web-1", "default/web-2"]
        );
        assert!(remaining("n3", &pods).is_empty());
    }

    #[test]
    fn a_long_terminating_pod_is_not_waited_for() {
        let pods = vec![
            terminating(pod("stuck").on("n1").build()),
            pod("web-1").on("n1").owned_by("ReplicaSet", "web").build(),
        ];
        let at = |s: i64| jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(s);
        assert_eq!(
            remaining_at("n1", &pods, at(30)),
            vec!["default/stuck", "default/web-1"]
        );
        assert_eq!(remaining_at("n1", &pods, at(31)), vec!["default/web-1"]);
        assert!(long_terminating(&pods[0], at(31)) && !long_terminating(&pods[1], at(31)));
    }

    #[test]
    fn static_pods_are_never_evicted() {
        let mut by_source = pod("etcd-n1").on("n1").build();
        by_source
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("kubernetes.io/config.source".into(), "file".into());
        let mut from_api = pod("web-1").on("n1").owned_by("ReplicaSet", "web").build();
        from_api
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("kubernetes.io/config.source".into(), "api".into());
        let pods = vec![
            by_source,
            pod("kube-proxy-n1").on("n1").owned_by("Node", "n1").build(),
            from_api,
        ];
        let c = classify("n1", &pods);
        let names: Vec<&str> = c.evict.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, vec!["web-1"]);
    }

    #[test]
    fn pods_that_landed_after_the_plan_are_found() {
        let before = vec![
            pod("web-1").on("n1").build(),
            pod("logs").on("n1").owned_by("DaemonSet", "logs").build(),
        ];
        let planned = uids_on("n1", &before);
        let mut after = before.clone();
        after.push(pod("new").ns("shop").on("n1").build());
        after.push(pod("logs-2").on("n1").owned_by("DaemonSet", "logs").build());
        assert_eq!(landed_since_plan("n1", &planned, &after), vec!["shop/new"]);
        assert!(landed_since_plan("n1", &planned, &before).is_empty());
    }
}
