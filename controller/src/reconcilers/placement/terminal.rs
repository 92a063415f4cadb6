//! Keeps the last state of pods that reached a terminal phase (a watch with a field selector
//! on `status.phase`), so an end is classified by its exit even when the pod is gone by the
//! time a placement pass runs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

/// Terminal pods are forgotten this long after they were seen (whoever needed them has run).
const KEEP: Duration = Duration::from_secs(600);

/// Terminal pods by UID.
#[derive(Default)]
pub struct TerminalPods(Mutex<HashMap<String, (Instant, Pod)>>);

impl TerminalPods {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Pod)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn record(&self, pod: Pod) {
        let Some(uid) = pod.uid() else { return };
        let mut all = self.lock();
        all.retain(|_, (t, _)| t.elapsed() < KEEP);
        all.insert(uid, (Instant::now(), pod));
    }

    /// The pod's terminal state, if it was seen in one (taken out).
    pub fn take(&self, uid: &str) -> Option<Pod> {
        self.lock().remove(uid).map(|(_, p)| p)
    }
}

/// Watch pods in a terminal phase until the stream ends (the task is aborted at shutdown).
pub async fn watch(client: kube::Client, into: std::sync::Arc<TerminalPods>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default()
        .fields("status.phase!=Pending,status.phase!=Running")
        .any_semantic();
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    while let Some(item) = stream.next().await {
        match item {
            Ok(mut pod) => {
                crate::state::trim::Trim::trim(&mut pod);
                into.record(pod);
            }
            Err(e) => tracing::warn!(error = %e, "terminal pod watch failed; retrying"),
        }
    }
}
