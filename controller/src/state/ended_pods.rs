//! The last states of pods that ended (a terminal phase) or were deleted, by UID, fed by the
//! pod watch: a placement pass classifies an end by what happened, even between two passes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cluster::CachedPod;
use kube::ResourceExt;

/// Last states are forgotten this long after they were seen (whoever needed them has run).
const KEEP: Duration = Duration::from_secs(600);
/// At most this many are kept (the oldest go first): pods that churn by the thousand cannot
/// grow the controller's memory without bound.
const MAX: usize = 20_000;

/// Last states of ended or deleted pods by UID.
#[derive(Default)]
pub struct EndedPods(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    pods: HashMap<String, (Instant, CachedPod)>,
    records: u64,
}

/// The pod reached `Succeeded` or `Failed` before anyone asked to delete it.
fn ended_on_its_own(pod: &CachedPod) -> bool {
    EndedPods::is_terminal(pod) && pod.metadata.deletion_timestamp.is_none()
}

impl EndedPods {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `pod` as its UID's last state. A later state replaces it, except after an end of
    /// its own: a pod that failed and was then deleted keeps its failure.
    pub fn record(&self, pod: CachedPod) {
        let Some(uid) = pod.uid() else { return };
        let mut kept = self.lock();
        kept.records += 1;
        if kept.pods.len() >= MAX || kept.records.is_multiple_of(1024) {
            kept.pods.retain(|_, (t, _)| t.elapsed() < KEEP);
        }
        if let Some((_, before)) = kept.pods.get(&uid)
            && ended_on_its_own(before)
        {
            return;
        }
        if kept.pods.len() >= MAX && !kept.pods.contains_key(&uid) {
            let oldest = kept
                .pods
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(u, _)| u.clone());
            if let Some(u) = oldest {
                kept.pods.remove(&u);
            }
        }
        kept.pods.insert(uid, (Instant::now(), pod));
    }

    /// The pod is in a terminal phase (`Succeeded`, `Failed`).
    pub fn is_terminal(pod: &CachedPod) -> bool {
        matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    }

    /// The pod's last state, if it was seen ended or deleted (taken out).
    pub fn take(&self, uid: &str) -> Option<CachedPod> {
        self.lock().pods.remove(uid).map(|(_, p)| p)
    }

    pub fn len(&self) -> usize {
        self.lock().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, phase: &str) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": uid},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn deleted(mut p: CachedPod) -> CachedPod {
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        p
    }

    #[test]
    fn the_latest_state_of_a_uid_is_taken_once() {
        let e = EndedPods::default();
        e.record(pod("a", "Running"));
        e.record(deleted(pod("a", "Failed")));
        let got = e.take("a");
        assert!(
            got.as_ref()
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        );
        assert!(e.take("a").is_none());
    }

    #[test]
    fn an_end_of_its_own_is_kept_over_its_deletion() {
        let e = EndedPods::default();
        e.record(pod("a", "Failed"));
        e.record(deleted(pod("a", "Failed")));
        let got = e.take("a");
        assert!(got.is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
    }

    #[test]
    fn the_oldest_go_first_beyond_the_cap() {
        let e = EndedPods::default();
        for i in 0..=MAX {
            e.record(pod(&format!("u{i}"), "Succeeded"));
        }
        assert_eq!(e.len(), MAX);
        assert!(e.take("u0").is_none(), "the oldest went");
        assert!(e.take(&format!("u{MAX}")).is_some());
    }
}
