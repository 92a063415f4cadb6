//! Steering replacements: which planned node a pod being created should prefer, and what became
//! of it. The admission webhook (`crate::admission`) asks [`Steering::admit`]; drains open slots.

pub mod book;
pub mod patch;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ebb_api::names;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};

pub use book::{Assignment, Fallback, Landing, OwnerKey, Slot, SteeringBook, Tally};

/// How long a planned destination waits for its replacement (and a steered replacement for its
/// binding) before it is forgotten.
pub const SLOT_TTL: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// Decides the steering of pods being created. Cheap to clone.
#[derive(Clone, Default)]
pub struct Steering {
    book: Arc<Mutex<SteeringBook>>,
    /// The node cache: whether a planned node can still take pods (set once the caches run).
    nodes: Arc<OnceLock<Store<Node>>>,
    metrics: Option<crate::metrics::Metrics>,
}

/// A landing the pod watch saw, for metrics and traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landed {
    pub policy: String,
    pub pod: String,
    pub planned: String,
    pub actual: String,
    pub landing: Landing,
}

/// The controlling owner of a pod, for the kinds whose pods are replaced when evicted.
pub fn owner_of(pod: &Pod) -> Option<OwnerKey> {
    let o = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    matches!(
        o.kind.as_str(),
        "ReplicaSet" | "StatefulSet" | "Job" | "ReplicationController"
    )
    .then(|| OwnerKey {
        kind: o.kind.clone(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: o.name.clone(),
    })
}

impl Steering {
    /// Steering that checks planned nodes against the shared node cache.
    pub fn new(nodes: Store<Node>) -> Self {
        let s = Self::default();
        s.set_nodes(nodes);
        s
    }

    /// Counts steered replacements and their landings in `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The node cache to check planned nodes against (the first one given is kept).
    pub fn set_nodes(&self, nodes: Store<Node>) {
        let _ = self.nodes.set(nodes);
    }

    fn count(&self, policy: &str, outcome: crate::metrics::ReplacementOutcome, reason: &str) {
        if let Some(m) = &self.metrics {
            m.replacement(policy, outcome, reason);
        }
    }

    fn book(&self) -> MutexGuard<'_, SteeringBook> {
        // Plain data: a panic while holding it leaves nothing half done worth refusing.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why `node` cannot take `pod` now, from the node cache (`None`: it can).
    fn unusable(&self, node: &str, pod: Option<&Pod>) -> Option<Fallback> {
        let cache = self.nodes.get()?;
        let Some(n) = cache.get(&ObjectRef::new(node)) else {
            return Some(Fallback::NodeGone);
        };
        patch::node_refuses(&n, pod).then_some(Fallback::NodeUnavailable)
    }

    /// A drain's eviction of a pod of `owner` was accepted; the plan put it on `slot.node`.
    pub fn open(&self, owner: OwnerKey, slot: Slot) {
        self.book().open(owner, slot);
    }

    /// The eviction of `evicted` (of `owner`) was not accepted: its slot, if still open, goes.
    pub fn withdraw(&self, owner: &OwnerKey, evicted: &str) {
        self.book().withdraw(owner, evicted);
    }

    /// The JSON patch to apply to `pod` as it is created, or `None` to leave it unchanged: a
    /// replacement of an owner with planned destinations prefers the next one that can take it.
    /// Fast (no API calls): it reads the book and the node cache.
    pub fn admit(&self, pod: &Pod) -> Option<json_patch::Patch> {
        let owner = owner_of(pod)?;
        if patch::gated_by_placement(pod) {
            // A PlacementHistory places this pod (warm data first); never both.
            return None;
        }
        let now = jiff::Timestamp::now();
        let assignment = {
            let mut book = self.book();
            if !book.has_open(&owner) {
                return None;
            }
            book.assign(&owner, now, &|n| self.unusable(n, Some(pod)))?
        };
        match assignment {
            Assignment::Steer { node, policy } => {
                tracing::debug!(%policy, owner = %owner.name, %node, "replacement steered");
                self.count(&policy, crate::metrics::ReplacementOutcome::steered, "");
                Some(patch::prefer_node(pod, &node))
            }
            Assignment::FellBack { policy, reason } => {
                tracing::info!(%policy, owner = %owner.name, reason = reason.as_str(), "replacement not steered");
                self.count(
                    &policy,
                    crate::metrics::ReplacementOutcome::fell_back,
                    reason.as_str(),
                );
                None
            }
        }
    }

    /// The pod watch saw `pod`: a steered replacement now bound is counted on plan or not,
    /// and traced under the drain that evicted the pod it replaces.
    pub fn observe(&self, pod: &Pod) -> Option<Landed> {
        let planned = pod
            .metadata
            .annotations
            .as_ref()?
            .get(names::ANNOTATION_PLANNED_NODE)?;
        let actual = pod.spec.as_ref()?.node_name.as_deref()?;
        let owner = owner_of(pod)?;
        let (slot, landing) = self
            .book()
            .landed(&owner, planned, actual, &|n| self.unusable(n, None))?;
        let landed = Landed {
            policy: slot.policy.clone(),
            pod: format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
            planned: planned.clone(),
            actual: actual.to_string(),
            landing: landing.clone(),
        };
        let reason = match &landing {
            Landing::OnPlan => {
                self.count(
                    &slot.policy,
                    crate::metrics::ReplacementOutcome::on_plan,
                    "",
                );
                ""
            }
            Landing::Elsewhere(r) => {
                self.count(
                    &slot.policy,
                    crate::metrics::ReplacementOutcome::fell_back,
                    r.as_str(),
                );
                r.as_str()
            }
        };
        let span = tracing::info_span!(
            "replacement",
            policy = %slot.policy,
            node = %slot.from,
            evicted = %slot.evicted,
            pod = %landed.pod,
            planned = %landed.planned,
            actual = %landed.actual,
            on_plan = landing == Landing::OnPlan,
            reason,
        );
        slot.trace.adopt(&span);
        span.in_scope(|| tracing::info!("replacement bound"));
        Some(landed)
    }

    /// Forgets slots older than [`SLOT_TTL`].
    pub fn expire(&self, now: jiff::Timestamp) {
        self.book().expire(now, SLOT_TTL);
    }

    /// The counts of `policy`'s replacements, and its slots still waiting.
    pub fn tally(&self, policy: &str) -> (Tally, usize) {
        let book = self.book();
        (book.tally(policy), book.open_count(policy))
    }
}
