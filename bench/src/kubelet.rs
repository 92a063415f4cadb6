//! The kubelet of one namespace's pods, played by the scale bench while kwok is stopped: a bound
//! pod is made Running and Ready after a short delay, a terminating one deleted once its grace
//! period is over. Watched from the current version (never a replay of every pod from 0).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use serde_json::{Value, json};

/// What the kubelet does next with a pod.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Bound and not started: write it Running and Ready.
    Start,
    /// Terminating: delete it (grace 0) after this long (its deletionTimestamp and 1 s, as
    /// `cluster.sh`'s kwok stage does: a kubelet whose containers use their whole grace period).
    Remove(Duration),
}

/// What to do with `pod` at `now`, if anything.
pub fn action(pod: &Pod, now: jiff::Timestamp) -> Option<Action> {
    if let Some(at) = pod.metadata.deletion_timestamp.as_ref() {
        let due = at.0 + jiff::SignedDuration::from_secs(1);
        let wait = now.duration_until(due);
        return Some(Action::Remove(
            Duration::try_from(wait).unwrap_or(Duration::ZERO),
        ));
    }
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    (bound && !(running && ready)).then_some(Action::Start)
}

/// The status a started pod reports: Running, Ready, its one container started, `ip` its IP.
pub fn started_status(pod: &Pod, ip: &str, now: jiff::Timestamp) -> Value {
    let containers: Vec<(&str, &str)> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c.name.as_str(), c.image.as_deref().unwrap_or_default()))
        .collect();
    running_status(ip, &containers, now)
}

/// The status of a Running, Ready pod at `ip` whose `(name, image)` containers all started at
/// `now` (also what the bench writes of the pods it sets up).
pub fn running_status(ip: &str, containers: &[(&str, &str)], now: jiff::Timestamp) -> Value {
    let now = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let containers: Vec<Value> = containers
        .iter()
        .map(|(name, image)| {
            json!({"name": name, "image": image, "imageID": "",
                "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": now}}})
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
        "containerStatuses": containers,
    }})
}

/// How the kubelet paces itself: a pod starts `delay` after it is seen bound (kwok's pod stages
/// in `cluster.sh`: 100 ms and up to 500 ms more); `workers` requests at once (kwok's default 4).
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    pub delay: Duration,
    pub workers: usize,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            delay: Duration::from_millis(350),
            workers: 4,
        }
    }
}

/// Plays the kubelet of `namespace`'s pods until dropped (abort the task it runs in). Requests
/// that fail are left: the pod's next event (or the watch's next list) brings it back.
pub async fn run(client: kube::Client, namespace: &str, pacing: Pacing) {
    let api = Api::<Pod>::namespaced(client, namespace);
    let workers = Arc::new(tokio::sync::Semaphore::new(pacing.workers.max(1)));
    // Pods with an action under way, by uid: one request each, whatever events arrive.
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut next_ip: u32 = 0;
    let mut events = std::pin::pin!(watcher(api.clone(), watcher::Config::default()));
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
            Ok(_) => continue,
            Err(e) => {
                eprintln!("  kubelet watch of {namespace}: {e}");
                continue;
            }
        };
        let Some(act) = action(&pod, jiff::Timestamp::now()) else {
            continue;
        };
        let (Some(uid), Some(name)) = (pod.metadata.uid.clone(), pod.metadata.name.clone()) else {
            continue;
        };
        let Ok(mut b) = busy.lock() else { return };
        if !b.insert(uid.clone()) {
            continue;
        }
        drop(b);
        next_ip = next_ip.wrapping_add(1);
        let ip = format!(
            "10.{}.{}.{}",
            200 + (next_ip >> 16) % 50,
            (next_ip >> 8) & 255,
            next_ip & 255
        );
        let (api, workers, busy) = (api.clone(), workers.clone(), busy.clone());
        tokio::spawn(async move {
            let wait = match &act {
                Action::Start => pacing.delay,
                Action::Remove(d) => *d,
            };
            tokio::time::sleep(wait).await;
            if let Ok(_slot) = workers.acquire().await {
                let res = match act {
                    Action::Start => {
                        let body = started_status(&pod, &ip, jiff::Timestamp::now());
                        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                            .await
                            .map(|_| ())
                    }
                    Action::Remove(_) => {
                        let dp = DeleteParams {
                            grace_period_seconds: Some(0),
                            preconditions: Some(Preconditions {
                                uid: Some(uid.clone()),
                                resource_version: None,
                            }),
                            ..DeleteParams::default()
                        };
                        api.delete(&name, &dp).await.map(|_| ())
                    }
                };
                match res {
                    // Gone already: the pod garbage collector removes the pods of a deleted node.
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => eprintln!("  kubelet: {name}: {e}"),
                    Ok(()) => {}
                }
            }
            if let Ok(mut b) = busy.lock() {
                b.remove(&uid);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    const NOW: &str = "2026-12-07T10:00:00Z";

    fn now() -> jiff::Timestamp {
        NOW.parse().unwrap()
    }

    #[test]
    fn a_bound_pod_not_yet_running_and_ready_is_started() {
        let bound = json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}});
        assert_eq!(action(&pod(bound.clone()), now()), Some(Action::Start));
        let mut running_unready = bound.clone();
        running_unready["status"] = json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}]});
        assert_eq!(action(&pod(running_unready), now()), Some(Action::Start));
        let mut started = bound.clone();
        started["status"] = json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(action(&pod(started), now()), None);
        let pending = json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c"}]}});
        assert_eq!(
            action(&pod(pending), now()),
            None,
            "not bound: the scheduler's"
        );
    }

    #[test]
    fn a_terminating_pod_goes_a_second_after_its_deletion_timestamp() {
        let going = |at: &str| {
            pod(json!({"metadata": {"name": "a", "deletionTimestamp": at},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}))
        };
        assert_eq!(
            action(&going("2026-12-07T10:00:05Z"), now()),
            Some(Action::Remove(Duration::from_secs(6)))
        );
        assert_eq!(
            action(&going("2026-12-07T09:59:00Z"), now()),
            Some(Action::Remove(Duration::ZERO)),
            "overdue: at once"
        );
    }

    #[test]
    fn a_started_pod_reports_each_container_running_and_the_pod_ready() {
        let p = pod(json!({"metadata": {"name": "a"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "fake"}, {"name": "d"}]}}));
        let s = started_status(&p, "10.200.0.1", now());
        assert_eq!(s["status"]["phase"], "Running");
        assert_eq!(s["status"]["podIP"], "10.200.0.1");
        let names: Vec<&str> = s["status"]["containerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["c", "d"]);
        let mut after = p.clone();
        after.status = serde_json::from_value(s["status"].clone()).unwrap();
        assert_eq!(
            action(&after, now()),
            None,
            "once written, nothing more to do"
        );
    }
}
