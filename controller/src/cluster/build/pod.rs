//! Pods into what the planner keeps ([`PodInfo`]) and what the scheduler looks at
//! ([`SchedRequirements`]): effective requests, selectors, affinity, tolerations, ports, spread.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cluster::CachedPod;
use crate::cluster::cached_pod::{Container, PodSpec};

use super::selectors::{add_match_label_keys, affinity_terms, node_terms, selector_from};
use super::volumes::{ClaimPlacement, VolumeIndex};
use super::{SnapshotError, resources_from};
use crate::cluster::types::{
    HostPort, LocalVolume, OwnerRef, PodInfo, Resources, SchedRequirements, SpreadConstraint,
    TaintEffect, Toleration,
};

/// The annotations of a pod the planner reads (drainability's). The model keeps only these: the
/// cache keeps them all for the readers that patch pods, and a second copy of a pod's every
/// annotation cost about 600 bytes a pod (a map's first entry allocates a whole node).
pub const PLANNER_POD_ANNOTATIONS: [&str; 3] = [
    ebb_api::names::ANNOTATION_SAFE_TO_EVICT,
    ebb_api::names::CA_ANNOTATION_SAFE_TO_EVICT,
    ebb_api::names::KARPENTER_DO_NOT_DISRUPT,
];

/// A pod's [`PLANNER_POD_ANNOTATIONS`] (an empty map allocates nothing).
fn planner_annotations(all: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let Some(all) = all else {
        return BTreeMap::new();
    };
    PLANNER_POD_ANNOTATIONS
        .iter()
        .filter_map(|k| all.get(*k).map(|v| ((*k).to_string(), v.clone())))
        .collect()
}

/// What a pod's volumes say: local storage (hostPath, disk emptyDir) and the first claim bound
/// to a PersistentVolume with node affinity (a local volume).
#[derive(Default)]
struct VolumeFacts {
    local_storage: bool,
    local_volume: Option<LocalVolume>,
}

/// Parses a Pod into what the planner keeps and what the scheduler looks at. `steered`: the
/// node ebb planned for it when ebb steered it at its creation and vouches for it (never read
/// from the pod itself: an annotation is anyone's to write).
pub fn parse_pod(
    pod: &CachedPod,
    volumes: &VolumeIndex,
    steered: Option<&str>,
) -> Result<(PodInfo, SchedRequirements), SnapshotError> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    let object = format!("{namespace}/{name}");
    let mut req = SchedRequirements {
        namespace: namespace.clone(),
        labels: meta.labels.clone().unwrap_or_default(),
        ..Default::default()
    };
    let mut vols = VolumeFacts::default();
    if let Some(spec) = pod.spec.as_ref() {
        scheduling_requirements(spec, &object, &mut req)?;
        vols = volume_facts(
            spec,
            meta.annotations.as_ref(),
            &namespace,
            volumes,
            &mut req,
        );
    }
    let info = pod_info(pod, namespace, name, object, vols, steered);
    Ok((info, req))
}

/// Fills `req` from the spec: requests, node selection, pod (anti-)affinity, tolerations, host
/// ports and hard topology spread.
fn scheduling_requirements(
    spec: &PodSpec,
    object: &str,
    req: &mut SchedRequirements,
) -> Result<(), SnapshotError> {
    req.requests = effective_requests(spec, object)?;
    req.node_selector = spec
        .node_selector
        .as_ref()
        .map(BTreeMap::from)
        .unwrap_or_default();
    let affinity = spec.affinity.as_ref();
    if let Some(ns) = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    {
        req.node_affinity = node_terms(ns, "Pod", object)?;
    }
    let (namespace, labels) = (&req.namespace, &req.labels);
    let terms = |t| affinity_terms(t, namespace, labels, object);
    let pod_affinity = terms(
        affinity
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
    )?;
    let pod_anti_affinity = terms(
        affinity
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
    )?;
    req.affinity = pod_affinity;
    req.anti_affinity = pod_anti_affinity;
    req.tolerations = tolerations(spec, object)?;
    req.host_ports = host_ports(spec);
    req.spread = spread_constraints(spec, &req.labels, object)?;
    Ok(())
}

fn container_requests(
    c: &Container,
    object: &str,
    field: &str,
) -> Result<Resources, SnapshotError> {
    Ok(resources_from(
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten(),
        "Pod",
        object,
        &format!("{field}[{}].resources.requests", c.name),
    )?
    .0)
}

/// Effective requests, as the scheduler computes them: containers and sidecars summed, at
/// least the largest init container (with the sidecars started before it), plus overhead.
fn effective_requests(spec: &PodSpec, object: &str) -> Result<Resources, SnapshotError> {
    let mut sum = Resources::default();
    for c in &spec.containers {
        sum.add(&container_requests(c, object, "spec.containers")?);
    }
    let mut init_max = Resources::default();
    let mut sidecars = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c, object, "spec.initContainers")?;
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
    let (overhead, _) = resources_from(
        spec.overhead.iter().flatten(),
        "Pod",
        object,
        "spec.overhead",
    )?;
    sum.add(&overhead);
    sum.extended.retain(|(_, v)| *v != 0);
    Ok(sum)
}

fn tolerations(spec: &PodSpec, object: &str) -> Result<Vec<Toleration>, SnapshotError> {
    let mut out = Vec::new();
    for t in spec.tolerations.iter().flatten() {
        let effect = match t.effect.as_deref() {
            None | Some("") => None,
            Some(e) => Some(TaintEffect::parse(e).ok_or_else(|| SnapshotError::Invalid {
                kind: "Pod",
                object: object.to_string(),
                why: format!("toleration effect `{e}` is unknown"),
            })?),
        };
        out.push(Toleration {
            key: t.key.clone().filter(|k| !k.is_empty()),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect,
        });
    }
    Ok(out)
}

/// Host ports of the containers and sidecars.
fn host_ports(spec: &PodSpec) -> Vec<HostPort> {
    let port_containers = spec.containers.iter().chain(
        spec.init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always")),
    );
    let mut out = Vec::new();
    for c in port_containers {
        for p in c.ports.iter().flatten() {
            if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                out.push(HostPort {
                    ip: p.host_ip.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: hp,
                });
            }
        }
    }
    out
}

/// The `DoNotSchedule` topology spread constraints.
fn spread_constraints(
    spec: &PodSpec,
    labels: &BTreeMap<String, String>,
    object: &str,
) -> Result<Vec<SpreadConstraint>, SnapshotError> {
    let mut out = Vec::new();
    for s in spec.topology_spread_constraints.iter().flatten() {
        if s.when_unsatisfiable != "DoNotSchedule" {
            continue;
        }
        let mut selector = match &s.label_selector {
            Some(sel) => selector_from(sel, "Pod", object)?,
            None => continue, // a null selector matches no pods: the constraint is moot
        };
        add_match_label_keys(&mut selector, s.match_label_keys.as_deref(), labels);
        out.push(SpreadConstraint {
            max_skew: s.max_skew.max(1),
            topology_key: s.topology_key.clone(),
            selector,
        });
    }
    Ok(out)
}

/// Local storage and local PersistentVolumes (whose node affinity joins `req`). Volumes named in
/// Cluster Autoscaler's `safe-to-evict-local-volumes` annotation do not count as local storage.
fn volume_facts(
    spec: &PodSpec,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    namespace: &str,
    volumes: &VolumeIndex,
    req: &mut SchedRequirements,
) -> VolumeFacts {
    let mut out = VolumeFacts::default();
    let may_lose: Vec<&str> = annotations
        .and_then(|a| a.get(ebb_api::names::CA_ANNOTATION_SAFE_TO_EVICT_LOCAL_VOLUMES))
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default();
    for v in spec.volumes.iter().flatten() {
        let local = v.host_path.is_some()
            || v.empty_dir
                .as_ref()
                .is_some_and(|ed| ed.medium.as_deref() != Some("Memory"));
        if local && !may_lose.contains(&v.name.as_str()) {
            out.local_storage = true;
        }
        let Some(pvc) = &v.persistent_volume_claim else {
            continue;
        };
        let Some(placement) = volumes.get(&(namespace.to_string(), pvc.claim_name.clone())) else {
            continue;
        };
        if let Some(terms) = placement.terms() {
            req.volume_node_affinity.push(terms);
        }
        if let ClaimPlacement::Bound { pv, .. } = placement
            && out.local_volume.is_none()
        {
            out.local_volume = Some(LocalVolume {
                claim: pvc.claim_name.clone(),
                pv: pv.clone(),
            });
        }
    }
    out
}

/// What the planner keeps of the pod: identity, owner, phase, readiness and volumes.
fn pod_info(
    pod: &CachedPod,
    namespace: String,
    name: String,
    object: String,
    vols: VolumeFacts,
    steered: Option<&str>,
) -> PodInfo {
    let meta = &pod.metadata;
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
    let mirror = ebb_api::names::is_static_pod(
        meta.annotations.as_ref(),
        meta.owner_references
            .iter()
            .flatten()
            .map(|o| o.kind.as_str()),
    );
    let annotations = planner_annotations(meta.annotations.as_ref());
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let terminating = meta.deletion_timestamp.is_some();
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    // On its way to a node: the scheduler nominated it (preemption, or binding in progress
    // since Kubernetes 1.35), or ebb steered it there at its creation (a replacement ebb
    // vouches for; the pod's own annotations count for nothing). It counts as there until it
    // is bound. A pod held by a scheduling gate is on its way nowhere.
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let nominated = match (&bound, terminal || terminating || gated) {
        (None, false) => status
            .and_then(|s| s.nominated_node_name.clone())
            .or_else(|| steered.map(str::to_string))
            .filter(|n| !n.is_empty()),
        _ => None,
    };
    let scheduled_at = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    PodInfo {
        uid: Arc::from(meta.uid.as_deref().unwrap_or(&object)),
        shared_key: PodInfo::key_of(&namespace, &name),
        mirror,
        started: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
        annotations,
        namespace,
        name,
        class: 0,
        owner,
        terminal,
        terminating,
        ready,
        local_storage: vols.local_storage,
        local_volume: vols.local_volume,
        nominated: nominated.is_some(),
        scheduled_at,
        node_name: bound.or(nominated),
    }
}
