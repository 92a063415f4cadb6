//! The pod as ebb keeps it: only the fields some reader uses, in structs sized for those fields
//! (a `k8s-openapi` `Pod` is sized for every field a pod can have: 7 KiB a pod however few it holds).
//!
//! The watch and `ebb-controller plan` decode pods straight into [`CachedPod`]: fields it has no
//! place for are skipped while decoding, never held. Field names and shapes follow the Pod API
//! (`pod.spec.containers[0].resources.requests`), so reading one reads like reading a Pod. A new
//! reader of a field not here must add it here first: the compiler then says what is kept.
//!
//! | part | kept | read by |
//! | --- | --- | --- |
//! | `metadata` | name, namespace, uid, resourceVersion, labels, annotations (not `kubectl`'s last-applied copy), ownerReferences, creationTimestamp, deletionTimestamp | everything that names a pod; annotations: drainability, placement tokens; owners: the model, drains; creation: whether the steering webhook was called for a new pod |
//! | `spec` | nodeName, schedulerName (not the default one's), affinity, nodeSelector, tolerations, topologySpreadConstraints, schedulingGates, overhead, resources, terminationGracePeriodSeconds | the model's scheduling requirements; placement's patches; evictions (grace); the pacing (a replacement in the default scheduler's queue) |
//! | containers, init containers | name, `resources.requests`, restartPolicy (sidecars), ports that have a hostPort | effective requests, host ports |
//! | volumes | hostPath, emptyDir, persistentVolumeClaim and ephemeral ones (an ephemeral one's template dropped; others dropped) | local storage, volumes pinned to a node; the pacing (claims a pod's scheduling waits for) |
//! | `status` | phase, reason, nominatedNodeName, startTime, the conditions Ready, PodScheduled and DisruptionTarget (type, status, reason; PodScheduled's time) | finished and ready pods, budgets' health, nominations, placement's end classification |
//! | container statuses | of terminated containers only: name, ready, `state.terminated` (exitCode, reason, startedAt, finishedAt) | placement's end classification (exit code, OOMKilled, how long it ran) |

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    Affinity, ContainerPort, EmptyDirVolumeSource, HostPathVolumeSource,
    PersistentVolumeClaimVolumeSource, Pod, PodSchedulingGate, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};

use super::build::LAST_APPLIED;
use super::compact_map::{CompactMap, ResourceList};

/// The scheduler of pods that name none.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// A pod, cut down to what ebb reads (module docs).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct CachedPod {
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}

/// What ebb reads of a pod's spec.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PodSpec {
    pub node_name: Option<String>,
    /// `None` for the default scheduler's pods (the trimmed cache holds no copy of its name).
    pub scheduler_name: Option<String>,
    pub containers: Vec<Container>,
    pub init_containers: Option<Vec<Container>>,
    pub volumes: Option<Vec<Volume>>,
    /// Boxed: most pods have none, and inline it would take 144 bytes of every pod.
    pub affinity: Option<Box<Affinity>>,
    pub node_selector: Option<CompactMap<String>>,
    pub tolerations: Option<Vec<Toleration>>,
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    pub scheduling_gates: Option<Vec<PodSchedulingGate>>,
    pub overhead: Option<ResourceList>,
    /// Pod-level resources (rare; read whole; boxed, as affinity).
    pub resources: Option<Box<ResourceRequirements>>,
    pub termination_grace_period_seconds: Option<i64>,
}

/// A container's name, requests, restart policy (a sidecar's `Always`) and host ports.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    pub resources: Option<Requests>,
    pub restart_policy: Option<String>,
    /// Only the ports that have a hostPort.
    pub ports: Option<Vec<ContainerPort>>,
}

/// A container's requests (its limits are not read).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct Requests {
    pub requests: Option<ResourceList>,
}

/// A volume that says something about local storage or a claim.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    pub host_path: Option<HostPathVolumeSource>,
    pub empty_dir: Option<EmptyDirVolumeSource>,
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// A claim created for the pod (its template is not kept).
    pub ephemeral: Option<Ephemeral>,
}

/// That a volume is a generic ephemeral one: a claim made for the pod.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Ephemeral {}

impl Volume {
    /// Whether any reader looks at this volume.
    fn is_read(&self) -> bool {
        self.host_path.is_some()
            || self.empty_dir.is_some()
            || self.persistent_volume_claim.is_some()
            || self.ephemeral.is_some()
    }

    /// A claim the pod's scheduling may wait for (bound or provisioned before the pod is).
    pub fn claims(&self) -> bool {
        self.persistent_volume_claim.is_some() || self.ephemeral.is_some()
    }
}

/// What ebb reads of a pod's status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Option<String>,
    pub reason: Option<String>,
    pub nominated_node_name: Option<String>,
    pub start_time: Option<Time>,
    pub conditions: Option<Vec<PodCondition>>,
    pub container_statuses: Option<Vec<ContainerStatus>>,
    pub init_container_statuses: Option<Vec<ContainerStatus>>,
}

/// A pod condition: type, status, reason, and (PodScheduled's only) when it changed.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PodCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: Option<String>,
    pub last_transition_time: Option<Time>,
}

/// The pod conditions some reader uses: readiness (budgets' health, placement), when the pod was
/// bound (`PodScheduled`), and whether a disruption ended it (`DisruptionTarget`).
const POD_CONDITIONS: [&str; 3] = ["Ready", "PodScheduled", "DisruptionTarget"];

/// A terminated container's status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    pub ready: bool,
    pub state: Option<ContainerState>,
}

/// A container's state; only a terminated one is kept.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct ContainerState {
    pub terminated: Option<Terminated>,
}

/// How a container ended.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Terminated {
    pub exit_code: i32,
    pub reason: Option<String>,
    pub started_at: Option<Time>,
    pub finished_at: Option<Time>,
}

impl CachedPod {
    /// Drops what decoding kept but no reader uses: metadata beyond identity, labels,
    /// annotations, owners and times; ports without a hostPort; volumes of other kinds;
    /// unread conditions and their times; the statuses of containers that did not terminate.
    pub fn trim(&mut self) {
        trim_meta(&mut self.metadata);
        if let Some(s) = self.spec.as_mut() {
            if s.scheduler_name.as_deref() == Some(DEFAULT_SCHEDULER) {
                s.scheduler_name = None;
            }
            s.containers.iter_mut().for_each(Container::trim);
            s.init_containers
                .iter_mut()
                .flatten()
                .for_each(Container::trim);
            s.volumes = s
                .volumes
                .take()
                .map(|v| v.into_iter().filter(Volume::is_read).collect::<Vec<_>>())
                .filter(|v| !v.is_empty());
        }
        if let Some(s) = self.status.as_mut() {
            if let Some(cs) = s.conditions.as_mut() {
                cs.retain(|c| POD_CONDITIONS.contains(&c.type_.as_str()));
                for c in cs.iter_mut().filter(|c| c.type_ != "PodScheduled") {
                    c.last_transition_time = None;
                }
            }
            let terminated = |v: Option<Vec<ContainerStatus>>| {
                v.map(|v| {
                    v.into_iter()
                        .filter(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
                        .collect::<Vec<_>>()
                })
                .filter(|v| !v.is_empty())
            };
            s.container_statuses = terminated(s.container_statuses.take());
            s.init_container_statuses = terminated(s.init_container_statuses.take());
        }
    }

    /// A PodScheduled time later than `now` (the API server's clock ahead of ebb's, or a
    /// simulator's fast clock) becomes `now`, when ebb saw the pod: the arrival window
    /// (`eligibility::ARRIVAL_WINDOW`, on ebb's clock) then counts from a time ebb's clock
    /// has passed, instead of opening only when that clock reaches the API server's.
    pub fn scheduled_no_later_than(&mut self, now: jiff::Timestamp) {
        let scheduled = self
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == "PodScheduled");
        for c in scheduled {
            if let Some(t) = c.last_transition_time.as_mut().filter(|t| t.0 > now) {
                t.0 = now;
            }
        }
    }

    /// The node the pod is bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }

    /// The pod's phase.
    pub fn phase(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.phase.as_deref())
    }
}

impl Container {
    fn trim(&mut self) {
        self.ports = self
            .ports
            .take()
            .map(|p| {
                p.into_iter()
                    .filter(|p| p.host_port.is_some_and(|h| h > 0))
                    .collect::<Vec<_>>()
            })
            .filter(|p| !p.is_empty());
    }
}

/// The metadata every reader uses: identity, labels, annotations, owners, creation and deletion.
pub fn trim_meta(m: &mut ObjectMeta) {
    let annotations = m.annotations.take().map(|mut a| {
        a.remove(LAST_APPLIED);
        a
    });
    *m = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        labels: m.labels.take(),
        annotations,
        owner_references: m.owner_references.take(),
        // Steering judges whether the webhook was called for a pod just created.
        creation_timestamp: m.creation_timestamp.take(),
        deletion_timestamp: m.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

impl From<Pod> for CachedPod {
    /// A whole pod (an admission request's, a test's) as the cache keeps it.
    fn from(p: Pod) -> Self {
        let spec = p.spec.map(|s| PodSpec {
            node_name: s.node_name,
            scheduler_name: s.scheduler_name,
            containers: s.containers.into_iter().map(Container::from).collect(),
            init_containers: s
                .init_containers
                .map(|cs| cs.into_iter().map(Container::from).collect()),
            volumes: s.volumes.map(|vs| {
                vs.into_iter()
                    .map(|v| Volume {
                        name: v.name,
                        host_path: v.host_path,
                        empty_dir: v.empty_dir,
                        persistent_volume_claim: v.persistent_volume_claim,
                        ephemeral: v.ephemeral.map(|_| Ephemeral {}),
                    })
                    .collect()
            }),
            affinity: s.affinity.map(Box::new),
            node_selector: s.node_selector.map(CompactMap::from),
            tolerations: s.tolerations,
            topology_spread_constraints: s.topology_spread_constraints,
            scheduling_gates: s.scheduling_gates,
            overhead: s.overhead.map(ResourceList::from),
            resources: s.resources.map(Box::new),
            termination_grace_period_seconds: s.termination_grace_period_seconds,
        });
        let statuses = |v: Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
            v.map(|v| {
                v.into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        ready: c.ready,
                        state: c.state.map(|s| ContainerState {
                            terminated: s.terminated.map(|t| Terminated {
                                exit_code: t.exit_code,
                                reason: t.reason,
                                started_at: t.started_at,
                                finished_at: t.finished_at,
                            }),
                        }),
                    })
                    .collect()
            })
        };
        let status = p.status.map(|s| PodStatus {
            phase: s.phase,
            reason: s.reason,
            nominated_node_name: s.nominated_node_name,
            start_time: s.start_time,
            conditions: s.conditions.map(|cs| {
                cs.into_iter()
                    .map(|c| PodCondition {
                        type_: c.type_,
                        status: c.status,
                        reason: c.reason,
                        last_transition_time: c.last_transition_time,
                    })
                    .collect()
            }),
            container_statuses: statuses(s.container_statuses),
            init_container_statuses: statuses(s.init_container_statuses),
        });
        let mut pod = CachedPod {
            metadata: p.metadata,
            spec,
            status,
        };
        pod.trim();
        pod
    }
}

impl From<k8s_openapi::api::core::v1::Container> for Container {
    fn from(c: k8s_openapi::api::core::v1::Container) -> Self {
        Container {
            name: c.name,
            resources: c.resources.map(|r| Requests {
                requests: r.requests.map(ResourceList::from),
            }),
            restart_policy: c.restart_policy,
            ports: c.ports,
        }
    }
}

impl kube::Resource for CachedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
