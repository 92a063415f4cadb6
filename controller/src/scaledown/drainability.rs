//! Which pods of a node must move, stay, or block the node, following Cluster Autoscaler's
//! drainability rules in its order; each block carries a `BlockingPodReason`.

use ebb_api::names;
use ebb_api::reasons::BlockingPodReason;

use super::pdb_coverage::PdbTracker;
use crate::cluster::{ClusterSnapshot, NodeId, PodId};

/// Controller kinds whose pods are re-created elsewhere when evicted.
pub const KNOWN_CONTROLLERS: [&str; 5] = [
    "ReplicaSet",
    "StatefulSet",
    "Job",
    "ReplicationController",
    "DaemonSet",
];

/// The policy switches that change the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainRules {
    pub skip_nodes_with_local_storage: bool,
    pub skip_nodes_with_system_pods: bool,
    pub skip_nodes_with_custom_controller_pods: bool,
}

impl Default for DrainRules {
    fn default() -> Self {
        DrainRules {
            skip_nodes_with_local_storage: true,
            skip_nodes_with_system_pods: true,
            skip_nodes_with_custom_controller_pods: true,
        }
    }
}

/// What draining a node does with one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDisposition {
    /// Not moved: mirror, DaemonSet, terminal or already terminating pods.
    Stays,
    /// Evicted and re-created elsewhere: it needs a place. Its PDBs are checked in simulation.
    Moves,
    /// Keeps the node.
    Blocks(BlockingPodReason),
}

/// Whether Karpenter's `do-not-disrupt` annotation protects the pod at `now`: `"true"`, or a
/// duration (`"30m"`) the pod has not yet run for since it started (a pod not started yet is
/// protected). Another value protects nothing, as in Karpenter.
pub fn do_not_disrupt(
    value: Option<&String>,
    started: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
) -> bool {
    let Some(v) = value else { return false };
    if names::is_true(Some(v)) {
        return true;
    }
    let Ok(d) = ebb_api::duration::parse_duration(v.trim()) else {
        return false;
    };
    if d.is_zero() {
        return false;
    }
    match started {
        None => true,
        Some(t) => jiff::SignedDuration::try_from(d)
            .ok()
            .and_then(|d| t.checked_add(d).ok())
            .is_none_or(|until| now < until),
    }
}

/// Whether either safe-to-evict annotation says `on-completion`.
fn on_completion(ann: &std::collections::BTreeMap<String, String>) -> bool {
    [
        names::ANNOTATION_SAFE_TO_EVICT,
        names::CA_ANNOTATION_SAFE_TO_EVICT,
    ]
    .iter()
    .any(|k| {
        ann.get(*k).is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case(names::SAFE_TO_EVICT_ON_COMPLETION)
        })
    })
}

/// Classifies a pod by the rules, in order: mirror or static, terminal, terminating, DaemonSet →
/// stays; `safe-to-evict: "true"` → moves; `safe-to-evict: "false"` or an active
/// `do-not-disrupt` → blocks; `safe-to-evict: "on-completion"` → blocks until it finishes; no
/// controller, unknown controller kind, missing controller; kube-system without PDB; local
/// storage (but volumes in `safe-to-evict-local-volumes`); pinned by a local volume.
pub fn classify(
    snap: &ClusterSnapshot,
    pod: PodId,
    rules: &DrainRules,
    pdbs: &mut PdbTracker,
) -> PodDisposition {
    classify_with(snap, pod, rules, pdbs, &mut LastOwner::default())
}

/// The last owner [`classify_with`] looked up, and whether the snapshot has it: a node's pods,
/// walked in name order, mostly share their owner, and the lookup (three maps by name) was a
/// tenth of a plan at 5,000 nodes.
#[derive(Default)]
struct LastOwner<'s> {
    key: Option<(&'s str, &'s str, &'s str)>,
    found: bool,
}

impl<'s> LastOwner<'s> {
    /// Whether the snapshot has the owner `kind`, `namespace`, `name`.
    fn found(&mut self, snap: &'s ClusterSnapshot, key: (&'s str, &'s str, &'s str)) -> bool {
        if self.key != Some(key) {
            self.found = snap.owner(key.0, key.1, key.2).is_some();
            self.key = Some(key);
        }
        self.found
    }
}

/// [`classify`], remembering the last owner looked up in `last`.
fn classify_with<'s>(
    snap: &'s ClusterSnapshot,
    pod: PodId,
    rules: &DrainRules,
    pdbs: &mut PdbTracker,
    last: &mut LastOwner<'s>,
) -> PodDisposition {
    let p = snap.pod(pod);
    if p.mirror || p.terminal || p.terminating || p.is_daemonset() {
        return PodDisposition::Stays;
    }
    let ann = &p.annotations;
    if names::is_true(ann.get(names::ANNOTATION_SAFE_TO_EVICT))
        || names::is_true(ann.get(names::CA_ANNOTATION_SAFE_TO_EVICT))
    {
        return PodDisposition::Moves;
    }
    if names::is_false(ann.get(names::ANNOTATION_SAFE_TO_EVICT))
        || names::is_false(ann.get(names::CA_ANNOTATION_SAFE_TO_EVICT))
        || ann
            .get(names::KARPENTER_DO_NOT_DISRUPT)
            .is_some_and(|v| do_not_disrupt(Some(v), p.started, jiff::Timestamp::now()))
    {
        return PodDisposition::Blocks(BlockingPodReason::NotSafeToEvictAnnotation);
    }
    if on_completion(ann) {
        return PodDisposition::Blocks(BlockingPodReason::RunsToCompletion);
    }
    match &p.owner {
        None => return PodDisposition::Blocks(BlockingPodReason::NotReplicated),
        Some(o) if !KNOWN_CONTROLLERS.contains(&o.kind.as_str()) => {
            if rules.skip_nodes_with_custom_controller_pods {
                return PodDisposition::Blocks(BlockingPodReason::CustomControllerPod);
            }
        }
        Some(o) => {
            if !last.found(snap, (&o.kind, &p.namespace, &o.name)) {
                return PodDisposition::Blocks(BlockingPodReason::ControllerNotFound);
            }
        }
    }
    if rules.skip_nodes_with_system_pods && p.namespace == "kube-system" && !pdbs.has_pdb(snap, pod)
    {
        return PodDisposition::Blocks(BlockingPodReason::UnmovableKubeSystemPod);
    }
    if rules.skip_nodes_with_local_storage && p.local_storage {
        return PodDisposition::Blocks(BlockingPodReason::LocalStorageRequested);
    }
    if p.local_volume.is_some() && !usable_elsewhere(snap, pod) {
        return PodDisposition::Blocks(BlockingPodReason::PinnedToNode);
    }
    PodDisposition::Moves
}

/// Whether a node other than the pod's own satisfies the node affinity of every volume of the
/// pod (a zonal volume can follow its pod within the zone; a local one cannot leave its node).
fn usable_elsewhere(snap: &ClusterSnapshot, pod: PodId) -> bool {
    let own = snap.node_of(pod);
    let volumes = &snap.class_of(pod).req.volume_node_affinity;
    (0..snap.node_count() as NodeId)
        .filter(|n| Some(*n) != own)
        .any(|n| {
            let node = snap.node(n);
            volumes
                .iter()
                .all(|terms| crate::cluster::types::terms_match(terms, &node.name, &node.labels))
        })
}

/// What a blocking pod's reason names beyond the pod: the volume that pins it.
pub fn block_detail(
    snap: &ClusterSnapshot,
    pod: PodId,
    reason: BlockingPodReason,
) -> Option<String> {
    let p = snap.pod(pod);
    match (reason, &p.local_volume) {
        (BlockingPodReason::PinnedToNode, Some(v)) => Some(format!(
            "claim {}/{} is bound to PersistentVolume {}, whose node affinity no other node satisfies",
            p.namespace, v.claim, v.pv
        )),
        _ => None,
    }
}

/// The pods that must move off `node`, sorted by `namespace/name`; or the first blocking pod.
pub fn pods_to_move(
    snap: &ClusterSnapshot,
    node: NodeId,
    rules: &DrainRules,
    pdbs: &mut PdbTracker,
) -> Result<Vec<PodId>, (PodId, BlockingPodReason)> {
    let pods = snap.pods_by_name(node);
    let mut out = Vec::with_capacity(pods.len());
    let mut last = LastOwner::default();
    for &pod in pods.iter() {
        match classify_with(snap, pod, rules, pdbs, &mut last) {
            PodDisposition::Stays => {}
            PodDisposition::Moves => out.push(pod),
            PodDisposition::Blocks(r) => return Err((pod, r)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClusterObjects, build_snapshot};
    use crate::testkit::{PodBuilder, node, objects, pod};

    fn classify_in(objs: ClusterObjects, rules: DrainRules) -> PodDisposition {
        let s = build_snapshot(&objs).unwrap();
        let p = s
            .pod_by_uid(&objs.pods[0].metadata.uid.clone().unwrap())
            .unwrap();
        classify(&s, p, &rules, &mut PdbTracker::new(&s))
    }

    #[test]
    fn the_model_keeps_of_a_pods_annotations_only_those_drainability_reads() {
        let objs = objects(
            [node("n1").cpu("4")],
            [pod("web-1")
                .owned_by_rs("web")
                .on("n1")
                .annotation("team", "a")
                .annotation("prometheus.io/scrape", "true")
                .annotation(names::CA_ANNOTATION_SAFE_TO_EVICT, "false")
                .annotation(names::KARPENTER_DO_NOT_DISRUPT, "true")],
        );
        let s = build_snapshot(&objs).unwrap();
        let p = s.pod(
            s.pod_by_uid(&objs.pods[0].metadata.uid.clone().unwrap())
                .unwrap(),
        );
        let kept: Vec<&str> = p.annotations.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            vec![
                names::CA_ANNOTATION_SAFE_TO_EVICT,
                names::KARPENTER_DO_NOT_DISRUPT
            ]
        );
        assert_eq!(p.annotations[names::CA_ANNOTATION_SAFE_TO_EVICT], "false");
    }

    fn one(p: PodBuilder) -> PodDisposition {
        classify_in(
            objects([node("n1").cpu("4")], [p.on("n1")]),
            DrainRules::default(),
        )
    }

    #[test]
    fn pods_that_stay() {
        assert_eq!(one(pod("static").mirror()), PodDisposition::Stays);
        assert_eq!(one(pod("ds").owned_by_ds("fluentd")), PodDisposition::Stays);
        assert_eq!(one(pod("done").phase("Succeeded")), PodDisposition::Stays);
        assert_eq!(one(pod("failed").phase("Failed")), PodDisposition::Stays);
        assert_eq!(
            one(pod("going").owned_by_rs("web").terminating()),
            PodDisposition::Stays
        );
    }

    #[test]
    fn blocking_rules() {
        use BlockingPodReason::*;
        assert_eq!(one(pod("bare")), PodDisposition::Blocks(NotReplicated));
        assert_eq!(
            one(pod("op").owned_by("Rollout", "x")),
            PodDisposition::Blocks(CustomControllerPod)
        );
        for (k, v) in [
            (names::ANNOTATION_SAFE_TO_EVICT, "false"),
            (names::CA_ANNOTATION_SAFE_TO_EVICT, "false"),
            (names::KARPENTER_DO_NOT_DISRUPT, "true"),
        ] {
            assert_eq!(
                one(pod("keep").owned_by_rs("web").annotation(k, v)),
                PodDisposition::Blocks(NotSafeToEvictAnnotation),
                "{k}"
            );
        }
        assert_eq!(
            one(pod("sys").ns("kube-system").owned_by_rs("dns")),
            PodDisposition::Blocks(UnmovableKubeSystemPod)
        );
        assert_eq!(
            one(pod("tmp").owned_by_rs("web").empty_dir(false)),
            PodDisposition::Blocks(LocalStorageRequested)
        );
        assert_eq!(
            one(pod("hp").owned_by_rs("web").host_path("/var/data")),
            PodDisposition::Blocks(LocalStorageRequested)
        );
        assert_eq!(
            one(pod("ram").owned_by_rs("web").empty_dir(true)),
            PodDisposition::Moves
        );
        assert_eq!(one(pod("web-1").owned_by_rs("web")), PodDisposition::Moves);
        // The owner is referenced but not in the snapshot.
        let mut objs = objects(
            [node("n1").cpu("4")],
            [pod("orphan").on("n1").owned_by_rs("gone")],
        );
        objs.replica_sets.clear();
        assert_eq!(
            classify_in(objs, DrainRules::default()),
            PodDisposition::Blocks(ControllerNotFound)
        );
    }

    /// The owner remembered while walking a node's pods is the same kind, namespace and name,
    /// not only the same name: a missing owner blocks right after a found one of that name.
    #[test]
    fn a_node_walk_looks_up_each_owner_it_has_not_just_seen() {
        let (s, n1) = {
            let mut objs = objects(
                [node("n1").cpu("4").pods(20)],
                [
                    pod("a-1").ns("one").on("n1").owned_by_rs("web"),
                    pod("a-2").ns("one").on("n1").owned_by_rs("web"),
                    pod("b-1").ns("one").on("n1").owned_by("StatefulSet", "web"),
                    pod("c-1").ns("two").on("n1").owned_by_rs("web"),
                ],
            );
            objs.stateful_sets.clear();
            objs.replica_sets
                .retain(|r| r.metadata.namespace.as_deref() == Some("one"));
            let s = build_snapshot(&objs).unwrap();
            let n = s.node_id("n1").unwrap();
            (s, n)
        };
        let by_name = |name: &str| {
            s.pods_on(n1)
                .iter()
                .copied()
                .find(|p| s.pod(*p).name == name)
                .unwrap()
        };
        let walk = |s: &ClusterSnapshot| {
            pods_to_move(s, n1, &DrainRules::default(), &mut PdbTracker::new(s))
        };
        // one/a-1 and one/a-2 move (their ReplicaSet is there); the StatefulSet web of the same
        // namespace is not.
        assert_eq!(
            walk(&s),
            Err((by_name("b-1"), BlockingPodReason::ControllerNotFound))
        );
        // Each pod alone, as the walk saw it.
        let alone = |name: &str| {
            classify(
                &s,
                by_name(name),
                &DrainRules::default(),
                &mut PdbTracker::new(&s),
            )
        };
        assert_eq!(alone("a-2"), PodDisposition::Moves);
        assert_eq!(
            alone("c-1"),
            PodDisposition::Blocks(BlockingPodReason::ControllerNotFound)
        );
        // Without the StatefulSet's pod, the walk reaches two/c-1: the ReplicaSet web of
        // namespace one does not stand for the one of namespace two.
        let mut objs = objects(
            [node("n1").cpu("4").pods(20)],
            [
                pod("a-1").ns("one").on("n1").owned_by_rs("web"),
                pod("c-1").ns("two").on("n1").owned_by_rs("web"),
            ],
        );
        objs.replica_sets
            .retain(|r| r.metadata.namespace.as_deref() == Some("one"));
        let s2 = build_snapshot(&objs).unwrap();
        let n2 = s2.node_id("n1").unwrap();
        let c = s2
            .pods_on(n2)
            .iter()
            .copied()
            .find(|p| s2.pod(*p).name == "c-1")
            .unwrap();
        assert_eq!(
            pods_to_move(&s2, n2, &DrainRules::default(), &mut PdbTracker::new(&s2)),
            Err((c, BlockingPodReason::ControllerNotFound))
        );
    }

    #[test]
    fn static_pods_stay_whatever_marks_them() {
        assert_eq!(
            one(pod("etcd").annotation(names::ANNOTATION_CONFIG_SOURCE, "file")),
            PodDisposition::Stays
        );
        assert_eq!(
            one(pod("proxy").owned_by("Node", "n1")),
            PodDisposition::Stays
        );
        // A pod from the API with the source annotation is an ordinary pod.
        assert_eq!(
            one(pod("web-1")
                .owned_by_rs("web")
                .annotation(names::ANNOTATION_CONFIG_SOURCE, "api")),
            PodDisposition::Moves
        );
    }

    #[test]
    fn on_completion_blocks_until_the_pod_has_finished() {
        for k in [
            names::ANNOTATION_SAFE_TO_EVICT,
            names::CA_ANNOTATION_SAFE_TO_EVICT,
        ] {
            assert_eq!(
                one(pod("job-1")
                    .owned_by("Job", "batch")
                    .annotation(k, "on-completion")),
                PodDisposition::Blocks(BlockingPodReason::RunsToCompletion),
                "{k}"
            );
            assert_eq!(
                one(pod("job-1")
                    .owned_by("Job", "batch")
                    .annotation(k, "on-completion")
                    .phase("Succeeded")),
                PodDisposition::Stays,
                "{k}: finished"
            );
        }
    }

    #[test]
    fn do_not_disrupt_with_a_duration_protects_until_the_pod_ran_that_long() {
        let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let at = |s: &str| Some(s.parse::<jiff::Timestamp>().unwrap());
        let v = |s: &str| Some(s.to_string());
        assert!(do_not_disrupt(v("true").as_ref(), None, now));
        assert!(do_not_disrupt(
            v("30m").as_ref(),
            at("2026-01-01T00:45:00Z"),
            now
        ));
        assert!(!do_not_disrupt(
            v("30m").as_ref(),
            at("2026-01-01T00:15:00Z"),
            now
        ));
        assert!(do_not_disrupt(
            v("1h30m").as_ref(),
            at("2026-01-01T00:15:00Z"),
            now
        ));
        assert!(
            do_not_disrupt(v("5m").as_ref(), None, now),
            "not started yet"
        );
        assert!(!do_not_disrupt(v("false").as_ref(), None, now));
        assert!(
            !do_not_disrupt(v("soon").as_ref(), None, now),
            "not a duration"
        );
        assert!(!do_not_disrupt(None, None, now));
        // Through the classification: a pod that has just started is kept.
        let young = || {
            pod("web-1")
                .owned_by_rs("web")
                .annotation(names::KARPENTER_DO_NOT_DISRUPT, "1h")
        };
        assert_eq!(
            one(young().started_at(jiff::Timestamp::now())),
            PodDisposition::Blocks(BlockingPodReason::NotSafeToEvictAnnotation)
        );
        let old = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(2);
        assert_eq!(one(young().started_at(old)), PodDisposition::Moves);
    }

    #[test]
    fn local_volumes_that_may_be_lost_do_not_keep_the_node() {
        let k = names::CA_ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES;
        assert_eq!(
            one(pod("tmp")
                .owned_by_rs("web")
                .empty_dir(false)
                .annotation(k, "scratch")),
            PodDisposition::Moves
        );
        assert_eq!(
            one(pod("tmp")
                .owned_by_rs("web")
                .empty_dir(false)
                .host_path("/var/data")
                .annotation(k, "cache, scratch")),
            PodDisposition::Blocks(BlockingPodReason::LocalStorageRequested),
            "the hostPath volume is not listed"
        );
        assert_eq!(
            one(pod("tmp")
                .owned_by_rs("web")
                .empty_dir(false)
                .host_path("/var/data")
                .annotation(k, "scratch,host")),
            PodDisposition::Moves
        );
    }

    #[test]
    fn safe_to_evict_true_overrides_and_switches_relax() {
        for k in [
            names::ANNOTATION_SAFE_TO_EVICT,
            names::CA_ANNOTATION_SAFE_TO_EVICT,
        ] {
            assert_eq!(
                one(pod("bare").empty_dir(false).annotation(k, "true")),
                PodDisposition::Moves,
                "{k}"
            );
        }
        let relaxed = DrainRules {
            skip_nodes_with_local_storage: false,
            skip_nodes_with_system_pods: false,
            skip_nodes_with_custom_controller_pods: false,
        };
        for p in [
            pod("tmp").owned_by_rs("web").empty_dir(false),
            pod("sys").ns("kube-system").owned_by_rs("dns"),
            pod("op").owned_by("Rollout", "x"),
        ] {
            assert_eq!(
                classify_in(objects([node("n1")], [p.on("n1")]), relaxed),
                PodDisposition::Moves
            );
        }
        // A kube-system pod with a PDB may move.
        let mut objs = objects(
            [node("n1")],
            [pod("dns-1")
                .ns("kube-system")
                .label("k8s-app", "dns")
                .owned_by_rs("dns")
                .on("n1")],
        );
        let mut budget = crate::testkit::pdb_min_available("dns", "k8s-app", "dns", 0);
        budget.metadata.namespace = Some("kube-system".into());
        objs.pdbs.push(budget);
        assert_eq!(
            classify_in(objs, DrainRules::default()),
            PodDisposition::Moves
        );
    }

    #[test]
    fn local_volume_pins_the_pod_and_names_the_volume() {
        use crate::testkit::{bound_claim, local_volume};
        let mut objs = objects(
            [node("n1"), node("n2")],
            [pod("db-0")
                .owned_by("StatefulSet", "db")
                .pvc("data-db-0")
                .on("n1")],
        );
        objs.persistent_volumes
            .push(local_volume("pv-1", "n1", Some("data-db-0")));
        objs.persistent_volume_claims
            .push(bound_claim("data-db-0", "pv-1"));
        objs.stateful_sets
            .push(crate::testkit::stateful_set("db", 1));
        let s = build_snapshot(&objs).unwrap();
        let p = s.pod_by_uid("uid-default-db-0").unwrap();
        assert_eq!(
            classify(&s, p, &DrainRules::default(), &mut PdbTracker::new(&s)),
            PodDisposition::Blocks(BlockingPodReason::PinnedToNode)
        );
        let detail = block_detail(&s, p, BlockingPodReason::PinnedToNode).unwrap_or_default();
        assert!(
            detail.contains("default/data-db-0") && detail.contains("PersistentVolume pv-1"),
            "{detail}"
        );
    }

    #[test]
    fn a_zonal_volume_lets_the_pod_move_within_its_zone() {
        use crate::testkit::{bound_claim, volume_on};
        let zone = "topology.kubernetes.io/zone";
        let mut objs = objects(
            [
                node("n1").label(zone, "a"),
                node("n2").label(zone, "a"),
                node("n3").label(zone, "b"),
            ],
            [pod("db-0")
                .owned_by("StatefulSet", "db")
                .pvc("data")
                .on("n1")],
        );
        objs.persistent_volumes
            .push(volume_on("pv-z", "zonal", zone, "a", Some("data")));
        objs.persistent_volume_claims
            .push(bound_claim("data", "pv-z"));
        objs.stateful_sets
            .push(crate::testkit::stateful_set("db", 1));
        assert_eq!(
            classify_in(objs.clone(), DrainRules::default()),
            PodDisposition::Moves
        );
        // The only other node of its zone gone: pinned.
        objs.nodes.remove(1);
        assert_eq!(
            classify_in(objs, DrainRules::default()),
            PodDisposition::Blocks(BlockingPodReason::PinnedToNode)
        );
    }
}
