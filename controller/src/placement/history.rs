//! `RoleHistory`: the per-PlacementHistory state machine. Pod events (placed, bound, running,
//! releasing, terminated, cancelled) go in with a clock; placement decisions come out.

use std::collections::{BTreeMap, HashMap};

use ebb_api::placement::{PlacementHistorySpec, PlacementPolicy};
use jiff::{SignedDuration, Timestamp};

use super::available::AvailableList;
use super::decision::{Action, Decision, Overdue, PlacementReason};
use super::error::HistoryError;
use super::escalation;
use super::failure_window::FailureWindow;
use super::node_map::{NodeEntry, NodeMap};
use super::nodes::NodeFacts;
use super::outcome::{Requeue, Termination, TerminationClass, classify, long_lived};
use super::requests::{OutstandingRequest, RequestState, RequestTracker};
use super::roles::{RoleConfig, RoleId, RoleTable};

/// Most history nodes a relaxed request prefers (one preferred affinity term each).
pub const MAX_PREFERRED_NODES: usize = 10;

/// Cluster-wide settings of a PlacementHistory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Failure counters reset at multiples of this period.
    pub failure_window: SignedDuration,
    /// Idle entries older than this are purged.
    pub retention: SignedDuration,
    /// Pods failing sooner than this after starting are start failures.
    pub short_lived: SignedDuration,
}

impl HistoryConfig {
    pub fn from_spec(spec: &PlacementHistorySpec) -> Result<Self, HistoryError> {
        let config = Self {
            failure_window: spec.failure_window.as_span(),
            retention: spec.retention.as_span(),
            short_lived: spec.short_lived_threshold.as_span(),
        };
        if config.failure_window.is_zero() {
            return Err(HistoryError::ZeroDuration {
                field: "failureWindow",
            });
        }
        if config.retention.is_zero() {
            return Err(HistoryError::ZeroDuration { field: "retention" });
        }
        Ok(config)
    }
}

/// A pod as the history needs it: its UID, its name (the instance: a re-created StatefulSet
/// pod keeps it) and its role (the value of the `roleLabel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRef<'a> {
    pub uid: &'a str,
    pub name: &'a str,
    pub role: &'a str,
}

/// A pod bound to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TrackedPod {
    name: String,
    role: RoleId,
    node: String,
    live: bool,
    releasing: bool,
    running_since: Option<Timestamp>,
}

/// Figures of a role since the controller started (not persisted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleCounters {
    pub pinned: u64,
    pub relaxed: u64,
    pub anywhere: u64,
    /// Requests relaxed at their deadline, and pinned pods deleted past theirs.
    pub escalations: u64,
    /// Pods bound to a node (replays after a restart not counted).
    pub bound: u64,
    /// Pods bound to a node where the role had run before or whose data was cached there.
    pub hits: u64,
    pub terminations: BTreeMap<TerminationClass, u64>,
}

/// What a termination did to the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminationReport {
    pub role: String,
    pub node: String,
    pub class: TerminationClass,
    pub requeue: Requeue,
    /// This failure took the node over the role's threshold: it is now excluded from pinned
    /// placement of the role until the failure window resets.
    pub node_excluded: bool,
}

/// The role history of one PlacementHistory.
#[derive(Clone, Debug)]
pub struct RoleHistory {
    pub(super) config: HistoryConfig,
    pub(super) roles: RoleTable,
    pub(super) nodes: NodeMap,
    pub(super) available: BTreeMap<RoleId, AvailableList>,
    pub(super) requests: RequestTracker,
    pods: HashMap<String, TrackedPod>,
    pub(super) window: FailureWindow,
    pub(super) counters: BTreeMap<RoleId, RoleCounters>,
    pub(super) dirty: bool,
}

impl RoleHistory {
    /// An empty history (bootstrap: nothing persisted yet).
    pub fn new(spec: &PlacementHistorySpec, now: Timestamp) -> Result<Self, HistoryError> {
        let roles = RoleTable::from_spec(spec, &BTreeMap::new())?;
        Self::from_parts(
            HistoryConfig::from_spec(spec)?,
            roles,
            NodeMap::default(),
            now,
        )
    }

    /// A history over a node map (used by rebuild): available lists are built from it.
    pub(crate) fn from_parts(
        config: HistoryConfig,
        roles: RoleTable,
        nodes: NodeMap,
        now: Timestamp,
    ) -> Result<Self, HistoryError> {
        let mut history = Self {
            window: FailureWindow::new(config.failure_window, now)?,
            config,
            roles,
            nodes,
            available: BTreeMap::new(),
            requests: RequestTracker::default(),
            pods: HashMap::new(),
            counters: BTreeMap::new(),
            dirty: false,
        };
        history.rebuild_available();
        Ok(history)
    }

    pub fn config(&self) -> &HistoryConfig {
        &self.config
    }

    pub fn roles(&self) -> &RoleTable {
        &self.roles
    }

    pub fn node_map(&self) -> &NodeMap {
        &self.nodes
    }

    /// The entry of `role` on `node`.
    pub fn entry(&self, node: &str, role: &str) -> Option<&NodeEntry> {
        let id = self.roles.by_name(role)?.id;
        self.nodes.get(node, id)
    }

    /// The role's available-node list, most recently used first.
    pub fn available(&self, role: &str) -> Vec<&str> {
        self.roles
            .by_name(role)
            .and_then(|r| self.available.get(&r.id))
            .map(|l| l.iter().collect())
            .unwrap_or_default()
    }

    /// The outstanding request of a pod.
    pub fn request(&self, uid: &str) -> Option<&OutstandingRequest> {
        self.requests.get(uid)
    }

    pub(crate) fn requests(&self) -> &RequestTracker {
        &self.requests
    }

    /// Figures of a role since the controller started.
    pub fn counters(&self, role: &str) -> RoleCounters {
        self.roles
            .by_name(role)
            .and_then(|r| self.counters.get(&r.id))
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn counters_by_id(&self, role: RoleId) -> RoleCounters {
        self.counters.get(&role).cloned().unwrap_or_default()
    }

    /// When failure counters reset next, seen from `now`.
    pub fn next_failure_reset(&self, now: Timestamp) -> Timestamp {
        let mut window = self.window;
        window.roll(now);
        window.next_reset()
    }

    /// True when persisted state (active, lastUsed) changed since the last save.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Ask for the next status write (the last one failed).
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    pub(crate) fn mark_saved(&mut self) {
        self.dirty = false;
    }

    /// Decide where a gated pod goes. Call it again for a pod that was told to wait: it stays
    /// on its node until the node can take it or the escalation deadline passes (strictly).
    /// A pod already released gets the same decision again.
    pub fn place(
        &mut self,
        pod: PodRef<'_>,
        facts: &NodeFacts,
        fits: &dyn Fn(&str) -> bool,
        now: Timestamp,
    ) -> Result<Decision, HistoryError> {
        self.roll_window(now);
        let role = self.role_of(pod)?.clone();
        if let Some(bound) = self.pods.get(pod.uid) {
            return Err(HistoryError::AlreadyBound {
                pod: pod.name.to_string(),
                node: bound.node.clone(),
            });
        }
        if let Some(request) = self.requests.get(pod.uid).cloned() {
            return Ok(match request.state {
                RequestState::Released(decision) => decision,
                RequestState::Waiting => self.revisit(&role, pod, request, facts, fits, now),
            });
        }
        if self.requests.take_relax_next(role.id, pod.name)
            && role.policy != PlacementPolicy::Strict
        {
            let action = Action::Relax(self.relaxed(&role, facts, true));
            return Ok(self.release_unpinned(
                &role,
                pod,
                now,
                action,
                PlacementReason::PreviousAttemptLostRace,
            ));
        }
        if role.policy == PlacementPolicy::Anywhere {
            let action = Action::Anywhere(self.relaxed(&role, facts, false));
            return Ok(self.release_unpinned(
                &role,
                pod,
                now,
                action,
                PlacementReason::PolicyAnywhere,
            ));
        }
        Ok(self.pick_and_record(&role, pod, facts, fits, now, now))
    }

    /// A pod was bound to `node` (it is starting there). Resolves its request wherever it
    /// landed, and counts a hit when the role had used the node before or `facts` report the
    /// role's resources cached there. Returns false when the pod was already known.
    pub fn on_bound(
        &mut self,
        pod: PodRef<'_>,
        node: &str,
        facts: &NodeFacts,
        now: Timestamp,
    ) -> Result<bool, HistoryError> {
        let warm = facts
            .get(node)
            .is_some_and(|v| v.warm_roles.contains(pod.role));
        self.bind(pod, node, Some(warm), now)
    }

    /// Bind a pod; `count` is `Some(warm)` for a new placement (counted in the figures),
    /// `None` for a replay.
    fn bind(
        &mut self,
        pod: PodRef<'_>,
        node: &str,
        count: Option<bool>,
        now: Timestamp,
    ) -> Result<bool, HistoryError> {
        self.roll_window(now);
        let role = self.role_of(pod)?.id;
        if self.pods.contains_key(pod.uid) {
            return Ok(false);
        }
        let had_history = self
            .nodes
            .get(node, role)
            .is_some_and(|e| e.last_used.is_some());
        self.nodes.get_or_create(node, role).starting += 1;
        if let Some(request) = self.requests.remove(pod.uid)
            && let Some(target) = request.target
        {
            if let Some(e) = self.nodes.get_mut(&target, role) {
                e.requested = e.requested.saturating_sub(1);
            }
            if target != node {
                self.requests.add_return(role, &target);
            }
        }
        if !self.usable(role, node) {
            self.list(role).remove(node);
        }
        self.flush_returns(role);
        if let Some(warm) = count {
            let counters = self.counters.entry(role).or_default();
            counters.bound += 1;
            if had_history || warm {
                counters.hits += 1;
            }
        }
        self.pods.insert(
            pod.uid.to_string(),
            TrackedPod {
                name: pod.name.to_string(),
                role,
                node: node.to_string(),
                live: false,
                releasing: false,
                running_since: None,
            },
        );
        self.dirty = true;
        Ok(true)
    }

    /// A bound pod is running. Returns false for unknown pods or pods already running.
    pub fn on_running(&mut self, uid: &str, now: Timestamp) -> bool {
        let Some(pod) = self.pods.get_mut(uid) else {
            return false;
        };
        if pod.live {
            return false;
        }
        pod.live = true;
        pod.running_since = Some(now);
        if let Some(e) = self.nodes.get_mut(&pod.node, pod.role) {
            e.starting = e.starting.saturating_sub(1);
            e.live += 1;
        }
        true
    }

    /// Re-register a pod found on a node after a restart, so counts match the cluster. Not
    /// counted as a placement.
    pub fn replay_pod(
        &mut self,
        pod: PodRef<'_>,
        node: &str,
        running: bool,
        now: Timestamp,
    ) -> Result<bool, HistoryError> {
        let added = self.bind(pod, node, None, now)?;
        if added && running {
            self.on_running(pod.uid, now);
            if let Some(p) = self.pods.get_mut(pod.uid) {
                // When it really started is unknown; the termination will say.
                p.running_since = None;
            }
        }
        Ok(added)
    }

    /// The pod's owner is deleting it. Returns false for unknown pods or repeated calls.
    pub fn on_releasing(&mut self, uid: &str) -> bool {
        let Some(pod) = self.pods.get_mut(uid) else {
            return false;
        };
        if pod.releasing {
            return false;
        }
        pod.releasing = true;
        if let Some(e) = self.nodes.get_mut(&pod.node, pod.role) {
            e.releasing += 1;
        }
        true
    }

    /// A bound pod ended. Classifies the end, updates counters and the available list.
    /// Returns `None` for pods never seen bound (their request, if any, is cancelled).
    pub fn on_terminated(
        &mut self,
        uid: &str,
        termination: &Termination,
        now: Timestamp,
    ) -> Option<TerminationReport> {
        self.roll_window(now);
        let Some(pod) = self.pods.remove(uid) else {
            self.cancel(uid);
            return None;
        };
        let role = self.roles.get(pod.role)?.clone();
        let class = classify(termination, pod.running_since, self.config.short_lived, now);
        let ran = termination.ran_for(pod.running_since, now);
        let entry = self.nodes.get_or_create(&pod.node, role.id);
        if pod.live {
            entry.live = entry.live.saturating_sub(1);
        } else {
            entry.starting = entry.starting.saturating_sub(1);
        }
        if pod.releasing {
            entry.releasing = entry.releasing.saturating_sub(1);
        }
        let was_over = role.over_threshold(entry.failed_recently);
        if class.is_node_failure() {
            entry.failed += 1;
            entry.failed_recently += 1;
        }
        match class {
            TerminationClass::StartFailure => entry.start_failed += 1,
            TerminationClass::Preempted => entry.preempted += 1,
            _ => {}
        }
        let now_over = role.over_threshold(entry.failed_recently);
        let requeue = if !self.usable(role.id, &pod.node) {
            Requeue::StillBusy
        } else {
            match class {
                TerminationClass::StartFailure => {
                    self.list(role.id).remove(&pod.node);
                    Requeue::Dropped
                }
                TerminationClass::Completed | TerminationClass::DeletedByOwner
                    if !long_lived(ran, self.config.short_lived) =>
                {
                    self.insert_sorted(role.id, &pod.node);
                    Requeue::Sorted
                }
                _ => {
                    if let Some(e) = self.nodes.get_mut(&pod.node, role.id) {
                        e.last_used = Some(now);
                    }
                    self.list(role.id).insert(&pod.node, Some(now));
                    Requeue::Head
                }
            }
        };
        *self
            .counters
            .entry(role.id)
            .or_default()
            .terminations
            .entry(class)
            .or_default() += 1;
        self.dirty = true;
        Some(TerminationReport {
            role: role.name.clone(),
            node: pod.node,
            class,
            requeue,
            node_excluded: role.avoids_failing_nodes() && !was_over && now_over,
        })
    }

    /// A pod that was never bound went away (deleted while gated or pending): drop its
    /// request and give its node back. Returns false when there was no request.
    pub fn cancel(&mut self, uid: &str) -> bool {
        let Some(request) = self.requests.remove(uid) else {
            return false;
        };
        if let Some(target) = request.target {
            if let Some(e) = self.nodes.get_mut(&target, request.role) {
                e.requested = e.requested.saturating_sub(1);
            }
            if self.usable(request.role, &target) {
                self.insert_sorted(request.role, &target);
            }
        }
        self.flush_returns(request.role);
        true
    }

    /// Pinned pods still not bound strictly after their deadline (they lost a race for their
    /// node). The controller deletes them; the next pod of the same name is relaxed at once.
    /// `Strict` roles never escalate.
    pub fn overdue(&mut self, now: Timestamp) -> Vec<Overdue> {
        let due: Vec<OutstandingRequest> = self
            .requests
            .iter()
            .filter(|r| {
                matches!(&r.state, RequestState::Released(d) if d.pinned_node().is_some())
                    && r.deadline.is_some_and(|d| escalation::is_due(d, now))
            })
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(due.len());
        for request in due {
            let Some(role) = self.roles.get(request.role).cloned() else {
                continue;
            };
            if role.policy == PlacementPolicy::Strict {
                continue;
            }
            self.requests.remove(&request.uid);
            let node = request.target.clone().unwrap_or_default();
            if let Some(e) = self.nodes.get_mut(&node, role.id) {
                e.requested = e.requested.saturating_sub(1);
            }
            self.requests.add_return(role.id, &node);
            self.requests.mark_relax_next(role.id, &request.pod_name);
            // Returned once the role's requests are resolved (the replacement pod is one).
            self.counters.entry(role.id).or_default().escalations += 1;
            out.push(Overdue {
                uid: request.uid,
                pod_name: request.pod_name,
                role: role.name.clone(),
                node,
                reason: PlacementReason::PinnedPodStillPending,
            });
        }
        out.sort_by(|a, b| a.uid.cmp(&b.uid));
        out
    }

    /// Forget idle entries not used within `retention` (and without recent failures).
    /// Returns how many entries were purged.
    pub fn purge(&mut self, now: Timestamp) -> usize {
        let cutoff = now
            .saturating_sub(self.config.retention)
            .unwrap_or(Timestamp::MIN);
        let removed = self
            .nodes
            .remove_where(|_, _, e| e.idle() && e.last_used.is_none_or(|u| u < cutoff));
        for (node, role) in &removed {
            self.list(*role).remove(node);
        }
        if !removed.is_empty() {
            self.dirty = true;
            tracing::info!(
                purged = removed.len(),
                nodes = self.nodes.len(),
                "purged placement history entries past retention"
            );
        }
        removed.len()
    }

    /// Apply a changed spec: roles keep their ids, new roles get fresh ones, entries and
    /// requests of removed roles are dropped. Returns the names of the removed roles and how
    /// many entries went with them.
    pub fn update_spec(
        &mut self,
        spec: &PlacementHistorySpec,
        now: Timestamp,
    ) -> Result<(Vec<String>, usize), HistoryError> {
        let config = HistoryConfig::from_spec(spec)?;
        let roles = RoleTable::from_spec(spec, &self.roles.id_map())?;
        let removed: Vec<RoleConfig> = self
            .roles
            .iter()
            .filter(|r| roles.get(r.id).is_none())
            .cloned()
            .collect();
        let dropped = self
            .nodes
            .remove_where(|_, role, _| roles.get(role).is_none())
            .len();
        for role in &removed {
            self.requests.drop_role(role.id);
            self.available.remove(&role.id);
            self.counters.remove(&role.id);
        }
        self.pods.retain(|_, p| roles.get(p.role).is_some());
        if config.failure_window != self.config.failure_window {
            self.window = FailureWindow::new(config.failure_window, now)?;
        }
        self.config = config;
        self.roles = roles;
        if dropped > 0 {
            self.dirty = true;
        }
        Ok((removed.into_iter().map(|r| r.name).collect(), dropped))
    }

    // ---- internals ----

    pub(super) fn role_of(&self, pod: PodRef<'_>) -> Result<&RoleConfig, HistoryError> {
        self.roles
            .by_name(pod.role)
            .ok_or_else(|| HistoryError::UnknownRole {
                pod: pod.name.to_string(),
                role: pod.role.to_string(),
            })
    }

    pub(super) fn list(&mut self, role: RoleId) -> &mut AvailableList {
        self.available.entry(role).or_default()
    }

    /// The node can take a new pod of the role (history-wise).
    pub(super) fn usable(&self, role: RoleId, node: &str) -> bool {
        let anti = self
            .roles
            .get(role)
            .is_some_and(|r| r.policy == PlacementPolicy::AntiAffinity);
        self.nodes
            .get(node, role)
            .is_some_and(|e| e.available() && (!anti || e.active() == 0))
    }

    pub(super) fn insert_sorted(&mut self, role: RoleId, node: &str) {
        let last_used = self.nodes.get(node, role).and_then(|e| e.last_used);
        self.list(role).insert(node, last_used);
    }

    pub(super) fn flush_returns(&mut self, role: RoleId) {
        for node in self.requests.take_returns_if_complete(role) {
            if self.usable(role, &node) {
                self.insert_sorted(role, &node);
            }
        }
    }

    fn rebuild_available(&mut self) {
        let mut lists = BTreeMap::new();
        for role in self.roles.iter() {
            let entries: Vec<(&str, Option<Timestamp>)> = self
                .nodes
                .role_entries(role.id)
                .filter(|(n, _)| self.usable(role.id, n))
                .map(|(n, e)| (n, e.last_used))
                .collect();
            lists.insert(role.id, AvailableList::from_entries(entries));
        }
        self.available = lists;
    }

    fn roll_window(&mut self, now: Timestamp) {
        if self.window.roll(now) {
            let mut reset = 0usize;
            for (_, _, e) in self.nodes.entries_mut() {
                if e.failed_recently > 0 {
                    reset += 1;
                }
                e.failed_recently = 0;
            }
            // Start-failed nodes are trusted again.
            self.rebuild_available();
            tracing::debug!(reset, window_start = %self.window.start(), "failure window reset");
        }
    }

    // ---- used by persistence ----

    /// Number of live (running) pods of a role.
    pub(crate) fn live_of(&self, role: RoleId) -> u32 {
        self.nodes.role_entries(role).map(|(_, e)| e.live).sum()
    }
}
