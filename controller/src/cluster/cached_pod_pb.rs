//! A protobuf pod (`k8s-pb`) as the pod cache keeps it: the same [`CachedPod`] the JSON decode
//! yields for the same pod, field by field.
//!
//! The API server writes both encodings from one Go object, but they say "unset" differently.
//! Go's protobuf writes every non-pointer string, number and bool, empty or not, where its JSON
//! leaves out those tagged `omitempty`; so a field tagged `omitempty` is `None` here when empty
//! or zero, a field without the tag is read as is, and a pointer field is `None` only when
//! absent. A non-pointer struct (a container's `resources`, a status's `state`, the pod's `spec`
//! and `status`) is always in Go's JSON, so it is always `Some` here. Times: Go sends a zero time
//! as an empty message (JSON `null`) and whole seconds otherwise (JSON's RFC 3339 has no
//! fraction), so nanoseconds are dropped. Quantities are the same canonical string in both.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as json;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as jmeta;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pmeta;

use super::cached_pod::{
    CachedPod, Container, ContainerState, ContainerStatus, Ephemeral, PodCondition, PodSpec,
    PodStatus, Requests, Terminated, Volume,
};

/// A protobuf pod that has no JSON form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    /// A time outside what RFC 3339 (and `jiff`) can write.
    #[error("the time {seconds} s from the epoch in field {field} is out of range")]
    Time { field: &'static str, seconds: i64 },
}

type R<T> = Result<T, ConvertError>;

impl CachedPod {
    /// The pod the cache keeps of a protobuf pod: what [`CachedPod`]'s JSON decode and
    /// [`CachedPod::trim`] keep of the same pod.
    pub fn from_protobuf(p: pb::Pod) -> Result<Self, ConvertError> {
        let spec = p.spec.unwrap_or_default();
        let status = p.status.unwrap_or_default();
        let mut pod = CachedPod {
            metadata: meta(p.metadata.unwrap_or_default())?,
            spec: Some(pod_spec(spec)),
            status: Some(pod_status(status)?),
        };
        pod.trim();
        Ok(pod)
    }
}

/// `omitempty` string: empty is unset.
fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// `omitempty` number or bool: zero is unset.
fn nonzero<T: Default + PartialEq>(v: Option<T>) -> Option<T> {
    v.filter(|v| *v != T::default())
}

/// `omitempty` list: empty is unset.
fn list<T, U>(v: Vec<T>, f: impl FnMut(T) -> U) -> Option<Vec<U>> {
    (!v.is_empty()).then(|| v.into_iter().map(f).collect())
}

/// `omitempty` list whose items may fail.
fn try_list<T, U>(v: Vec<T>, f: impl FnMut(T) -> R<U>) -> R<Option<Vec<U>>> {
    if v.is_empty() {
        return Ok(None);
    }
    v.into_iter().map(f).collect::<R<Vec<U>>>().map(Some)
}

/// `omitempty` map of strings (a `BTreeMap`, or the cache's `CompactMap`).
fn strings<C: From<BTreeMap<String, String>>>(m: BTreeMap<String, String>) -> Option<C> {
    (!m.is_empty()).then(|| C::from(m))
}

fn quantity(q: k8s_pb::apimachinery::pkg::api::resource::Quantity) -> Quantity {
    Quantity(q.string.unwrap_or_default())
}

/// `omitempty` resource list (a `BTreeMap`, or the cache's `ResourceList`).
fn resources<C: FromIterator<(String, Quantity)>>(
    m: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>,
) -> Option<C> {
    (!m.is_empty()).then(|| m.into_iter().map(|(k, q)| (k, quantity(q))).collect())
}

/// A `metav1.Time`: an absent or empty message is Go's zero time (JSON `null`); otherwise whole
/// seconds, as its JSON writes them.
fn time(field: &'static str, t: Option<pmeta::Time>) -> R<Option<jmeta::Time>> {
    let Some(t) = t else { return Ok(None) };
    if t.seconds.is_none() && t.nanos.is_none() {
        return Ok(None);
    }
    let seconds = t.seconds.unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|ts| Some(jmeta::Time(ts)))
        .map_err(|_| ConvertError::Time { field, seconds })
}

/// The metadata fields the cache keeps ([`super::cached_pod::trim_meta`]).
fn meta(m: pmeta::ObjectMeta) -> R<jmeta::ObjectMeta> {
    Ok(jmeta::ObjectMeta {
        name: nonempty(m.name),
        namespace: nonempty(m.namespace),
        uid: nonempty(m.uid),
        resource_version: nonempty(m.resource_version),
        labels: strings(m.labels),
        annotations: strings(m.annotations),
        owner_references: list(m.owner_references, |o| jmeta::OwnerReference {
            api_version: o.api_version.unwrap_or_default(),
            kind: o.kind.unwrap_or_default(),
            name: o.name.unwrap_or_default(),
            uid: o.uid.unwrap_or_default(),
            controller: o.controller,
            block_owner_deletion: o.block_owner_deletion,
        }),
        creation_timestamp: time("metadata.creationTimestamp", m.creation_timestamp)?,
        deletion_timestamp: time("metadata.deletionTimestamp", m.deletion_timestamp)?,
        ..jmeta::ObjectMeta::default()
    })
}

fn pod_spec(s: pb::PodSpec) -> PodSpec {
    PodSpec {
        node_name: nonempty(s.node_name),
        scheduler_name: nonempty(s.scheduler_name),
        containers: s.containers.into_iter().map(container).collect(),
        init_containers: list(s.init_containers, container),
        volumes: list(s.volumes, volume),
        affinity: s.affinity.map(|a| Box::new(affinity(a))),
        node_selector: strings(s.node_selector),
        tolerations: list(s.tolerations, |t| json::Toleration {
            key: nonempty(t.key),
            operator: nonempty(t.operator),
            value: nonempty(t.value),
            effect: nonempty(t.effect),
            toleration_seconds: t.toleration_seconds,
        }),
        topology_spread_constraints: list(s.topology_spread_constraints, |c| {
            json::TopologySpreadConstraint {
                max_skew: c.max_skew.unwrap_or_default(),
                topology_key: c.topology_key.unwrap_or_default(),
                when_unsatisfiable: c.when_unsatisfiable.unwrap_or_default(),
                label_selector: c.label_selector.map(label_selector),
                min_domains: c.min_domains,
                node_affinity_policy: c.node_affinity_policy,
                node_taints_policy: c.node_taints_policy,
                match_label_keys: list(c.match_label_keys, |k| k),
            }
        }),
        scheduling_gates: list(s.scheduling_gates, |g| json::PodSchedulingGate {
            name: g.name.unwrap_or_default(),
        }),
        overhead: resources(s.overhead),
        resources: s.resources.map(|r| Box::new(requirements(r))),
        termination_grace_period_seconds: s.termination_grace_period_seconds,
    }
}

fn container(c: pb::Container) -> Container {
    Container {
        name: c.name.unwrap_or_default(),
        // A struct in Go: always in its JSON.
        resources: Some(Requests {
            requests: c.resources.and_then(|r| resources(r.requests)),
        }),
        restart_policy: c.restart_policy,
        ports: list(c.ports, |p| json::ContainerPort {
            name: nonempty(p.name),
            host_port: nonzero(p.host_port),
            container_port: p.container_port.unwrap_or_default(),
            protocol: nonempty(p.protocol),
            host_ip: nonempty(p.host_ip),
        }),
    }
}

fn volume(v: pb::Volume) -> Volume {
    let source = v.volume_source.unwrap_or_default();
    Volume {
        name: v.name.unwrap_or_default(),
        host_path: source.host_path.map(|h| json::HostPathVolumeSource {
            path: h.path.unwrap_or_default(),
            type_: h.r#type,
        }),
        empty_dir: source.empty_dir.map(|e| json::EmptyDirVolumeSource {
            medium: nonempty(e.medium),
            size_limit: e.size_limit.map(quantity),
        }),
        persistent_volume_claim: source.persistent_volume_claim.map(|c| {
            json::PersistentVolumeClaimVolumeSource {
                claim_name: c.claim_name.unwrap_or_default(),
                read_only: nonzero(c.read_only),
            }
        }),
        ephemeral: source.ephemeral.map(|_| Ephemeral {}),
    }
}

fn requirements(r: pb::ResourceRequirements) -> json::ResourceRequirements {
    json::ResourceRequirements {
        limits: resources(r.limits),
        requests: resources(r.requests),
        claims: list(r.claims, |c| json::ResourceClaim {
            name: c.name.unwrap_or_default(),
            request: nonempty(c.request),
        }),
    }
}

fn label_selector(s: pmeta::LabelSelector) -> jmeta::LabelSelector {
    jmeta::LabelSelector {
        match_labels: strings(s.match_labels),
        match_expressions: list(s.match_expressions, |r| jmeta::LabelSelectorRequirement {
            key: r.key.unwrap_or_default(),
            operator: r.operator.unwrap_or_default(),
            values: list(r.values, |v| v),
        }),
    }
}

fn affinity(a: pb::Affinity) -> json::Affinity {
    json::Affinity {
        node_affinity: a.node_affinity.map(|n| json::NodeAffinity {
            required_during_scheduling_ignored_during_execution: n
                .required_during_scheduling_ignored_during_execution
                .map(|s| json::NodeSelector {
                    node_selector_terms: s
                        .node_selector_terms
                        .into_iter()
                        .map(node_selector_term)
                        .collect(),
                }),
            preferred_during_scheduling_ignored_during_execution: list(
                n.preferred_during_scheduling_ignored_during_execution,
                |p| json::PreferredSchedulingTerm {
                    weight: p.weight.unwrap_or_default(),
                    preference: node_selector_term(p.preference.unwrap_or_default()),
                },
            ),
        }),
        pod_affinity: a.pod_affinity.map(|p| json::PodAffinity {
            required_during_scheduling_ignored_during_execution: list(
                p.required_during_scheduling_ignored_during_execution,
                pod_affinity_term,
            ),
            preferred_during_scheduling_ignored_during_execution: list(
                p.preferred_during_scheduling_ignored_during_execution,
                weighted_term,
            ),
        }),
        pod_anti_affinity: a.pod_anti_affinity.map(|p| json::PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: list(
                p.required_during_scheduling_ignored_during_execution,
                pod_affinity_term,
            ),
            preferred_during_scheduling_ignored_during_execution: list(
                p.preferred_during_scheduling_ignored_during_execution,
                weighted_term,
            ),
        }),
    }
}

fn node_selector_term(t: pb::NodeSelectorTerm) -> json::NodeSelectorTerm {
    let requirement = |r: pb::NodeSelectorRequirement| json::NodeSelectorRequirement {
        key: r.key.unwrap_or_default(),
        operator: r.operator.unwrap_or_default(),
        values: list(r.values, |v| v),
    };
    json::NodeSelectorTerm {
        match_expressions: list(t.match_expressions, requirement),
        match_fields: list(t.match_fields, requirement),
    }
}

fn pod_affinity_term(t: pb::PodAffinityTerm) -> json::PodAffinityTerm {
    json::PodAffinityTerm {
        label_selector: t.label_selector.map(label_selector),
        namespaces: list(t.namespaces, |n| n),
        topology_key: t.topology_key.unwrap_or_default(),
        namespace_selector: t.namespace_selector.map(label_selector),
        match_label_keys: list(t.match_label_keys, |k| k),
        mismatch_label_keys: list(t.mismatch_label_keys, |k| k),
    }
}

fn weighted_term(t: pb::WeightedPodAffinityTerm) -> json::WeightedPodAffinityTerm {
    json::WeightedPodAffinityTerm {
        weight: t.weight.unwrap_or_default(),
        pod_affinity_term: pod_affinity_term(t.pod_affinity_term.unwrap_or_default()),
    }
}

fn pod_status(s: pb::PodStatus) -> R<PodStatus> {
    Ok(PodStatus {
        phase: nonempty(s.phase),
        reason: nonempty(s.reason),
        nominated_node_name: nonempty(s.nominated_node_name),
        start_time: time("status.startTime", s.start_time)?,
        conditions: try_list(s.conditions, |c| {
            Ok(PodCondition {
                type_: c.r#type.unwrap_or_default(),
                status: c.status.unwrap_or_default(),
                reason: nonempty(c.reason),
                last_transition_time: time(
                    "status.conditions.lastTransitionTime",
                    c.last_transition_time,
                )?,
            })
        })?,
        container_statuses: try_list(s.container_statuses, container_status)?,
        init_container_statuses: try_list(s.init_container_statuses, container_status)?,
    })
}

fn container_status(c: pb::ContainerStatus) -> R<ContainerStatus> {
    let state = c.state.unwrap_or_default();
    Ok(ContainerStatus {
        name: c.name.unwrap_or_default(),
        ready: c.ready.unwrap_or_default(),
        // A struct in Go: always in its JSON.
        state: Some(ContainerState {
            terminated: match state.terminated {
                Some(t) => Some(Terminated {
                    exit_code: t.exit_code.unwrap_or_default(),
                    reason: nonempty(t.reason),
                    started_at: time("state.terminated.startedAt", t.started_at)?,
                    finished_at: time("state.terminated.finishedAt", t.finished_at)?,
                }),
                None => None,
            },
        }),
    })
}
