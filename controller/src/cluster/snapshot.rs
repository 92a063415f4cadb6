//! `ClusterSnapshot`: nodes, pods, PDBs and owners with per-node placement and requested
//! totals, and `fork()/commit()/revert()` through an undo log that costs O(changes).

use super::undo::UndoLog;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::types::{
    ClassId, NodeId, NodeInfo, OwnerInfo, PdbInfo, PodAffinityTerm, PodId, PodInfo, Resources,
    SchedClass, SchedRequirements, Taint,
};

/// One reversible change.
#[derive(Clone, Debug)]
enum Change {
    /// The pod was moved; `from` is where it was before, at index `at` of that node's pods.
    Moved {
        pod: PodId,
        from: Option<NodeId>,
        at: usize,
    },
    /// The pod was appended to the snapshot (it is the last pod).
    Added { pod: PodId },
    /// A class was appended (it is the last class); `marked` are the classes its anti-affinity
    /// marked as targeted, which were not before.
    ClassAdded { marked: Vec<ClassId> },
    /// The node's taints were replaced; `before` are the taints it had.
    Taints { node: NodeId, before: Vec<Taint> },
}

/// Requested cpu (milli) and memory (bytes) of the pods on a node: of all of them, of the
/// DaemonSet pods, of the mirror pods and of the pods that are both, so that utilisation leaving
/// either out is a subtraction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub all: [i64; 2],
    pub daemon_sets: [i64; 2],
    pub mirror: [i64; 2],
    pub both: [i64; 2],
}

impl Usage {
    fn add(&mut self, pod: &PodInfo, r: &Resources, sign: i64) {
        let (cpu, mem) = (sign * r.cpu_milli, sign * r.memory);
        let to = |v: &mut [i64; 2]| {
            v[0] += cpu;
            v[1] += mem;
        };
        to(&mut self.all);
        let ds = pod.is_daemonset();
        if ds {
            to(&mut self.daemon_sets);
        }
        if pod.mirror {
            to(&mut self.mirror);
        }
        if ds && pod.mirror {
            to(&mut self.both);
        }
    }

    /// Requested (cpu, memory), without DaemonSet and/or mirror pods.
    pub fn counted(&self, ignore_daemon_sets: bool, ignore_mirror_pods: bool) -> (i64, i64) {
        let mut v = self.all;
        for (skip, part) in [
            (ignore_daemon_sets, self.daemon_sets),
            (ignore_mirror_pods, self.mirror),
        ] {
            if skip {
                v[0] -= part[0];
                v[1] -= part[1];
            }
        }
        if ignore_daemon_sets && ignore_mirror_pods {
            v[0] += self.both[0];
            v[1] += self.both[1];
        }
        (v[0], v[1])
    }
}

/// The hasher of the model's lookups by name that every drain simulation makes (the owner of
/// each pod classified): foldhash, seeded at random per process, several times faster than the
/// standard library's SipHash on short names. The names come from the API server, which bounds
/// their length and number.
pub(crate) type NameHasher = foldhash::fast::RandomState;

/// Owners by kind, namespace and name.
pub(crate) type OwnerMap = HashMap<
    String,
    HashMap<String, HashMap<String, OwnerInfo, NameHasher>, NameHasher>,
    NameHasher,
>;

/// Owners keyed by (kind, namespace, name) into an [`OwnerMap`].
pub(crate) fn owner_map(owners: HashMap<(String, String, String), OwnerInfo>) -> OwnerMap {
    let mut map = OwnerMap::default();
    for ((kind, ns, name), o) in owners {
        map.entry(kind)
            .or_default()
            .entry(ns)
            .or_default()
            .insert(name, o);
    }
    map
}

/// A consistent picture of the cluster that simulations change and undo.
///
/// Build it with [`crate::cluster::build_snapshot`]. Simulations move pods with
/// [`ClusterSnapshot::place`] inside a [`fork`](ClusterSnapshot::fork); a
/// [`revert`](ClusterSnapshot::revert) undoes every change since the matching fork and
/// [`commit`](ClusterSnapshot::commit) keeps them (folding them into the enclosing fork, if any).
/// Forks nest.
#[derive(Clone, Debug)]
pub struct ClusterSnapshot {
    pub(crate) nodes: Vec<NodeInfo>,
    pub(crate) node_ids: HashMap<String, NodeId, NameHasher>,
    pub(crate) pods: Vec<PodInfo>,
    pub(crate) pod_ids: HashMap<Arc<str>, PodId, NameHasher>,
    pub(crate) classes: Vec<SchedClass>,
    pub(crate) class_ids: HashMap<SchedRequirements, ClassId>,
    pub(crate) pdbs: Vec<PdbInfo>,
    /// Owners by kind, namespace and name (looked up without building a key).
    pub(crate) owners: OwnerMap,
    /// (label key, value) → nodes carrying it, for topology domains.
    pub(crate) domains: HashMap<(String, String), Vec<NodeId>>,
    pub(crate) pod_node: Vec<Option<NodeId>>,
    pub(crate) node_pods: Vec<Vec<PodId>>,
    pub(crate) requested: Vec<Resources>,
    /// Requested cpu and memory per node, split the ways utilisation may leave pods out.
    pub(crate) usage: Vec<Usage>,
    pub(crate) generation: Vec<u64>,
    /// Pods of each class (placed or not); a class without pods outside a fork is free.
    pub(crate) class_refs: Vec<u32>,
    /// Slots of classes without pods, reused by the next class interned outside a fork.
    pub(crate) free_classes: Vec<ClassId>,
    /// Per class, how many classes with pods have an anti-affinity term selecting it (it is
    /// `targeted_by_anti_affinity` while this is above zero).
    pub(crate) anti_targets: Vec<u32>,
    /// Classes with pods and anti-affinity terms.
    pub(crate) with_anti: Vec<ClassId>,
    /// Nodes whose pods a fork appended out of `namespace/name` order (empty outside forks).
    unsorted: Unsorted,
    undo: UndoLog<Change>,
}

/// The nodes whose pod lists may be out of order, looked up in O(1) and cleared in O(marked).
/// Marks are kept per fork: reverting a fork unmarks the nodes it marked (their pods are back
/// as they were, in order), so a failed drain simulation leaves no node to sort.
#[derive(Clone, Debug, Default)]
struct Unsorted {
    marked: Vec<bool>,
    list: Vec<NodeId>,
    /// Per open fork, how many nodes were marked when it started.
    forks: Vec<usize>,
}

impl Unsorted {
    fn mark(&mut self, node: NodeId) {
        let i = node as usize;
        if self.marked.len() <= i {
            self.marked.resize(i + 1, false);
        }
        if !self.marked[i] {
            self.marked[i] = true;
            self.list.push(node);
        }
    }

    fn contains(&self, node: NodeId) -> bool {
        self.marked.get(node as usize).copied().unwrap_or(false)
    }

    fn fork(&mut self) {
        self.forks.push(self.list.len());
    }

    /// The innermost fork is kept: its marks become its parent's.
    fn commit(&mut self) {
        self.forks.pop();
    }

    /// The innermost fork is undone: the nodes it marked are in order again.
    fn revert(&mut self) {
        let Some(from) = self.forks.pop() else {
            return;
        };
        for n in self.list.drain(from..) {
            self.marked[n as usize] = false;
        }
    }

    /// Forgets every mark; returns the nodes that had one.
    fn take(&mut self) -> Vec<NodeId> {
        for &n in &self.list {
            self.marked[n as usize] = false;
        }
        self.forks.clear();
        std::mem::take(&mut self.list)
    }
}

impl ClusterSnapshot {
    pub(crate) fn from_parts(
        nodes: Vec<NodeInfo>,
        pods: Vec<PodInfo>,
        classes: Vec<SchedClass>,
        class_ids: HashMap<SchedRequirements, ClassId>,
        pdbs: Vec<PdbInfo>,
        owners: HashMap<(String, String, String), OwnerInfo>,
        placement: Vec<Option<NodeId>>,
    ) -> Self {
        let owners = owner_map(owners);
        let node_ids = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i as NodeId))
            .collect();
        let pod_ids = pods
            .iter()
            .enumerate()
            .map(|(i, p)| (p.uid.clone(), i as PodId))
            .collect();
        let mut domains: HashMap<(String, String), Vec<NodeId>> = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            for (k, v) in &n.labels {
                domains
                    .entry((k.clone(), v.clone()))
                    .or_default()
                    .push(i as NodeId);
            }
        }
        let mut class_refs = vec![0u32; classes.len()];
        for p in &pods {
            class_refs[p.class as usize] += 1;
        }
        let with_anti: Vec<ClassId> = (0..classes.len() as ClassId)
            .filter(|c| !classes[*c as usize].req.anti_affinity.is_empty())
            .collect();
        let anti_targets = classes
            .iter()
            .map(|c| {
                let selecting = with_anti.iter().filter(|a| {
                    classes[**a as usize]
                        .req
                        .anti_affinity
                        .iter()
                        .any(|t| t.selects(&c.req.namespace, &c.req.labels))
                });
                selecting.count() as u32
            })
            .collect();
        let mut snap = ClusterSnapshot {
            class_refs,
            free_classes: Vec::new(),
            anti_targets,
            with_anti,
            node_pods: vec![Vec::new(); nodes.len()],
            requested: vec![Resources::default(); nodes.len()],
            usage: vec![Usage::default(); nodes.len()],
            generation: vec![0; nodes.len()],
            pod_node: vec![None; pods.len()],
            nodes,
            node_ids,
            pods,
            pod_ids,
            classes,
            class_ids,
            pdbs,
            owners,
            domains,
            unsorted: Unsorted::default(),
            undo: UndoLog::default(),
        };
        for (pod, node) in placement.into_iter().enumerate() {
            if let Some(node) = node {
                snap.attach(pod as PodId, node);
            }
        }
        snap
    }

    // ---- read access -------------------------------------------------------------------

    /// Number of nodes; node ids are `0..node_count()`.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Number of pods (placed or not); pod ids are `0..pod_count()`.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn node(&self, id: NodeId) -> &NodeInfo {
        &self.nodes[id as usize]
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_ids.get(name).copied()
    }

    pub fn pod(&self, id: PodId) -> &PodInfo {
        &self.pods[id as usize]
    }

    /// The pod with this UID.
    pub fn pod_by_uid(&self, uid: &str) -> Option<PodId> {
        self.pod_ids.get(uid).copied()
    }

    /// The scheduling class of a pod.
    pub fn class_of(&self, pod: PodId) -> &SchedClass {
        &self.classes[self.pods[pod as usize].class as usize]
    }

    pub fn class(&self, id: ClassId) -> &SchedClass {
        &self.classes[id as usize]
    }

    pub fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// Labels of a pod.
    pub fn pod_labels(&self, pod: PodId) -> &BTreeMap<String, String> {
        &self.class_of(pod).req.labels
    }

    /// Where the pod is in the (possibly simulated) state; `None` when pending or removed.
    pub fn node_of(&self, pod: PodId) -> Option<NodeId> {
        self.pod_node[pod as usize]
    }

    /// Pods currently placed on a node (terminal pods are never placed): in `namespace/name`
    /// order, except pods placed inside a fork, which follow them.
    pub fn pods_on(&self, node: NodeId) -> &[PodId] {
        &self.node_pods[node as usize]
    }

    /// Sum of the effective requests of the pods placed on a node.
    pub fn requested(&self, node: NodeId) -> &Resources {
        &self.requested[node as usize]
    }

    /// Requested cpu and memory of the pods on a node, by kind of pod.
    pub fn usage(&self, node: NodeId) -> &Usage {
        &self.usage[node as usize]
    }

    /// Increases whenever the pods of the node change, so caches can key on it.
    pub fn generation(&self, node: NodeId) -> u64 {
        self.generation[node as usize]
    }

    pub fn pdbs(&self) -> &[PdbInfo] {
        &self.pdbs
    }

    /// The owner object (`kind`, namespace, name), if the snapshot has it.
    pub fn owner(&self, kind: &str, namespace: &str, name: &str) -> Option<&OwnerInfo> {
        self.owners.get(kind)?.get(namespace)?.get(name)
    }

    /// Every owner.
    pub fn owners(&self) -> impl Iterator<Item = &OwnerInfo> {
        self.owners
            .values()
            .flat_map(|m| m.values())
            .flat_map(|m| m.values())
    }

    /// Nodes whose label `key` has value `value` (a topology domain).
    pub fn domain(&self, key: &str, value: &str) -> &[NodeId] {
        self.domains
            .get(&(key.to_string(), value.to_string()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Node ids in name order.
    pub fn nodes_by_name(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = (0..self.nodes.len() as NodeId).collect();
        ids.sort_by(|a, b| {
            self.nodes[*a as usize]
                .name
                .cmp(&self.nodes[*b as usize].name)
        });
        ids
    }

    // ---- changes -----------------------------------------------------------------------

    /// Moves a pod to `to` (`None`: removes it from its node). Recorded for `revert`.
    pub fn place(&mut self, pod: PodId, to: Option<NodeId>) {
        let from = self.pod_node[pod as usize];
        if from == to {
            return;
        }
        let at = from.map_or(0, |f| self.detach(pod, f));
        if let Some(t) = to {
            self.attach(pod, t);
        }
        self.undo.record(Change::Moved { pod, from, at });
    }

    /// Adds a pod that is not in the snapshot (for example one that was just evicted), unplaced.
    /// Returns its id; inside a fork, `revert` removes it again.
    pub fn add_pod(&mut self, mut pod: PodInfo, req: SchedRequirements) -> PodId {
        pod.class = self.intern_class(req);
        self.class_refs[pod.class as usize] += 1;
        let id = self.pods.len() as PodId;
        self.pod_ids.insert(pod.uid.clone(), id);
        self.pods.push(pod);
        self.pod_node.push(None);
        self.undo.record(Change::Added { pod: id });
        id
    }

    /// The class of `req`, created when no pod has it yet (its anti-affinity marks the classes
    /// it targets). Inside a fork the class is appended and `revert` removes it again; outside,
    /// a free slot is reused.
    pub(crate) fn intern_class(&mut self, req: SchedRequirements) -> ClassId {
        if let Some(id) = self.class_ids.get(&req) {
            return *id;
        }
        let selects = |anti: &[PodAffinityTerm], of: &SchedRequirements| {
            anti.iter().any(|t| t.selects(&of.namespace, &of.labels))
        };
        let mut targets = self
            .with_anti
            .iter()
            .filter(|c| selects(&self.classes[**c as usize].req.anti_affinity, &req))
            .count() as u32;
        if selects(&req.anti_affinity, &req) {
            targets += 1;
        }
        // The new class's own anti-affinity may target existing classes.
        let mut marked = Vec::new();
        if !req.anti_affinity.is_empty() {
            for (i, c) in self.classes.iter_mut().enumerate() {
                if self.class_refs[i] > 0 && selects(&req.anti_affinity, &c.req) {
                    self.anti_targets[i] += 1;
                    c.targeted_by_anti_affinity = true;
                    marked.push(i as ClassId);
                }
            }
        }
        let class = SchedClass {
            req: req.clone(),
            targeted_by_anti_affinity: targets > 0,
        };
        let reuse = if self.undo.depth() == 0 {
            self.free_classes.pop()
        } else {
            None
        };
        let id = match reuse {
            Some(id) => {
                self.classes[id as usize] = class;
                self.class_refs[id as usize] = 0;
                self.anti_targets[id as usize] = targets;
                id
            }
            None => {
                self.classes.push(class);
                self.class_refs.push(0);
                self.anti_targets.push(targets);
                (self.classes.len() - 1) as ClassId
            }
        };
        if !req.anti_affinity.is_empty() {
            self.with_anti.push(id);
        }
        self.class_ids.insert(req, id);
        self.undo.record(Change::ClassAdded { marked });
        id
    }

    /// Replaces the taints of a node (for example to simulate it without ebb's taint). Recorded
    /// for `revert`.
    pub fn set_taints(&mut self, node: NodeId, taints: Vec<Taint>) {
        let before = std::mem::replace(&mut self.nodes[node as usize].taints, taints);
        self.undo.record(Change::Taints { node, before });
    }

    /// Starts a fork: later changes can be undone with `revert` or kept with `commit`.
    pub fn fork(&mut self) {
        self.undo.fork();
        self.unsorted.fork();
    }

    /// Keeps the changes of the innermost fork.
    pub fn commit(&mut self) {
        self.undo.commit();
        self.unsorted.commit();
        if self.undo.depth() == 0 {
            // Outside forks every node's pods are in order again.
            for n in self.unsorted.take() {
                let mut pods = std::mem::take(&mut self.node_pods[n as usize]);
                pods.sort_by(|a, b| self.name_key(*a).cmp(&self.name_key(*b)));
                self.node_pods[n as usize] = pods;
            }
        }
    }

    /// Undoes every change since the innermost fork, in O(changes).
    pub fn revert(&mut self) {
        let mut undo = std::mem::take(&mut self.undo);
        undo.revert(|change| match change {
            Change::Moved { pod, from, at } => {
                if let Some(cur) = self.pod_node[pod as usize] {
                    self.detach(pod, cur);
                }
                // Back where it was: the node's pods are as they were right after it left.
                if let Some(f) = from {
                    self.attach_at(pod, f, at);
                }
            }
            Change::Added { pod } => {
                if let Some(cur) = self.pod_node[pod as usize] {
                    self.detach(pod, cur);
                }
                let info = self.pods.pop();
                self.pod_node.pop();
                if let Some(info) = info {
                    self.pod_ids.remove(&info.uid);
                    self.class_refs[info.class as usize] -= 1;
                }
            }
            Change::ClassAdded { marked } => {
                for c in marked {
                    let c = c as usize;
                    self.anti_targets[c] -= 1;
                    self.classes[c].targeted_by_anti_affinity = self.anti_targets[c] > 0;
                }
                self.class_refs.pop();
                self.anti_targets.pop();
                let id = self.classes.len().saturating_sub(1) as ClassId;
                self.with_anti.retain(|c| *c != id);
                if let Some(class) = self.classes.pop() {
                    self.class_ids.remove(&class.req);
                }
            }
            Change::Taints { node, before } => {
                self.nodes[node as usize].taints = before;
            }
        });
        self.undo = undo;
        // Every node this fork marked has its pods back as they were before it: in order.
        self.unsorted.revert();
    }

    /// Depth of nested forks.
    pub fn fork_depth(&self) -> usize {
        self.undo.depth()
    }

    fn attach(&mut self, pod: PodId, node: NodeId) {
        // Outside a fork kept in `namespace/name` order, the order drains list pods in:
        // whoever walks a node's pods in that order (the drain simulation, every loop) need
        // not sort them. Inside one (a simulated move, reverted or committed within the loop)
        // appended: searching the place costs more than sorting the few nodes that receive
        // pods and are then walked.
        let list = &self.node_pods[node as usize];
        let at = if self.undo.depth() > 0 {
            if list
                .last()
                .is_some_and(|l| self.name_key(*l) > self.name_key(pod))
            {
                self.unsorted.mark(node);
            }
            list.len()
        } else {
            let key = self.name_key(pod);
            list.partition_point(|p| self.name_key(*p) <= key)
        };
        self.attach_at(pod, node, at);
    }

    /// What a node's pods are ordered by: `namespace/name`.
    fn name_key(&self, pod: PodId) -> (&str, &str) {
        let p = &self.pods[pod as usize];
        (&p.namespace, &p.name)
    }

    /// A node's pods in `namespace/name` order, as drains list them; sorted here only when a
    /// simulation appended some of them out of order.
    pub fn pods_by_name(&self, node: NodeId) -> std::borrow::Cow<'_, [PodId]> {
        let pods = &self.node_pods[node as usize];
        if !self.unsorted.contains(node) {
            return std::borrow::Cow::Borrowed(pods);
        }
        let mut pods = pods.clone();
        pods.sort_by_key(|p| self.name_key(*p));
        std::borrow::Cow::Owned(pods)
    }

    /// `attach` at index `at` of the node's pods, known to keep their order.
    fn attach_at(&mut self, pod: PodId, node: NodeId, at: usize) {
        let class = self.pods[pod as usize].class as usize;
        let requests = &self.classes[class].req.requests;
        self.requested[node as usize].add(requests);
        self.usage[node as usize].add(&self.pods[pod as usize], requests, 1);
        let list = &mut self.node_pods[node as usize];
        list.insert(at.min(list.len()), pod);
        self.pod_node[pod as usize] = Some(node);
        self.generation[node as usize] += 1;
    }

    /// Takes the pod off the node; returns the index it had in the node's pods.
    fn detach(&mut self, pod: PodId, node: NodeId) -> usize {
        let class = self.pods[pod as usize].class as usize;
        let requests = &self.classes[class].req.requests;
        self.requested[node as usize].sub(requests);
        self.usage[node as usize].add(&self.pods[pod as usize], requests, -1);
        let list = &mut self.node_pods[node as usize];
        let at = list.iter().rposition(|p| *p == pod);
        if let Some(i) = at {
            list.remove(i);
        }
        self.pod_node[pod as usize] = None;
        self.generation[node as usize] += 1;
        at.unwrap_or(list.len())
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::{node, pod, snapshot};

    #[test]
    fn nested_forks_revert_only_their_changes() {
        let mut s = snapshot(
            [node("a").cpu("4"), node("b").cpu("4")],
            [pod("p1").on("a").cpu("1"), pod("p2").on("a").cpu("2")],
        );
        let (a, b) = (s.node_id("a").unwrap(), s.node_id("b").unwrap());
        let (p1, p2) = (
            s.pod_by_uid("uid-default-p1").unwrap(),
            s.pod_by_uid("uid-default-p2").unwrap(),
        );
        assert_eq!(s.requested(a).cpu_milli, 3000);
        s.fork();
        s.place(p1, Some(b));
        s.fork();
        s.place(p2, Some(b));
        assert_eq!(s.requested(b).cpu_milli, 3000);
        assert!(s.pods_on(a).is_empty());
        s.revert();
        assert_eq!(s.node_of(p2), Some(a));
        assert_eq!(s.node_of(p1), Some(b));
        s.fork();
        s.place(p2, None);
        s.commit(); // folded into the outer fork
        s.revert();
        assert_eq!(s.node_of(p1), Some(a));
        assert_eq!(s.node_of(p2), Some(a));
        assert_eq!(s.requested(a).cpu_milli, 3000);
        assert_eq!(s.requested(b).cpu_milli, 0);
        assert_eq!(s.fork_depth(), 0);
    }

    #[test]
    fn a_nodes_pods_stay_in_name_order_as_pods_arrive_and_leave() {
        let mut s = snapshot(
            [node("a").cpu("8"), node("b").cpu("8")],
            [
                pod("p3").on("a").cpu("1"),
                pod("p1").on("b").cpu("1"),
                pod("p2").on("b").cpu("1"),
                pod("p0").on("b").cpu("1"),
            ],
        );
        let (a, b) = (s.node_id("a").unwrap(), s.node_id("b").unwrap());
        let names = |s: &super::ClusterSnapshot, n| {
            s.pods_on(n)
                .iter()
                .map(|p| s.pod(*p).name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&s, b), ["p0", "p1", "p2"]);
        let id = |s: &super::ClusterSnapshot, name: &str| {
            s.pod_by_uid(&format!("uid-default-{name}")).unwrap()
        };
        // Outside a fork in name order as they arrive.
        for p in ["p2", "p0"] {
            let p = id(&s, p);
            s.place(p, Some(a));
        }
        assert_eq!(names(&s, a), ["p0", "p2", "p3"]);
        assert_eq!(names(&s, b), ["p1"]);
        // Inside one appended, listed by name all the same, and back in place on revert.
        s.fork();
        let p1 = id(&s, "p1");
        s.place(p1, Some(a));
        let p0 = id(&s, "p0");
        s.place(p0, Some(b));
        assert_eq!(names(&s, a), ["p2", "p3", "p1"]);
        let by_name: Vec<_> = s
            .pods_by_name(a)
            .iter()
            .map(|p| s.pod(*p).name.clone())
            .collect();
        assert_eq!(by_name, ["p1", "p2", "p3"]);
        s.revert();
        assert_eq!(names(&s, a), ["p0", "p2", "p3"]);
        assert_eq!(names(&s, b), ["p1"]);
    }

    #[test]
    fn added_pods_disappear_on_revert() {
        let mut s = snapshot([node("a").cpu("4")], [pod("p1").on("a").cpu("1")]);
        let (info, req) = crate::cluster::build::parse_pod(
            &pod("new").cpu("1").build(),
            &Default::default(),
            None,
        )
        .unwrap();
        s.fork();
        let id = s.add_pod(info, req);
        s.place(id, s.node_id("a"));
        assert_eq!(s.requested(0).cpu_milli, 2000);
        s.revert();
        assert_eq!(s.pod_count(), 1);
        assert!(s.pod_by_uid("uid-default-new").is_none());
        assert_eq!(s.requested(0).cpu_milli, 1000);
    }

    #[test]
    fn missing_node_and_bad_quantity_name_the_object() {
        let e = crate::cluster::build_snapshot(&crate::testkit::objects(
            [node("a").cpu("4")],
            [pod("p1").on("ghost")],
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("default/p1") && e.to_string().contains("ghost"),
            "{e}"
        );
        let e = crate::cluster::build_snapshot(&crate::testkit::objects(
            [node("a").cpu("4")],
            [pod("p1").on("a").cpu("lots")],
        ))
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("Pod default/p1")
                && msg.contains("resources.requests.cpu")
                && msg.contains("lots"),
            "{msg}"
        );
        let e = crate::cluster::build_snapshot(&crate::testkit::objects(
            [node("a").mem("12XB")],
            Vec::<crate::testkit::PodBuilder>::new(),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("Node a"), "{e}");
    }

    /// A plan runs inside one fork, and each drain it simulates in a nested one: a simulated
    /// drain that fails (reverted) leaves its destinations as they were, walked without a sort;
    /// one that is kept leaves them to sort until the plan's fork ends.
    #[test]
    fn a_reverted_nested_fork_leaves_no_node_to_sort() {
        use std::borrow::Cow;
        let mut s = snapshot(
            [node("n0").cpu("8"), node("n1").cpu("8")],
            [
                pod("b").on("n0").cpu("1m"),
                pod("a").on("n1").cpu("1m"),
                pod("c").on("n1").cpu("1m"),
            ],
        );
        let uid = |s: &super::ClusterSnapshot, n: &str| {
            s.pod_by_uid(&format!("uid-default-{n}")).unwrap()
        };
        let (a, b) = (uid(&s, "a"), uid(&s, "b"));
        s.fork(); // the plan's
        s.fork(); // a drain of n1 that fails
        s.place(a, Some(0)); // appended after b: out of order
        assert!(matches!(s.pods_by_name(0), Cow::Owned(_)));
        s.revert();
        assert!(
            matches!(s.pods_by_name(0), Cow::Borrowed(_)),
            "n0 is back as it was, in order"
        );
        s.fork(); // a drain of n0 that is kept: b goes to n1, after c
        s.place(b, Some(1));
        s.commit();
        assert!(
            matches!(s.pods_by_name(1), Cow::Owned(_)),
            "kept: n1 to sort"
        );
        let names: Vec<_> = s
            .pods_by_name(1)
            .iter()
            .map(|p| s.pod(*p).name.clone())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        s.revert();
        assert!(matches!(s.pods_by_name(1), Cow::Borrowed(_)));
    }

    proptest::proptest! {
        /// Whatever nested forks move, commit and revert, a node's pods come in
        /// `namespace/name` order, and outside forks they are stored in that order.
        #[test]
        fn pods_by_name_is_always_in_name_order(
            ops in proptest::collection::vec((0u8..4, 0usize..12, 0u8..3), 1..60),
        ) {
            let names = ["z", "a", "m", "b", "y", "c", "x", "d", "w", "e", "v", "f"];
            let pods: Vec<_> = names
                .iter()
                .enumerate()
                .map(|(i, n)| pod(n).on(["n0", "n1", "n2"][i % 3]).cpu("1m"))
                .collect();
            let mut s = snapshot([node("n0").cpu("64"), node("n1").cpu("64"), node("n2").cpu("64")], pods);
            let in_order = |s: &super::ClusterSnapshot, n: super::NodeId| {
                let mut want = s.pods_on(n).to_vec();
                want.sort_by_key(|p| (s.pod(*p).namespace.clone(), s.pod(*p).name.clone()));
                want
            };
            for (op, pod, node) in ops {
                match op {
                    0 => s.fork(),
                    1 if s.fork_depth() > 0 => s.commit(),
                    2 if s.fork_depth() > 0 => s.revert(),
                    _ => {
                        if s.fork_depth() == 0 {
                            s.fork();
                        }
                        s.place((pod % s.pod_count()) as super::PodId, Some(node as super::NodeId));
                    }
                }
                for n in 0..3 {
                    proptest::prop_assert_eq!(s.pods_by_name(n), in_order(&s, n));
                    if s.fork_depth() == 0 {
                        proptest::prop_assert_eq!(s.pods_on(n).to_vec(), in_order(&s, n));
                    }
                }
            }
        }
    }
}
