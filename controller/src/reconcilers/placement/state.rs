//! What the controller keeps of one PlacementHistory between passes: its RoleHistory (rebuilt
//! from the status or following spec changes), the pods last seen and the last status written.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::cluster::CachedPod;
use ebb_api::placement::{PlacementHistory, PlacementHistoryStatus};
use jiff::Timestamp;

use crate::placement::{HistoryError, RoleHistory};

/// What the controller keeps of one PlacementHistory between passes.
pub struct PhState {
    pub history: RoleHistory,
    /// The generation the history follows.
    pub generation: Option<i64>,
    /// Selected pods as last seen, by UID (a deleted pod's last state classifies its end).
    pub last_seen: HashMap<String, CachedPod>,
    /// Pods already reported terminated.
    pub ended: HashSet<String>,
    /// Pods announced as waiting for their node.
    pub waiting: HashSet<String>,
    pub last_write: Option<Instant>,
    pub last_figures: Option<PlacementHistoryStatus>,
}

impl PhState {
    /// A new state: the history rebuilt from the status of `ph` (`key`: its `namespace/name`).
    pub fn rebuild(ph: &PlacementHistory, key: &str, now: Timestamp) -> Result<Self, HistoryError> {
        let (history, report) = RoleHistory::rebuild(&ph.spec, ph.status.as_ref(), now)?;
        tracing::info!(ph = %key, ?report, "placement history rebuilt");
        Ok(Self {
            history,
            generation: ph.metadata.generation,
            last_seen: HashMap::new(),
            ended: HashSet::new(),
            waiting: HashSet::new(),
            last_write: None,
            last_figures: ph.status.clone(),
        })
    }

    /// Follow the spec of `ph` when its generation changed.
    pub fn follow_spec(
        &mut self,
        ph: &PlacementHistory,
        key: &str,
        now: Timestamp,
    ) -> Result<(), HistoryError> {
        if self.generation == ph.metadata.generation {
            return Ok(());
        }
        let (removed, dropped) = self.history.update_spec(&ph.spec, now)?;
        if !removed.is_empty() {
            tracing::info!(ph = %key, ?removed, dropped, "roles removed from the spec");
        }
        self.generation = ph.metadata.generation;
        Ok(())
    }
}
