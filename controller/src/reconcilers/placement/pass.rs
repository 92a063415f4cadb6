//! One pass over a PlacementHistory as plain data: what it reads (the object, node facts) and
//! what it builds up (its state, Events to send); the steps are in lifecycle, place, escalate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cluster::CachedPod;
use ebb_api::placement::PlacementHistory;
use jiff::Timestamp;
use kube::ResourceExt;

use super::context::Context;
use super::events::Notice;
use super::facts::{lost_nodes, node_facts};
use super::state::PhState;
use super::status;
use crate::metrics::PlacementHistoryLabels;
use crate::placement::{NodeFacts, warm_roles};

/// One pass over a PlacementHistory.
pub struct Pass<'a> {
    pub ctx: &'a Context,
    pub ph: &'a PlacementHistory,
    /// `namespace/name` of the PlacementHistory.
    pub key: String,
    pub now: Timestamp,
    pub state: PhState,
    /// Node facts, with the roles each node agent reports warm data of.
    pub facts: NodeFacts,
    /// Node names by readiness (`true`: NotReady).
    pub lost: BTreeMap<String, bool>,
    /// Metric labels of the PlacementHistory.
    pub labels: PlacementHistoryLabels,
    /// Events to send when the pass is done.
    pub notices: Vec<Notice>,
}

impl<'a> Pass<'a> {
    /// Gather the node facts of a pass from the caches.
    pub fn new(
        ctx: &'a Context,
        ph: &'a PlacementHistory,
        key: String,
        state: PhState,
        now: Timestamp,
    ) -> Self {
        let nodes = ctx.stores.nodes.state();
        let mut facts = node_facts(&nodes);
        let (ns, name) = (ph.namespace().unwrap_or_default(), ph.name_any());
        for node_state in ctx.node_states.state() {
            if let (Some(status), Some(view)) = (
                node_state.status.as_ref(),
                facts.get_mut(&node_state.name_any()),
            ) {
                view.warm_roles = warm_roles(status, &ns, &name, &ph.spec);
            }
        }
        Self {
            ctx,
            ph,
            key,
            now,
            state,
            facts,
            lost: lost_nodes(&nodes),
            labels: labels(ph),
            notices: Vec::new(),
        }
    }

    /// Whether the pod's node is gone or NotReady (a pod on no node counts as lost).
    pub fn node_lost(&self, pod: &CachedPod) -> bool {
        node_of(pod).is_none_or(|n| self.lost.get(n).copied().unwrap_or(true))
    }

    /// Write the status, at most once per interval and only on change. A failed write leaves
    /// the history dirty (written again next pass).
    pub async fn save_status(&mut self) -> Result<(), kube::Error> {
        let due = self
            .state
            .last_write
            .is_none_or(|t| t.elapsed() >= self.ctx.settings.status_interval);
        if !due {
            return Ok(());
        }
        let dirty = self.state.history.is_dirty();
        let status = status::placing(self.ph, &mut self.state.history, self.now);
        let changed = dirty
            || self
                .state
                .last_figures
                .as_ref()
                .is_none_or(|l| status::figures_differ(l, &status));
        if !changed {
            return Ok(());
        }
        match status::write_status(&self.ctx.client, self.ph, &status).await {
            Ok(()) => {
                self.state.last_write = Some(Instant::now());
                self.state.last_figures = Some(status);
                Ok(())
            }
            Err(e) => {
                self.state.history.mark_dirty();
                Err(e)
            }
        }
    }

    /// When to look again: soon while pods wait or the history is unsaved.
    pub fn requeue_after(&self, any_waiting: bool) -> Duration {
        let settings = &self.ctx.settings;
        if any_waiting || self.state.history.is_dirty() {
            settings.retry
        } else {
            settings.status_interval.max(settings.retry)
        }
    }

    /// Keep the state for the next pass and send the Events.
    pub async fn finish(self) {
        self.ctx.put_state(&self.key, self.state);
        self.ctx.notify(self.notices).await;
    }
}

pub fn labels(ph: &PlacementHistory) -> PlacementHistoryLabels {
    PlacementHistoryLabels {
        namespace: ph.namespace().unwrap_or_default(),
        placement_history: ph.name_any(),
    }
}

pub fn phase(p: &CachedPod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn node_of(p: &CachedPod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

pub fn terminal(p: &CachedPod) -> bool {
    crate::state::ended_pods::EndedPods::is_terminal(p)
}
