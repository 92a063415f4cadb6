//! What the planner remembers of a policy between loops (`PlannerState`): the candidate and
//! non-candidate sets, destination hints and recent evictions, as the seed document names them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::cluster::CachedPod;
use ebb_api::reasons::UnremovableReason;
use jiff::Timestamp;

use super::decisions::Plan;
use crate::cluster::ClusterSnapshot;
use crate::cluster::snapshot::NameHasher;

/// One loop's destinations: source node → pod uid → destination node. Looked up and written
/// for every pod a drain simulation moves, so hashed with the model's [`NameHasher`]; the uid
/// and destination are the plan's own strings, shared.
pub(crate) type HintMap = HashMap<String, HashMap<Arc<str>, Arc<str>, NameHasher>, NameHasher>;

/// A pod the actuator evicted, remembered for `recentEvictionWindow`. The cache's own copy,
/// shared: every drain started holds the planner's state, and a wave evicts thousands of pods.
#[derive(Clone, Debug)]
pub struct RecentEviction {
    pub pod: Arc<CachedPod>,
    pub evicted_at: Timestamp,
}

/// A node whose drain simulation failed, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NonCandidate {
    pub at: Timestamp,
    pub reason: UnremovableReason,
}

/// The destination hints of one source node's pods, both generations.
#[derive(Clone, Copy, Debug, Default)]
pub struct SourceHints<'a> {
    current: Option<&'a HashMap<Arc<str>, Arc<str>, NameHasher>>,
    previous: Option<&'a HashMap<Arc<str>, Arc<str>, NameHasher>>,
}

impl<'a> SourceHints<'a> {
    /// Destination remembered for pod `uid`.
    pub fn get(&self, uid: &str) -> Option<&'a str> {
        self.current
            .and_then(|m| m.get(uid))
            .or_else(|| self.previous.and_then(|m| m.get(uid)))
            .map(|to| &**to)
    }
}

/// `pod_destination_hints` in two generations: the last loop's and the one before. Hints not
/// refreshed for two loops are forgotten.
#[derive(Clone, Debug, Default)]
pub struct DestinationHints {
    current: HintMap,
    previous: HintMap,
}

impl DestinationHints {
    /// Destination remembered for pod `uid` of node `source`.
    pub fn get(&self, source: &str, uid: &str) -> Option<&str> {
        self.of(Some(source)).get(uid)
    }

    /// The hints for the pods of node `source` (none without a source), looked up once for
    /// all of its pods.
    pub fn of(&self, source: Option<&str>) -> SourceHints<'_> {
        SourceHints {
            current: source.and_then(|s| self.current.get(s)),
            previous: source.and_then(|s| self.previous.get(s)),
        }
    }

    /// Number of hints in the newest generation.
    pub fn len(&self) -> usize {
        self.current.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Only the hints for pods of the `sources` nodes.
    pub fn only_from<'a>(&self, sources: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = DestinationHints::default();
        for s in sources {
            if let Some(m) = self.current.get(s) {
                out.current.insert(s.to_string(), m.clone());
            }
            if let Some(m) = self.previous.get(s) {
                out.previous.insert(s.to_string(), m.clone());
            }
        }
        out
    }

    pub(super) fn rotate(&mut self, new: HintMap) {
        self.previous = std::mem::replace(&mut self.current, new);
    }
}

/// What the planner remembers of a policy between loops: its candidates and non-candidates,
/// where it put pods, and the pods the actuator evicted ([`PlannerState::record_eviction`]).
/// Which nodes are being deleted is not kept here: each loop reads it from the nodes' taints and
/// the actuator's drains in flight.
#[derive(Clone, Debug, Default)]
pub struct PlannerState {
    /// `candidate_set`: nodes removable together, with when each entered (reset on leaving).
    pub candidates: BTreeMap<String, Timestamp>,
    /// `non_candidate_set`: nodes whose drain simulation failed, with when.
    pub non_candidates: BTreeMap<String, NonCandidate>,
    /// `pod_destination_hints`.
    pub hints: DestinationHints,
    /// `recent_evictions`.
    pub recent_evictions: Vec<RecentEviction>,
}

impl PlannerState {
    /// The actuator evicted this pod at `at`.
    pub fn record_eviction(&mut self, pod: Arc<CachedPod>, at: Timestamp) {
        self.recent_evictions.push(RecentEviction {
            pod,
            evicted_at: at,
        });
    }
}

impl PlannerState {
    /// State for the next loop: the new candidate set, the non-candidates (refreshed, forgotten
    /// once candidates or gone) and the hints.
    pub(super) fn remember(
        &mut self,
        snap: &ClusterSnapshot,
        out: &Plan,
        non_candidates: BTreeMap<String, NonCandidate>,
        new_hints: HintMap,
    ) {
        self.candidates = out
            .candidates
            .iter()
            .map(|c| (c.node.clone(), c.since))
            .collect();
        self.non_candidates
            .retain(|n, _| snap.node_id(n).is_some() && !non_candidates.contains_key(n));
        self.non_candidates.extend(non_candidates);
        for c in &out.candidates {
            self.non_candidates.remove(&c.node);
        }
        self.hints.rotate(new_hints);
    }
}
