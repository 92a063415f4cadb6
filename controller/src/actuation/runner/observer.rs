//! What a drain does on each Eviction call: steering slots for the pod's replacement (opened
//! before the call, withdrawn if it is not accepted) and the tracker's counts.

use super::*;
use crate::cluster::CachedPod;

pub(super) struct Observer {
    pub(super) objects: std::collections::HashMap<String, Arc<CachedPod>>,
    pub(super) tracker: Tracker,
    pub(super) policy: String,
    pub(super) node: String,
    pub(super) steering: crate::steering::Steering,
    /// Planned destination per pod uid.
    pub(super) destinations: std::collections::BTreeMap<String, String>,
}

impl Observer {
    /// Withdraws the slot `open_slot` opened for `pod`, if no replacement took it.
    fn close_slot(&self, pod: &PodRef) {
        let Some(owner) = self
            .objects
            .get(&pod.uid)
            .and_then(|o| crate::steering::owner_of(o))
        else {
            return;
        };
        self.steering.withdraw(&owner, &pod.key());
    }

    /// The plan put `pod` on a node: its replacement will prefer that node.
    fn open_slot(&self, pod: &PodRef, at: jiff::Timestamp) {
        let (Some(dest), Some(object)) =
            (self.destinations.get(&pod.uid), self.objects.get(&pod.uid))
        else {
            return;
        };
        let Some(owner) = crate::steering::owner_of(object) else {
            return;
        };
        tracing::debug!(pod = %pod.key(), planned = %dest, "replacement will prefer its planned node");
        self.steering.open(
            owner,
            crate::steering::Slot {
                node: dest.clone(),
                policy: self.policy.clone(),
                from: self.node.clone(),
                evicted: pod.key(),
                opened: at,
                trace: ebb_telemetry::TraceParent::current(),
            },
        );
    }
}

impl EvictionObserver for Observer {
    /// The slot opens before the call: the owner's controller may create the replacement
    /// before the API server's answer reaches the drain.
    fn before_call(&self, pod: &PodRef) {
        self.open_slot(pod, jiff::Timestamp::now());
    }

    fn on_call(&self, pod: &PodRef, call: &EvictionCall) {
        let now = jiff::Timestamp::now();
        if !matches!(call, EvictionCall::Accepted) {
            // Not evicted (refused, gone or failed): no replacement follows from this call.
            self.close_slot(pod);
        }
        match call {
            EvictionCall::Blocked => {
                self.tracker
                    .apply(&self.node, DrainEvent::EvictionBlocked, now);
                self.tracker.record_refusal(&self.policy);
            }
            EvictionCall::Accepted => self.tracker.record_eviction(Evicted {
                policy: self.policy.clone(),
                node: self.node.clone(),
                pod: pod.clone(),
                object: self.objects.get(&pod.uid).cloned(),
                at: now,
            }),
            EvictionCall::Gone | EvictionCall::Failed(_) => {}
        }
    }
}
