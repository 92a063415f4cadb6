//! Shared reflectors: one watch per kind (Nodes, Pods, PDBs and the owner kinds), shared by every
//! policy; each event marks the shared model, the pod watch ticks drains, the node watch wakes
//! the policies.

use std::collections::BTreeSet;
use std::sync::{Arc, MutexGuard};

use crate::cluster::CachedPod;
use ebb_api::names;
use ebb_api::nodestate::NodeState;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, ReplicationController,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::ended_pods::EndedPods;
use super::lists::InitialList;
use super::machine_caches::{ProviderSources, ProviderStores};
use super::pod_stream::{self, PodEncoding};
use super::shared_model::{Caches, Catchup, OwnerKind, SharedModel};
use super::trim::Trim;
use crate::cluster::ClusterObjects;

/// The caches of every kind the controller reads.
#[derive(Clone)]
pub struct Stores {
    pub nodes: Store<Node>,
    pub pods: Store<CachedPod>,
    /// The pods by node and by namespace (kept by the pod watch).
    pub pod_index: super::pod_index::PodIndex,
    pub pdbs: Store<PodDisruptionBudget>,
    pub replica_sets: Store<ReplicaSet>,
    pub stateful_sets: Store<StatefulSet>,
    pub daemon_sets: Store<DaemonSet>,
    pub jobs: Store<Job>,
    pub replication_controllers: Store<ReplicationController>,
    /// Volumes, claims and their classes: where each pod's volumes let it run (a pod on a local
    /// volume cannot leave its node).
    pub persistent_volumes: Store<PersistentVolume>,
    pub persistent_volume_claims: Store<PersistentVolumeClaim>,
    pub storage_classes: Store<StorageClass>,
    /// The node agents' NodeStates (warm data per node): read when there, never waited for, so
    /// a cluster without agents (or without the CRD) still plans.
    pub node_states: Store<NodeState>,
    /// Cluster API's and Karpenter's objects, when their removal is enabled.
    pub providers: ProviderStores,
    /// The cluster model built from these caches, kept current by their events.
    pub model: Arc<SharedModel>,
    /// Last states of pods that ended or were deleted (placement classifies ends by them).
    pub ended: Arc<EndedPods>,
}

/// The running watches and what they signal.
pub struct Watches {
    pub stores: Stores,
    /// Ticks on every pod event.
    pub pod_changes: watch::Receiver<u64>,
    /// A unit per node event that changed labels, taints or schedulability (coalesced).
    pub node_changes: mpsc::Receiver<()>,
    /// Ticks on every PodDisruptionBudget event.
    pub pdb_changes: watch::Receiver<u64>,
    /// A unit when a budget allows more disruptions than before, or a new one appears
    /// (coalesced): drains waiting for it may start.
    pub budget_rises: mpsc::Receiver<()>,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Run one reflector; `on_event` sees every applied or deleted object, and `Changed` when a
/// re-list has replaced the cache (objects deleted meanwhile vanish without an event of their
/// own, and a waiter on a change must look again).
fn reflect<K>(
    api: Api<K>,
    lists: InitialList,
    kind: &'static str,
    on_event: impl Fn(Changed<'_, K>) + Send + 'static,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Trim
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflect_events(watcher(api, lists.config()), kind, on_event)
}

/// [`reflect`] over watcher events from `events` (kube's `watcher` or another source of the
/// same events): the same backoff, trimming and cache.
fn reflect_events<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    kind: &'static str,
    on_event: impl Fn(Changed<'_, K>) + Send + 'static,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Trim + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = events
        .default_backoff()
        .modify(|o| {
            o.trim();
            o.seen_at(jiff::Timestamp::now());
        })
        .reflect(writer);
    let task = tokio::spawn(drive(stream, kind, on_event));
    (store, task)
}

/// What changed in a cache.
pub enum Changed<'a, K> {
    /// An object was added or modified (or listed again).
    Applied(&'a K),
    /// An object was deleted.
    Deleted(&'a K),
    /// A re-list finished: the cache now holds exactly the listed objects.
    Relisted,
}

async fn drive<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    kind: &'static str,
    on_event: impl Fn(Changed<'_, K>),
) {
    let mut stream = std::pin::pin!(stream);
    let mut seen: u64 = 0;
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                seen += 1;
                on_event(Changed::Applied(&o));
                if seen.is_multiple_of(10_000) {
                    tracing::debug!(kind, seen, "watch events");
                }
            }
            Ok(watcher::Event::Delete(o)) => {
                seen += 1;
                on_event(Changed::Deleted(&o));
                if seen.is_multiple_of(10_000) {
                    tracing::debug!(kind, seen, "watch events");
                }
            }
            Ok(watcher::Event::InitDone) => on_event(Changed::Relisted),
            Ok(watcher::Event::Init) => {}
            // The backoff retries; say so once per failure.
            Err(e) => tracing::warn!(kind, error = %e, "watch failed; retrying"),
        }
    }
    tracing::info!(kind, seen, "watch ended");
}

/// Hash of what of a node matters to the policies: labels, taints, schedulability, deletion.
pub(crate) fn node_fingerprint(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    if let Some(spec) = &node.spec {
        spec.unschedulable.hash(&mut h);
        for t in spec.taints.iter().flatten() {
            (&t.key, &t.value, &t.effect).hash(&mut h);
        }
    }
    h.finish()
}

/// True unless the API server says it does not serve `K` at all (404 on a list): optional kinds
/// (ReplicationControllers) are then left out instead of blocking the cache sync forever.
async fn served<K>(api: &Api<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let listed = api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await;
    !matches!(listed, Err(kube::Error::Api(s)) if s.code == 404)
}

/// A cache that is synced and stays empty.
fn empty<K>() -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    // The store stays readable; with the writer gone it would report "dropped" to waiters.
    std::mem::forget(writer);
    store
}

/// The PodDisruptionBudget cache: `changes` ticks on every event, `rises` gets a unit when a
/// budget allows more disruptions than before, appears, or the cache was re-listed.
/// The node watch: marks the model and wakes the policy loops on a change of what they read
/// (labels, taints, schedulability: [`node_fingerprint`]), or after a re-list.
fn watch_nodes(
    client: kube::Client,
    lists: InitialList,
    model: Arc<SharedModel>,
    changes: mpsc::Sender<()>,
) -> (Store<Node>, JoinHandle<()>) {
    let seen = std::sync::Mutex::new(std::collections::HashMap::<String, u64>::new());
    reflect(Api::<Node>::all(client), lists, "Node", move |c| {
        mark(&model, &c, |m, _, name| m.node_changed(name));
        let fresh = match c {
            Changed::Applied(n) | Changed::Deleted(n) => {
                let print = node_fingerprint(n);
                seen.lock()
                    .map(|mut seen| seen.insert(n.name_any(), print) != Some(print))
                    .unwrap_or(true)
            }
            Changed::Relisted => true,
        };
        if fresh {
            // Full channel: a wake-up is already pending, which is all we need.
            let _ = changes.try_send(());
        }
    })
}

/// What the pod watch shows `on_pod`: a pod applied, or deleted.
#[derive(Clone, Copy, Debug)]
pub enum PodSeen<'a> {
    Applied(&'a CachedPod),
    Deleted(&'a CachedPod),
}

/// The pod watch: shows `on_pod` every pod applied or deleted (before the model reads it, so
/// what `on_pod` tells the model is in the same change), marks the model, ticks `changes`.
#[allow(clippy::too_many_arguments)]
fn watch_pods(
    client: kube::Client,
    lists: InitialList,
    encoding: PodEncoding,
    model: Arc<SharedModel>,
    ended: Arc<EndedPods>,
    index: super::pod_index::PodIndex,
    changes: watch::Sender<u64>,
    on_pod: impl Fn(PodSeen<'_>) + Send + 'static,
) -> (Store<CachedPod>, JoinHandle<()>) {
    let on_event = move |c: Changed<'_, CachedPod>| {
        match &c {
            Changed::Applied(p) => {
                index.applied(p);
                // Every pod that ended (a Job's, a failed one): how it ended, for histories.
                if EndedPods::is_terminal(p) {
                    ended.record((*p).clone());
                }
                on_pod(PodSeen::Applied(p))
            }
            Changed::Deleted(p) => {
                index.deleted(p);
                // A deleted pod placement released: where it ran and how it went.
                if p.annotations().contains_key(names::ANNOTATION_PLACEMENT) {
                    ended.record((*p).clone());
                }
                on_pod(PodSeen::Deleted(p))
            }
            Changed::Relisted => {}
        }
        mark(&model, &c, SharedModel::pod_changed);
        changes.send_modify(|v| *v = v.wrapping_add(1));
    };
    match encoding {
        PodEncoding::Json => reflect(Api::<CachedPod>::all(client), lists, "Pod", on_event),
        PodEncoding::Protobuf => {
            let events =
                pod_stream::watch(client, lists, Default::default()).map_err(watcher::Error::from);
            reflect_events(events, "Pod", on_event)
        }
    }
}

fn watch_budgets(
    client: kube::Client,
    lists: InitialList,
    model: Arc<SharedModel>,
    index: super::pod_index::PodIndex,
    changes: watch::Sender<u64>,
    rises: mpsc::Sender<()>,
) -> (Store<PodDisruptionBudget>, JoinHandle<()>) {
    let allowed_before = std::sync::Mutex::new(std::collections::HashMap::<String, i32>::new());
    let api = Api::<PodDisruptionBudget>::all(client);
    reflect(api, lists, "PodDisruptionBudget", move |c| {
        mark(&model, &c, SharedModel::pdb_changed);
        if let Changed::Deleted(b) = &c {
            // The pods it selected are no longer kept for it.
            index.forget_selection(&format!(
                "{}/{}",
                b.namespace().unwrap_or_default(),
                b.name_any()
            ));
        }
        changes.send_modify(|v| *v = v.wrapping_add(1));
        let rose = match c {
            Changed::Applied(b) | Changed::Deleted(b) => {
                let key = format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
                let allowed = b.status.as_ref().map_or(0, |s| s.disruptions_allowed);
                allowed_before
                    .lock()
                    .map(|mut m| m.insert(key, allowed).is_none_or(|was| allowed > was))
                    .unwrap_or(true)
            }
            Changed::Relisted => true,
        };
        if rose {
            // Full channel: a wake-up is already pending, which is all we need.
            let _ = rises.try_send(());
        }
    })
}

/// Marks what a cache event changed in the model: `key` names the object (namespace and name);
/// a re-list asks for a rebuild.
fn mark<K: Resource>(
    model: &SharedModel,
    c: &Changed<'_, K>,
    changed: impl FnOnce(&SharedModel, &str, &str),
) {
    match c {
        Changed::Applied(o) | Changed::Deleted(o) => {
            let meta = o.meta();
            changed(
                model,
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
            );
        }
        Changed::Relisted => model.relisted(),
    }
}

/// Start the watches (cluster-wide), with those of the enabled removal providers.
pub async fn start(
    client: kube::Client,
    providers: &ProviderSources,
    lists: InitialList,
) -> Watches {
    start_seeing_pods(
        client,
        providers,
        lists,
        PodEncoding::default(),
        Default::default(),
        |_| {},
    )
    .await
}

/// [`start`], with `on_pod` seeing every pod the pod watch applies or deletes (after its cache
/// holds it); `pods` is how the pod watch asks for pods; `model` is the model the watches keep
/// current.
pub async fn start_seeing_pods(
    client: kube::Client,
    providers: &ProviderSources,
    lists: InitialList,
    pods: PodEncoding,
    model: Arc<SharedModel>,
    on_pod: impl Fn(PodSeen<'_>) + Send + 'static,
) -> Watches {
    let (pod_tx, pod_changes) = watch::channel(0u64);
    let (node_tx, node_changes) = mpsc::channel(1);
    let (pdb_tx, pdb_changes) = watch::channel(0u64);
    let (rise_tx, budget_rises) = mpsc::channel(1);
    let mut tasks = Vec::new();
    let (nodes, t) = watch_nodes(client.clone(), lists, model.clone(), node_tx);
    tasks.push(t);
    let ended = Arc::new(EndedPods::default());
    let pod_index = super::pod_index::PodIndex::watched();
    let (pods, t) = watch_pods(
        client.clone(),
        lists,
        pods,
        model.clone(),
        ended.clone(),
        pod_index.clone(),
        pod_tx,
        on_pod,
    );
    tasks.push(t);
    macro_rules! owners {
        ($kind:ident) => {{
            let m = model.clone();
            let (s, t) = reflect(
                Api::<$kind>::all(client.clone()),
                lists,
                stringify!($kind),
                move |c| {
                    mark(&m, &c, |m, ns, name| {
                        m.owner_changed(OwnerKind::$kind, ns, name)
                    })
                },
            );
            tasks.push(t);
            s
        }};
    }
    macro_rules! volumes {
        ($kind:ident) => {{
            let m = model.clone();
            let (s, t) = reflect(
                Api::<$kind>::all(client.clone()),
                lists,
                stringify!($kind),
                move |c| mark(&m, &c, |m, _, _| m.volumes_changed()),
            );
            tasks.push(t);
            s
        }};
    }
    let stores = Stores {
        nodes,
        pods,
        pod_index: pod_index.clone(),
        pdbs: {
            let (s, t) = watch_budgets(
                client.clone(),
                lists,
                model.clone(),
                pod_index.clone(),
                pdb_tx,
                rise_tx,
            );
            tasks.push(t);
            s
        },
        replica_sets: owners!(ReplicaSet),
        stateful_sets: owners!(StatefulSet),
        daemon_sets: owners!(DaemonSet),
        jobs: owners!(Job),
        replication_controllers: if served(&Api::<ReplicationController>::all(client.clone())).await
        {
            owners!(ReplicationController)
        } else {
            tracing::warn!(
                "the API server does not serve ReplicationControllers; pods owned by one count as having no known controller"
            );
            empty()
        },
        persistent_volumes: volumes!(PersistentVolume),
        persistent_volume_claims: volumes!(PersistentVolumeClaim),
        storage_classes: volumes!(StorageClass),
        node_states: {
            let m = model.clone();
            let (s, t) = reflect(
                Api::<NodeState>::all(client.clone()),
                lists,
                "NodeState",
                move |c| mark(&m, &c, |m, _, _| m.node_states_changed()),
            );
            tasks.push(t);
            s
        },
        providers: {
            let m = model.clone();
            ProviderStores::start(providers, lists, &mut tasks, move || m.providers_changed())
        },
        model,
        ended,
    };
    Watches {
        stores,
        pod_changes,
        node_changes,
        pdb_changes,
        budget_rises,
        tasks,
    }
}

impl Stores {
    /// The cluster model, brought up to date with these caches (see [`SharedModel::current`]).
    pub fn model(&self) -> (MutexGuard<'_, crate::cluster::LiveCluster>, Catchup) {
        self.model.current(&Caches {
            nodes: &self.nodes,
            pods: &self.pods,
            pdbs: &self.pdbs,
            replica_sets: &self.replica_sets,
            stateful_sets: &self.stateful_sets,
            daemon_sets: &self.daemon_sets,
            jobs: &self.jobs,
            replication_controllers: &self.replication_controllers,
            persistent_volumes: &self.persistent_volumes,
            persistent_volume_claims: &self.persistent_volume_claims,
            storage_classes: &self.storage_classes,
            node_states: &self.node_states,
            providers: &self.providers,
        })
    }

    /// Wait until every cache has listed its kind once.
    pub async fn wait_synced(&self) -> Result<(), reflector::store::WriterDropped> {
        self.nodes.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        self.pdbs.wait_until_ready().await?;
        self.replica_sets.wait_until_ready().await?;
        self.stateful_sets.wait_until_ready().await?;
        self.daemon_sets.wait_until_ready().await?;
        self.jobs.wait_until_ready().await?;
        self.replication_controllers.wait_until_ready().await?;
        self.persistent_volumes.wait_until_ready().await?;
        self.persistent_volume_claims.wait_until_ready().await?;
        self.storage_classes.wait_until_ready().await?;
        self.providers.wait_synced().await?;
        Ok(())
    }

    /// The objects a snapshot is built from. Pods bound to a node the cache does not know (a
    /// node deleted a moment ago) are left out: they are going away with it.
    pub fn objects(&self) -> ClusterObjects {
        fn all<K: Clone + kube::Resource<DynamicType = ()> + 'static>(s: &Store<K>) -> Vec<K> {
            s.state().iter().map(|o| (**o).clone()).collect()
        }
        let nodes = all(&self.nodes);
        let names: BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        let pods = self
            .pods
            .state()
            .iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_none_or(|n| names.contains(n))
            })
            .map(|p| (**p).clone())
            .collect();
        ClusterObjects {
            nodes,
            pods,
            pdbs: all(&self.pdbs),
            replica_sets: all(&self.replica_sets),
            stateful_sets: all(&self.stateful_sets),
            daemon_sets: all(&self.daemon_sets),
            jobs: all(&self.jobs),
            replication_controllers: all(&self.replication_controllers),
            persistent_volumes: all(&self.persistent_volumes),
            persistent_volume_claims: all(&self.persistent_volume_claims),
            storage_classes: all(&self.storage_classes),
            node_states: all(&self.node_states),
            providers: self.providers.index(),
        }
    }
}
