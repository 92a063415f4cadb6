//! The facts about a live pod on this node that the agent records: per container, whether it
//! waits, runs or terminated. `LivePod::from_pod` is the only place that reads a Kubernetes Pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::store::UnixMillis;

/// What the pod status says about one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveContainer {
    /// Not started yet (image pull, init containers, scheduling gates).
    Waiting,
    Running {
        started_at: UnixMillis,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: String,
        started_at: Option<UnixMillis>,
        finished_at: UnixMillis,
    },
}

/// A pod bound to this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivePod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `image` per container name of the spec.
    pub images: BTreeMap<String, String>,
    pub containers: BTreeMap<String, LiveContainer>,
    pub restart_counts: BTreeMap<String, u32>,
    pub labels: BTreeMap<String, String>,
    /// The pod is being deleted.
    pub deleting: bool,
    /// Phase `Succeeded` or `Failed`: no container will run again.
    pub terminal: bool,
    /// The pod's node-local API token annotation, if any.
    pub token: Option<String>,
    /// The pod has a `DisruptionTarget` condition (eviction, preemption).
    pub disrupted: bool,
}

fn millis(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> UnixMillis {
    t.0.as_millisecond()
}

fn live_container(status: &ContainerStatus, now: UnixMillis) -> LiveContainer {
    let Some(state) = &status.state else {
        return LiveContainer::Waiting;
    };
    if let Some(t) = &state.terminated {
        return LiveContainer::Terminated {
            exit_code: t.exit_code,
            reason: t.reason.clone().unwrap_or_default(),
            message: t.message.clone().unwrap_or_default(),
            started_at: t.started_at.as_ref().map(millis),
            finished_at: t.finished_at.as_ref().map(millis).unwrap_or(now),
        };
    }
    if let Some(r) = &state.running {
        return LiveContainer::Running {
            started_at: r.started_at.as_ref().map(millis).unwrap_or(now),
        };
    }
    LiveContainer::Waiting
}

impl LivePod {
    /// Reads a pod; `None` when it lacks the identity the store keys on (uid, namespace, name).
    pub fn from_pod(pod: &Pod, now: UnixMillis) -> Option<LivePod> {
        let meta = &pod.metadata;
        let uid = meta.uid.clone()?;
        let namespace = meta.namespace.clone()?;
        let name = meta.name.clone()?;
        let images = pod
            .spec
            .as_ref()
            .map(|s| {
                s.containers
                    .iter()
                    .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let status = pod.status.as_ref();
        let statuses = status
            .and_then(|s| s.container_statuses.as_ref())
            .map(|v| v.as_slice())
            .unwrap_or(&[]);
        let containers = statuses
            .iter()
            .map(|c| (c.name.clone(), live_container(c, now)))
            .collect();
        let restart_counts = statuses
            .iter()
            .map(|c| (c.name.clone(), c.restart_count.max(0) as u32))
            .collect();
        let disrupted = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            });
        Some(LivePod {
            uid,
            namespace,
            name,
            images,
            containers,
            restart_counts,
            labels: meta.labels.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            terminal: status
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed"),
            token: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ebb_api::names::ANNOTATION_TOKEN))
                .cloned(),
            disrupted,
        })
    }
}

#[cfg(test)]
pub mod build {
    //! Test builders: `pod("web-1").uid("u1").running("main", 10)`.
    use super::*;

    pub fn pod(name: &str) -> LivePod {
        LivePod {
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            images: BTreeMap::new(),
            containers: BTreeMap::new(),
            restart_counts: BTreeMap::new(),
            labels: BTreeMap::new(),
            deleting: false,
            terminal: false,
            token: None,
            disrupted: false,
        }
    }

    impl LivePod {
        pub fn waiting(mut self, c: &str) -> Self {
            self.images.insert(c.into(), "img".into());
            self.containers.insert(c.into(), LiveContainer::Waiting);
            self
        }
        pub fn running(mut self, c: &str, started_at: UnixMillis) -> Self {
            self.images.insert(c.into(), "img".into());
            self.containers
                .insert(c.into(), LiveContainer::Running { started_at });
            self
        }
        pub fn exited(
            mut self,
            c: &str,
            code: i32,
            reason: &str,
            started: i64,
            finished: i64,
        ) -> Self {
            self.images.insert(c.into(), "img".into());
            self.containers.insert(
                c.into(),
                LiveContainer::Terminated {
                    exit_code: code,
                    reason: reason.into(),
                    message: String::new(),
                    started_at: Some(started),
                    finished_at: finished,
                },
            );
            self
        }
        pub fn label(mut self, k: &str, v: &str) -> Self {
            self.labels.insert(k.into(), v.into());
            self
        }
        pub fn disrupted(mut self) -> Self {
            self.disrupted = true;
            self
        }
        pub fn terminal(mut self) -> Self {
            self.terminal = true;
            self
        }
        pub fn token(mut self, t: &str) -> Self {
            self.token = Some(t.into());
            self
        }
        pub fn deleting(mut self) -> Self {
            self.deleting = true;
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_terminated_running_and_waiting_containers_from_a_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "ns", "uid": "u1",
                         "labels": {"role": "web"}},
            "spec": {"containers": [{"name": "a", "image": "i:a"}, {"name": "b", "image": "i:b"}, {"name": "c"}]},
            "status": {
                "conditions": [{"type": "DisruptionTarget", "status": "True"}],
                "containerStatuses": [
                {"name": "a", "image": "i:a", "imageID": "", "ready": false, "restartCount": 2,
                 "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                           "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:05Z"}}},
                {"name": "b", "image": "i:b", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}},
                {"name": "c", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}
            ]}
        }))
        .unwrap();
        let live = LivePod::from_pod(&pod, 0).unwrap();
        let t0 = 1_767_225_600_000;
        assert_eq!(
            live.containers["a"],
            LiveContainer::Terminated {
                exit_code: 137,
                reason: "OOMKilled".into(),
                message: String::new(),
                started_at: Some(t0),
                finished_at: t0 + 5_000,
            }
        );
        assert_eq!(
            live.containers["b"],
            LiveContainer::Running {
                started_at: t0 + 1_000
            }
        );
        assert_eq!(live.containers["c"], LiveContainer::Waiting);
        assert_eq!(live.restart_counts["a"], 2);
        assert_eq!(live.images["b"], "i:b");
        assert!(live.disrupted);
        assert!(!live.deleting);
        assert_eq!(live.labels["role"], "web");

        let mut nameless = pod.clone();
        nameless.metadata.uid = None;
        assert_eq!(LivePod::from_pod(&nameless, 0), None);
    }
}
