//! Builds a [`ClusterSnapshot`] from Kubernetes objects: parses quantities once, resolves
//! owners and local volumes, interns pods into scheduling classes, and computes PDB allowances.

mod nodes;
mod owners;
mod pdbs;
mod pod;
mod selectors;
mod volumes;

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::cluster::CachedPod;
use ebb_api::nodestate::NodeState;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, ReplicationController,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use thiserror::Error;

use super::machines::{ProviderIndex, link};
use super::quantity::{QuantityError, parse_milli, parse_units};
use super::snapshot::ClusterSnapshot;
use super::types::{
    ClassId, NodeId, NodeInfo, PodAffinityTerm, PodInfo, Resources, SchedClass, SchedRequirements,
};
pub use nodes::{parse_node, warm_roles_by_node};
pub use owners::{OwnerIndex, Workload, owner_index};
pub use pdbs::{ParsedPdb, PdbRule, counted as pdb_counts, parse_pdb};
pub use pod::parse_pod;
pub use selectors::selector_from;
pub use volumes::{ClaimPlacement, NO_PROVISIONER, VolumeIndex, volume_index};

/// Label every kubelet sets; added from the node name when missing so `hostname` topology works.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// `kubectl apply`'s copy of the whole object: never read, often the largest annotation.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The annotations the model keeps of an object: all but [`LAST_APPLIED`].
pub fn kept_annotations(all: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    all.into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != LAST_APPLIED)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Objects a snapshot is built from (for example the contents of reflector stores).
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    pub nodes: Vec<Node>,
    pub pods: Vec<CachedPod>,
    pub pdbs: Vec<PodDisruptionBudget>,
    pub replica_sets: Vec<ReplicaSet>,
    pub stateful_sets: Vec<StatefulSet>,
    pub daemon_sets: Vec<DaemonSet>,
    pub jobs: Vec<Job>,
    pub replication_controllers: Vec<ReplicationController>,
    /// Optional: with PVs, PVCs and StorageClasses, pods are placed where their volumes let
    /// them run (a pod on a local volume is pinned to its node).
    pub persistent_volumes: Vec<PersistentVolume>,
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    pub storage_classes: Vec<StorageClass>,
    /// Optional: the node agents' NodeStates, for the roles whose data each node holds warm.
    pub node_states: Vec<NodeState>,
    /// Optional: Cluster API's and Karpenter's objects, for the machine behind each node.
    pub providers: ProviderIndex,
}

/// Input that cannot be turned into a snapshot.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("{kind} {object}: field {field}: {error}")]
    Quantity {
        kind: &'static str,
        object: String,
        field: String,
        error: QuantityError,
    },
    #[error("Pod {pod} is bound to node {node}, which is not in the snapshot; include all nodes")]
    MissingNode { pod: String, node: String },
    #[error("{kind} {object}: {why}")]
    Invalid {
        kind: &'static str,
        object: String,
        why: String,
    },
}

fn quantity_err(
    kind: &'static str,
    object: &str,
    field: String,
    e: QuantityError,
) -> SnapshotError {
    SnapshotError::Quantity {
        kind,
        object: object.to_string(),
        field,
        error: e,
    }
}

/// Adds a resource list (`requests`, `allocatable`, `overhead`) into `Resources`.
fn resources_from<'a>(
    list: impl IntoIterator<Item = (&'a String, &'a Quantity)>,
    kind: &'static str,
    object: &str,
    field: &str,
) -> Result<(Resources, Option<i64>), SnapshotError> {
    let mut r = Resources::default();
    let mut pods = None;
    for (name, q) in list {
        let f = || format!("{field}.{name}");
        match name.as_str() {
            "cpu" => {
                r.cpu_milli = parse_milli(&q.0).map_err(|e| quantity_err(kind, object, f(), e))?
            }
            "memory" => {
                r.memory = parse_units(&q.0).map_err(|e| quantity_err(kind, object, f(), e))?
            }
            "ephemeral-storage" => {
                r.ephemeral_storage =
                    parse_units(&q.0).map_err(|e| quantity_err(kind, object, f(), e))?
            }
            "pods" => {
                pods = Some(parse_units(&q.0).map_err(|e| quantity_err(kind, object, f(), e))?)
            }
            other => {
                let v = parse_milli(&q.0).map_err(|e| quantity_err(kind, object, f(), e))?;
                r.extended.push((other.to_string(), v));
            }
        }
    }
    r.extended.sort();
    Ok((r, pods))
}

/// Builds the snapshot. Pods bound to nodes that are missing are an error; pending pods are
/// kept unplaced; terminal pods are kept but use no resources.
pub fn build_snapshot(objects: &ClusterObjects) -> Result<ClusterSnapshot, SnapshotError> {
    let (nodes, node_ids) = parse_nodes(objects)?;
    let volumes = volume_index(
        &objects.persistent_volumes,
        &objects.persistent_volume_claims,
        &objects.storage_classes,
    )?;
    let mut interned = Interned::default();
    for p in &objects.pods {
        interned.add(p, &volumes, &node_ids)?;
    }
    mark_anti_affinity_targets(&mut interned.classes);
    let pdbs = pdbs::pdb_infos(
        &objects.pdbs,
        &pdbs::PodsView {
            pods: &interned.pods,
            classes: &interned.classes,
            placement: &interned.placement,
        },
    )?;
    let owners = owner_index(objects);
    let Interned {
        pods,
        placement,
        classes,
        class_ids,
        ..
    } = interned;
    Ok(ClusterSnapshot::from_parts(
        nodes, pods, classes, class_ids, pdbs, owners, placement,
    ))
}

/// The nodes (each name once) with their warm roles, and their ids by name.
fn parse_nodes(
    objects: &ClusterObjects,
) -> Result<(Vec<NodeInfo>, HashMap<String, NodeId>), SnapshotError> {
    let mut nodes = Vec::with_capacity(objects.nodes.len());
    let mut node_ids: HashMap<String, NodeId> = HashMap::new();
    for n in &objects.nodes {
        let mut info = parse_node(n)?;
        info.machine = link(
            &info.name,
            &info.labels,
            &info.annotations,
            &objects.providers,
        );
        if node_ids
            .insert(info.name.clone(), nodes.len() as NodeId)
            .is_some()
        {
            return Err(SnapshotError::Invalid {
                kind: "Node",
                object: info.name,
                why: "listed twice".into(),
            });
        }
        nodes.push(info);
    }
    for (node, roles) in warm_roles_by_node(&objects.node_states) {
        if let Some(&id) = node_ids.get(&node) {
            nodes[id as usize].warm_roles = roles;
        }
    }
    Ok((nodes, node_ids))
}

/// Pods interned into scheduling classes (pods with equal requirements share one), with
/// where each is placed.
#[derive(Default)]
struct Interned {
    pods: Vec<PodInfo>,
    placement: Vec<Option<NodeId>>,
    classes: Vec<SchedClass>,
    class_ids: HashMap<SchedRequirements, ClassId>,
    seen_uids: HashSet<std::sync::Arc<str>>,
}

impl Interned {
    /// Adds `pod` (once per uid); terminal pods are kept unplaced.
    fn add(
        &mut self,
        pod: &CachedPod,
        volumes: &VolumeIndex,
        node_ids: &HashMap<String, NodeId>,
    ) -> Result<(), SnapshotError> {
        let (mut info, req) = parse_pod(pod, volumes, None)?;
        if self.seen_uids.contains(&info.uid) {
            return Ok(()); // the same pod listed twice
        }
        let node = match &info.node_name {
            Some(n) => match node_ids.get(n) {
                Some(id) => Some(*id),
                // Nominated to a node that is gone: left out, as a cache leaves it out.
                None if info.nominated => return Ok(()),
                None => {
                    return Err(SnapshotError::MissingNode {
                        pod: info.key(),
                        node: n.clone(),
                    });
                }
            },
            None => None,
        };
        let next = self.classes.len() as ClassId;
        let classes = &mut self.classes;
        info.class = *self.class_ids.entry(req.clone()).or_insert_with(|| {
            classes.push(SchedClass {
                req,
                targeted_by_anti_affinity: false,
            });
            next
        });
        self.seen_uids.insert(info.uid.clone());
        self.placement.push(if info.terminal { None } else { node });
        self.pods.push(info);
        Ok(())
    }
}

/// Marks the classes some anti-affinity term selects.
fn mark_anti_affinity_targets(classes: &mut [SchedClass]) {
    let anti: Vec<PodAffinityTerm> = classes
        .iter()
        .flat_map(|c| c.req.anti_affinity.iter().cloned())
        .collect();
    for c in classes {
        c.targeted_by_anti_affinity = anti
            .iter()
            .any(|t| t.selects(&c.req.namespace, &c.req.labels));
    }
}
