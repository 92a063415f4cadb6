//! Steering replacements: which planned node a pod being created should prefer, and what became
//! of it. The admission webhook (`crate::admission`) asks [`Steering::admit`]; drains open slots.

pub mod book;
pub mod patch;
pub mod reach;
mod ticket;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::cluster::CachedPod;
use ebb_api::names;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};

pub use book::{
    Assignment, Claim, Fallback, HOLD_TTL, Landing, OwnerKey, PodKey, Slot, SteeringBook, Swept,
    Tally,
};

use crate::state::shared_model::SharedModel;

/// How long a planned destination waits for its replacement (and a steered replacement for its
/// binding) before it is forgotten.
pub const SLOT_TTL: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// Decides the steering of pods being created. Cheap to clone.
#[derive(Clone, Default)]
pub struct Steering {
    book: Arc<Mutex<SteeringBook>>,
    /// The node cache: whether a planned node can still take pods (set once the caches run).
    nodes: Arc<OnceLock<Store<Node>>>,
    /// The shared model, told which pending pods ebb steered (set once the caches run).
    model: Arc<OnceLock<Arc<SharedModel>>>,
    metrics: Option<crate::metrics::Metrics>,
    /// Whether the API server really calls the webhook.
    reach: Arc<Mutex<reach::Reach>>,
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
pub fn owner_of(pod: &CachedPod) -> Option<OwnerKey> {
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

    /// The model in which steered pods still pending count on their planned node (the first
    /// one given is kept).
    pub fn set_model(&self, model: Arc<SharedModel>) {
        let _ = self.model.set(model);
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
    fn unusable(&self, node: &str, pod: Option<&CachedPod>) -> Option<Fallback> {
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
    /// replacement of an owner with planned destinations prefers the next one that can take it,
    /// and carries a fresh ticket that ties the destination to it once the pod watch sees it.
    /// A dry run changes nothing and gets no patch. Fast (no API calls): it reads the book and
    /// the node cache. Nothing is counted here: a request that is not followed by a pod (a
    /// forged one, or a pod refused later in admission) only holds a destination for a while.
    pub fn admit(&self, pod: &CachedPod, dry_run: bool) -> Option<json_patch::Patch> {
        if dry_run {
            return None;
        }
        let owner = owner_of(pod)?;
        if patch::gated_by_placement(pod) {
            // A PlacementHistory places this pod (warm data first); never both.
            return None;
        }
        let now = jiff::Timestamp::now();
        let ticket = ticket::new()?;
        let assignment = {
            let mut book = self.book();
            if !book.has_waiting(&owner) {
                return None;
            }
            self.reach().admitted(&owner, now);
            book.hold(&owner, &ticket, now, &|n| self.unusable(n, Some(pod)))?
        };
        match assignment {
            Assignment::Steer { node, policy } => {
                tracing::debug!(%policy, owner = %owner.name, %node, "replacement steered");
                Some(patch::prefer_node(pod, &node, &ticket))
            }
            Assignment::FellBack { policy, reason } => {
                tracing::info!(%policy, owner = %owner.name, reason = reason.as_str(), "replacement not steered");
                None
            }
        }
    }

    /// The pod watch saw `pod` applied: a replacement carrying a ticket this book handed out
    /// claims its destination (counted as steered once), counts on its planned node in the
    /// model while it waits unbound and ungated, and once bound is counted on plan or not and
    /// traced under the drain that evicted the pod it replaces.
    pub fn observe(&self, pod: &CachedPod) -> Option<Landed> {
        let key = pod_key(pod);
        let Some(ticket) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::ANNOTATION_STEERING_TICKET))
        else {
            self.unvouch(&key);
            self.judge_reach(pod, &key);
            return None;
        };
        let owner = owner_of(pod)?;
        let now = jiff::Timestamp::now();
        let claim = self.book().claim(ticket, &key, &owner, now);
        let Some(claim) = claim else {
            // A ticket this book did not hand out to this pod: never counted anywhere.
            self.unvouch(&key);
            return None;
        };
        if claim.new {
            self.reach().steered();
            self.count(
                &claim.policy,
                crate::metrics::ReplacementOutcome::steered,
                "",
            );
        }
        let actual = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        let Some(actual) = actual else {
            let waiting = pod.metadata.deletion_timestamp.is_none()
                && !patch::gated(pod)
                && !matches!(
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                );
            if waiting {
                self.vouch(&key, &claim.node);
            } else {
                self.unvouch(&key);
            }
            return None;
        };
        self.unvouch(&key);
        let (slot, landing) = self
            .book()
            .landed(&key, ticket, actual, &|n| self.unusable(n, None))?;
        Some(self.report_landing(&key, slot, actual, landing))
    }

    /// The pod watch saw `pod` deleted: a slot it held is forgotten.
    pub fn observe_deleted(&self, pod: &CachedPod) {
        let key = pod_key(pod);
        self.book().deleted(&key);
        self.unvouch(&key);
    }

    fn reach(&self) -> MutexGuard<'_, reach::Reach> {
        self.reach.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pod without a ticket: when it is a fresh replacement of an owner with planned
    /// destinations waiting, whether the webhook was called for it.
    fn judge_reach(&self, pod: &CachedPod, key: &PodKey) {
        let Some(created) = pod.metadata.creation_timestamp.as_ref().map(|t| t.0) else {
            return;
        };
        let now = jiff::Timestamp::now();
        if now.duration_since(created) > jiff::SignedDuration::from_secs(60) || patch::gated(pod) {
            return;
        }
        let Some(owner) = owner_of(pod) else {
            return;
        };
        if !self.book().has_waiting(&owner) {
            return;
        }
        self.reach().unticketed(key, &owner, created, now);
    }

    /// Why steering is off in fact although registered: the API server did not call the
    /// webhook for the last replacements created (`None`: it did, or none was created).
    pub fn unreached(&self) -> Option<String> {
        self.reach().unreached()
    }

    fn vouch(&self, key: &PodKey, node: &str) {
        if let Some(m) = self.model.get() {
            m.steered_pending(&key.0, &key.1, Some(node));
        }
    }

    fn unvouch(&self, key: &PodKey) {
        if let Some(m) = self.model.get() {
            m.steered_pending(&key.0, &key.1, None);
        }
    }

    fn report_landing(&self, key: &PodKey, slot: Slot, actual: &str, landing: Landing) -> Landed {
        let landed = Landed {
            policy: slot.policy.clone(),
            pod: format!("{}/{}", key.0, key.1),
            planned: slot.node.clone(),
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
        landed
    }

    /// The sweep of [`SteeringBook::expire`] with [`SLOT_TTL`]: destinations whose pod never
    /// appeared are offered again, unusable and old ones dropped, forgotten pods no longer
    /// counted in the model.
    pub fn expire(&self, now: jiff::Timestamp) {
        let swept = self
            .book()
            .expire(now, SLOT_TTL, &|n| self.unusable(n, None));
        for key in &swept.forgotten {
            self.unvouch(key);
        }
        for policy in &swept.not_created {
            self.count(policy, crate::metrics::ReplacementOutcome::not_created, "");
        }
        for (policy, reason) in &swept.dropped {
            self.count(
                policy,
                crate::metrics::ReplacementOutcome::fell_back,
                reason.as_str(),
            );
        }
    }

    /// The counts of `policy`'s replacements, and its slots still waiting.
    pub fn tally(&self, policy: &str) -> (Tally, usize) {
        let book = self.book();
        (book.tally(policy), book.open_count(policy))
    }
}

/// A pod's key as the model reads it (namespace "default" when unset).
fn pod_key(pod: &CachedPod) -> PodKey {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}
