//! The cached pods by node and by namespace, kept current by the pod watch: a drain finds its
//! node's pods, and the disruption gate a budget's namespace, without a pass over every pod.
//!
//! The index only names pods; each lookup reads them from the cache and keeps those that still
//! match (a re-list does not report the pods it dropped: their names go on the next lookup).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cluster::CachedPod;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::actuation::pods::node_of;

#[derive(Default)]
struct Inner {
    by_node: HashMap<String, HashSet<ObjectRef<CachedPod>>>,
    by_namespace: HashMap<String, HashSet<ObjectRef<CachedPod>>>,
    /// Where each indexed pod was last seen bound.
    node: HashMap<ObjectRef<CachedPod>, String>,
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
        let key = key(pod);
        let ns = pod.namespace().unwrap_or_default();
        let node = node_of(pod).map(str::to_string);
        let mut inner = self.lock();
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
        let key = key(pod);
        let mut inner = self.lock();
        remove(
            &mut inner.by_namespace,
            &pod.namespace().unwrap_or_default(),
            &key,
        );
        if let Some(old) = inner.node.remove(&key) {
            remove(&mut inner.by_node, &old, &key);
        }
    }

    /// The cached pods bound to `node`.
    pub fn on_node(&self, node: &str, pods: &Store<CachedPod>) -> Vec<Arc<CachedPod>> {
        if !self.fed {
            return pods.state_filter(|p| node_of(p) == Some(node));
        }
        let keys: Vec<ObjectRef<CachedPod>> = match self.lock().by_node.get(node) {
            Some(k) => k.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let (found, stale) = read(keys, pods, |p| node_of(p) == Some(node));
        if !stale.is_empty() {
            let mut inner = self.lock();
            for k in &stale {
                remove(&mut inner.by_node, node, k);
                if inner.node.get(k).map(String::as_str) == Some(node) {
                    inner.node.remove(k);
                }
            }
        }
        found
    }

    /// The cached pods of `namespace`.
    pub fn in_namespace(&self, namespace: &str, pods: &Store<CachedPod>) -> Vec<Arc<CachedPod>> {
        if !self.fed {
            return pods.state_filter(|p| p.metadata.namespace.as_deref() == Some(namespace));
        }
        let keys: Vec<ObjectRef<CachedPod>> = match self.lock().by_namespace.get(namespace) {
            Some(k) => k.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let (found, stale) = read(keys, pods, |_| true);
        if !stale.is_empty() {
            let mut inner = self.lock();
            for k in &stale {
                remove(&mut inner.by_namespace, namespace, k);
            }
        }
        found
    }
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

fn remove(
    map: &mut HashMap<String, HashSet<ObjectRef<CachedPod>>>,
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
    keys: Vec<ObjectRef<CachedPod>>,
    pods: &Store<CachedPod>,
    keep: impl Fn(&CachedPod) -> bool,
) -> (Vec<Arc<CachedPod>>, Vec<ObjectRef<CachedPod>>) {
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
        serde_json::from_value(serde_json::json!({
            // As the watch sends them: the cache's keys carry uid and resourceVersion, the
            // index's do not.
            "metadata": {"namespace": ns, "name": name, "uid": format!("{ns}-{name}"), "resourceVersion": "7"},
            "spec": {"containers": [], "nodeName": node},
        }))
        .unwrap()
    }

    fn names(mut v: Vec<Arc<CachedPod>>) -> Vec<String> {
        let mut out: Vec<String> = v.drain(..).map(|p| p.name_any()).collect();
        out.sort();
        out
    }

    #[test]
    fn a_pod_moves_with_its_binding_and_goes_with_its_deletion() {
        let (reader, mut writer) = store::<CachedPod>();
        let index = PodIndex::watched();
        let mut apply = |p: CachedPod| {
            writer.apply_watcher_event(&Event::Apply(p.clone()));
            index.applied(&p);
        };
        apply(pod("a", "p1", None));
        apply(pod("a", "p2", Some("n1")));
        apply(pod("b", "p3", Some("n1")));
        assert_eq!(names(index.on_node("n1", &reader)), ["p2", "p3"]);
        assert_eq!(names(index.in_namespace("a", &reader)), ["p1", "p2"]);
        // Bound later, to another node.
        apply(pod("a", "p1", Some("n2")));
        assert_eq!(names(index.on_node("n2", &reader)), ["p1"]);
        let gone = pod("b", "p3", Some("n1"));
        writer.apply_watcher_event(&Event::Delete(gone.clone()));
        index.deleted(&gone);
        assert_eq!(names(index.on_node("n1", &reader)), ["p2"]);
        assert!(index.in_namespace("b", &reader).is_empty());
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
        assert!(index.in_namespace("a", &reader).is_empty());
        assert!(index.lock().by_node.is_empty(), "pruned on the lookup");
    }

    #[test]
    fn an_index_nobody_feeds_reads_the_whole_cache() {
        let (reader, mut writer) = store::<CachedPod>();
        writer.apply_watcher_event(&Event::Apply(pod("a", "p1", Some("n1"))));
        let index = PodIndex::default();
        assert_eq!(names(index.on_node("n1", &reader)), ["p1"]);
        assert_eq!(names(index.in_namespace("a", &reader)), ["p1"]);
    }

    proptest! {
        /// Whatever the sequence of applies and deletes, a lookup returns exactly what a pass
        /// over the whole cache would.
        #[test]
        fn lookups_match_a_pass_over_the_cache(
            ops in prop::collection::vec((0u8..6, prop::option::of(0u8..3), any::<bool>()), 1..60)
        ) {
            let (reader, mut writer) = store::<CachedPod>();
            let index = PodIndex::watched();
            for (i, node, delete) in ops {
                let ns = if i % 2 == 0 { "even" } else { "odd" };
                let p = pod(ns, &format!("p{i}"), node.map(|n| format!("n{n}")).as_deref());
                if delete {
                    writer.apply_watcher_event(&Event::Delete(p.clone()));
                    index.deleted(&p);
                } else {
                    writer.apply_watcher_event(&Event::Apply(p.clone()));
                    index.applied(&p);
                }
            }
            for n in ["n0", "n1", "n2"] {
                let want = names(reader.state_filter(|p| node_of(p) == Some(n)));
                prop_assert_eq!(names(index.on_node(n, &reader)), want);
            }
            for ns in ["even", "odd"] {
                let want = names(reader.state_filter(|p| p.namespace().as_deref() == Some(ns)));
                prop_assert_eq!(names(index.in_namespace(ns, &reader)), want);
            }
        }
    }
}
