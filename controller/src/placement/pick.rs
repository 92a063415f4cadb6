//! Picking a node for a gated pod: eligibility of history nodes, the recency pick with the
//! warm-data tie-break, waiting and escalation of requests, and relaxed constraints.

use std::collections::BTreeSet;

use ebb_api::placement::PlacementPolicy;
use jiff::Timestamp;

use super::decision::{Action, Decision, PlacementReason, RelaxedConstraints};
use super::escalation;
use super::history::{MAX_PREFERRED_NODES, PodRef, RoleHistory};
use super::node_map::newer_first;
use super::nodes::NodeFacts;
use super::requests::{OutstandingRequest, RequestState};
use super::roles::{RoleConfig, RoleId};

/// Result of picking a history node.
pub(super) enum Pick {
    Now {
        node: String,
        reason: PlacementReason,
    },
    Later {
        node: String,
        reason: PlacementReason,
    },
    Nothing,
}

/// Whether a node can take a pinned pod of a role.
pub(super) enum Eligibility {
    Placeable,
    NotNow(PlacementReason),
    Ineligible,
}

impl RoleHistory {
    pub(super) fn eligibility(
        &self,
        role: &RoleConfig,
        node: &str,
        facts: &NodeFacts,
        fits: &dyn Fn(&str) -> bool,
    ) -> Eligibility {
        let Some(view) = facts.get(node) else {
            return Eligibility::Ineligible;
        };
        if view.draining_or_candidate || !role.matches_labels(&view.labels) {
            return Eligibility::Ineligible;
        }
        let failed = self
            .nodes
            .get(node, role.id)
            .map_or(0, |e| e.failed_recently);
        if role.avoids_failing_nodes() && role.over_threshold(failed) {
            return Eligibility::Ineligible;
        }
        if !view.schedulable_ready {
            Eligibility::NotNow(PlacementReason::NodeNotReady)
        } else if !fits(node) {
            Eligibility::NotNow(PlacementReason::DoesNotFit)
        } else {
            Eligibility::Placeable
        }
    }

    /// The head of the role's list that is eligible and placeable now (warm data breaks ties
    /// of equal recency); else the first eligible node to wait for; else nothing.
    pub(super) fn pick(
        &mut self,
        role: &RoleConfig,
        facts: &NodeFacts,
        fits: &dyn Fn(&str) -> bool,
    ) -> Pick {
        let busy: Vec<String> = self
            .available
            .get(&role.id)
            .into_iter()
            .flat_map(|l| l.iter())
            .filter(|n| !self.usable(role.id, n))
            .map(str::to_string)
            .collect();
        for node in &busy {
            self.list(role.id).remove(node);
        }
        let Some(list) = self.available.get(&role.id) else {
            return Pick::Nothing;
        };
        let warm = |n: &str| {
            facts
                .get(n)
                .is_some_and(|v| v.warm_roles.contains(&role.name))
        };
        let last_used = |n: &str| self.nodes.get(n, role.id).and_then(|e| e.last_used);
        let mut chosen: Option<(&str, PlacementReason)> = None;
        let mut wait: Option<(&str, PlacementReason)> = None;
        for node in list.iter() {
            match self.eligibility(role, node, facts, fits) {
                Eligibility::Ineligible => continue,
                Eligibility::NotNow(reason) => {
                    if chosen.is_none() && wait.is_none() {
                        wait = Some((node, reason));
                    }
                }
                Eligibility::Placeable => match chosen {
                    None => {
                        chosen = Some((node, PlacementReason::MostRecentNode));
                        if warm(node) {
                            break;
                        }
                    }
                    Some((first, _)) => {
                        if last_used(node) != last_used(first) {
                            break;
                        }
                        if warm(node) {
                            chosen = Some((node, PlacementReason::WarmDataTieBreak));
                            break;
                        }
                    }
                },
            }
            if let Some((first, _)) = chosen
                && last_used(node) != last_used(first)
            {
                break;
            }
        }
        match (chosen, wait) {
            (Some((node, reason)), _) => Pick::Now {
                node: node.to_string(),
                reason,
            },
            (None, Some((node, reason))) => Pick::Later {
                node: node.to_string(),
                reason,
            },
            (None, None) => Pick::Nothing,
        }
    }

    pub(super) fn reserve(&mut self, role: RoleId, node: &str) {
        self.list(role).remove(node);
        self.nodes.get_or_create(node, role).requested += 1;
    }

    pub(super) fn pick_and_record(
        &mut self,
        role: &RoleConfig,
        pod: PodRef<'_>,
        facts: &NodeFacts,
        fits: &dyn Fn(&str) -> bool,
        requested_at: Timestamp,
        now: Timestamp,
    ) -> Decision {
        let strict = role.policy == PlacementPolicy::Strict;
        match self.pick(role, facts, fits) {
            Pick::Now { node, reason } => {
                self.reserve(role.id, &node);
                self.pinned(role, pod, node, reason, requested_at, now)
            }
            Pick::Later { node, reason } => {
                self.reserve(role.id, &node);
                let deadline =
                    (!strict).then(|| escalation::deadline(requested_at, role.escalation_timeout));
                self.requests.insert(OutstandingRequest {
                    uid: pod.uid.to_string(),
                    pod_name: pod.name.to_string(),
                    role: role.id,
                    target: Some(node.clone()),
                    requested_at,
                    deadline,
                    state: RequestState::Waiting,
                });
                Decision {
                    action: Action::Wait {
                        node,
                        until: deadline,
                    },
                    reason,
                }
            }
            Pick::Nothing => {
                let action = Action::Anywhere(self.relaxed(role, facts, false));
                self.release_unpinned(
                    role,
                    pod,
                    requested_at,
                    action,
                    PlacementReason::NoAvailableHistoryNode,
                )
            }
        }
    }

    /// Record a pinned release; its deadline (for [`Self::overdue`]) starts now.
    pub(super) fn pinned(
        &mut self,
        role: &RoleConfig,
        pod: PodRef<'_>,
        node: String,
        reason: PlacementReason,
        requested_at: Timestamp,
        now: Timestamp,
    ) -> Decision {
        let decision = Decision {
            action: Action::Pin { node: node.clone() },
            reason,
        };
        self.requests.insert(OutstandingRequest {
            uid: pod.uid.to_string(),
            pod_name: pod.name.to_string(),
            role: role.id,
            target: Some(node),
            requested_at,
            deadline: (role.policy != PlacementPolicy::Strict)
                .then(|| escalation::deadline(now, role.escalation_timeout)),
            state: RequestState::Released(decision.clone()),
        });
        self.counters.entry(role.id).or_default().pinned += 1;
        decision
    }

    pub(super) fn release_unpinned(
        &mut self,
        role: &RoleConfig,
        pod: PodRef<'_>,
        requested_at: Timestamp,
        action: Action,
        reason: PlacementReason,
    ) -> Decision {
        let decision = Decision { action, reason };
        let counters = self.counters.entry(role.id).or_default();
        match decision.action {
            Action::Relax(_) => counters.relaxed += 1,
            _ => counters.anywhere += 1,
        }
        self.requests.insert(OutstandingRequest {
            uid: pod.uid.to_string(),
            pod_name: pod.name.to_string(),
            role: role.id,
            target: None,
            requested_at,
            deadline: None,
            state: RequestState::Released(decision.clone()),
        });
        decision
    }

    /// A waiting request is asked again.
    pub(super) fn revisit(
        &mut self,
        role: &RoleConfig,
        pod: PodRef<'_>,
        request: OutstandingRequest,
        facts: &NodeFacts,
        fits: &dyn Fn(&str) -> bool,
        now: Timestamp,
    ) -> Decision {
        let target = request.target.clone().unwrap_or_default();
        let due = request.deadline.is_some_and(|d| escalation::is_due(d, now));
        match (due, self.eligibility(role, &target, facts, fits)) {
            (false, Eligibility::Placeable) => self.pinned(
                role,
                pod,
                target,
                PlacementReason::MostRecentNode,
                request.requested_at,
                now,
            ),
            (false, Eligibility::NotNow(reason)) => Decision {
                action: Action::Wait {
                    node: target,
                    until: request.deadline,
                },
                reason,
            },
            // Past the deadline, or the node went away or became ineligible.
            (due, _) => {
                self.requests.remove(pod.uid);
                if let Some(e) = self.nodes.get_mut(&target, role.id) {
                    e.requested = e.requested.saturating_sub(1);
                }
                if due {
                    self.requests.add_return(role.id, &target);
                    self.counters.entry(role.id).or_default().escalations += 1;
                    let action = Action::Relax(self.relaxed(role, facts, true));
                    return self.release_unpinned(
                        role,
                        pod,
                        request.requested_at,
                        action,
                        PlacementReason::EscalationTimeout,
                    );
                }
                if self.usable(role.id, &target) {
                    self.insert_sorted(role.id, &target);
                }
                // Pick again, keeping the original request time (and so the deadline).
                self.pick_and_record(role, pod, facts, fits, request.requested_at, now)
            }
        }
    }

    /// Constraints of an unpinned release: role labels, nodes to avoid, and (when `prefer`)
    /// the most recent history nodes as preferred affinity.
    pub(super) fn relaxed(
        &self,
        role: &RoleConfig,
        facts: &NodeFacts,
        prefer: bool,
    ) -> RelaxedConstraints {
        let anti = role.policy == PlacementPolicy::AntiAffinity;
        let mut avoid = BTreeSet::new();
        for (node, e) in self.nodes.role_entries(role.id) {
            if (role.avoids_failing_nodes() && role.over_threshold(e.failed_recently))
                || (anti && (e.active() > 0 || e.requested > 0))
            {
                avoid.insert(node.to_string());
            }
        }
        let mut prefer_nodes = Vec::new();
        if prefer {
            let mut history: Vec<(&str, Option<Timestamp>)> = self
                .nodes
                .role_entries(role.id)
                .filter(|(n, e)| {
                    e.last_used.is_some()
                        && !avoid.contains(*n)
                        && facts.get(n).is_some_and(|v| !v.draining_or_candidate)
                })
                .map(|(n, e)| (n, e.last_used))
                .collect();
            history.sort_by(|a, b| newer_first(*a, *b));
            prefer_nodes = history
                .into_iter()
                .take(MAX_PREFERRED_NODES)
                .enumerate()
                .map(|(i, (n, _))| (n.to_string(), 100 - 10 * i as i32))
                .collect();
        }
        RelaxedConstraints {
            node_selector: role.node_selector.clone(),
            avoid_nodes: avoid.into_iter().collect(),
            prefer_nodes,
        }
    }
}
