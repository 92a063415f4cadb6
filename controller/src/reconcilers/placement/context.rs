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
    /// When this process first saw each gated pod (by UID): grace and gate wait are measured
    /// on this clock, not against creation timestamps written by another clock.
    first_seen: Mutex<HashMap<String, Instant>>,
    /// Last states of pods seen ended or deleted (the caches' own).
    pub ended: Arc<EndedPods>,
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
            first_seen: Mutex::default(),
            ended,
        }
    }

    /// How long this process has seen the gated pod `uid`.
    pub fn gated_for(&self, uid: &str) -> Duration {
        lock(&self.first_seen)
            .entry(uid.to_string())
            .or_insert_with(Instant::now)
            .elapsed()
    }

    /// The pod left its gate: stop timing it; returns how long it was seen gated.
    pub fn ungated(&self, uid: &str) -> Option<Duration> {
        lock(&self.first_seen).remove(uid).map(|t| t.elapsed())
    }

    /// Forget timings and releases of pods no longer gated (`gated`: UIDs gated now).
    pub fn retain_gated(&self, gated: &HashSet<String>) {
        lock(&self.first_seen).retain(|uid, _| gated.contains(uid));
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
