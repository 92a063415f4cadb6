//! Outstanding placement requests, keyed by pod UID: which node each gated or just-released pod
//! was sent to, since when, and until when it may wait.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use jiff::Timestamp;

use super::decision::Decision;
use super::roles::RoleId;

/// Where a request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// The pod is still gated, waiting for its target node.
    Waiting,
    /// The gate was removed with this decision; the pod is not bound yet.
    Released(Decision),
}

/// One pod's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutstandingRequest {
    pub uid: String,
    pub pod_name: String,
    pub role: RoleId,
    /// The history node reserved for it (its entry's `requested` counts it).
    pub target: Option<String>,
    pub requested_at: Timestamp,
    /// Escalation deadline (`None`: never escalates).
    pub deadline: Option<Timestamp>,
    pub state: RequestState,
}

/// All outstanding requests of one history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestTracker {
    by_uid: HashMap<String, OutstandingRequest>,
    /// (role, pod name) whose next request is relaxed at once (a pinned attempt lost a race).
    relax_next: HashSet<(RoleId, String)>,
    /// Targets of requests satisfied on another node: returned to the list once the role has
    /// no outstanding requests left.
    returns: BTreeMap<RoleId, BTreeSet<String>>,
}

impl RequestTracker {
    pub fn get(&self, uid: &str) -> Option<&OutstandingRequest> {
        self.by_uid.get(uid)
    }

    pub fn get_mut(&mut self, uid: &str) -> Option<&mut OutstandingRequest> {
        self.by_uid.get_mut(uid)
    }

    pub fn insert(&mut self, request: OutstandingRequest) {
        self.by_uid.insert(request.uid.clone(), request);
    }

    pub fn remove(&mut self, uid: &str) -> Option<OutstandingRequest> {
        self.by_uid.remove(uid)
    }

    pub fn iter(&self) -> impl Iterator<Item = &OutstandingRequest> {
        self.by_uid.values()
    }

    /// Outstanding requests of a role.
    pub fn count_for_role(&self, role: RoleId) -> usize {
        self.by_uid.values().filter(|r| r.role == role).count()
    }

    /// Requests of a role still waiting behind the gate.
    pub fn waiting_for_role(&self, role: RoleId) -> usize {
        self.by_uid
            .values()
            .filter(|r| r.role == role && r.state == RequestState::Waiting)
            .count()
    }

    pub fn mark_relax_next(&mut self, role: RoleId, pod_name: &str) {
        self.relax_next.insert((role, pod_name.to_string()));
    }

    /// True (once) when the next request of this pod name must be relaxed.
    pub fn take_relax_next(&mut self, role: RoleId, pod_name: &str) -> bool {
        self.relax_next.remove(&(role, pod_name.to_string()))
    }

    pub fn add_return(&mut self, role: RoleId, node: &str) {
        self.returns
            .entry(role)
            .or_default()
            .insert(node.to_string());
    }

    /// The nodes to return to the role's list if it has no outstanding request left.
    pub fn take_returns_if_complete(&mut self, role: RoleId) -> Vec<String> {
        if self.count_for_role(role) > 0 {
            return Vec::new();
        }
        self.returns
            .remove(&role)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }

    /// Forget everything about a role (it was removed from the spec).
    pub fn drop_role(&mut self, role: RoleId) {
        self.by_uid.retain(|_, r| r.role != role);
        self.relax_next.retain(|(r, _)| *r != role);
        self.returns.remove(&role);
    }
}
