//! What placement passes share: client, caches, metrics, Events, leadership, the token key,
//! settings, each PlacementHistory's state, and which PlacementHistories are valid.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ebb_api::conditions::{READY, condition, set_condition};
use ebb_api::nodestate::NodeState;
use ebb_api::placement::PlacementHistory;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};

use super::keys::CurrentKey;
use super::reconcile::PhState;
use super::terminal::TerminalPods;
use crate::metrics::Metrics;
use crate::state::Leadership;
use crate::state::Stores;

/// Settings of placement (flags of `ebb-controller run`).
#[derive(Clone, Debug)]
pub struct PlacementSettings {
    /// Gated pods no valid PlacementHistory governs are released after this.
    pub grace: Duration,
    /// Status writes per PlacementHistory at most this often.
    pub status_interval: Duration,
    /// Waiting pods are looked at again this often.
    pub retry: Duration,
    /// Tokens minted for pods are valid this long.
    pub token_ttl: Duration,
    /// The token key is replaced this often (the old one stays valid as the previous key).
    pub key_rotation: Duration,
    /// `namespace/name` of the token key Secret.
    pub token_secret: (String, String),
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(10),
            status_interval: Duration::from_secs(10),
            retry: Duration::from_secs(1),
            token_ttl: Duration::from_secs(24 * 3600),
            key_rotation: Duration::from_secs(24 * 3600),
            token_secret: ("ebb-system".into(), "ebb-token-keys".into()),
        }
    }
}

/// An Event to send after a pass.
pub struct Notice {
    reference: ObjectReference,
    warning: bool,
    reason: &'static str,
    note: String,
    /// The object the Event also concerns: repeats are folded into one series per related
    /// object (keeping the first note), so notes naming a node or pod need it set.
    related: Option<ObjectReference>,
}

impl Notice {
    pub fn pod(pod: &Pod, warning: bool, reason: &'static str, note: String) -> Self {
        Self {
            reference: pod.object_ref(&()),
            warning,
            reason,
            note,
            related: None,
        }
    }
    pub fn ph(ph: &PlacementHistory, warning: bool, reason: &'static str, note: String) -> Self {
        Self {
            reference: ph.object_ref(&()),
            warning,
            reason,
            note,
            related: None,
        }
    }
    /// The Event concerns this node too.
    pub fn about_node(mut self, node: &str) -> Self {
        self.related = Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        });
        self
    }
    /// The Event concerns this pod too.
    pub fn about_pod(mut self, namespace: &str, pod: &str) -> Self {
        self.related = Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(pod.into()),
            ..Default::default()
        });
        self
    }
}

pub struct Ctx {
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
    /// Last states of pods seen in a terminal phase.
    pub terminal: Arc<TerminalPods>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ctx {
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
            terminal: Arc::default(),
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
    pub async fn invalid(&self, ph: &PlacementHistory, key: &str, why: String) -> Requeue {
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
            if let Err(e) = super::reconcile::write_status(&self.client, ph, &status).await {
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
        Requeue::requeue(Duration::from_secs(30))
    }

    pub async fn notify(&self, notices: Vec<Notice>) {
        for n in notices {
            let event = Event {
                type_: if n.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: n.reason.into(),
                note: Some(n.note),
                action: "Placement".into(),
                secondary: n.related,
            };
            if let Err(e) = self.recorder.publish(&event, &n.reference).await {
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
