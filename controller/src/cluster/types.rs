//! The parsed, scheduling-relevant picture of nodes, pods, PDBs and owners that the snapshot
//! holds: integers instead of quantity strings, selectors ready to match, shared pod classes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Index of a node in a [`crate::cluster::ClusterSnapshot`].
pub type NodeId = u32;
/// Index of a pod in a [`crate::cluster::ClusterSnapshot`].
pub type PodId = u32;
/// Index of a scheduling equivalence class (pods with identical scheduling requirements).
pub type ClassId = u32;

/// Resource amounts: cpu and extended resources in milli-units, memory and ephemeral storage in
/// bytes. `extended` is sorted by resource name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    pub cpu_milli: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub extended: Vec<(String, i64)>,
}

impl Resources {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Resources) {
        self.cpu_milli += other.cpu_milli;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        for (name, v) in &other.extended {
            match self
                .extended
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
            {
                Ok(i) => self.extended[i].1 += v,
                Err(i) => self.extended.insert(i, (name.clone(), *v)),
            }
        }
    }

    /// Subtracts `other` from `self`.
    pub fn sub(&mut self, other: &Resources) {
        self.cpu_milli -= other.cpu_milli;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        for (name, v) in &other.extended {
            match self
                .extended
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
            {
                Ok(i) => self.extended[i].1 -= v,
                Err(i) => self.extended.insert(i, (name.clone(), -*v)),
            }
        }
    }

    /// Element-wise maximum.
    pub fn max_with(&mut self, other: &Resources) {
        self.cpu_milli = self.cpu_milli.max(other.cpu_milli);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        for (name, v) in &other.extended {
            match self
                .extended
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
            {
                Ok(i) => self.extended[i].1 = self.extended[i].1.max(*v),
                Err(i) => self.extended.insert(i, (name.clone(), (*v).max(0))),
            }
        }
    }

    /// Amount of an extended resource (0 when absent).
    pub fn extended(&self, name: &str) -> i64 {
        self.extended
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .map(|i| self.extended[i].1)
            .unwrap_or(0)
    }

    /// Whether `self` asks for at least as much as `other` of every resource: a node without
    /// room for `other` has none for `self`.
    pub fn covers(&self, other: &Resources) -> bool {
        self.cpu_milli >= other.cpu_milli
            && self.memory >= other.memory
            && self.ephemeral_storage >= other.ephemeral_storage
            && other
                .extended
                .iter()
                .all(|(name, v)| self.extended(name) >= *v)
    }
}

/// Operator of a label or node-field requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    /// Node affinity only: the label's integer value is greater than the single value.
    Gt,
    /// Node affinity only: the label's integer value is less than the single value.
    Lt,
}

/// One requirement on a label (or, for node affinity `matchFields`, on `metadata.name`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether a label value (None: label absent) satisfies the requirement.
    pub fn matches(&self, value: Option<&str>) -> bool {
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), Some(bound)) = (value, self.values.first()) else {
                    return false;
                };
                match (v.parse::<i64>(), bound.parse::<i64>()) {
                    (Ok(v), Ok(b)) if self.operator == Operator::Gt => v > b,
                    (Ok(v), Ok(b)) => v < b,
                    _ => false,
                }
            }
        }
    }
}

/// A label selector (`matchLabels` folded into `In` requirements). Empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
}

impl Selector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
    }
}

/// One `nodeSelectorTerm`: all expressions and fields must match; an empty term matches nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeSelectorTerm {
    pub match_expressions: Vec<Requirement>,
    /// Requirements on node fields; only `metadata.name` exists.
    pub match_fields: Vec<Requirement>,
}

impl NodeSelectorTerm {
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        if self.match_expressions.is_empty() && self.match_fields.is_empty() {
            return false;
        }
        self.match_expressions
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
            && self.match_fields.iter().all(|r| {
                r.key == "metadata.name" && r.matches(Some(node_name))
                    || r.key != "metadata.name" && r.matches(None)
            })
    }
}

/// Terms of a required node selector, ORed.
pub fn terms_match(
    terms: &[NodeSelectorTerm],
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    terms.iter().any(|t| t.matches(node_name, labels))
}

/// Taint effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "NoSchedule" => Some(Self::NoSchedule),
            "PreferNoSchedule" => Some(Self::PreferNoSchedule),
            "NoExecute" => Some(Self::NoExecute),
            _ => None,
        }
    }
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: TaintEffect,
}

/// A pod toleration. `key: None` with `Exists` tolerates everything.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Toleration {
    pub key: Option<String>,
    pub exists: bool,
    pub value: String,
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        match &self.key {
            None => self.exists,
            Some(k) if k != &taint.key => false,
            Some(_) => self.exists || self.value == taint.value,
        }
    }
}

/// A host port a pod binds. `ip` "0.0.0.0" (or empty) conflicts with every address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let wildcard = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == other.port
            && self.protocol == other.protocol
            && (wildcard(&self.ip) || wildcard(&other.ip) || self.ip == other.ip)
    }
}

/// Which namespaces an inter-pod term looks at.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NamespaceScope {
    /// Listed namespaces (the pod's own when the term names none).
    Listed(Vec<String>),
    /// All namespaces (`namespaceSelector: {}`; a non-empty namespace selector is treated the
    /// same way, conservatively, because namespaces' labels are not part of the snapshot).
    All,
}

impl NamespaceScope {
    pub fn contains(&self, ns: &str) -> bool {
        match self {
            NamespaceScope::All => true,
            NamespaceScope::Listed(v) => v.iter().any(|n| n == ns),
        }
    }
}

/// A required inter-pod (anti-)affinity term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodAffinityTerm {
    pub selector: Selector,
    pub namespaces: NamespaceScope,
    pub topology_key: String,
}

impl PodAffinityTerm {
    /// Whether a pod (namespace, labels) is selected by this term.
    pub fn selects(&self, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.contains(ns) && self.selector.matches(labels)
    }
}

/// A topology spread constraint with `whenUnsatisfiable: DoNotSchedule`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SpreadConstraint {
    pub max_skew: i32,
    pub topology_key: String,
    pub selector: Selector,
}

/// Everything the scheduler looks at when placing a pod. Pods with equal requirements share one
/// [`SchedClass`] and therefore one set of cached predicate results.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SchedRequirements {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Effective requests: max(sum of containers + sidecars, each init container + earlier
    /// sidecars) + overhead.
    pub requests: Resources,
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity terms (ORed); empty means no constraint.
    pub node_affinity: Vec<NodeSelectorTerm>,
    /// Node affinity of bound local PersistentVolumes: every entry must match.
    pub volume_node_affinity: Vec<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
    pub host_ports: Vec<HostPort>,
    pub affinity: Vec<PodAffinityTerm>,
    pub anti_affinity: Vec<PodAffinityTerm>,
    pub spread: Vec<SpreadConstraint>,
}

impl SchedRequirements {
    /// These requirements without their requests and labels: what, besides its size, decides
    /// where a pod fits when no other pod's position matters (labels only count for inter-pod
    /// terms, which [`SchedClass::is_inter_pod`] classes have).
    pub fn placement_shape(&self) -> SchedRequirements {
        SchedRequirements {
            labels: BTreeMap::new(),
            requests: Resources::default(),
            ..self.clone()
        }
    }
}

/// A scheduling equivalence class.
#[derive(Clone, Debug)]
pub struct SchedClass {
    pub req: SchedRequirements,
    /// Some pod in the cluster has an anti-affinity term selecting this class: placing it
    /// depends on pods elsewhere, so results of this class are never cached negatively.
    pub targeted_by_anti_affinity: bool,
}

impl SchedClass {
    /// Whether placing a pod of this class depends on other pods' positions.
    pub fn is_inter_pod(&self) -> bool {
        self.targeted_by_anti_affinity
            || !self.req.affinity.is_empty()
            || !self.req.anti_affinity.is_empty()
            || !self.req.spread.is_empty()
    }
}

/// Reference to the controller of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
}

/// A pod as the planner sees it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    /// Shared with the snapshot's index by uid and with the plans' moves and hints.
    pub uid: Arc<str>,
    pub namespace: String,
    pub name: String,
    /// `namespace/name`, made once and shared with the plans that move the pod.
    pub shared_key: Arc<str>,
    pub class: ClassId,
    /// Only those the planner reads (`build::pod::PLANNER_POD_ANNOTATIONS`).
    pub annotations: BTreeMap<String, String>,
    pub owner: Option<OwnerRef>,
    /// Created from the kubelet's static manifests (`kubernetes.io/config.mirror`, a
    /// `kubernetes.io/config.source` other than `api`, or owned by its Node).
    pub mirror: bool,
    /// `status.startTime` (when the kubelet started it), if set.
    pub started: Option<jiff::Timestamp>,
    /// Phase Succeeded or Failed.
    pub terminal: bool,
    /// `metadata.deletionTimestamp` set.
    pub terminating: bool,
    /// Condition Ready is True (counts as healthy for PodDisruptionBudgets).
    pub ready: bool,
    /// Uses a hostPath volume or an emptyDir not backed by memory.
    pub local_storage: bool,
    /// Its first claim bound to a PersistentVolume with node affinity (a local volume).
    pub local_volume: Option<LocalVolume>,
    /// Not bound yet, but nominated to `node_name` by the scheduler (`status.nominatedNodeName`:
    /// preemption, or a binding in progress): it uses that node's capacity until it is bound.
    pub nominated: bool,
    /// When the scheduler bound it (its `PodScheduled` condition), if known.
    pub scheduled_at: Option<jiff::Timestamp>,
    /// The node the object said it runs on (kept even if that node is not in the snapshot), or
    /// the node it is nominated to.
    pub node_name: Option<String>,
}

/// A claim of a pod bound to a PersistentVolume with node affinity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalVolume {
    pub claim: String,
    pub pv: String,
}

impl PodInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        self.shared_key.to_string()
    }

    /// `namespace/name` as a [`PodInfo`] keeps it.
    pub fn key_of(namespace: &str, name: &str) -> Arc<str> {
        Arc::from(format!("{namespace}/{name}"))
    }

    pub fn is_daemonset(&self) -> bool {
        self.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet")
    }
}

/// A node as the planner sees it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub allocatable: Resources,
    /// Allocatable pod count.
    pub max_pods: i64,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub ready: bool,
    /// `metadata.deletionTimestamp` set.
    pub deleting: bool,
    /// Workload roles whose local data the node holds warm (from its NodeState); the planner
    /// prefers to drain nodes with fewer.
    pub warm_roles: u32,
    /// The Cluster API Machine or Karpenter NodeClaim behind the node, if one manages it.
    pub machine: Option<super::machines::MachineLink>,
}

impl NodeInfo {
    /// Whether the node carries a taint with this key.
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t.key == key)
    }
}

/// A PodDisruptionBudget: which pods it covers and how many may be disrupted now.
#[derive(Clone, Debug)]
pub struct PdbInfo {
    pub namespace: String,
    pub name: String,
    pub selector: Selector,
    /// Disruptions allowed at snapshot time: `status.disruptionsAllowed` when the disruption
    /// controller has observed the budget's generation, else computed from
    /// `minAvailable`/`maxUnavailable` and the healthy pods it selects.
    pub disruptions_allowed: i64,
    /// Healthy pods the budget must keep (`status.desiredHealthy`, or computed likewise).
    pub desired_healthy: i64,
    /// Pods the API server has recorded as evicted and the disruption controller has not
    /// processed yet (`status.disruptedPods`): no longer healthy whatever they look like.
    pub disrupted: BTreeSet<String>,
}

impl PdbInfo {
    pub fn covers(&self, pod: &PodInfo, labels: &BTreeMap<String, String>) -> bool {
        pod.namespace == self.namespace && self.selector.matches(labels)
    }
}

/// A workload controller: how many replicas it wants.
#[derive(Clone, Debug)]
pub struct OwnerInfo {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Desired replicas (Jobs: parallelism; DaemonSets: desired scheduled).
    pub desired: i64,
}
