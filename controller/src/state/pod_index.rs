//! The cached pods by node, by namespace, by the selectors and controllers asked about and those
//! held by a scheduling gate, kept current by the pod watch: a drain finds its node's pods, the disruption
//! gate a budget's pods and the placement sweep the gated pods, without a pass over every pod
//! (or over every pod of a namespace of tens of thousands).
//!
//! The index only names pods; each lookup reads them from the cache and keeps those that still
//! match (a re-list does not report the pods it dropped: their names go on the next lookup).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cluster::CachedPod;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::actuation::pods::node_of;
use crate::cluster::types::Selector;

/// A pod's name and namespace, allocated once per pod and shared by every map that names it
/// (each map then holds a pointer, not its own copy of both strings).
type Key = Arc<ObjectRef<CachedPod>>;

#[derive(Default)]
struct Inner {
    by_node: HashMap<Arc<str>, HashSet<Key>>,
    by_namespace: HashMap<String, HashSet<Key>>,
    /// Where each indexed pod was last seen bound (the name shared with `by_node`'s key).
    node: HashMap<Key, Arc<str>>,
    /// By namespace, then by who asked (a budget's `namespace/name`, or a controller whose pods
    /// are watched): the pods it picks.
    selections: HashMap<String, HashMap<String, Selection>>,
    /// Pods with at least one scheduling gate (few: a gate is lifted within seconds).
    gated: HashSet<Key>,
}

impl Inner {
    /// The index's key of `pod`: the one its maps share when it is indexed, else a new one.
    fn key(&self, pod: &CachedPod, ns: &str) -> Key {
        let fresh = key(pod);
        self.by_namespace
            .get(ns)
            .and_then(|set| set.get(&fresh))
            .cloned()
            .unwrap_or_else(|| Arc::new(fresh))
    }

    /// The shared name of `node` when a pod is indexed on it, else a new one.
    fn node_name(&self, node: &str) -> Arc<str> {
        self.by_node
            .get_key_value(node)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| Arc::from(node))
    }
}

/// Whether a scheduling gate (anyone's) holds the pod.
fn has_gates(pod: &CachedPod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// The pods of one namespace a selector picks: built by one pass over the namespace when first
/// asked for (or when the selector changed), then kept by every pod event.
struct Selection {
    picks: Picks,
    members: HashSet<Key>,
    /// Members the watch applied since [`PodIndex::controlled_changes`] last took them (kept
    /// only for the selections it reads).
    changed: Option<HashSet<Key>>,
}

/// Which pods of a namespace a selection holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Picks {
    /// Those whose labels a (budget's) selector matches.
    Labels(Selector),
    /// Those whose controlling owner is the `kind` named `name`.
    ControlledBy { kind: String, name: String },
}

impl Picks {
    fn matches(&self, pod: &CachedPod) -> bool {
        match self {
            Picks::Labels(s) => s.matches(labels_of(pod)),
            Picks::ControlledBy { kind, name } => pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.kind == *kind && o.name == *name),
        }
    }
}

fn labels_of(pod: &CachedPod) -> &std::collections::BTreeMap<String, String> {
    static EMPTY: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    pod.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

/// Pods by node and namespace; cheap to share.
#[derive(Clone, Default)]
pub struct PodIndex {
    inner: Arc<Mutex<Inner>>,
    /// Fed by the pod watch; an index nobody feeds (caches built by hand) answers with a pass
    /// over the cache instead.
    fed: bool,
}

impl PodIndex {
    /// An index the pod watch keeps current (see `stores::watch_pods`).
    pub fn watched() -> Self {
        PodIndex {
            fed: true,
            ..Default::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pod the watch added or changed (or listed again).
    pub fn applied(&self, pod: &CachedPod) {
        let ns = pod.namespace().unwrap_or_default();
        let mut inner = self.lock();
        let key = inner.key(pod, &ns);
        let node = node_of(pod).map(|n| inner.node_name(n));
        if has_gates(pod) {
            inner.gated.insert(key.clone());
        } else {
            inner.gated.remove(&key);
        }
        if let Some(selections) = inner.selections.get_mut(&ns) {
            for s in selections.values_mut() {
                if s.picks.matches(pod) {
                    s.members.insert(key.clone());
                    if let Some(changed) = s.changed.as_mut() {
                        changed.insert(key.clone());
                    }
                } else {
                    s.members.remove(&key);
                }
            }
        }
        inner
            .by_namespace
            .entry(ns)
            .or_default()
            .insert(key.clone());
        let was = inner.node.get(&key).cloned();
        if was == node {
            return;
        }
        if let Some(old) = was {
            remove(&mut inner.by_node, &old, &key);
            inner.node.remove(&key);
        }
        if let Some(n) = node {
            inner
                .by_node
                .entry(n.clone())
                .or_default()
                .insert(key.clone());
            inner.node.insert(key, n);
        }
    }

    /// A pod the watch saw deleted.
    pub fn deleted(&self, pod: &CachedPod) {
        let key = &key(pod);
        let ns = pod.namespace().unwrap_or_default();
        let mut inner = self.lock();
        if let Some(selections) = inner.selections.get_mut(&ns) {
            for s in selections.values_mut() {
                s.members.remove(key);
            }
        }
        inner.gated.remove(key);
        remove(&mut inner.by_namespace, &ns, key);
        if let Some(old) = inner.node.remove(key) {
            remove(&mut inner.by_node, &old, key);
        }
    }

    /// The cached pods bound to `node`.
    pub fn on_node(&self, node: &str, pods: &Store<CachedPod>) -> Vec<Arc<CachedPod>> {
        if !self.fed {
            return pods.state_filter(|p| node_of(p) == Some(node));
        }
        let keys: Vec<Key> = match self.lock().by_node.get(node) {
            Some(k) => k.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let (found, stale) = read(keys, pods, |p| node_of(p) == Some(node));
        if !stale.is_empty() {
            let mut inner = self.lock();
            for k in &stale {
                remove(&mut inner.by_node, node, k);
                if inner.node.get(k).map(|n| &**n) == Some(node) {
                    inner.node.remove(k);
                }
            }
        }
        found
    }

    /// The cached pods a scheduling gate holds.
    pub fn gated(&self, pods: &Store<CachedPod>) -> Vec<Arc<CachedPod>> {
        if !self.fed {
            return pods.state_filter(has_gates);
        }
        let keys: Vec<Key> = self.lock().gated.iter().cloned().collect();
        let (found, stale) = read(keys, pods, has_gates);
        if !stale.is_empty() {
            let mut inner = self.lock();
            for k in &stale {
                inner.gated.remove(k);
            }
        }
        found
    }
}

impl PodIndex {
    /// The cached pods of `namespace` that `selector` picks, for `asker` (a budget's
    /// `namespace/name`): the first call, and the first after the selector changed, pass over
    /// the namespace once; later calls read only the picked pods.
    pub fn selected(
        &self,
        namespace: &str,
        asker: &str,
        selector: &Selector,
        pods: &Store<CachedPod>,
    ) -> Vec<Arc<CachedPod>> {
        self.picked(
            namespace,
            asker,
            &Picks::Labels(selector.clone()),
            pods,
            false,
        )
    }

    /// The cached pods of `namespace` controlled by the `kind` named `name` that the watch
    /// applied since the last call: all of them at the first call (and the first after
    /// [`Self::forget_controlled`]), then only those that changed, so that a reader who follows
    /// a controller's pods does not walk all of them on every event. An index nobody feeds
    /// answers all of them every time.
    pub fn controlled_changes(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        pods: &Store<CachedPod>,
    ) -> Vec<Arc<CachedPod>> {
        let asker = controlled_asker(kind, name);
        let picks = Picks::ControlledBy {
            kind: kind.to_string(),
            name: name.to_string(),
        };
        if self.fed {
            let mut inner = self.lock();
            let kept = inner
                .selections
                .get_mut(namespace)
                .and_then(|s| s.get_mut(&asker))
                .filter(|s| s.picks == picks)
                .and_then(|s| s.changed.as_mut())
                .map(std::mem::take);
            drop(inner);
            if let Some(changed) = kept {
                let keep = |p: &CachedPod| {
                    p.metadata.namespace.as_deref() == Some(namespace) && picks.matches(p)
                };
                // A pod deleted since is not returned (its deletion took it out of the members,
                // not out of the changes).
                return read(changed.into_iter().collect(), pods, keep).0;
            }
        }
        self.picked(namespace, &asker, &picks, pods, true)
    }

    /// All the cached pods of `namespace` controlled by the `kind` named `name`, leaving what
    /// [`Self::controlled_changes`] answers next as it was (once it was asked).
    pub fn controlled(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        pods: &Store<CachedPod>,
    ) -> Vec<Arc<CachedPod>> {
        let picks = Picks::ControlledBy {
            kind: kind.to_string(),
            name: name.to_string(),
        };
        self.picked(namespace, &controlled_asker(kind, name), &picks, pods, true)
    }

    /// Forgets the pods of `namespace` controlled by the `kind` named `name`.
    pub fn forget_controlled(&self, namespace: &str, kind: &str, name: &str) {
        self.forget_in(namespace, &controlled_asker(kind, name));
    }

    /// What `picks` picks in `namespace` for `asker`, building the selection when it is not
    /// current; `track`: a selection built here records its changes from now on.
    fn picked(
        &self,
        namespace: &str,
        asker: &str,
        picks: &Picks,
        pods: &Store<CachedPod>,
        track: bool,
    ) -> Vec<Arc<CachedPod>> {
        let keep =
            |p: &CachedPod| p.metadata.namespace.as_deref() == Some(namespace) && picks.matches(p);
        if !self.fed {
            return pods.state_filter(|p| keep(p));
        }
        let keys: Vec<Key> = {
            let mut inner = self.lock();
            let current = inner
                .selections
                .get(namespace)
                .and_then(|s| s.get(asker))
                .is_some_and(|s| &s.picks == picks);
            if !current {
                // Under the index's lock: a pod the watch applies meanwhile is matched by its
                // own event, after this pass.
                let members: HashSet<Key> = inner
                    .by_namespace
                    .get(namespace)
                    .into_iter()
                    .flatten()
                    .filter(|k| pods.get(k).is_some_and(|p| keep(&p)))
                    .cloned()
                    .collect();
                inner
                    .selections
                    .entry(namespace.to_string())
                    .or_default()
                    .insert(
                        asker.to_string(),
                        Selection {
                            picks: picks.clone(),
                            members,
                            changed: track.then(HashSet::new),
                        },
                    );
            }
            inner
                .selections
                .get(namespace)
                .and_then(|s| s.get(asker))
                .map(|s| s.members.iter().cloned().collect())
                .unwrap_or_default()
        };
        let (found, stale) = read(keys, pods, keep);
        if !stale.is_empty() {
            let mut inner = self.lock();
            if let Some(s) = inner
                .selections
                .get_mut(namespace)
                .and_then(|s| s.get_mut(asker))
            {
                for k in &stale {
                    s.members.remove(k);
                }
            }
        }
        found
    }

    /// Forgets what `asker` selected in `namespace` only.
    fn forget_in(&self, namespace: &str, asker: &str) {
        let mut inner = self.lock();
        if let Some(s) = inner.selections.get_mut(namespace) {
            s.remove(asker);
            if s.is_empty() {
                inner.selections.remove(namespace);
            }
        }
    }

    /// Forgets what `asker` (a deleted budget's `namespace/name`) selected.
    pub fn forget_selection(&self, asker: &str) {
        let mut inner = self.lock();
        for s in inner.selections.values_mut() {
            s.remove(asker);
        }
        inner.selections.retain(|_, s| !s.is_empty());
    }
}

/// The asker a controller's pods are kept for: no budget's `namespace/name` looks like it.
fn controlled_asker(kind: &str, name: &str) -> String {
    format!("controlled-by {kind} {name}")
}

/// A pod's name and namespace: what a cache lookup needs (`ObjectRef::from_obj` would also copy
/// its uid and resourceVersion into each of the three maps, a third of the index's memory).
fn key(pod: &CachedPod) -> ObjectRef<CachedPod> {
    let r = ObjectRef::new(pod.metadata.name.as_deref().unwrap_or_default());
    match pod.metadata.namespace.as_deref() {
        Some(ns) => r.within(ns),
        None => r,
    }
}

fn remove<K: std::borrow::Borrow<str> + Eq + std::hash::Hash>(
    map: &mut HashMap<K, HashSet<Key>>,
    at: &str,
    key: &ObjectRef<CachedPod>,
) {
    if let Some(set) = map.get_mut(at) {
        set.remove(key);
        if set.is_empty() {
            map.remove(at);
        }
    }
}

/// The pods of `keys` the cache holds and `keep` accepts, and the keys it no longer holds so.
fn read(
    keys: Vec<Key>,
    pods: &Store<CachedPod>,
    keep: impl Fn(&CachedPod) -> bool,
) -> (Vec<Arc<CachedPod>>, Vec<Key>) {
    let mut found = Vec::with_capacity(keys.len());
    let mut stale = Vec::new();
    for k in keys {
        match pods.get(&k) {
            Some(p) if keep(&p) => found.push(p),
            _ => stale.push(k),
        }
    }
    (found, stale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use proptest::prelude::*;

    fn pod(ns: &str, name: &str, node: Option<&str>) -> CachedPod {
        labelled(ns, name, node, "x")
    }

    fn labelled(ns: &str, name: &str, node: Option<&str>, app: &str) -> CachedPod {
        gated(ns, name, node, app, false)
    }

    fn gated(ns: &str, name: &str, node: Option<&str>, app: &str, gate: bool) -> CachedPod {
        let gates = if gate {
            serde_json::json!([{"name": "example.com/hold"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            // As the watch sends them: the cache's keys carry uid and resourceVersion, the
            // index's do not.
            "metadata": {"namespace": ns, "name": name, "uid": format!("{ns}-{name}"), "resourceVersion": "7",
                         "labels": {"app": app}},
            "spec": {"containers": [], "nodeName": node, "schedulingGates": gates},
        }))
        .unwrap()
    }

    /// Selects pods labelled `app=<app>`.
    fn app(app: &str) -> Selector {
        crate::cluster::build::selector_from(
            &serde_json::from_value(serde_json::json!({"matchLabels": {"app": app}})).unwrap(),
            "PodDisruptionBudget",
            "test",
        )
        .unwrap()
    }

    /// Every pod of a namespace (the empty selector).
    fn in_namespace(index: &PodIndex, ns: &str, pods: &Store<CachedPod>) -> Vec<Arc<CachedPod>> {
        index.selected(ns, "all", &Selector::default(), pods)
    }

    fn names(mut v: Vec<Arc<CachedPod>>) -> Vec<String> {
        let mut out: Vec<String> = v.drain(..).map(|p| p.name_any()).collect();
        out.sort();
        out
    }

    /// A pod applied as the watch applies it: to the cache, then to the index.
    fn watched_apply(
        writer: &mut kube::runtime::reflector::store::Writer<CachedPod>,
        index: &PodIndex,
        p: CachedPod,
    ) {
        writer.apply_watcher_event(&Event::Apply(p.clone()));
        index.applied(&p);
    }

    #[test]
    fn every_map_shares_one_key_per_pod_and_one_name_per_node() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let mut apply = |p: CachedPod| watched_apply(&mut writer, &index, p);
        apply(pod("a", "p1", Some("n1")));
        apply(pod("a", "p2", Some("n1")));
        // The budget's selection and the pod applied again, bound elsewhere, then back.
        assert_eq!(names(in_namespace(&index, "a", &reader)), ["p1", "p2"]);
        apply(pod("a", "p1", Some("n2")));
        apply(pod("a", "p1", Some("n1")));
        let inner = index.lock();
        let probe = key(&pod("a", "p1", None));
        let in_ns = inner.by_namespace["a"]
            .get(&probe)
            .expect("indexed by namespace");
        let (in_node_map, node) = inner.node.get_key_value(&probe).expect("indexed by node");
        let on_node = inner.by_node["n1"].get(&probe).expect("indexed on n1");
        let selected = inner.selections["a"]["all"]
            .members
            .get(&probe)
            .expect("selected");
        for k in [in_node_map, on_node, selected] {
            assert!(Arc::ptr_eq(in_ns, k), "one allocation per pod's key");
        }
        let (n1, _) = inner.by_node.get_key_value("n1").expect("n1 indexed");
        assert!(Arc::ptr_eq(n1, node), "one allocation per node's name");
        // The probe is a value of its own: every reference counted is one of the maps'.
        assert_eq!(
            Arc::strong_count(in_ns),
            4,
            "namespace, node map, node set, selection"
        );
    }

    #[test]
    fn a_pod_moves_with_its_binding_and_goes_with_its_deletion() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let mut apply = |p: CachedPod| watched_apply(&mut writer, &index, p);
        apply(pod("a", "p1", None));
        apply(pod("a", "p2", Some("n1")));
        apply(pod("b", "p3", Some("n1")));
        assert_eq!(names(index.on_node("n1", &reader)), ["p2", "p3"]);
        assert_eq!(names(in_namespace(&index, "a", &reader)), ["p1", "p2"]);
        // Bound later, to another node.
        apply(pod("a", "p1", Some("n2")));
        assert_eq!(names(index.on_node("n2", &reader)), ["p1"]);
        let gone = pod("b", "p3", Some("n1"));
        writer.apply_watcher_event(&Event::Delete(gone.clone()));
        index.deleted(&gone);
        assert_eq!(names(index.on_node("n1", &reader)), ["p2"]);
        assert!(in_namespace(&index, "b", &reader).is_empty());
    }

    #[test]
    fn a_pod_the_cache_dropped_without_a_deletion_is_not_returned() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let p = pod("a", "p1", Some("n1"));
        writer.apply_watcher_event(&Event::Apply(p.clone()));
        index.applied(&p);
        // A re-list without it: the cache forgets it, the index is not told.
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        assert!(index.on_node("n1", &reader).is_empty());
        assert!(in_namespace(&index, "a", &reader).is_empty());
        assert!(index.lock().by_node.is_empty(), "pruned on the lookup");
        assert!(
            index.lock().selections["a"]["all"].members.is_empty(),
            "pruned on the lookup"
        );
    }

    #[test]
    fn an_index_nobody_feeds_reads_the_whole_cache() {
        let (reader, mut writer) = store::<CachedPod>();
        writer.apply_watcher_event(&Event::Apply(pod("a", "p1", Some("n1"))));
        let index = PodIndex::default();
        assert_eq!(names(index.on_node("n1", &reader)), ["p1"]);
        assert_eq!(names(in_namespace(&index, "a", &reader)), ["p1"]);
    }

    proptest! {
        /// Whatever the sequence of applies (with labels changing) and deletes, and whenever a
        /// selection is first asked for, a lookup returns exactly what a pass over the whole
        /// cache would.
        #[test]
        fn lookups_match_a_pass_over_the_cache(
            ops in prop::collection::vec((0u8..6, prop::option::of(0u8..3), any::<bool>(), any::<bool>(), prop::bool::weighted(0.2), any::<bool>()), 1..60)
        ) {
            let (reader, mut writer) = store::<CachedPod>();
            let index = PodIndex::watched();
            let x = app("x");
            for (i, node, delete, is_x, ask, gate) in ops {
                let ns = if i % 2 == 0 { "even" } else { "odd" };
                let p = gated(ns, &format!("p{i}"), node.map(|n| format!("n{n}")).as_deref(), if is_x { "x" } else { "y" }, gate);
                if delete {
                    writer.apply_watcher_event(&Event::Delete(p.clone()));
                    index.deleted(&p);
                } else {
                    writer.apply_watcher_event(&Event::Apply(p.clone()));
                    index.applied(&p);
                }
                if ask {
                    // Registers the selection part way: later events must keep it.
                    index.selected(ns, "budget", &x, &reader);
                }
            }
            for n in ["n0", "n1", "n2"] {
                let want = names(reader.state_filter(|p| node_of(p) == Some(n)));
                prop_assert_eq!(names(index.on_node(n, &reader)), want);
            }
            for ns in ["even", "odd"] {
                let want = names(reader.state_filter(|p| p.namespace().as_deref() == Some(ns)));
                prop_assert_eq!(names(in_namespace(&index, ns, &reader)), want);
                let want = names(reader.state_filter(|p| p.namespace().as_deref() == Some(ns) && labels_of(p).get("app").map(String::as_str) == Some("x")));
                prop_assert_eq!(names(index.selected(ns, "budget", &x, &reader)), want);
            }
            prop_assert_eq!(names(index.gated(&reader)), names(reader.state_filter(has_gates)));
        }
    }

    #[test]
    fn a_gated_pod_leaves_the_index_when_its_gates_are_lifted() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let mut apply = |p: CachedPod| watched_apply(&mut writer, &index, p);
        apply(gated("a", "held", None, "x", true));
        apply(gated("a", "free", None, "x", false));
        assert_eq!(names(index.gated(&reader)), ["held"]);
        apply(gated("a", "held", None, "x", false));
        assert!(index.gated(&reader).is_empty());
        assert!(index.lock().gated.is_empty());
        // An index nobody feeds finds them in the cache.
        apply(gated("a", "again", None, "x", true));
        assert_eq!(names(PodIndex::default().gated(&reader)), ["again"]);
    }

    #[test]
    fn a_selection_follows_its_selector_and_forgets_deleted_askers() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        for (name, a) in [("p1", "x"), ("p2", "y")] {
            let p = labelled("ns", name, Some("n1"), a);
            writer.apply_watcher_event(&Event::Apply(p.clone()));
            index.applied(&p);
        }
        assert_eq!(
            names(index.selected("ns", "ns/b", &app("x"), &reader)),
            ["p1"]
        );
        // The budget's selector changed: the selection is built again.
        assert_eq!(
            names(index.selected("ns", "ns/b", &app("y"), &reader)),
            ["p2"]
        );
        index.forget_selection("ns/other");
        assert_eq!(
            index.lock().selections["ns"].len(),
            1,
            "another asker's is kept"
        );
        index.forget_selection("ns/b");
        assert!(index.lock().selections.is_empty());
    }

    fn controlled(ns: &str, name: &str, kind: &str, owner: &str) -> CachedPod {
        let mut p = pod(ns, name, Some("n1"));
        p.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: kind.into(),
                name: owner.into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        p
    }

    #[test]
    fn a_controller_selection_follows_owners_and_is_forgotten_per_namespace() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let mut apply = |p: CachedPod| watched_apply(&mut writer, &index, p);
        apply(controlled("a", "web-1", "ReplicaSet", "web"));
        apply(controlled("a", "db-0", "StatefulSet", "web"));
        apply(controlled("b", "web-2", "ReplicaSet", "web"));
        apply(controlled("a", "web-4", "ReplicaSet", "web"));
        assert_eq!(
            names(index.controlled_changes("a", "ReplicaSet", "web", &reader)),
            ["web-1", "web-4"],
            "all at first; same name, another kind or namespace: not its pods"
        );
        assert!(
            index
                .controlled_changes("a", "ReplicaSet", "web", &reader)
                .is_empty(),
            "nothing changed since"
        );
        index.controlled_changes("b", "ReplicaSet", "web", &reader);
        // Kept by the watch once asked for: a new pod joins, an orphaned one leaves, a deleted
        // one is not returned; only what changed is.
        apply(controlled("a", "web-3", "ReplicaSet", "web"));
        apply(pod("a", "web-1", Some("n1")));
        apply(controlled("a", "web-5", "ReplicaSet", "web"));
        let gone = controlled("a", "web-5", "ReplicaSet", "web");
        writer.apply_watcher_event(&Event::Delete(gone.clone()));
        index.deleted(&gone);
        assert_eq!(
            names(index.controlled_changes("a", "ReplicaSet", "web", &reader)),
            ["web-3"]
        );
        index.forget_controlled("a", "ReplicaSet", "web");
        assert!(!index.lock().selections.contains_key("a"));
        assert_eq!(index.lock().selections["b"].len(), 1, "namespace b's kept");
    }
}
