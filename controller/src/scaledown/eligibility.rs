//! Whether a node may be considered for removal at all (before any simulation), and its
//! utilisation: its accelerators' requested share, else the larger of cpu and memory's.

use std::collections::{BTreeSet, HashMap};

use ebb_api::names;
use ebb_api::reasons::UnremovableReason;

use crate::cluster::{ClusterSnapshot, NodeId};

/// How utilisation counts special pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UtilizationRules {
    pub ignore_daemon_sets: bool,
    pub ignore_mirror_pods: bool,
}

/// max(cpu requested / allocatable, memory requested / allocatable) of the pods on the node.
/// A node with no allocatable cpu or memory counts as fully used for that resource.
pub fn utilization(snap: &ClusterSnapshot, node: NodeId, rules: UtilizationRules) -> f64 {
    // Kept per node as pods come and go: the sums of the pods counted.
    let (cpu, mem) = snap
        .usage(node)
        .counted(rules.ignore_daemon_sets, rules.ignore_mirror_pods);
    let alloc = &snap.node(node).allocatable;
    let ratio = |used: i64, total: i64| {
        if total <= 0 {
            if used > 0 { f64::INFINITY } else { 0.0 }
        } else {
            used as f64 / total as f64
        }
    };
    ratio(cpu, alloc.cpu_milli).max(ratio(mem, alloc.memory))
}

/// The extended resources that make a node an accelerator node (`acceleratorResources`) and
/// the threshold such a node is judged against (`acceleratorUtilizationThreshold`).
#[derive(Clone, Debug, PartialEq)]
pub struct Accelerators {
    pub resources: Vec<String>,
    pub threshold: f64,
}

impl Default for Accelerators {
    fn default() -> Self {
        Accelerators {
            resources: ebb_api::scaledown::defaults::accelerator_resources(),
            threshold: ebb_api::scaledown::defaults::accelerator_utilization_threshold(),
        }
    }
}

/// How busy a node is, and against which threshold it is judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Requested over allocatable: of its accelerators for an accelerator node, else the larger
    /// of cpu and memory.
    pub share: f64,
    pub threshold: f64,
    /// Judged by its accelerators (it has allocatable of one of `acceleratorResources`).
    pub accelerator: bool,
    /// A priced accelerator node dearer per accelerator than the cheapest the policy governs:
    /// worth simulating however busy, since moving its pods to cheaper accelerators is what
    /// saves money (see `NodeFacts::gather`).
    pub dear: bool,
}

impl Load {
    /// At or below its threshold (Cluster Autoscaler's rule: a 4-GPU node using 2 at the default
    /// 0.5 is a candidate), or a dear accelerator node: worth simulating.
    pub fn underutilized(&self) -> bool {
        self.share <= self.threshold || self.dear
    }

    /// The reason a node above its threshold stays.
    pub fn busy_reason(&self) -> UnremovableReason {
        if self.accelerator {
            UnremovableReason::AcceleratorsInUse
        } else {
            UnremovableReason::NotUnderutilized
        }
    }
}

/// The largest requested share of the node's accelerators (requested over allocatable, per
/// resource of `acc` the node has), or `None` when it has none. Pods count as in [`utilization`].
pub fn accelerator_share(
    snap: &ClusterSnapshot,
    node: NodeId,
    rules: UtilizationRules,
    acc: &Accelerators,
) -> Option<f64> {
    let alloc = &snap.node(node).allocatable;
    let present: Vec<(&str, i64)> = acc
        .resources
        .iter()
        .map(|r| (r.as_str(), alloc.extended(r)))
        .filter(|(_, a)| *a > 0)
        .collect();
    if present.is_empty() {
        return None;
    }
    let mut used = vec![0i64; present.len()];
    for &p in snap.pods_on(node) {
        let info = snap.pod(p);
        if (rules.ignore_daemon_sets && info.is_daemonset())
            || (rules.ignore_mirror_pods && info.mirror)
        {
            continue;
        }
        let req = &snap.class_of(p).req.requests;
        for (u, (r, _)) in used.iter_mut().zip(&present) {
            *u += req.extended(r);
        }
    }
    Some(
        used.iter()
            .zip(&present)
            .map(|(u, (_, a))| *u as f64 / *a as f64)
            .fold(0.0, f64::max),
    )
}

/// How many accelerators the node has: its allocatable of the resources of `acc`, summed.
pub fn accelerator_count(snap: &ClusterSnapshot, node: NodeId, acc: &Accelerators) -> i64 {
    let alloc = &snap.node(node).allocatable;
    acc.resources.iter().map(|r| alloc.extended(r).max(0)).sum()
}

/// The node's [`Load`]: by its accelerators when it has any of `acc`, else by cpu and memory
/// against `threshold`.
pub fn load(
    snap: &ClusterSnapshot,
    node: NodeId,
    rules: UtilizationRules,
    threshold: f64,
    acc: &Accelerators,
) -> Load {
    match accelerator_share(snap, node, rules, acc) {
        Some(share) => Load {
            share,
            threshold: acc.threshold,
            accelerator: true,
            dear: false,
        },
        None => Load {
            share: utilization(snap, node, rules),
            threshold,
            accelerator: false,
            dear: false,
        },
    }
}

/// Whether the node is being deleted: in the deleted set, tainted `ebb.dev/to-be-deleted`, or
/// with a deletion timestamp.
pub fn being_deleted(snap: &ClusterSnapshot, node: NodeId, deleted: &BTreeSet<String>) -> bool {
    let n = snap.node(node);
    n.deleting || deleted.contains(&n.name) || n.has_taint(names::TAINT_TO_BE_DELETED)
}

/// Node-level reasons, in order: being deleted, being disrupted by Karpenter, scale-down disabled by annotation (ebb's, Cluster
/// Autoscaler's or Karpenter's), cordoned by someone else, `load` above its threshold
/// (skipped for unready nodes, which are removable whatever they request).
pub fn check_node(
    snap: &ClusterSnapshot,
    node: NodeId,
    deleted: &BTreeSet<String>,
    load: Load,
) -> Result<(), UnremovableReason> {
    let n = snap.node(node);
    if being_deleted(snap, node, deleted) {
        return Err(UnremovableReason::CurrentlyBeingDeleted);
    }
    if n.has_taint(names::KARPENTER_DISRUPTED_TAINT) {
        return Err(UnremovableReason::DisruptedByKarpenter);
    }
    let ann = &n.annotations;
    if names::is_true(ann.get(names::ANNOTATION_SCALE_DOWN_DISABLED))
        || names::is_true(ann.get(names::CA_ANNOTATION_SCALE_DOWN_DISABLED))
        || names::is_true(ann.get(names::KARPENTER_DO_NOT_DISRUPT))
    {
        return Err(UnremovableReason::ScaleDownDisabledAnnotation);
    }
    if n.unschedulable {
        return Err(UnremovableReason::Unschedulable);
    }
    if n.ready && !load.underutilized() {
        return Err(load.busy_reason());
    }
    Ok(())
}

/// How long after a pod was bound to a node that node is not removed: the scheduler may still
/// be binding others there (Kubernetes issue 125491: nodes deleted while a pod was binding).
pub const ARRIVAL_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(5);

/// Pods on their way to `node` (nominated to it, not bound yet) or bound to it within
/// [`ARRIVAL_WINDOW`] before `now`, DaemonSet and mirror pods excepted: `namespace/name`, sorted.
/// A node with any is not removed now.
pub fn arriving(snap: &ClusterSnapshot, node: NodeId, now: jiff::Timestamp) -> Vec<String> {
    let since = now - ARRIVAL_WINDOW;
    let mut out: Vec<String> = snap
        .pods_on(node)
        .iter()
        .map(|p| snap.pod(*p))
        .filter(|p| !p.mirror && !p.is_daemonset() && !p.terminal && !p.terminating)
        .filter(|p| p.nominated || p.scheduled_at.is_some_and(|t| t > since && t <= now))
        .map(|p| p.key())
        .collect();
    out.sort();
    out
}

/// Owners of the pods ebb evicted in the recent-evictions window, each with its earliest
/// eviction: namespace → owner name → (kind, time).
#[derive(Debug, Default)]
pub struct RecentlyEvicted(HashMap<String, HashMap<String, Vec<(String, jiff::Timestamp)>>>);

impl RecentlyEvicted {
    pub fn new(evictions: &[super::memory::RecentEviction]) -> Self {
        let mut owners = RecentlyEvicted::default();
        // Owners whose evicted pods are replaced.
        for (o, at) in evictions
            .iter()
            .filter_map(|e| Some((crate::steering::owner_of(&e.pod)?, e.evicted_at)))
        {
            let kinds = owners
                .0
                .entry(o.namespace)
                .or_default()
                .entry(o.name)
                .or_default();
            match kinds.iter_mut().find(|(k, _)| *k == o.kind) {
                Some((_, t)) => *t = (*t).min(at),
                None => kinds.push((o.kind, at)),
            }
        }
        owners
    }

    /// When ebb first evicted a pod of `kind` `namespace/name` in the window.
    fn evicted(&self, namespace: &str, kind: &str, name: &str) -> Option<jiff::Timestamp> {
        self.0
            .get(namespace)?
            .get(name)?
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, t)| *t)
    }

    /// Replacements on `node` of pods ebb moved: pods of an owner ebb evicted from, bound to the
    /// node after that eviction, and before the node became a candidate when it is one already
    /// (`candidate_since`: a replacement that lands on a node already being removed is moved
    /// with it, which holding the node back would not undo). `namespace/name`, sorted. A node
    /// with any stays while the evictions are recent, so that a pod ebb just moved is not moved
    /// again by a later loop.
    pub fn received(
        &self,
        snap: &ClusterSnapshot,
        node: NodeId,
        candidate_since: Option<jiff::Timestamp>,
    ) -> Vec<String> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<String> = snap
            .pods_on(node)
            .iter()
            .map(|p| snap.pod(*p))
            .filter(|p| !p.mirror && !p.is_daemonset() && !p.terminal && !p.terminating)
            .filter(|p| {
                let (Some(o), Some(bound)) = (&p.owner, p.scheduled_at) else {
                    return false;
                };
                // A pod's binding time has whole seconds (its condition's time).
                let bound = bound.as_second();
                self.evicted(&p.namespace, &o.kind, &o.name)
                    .is_some_and(|evicted| {
                        bound >= evicted.as_second()
                            && candidate_since.is_none_or(|since| bound < since.as_second())
                    })
            })
            .map(|p| p.key())
            .collect();
        out.sort();
        out
    }
}

/// The message naming what [`RecentlyEvicted::received`] found.
pub fn received_message(pods: &[String]) -> String {
    format!(
        "it received replacements of pods ebb evicted recently: {}",
        shown(pods)
    )
}

/// Up to three of `pods`, and how many more.
fn shown(pods: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut s = pods
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if pods.len() > SHOWN {
        s.push_str(&format!(" and {} more", pods.len() - SHOWN));
    }
    s
}

/// The message naming what [`arriving`] found.
pub fn arriving_message(pods: &[String]) -> String {
    format!(
        "pods nominated to the node or bound to it in the last {}s: {}",
        ARRIVAL_WINDOW.as_secs(),
        shown(pods)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{NodeBuilder, node, pod, snapshot, taint};

    /// A node exactly at its threshold is a candidate (Cluster Autoscaler's at-or-below): a
    /// 4-GPU node using 2 at 0.5, a 4-cpu node requesting 2 at 0.5; a hair above is not; at
    /// threshold 0 only an empty node is.
    #[test]
    fn a_node_at_its_threshold_is_underutilized() {
        let s = snapshot(
            [
                node("gpu").cpu("32").resource("nvidia.com/gpu", "4"),
                node("cpu").cpu("4"),
                node("over").cpu("4"),
                node("empty").cpu("4"),
            ],
            [
                pod("train")
                    .on("gpu")
                    .cpu("30")
                    .resource("nvidia.com/gpu", "2")
                    .owned_by_rs("t"),
                pod("web").on("cpu").cpu("2").owned_by_rs("w"),
                pod("web2").on("over").cpu("2001m").owned_by_rs("w"),
            ],
        );
        let rules = UtilizationRules::default();
        let acc = Accelerators::default();
        let at = |n: NodeId, t: f64| load(&s, n, rules, t, &acc).underutilized();
        assert!(
            at(0, 0.9),
            "2 of 4 GPUs at the accelerator threshold 0.5 (cpu does not count)"
        );
        assert!(at(1, 0.5));
        assert!(!at(2, 0.5), "2001m of 4 cpu is above 0.5");
        assert!(at(3, 0.0) && !at(1, 0.0), "threshold 0: empty nodes only");
    }

    fn reason(n: NodeBuilder, deleted: &[&str]) -> Result<(), UnremovableReason> {
        let s = snapshot(
            [n],
            [
                pod("web-1").on("n1").cpu("1").mem("1Gi").owned_by_rs("web"),
                pod("ds").on("n1").cpu("1").owned_by_ds("agent"),
            ],
        );
        let deleted = deleted.iter().map(|s| s.to_string()).collect();
        let rules = UtilizationRules::default();
        check_node(
            &s,
            0,
            &deleted,
            load(&s, 0, rules, 0.5, &Accelerators::default()),
        )
    }

    fn n1() -> NodeBuilder {
        node("n1").cpu("8").mem("8Gi")
    }

    #[test]
    fn node_reasons_in_order() {
        use UnremovableReason::*;
        assert_eq!(reason(n1(), &[]), Ok(()));
        assert_eq!(reason(n1(), &["n1"]), Err(CurrentlyBeingDeleted));
        assert_eq!(
            reason(
                n1().taint(taint(names::TAINT_TO_BE_DELETED, "1", "NoSchedule")),
                &[]
            ),
            Err(CurrentlyBeingDeleted)
        );
        for a in [
            names::ANNOTATION_SCALE_DOWN_DISABLED,
            names::CA_ANNOTATION_SCALE_DOWN_DISABLED,
            names::KARPENTER_DO_NOT_DISRUPT,
        ] {
            assert_eq!(
                reason(n1().annotation(a, "true"), &[]),
                Err(ScaleDownDisabledAnnotation),
                "{a}"
            );
        }
        assert_eq!(reason(n1().unschedulable(), &[]), Err(Unschedulable));
        assert_eq!(
            reason(
                n1().taint(taint(names::KARPENTER_DISRUPTED_TAINT, "", "NoSchedule")),
                &[]
            ),
            Err(DisruptedByKarpenter),
            "ebb does not fight Karpenter's own disruption"
        );
        // 2 cpu of 3 requested: 0.67 ≥ 0.5.
        assert_eq!(
            reason(node("n1").cpu("3").mem("8Gi"), &[]),
            Err(NotUnderutilized)
        );
        // Memory counts too: 1Gi of 1.5Gi.
        assert_eq!(
            reason(node("n1").cpu("8").mem("1536Mi"), &[]),
            Err(NotUnderutilized)
        );
        // Unready nodes skip the utilisation check.
        assert_eq!(
            reason(node("n1").cpu("3").mem("8Gi").not_ready(), &[]),
            Ok(())
        );
    }

    #[test]
    fn daemon_sets_count_unless_ignored() {
        let s = snapshot(
            [node("n1").cpu("4").mem("64Gi")],
            [
                pod("web-1").on("n1").cpu("1").owned_by_rs("web"),
                pod("ds").on("n1").cpu("1").owned_by_ds("agent"),
                pod("static").on("n1").cpu("1").mirror(),
            ],
        );
        assert!((utilization(&s, 0, UtilizationRules::default()) - 0.75).abs() < 1e-9);
        let ignore = UtilizationRules {
            ignore_daemon_sets: true,
            ignore_mirror_pods: true,
        };
        assert!((utilization(&s, 0, ignore) - 0.25).abs() < 1e-9);
    }

    /// The API server's clock ahead of ebb's (skew, or the simulator's fast clock): a pod bound
    /// "in the future" counts as arriving from when the watch delivered it, for the window on
    /// ebb's clock, not later when ebb's clock reaches the API server's time.
    #[test]
    fn a_binding_stamped_ahead_of_ebbs_clock_arrives_when_seen() {
        let seen: jiff::Timestamp = "2026-06-01T12:00:00Z".parse().unwrap_or_default();
        let secs = jiff::SignedDuration::from_secs;
        let ahead = seen + secs(120);
        let at = |p: crate::testkit::PodBuilder, clamp: bool| {
            let mut p = p.build();
            if clamp {
                p.scheduled_no_later_than(seen);
            }
            p
        };
        let bound = || pod("w").on("n1").owned_by_rs("web").scheduled_at(ahead);
        let raw = snapshot([node("n1").cpu("4")], [at(bound(), false)]);
        // As stamped: not arriving while ebb's clock is behind, arriving once it passes the stamp.
        assert!(arriving(&raw, 0, seen + secs(1)).is_empty());
        assert_eq!(arriving(&raw, 0, ahead + secs(1)), vec!["default/w"]);
        let s = snapshot([node("n1").cpu("4")], [at(bound(), true)]);
        assert_eq!(arriving(&s, 0, seen + secs(1)), vec!["default/w"]);
        assert!(arriving(&s, 0, seen + ARRIVAL_WINDOW + secs(1)).is_empty());
        assert!(
            arriving(&s, 0, ahead + secs(1)).is_empty(),
            "the window does not open again when ebb's clock reaches the stamp"
        );
        // A stamp behind ebb's clock is kept as it is.
        let past = pod("p")
            .on("n1")
            .owned_by_rs("web")
            .scheduled_at(seen - secs(60));
        let s = snapshot([node("n1").cpu("4")], [at(past, true)]);
        assert!(arriving(&s, 0, seen).is_empty());
    }

    #[test]
    fn pods_on_their_way_or_just_bound_keep_their_node() {
        let now: jiff::Timestamp = "2026-06-01T12:00:00Z".parse().unwrap_or_default();
        let ago = |s: i64| now - jiff::SignedDuration::from_secs(s);
        let s = snapshot(
            [
                node("n1").cpu("4"),
                node("n2").cpu("4"),
                node("n3").cpu("4"),
            ],
            [
                pod("old").on("n1").owned_by_rs("web").scheduled_at(ago(60)),
                pod("ds-new")
                    .on("n1")
                    .owned_by_ds("agent")
                    .scheduled_at(ago(1)),
                pod("fresh")
                    .on("n2")
                    .owned_by_rs("web")
                    .scheduled_at(ago(2)),
                pod("preemptor").owned_by_rs("web").nominated("n3").cpu("3"),
            ],
        );
        assert!(
            arriving(&s, 0, now).is_empty(),
            "bound long ago; DaemonSet pods never count"
        );
        assert_eq!(arriving(&s, 1, now), vec!["default/fresh"]);
        assert!(
            arriving(&s, 1, now + ARRIVAL_WINDOW).is_empty(),
            "settled after the window"
        );
        assert_eq!(arriving(&s, 2, now), vec!["default/preemptor"]);
        // The nominated pod uses its node's capacity.
        let (cpu, _) = s.usage(2).counted(false, false);
        assert_eq!(cpu, 3000);
        assert!(
            arriving_message(&["a".into(), "b".into(), "c".into(), "d".into()])
                .contains("and 1 more")
        );
    }
}
