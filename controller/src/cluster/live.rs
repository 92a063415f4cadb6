//! The one cluster model every policy and placement share: a [`ClusterSnapshot`] kept current by
//! watch events, each object parsed once when it changes; a loop forks it instead of rebuilding.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::cluster::CachedPod;
use ebb_api::nodestate::NodeState;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use super::build::{
    ClaimPlacement, ClusterObjects, OwnerIndex, PdbRule, SnapshotError, VolumeIndex, owner_index,
    parse_node, parse_pdb, parse_pod, pdb_counts, volume_index, warm_roles_by_node,
};
use super::incremental::UpdateError;
use super::machines::{ProviderIndex, link};
use super::snapshot::ClusterSnapshot;
use super::types::{LocalVolume, NodeId, OwnerInfo, PdbInfo, PodId, PodInfo, SchedRequirements};

/// A pod's key in the watch: (namespace, name).
pub type PodKey = (String, String);

/// One change the watches report.
#[derive(Clone, Debug)]
pub enum ClusterEvent<'a> {
    /// A node was added or changed.
    NodeApplied(&'a Node),
    /// A node was deleted (by name).
    NodeDeleted(&'a str),
    PodApplied(&'a CachedPod),
    PodDeleted {
        namespace: &'a str,
        name: &'a str,
    },
    PdbApplied(&'a PodDisruptionBudget),
    PdbDeleted {
        namespace: &'a str,
        name: &'a str,
    },
    /// A workload owner was added or changed (see [`super::build::Workload::owner_info`]).
    OwnerApplied(OwnerInfo),
    OwnerDeleted {
        kind: &'a str,
        namespace: &'a str,
        name: &'a str,
    },
    /// Every owner at once (for example after a relist).
    Owners(OwnerIndex),
    /// The node agents' NodeStates (all of them): the warm roles of every node.
    NodeStates(&'a [NodeState]),
    /// The warm roles of every node, counted from the NodeStates
    /// ([`super::build::warm_roles_by_node`]).
    WarmRoles(HashMap<String, u32>),
    /// Cluster API's and Karpenter's objects changed: every node's machine link.
    Providers(&'a ProviderIndex),
    /// PersistentVolumes, claims and StorageClasses changed: where each claim lets its pods
    /// run ([`super::build::volume_index`] of all of them).
    Volumes(Result<VolumeIndex, SnapshotError>),
}

impl<'a> ClusterEvent<'a> {
    /// The deletion of this pod.
    pub fn pod_deleted(pod: &'a CachedPod) -> Self {
        ClusterEvent::PodDeleted {
            namespace: pod.metadata.namespace.as_deref().unwrap_or("default"),
            name: pod.metadata.name.as_deref().unwrap_or_default(),
        }
    }

    /// The deletion of this budget.
    pub fn pdb_deleted(pdb: &'a PodDisruptionBudget) -> Self {
        ClusterEvent::PdbDeleted {
            namespace: pdb.metadata.namespace.as_deref().unwrap_or_default(),
            name: pdb.metadata.name.as_deref().unwrap_or_default(),
        }
    }
}

/// Where a pod the watch reported is in the model.
#[derive(Clone, Debug)]
enum PodSlot {
    /// In the snapshot, with this UID.
    In(String),
    /// Parsed, bound to a node the model does not have (yet): held aside until it appears.
    Aside(String),
    /// Could not be parsed (the error is in `bad_pods`).
    Failed,
}

/// What the model keeps of a budget beyond its [`super::types::PdbInfo`]: how to compute its
/// allowance when its status is not trusted, and the pods it counts.
#[derive(Clone, Debug)]
struct PdbCounts {
    rule: Option<PdbRule>,
    /// Pods selected and not finished.
    expected: i64,
    /// Among them, ready and placed.
    healthy: i64,
}

/// The cluster model, kept current by [`LiveCluster::apply`].
///
/// It equals what [`super::build_snapshot`] builds from the same objects (pods bound to a node
/// the model lacks left out, as the controller's stores leave them out), up to ids and order:
/// PDBs are kept in (namespace, name) order. Objects that cannot be parsed are recorded, and
/// [`LiveCluster::snapshot_mut`] reports the first until it is fixed or deleted.
///
/// A loop takes [`LiveCluster::snapshot_mut`] and runs the planner on it (which forks and
/// reverts); events wait while a fork is open. Node, pod and class ids change as events are
/// applied, so each loop uses a fresh [`super::PredicateChecker`].
#[derive(Clone, Debug)]
pub struct LiveCluster {
    snap: ClusterSnapshot,
    pods: HashMap<PodKey, PodSlot>,
    /// Pods held aside, by the node they are bound to.
    aside: HashMap<String, HashMap<PodKey, (PodInfo, SchedRequirements)>>,
    /// UIDs of finished pods (in the snapshot, unplaced) by the node they ran on.
    finished: HashMap<String, HashSet<String>>,
    /// Claims of the pods that mount PersistentVolumeClaims, in volume order.
    claims: HashMap<PodKey, Vec<String>>,
    /// Parallel to `snap.pdbs` (both in (namespace, name) order).
    pdb_counts: Vec<PdbCounts>,
    volumes: VolumeIndex,
    providers: ProviderIndex,
    warm: HashMap<String, u32>,
    bad_nodes: BTreeMap<String, SnapshotError>,
    bad_volumes: Option<SnapshotError>,
    /// With the node each is bound to (`spec.nodeName` as written).
    bad_pods: BTreeMap<PodKey, (Option<String>, SnapshotError)>,
    bad_pdbs: BTreeMap<(String, String), SnapshotError>,
    /// Pending pods ebb steered, counted on their planned node (see [`super::SteeredPods`]).
    steered: super::SteeredPods,
}

impl Default for LiveCluster {
    fn default() -> Self {
        LiveCluster {
            snap: ClusterSnapshot::from_parts(
                Vec::new(),
                Vec::new(),
                Vec::new(),
                HashMap::new(),
                Vec::new(),
                HashMap::new(),
                Vec::new(),
            ),
            pods: HashMap::new(),
            aside: HashMap::new(),
            finished: HashMap::new(),
            claims: HashMap::new(),
            pdb_counts: Vec::new(),
            volumes: VolumeIndex::new(),
            providers: ProviderIndex::default(),
            warm: HashMap::new(),
            bad_nodes: BTreeMap::new(),
            bad_volumes: None,
            bad_pods: BTreeMap::new(),
            bad_pdbs: BTreeMap::new(),
            steered: Default::default(),
        }
    }
}

/// The key of a pod (its namespace "default" when unset, as [`parse_pod`] reads it).
pub fn pod_key(pod: &CachedPod) -> PodKey {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The node affinity `claims` (of a pod of `namespace`, in volume order) add to the pod, and
/// its first claim bound to a local volume, as [`parse_pod`] reads them.
fn claim_facts(
    volumes: &VolumeIndex,
    namespace: &str,
    claims: &[String],
) -> (
    Vec<Vec<super::types::NodeSelectorTerm>>,
    Option<LocalVolume>,
) {
    let mut terms = Vec::new();
    let mut local = None;
    for c in claims {
        let Some(p) = volumes.get(&(namespace.to_string(), c.clone())) else {
            continue;
        };
        if let Some(t) = p.terms() {
            terms.push(t);
        }
        if let (ClaimPlacement::Bound { pv, .. }, None) = (p, &local) {
            local = Some(LocalVolume {
                claim: c.clone(),
                pv: pv.clone(),
            });
        }
    }
    (terms, local)
}

/// Claims a pod mounts, in volume order.
fn pvc_claims(pod: &CachedPod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect()
}

impl LiveCluster {
    /// An empty model that counts the pending pods `steered` vouches for on their planned node.
    pub fn with_steered(steered: super::SteeredPods) -> Self {
        LiveCluster {
            steered,
            ..LiveCluster::default()
        }
    }

    /// The model of `objects`, built by applying them as events.
    pub fn from_objects(objects: &ClusterObjects) -> Self {
        let mut live = LiveCluster::default();
        let events = [
            ClusterEvent::Volumes(volume_index(
                &objects.persistent_volumes,
                &objects.persistent_volume_claims,
                &objects.storage_classes,
            )),
            ClusterEvent::Providers(&objects.providers),
            ClusterEvent::NodeStates(&objects.node_states),
            ClusterEvent::Owners(owner_index(objects)),
        ];
        let nodes = objects.nodes.iter().map(ClusterEvent::NodeApplied);
        let pdbs = objects.pdbs.iter().map(ClusterEvent::PdbApplied);
        let pods = objects.pods.iter().map(ClusterEvent::PodApplied);
        for e in events.into_iter().chain(nodes).chain(pdbs).chain(pods) {
            // No fork is open on a model nobody has seen yet.
            let _ = live.apply(e);
        }
        live
    }

    /// Applies one watch event. Refused while a fork of the snapshot is open.
    pub fn apply(&mut self, event: ClusterEvent<'_>) -> Result<(), UpdateError> {
        if self.snap.fork_depth() > 0 {
            return Err(UpdateError::ForkOpen);
        }
        match event {
            ClusterEvent::NodeApplied(n) => self.upsert_node(n),
            ClusterEvent::NodeDeleted(name) => {
                self.bad_nodes.remove(name);
                self.drop_node(name)
            }
            ClusterEvent::PodApplied(p) => self.upsert_pod(p),
            ClusterEvent::PodDeleted { namespace, name } => {
                self.remove_pod(&(namespace.to_string(), name.to_string()));
                Ok(())
            }
            ClusterEvent::PdbApplied(p) => self.upsert_pdb(p),
            ClusterEvent::PdbDeleted { namespace, name } => {
                let key = (namespace.to_string(), name.to_string());
                self.bad_pdbs.remove(&key);
                self.remove_pdb(&key);
                Ok(())
            }
            ClusterEvent::OwnerApplied(o) => self.snap.upsert_owner(o),
            ClusterEvent::OwnerDeleted {
                kind,
                namespace,
                name,
            } => self.snap.remove_owner(kind, namespace, name),
            ClusterEvent::Owners(o) => self.snap.set_owners(o),
            ClusterEvent::NodeStates(states) => {
                self.apply(ClusterEvent::WarmRoles(warm_roles_by_node(states)))
            }
            ClusterEvent::WarmRoles(warm) => {
                self.warm = warm;
                for id in 0..self.snap.node_count() as NodeId {
                    let node = self.snap.node_extras_mut(id);
                    node.warm_roles = self.warm.get(&node.name).copied().unwrap_or(0);
                }
                Ok(())
            }
            ClusterEvent::Providers(index) => {
                self.providers = index.clone();
                for id in 0..self.snap.node_count() as NodeId {
                    let node = self.snap.node_extras_mut(id);
                    node.machine = link(&node.name, &node.labels, &node.annotations, index);
                }
                Ok(())
            }
            ClusterEvent::Volumes(index) => self.set_volumes(index),
        }
    }

    /// The first object that cannot be read (nodes, volumes, pods, budgets in that order, each by
    /// name), as building a snapshot from the same objects would report it.
    pub fn error(&self) -> Option<&SnapshotError> {
        let bound_here = |node: &Option<String>| match node {
            None => true,
            Some(n) => self.snap.node_id(n).is_some(),
        };
        self.bad_nodes
            .values()
            .next()
            .or(self.bad_volumes.as_ref())
            .or_else(|| {
                self.bad_pods
                    .values()
                    .find(|(node, _)| bound_here(node))
                    .map(|(_, e)| e)
            })
            .or_else(|| self.bad_pdbs.values().next())
    }

    /// The model for a loop to read, or the error that stops loops.
    pub fn snapshot(&self) -> Result<&ClusterSnapshot, SnapshotError> {
        match self.error() {
            Some(e) => Err(e.clone()),
            None => Ok(&self.snap),
        }
    }

    /// The model for a loop to fork (`plan` forks and reverts it, leaving it as it was), or the
    /// error that stops loops.
    pub fn snapshot_mut(&mut self) -> Result<&mut ClusterSnapshot, SnapshotError> {
        match self.error() {
            Some(e) => Err(e.clone()),
            None => Ok(&mut self.snap),
        }
    }

    /// The Cluster API and Karpenter objects each node's machine is resolved with.
    pub fn providers(&self) -> &ProviderIndex {
        &self.providers
    }

    /// The model whatever errors there are (for tests and diagnostics).
    pub fn model(&self) -> &ClusterSnapshot {
        &self.snap
    }

    /// Pods held aside because the node they are bound to is not in the model.
    pub fn held_aside(&self) -> usize {
        self.aside.values().map(HashMap::len).sum()
    }

    // ---- nodes -------------------------------------------------------------------------

    fn upsert_node(&mut self, node: &Node) -> Result<(), UpdateError> {
        let mut info = match parse_node(node) {
            Ok(i) => i,
            Err(e) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                self.drop_node(&name)?;
                self.bad_nodes.insert(name, e);
                return Ok(());
            }
        };
        self.bad_nodes.remove(&info.name);
        info.machine = link(&info.name, &info.labels, &info.annotations, &self.providers);
        info.warm_roles = self.warm.get(&info.name).copied().unwrap_or(0);
        let name = info.name.clone();
        let new = self.snap.node_id(&name).is_none();
        self.snap.upsert_node(info)?;
        if new && let Some(waiting) = self.aside.remove(&name) {
            for (key, (info, req)) in waiting {
                self.admit(key, info, req)?;
            }
        }
        Ok(())
    }

    /// Takes a node out of the model; the pods bound to it are held aside.
    fn drop_node(&mut self, name: &str) -> Result<(), UpdateError> {
        let Some(id) = self.snap.node_id(name) else {
            return Ok(());
        };
        let mut uids: Vec<String> = self
            .snap
            .pods_on(id)
            .iter()
            .map(|p| self.snap.pod(*p).uid.to_string())
            .collect();
        uids.extend(self.finished.remove(name).into_iter().flatten());
        for uid in uids {
            let (info, req) = self.take(&uid)?;
            let key = (info.namespace.clone(), info.name.clone());
            self.pods
                .insert(key.clone(), PodSlot::Aside(name.to_string()));
            self.aside
                .entry(name.to_string())
                .or_default()
                .insert(key, (info, req));
        }
        self.snap.remove_node(name)
    }

    // ---- pods --------------------------------------------------------------------------

    fn upsert_pod(&mut self, pod: &CachedPod) -> Result<(), UpdateError> {
        let key = pod_key(pod);
        self.remove_pod(&key);
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let planned = self.steered.planned(&key);
        let (info, req) = match parse_pod(pod, &self.volumes, planned.as_deref()) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.bad_pods.insert(key.clone(), (bound, e));
                self.pods.insert(key, PodSlot::Failed);
                return Ok(());
            }
        };
        let claims = pvc_claims(pod);
        if !claims.is_empty() {
            self.claims.insert(key.clone(), claims);
        }
        // Bound or nominated to a node the model lacks: held aside until it appears.
        match info.node_name.clone() {
            Some(node) if self.snap.node_id(&node).is_none() => {
                self.pods.insert(key.clone(), PodSlot::Aside(node.clone()));
                self.aside.entry(node).or_default().insert(key, (info, req));
                Ok(())
            }
            _ => self.admit(key, info, req),
        }
    }

    /// Puts a parsed pod whose node (if any) is in the model into the snapshot.
    fn admit(
        &mut self,
        key: PodKey,
        info: PodInfo,
        req: SchedRequirements,
    ) -> Result<(), UpdateError> {
        let node = match &info.node_name {
            Some(n) if !info.terminal => self.snap.node_id(n),
            _ => None,
        };
        let uid = info.uid.to_string();
        if info.terminal
            && let Some(n) = &info.node_name
        {
            self.finished
                .entry(n.clone())
                .or_default()
                .insert(uid.clone());
        }
        match self.snap.insert_pod(info, req, node) {
            Ok(id) => {
                self.count_in_pdbs(id, 1);
                self.pods.insert(key, PodSlot::In(uid));
                Ok(())
            }
            Err(UpdateError::DuplicatePod(pod)) => {
                // Another pod has this UID (the API server never does that); the first stays.
                tracing::warn!(%pod, %uid, "two pods share a UID; the second is left out");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Removes a pod from the snapshot (with its budget counts and finished-pod entry).
    fn take(&mut self, uid: &str) -> Result<(PodInfo, SchedRequirements), UpdateError> {
        if let Some(id) = self.snap.pod_by_uid(uid) {
            self.count_in_pdbs(id, -1);
        }
        let (info, req) = self.snap.take_pod(uid)?;
        if info.terminal
            && let Some(n) = &info.node_name
            && let Some(set) = self.finished.get_mut(n)
        {
            set.remove(uid);
            if set.is_empty() {
                self.finished.remove(n);
            }
        }
        Ok((info, req))
    }

    /// Forgets whatever the model has of the pod.
    fn remove_pod(&mut self, key: &PodKey) {
        self.claims.remove(key);
        match self.pods.remove(key) {
            Some(PodSlot::In(uid)) => {
                if let Err(e) = self.take(&uid) {
                    tracing::warn!(pod = %key.1, error = %e, "pod missing from the model");
                }
            }
            Some(PodSlot::Aside(node)) => {
                if let Some(waiting) = self.aside.get_mut(&node) {
                    waiting.remove(key);
                    if waiting.is_empty() {
                        self.aside.remove(&node);
                    }
                }
            }
            Some(PodSlot::Failed) => {
                self.bad_pods.remove(key);
            }
            None => {}
        }
    }

    /// Adds (`delta` 1) or removes (-1) the pod from the counts of the budgets selecting it.
    fn count_in_pdbs(&mut self, pod: PodId, delta: i64) {
        let snap = &mut self.snap;
        let info = &snap.pods[pod as usize];
        let placed = snap.pod_node[pod as usize].is_some();
        let labels = &snap.classes[info.class as usize].req.labels;
        let first = snap
            .pdbs
            .partition_point(|p| p.namespace.as_str() < info.namespace.as_str());
        for i in first..snap.pdbs.len() {
            let pdb = &mut snap.pdbs[i];
            if pdb.namespace != info.namespace {
                break;
            }
            if !pdb_counts(pdb, info, labels) {
                continue;
            }
            let counts = &mut self.pdb_counts[i];
            counts.expected += delta;
            if info.ready && placed {
                counts.healthy += delta;
            }
            if let Some(rule) = &counts.rule {
                (pdb.desired_healthy, pdb.disruptions_allowed) =
                    rule.allowance(counts.expected, counts.healthy);
            }
        }
    }

    // ---- budgets -----------------------------------------------------------------------

    fn upsert_pdb(&mut self, pdb: &PodDisruptionBudget) -> Result<(), UpdateError> {
        let key = (
            pdb.metadata.namespace.clone().unwrap_or_default(),
            pdb.metadata.name.clone().unwrap_or_default(),
        );
        let parsed = match parse_pdb(pdb) {
            Ok(p) => p,
            Err(e) => {
                self.remove_pdb(&key);
                self.bad_pdbs.insert(key, e);
                return Ok(());
            }
        };
        self.bad_pdbs.remove(&key);
        let Some(parsed) = parsed else {
            self.remove_pdb(&key);
            return Ok(());
        };
        let at = self.pdb_index(&key);
        let (expected, healthy) = match at {
            Ok(i) if self.snap.pdbs[i].selector == parsed.info.selector => {
                (self.pdb_counts[i].expected, self.pdb_counts[i].healthy)
            }
            _ => self.count_pods(&parsed.info),
        };
        let info = parsed.with_counts(expected, healthy);
        let counts = PdbCounts {
            rule: parsed.rule,
            expected,
            healthy,
        };
        match at {
            Ok(i) => {
                self.snap.pdbs[i] = info;
                self.pdb_counts[i] = counts;
            }
            Err(i) => {
                self.snap.pdbs.insert(i, info);
                self.pdb_counts.insert(i, counts);
            }
        }
        Ok(())
    }

    fn remove_pdb(&mut self, key: &(String, String)) {
        if let Ok(i) = self.pdb_index(key) {
            self.snap.pdbs.remove(i);
            self.pdb_counts.remove(i);
        }
    }

    /// Where the budget is (or would go) in `snap.pdbs`.
    fn pdb_index(&self, key: &(String, String)) -> Result<usize, usize> {
        self.snap
            .pdbs
            .binary_search_by(|p| (p.namespace.as_str(), p.name.as_str()).cmp(&(&key.0, &key.1)))
    }

    /// The pods a budget counts, and the ready and placed ones among them (every pod read).
    fn count_pods(&self, pdb: &PdbInfo) -> (i64, i64) {
        let (mut expected, mut healthy) = (0, 0);
        for p in 0..self.snap.pod_count() as PodId {
            if pdb_counts(pdb, self.snap.pod(p), self.snap.pod_labels(p)) {
                expected += 1;
                if self.snap.pod(p).ready && self.snap.node_of(p).is_some() {
                    healthy += 1;
                }
            }
        }
        (expected, healthy)
    }

    // ---- volumes -----------------------------------------------------------------------

    /// New volume facts: the pods whose claims now resolve differently are parsed again (from
    /// what the model kept of them: their claims).
    fn set_volumes(
        &mut self,
        index: Result<VolumeIndex, SnapshotError>,
    ) -> Result<(), UpdateError> {
        let index = match index {
            Ok(i) => i,
            Err(e) => {
                self.bad_volumes = Some(e);
                return Ok(());
            }
        };
        self.bad_volumes = None;
        if index == self.volumes {
            return Ok(());
        }
        self.volumes = index;
        let claims: Vec<(PodKey, Vec<String>)> = self
            .claims
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        for (key, claims) in claims {
            let (terms, local) = claim_facts(&self.volumes, &key.0, &claims);
            match self.pods.get(&key).cloned() {
                Some(PodSlot::In(uid)) => {
                    let Some(id) = self.snap.pod_by_uid(&uid) else {
                        continue;
                    };
                    if self.snap.class_of(id).req.volume_node_affinity == terms
                        && self.snap.pod(id).local_volume == local
                    {
                        continue;
                    }
                    let (mut info, mut req) = self.take(&uid)?;
                    req.volume_node_affinity = terms;
                    info.local_volume = local;
                    self.pods.remove(&key);
                    self.admit(key, info, req)?;
                }
                Some(PodSlot::Aside(node)) => {
                    if let Some((info, req)) = self
                        .aside
                        .get_mut(&node)
                        .and_then(|waiting| waiting.get_mut(&key))
                    {
                        req.volume_node_affinity = terms;
                        info.local_volume = local;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
