//! The live model against a snapshot built from scratch: after any sequence of node, pod and
//! budget events (loops and re-checks forking it in between), both hold the same cluster and
//! the planner decides the same on both.

use std::collections::{BTreeMap, BTreeSet};

use crate::cluster::CachedPod;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;

use super::build::{ClusterObjects, owner_index};
use super::live::{ClusterEvent, LiveCluster};
use super::types::{NodeId, PodId, Resources};
use super::{ClusterSnapshot, build_snapshot};
use crate::scaledown::{
    PlannerConfig, PlannerState, StepStopwatch, plan, recheck, select_deletions,
};
use crate::testkit::{node, pdb_min_available, pod, taint};

pub(crate) const NODES: u8 = 4;
pub(crate) const PODS: u8 = 10;
pub(crate) const PDBS: u8 = 2;

#[derive(Clone, Debug)]
pub(crate) struct NodeVar {
    /// 0..3: 2, 4, 8 cpus; 3: an unreadable quantity.
    cpu: u8,
    zone: u8,
    pool: u8,
    to_be_deleted: bool,
    ready: bool,
    unschedulable: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct PodVar {
    /// Node index; `NODES` is a node that never exists; None: pending.
    node: Option<u8>,
    /// 0..3: 100m, 500m, 1 cpu; 3: an unreadable quantity.
    cpu: u8,
    app: u8,
    anti_affinity: bool,
    spread: bool,
    finished: bool,
    ready: bool,
    /// A new UID under the same name (the pod was replaced).
    generation: u8,
    daemon_set: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct PdbVar {
    app: u8,
    /// 0..3: minAvailable 1, 2, "50%"; 3: an unreadable value.
    min: u8,
    /// The status observed, with disruptions allowed.
    observed: Option<i32>,
}

#[derive(Clone, Debug)]
pub(crate) enum Ev {
    Node(u8, NodeVar),
    NodeGone(u8),
    Pod(u8, PodVar),
    PodGone(u8),
    Pdb(u8, PdbVar),
    PdbGone(u8),
    /// A planner loop on the live model (forks and reverts it), with a pod evicted recently.
    Plan(Option<PodVar>),
    /// A re-check of a node on the live model.
    Recheck(u8),
}

fn node_var() -> impl Strategy<Value = NodeVar> {
    (
        prop_oneof![30 => 0u8..3, 1 => Just(3u8)],
        0u8..2,
        0u8..2,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(cpu, zone, pool, to_be_deleted, ready, unschedulable)| NodeVar {
                cpu,
                zone,
                pool,
                to_be_deleted,
                ready,
                unschedulable,
            },
        )
}

fn pod_var() -> impl Strategy<Value = PodVar> {
    (
        prop_oneof![1 => Just(None), 8 => (0..=NODES).prop_map(Some)],
        prop_oneof![40 => 0u8..3, 1 => Just(3u8)],
        0u8..3,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.85),
        0u8..2,
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(node, cpu, app, anti_affinity, spread, finished, ready, generation, daemon_set)| {
                PodVar {
                    node,
                    cpu,
                    app,
                    anti_affinity,
                    spread,
                    finished,
                    ready,
                    generation,
                    daemon_set,
                }
            },
        )
}

fn pdb_var() -> impl Strategy<Value = PdbVar> {
    (
        0u8..3,
        prop_oneof![20 => 0u8..3, 1 => Just(3u8)],
        prop_oneof![2 => Just(None), 1 => (0i32..3).prop_map(Some)],
    )
        .prop_map(|(app, min, observed)| PdbVar { app, min, observed })
}

pub(crate) fn event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => (0..NODES, node_var()).prop_map(|(i, v)| Ev::Node(i, v)),
        1 => (0..NODES).prop_map(Ev::NodeGone),
        10 => (0..PODS, pod_var()).prop_map(|(i, v)| Ev::Pod(i, v)),
        3 => (0..PODS).prop_map(Ev::PodGone),
        2 => (0..PDBS, pdb_var()).prop_map(|(i, v)| Ev::Pdb(i, v)),
        1 => (0..PDBS).prop_map(Ev::PdbGone),
        1 => prop::option::of(pod_var()).prop_map(Ev::Plan),
        1 => (0..NODES).prop_map(Ev::Recheck),
    ]
}

pub(crate) fn node_object(i: u8, v: &NodeVar) -> Node {
    let cpu = ["2", "4", "8", "lots"][v.cpu as usize];
    let mut b = node(&format!("n{i}"))
        .cpu(cpu)
        .mem("16Gi")
        .label("topology.kubernetes.io/zone", ["a", "b"][v.zone as usize])
        .label("pool", ["x", "y"][v.pool as usize]);
    if v.to_be_deleted {
        b = b.taint(taint(
            ebb_api::names::TAINT_TO_BE_DELETED,
            "1",
            "NoSchedule",
        ));
    }
    if !v.ready {
        b = b.not_ready();
    }
    if v.unschedulable {
        b = b.unschedulable();
    }
    b.build()
}

pub(crate) fn pod_object(j: u8, v: &PodVar) -> CachedPod {
    let app = format!("app{}", v.app);
    let mut b = pod(&format!("p{j}"))
        .uid(&format!("uid-p{j}-{}", v.generation))
        .cpu(["100m", "500m", "1", "much"][v.cpu as usize])
        .mem("1Gi")
        .label("app", &app);
    b = if v.daemon_set {
        b.owned_by_ds("agent")
    } else {
        b.owned_by_rs(&app)
    };
    if let Some(n) = v.node {
        b = b.on(&format!("n{n}"));
    }
    if v.anti_affinity {
        b = b.anti_affinity("app", &app, "kubernetes.io/hostname");
    }
    if v.spread {
        b = b.spread("app", &app, "topology.kubernetes.io/zone", 1);
    }
    if v.finished {
        b = b.phase("Succeeded");
    }
    if !v.ready {
        b = b.not_ready();
    }
    b.build()
}

pub(crate) fn pdb_object(k: u8, v: &PdbVar) -> PodDisruptionBudget {
    let app = format!("app{}", v.app);
    let mut p = pdb_min_available(&format!("d{k}"), "app", &app, 1);
    if let Some(spec) = p.spec.as_mut() {
        spec.min_available = Some(match v.min {
            0 => IntOrString::Int(1),
            1 => IntOrString::Int(2),
            2 => IntOrString::String("50%".into()),
            _ => IntOrString::String("most".into()),
        });
    }
    p.metadata.generation = Some(1);
    if let Some(allowed) = v.observed {
        p.status = Some(PodDisruptionBudgetStatus {
            observed_generation: Some(1),
            disruptions_allowed: allowed,
            desired_healthy: 1,
            current_healthy: 1 + allowed,
            expected_pods: 1 + allowed,
            ..Default::default()
        });
    }
    p
}

/// The objects the watches hold now.
#[derive(Default)]
struct World {
    nodes: BTreeMap<u8, Node>,
    pods: BTreeMap<u8, CachedPod>,
    pdbs: BTreeMap<u8, PodDisruptionBudget>,
}

impl World {
    /// What the controller's stores hand the snapshot build: pods bound to a node not in the
    /// store are left out; budgets in (namespace, name) order.
    fn objects(&self) -> ClusterObjects {
        let names: BTreeSet<String> = self
            .nodes
            .values()
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let pods: Vec<CachedPod> = self
            .pods
            .values()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_none_or(|n| names.contains(n))
            })
            .cloned()
            .collect();
        let mut objects = crate::testkit::objects(self.nodes.values().cloned(), pods);
        objects.pdbs = self.pdbs.values().cloned().collect();
        objects
    }
}

/// A snapshot in terms of names and UIDs (ids and order left out).
#[derive(Debug, PartialEq)]
pub(crate) struct Canonical {
    nodes: BTreeMap<String, String>,
    pods: BTreeMap<String, String>,
    requested: BTreeMap<String, Resources>,
    pods_on: BTreeMap<String, BTreeSet<String>>,
    domains: BTreeMap<(String, String), BTreeSet<String>>,
    pdbs: BTreeMap<(String, String), String>,
    owners: BTreeMap<(String, String, String), String>,
    usage: BTreeMap<String, super::snapshot::Usage>,
}

pub(crate) fn canonical(s: &ClusterSnapshot) -> Canonical {
    let nodes = 0..s.node_count() as NodeId;
    let name = |n: NodeId| s.node(n).name.clone();
    let normal = |r: &Resources| {
        let mut r = r.clone();
        r.extended.retain(|(_, v)| *v != 0);
        r
    };
    let mut domains: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for n in nodes.clone() {
        for (k, v) in &s.node(n).labels {
            let members = s.domain(k, v).iter().map(|m| name(*m)).collect();
            domains.insert((k.clone(), v.clone()), members);
        }
    }
    assert_eq!(
        s.domains.values().map(Vec::len).sum::<usize>(),
        domains.values().map(BTreeSet::len).sum::<usize>(),
        "no stale domain entries"
    );
    Canonical {
        nodes: nodes
            .clone()
            .map(|n| (name(n), format!("{:?}", s.node(n))))
            .collect(),
        pods: (0..s.pod_count() as PodId)
            .map(|p| {
                let mut info = s.pod(p).clone();
                info.class = 0;
                let class = s.class_of(p);
                let at = s.node_of(p).map(name);
                let v = format!(
                    "{info:?} {:?} targeted={} on={at:?}",
                    class.req, class.targeted_by_anti_affinity
                );
                (info.uid.to_string(), v)
            })
            .collect(),
        requested: nodes
            .clone()
            .map(|n| (name(n), normal(s.requested(n))))
            .collect(),
        pods_on: nodes
            .map(|n| {
                let uids = s.pods_on(n).iter().map(|p| s.pod(*p).uid.to_string());
                (name(n), uids.collect())
            })
            .collect(),
        domains,
        pdbs: s
            .pdbs()
            .iter()
            .map(|p| ((p.namespace.clone(), p.name.clone()), format!("{p:?}")))
            .collect(),
        owners: s
            .owners()
            .map(|o| {
                let key = (o.kind.clone(), o.namespace.clone(), o.name.clone());
                (key, format!("{o:?}"))
            })
            .collect(),
        usage: (0..s.node_count() as NodeId)
            .map(|n| (s.node(n).name.clone(), *s.usage(n)))
            .collect(),
    }
}

/// Internal consistency of a snapshot: placement both ways, class reference counts and ids.
fn check_indexes(s: &ClusterSnapshot) {
    for p in 0..s.pod_count() as PodId {
        assert_eq!(s.pod_by_uid(&s.pod(p).uid), Some(p));
        if let Some(n) = s.node_of(p) {
            assert!(s.pods_on(n).contains(&p));
        }
    }
    for n in 0..s.node_count() as NodeId {
        assert_eq!(s.node_id(&s.node(n).name), Some(n));
        for p in s.pods_on(n) {
            assert_eq!(s.node_of(*p), Some(n));
        }
        // Drains walk a node's pods in name order without sorting them.
        let names: Vec<(&str, &str)> = s
            .pods_on(n)
            .iter()
            .map(|p| (s.pod(*p).namespace.as_str(), s.pod(*p).name.as_str()))
            .collect();
        assert!(
            names.is_sorted(),
            "pods of {} out of name order: {names:?}",
            s.node(n).name
        );
    }
    let mut refs = vec![0u32; s.class_count()];
    for p in 0..s.pod_count() as PodId {
        refs[s.pod(p).class as usize] += 1;
    }
    assert_eq!(refs, s.class_refs, "class reference counts");
    for (c, r) in refs.iter().enumerate() {
        if *r > 0 {
            assert_eq!(s.class_ids.get(&s.class(c as u32).req), Some(&(c as u32)));
        }
    }
    assert_eq!(s.class_ids.len(), refs.iter().filter(|r| **r > 0).count());
    let live: Vec<u32> = (0..refs.len() as u32)
        .filter(|c| refs[*c as usize] > 0)
        .collect();
    let mut with_anti: Vec<u32> = live
        .iter()
        .copied()
        .filter(|c| !s.class(*c).req.anti_affinity.is_empty())
        .collect();
    let mut kept = s.with_anti.clone();
    with_anti.sort();
    kept.sort();
    assert_eq!(with_anti, kept, "classes with anti-affinity");
    for &c in &live {
        let req = &s.class(c).req;
        let targets = with_anti
            .iter()
            .filter(|a| {
                let anti = &s.class(**a).req.anti_affinity;
                anti.iter().any(|t| t.selects(&req.namespace, &req.labels))
            })
            .count() as u32;
        assert_eq!(s.anti_targets[c as usize], targets, "classes targeting {c}");
        assert_eq!(s.class(c).targeted_by_anti_affinity, targets > 0);
    }
}

/// The checker's caches (node-static results, anti-affinity selections per class) answer as
/// checking everything afresh does, for every pod on every node.
fn check_caches(s: &ClusterSnapshot) {
    let mut cached = super::PredicateChecker::new();
    let mut fresh = super::PredicateChecker::without_cache();
    for _ in 0..2 {
        for p in 0..s.pod_count() as PodId {
            for n in 0..s.node_count() as NodeId {
                assert_eq!(cached.check(s, p, n), fresh.check(s, p, n));
            }
        }
    }
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_800_000_000).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// A recently evicted pod (its owner unknown, so it is placed again).
fn evicted(v: &PodVar) -> CachedPod {
    let mut p = pod_object(PODS, v);
    p.metadata.owner_references = None;
    p
}

fn run_plan(
    s: &mut ClusterSnapshot,
    evicted: Option<&CachedPod>,
) -> (crate::scaledown::Plan, crate::scaledown::budgets::Selection) {
    let cfg = PlannerConfig::default();
    let mut state = PlannerState::default();
    if let Some(p) = evicted {
        state.record_eviction(std::sync::Arc::new(p.clone()), now());
    }
    let p = plan(
        s,
        &mut super::PredicateChecker::new(),
        &cfg,
        now(),
        &mut state,
        &Default::default(),
        &mut StepStopwatch::default(),
    );
    let sel = select_deletions(s, &p, &state, &cfg, now(), true);
    (p, sel)
}

fn apply(live: &mut LiveCluster, world: &mut World, ev: &Ev) {
    let r = match ev {
        Ev::Node(i, v) => {
            let n = node_object(*i, v);
            let r = live.apply(ClusterEvent::NodeApplied(&n));
            world.nodes.insert(*i, n);
            r
        }
        Ev::NodeGone(i) => {
            world.nodes.remove(i);
            live.apply(ClusterEvent::NodeDeleted(&format!("n{i}")))
        }
        Ev::Pod(j, v) => {
            let p = pod_object(*j, v);
            let r = live.apply(ClusterEvent::PodApplied(&p));
            world.pods.insert(*j, p);
            r
        }
        Ev::PodGone(j) => {
            world.pods.remove(j);
            live.apply(ClusterEvent::PodDeleted {
                namespace: "default",
                name: &format!("p{j}"),
            })
        }
        Ev::Pdb(k, v) => {
            let p = pdb_object(*k, v);
            let r = live.apply(ClusterEvent::PdbApplied(&p));
            world.pdbs.insert(*k, p);
            r
        }
        Ev::PdbGone(k) => {
            world.pdbs.remove(k);
            live.apply(ClusterEvent::PdbDeleted {
                namespace: "default",
                name: &format!("d{k}"),
            })
        }
        Ev::Plan(e) => {
            if let Ok(s) = live.snapshot_mut() {
                let before = canonical(s);
                run_plan(s, e.as_ref().map(evicted).as_ref());
                assert_eq!(before, canonical(s), "a loop leaves the model as it was");
            }
            Ok(())
        }
        Ev::Recheck(i) => {
            let objects = world.objects();
            live.apply(ClusterEvent::Owners(owner_index(&objects)))
                .unwrap_or_else(|e| panic!("{e}"));
            if let Ok(s) = live.snapshot_mut() {
                // A loop first, for the destination hints the re-check starts from.
                let cfg = PlannerConfig::default();
                let mut state = PlannerState::default();
                plan(
                    s,
                    &mut super::PredicateChecker::new(),
                    &cfg,
                    now(),
                    &mut state,
                    &Default::default(),
                    &mut StepStopwatch::default(),
                );
                let before = canonical(s);
                let name = format!("n{i}");
                let none = Default::default();
                let forked = recheck(
                    s,
                    &cfg,
                    &state,
                    &none,
                    &name,
                    now(),
                    &mut StepStopwatch::default(),
                )
                .map_err(|e| e.to_string());
                assert_eq!(
                    before,
                    canonical(s),
                    "a re-check leaves the model as it was"
                );
                let rebuilt = build_snapshot(&objects)
                    .map_err(|e| e.to_string())
                    .and_then(|mut scratch| {
                        recheck(
                            &mut scratch,
                            &cfg,
                            &state,
                            &none,
                            &name,
                            now(),
                            &mut StepStopwatch::default(),
                        )
                        .map_err(|e| e.to_string())
                    });
                assert_eq!(
                    forked, rebuilt,
                    "the re-check of {name} decides as a rebuild does"
                );
            }
            Ok(())
        }
    };
    assert_eq!(r, Ok(()));
}

/// Compares the live model with a snapshot built from the objects the watches hold: the same
/// error, or the same cluster and the same decisions.
fn compare(live: &mut LiveCluster, world: &World, evicted: Option<&CachedPod>) {
    let objects = world.objects();
    live.apply(ClusterEvent::Owners(owner_index(&objects)))
        .unwrap_or_else(|e| panic!("{e}"));
    match (build_snapshot(&objects), live.snapshot_mut()) {
        (Err(a), Err(b)) => assert_eq!(a, b, "the same object is reported"),
        (Ok(_), Err(e)) => panic!("live model reports {e}, a fresh build does not"),
        (Err(e), Ok(_)) => panic!("a fresh build fails ({e}), the live model does not"),
        (Ok(mut scratch), Ok(model)) => {
            assert_eq!(canonical(&scratch), canonical(model));
            check_caches(model);
            assert_eq!(
                run_plan(&mut scratch, evicted),
                run_plan(model, evicted),
                "same decisions"
            );
            let from_objects = LiveCluster::from_objects(&objects);
            assert_eq!(
                canonical(from_objects.model()),
                canonical(model),
                "from_objects builds the same model"
            );
        }
    }
}

/// Applies the events to a live model, comparing it with a fresh build at every loop and at
/// the end.
fn check(events: &[Ev]) {
    let mut live = LiveCluster::default();
    let mut world = World::default();
    for ev in events {
        apply(&mut live, &mut world, ev);
        check_indexes(live.model());
        if let Ev::Plan(e) = ev {
            compare(&mut live, &world, e.as_ref().map(evicted).as_ref());
        }
    }
    compare(&mut live, &world, None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any sequence of node, pod and budget changes (with loops and re-checks in between)
    /// leaves the live model equal to one built from scratch from the final objects.
    #[test]
    fn the_live_model_equals_a_fresh_build(events in prop::collection::vec(event(), 0..120)) {
        check(&events);
    }
}

#[test]
fn pods_wait_for_their_node_and_leave_with_it() {
    let mut live = LiveCluster::default();
    let p = pod("p1").on("n1").cpu("1").owned_by_rs("web").build();
    live.apply(ClusterEvent::PodApplied(&p))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((live.model().pod_count(), live.held_aside()), (0, 1));
    let n = node("n1").cpu("4").build();
    live.apply(ClusterEvent::NodeApplied(&n))
        .unwrap_or_else(|e| panic!("{e}"));
    let s = live.model();
    assert_eq!((s.pod_count(), live.held_aside()), (1, 0));
    assert_eq!(s.requested(0).cpu_milli, 1000);
    live.apply(ClusterEvent::NodeDeleted("n1"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((live.model().pod_count(), live.held_aside()), (0, 1));
}

#[test]
fn an_unreadable_object_stops_loops_until_fixed_or_deleted() {
    let mut live = LiveCluster::from_objects(&crate::testkit::objects(
        [node("n1").cpu("4")],
        [pod("p1").on("n1").cpu("1")],
    ));
    assert!(live.snapshot_mut().is_ok());
    let bad = pod("p1").on("n1").cpu("lots").build();
    live.apply(ClusterEvent::PodApplied(&bad))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = live
        .snapshot_mut()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("Pod default/p1") && e.contains("lots"), "{e}");
    let fixed = pod("p1").on("n1").cpu("2").build();
    live.apply(ClusterEvent::PodApplied(&fixed))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        live.snapshot_mut().map(|s| s.requested(0).cpu_milli),
        Ok(2000)
    );
    // A bad pod on a node the model does not have is left out, as the stores leave it out.
    let elsewhere = pod("p2").on("ghost").cpu("lots").build();
    live.apply(ClusterEvent::PodApplied(&elsewhere))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(live.snapshot_mut().is_ok());
    let n = node("ghost").cpu("4").build();
    live.apply(ClusterEvent::NodeApplied(&n))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(live.snapshot_mut().is_err());
    live.apply(ClusterEvent::PodDeleted {
        namespace: "default",
        name: "p2",
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(live.snapshot_mut().is_ok());
}

#[test]
fn events_wait_while_a_fork_is_open() {
    let mut live = LiveCluster::from_objects(&crate::testkit::objects(
        [node("n1").cpu("4")],
        Vec::<crate::testkit::PodBuilder>::new(),
    ));
    if let Ok(s) = live.snapshot_mut() {
        s.fork();
    }
    let p = pod("p1").on("n1").build();
    assert_eq!(
        live.apply(ClusterEvent::PodApplied(&p)),
        Err(super::UpdateError::ForkOpen)
    );
}

#[test]
fn a_new_local_volume_pins_the_pods_that_claim_it() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let mut objects = crate::testkit::objects(
        [node("n1").cpu("4")],
        [
            pod("db-0").on("n1").pvc("data-db-0").cpu("1"),
            pod("web").on("n1").cpu("1"),
        ],
    );
    let mut live = LiveCluster::from_objects(&objects);
    let pv: Result<PersistentVolume, _> = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pv-1"},
        "spec": {"local": {"path": "/mnt/disk"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}
    }));
    let pvc: Result<PersistentVolumeClaim, _> = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data-db-0", "namespace": "default"}, "spec": {"volumeName": "pv-1"}
    }));
    objects.persistent_volumes = vec![pv.unwrap_or_else(|e| panic!("{e}"))];
    objects.persistent_volume_claims = vec![pvc.unwrap_or_else(|e| panic!("{e}"))];
    live.apply(ClusterEvent::Volumes(crate::cluster::build::volume_index(
        &objects.persistent_volumes,
        &objects.persistent_volume_claims,
        &objects.storage_classes,
    )))
    .unwrap_or_else(|e| panic!("{e}"));
    let scratch = build_snapshot(&objects).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(canonical(live.model()), canonical(&scratch));
    let s = live.model();
    let db = s.pod_by_uid("uid-default-db-0").unwrap_or_default();
    assert_eq!(
        s.pod(db)
            .local_volume
            .as_ref()
            .map(|v| (v.claim.as_str(), v.pv.as_str())),
        Some(("data-db-0", "pv-1"))
    );
    assert_eq!(s.class_of(db).req.volume_node_affinity.len(), 1);
    check_indexes(s);
}
