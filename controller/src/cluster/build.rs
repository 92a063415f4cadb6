//! Builds a [`ClusterSnapshot`] from Kubernetes objects: parses quantities once, resolves
//! owners and local volumes, interns pods into scheduling classes, and computes PDB allowances.

use std::collections::{BTreeMap, HashMap};

use ebb_api::nodestate::NodeState;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelector, PersistentVolume, PersistentVolumeClaim, Pod,
    ReplicationController,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use thiserror::Error;

use super::model::{
    ClassId, HostPort, NamespaceScope, NodeId, NodeInfo, NodeSelectorTerm, Operator, OwnerInfo,
    OwnerRef, PdbInfo, PodAffinityTerm, PodInfo, Requirement, Resources, SchedClass,
    SchedRequirements, Selector, SpreadConstraint, Taint, TaintEffect, Toleration,
};
use super::quantity::{QuantityError, parse_milli, parse_units};
use super::snapshot::ClusterSnapshot;

/// Label every kubelet sets; added from the node name when missing so `hostname` topology works.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Objects a snapshot is built from (for example the contents of reflector stores).
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub pdbs: Vec<PodDisruptionBudget>,
    pub replica_sets: Vec<ReplicaSet>,
    pub stateful_sets: Vec<StatefulSet>,
    pub daemon_sets: Vec<DaemonSet>,
    pub jobs: Vec<Job>,
    pub replication_controllers: Vec<ReplicationController>,
    /// Optional: with PVs and PVCs, pods on local volumes are known to be pinned to their node.
    pub persistent_volumes: Vec<PersistentVolume>,
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// Optional: the node agents' NodeStates, for the roles whose data each node holds warm.
    pub node_states: Vec<NodeState>,
}

/// Input that cannot be turned into a snapshot.
#[derive(Debug, Error)]
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
fn resources_from(
    list: Option<&BTreeMap<String, Quantity>>,
    kind: &'static str,
    object: &str,
    field: &str,
) -> Result<(Resources, Option<i64>), SnapshotError> {
    let mut r = Resources::default();
    let mut pods = None;
    for (name, q) in list.into_iter().flatten() {
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

fn requirement(key: &str, op: &str, values: Vec<String>) -> Option<Requirement> {
    let operator = match op {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        _ => return None,
    };
    Some(Requirement {
        key: key.to_string(),
        operator,
        values,
    })
}

/// Converts a `LabelSelector`. `None` → `None` (selects nothing in most APIs).
pub fn selector_from(
    sel: &LabelSelector,
    kind: &'static str,
    object: &str,
) -> Result<Selector, SnapshotError> {
    let mut requirements = Vec::new();
    for (k, v) in sel.match_labels.iter().flatten() {
        requirements.push(Requirement {
            key: k.clone(),
            operator: Operator::In,
            values: vec![v.clone()],
        });
    }
    for e in sel.match_expressions.iter().flatten() {
        let r = requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
            .filter(|r| !matches!(r.operator, Operator::Gt | Operator::Lt))
            .ok_or_else(|| SnapshotError::Invalid {
                kind,
                object: object.to_string(),
                why: format!(
                    "label selector operator `{}` on key `{}` is not In, NotIn, Exists or DoesNotExist",
                    e.operator, e.key
                ),
            })?;
        requirements.push(r);
    }
    Ok(Selector { requirements })
}

fn node_terms(
    sel: &NodeSelector,
    kind: &'static str,
    object: &str,
) -> Result<Vec<NodeSelectorTerm>, SnapshotError> {
    let bad = |op: &str, key: &str| SnapshotError::Invalid {
        kind,
        object: object.to_string(),
        why: format!("node selector operator `{op}` on key `{key}` is unknown"),
    };
    let mut terms = Vec::new();
    for t in &sel.node_selector_terms {
        let mut term = NodeSelectorTerm::default();
        for e in t.match_expressions.iter().flatten() {
            term.match_expressions.push(
                requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
                    .ok_or_else(|| bad(&e.operator, &e.key))?,
            );
        }
        for e in t.match_fields.iter().flatten() {
            term.match_fields.push(
                requirement(&e.key, &e.operator, e.values.clone().unwrap_or_default())
                    .ok_or_else(|| bad(&e.operator, &e.key))?,
            );
        }
        terms.push(term);
    }
    Ok(terms)
}

/// Parses a Node.
pub fn parse_node(node: &Node) -> Result<NodeInfo, SnapshotError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(SnapshotError::Invalid {
            kind: "Node",
            object: "(unnamed)".into(),
            why: "metadata.name is empty".into(),
        });
    }
    let status = node.status.as_ref();
    let (allocatable, pods) = resources_from(
        status
            .and_then(|s| s.allocatable.as_ref())
            .or(status.and_then(|s| s.capacity.as_ref())),
        "Node",
        &name,
        "status.allocatable",
    )?;
    let spec = node.spec.as_ref();
    let mut taints = Vec::new();
    for t in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        let effect = TaintEffect::parse(&t.effect).ok_or_else(|| SnapshotError::Invalid {
            kind: "Node",
            object: name.clone(),
            why: format!("taint `{}` has unknown effect `{}`", t.key, t.effect),
        })?;
        taints.push(Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect,
        });
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    labels
        .entry(HOSTNAME_LABEL.to_string())
        .or_insert_with(|| name.clone());
    Ok(NodeInfo {
        labels,
        annotations: node.metadata.annotations.clone().unwrap_or_default(),
        allocatable,
        max_pods: pods.unwrap_or(110),
        taints,
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
        deleting: node.metadata.deletion_timestamp.is_some(),
        warm_roles: 0,
        name,
    })
}

/// Per node, how many workload roles (PlacementHistory namespace, name and role) have at least
/// one resource in state `Localized` there, as the node agents report in their NodeStates.
pub fn warm_roles_by_node(states: &[NodeState]) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for st in states {
        let Some(status) = &st.status else { continue };
        let roles: std::collections::BTreeSet<(&str, &str, &str)> = status
            .localized
            .iter()
            .filter(|l| l.state == "Localized")
            .map(|l| {
                (
                    l.namespace.as_str(),
                    l.placement_history.as_str(),
                    l.role.as_str(),
                )
            })
            .collect();
        if !roles.is_empty() {
            *out.entry(st.spec.node_name.clone()).or_insert(0) +=
                u32::try_from(roles.len()).unwrap_or(u32::MAX);
        }
    }
    out
}

/// Local volumes by claim: (namespace, claim) → node affinity of the bound PV.
pub type VolumeIndex = HashMap<(String, String), Vec<NodeSelectorTerm>>;

/// Indexes PVs with node affinity by the claim bound to them.
pub fn volume_index(
    pvs: &[PersistentVolume],
    pvcs: &[PersistentVolumeClaim],
) -> Result<VolumeIndex, SnapshotError> {
    let mut by_pv: HashMap<String, Vec<NodeSelectorTerm>> = HashMap::new();
    for pv in pvs {
        let name = pv.metadata.name.clone().unwrap_or_default();
        if let Some(req) = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
        {
            by_pv.insert(name.clone(), node_terms(req, "PersistentVolume", &name)?);
        }
    }
    let mut index = HashMap::new();
    for pvc in pvcs {
        let ns = pvc.metadata.namespace.clone().unwrap_or_default();
        let name = pvc.metadata.name.clone().unwrap_or_default();
        if let Some(terms) = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_ref())
            .and_then(|v| by_pv.get(v))
        {
            index.insert((ns, name), terms.clone());
        }
    }
    Ok(index)
}

fn container_requests(
    c: &Container,
    object: &str,
    field: &str,
) -> Result<Resources, SnapshotError> {
    Ok(resources_from(
        c.resources.as_ref().and_then(|r| r.requests.as_ref()),
        "Pod",
        object,
        &format!("{field}[{}].resources.requests", c.name),
    )?
    .0)
}

fn affinity_terms(
    terms: Option<&Vec<k8s_openapi::api::core::v1::PodAffinityTerm>>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    object: &str,
) -> Result<Vec<PodAffinityTerm>, SnapshotError> {
    let mut out = Vec::new();
    for t in terms.into_iter().flatten() {
        let mut selector = match &t.label_selector {
            Some(s) => selector_from(s, "Pod", object)?,
            // A null selector matches no pods: represent it by an impossible requirement.
            None => Selector {
                requirements: vec![Requirement {
                    key: String::new(),
                    operator: Operator::In,
                    values: vec![],
                }],
            },
        };
        for key in t.match_label_keys.iter().flatten() {
            if let Some(v) = labels.get(key) {
                selector.requirements.push(Requirement {
                    key: key.clone(),
                    operator: Operator::In,
                    values: vec![v.clone()],
                });
            }
        }
        let namespaces = if t.namespace_selector.is_some() {
            NamespaceScope::All
        } else {
            match t.namespaces.as_ref().filter(|n| !n.is_empty()) {
                Some(n) => NamespaceScope::Listed(n.clone()),
                None => NamespaceScope::Listed(vec![namespace.to_string()]),
            }
        };
        out.push(PodAffinityTerm {
            selector,
            namespaces,
            topology_key: t.topology_key.clone(),
        });
    }
    Ok(out)
}

/// Parses a Pod into what the planner keeps and what the scheduler looks at.
pub fn parse_pod(
    pod: &Pod,
    volumes: &VolumeIndex,
) -> Result<(PodInfo, SchedRequirements), SnapshotError> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    let object = format!("{namespace}/{name}");
    let labels = meta.labels.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let mut req = SchedRequirements {
        namespace: namespace.clone(),
        labels: labels.clone(),
        ..Default::default()
    };
    let mut local_storage = false;
    let mut pinned_by_volume = false;
    if let Some(spec) = spec {
        // Effective requests, as the scheduler computes them.
        let mut sum = Resources::default();
        for c in &spec.containers {
            sum.add(&container_requests(c, &object, "spec.containers")?);
        }
        let mut init_max = Resources::default();
        let mut sidecars = Resources::default();
        for c in spec.init_containers.iter().flatten() {
            let r = container_requests(c, &object, "spec.initContainers")?;
            if c.restart_policy.as_deref() == Some("Always") {
                sidecars.add(&r);
                init_max.max_with(&sidecars);
            } else {
                let mut this = r;
                this.add(&sidecars);
                init_max.max_with(&this);
            }
        }
        sum.add(&sidecars);
        sum.max_with(&init_max);
        let (overhead, _) =
            resources_from(spec.overhead.as_ref(), "Pod", &object, "spec.overhead")?;
        sum.add(&overhead);
        sum.extended.retain(|(_, v)| *v != 0);
        req.requests = sum;

        req.node_selector = spec.node_selector.clone().unwrap_or_default();
        let affinity = spec.affinity.as_ref();
        if let Some(ns) = affinity
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
        {
            req.node_affinity = node_terms(ns, "Pod", &object)?;
        }
        req.affinity = affinity_terms(
            affinity
                .and_then(|a| a.pod_affinity.as_ref())
                .and_then(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            &namespace,
            &labels,
            &object,
        )?;
        req.anti_affinity = affinity_terms(
            affinity
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                }),
            &namespace,
            &labels,
            &object,
        )?;
        for t in spec.tolerations.iter().flatten() {
            let effect = match t.effect.as_deref() {
                None | Some("") => None,
                Some(e) => Some(TaintEffect::parse(e).ok_or_else(|| SnapshotError::Invalid {
                    kind: "Pod",
                    object: object.clone(),
                    why: format!("toleration effect `{e}` is unknown"),
                })?),
            };
            req.tolerations.push(Toleration {
                key: t.key.clone().filter(|k| !k.is_empty()),
                exists: t.operator.as_deref() == Some("Exists"),
                value: t.value.clone().unwrap_or_default(),
                effect,
            });
        }
        let port_containers = spec.containers.iter().chain(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always")),
        );
        for c in port_containers {
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                    req.host_ports.push(HostPort {
                        ip: p.host_ip.clone().unwrap_or_default(),
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        port: hp,
                    });
                }
            }
        }
        for s in spec.topology_spread_constraints.iter().flatten() {
            if s.when_unsatisfiable != "DoNotSchedule" {
                continue;
            }
            let mut selector = match &s.label_selector {
                Some(sel) => selector_from(sel, "Pod", &object)?,
                None => continue, // a null selector matches no pods: the constraint is moot
            };
            for key in s.match_label_keys.iter().flatten() {
                if let Some(v) = labels.get(key) {
                    selector.requirements.push(Requirement {
                        key: key.clone(),
                        operator: Operator::In,
                        values: vec![v.clone()],
                    });
                }
            }
            req.spread.push(SpreadConstraint {
                max_skew: s.max_skew.max(1),
                topology_key: s.topology_key.clone(),
                selector,
            });
        }
        for v in spec.volumes.iter().flatten() {
            if v.host_path.is_some() {
                local_storage = true;
            }
            if let Some(ed) = &v.empty_dir
                && ed.medium.as_deref() != Some("Memory")
            {
                local_storage = true;
            }
            if let Some(pvc) = &v.persistent_volume_claim
                && let Some(terms) = volumes.get(&(namespace.clone(), pvc.claim_name.clone()))
            {
                req.volume_node_affinity.push(terms.clone());
                pinned_by_volume = true;
            }
        }
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| OwnerRef {
            kind: o.kind.clone(),
            name: o.name.clone(),
        });
    let annotations = meta.annotations.clone().unwrap_or_default();
    let info = PodInfo {
        uid: meta.uid.clone().unwrap_or_else(|| object.clone()),
        mirror: annotations.contains_key("kubernetes.io/config.mirror"),
        annotations,
        namespace,
        name,
        class: 0,
        owner,
        terminal: matches!(phase, "Succeeded" | "Failed"),
        terminating: meta.deletion_timestamp.is_some(),
        ready,
        local_storage,
        pinned_by_volume,
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
    };
    Ok((info, req))
}

fn int_or_percent(v: &IntOrString, total: i64, round_up: bool) -> Option<i64> {
    match v {
        IntOrString::Int(i) => Some(i64::from(*i)),
        IntOrString::String(s) => {
            let p: i64 = s.strip_suffix('%')?.trim().parse().ok()?;
            Some(if round_up {
                (p * total + 99) / 100
            } else {
                p * total / 100
            })
        }
    }
}

/// Builds the snapshot. Pods bound to nodes that are missing are an error; pending pods are
/// kept unplaced; terminal pods are kept but use no resources.
pub fn build_snapshot(objects: &ClusterObjects) -> Result<ClusterSnapshot, SnapshotError> {
    let mut nodes = Vec::with_capacity(objects.nodes.len());
    let mut node_ids: HashMap<String, NodeId> = HashMap::new();
    for n in &objects.nodes {
        let info = parse_node(n)?;
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
    let volumes = volume_index(
        &objects.persistent_volumes,
        &objects.persistent_volume_claims,
    )?;
    let mut classes: Vec<SchedClass> = Vec::new();
    let mut class_ids: HashMap<SchedRequirements, ClassId> = HashMap::new();
    let mut pods = Vec::with_capacity(objects.pods.len());
    let mut placement = Vec::with_capacity(objects.pods.len());
    let mut seen_uids: HashMap<String, ()> = HashMap::new();
    for p in &objects.pods {
        let (mut info, req) = parse_pod(p, &volumes)?;
        if seen_uids.insert(info.uid.clone(), ()).is_some() {
            continue; // the same pod listed twice
        }
        let next = classes.len() as ClassId;
        info.class = *class_ids.entry(req.clone()).or_insert_with(|| {
            classes.push(SchedClass {
                req,
                targeted_by_anti_affinity: false,
            });
            next
        });
        let node = match &info.node_name {
            Some(n) => Some(*node_ids.get(n).ok_or_else(|| SnapshotError::MissingNode {
                pod: info.key(),
                node: n.clone(),
            })?),
            None => None,
        };
        placement.push(if info.terminal { None } else { node });
        pods.push(info);
    }
    // Which classes some anti-affinity term selects.
    let anti: Vec<PodAffinityTerm> = classes
        .iter()
        .flat_map(|c| c.req.anti_affinity.iter().cloned())
        .collect();
    for c in &mut classes {
        c.targeted_by_anti_affinity = anti
            .iter()
            .any(|t| t.selects(&c.req.namespace, &c.req.labels));
    }

    let mut pdbs = Vec::new();
    for pdb in &objects.pdbs {
        let ns = pdb.metadata.namespace.clone().unwrap_or_default();
        let name = pdb.metadata.name.clone().unwrap_or_default();
        let object = format!("{ns}/{name}");
        let spec = pdb.spec.as_ref();
        let selector = match spec.and_then(|s| s.selector.as_ref()) {
            Some(s) => selector_from(s, "PodDisruptionBudget", &object)?,
            None => continue, // selects nothing
        };
        let (mut expected, mut healthy) = (0i64, 0i64);
        for (i, p) in pods.iter().enumerate() {
            if p.namespace == ns
                && !p.terminal
                && selector.matches(&classes[p.class as usize].req.labels)
            {
                expected += 1;
                if p.ready && placement[i].is_some() {
                    healthy += 1;
                }
            }
        }
        let allowed = match pdb
            .status
            .as_ref()
            .filter(|s| s.observed_generation.is_some())
        {
            Some(s) => i64::from(s.disruptions_allowed),
            None => {
                let desired = if let Some(min) = spec.and_then(|s| s.min_available.as_ref()) {
                    int_or_percent(min, expected, true)
                } else if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
                    int_or_percent(max, expected, true).map(|m| expected - m)
                } else {
                    Some(expected) // neither set: no disruptions
                };
                let desired = desired.ok_or_else(|| SnapshotError::Invalid {
                    kind: "PodDisruptionBudget",
                    object: object.clone(),
                    why: "minAvailable/maxUnavailable is neither a number nor a percentage".into(),
                })?;
                (healthy - desired).max(0)
            }
        };
        pdbs.push(PdbInfo {
            namespace: ns,
            name,
            selector,
            disruptions_allowed: allowed,
        });
    }

    let mut owners = HashMap::new();
    let mut add_owner = |kind: &str,
                         meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                         desired: i64| {
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        owners.insert(
            (kind.to_string(), ns.clone(), name.clone()),
            OwnerInfo {
                kind: kind.to_string(),
                namespace: ns,
                name,
                desired,
            },
        );
    };
    for o in &objects.replica_sets {
        add_owner(
            "ReplicaSet",
            &o.metadata,
            i64::from(o.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
        );
    }
    for o in &objects.stateful_sets {
        add_owner(
            "StatefulSet",
            &o.metadata,
            i64::from(o.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
        );
    }
    for o in &objects.replication_controllers {
        add_owner(
            "ReplicationController",
            &o.metadata,
            i64::from(o.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
        );
    }
    for o in &objects.jobs {
        add_owner(
            "Job",
            &o.metadata,
            i64::from(o.spec.as_ref().and_then(|s| s.parallelism).unwrap_or(1)),
        );
    }
    for o in &objects.daemon_sets {
        add_owner(
            "DaemonSet",
            &o.metadata,
            i64::from(
                o.status
                    .as_ref()
                    .map(|s| s.desired_number_scheduled)
                    .unwrap_or(0),
            ),
        );
    }
    Ok(ClusterSnapshot::from_parts(
        nodes, pods, classes, class_ids, pdbs, owners, placement,
    ))
}
