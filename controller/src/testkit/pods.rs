//! Pod builder: a Running, Ready pod in namespace `default` with uid `uid-<namespace>-<name>`
//! and one container, refined with requests, owners, status and volumes.

use crate::cluster::CachedPod;
use crate::cluster::cached_pod::{Container, PodCondition, PodSpec, PodStatus, Requests, Volume};
use crate::cluster::compact_map::ResourceList;
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolumeClaimVolumeSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

use super::put;

/// Builder of a Running, Ready pod (uid: `uid-<namespace>-<name>`, kept by [`PodBuilder::ns`]).
#[derive(Clone, Debug)]
pub struct PodBuilder(CachedPod);

/// Start a Pod named `name` in namespace `default`.
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder(CachedPod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-default-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(Requests {
                    requests: Some(ResourceList::default()),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    })
}

impl PodBuilder {
    pub(super) fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_default()
    }
    fn request(mut self, k: &str, v: &str) -> Self {
        if let Some(r) = self.spec().containers[0]
            .resources
            .get_or_insert_default()
            .requests
            .as_mut()
        {
            r.insert(k.into(), Quantity(v.into()));
        }
        self
    }
    /// Moves the pod to namespace `ns` (its uid follows: `uid-<ns>-<name>`).
    pub fn ns(mut self, ns: &str) -> Self {
        let name = self.0.metadata.name.clone().unwrap_or_default();
        self.0.metadata.namespace = Some(ns.into());
        self.0.metadata.uid = Some(format!("uid-{ns}-{name}"));
        self
    }
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }
    pub fn on(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }
    pub fn cpu(self, v: &str) -> Self {
        self.request("cpu", v)
    }
    pub fn mem(self, v: &str) -> Self {
        self.request("memory", v)
    }
    pub fn resource(self, name: &str, v: &str) -> Self {
        self.request(name, v)
    }
    /// Adds an init container requesting this cpu (and nothing else).
    pub fn init_cpu(mut self, v: &str, sidecar: bool) -> Self {
        let inits = self.spec().init_containers.get_or_insert_default();
        let n = inits.len();
        inits.push(Container {
            name: format!("init-{n}"),
            restart_policy: sidecar.then(|| "Always".to_string()),
            resources: Some(Requests {
                requests: Some(ResourceList::from_iter([(
                    "cpu".to_string(),
                    Quantity(v.into()),
                )])),
            }),
            ..Default::default()
        });
        self
    }
    pub fn overhead_cpu(mut self, v: &str) -> Self {
        self.spec().overhead = Some(ResourceList::from_iter([(
            "cpu".to_string(),
            Quantity(v.into()),
        )]));
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        put(&mut self.0.metadata.labels, k, v);
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        put(&mut self.0.metadata.annotations, k, v);
        self
    }
    /// Controlled by the `kind` named `name` (owner uid: `uid-<kind>-<name>`).
    pub fn owned_by(mut self, kind: &str, name: &str) -> Self {
        let api_version = match kind {
            "Job" => "batch/v1",
            "ReplicationController" => "v1",
            _ => "apps/v1",
        };
        self.0.metadata.owner_references = Some(vec![OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{kind}-{name}"),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        self
    }
    pub fn owned_by_rs(self, name: &str) -> Self {
        self.owned_by("ReplicaSet", name)
    }
    pub fn owned_by_ds(self, name: &str) -> Self {
        self.owned_by("DaemonSet", name)
    }
    /// `status.startTime`.
    pub fn started_at(mut self, t: jiff::Timestamp) -> Self {
        self.0.status.get_or_insert_default().start_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t));
        self
    }
    pub fn mirror(self) -> Self {
        self.annotation("kubernetes.io/config.mirror", "hash")
    }
    pub fn grace(mut self, seconds: i64) -> Self {
        self.spec().termination_grace_period_seconds = Some(seconds);
        self
    }
    pub fn phase(mut self, phase: &str) -> Self {
        if let Some(s) = self.0.status.as_mut() {
            s.phase = Some(phase.into());
        }
        self
    }
    pub fn not_ready(mut self) -> Self {
        if let Some(c) = self.0.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].status = "False".into();
        }
        self
    }
    pub fn terminating(mut self) -> Self {
        self.0.metadata.deletion_timestamp =
            Some(Time("2026-01-01T00:00:00Z".parse().unwrap_or_default()));
        self
    }
    fn volume(mut self, volume: Volume) -> Self {
        self.spec().volumes.get_or_insert_default().push(volume);
        self
    }
    pub fn empty_dir(self, memory: bool) -> Self {
        self.volume(Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: memory.then(|| "Memory".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
    pub fn host_path(self, path: &str) -> Self {
        self.volume(Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.into(),
                type_: None,
            }),
            ..Default::default()
        })
    }
    pub fn pvc(self, claim: &str) -> Self {
        self.volume(Volume {
            name: claim.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Default::default()
        })
    }
    /// Pending, nominated to `node` by the scheduler (`status.nominatedNodeName`).
    pub fn nominated(mut self, node: &str) -> Self {
        self.spec().node_name = None;
        if let Some(s) = self.0.status.as_mut() {
            s.nominated_node_name = Some(node.into());
            s.phase = Some("Pending".into());
        }
        self.not_ready()
    }
    /// Bound by the scheduler at `at` (its `PodScheduled` condition).
    pub fn scheduled_at(mut self, at: jiff::Timestamp) -> Self {
        if let Some(s) = self.0.status.as_mut() {
            s.conditions.get_or_insert_default().push(PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: Some(Time(at)),
                ..Default::default()
            });
        }
        self
    }
    pub fn build(self) -> CachedPod {
        self.0
    }
}

impl From<PodBuilder> for CachedPod {
    fn from(b: PodBuilder) -> CachedPod {
        b.0
    }
}
