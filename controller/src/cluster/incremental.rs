//! Changes to a [`ClusterSnapshot`] as watch events report them, outside any fork: nodes and pods
//! added, updated and removed (ids stay dense: the last one moves into the gap), PDBs and owners.

use thiserror::Error;

use super::build::OwnerIndex;
use super::snapshot::{ClusterSnapshot, owner_map};
use super::types::{
    ClassId, NodeId, NodeInfo, OwnerInfo, PdbInfo, PodId, PodInfo, Resources, SchedClass,
    SchedRequirements,
};

/// Why the snapshot refused a change.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum UpdateError {
    #[error("a fork of the snapshot is open: cluster changes wait until it is reverted")]
    ForkOpen,
    #[error("pod {0} is already in the snapshot")]
    DuplicatePod(String),
    #[error("pod {0} is not in the snapshot")]
    UnknownPod(String),
    #[error("node {0} is not in the snapshot")]
    UnknownNode(String),
    #[error("node {0} still has pods placed on it")]
    NodeNotEmpty(String),
}

impl ClusterSnapshot {
    fn no_fork(&self) -> Result<(), UpdateError> {
        if self.fork_depth() > 0 {
            return Err(UpdateError::ForkOpen);
        }
        Ok(())
    }

    /// Adds a node, or replaces what the snapshot knows of it (its pods stay; label changes
    /// move it between topology domains).
    pub fn upsert_node(&mut self, info: NodeInfo) -> Result<NodeId, UpdateError> {
        self.no_fork()?;
        if let Some(id) = self.node_ids.get(&info.name).copied() {
            let old = std::mem::replace(&mut self.nodes[id as usize], info);
            let new = &self.nodes[id as usize];
            for (k, v) in &old.labels {
                if new.labels.get(k) != Some(v) {
                    domain_remove(&mut self.domains, k, v, id);
                }
            }
            for (k, v) in &new.labels {
                if old.labels.get(k) != Some(v) {
                    self.domains
                        .entry((k.clone(), v.clone()))
                        .or_default()
                        .push(id);
                }
            }
            self.generation[id as usize] += 1;
            return Ok(id);
        }
        let id = self.nodes.len() as NodeId;
        for (k, v) in &info.labels {
            self.domains
                .entry((k.clone(), v.clone()))
                .or_default()
                .push(id);
        }
        self.node_ids.insert(info.name.clone(), id);
        self.nodes.push(info);
        self.node_pods.push(Vec::new());
        self.requested.push(Resources::default());
        self.usage.push(Default::default());
        self.generation.push(0);
        Ok(id)
    }

    /// Removes a node with no pods placed on it (remove or move them first). The last node
    /// takes its id.
    pub fn remove_node(&mut self, name: &str) -> Result<(), UpdateError> {
        self.no_fork()?;
        let id = self
            .node_id(name)
            .ok_or_else(|| UpdateError::UnknownNode(name.to_string()))?;
        if !self.node_pods[id as usize].is_empty() {
            return Err(UpdateError::NodeNotEmpty(name.to_string()));
        }
        self.node_ids.remove(name);
        for (k, v) in &self.nodes[id as usize].labels {
            domain_remove(&mut self.domains, k, v, id);
        }
        let last = (self.nodes.len() - 1) as NodeId;
        self.nodes.swap_remove(id as usize);
        self.node_pods.swap_remove(id as usize);
        self.requested.swap_remove(id as usize);
        self.usage.swap_remove(id as usize);
        self.generation.swap_remove(id as usize);
        if id != last {
            let moved = &self.nodes[id as usize];
            self.node_ids.insert(moved.name.clone(), id);
            for (k, v) in &moved.labels {
                if let Some(list) = self.domains.get_mut(&(k.clone(), v.clone()))
                    && let Some(slot) = list.iter_mut().find(|n| **n == last)
                {
                    *slot = id;
                }
            }
            for &p in &self.node_pods[id as usize] {
                self.pod_node[p as usize] = Some(id);
            }
        }
        Ok(())
    }

    /// Adds a pod (not in the snapshot yet), placed on `node` or unplaced.
    pub fn insert_pod(
        &mut self,
        mut pod: PodInfo,
        req: SchedRequirements,
        node: Option<NodeId>,
    ) -> Result<PodId, UpdateError> {
        self.no_fork()?;
        if self.pod_ids.contains_key(&pod.uid) {
            return Err(UpdateError::DuplicatePod(pod.key()));
        }
        if let Some(n) = node
            && n as usize >= self.nodes.len()
        {
            return Err(UpdateError::UnknownNode(format!("#{n}")));
        }
        pod.class = self.intern_class(req);
        self.class_refs[pod.class as usize] += 1;
        let id = self.pods.len() as PodId;
        self.pod_ids.insert(pod.uid.clone(), id);
        self.pods.push(pod);
        self.pod_node.push(None);
        if let Some(n) = node {
            self.place(id, Some(n));
        }
        Ok(id)
    }

    /// Removes a pod and returns what the snapshot knew of it. The last pod takes its id.
    pub fn remove_pod(&mut self, uid: &str) -> Result<PodInfo, UpdateError> {
        self.no_fork()?;
        let id = self
            .pod_by_uid(uid)
            .ok_or_else(|| UpdateError::UnknownPod(uid.to_string()))?;
        self.place(id, None);
        let last = (self.pods.len() - 1) as PodId;
        self.pods.swap(id as usize, last as usize);
        self.pod_node.swap(id as usize, last as usize);
        let info = self
            .pods
            .pop()
            .ok_or_else(|| UpdateError::UnknownPod(uid.to_string()))?;
        self.pod_node.pop();
        self.pod_ids.remove(&info.uid);
        if id != last {
            self.pod_ids.insert(self.pods[id as usize].uid.clone(), id);
            if let Some(n) = self.pod_node[id as usize]
                && let Some(slot) = self.node_pods[n as usize].iter_mut().find(|p| **p == last)
            {
                *slot = id;
            }
        }
        let class = info.class as usize;
        self.class_refs[class] -= 1;
        if self.class_refs[class] == 0 {
            self.free_class(info.class);
        }
        Ok(info)
    }

    /// Removes a pod and returns it with its scheduling requirements (to add it back later).
    pub fn take_pod(&mut self, uid: &str) -> Result<(PodInfo, SchedRequirements), UpdateError> {
        let id = self
            .pod_by_uid(uid)
            .ok_or_else(|| UpdateError::UnknownPod(uid.to_string()))?;
        let req = self.class_of(id).req.clone();
        Ok((self.remove_pod(uid)?, req))
    }

    /// A class no pod uses any more: its slot is free, and the classes its anti-affinity
    /// targeted count one class fewer targeting them.
    fn free_class(&mut self, class: ClassId) {
        let dead = std::mem::replace(
            &mut self.classes[class as usize],
            SchedClass {
                req: SchedRequirements::default(),
                targeted_by_anti_affinity: false,
            },
        );
        self.class_ids.remove(&dead.req);
        self.free_classes.push(class);
        self.anti_targets[class as usize] = 0;
        if dead.req.anti_affinity.is_empty() {
            return;
        }
        self.with_anti.retain(|c| *c != class);
        for (i, c) in self.classes.iter_mut().enumerate() {
            if self.class_refs[i] > 0
                && dead
                    .req
                    .anti_affinity
                    .iter()
                    .any(|t| t.selects(&c.req.namespace, &c.req.labels))
            {
                self.anti_targets[i] -= 1;
                c.targeted_by_anti_affinity = self.anti_targets[i] > 0;
            }
        }
    }

    /// Replaces the PodDisruptionBudgets.
    pub fn set_pdbs(&mut self, pdbs: Vec<PdbInfo>) -> Result<(), UpdateError> {
        self.no_fork()?;
        self.pdbs = pdbs;
        Ok(())
    }

    /// Adds or replaces an owner.
    pub fn upsert_owner(&mut self, owner: OwnerInfo) -> Result<(), UpdateError> {
        self.no_fork()?;
        self.owners
            .entry(owner.kind.clone())
            .or_default()
            .entry(owner.namespace.clone())
            .or_default()
            .insert(owner.name.clone(), owner);
        Ok(())
    }

    /// Removes an owner (absent: nothing happens).
    pub fn remove_owner(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), UpdateError> {
        self.no_fork()?;
        if let Some(by_ns) = self.owners.get_mut(kind) {
            if let Some(by_name) = by_ns.get_mut(namespace) {
                by_name.remove(name);
                if by_name.is_empty() {
                    by_ns.remove(namespace);
                }
            }
            if by_ns.is_empty() {
                self.owners.remove(kind);
            }
        }
        Ok(())
    }

    /// Replaces every owner.
    pub fn set_owners(&mut self, owners: OwnerIndex) -> Result<(), UpdateError> {
        self.no_fork()?;
        self.owners = owner_map(owners);
        Ok(())
    }

    /// Sets the node's warm roles and machine link (fields no index depends on).
    pub(crate) fn node_extras_mut(&mut self, node: NodeId) -> &mut NodeInfo {
        &mut self.nodes[node as usize]
    }
}

/// Takes `node` out of the topology domain `key=value` (dropping the domain when empty).
fn domain_remove(
    domains: &mut std::collections::HashMap<(String, String), Vec<NodeId>>,
    key: &str,
    value: &str,
    node: NodeId,
) {
    let k = (key.to_string(), value.to_string());
    if let Some(list) = domains.get_mut(&k) {
        if let Some(i) = list.iter().position(|n| *n == node) {
            list.swap_remove(i);
        }
        if list.is_empty() {
            domains.remove(&k);
        }
    }
}
