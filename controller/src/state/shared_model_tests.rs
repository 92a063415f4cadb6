//! The shared model over real reflector caches: marked as the watches mark it, it always equals
//! a snapshot built from the caches, through re-lists, owners, a reader holding it and a panic.

use std::collections::BTreeMap;

use crate::cluster::CachedPod;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use proptest::prelude::*;

use super::shared_model::{Catchup, OwnerKind};
use super::stores::Stores;
use crate::cluster::build_snapshot;
use crate::cluster::live::pod_key;
use crate::cluster::live_tests::{
    Ev, NODES, PDBS, PODS, canonical, event, node_object, pdb_object, pod_object,
};
use crate::testkit::{node, pod, replica_set};

fn synced<K>() -> (reflector::Store<K>, Writer<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut w) = reflector::store::<K>();
    w.apply_watcher_event(&watcher::Event::Init);
    w.apply_watcher_event(&watcher::Event::InitDone);
    (store, w)
}

/// Applies (or deletes) `o` in a cache; returns its namespace and name.
fn write<K>(w: &mut Writer<K>, o: K, gone: bool) -> (String, String)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let key = (
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    );
    w.apply_watcher_event(&if gone {
        watcher::Event::Delete(o)
    } else {
        watcher::Event::Apply(o)
    });
    key
}

/// Caches written as the watches write them: the object first, then the model's mark.
struct Caches {
    stores: Stores,
    nodes: Writer<Node>,
    pods: Writer<CachedPod>,
    pdbs: Writer<PodDisruptionBudget>,
    replica_sets: Writer<ReplicaSet>,
}

impl Caches {
    fn new() -> Self {
        let (nodes_s, nodes) = synced();
        let (pods_s, pods) = synced();
        let (pdbs_s, pdbs) = synced();
        let (rs_s, replica_sets) = synced();
        Caches {
            stores: Stores {
                nodes: nodes_s,
                pods: pods_s,
                pod_index: Default::default(),
                pdbs: pdbs_s,
                replica_sets: rs_s,
                stateful_sets: synced().0,
                daemon_sets: synced().0,
                jobs: synced().0,
                replication_controllers: synced().0,
                persistent_volumes: synced().0,
                persistent_volume_claims: synced().0,
                storage_classes: synced().0,
                node_states: synced().0,
                providers: Default::default(),
                model: Default::default(),
                ended: Default::default(),
            },
            nodes,
            pods,
            pdbs,
            replica_sets,
        }
    }

    fn node(&mut self, n: Node, gone: bool) {
        let (_, name) = write(&mut self.nodes, n, gone);
        self.stores.model.node_changed(&name);
    }

    fn pod(&mut self, p: CachedPod, gone: bool) {
        let (ns, name) = write(&mut self.pods, p, gone);
        self.stores.model.pod_changed(&ns, &name);
    }

    fn pdb(&mut self, b: PodDisruptionBudget, gone: bool) {
        let (ns, name) = write(&mut self.pdbs, b, gone);
        self.stores.model.pdb_changed(&ns, &name);
    }

    fn replica_set(&mut self, r: ReplicaSet, gone: bool) {
        let (ns, name) = write(&mut self.replica_sets, r, gone);
        self.stores
            .model
            .owner_changed(OwnerKind::ReplicaSet, &ns, &name);
    }

    /// The model brought up to date equals a snapshot built from the caches (or reports the
    /// same unreadable object).
    fn check(&self) -> Catchup {
        let (mut live, caught) = self.stores.model();
        // Caches list in no particular order; a build reports the first unreadable object in
        // list order, the model the first by name.
        let mut objects = self.stores.objects();
        objects.nodes.sort_by_key(|n| n.metadata.name.clone());
        objects.pods.sort_by_key(pod_key);
        objects
            .pdbs
            .sort_by_key(|b| (b.metadata.namespace.clone(), b.metadata.name.clone()));
        match (build_snapshot(&objects), live.snapshot_mut()) {
            (Err(a), Err(b)) => assert_eq!(a, b, "the same object is reported"),
            (Ok(scratch), Ok(model)) => assert_eq!(canonical(&scratch), canonical(model)),
            (a, b) => panic!(
                "a build says {:?}, the model {:?}",
                a.err(),
                b.err().map(|e| e.to_string())
            ),
        }
        caught
    }
}

#[test]
fn the_first_reader_builds_the_model_and_later_readers_apply_only_what_changed() {
    let mut c = Caches::new();
    c.node(node("n1").cpu("4").build(), false);
    c.node(node("n2").cpu("4").build(), false);
    c.pod(pod("a").cpu("1").on("n1").build(), false);
    let first = c.check();
    assert!(first.rebuilt, "nothing was built yet: {first:?}");

    c.pod(pod("b").cpu("1").on("n2").build(), false);
    c.pod(pod("b").cpu("2").on("n2").build(), false);
    c.node(node("n1").cpu("4").build(), true);
    assert_eq!(
        c.check(),
        Catchup {
            changes: 2,
            rebuilt: false
        },
        "pod b (twice) and node n1"
    );
    assert_eq!(c.check().changes, 0, "nothing changed since");

    // The pod of the deleted node comes back with it.
    c.node(node("n1").cpu("4").build(), false);
    c.check();
    let (live, _) = c.stores.model();
    let snap = live.model();
    let n1 = snap.node_id("n1").expect("n1 is back");
    assert_eq!(snap.pods_on(n1).len(), 1);
}

#[test]
fn a_relist_rebuilds_the_model_and_drops_what_was_marked_before() {
    let mut c = Caches::new();
    c.node(node("n1").cpu("4").build(), false);
    c.check();
    // A pod deleted while the watch was down: gone from the cache without an event.
    c.pods
        .apply_watcher_event(&watcher::Event::Apply(pod("ghost").on("n1").build()));
    c.pods.apply_watcher_event(&watcher::Event::Init);
    c.pods.apply_watcher_event(&watcher::Event::InitDone);
    c.stores.model.relisted();
    c.pod(pod("x").on("n1").build(), false);
    let caught = c.check();
    assert!(caught.rebuilt, "{caught:?}");
}

#[test]
fn owners_follow_their_objects() {
    let mut c = Caches::new();
    c.node(node("n1").cpu("4").build(), false);
    c.replica_set(replica_set("web", 3), false);
    c.check();
    let desired = |c: &Caches| {
        let (live, _) = c.stores.model();
        live.model()
            .owner("ReplicaSet", "default", "web")
            .map(|o| o.desired)
    };
    assert_eq!(desired(&c), Some(3));
    c.replica_set(replica_set("web", 5), false);
    assert_eq!(desired(&c), Some(5));
    c.replica_set(replica_set("web", 5), true);
    assert_eq!(desired(&c), None);
}

#[test]
fn a_change_while_a_reader_holds_the_model_waits_for_the_next_reader() {
    let mut c = Caches::new();
    c.node(node("n1").cpu("4").build(), false);
    c.check();
    let stores = c.stores.clone();
    let (held, _) = stores.model();
    c.pod(pod("late").on("n1").build(), false);
    assert!(held.model().pod_by_uid("uid-default-late").is_none());
    drop(held);
    assert_eq!(c.check().changes, 1);
    let (live, _) = c.stores.model();
    assert!(live.model().pod_by_uid("uid-default-late").is_some());
}

#[test]
fn a_reader_that_panics_mid_fork_leaves_a_model_that_is_rebuilt() {
    let mut c = Caches::new();
    c.node(node("n1").cpu("4").build(), false);
    c.node(node("n2").cpu("4").build(), false);
    c.pod(pod("a").on("n1").build(), false);
    c.check();
    let stores = c.stores.clone();
    let panicked = std::thread::spawn(move || {
        let (mut live, _) = stores.model();
        let snap = live.snapshot_mut().expect("readable");
        snap.fork();
        let (p, n2) = (snap.pod_by_uid("uid-default-a"), snap.node_id("n2"));
        if let (Some(p), Some(n2)) = (p, n2) {
            snap.place(p, Some(n2));
        }
        panic!("a reader fails mid-fork");
    })
    .join();
    assert!(panicked.is_err());
    let caught = c.check();
    assert!(caught.rebuilt, "{caught:?}");
    let (live, _) = c.stores.model();
    let snap = live.model();
    assert_eq!(snap.fork_depth(), 0);
    let a = snap.pod_by_uid("uid-default-a").expect("pod a");
    assert_eq!(snap.node_of(a), snap.node_id("n1"), "pod a is back on n1");
}

#[derive(Clone, Debug)]
enum Step {
    Cluster(Ev),
    ReplicaSet(u8, Option<i32>),
    Relist,
    Read,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => event().prop_map(Step::Cluster),
        1 => (0u8..3, prop::option::of(0i32..4)).prop_map(|(i, r)| Step::ReplicaSet(i, r)),
        1 => Just(Step::Relist),
        3 => Just(Step::Read),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever the caches go through, the model read after it equals a build from them.
    #[test]
    fn the_shared_model_always_equals_a_build_from_the_caches(
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let mut c = Caches::new();
        let mut nodes: BTreeMap<u8, Node> = BTreeMap::new();
        let mut pods: BTreeMap<u8, CachedPod> = BTreeMap::new();
        let mut pdbs: BTreeMap<u8, PodDisruptionBudget> = BTreeMap::new();
        for s in steps {
            match s {
                Step::Cluster(Ev::Node(i, v)) => {
                    let n = node_object(i % NODES, &v);
                    nodes.insert(i % NODES, n.clone());
                    c.node(n, false);
                }
                Step::Cluster(Ev::NodeGone(i)) => {
                    if let Some(n) = nodes.remove(&(i % NODES)) {
                        c.node(n, true);
                    }
                }
                Step::Cluster(Ev::Pod(j, v)) => {
                    let p = pod_object(j % PODS, &v);
                    pods.insert(j % PODS, p.clone());
                    c.pod(p, false);
                }
                Step::Cluster(Ev::PodGone(j)) => {
                    if let Some(p) = pods.remove(&(j % PODS)) {
                        c.pod(p, true);
                    }
                }
                Step::Cluster(Ev::Pdb(k, v)) => {
                    let b = pdb_object(k % PDBS, &v);
                    pdbs.insert(k % PDBS, b.clone());
                    c.pdb(b, false);
                }
                Step::Cluster(Ev::PdbGone(k)) => {
                    if let Some(b) = pdbs.remove(&(k % PDBS)) {
                        c.pdb(b, true);
                    }
                }
                Step::Cluster(Ev::Plan(_) | Ev::Recheck(_)) | Step::Read => {
                    c.check();
                }
                Step::ReplicaSet(i, Some(r)) => {
                    c.replica_set(replica_set(&format!("app{i}"), r), false)
                }
                Step::ReplicaSet(i, None) => {
                    c.replica_set(replica_set(&format!("app{i}"), 0), true)
                }
                Step::Relist => c.stores.model.relisted(),
            }
        }
        c.check();
    }
}

#[test]
fn placement_sees_its_own_pins_on_a_fork_and_leaves_the_model_as_it_was() {
    use crate::reconcilers::placement::place::FitCheck;
    let mut c = Caches::new();
    c.node(node("n1").cpu("1").build(), false);
    c.node(node("n2").cpu("1").build(), false);
    // Two pending pods that cannot share a node.
    c.pod(pod("a").cpu("600m").build(), false);
    c.pod(pod("b").cpu("600m").build(), false);
    let (a, b) = ("uid-default-a", "uid-default-b");
    let fit = FitCheck::new(&c.stores);
    assert!(fit.fits(a, "n1"));
    assert!(fit.fits(b, "n1"));
    fit.pinned(a, "n1");
    assert!(!fit.fits(b, "n1"), "a is pinned there");
    assert!(fit.fits(b, "n2"));
    assert!(!fit.fits(b, "n3"), "no such node");
    let (live, _) = c.stores.model();
    let snap = live.model();
    assert_eq!(snap.fork_depth(), 0);
    let pa = snap.pod_by_uid(a).expect("pod a");
    assert_eq!(
        snap.node_of(pa),
        None,
        "the pin is not written into the shared model"
    );
}

/// Pods on `node` in the model, by name.
fn on_node(c: &Caches, node: &str) -> Vec<String> {
    let (live, _) = c.stores.model();
    let snap = live.model();
    let Some(id) = snap.node_id(node) else {
        return vec![];
    };
    let mut names: Vec<String> = snap
        .pods_on(id)
        .iter()
        .map(|p| snap.pod(*p).name.clone())
        .collect();
    names.sort();
    names
}

#[test]
fn only_replacements_ebb_steered_count_on_their_planned_node() {
    use crate::steering::{OwnerKey, Slot, Steering};
    use ebb_api::names::{ANNOTATION_PLANNED_NODE, ANNOTATION_STEERING_TICKET};
    let mut c = Caches::new();
    c.node(node("n1").cpu("4").build(), false);
    c.node(node("n2").cpu("4").build(), false);
    let steering = Steering::default();
    steering.set_model(c.stores.model.clone());
    let web = OwnerKey {
        kind: "ReplicaSet".into(),
        namespace: "default".into(),
        name: "web".into(),
    };
    steering.open(
        web.clone(),
        Slot {
            node: "n2".into(),
            policy: "pool".into(),
            from: "n1".into(),
            evicted: "default/web-old".into(),
            opened: jiff::Timestamp::now(),
            trace: Default::default(),
        },
    );
    // As the watch shows a pod: steering first, then the model's mark.
    let seen = |c: &mut Caches, p: CachedPod| {
        steering.observe(&p);
        c.pod(p, false);
    };
    // A tenant's pending pods with ebb's annotations written by hand (one held by a gate of
    // its own): never counted anywhere.
    let forged = |name: &str| {
        pod(name)
            .owned_by_rs("web")
            .cpu("1")
            .annotation(ANNOTATION_PLANNED_NODE, "n2")
            .annotation(
                ANNOTATION_STEERING_TICKET,
                "00000000000000000000000000000000",
            )
    };
    let mut gated = forged("tenant-gated").build();
    if let Some(s) = gated.spec.as_mut() {
        s.scheduling_gates =
            serde_json::from_value(serde_json::json!([{"name": "tenant.example/hold"}])).ok();
    }
    seen(&mut c, gated);
    seen(&mut c, forged("tenant-plain").build());
    assert_eq!(on_node(&c, "n2"), Vec::<String>::new());

    // The replacement, as the API server admits it: steered, then seen pending.
    let created = pod("web-new").owned_by_rs("web").cpu("1").build();
    let patch = steering
        .admit(&created, false)
        .expect("a replacement is steered");
    let mut doc = serde_json::to_value(&created).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    let created: CachedPod = serde_json::from_value(doc).unwrap();
    let ticket = created.metadata.annotations.clone().unwrap_or_default()
        [ANNOTATION_STEERING_TICKET]
        .clone();
    seen(&mut c, created.clone());
    assert_eq!(on_node(&c, "n2"), vec!["web-new".to_string()]);
    assert_eq!(steering.tally("pool").0.steered, 1);

    // A copy of its ticket on another pod claims nothing.
    let copy = pod("tenant-copy")
        .owned_by_rs("web")
        .cpu("1")
        .annotation(ANNOTATION_PLANNED_NODE, "n2")
        .annotation(ANNOTATION_STEERING_TICKET, &ticket)
        .build();
    seen(&mut c, copy);
    assert_eq!(on_node(&c, "n2"), vec!["web-new".to_string()]);
    assert_eq!(steering.tally("pool").0.steered, 1, "counted once");

    // A dry run changes nothing and is not steered.
    let other = pod("web-dry").owned_by_rs("web").cpu("1").build();
    assert!(steering.admit(&other, true).is_none());

    // Once gone, it counts no more.
    steering.observe_deleted(&created);
    c.pod(created, true);
    assert_eq!(on_node(&c, "n2"), Vec::<String>::new());
}
