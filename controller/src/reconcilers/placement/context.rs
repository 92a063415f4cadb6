//! What placement passes share: client, caches, metrics, Events, leadership, the token key,
//! settings, each PlacementHistory's state, and which PlacementHistories are valid.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ebb_api::conditions::{READY, condition, set_condition};
use ebb_api::nodestate::NodeState;
use ebb_api::placement::PlacementHistory;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use super::events::Notice;
use super::keys::CurrentKey;
use super::settings::PlacementSettings;
use super::state::PhState;
use super::status::write_status;
use crate::metrics::Metrics;
use crate::state::Leadership;
use crate::state::Stores;
use crate::state::ended_pods::EndedPods;

/// The state placement passes and the ungoverned sweep share.
pub struct Context {
    pub client: kube::Client,
    pub stores: Stores,
    pub histories: Store<PlacementHistory>,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub leadership: Leadership,
    pub keys: CurrentKey,
    pub settings: PlacementSettings,
    /// The node agents' NodeStates (empty when no agent runs).
    pub node_states: Store<NodeState>,
    states: Mutex<HashMap<String, PhState>>,
    /// `namespace/name` of PlacementHistories that could not be used, with why.
    invalid: Mutex<HashMap<String, String>>,
    /// Pods already released by the ungoverned sweep.
    pub released: Mutex<HashSet<String>>,
    /// When this process first saw each gated pod.
    first_seen: GateClock,
    /// Last states of pods seen ended or deleted (the caches' own).
    pub ended: Arc<EndedPods>,
}

/// When this process first saw each gated pod (by UID): grace and gate wait are measured on
/// this clock, not against creation timestamps written by another clock.
#[derive(Default)]
struct GateClock(Mutex<HashMap<String, Instant>>);

impl GateClock {
    /// How long `uid` has been seen gated (from now on when it is new).
    fn seen(&self, uid: &str) -> Duration {
        lock(&self.0)
            .entry(uid.to_string())
            .or_insert_with(Instant::now)
            .elapsed()
    }

    /// `uid` was released: forget it and return how long it waited. The release's own watch
    /// event can reach a sweep (which forgets pods no longer gated) before the patch's answer
    /// reaches the releaser: then `before`, the wait measured just before the release.
    fn released(&self, uid: &str, before: Duration) -> Duration {
        lock(&self.0)
            .remove(uid)
            .map_or(before, |t| t.elapsed().max(before))
    }

    /// Forget pods no longer gated.
    fn retain(&self, gated: &HashSet<String>) {
        lock(&self.0).retain(|uid, _| gated.contains(uid));
    }
}

/// An invalid PlacementHistory is looked at again this often.
const INVALID_REQUEUE: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        stores: Stores,
        histories: Store<PlacementHistory>,
        metrics: Metrics,
        recorder: Recorder,
        leadership: Leadership,
        keys: CurrentKey,
        settings: PlacementSettings,
        node_states: Store<NodeState>,
    ) -> Self {
        let ended = stores.ended.clone();
        Self {
            client,
            stores,
            histories,
            metrics,
            recorder,
            leadership,
            keys,
            settings,
            node_states,
            states: Mutex::default(),
            invalid: Mutex::default(),
            released: Mutex::default(),
            first_seen: GateClock::default(),
            ended,
        }
    }

    /// How long this process has seen the gated pod `uid`.
    pub fn gated_for(&self, uid: &str) -> Duration {
        self.first_seen.seen(uid)
    }

    /// The pod left its gate: stop timing it; returns how long it was seen gated (`before`,
    /// measured before the release, when a sweep already forgot it).
    pub fn ungated(&self, uid: &str, before: Duration) -> Duration {
        self.first_seen.released(uid, before)
    }

    /// The pod is gone: stop timing it.
    pub fn gone(&self, uid: &str) {
        self.first_seen.released(uid, Duration::ZERO);
    }

    /// Forget timings and releases of pods no longer gated (`gated`: UIDs gated now).
    pub fn retain_gated(&self, gated: &HashSet<String>) {
        self.first_seen.retain(gated);
        lock(&self.released).retain(|uid| gated.contains(uid));
    }

    pub fn take_state(&self, key: &str) -> Option<PhState> {
        lock(&self.states).remove(key)
    }

    pub fn put_state(&self, key: &str, state: PhState) {
        lock(&self.states).insert(key.to_string(), state);
    }

    pub fn forget(&self, key: &str) {
        lock(&self.states).remove(key);
        lock(&self.invalid).remove(key);
    }

    pub fn set_valid(&self, key: &str) {
        lock(&self.invalid).remove(key);
    }

    /// Whether the PlacementHistory `namespace/name` can govern pods.
    pub fn is_valid(&self, key: &str) -> bool {
        !lock(&self.invalid).contains_key(key)
    }

    /// The PlacementHistory cannot be used: its gated pods are released by the ungoverned
    /// sweep. A warning Event when the reason is new.
    pub async fn invalid(&self, ph: &PlacementHistory, key: &str, why: String) -> Action {
        let fresh = lock(&self.invalid).insert(key.to_string(), why.clone()) != Some(why.clone());
        lock(&self.states).remove(key);
        if fresh {
            let mut status = ph.status.clone().unwrap_or_default();
            set_condition(
                &mut status.conditions,
                condition(
                    READY,
                    false,
                    "InvalidSpec",
                    why.clone(),
                    ph.metadata.generation,
                    jiff::Timestamp::now(),
                ),
            );
            if let Err(e) = write_status(&self.client, ph, &status).await {
                tracing::warn!(ph = %key, error = %e, "could not write the status");
            }
            tracing::warn!(ph = %key, %why, "PlacementHistory is invalid; its gated pods are released unchanged");
            self.notify(vec![Notice::ph(
                ph,
                true,
                "InvalidPlacementHistory",
                format!("{why}; gated pods it selects are released without placement"),
            )])
            .await;
        }
        Action::requeue(INVALID_REQUEUE)
    }

    /// Publish the Events of a pass (a failure is logged).
    pub async fn notify(&self, notices: Vec<Notice>) {
        for n in notices {
            if let Err(e) = self.recorder.publish(&n.event(), &n.reference).await {
                tracing::warn!(reason = n.reason, error = %e, "could not publish an Event");
            }
        }
    }

    /// The PlacementHistories (valid ones) in `namespace`.
    pub fn valid_in(&self, namespace: &str) -> Vec<Arc<PlacementHistory>> {
        self.histories
            .state()
            .into_iter()
            .filter(|ph| ph.namespace().as_deref() == Some(namespace))
            .filter(|ph| {
                self.is_valid(&format!("{namespace}/{}", ph.name_any()))
                    && ph.metadata.deletion_timestamp.is_none()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_forgotten_by_a_sweep_still_counts_its_wait() {
        let clock = GateClock::default();
        clock.seen("a");
        let before = clock.seen("a") + Duration::from_secs(3);
        // The sweep saw the pod's ungated copy before the releaser saw the patch's answer.
        clock.retain(&HashSet::new());
        assert_eq!(clock.released("a", before), before);
    }

    #[test]
    fn a_released_pod_is_timed_from_its_first_sight_and_forgotten() {
        let clock = GateClock::default();
        clock.seen("a");
        std::thread::sleep(Duration::from_millis(20));
        let waited = clock.released("a", Duration::ZERO);
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        // Forgotten: seen again, it is timed afresh.
        assert!(clock.seen("a") < Duration::from_millis(20));
    }
}
