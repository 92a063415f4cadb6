//! The one cluster model every policy, re-check and placement pass reads: the watches mark what
//! changed, and the next reader applies those changes (or rebuilds it after a re-list).

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::cluster::CachedPod;
use ebb_api::nodestate::NodeState;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, ReplicationController,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cluster::build::{SnapshotError, VolumeIndex, Workload, volume_index};
use crate::cluster::{ClusterEvent, LiveCluster, UpdateError};

/// An owner kind whose desired replicas the model keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerKind {
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    ReplicationController,
}

impl OwnerKind {
    pub fn name(self) -> &'static str {
        match self {
            OwnerKind::ReplicaSet => "ReplicaSet",
            OwnerKind::StatefulSet => "StatefulSet",
            OwnerKind::DaemonSet => "DaemonSet",
            OwnerKind::Job => "Job",
            OwnerKind::ReplicationController => "ReplicationController",
        }
    }
}

/// The caches the model is read from: the watches' stores, each kind the model holds.
pub struct Caches<'a> {
    pub nodes: &'a Store<Node>,
    pub pods: &'a Store<CachedPod>,
    pub pdbs: &'a Store<PodDisruptionBudget>,
    pub replica_sets: &'a Store<ReplicaSet>,
    pub stateful_sets: &'a Store<StatefulSet>,
    pub daemon_sets: &'a Store<DaemonSet>,
    pub jobs: &'a Store<Job>,
    pub replication_controllers: &'a Store<ReplicationController>,
    pub persistent_volumes: &'a Store<PersistentVolume>,
    pub persistent_volume_claims: &'a Store<PersistentVolumeClaim>,
    pub storage_classes: &'a Store<StorageClass>,
    pub node_states: &'a Store<NodeState>,
    pub providers: &'a super::machine_caches::ProviderStores,
}

/// What changed since the model last caught up: keys only, the caches hold the objects. A key
/// changed many times is applied once, so the set never outgrows the cluster.
#[derive(Debug)]
struct Dirty {
    /// A cache was re-listed (objects deleted meanwhile had no event), or the model was never
    /// built: build it again from the caches.
    rebuild: bool,
    nodes: BTreeSet<String>,
    pods: BTreeSet<(String, String)>,
    pdbs: BTreeSet<(String, String)>,
    owners: BTreeSet<(OwnerKind, String, String)>,
    node_states: bool,
    providers: bool,
    /// PersistentVolumes, claims or StorageClasses changed.
    volumes: bool,
}

impl Default for Dirty {
    fn default() -> Self {
        Dirty {
            rebuild: true,
            nodes: BTreeSet::new(),
            pods: BTreeSet::new(),
            pdbs: BTreeSet::new(),
            owners: BTreeSet::new(),
            node_states: false,
            providers: false,
            volumes: false,
        }
    }
}

impl Dirty {
    fn changes(&self) -> usize {
        self.nodes.len()
            + self.pods.len()
            + self.pdbs.len()
            + self.owners.len()
            + usize::from(self.node_states)
            + usize::from(self.providers)
            + usize::from(self.volumes)
    }
}

/// What bringing the model up to date did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Catchup {
    /// Objects (or whole kinds, for NodeStates and the providers) applied.
    pub changes: usize,
    /// The model was built again from the caches.
    pub rebuilt: bool,
}

/// The shared model and what changed since it was last read.
#[derive(Debug, Default)]
pub struct SharedModel {
    dirty: Mutex<Dirty>,
    live: Mutex<LiveCluster>,
    /// Pending pods ebb steered, vouched for by the steering book (read by the model).
    steered: crate::cluster::SteeredPods,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn namespaced<K: kube::Resource<DynamicType = ()>>(ns: &str, name: &str) -> ObjectRef<K> {
    ObjectRef::new(name).within(ns)
}

impl SharedModel {
    /// Marks a change; nothing to mark while a rebuild is due (it reads every cache).
    fn mark(&self, f: impl FnOnce(&mut Dirty)) {
        let mut d = lock(&self.dirty);
        if !d.rebuild {
            f(&mut d);
        }
    }

    pub fn node_changed(&self, name: &str) {
        self.mark(|d| {
            d.nodes.insert(name.to_string());
        });
    }

    pub fn pod_changed(&self, namespace: &str, name: &str) {
        self.mark(|d| {
            d.pods.insert((namespace.to_string(), name.to_string()));
        });
    }

    pub fn pdb_changed(&self, namespace: &str, name: &str) {
        self.mark(|d| {
            d.pdbs.insert((namespace.to_string(), name.to_string()));
        });
    }

    pub fn owner_changed(&self, kind: OwnerKind, namespace: &str, name: &str) {
        self.mark(|d| {
            d.owners
                .insert((kind, namespace.to_string(), name.to_string()));
        });
    }

    pub fn node_states_changed(&self) {
        self.mark(|d| d.node_states = true);
    }

    pub fn providers_changed(&self) {
        self.mark(|d| d.providers = true);
    }

    pub fn volumes_changed(&self) {
        self.mark(|d| d.volumes = true);
    }

    /// The steering book vouches (`Some(node)`) that the pending pod `namespace/name` is a
    /// replacement it steered to `node`, or withdraws that (`None`): the model counts it there.
    pub fn steered_pending(&self, namespace: &str, name: &str, node: Option<&str>) {
        // The pod watch asks this for every pod it sees: nothing to withdraw is the common case.
        if node.is_none() && self.steered.is_empty() {
            return;
        }
        if self
            .steered
            .set((namespace.to_string(), name.to_string()), node)
        {
            self.pod_changed(namespace, name);
        }
    }

    /// A cache was listed again: the next reader rebuilds the model.
    pub fn relisted(&self) {
        *lock(&self.dirty) = Dirty::default();
    }

    /// The model, brought up to date with `stores` first; held until the guard drops (a loop
    /// forks and reverts it under the guard). Changes that arrive meanwhile wait for the next
    /// reader.
    pub fn current(&self, stores: &Caches<'_>) -> (MutexGuard<'_, LiveCluster>, Catchup) {
        let mut live = match self.live.lock() {
            Ok(g) => g,
            Err(poisoned) => {
                // A reader panicked with the model in its hands (perhaps mid-fork).
                tracing::warn!("the cluster model was left inconsistent; rebuilding it");
                self.relisted();
                poisoned.into_inner()
            }
        };
        let dirty = std::mem::replace(
            &mut *lock(&self.dirty),
            Dirty {
                rebuild: false,
                ..Dirty::default()
            },
        );
        let changes = dirty.changes();
        if !dirty.rebuild {
            match apply(&mut live, stores, &dirty) {
                Ok(()) => {
                    return (
                        live,
                        Catchup {
                            changes,
                            rebuilt: false,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the cluster model refused a change; rebuilding it")
                }
            }
        }
        let t = Instant::now();
        let (model, objects) = build(stores, &self.steered);
        *live = model;
        tracing::info!(
            objects,
            held_aside = live.held_aside(),
            took_ms = t.elapsed().as_millis() as u64,
            "cluster model built from the caches"
        );
        (
            live,
            Catchup {
                changes: objects,
                rebuilt: true,
            },
        )
    }
}

/// The model of what the caches hold, read in place (no object is copied), in the order
/// [`LiveCluster::from_objects`] applies them; with the number of objects read.
fn build(stores: &Caches<'_>, steered: &crate::cluster::SteeredPods) -> (LiveCluster, usize) {
    let mut live = LiveCluster::with_steered(steered.clone());
    let mut owners = crate::cluster::build::OwnerIndex::new();
    let mut add = |o: crate::cluster::types::OwnerInfo| {
        owners.insert((o.kind.clone(), o.namespace.clone(), o.name.clone()), o);
    };
    stores
        .replica_sets
        .state()
        .iter()
        .for_each(|o| add(o.owner_info()));
    stores
        .stateful_sets
        .state()
        .iter()
        .for_each(|o| add(o.owner_info()));
    let rcs = stores.replication_controllers.state();
    rcs.iter().for_each(|o| add(o.owner_info()));
    stores.jobs.state().iter().for_each(|o| add(o.owner_info()));
    stores
        .daemon_sets
        .state()
        .iter()
        .for_each(|o| add(o.owner_info()));
    let node_states = stores.node_states.state();
    let warm = crate::cluster::build::warm_roles_by_node(node_states.iter().map(|s| &**s));
    let (nodes, pdbs, pods) = (
        stores.nodes.state(),
        stores.pdbs.state(),
        stores.pods.state(),
    );
    let count = owners.len() + nodes.len() + pdbs.len() + pods.len();
    let events = [
        ClusterEvent::Volumes(volumes(stores)),
        ClusterEvent::Providers(&stores.providers.index()),
        ClusterEvent::WarmRoles(warm),
        ClusterEvent::Owners(owners),
    ];
    let all = events
        .into_iter()
        .chain(nodes.iter().map(|n| ClusterEvent::NodeApplied(n)))
        .chain(pdbs.iter().map(|b| ClusterEvent::PdbApplied(b)))
        .chain(pods.iter().map(|p| ClusterEvent::PodApplied(p)));
    for e in all {
        if let Err(e) = live.apply(e) {
            // No fork is open on a model nobody has seen yet; say so if that ever changes.
            tracing::warn!(error = %e, "building the cluster model");
        }
    }
    (live, count)
}

/// Where the claims of the caches let their pods run.
fn volumes(stores: &Caches<'_>) -> Result<VolumeIndex, SnapshotError> {
    let (pvs, pvcs, classes) = (
        stores.persistent_volumes.state(),
        stores.persistent_volume_claims.state(),
        stores.storage_classes.state(),
    );
    volume_index(
        pvs.iter().map(|v| &**v),
        pvcs.iter().map(|c| &**c),
        classes.iter().map(|c| &**c),
    )
}

/// Applies the changed keys, reading each object from its cache (gone from it: deleted), in the
/// order a build reads them: volumes, NodeStates and providers, owners, nodes, budgets, pods.
fn apply(live: &mut LiveCluster, stores: &Caches<'_>, dirty: &Dirty) -> Result<(), UpdateError> {
    if dirty.volumes {
        live.apply(ClusterEvent::Volumes(volumes(stores)))?;
    }
    if dirty.providers {
        live.apply(ClusterEvent::Providers(&stores.providers.index()))?;
    }
    if dirty.node_states {
        let states = stores.node_states.state();
        let warm = crate::cluster::build::warm_roles_by_node(states.iter().map(|s| &**s));
        live.apply(ClusterEvent::WarmRoles(warm))?;
    }
    for (kind, ns, name) in &dirty.owners {
        let info = match kind {
            OwnerKind::ReplicaSet => owner(stores.replica_sets, ns, name),
            OwnerKind::StatefulSet => owner(stores.stateful_sets, ns, name),
            OwnerKind::DaemonSet => owner(stores.daemon_sets, ns, name),
            OwnerKind::Job => owner(stores.jobs, ns, name),
            OwnerKind::ReplicationController => owner(stores.replication_controllers, ns, name),
        };
        live.apply(match info {
            Some(o) => ClusterEvent::OwnerApplied(o),
            None => ClusterEvent::OwnerDeleted {
                kind: kind.name(),
                namespace: ns,
                name,
            },
        })?;
    }
    for name in &dirty.nodes {
        match stores.nodes.get(&ObjectRef::new(name)) {
            Some(n) => live.apply(ClusterEvent::NodeApplied(&n))?,
            None => live.apply(ClusterEvent::NodeDeleted(name))?,
        }
    }
    for (ns, name) in &dirty.pdbs {
        match stores.pdbs.get(&namespaced(ns, name)) {
            Some(b) => live.apply(ClusterEvent::PdbApplied(&b))?,
            None => live.apply(ClusterEvent::PdbDeleted {
                namespace: ns,
                name,
            })?,
        }
    }
    for (ns, name) in &dirty.pods {
        match stores.pods.get(&namespaced(ns, name)) {
            Some(p) => live.apply(ClusterEvent::PodApplied(&p))?,
            None => live.apply(ClusterEvent::PodDeleted {
                namespace: ns,
                name,
            })?,
        }
    }
    Ok(())
}

fn owner<K>(store: &Store<K>, ns: &str, name: &str) -> Option<crate::cluster::types::OwnerInfo>
where
    K: kube::Resource<DynamicType = ()> + Workload + Clone + 'static,
{
    store.get(&namespaced(ns, name)).map(|o| o.owner_info())
}
