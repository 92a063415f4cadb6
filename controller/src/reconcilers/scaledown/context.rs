//! What every reconcile shares: the client, the caches, the actuator, metrics, the event
//! recorder, leadership, and per-policy memory (planner state, last status, last facts).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use ebb_api::{ScaleDownPolicy, ScaleDownPolicyStatus};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;

use super::events::Facts;
use super::permissions::NodeDeletion;
use crate::actuation::Actuator;
use crate::metrics::Metrics;
use crate::scaledown::PlannerState;
use crate::state::{Leadership, Stores};

/// What the controller remembers of one policy between loops.
#[derive(Default)]
pub struct PolicyMemory {
    pub planner: PlannerState,
    /// The status last written (to skip writes that change nothing).
    pub last_written: Option<ScaleDownPolicyStatus>,
    /// The facts Events were last derived from.
    pub facts: Facts,
    /// Nodes removed since the policy was created (seeded from its status).
    pub removed_total: Option<i64>,
    /// Evictions a PodDisruptionBudget refused since the policy was created (seeded likewise).
    pub refused_total: Option<i64>,
    /// Cancels this policy's drains (policy deleted or switched to DryRun); a child of the
    /// controller's shutdown token, created on first use.
    pub cancel: Option<CancellationToken>,
    /// Since when drains have waited for candidates' soft taints (see `act::SoftTaintWait`).
    pub soft_taint_wait: crate::actuation::taints::SoftTaintWait,
}

/// Shared by every reconcile.
pub struct Context {
    pub client: kube::Client,
    pub stores: Stores,
    pub policies: Store<ScaleDownPolicy>,
    pub actuator: Actuator,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub leadership: Leadership,
    /// Cancelled when the controller stops; every policy's token is a child of it.
    pub shutdown: CancellationToken,
    /// Whether the service account may delete Nodes (for `DrainAndDelete`).
    pub node_deletion: NodeDeletion,
    /// Where replacements are steered (the one the admission webhook asks).
    pub steering: crate::steering::Steering,
    /// Whether the steering webhook is in place (or why not).
    pub steering_availability: tokio::sync::watch::Receiver<crate::admission::SteeringAvailability>,
    memory: Mutex<HashMap<String, PolicyMemory>>,
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        stores: Stores,
        policies: Store<ScaleDownPolicy>,
        actuator: Actuator,
        metrics: Metrics,
        recorder: Recorder,
        leadership: Leadership,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            client,
            stores,
            policies,
            actuator,
            metrics,
            recorder,
            leadership,
            shutdown,
            node_deletion: NodeDeletion::default(),
            steering: Default::default(),
            steering_availability: tokio::sync::watch::channel(
                crate::admission::SteeringAvailability::Disabled {
                    reason: "not started".into(),
                },
            )
            .1,
            memory: Mutex::default(),
        }
    }

    /// Replacements are steered by `steering`, whose webhook reports `availability`.
    pub fn with_steering(
        mut self,
        steering: crate::steering::Steering,
        availability: tokio::sync::watch::Receiver<crate::admission::SteeringAvailability>,
    ) -> Self {
        self.steering = steering;
        self.steering_availability = availability;
        self
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, PolicyMemory>> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a policy's memory out for one loop (put it back with [`Context::put_memory`]).
    pub fn take_memory(&self, policy: &str) -> PolicyMemory {
        let mut m = self.lock().remove(policy).unwrap_or_default();
        self.live_token(&mut m);
        m
    }

    pub fn put_memory(&self, policy: &str, memory: PolicyMemory) {
        self.lock().insert(policy.to_string(), memory);
    }

    /// Forget a policy (deleted), cancelling its drains.
    pub fn forget(&self, policy: &str) {
        if let Some(m) = self.lock().remove(policy)
            && let Some(c) = &m.cancel
        {
            c.cancel();
        }
    }

    /// The cancel token of a policy's drains, creating its memory if needed.
    pub fn cancel_token(&self, policy: &str) -> CancellationToken {
        let mut all = self.lock();
        let m = all.entry(policy.to_string()).or_default();
        self.live_token(m)
    }

    /// The policy's live cancel token (a fresh child of the shutdown token when none is live).
    pub fn live_token(&self, m: &mut PolicyMemory) -> CancellationToken {
        match &m.cancel {
            Some(c) if !c.is_cancelled() => c.clone(),
            _ => {
                let c = self.shutdown.child_token();
                m.cancel = Some(c.clone());
                c
            }
        }
    }
}
