//! The drains in flight, the ones that finished since the controller last looked, and the recent
//! evictions (for the planner). Shared by the drain tasks and the reconcile loop.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use super::drain::{Drain, DrainEvent, InvalidTransition, Outcome, Step};
use super::status::{ActuationStatus, Evicted, Finished};

#[derive(Default)]
struct Inner {
    drains: BTreeMap<String, Drain>,
    finished: Vec<Finished>,
    /// Evictions not yet handed to the planner (which keeps its own window).
    unseen: Vec<Evicted>,
    /// Evictions a PodDisruptionBudget refused, per policy, not yet taken.
    refused: BTreeMap<String, i64>,
    /// Nodes whose drain in flight a written policy status lists: a process started after
    /// their removal counts it from there.
    recorded: BTreeSet<String>,
}

impl Inner {
    fn draining(&self, policy: Option<&str>) -> Vec<Drain> {
        self.drains
            .values()
            .filter(|d| policy.is_none_or(|p| d.policy == p))
            .cloned()
            .collect()
    }
}

/// Shared record of the actuator's work. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracker {
    inner: Arc<Mutex<Inner>>,
    recorded_changed: Arc<tokio::sync::Notify>,
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep going with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Register a drain; false when its node is already being drained.
    pub fn begin(&self, drain: Drain) -> bool {
        let mut inner = self.lock();
        if inner.drains.contains_key(&drain.node) {
            return false;
        }
        inner.drains.insert(drain.node.clone(), drain);
        true
    }

    /// Feed an event to the drain of `node`. When it ends, it moves to the finished list.
    /// `None` when no drain of that node is in flight.
    pub fn apply(
        &self,
        node: &str,
        event: DrainEvent,
        now: jiff::Timestamp,
    ) -> Option<Result<Step, InvalidTransition>> {
        let mut inner = self.lock();
        let drain = inner.drains.get_mut(node)?;
        let result = drain.apply(event);
        if let Ok(Step::Done(outcome)) = &result {
            let outcome = outcome.clone();
            inner.recorded.remove(node);
            if let Some(drain) = inner.drains.remove(node) {
                inner.finished.push(Finished {
                    drain,
                    outcome,
                    at: now,
                });
            }
        }
        Some(result)
    }

    /// The drain of `node`, if in flight.
    pub fn get(&self, node: &str) -> Option<Drain> {
        self.lock().drains.get(node).cloned()
    }

    /// Drains in flight, of one policy or all, sorted by node.
    pub fn draining(&self, policy: Option<&str>) -> Vec<Drain> {
        self.lock().draining(policy)
    }

    /// The drains of `policy` in flight, and how many of its drains removed their node since
    /// the last [`Tracker::take_finished`], read together: a status built from both lists a
    /// drain until its removal is counted, never neither (a drain that ends between a loop's
    /// observe and its status write would otherwise leave the list uncounted, and a process
    /// started after that write would miss the removal).
    pub fn draining_and_removed_since(&self, policy: &str) -> (Vec<Drain>, i64) {
        let inner = self.lock();
        let draining = inner.draining(Some(policy));
        let removed = inner
            .finished
            .iter()
            .filter(|f| f.drain.policy == policy && f.outcome == Outcome::Removed)
            .count() as i64;
        (draining, removed)
    }

    /// A policy status listing these nodes' drains in flight was written (or was already
    /// there): a removal from now on is counted by a process that starts after it.
    pub fn mark_recorded<'a>(&self, nodes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        let mut added = false;
        for node in nodes {
            if inner.drains.contains_key(node) && !inner.recorded.contains(node) {
                inner.recorded.insert(node.to_string());
                added = true;
            }
        }
        drop(inner);
        if added {
            self.recorded_changed.notify_waiters();
        }
    }

    /// Resolves once a written status lists the drain of `node` ([`Self::mark_recorded`]).
    pub async fn recorded(&self, node: &str) {
        loop {
            let changed = self.recorded_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().recorded.contains(node) {
                return;
            }
            changed.await;
        }
    }

    /// Nodes being drained, by any policy.
    pub fn in_flight(&self) -> BTreeSet<String> {
        self.lock().drains.keys().cloned().collect()
    }

    /// Take the drains of `policy` that ended since the last call.
    pub fn take_finished(&self, policy: &str) -> Vec<Finished> {
        let mut inner = self.lock();
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.finished)
            .into_iter()
            .partition(|f| f.drain.policy == policy);
        inner.finished = rest;
        mine
    }

    /// Remember an eviction.
    pub fn record_eviction(&self, evicted: Evicted) {
        self.lock().unseen.push(evicted);
    }

    /// Count an eviction a PodDisruptionBudget refused (HTTP 429).
    pub fn record_refusal(&self, policy: &str) {
        *self.lock().refused.entry(policy.to_string()).or_insert(0) += 1;
    }

    /// Take the refusals of `policy` counted since the last call.
    pub fn take_refused(&self, policy: &str) -> i64 {
        self.lock().refused.remove(policy).unwrap_or(0)
    }

    /// What `policy`'s loop reads of actuation: every drain in flight, and what it has not
    /// taken yet of its finished drains, evictions and refusals (taken once).
    pub fn status(&self, policy: &str) -> ActuationStatus {
        ActuationStatus {
            draining: self.draining(None),
            finished: self.take_finished(policy),
            evicted: self.take_evictions(policy),
            refused: self.take_refused(policy),
        }
    }

    /// Take the evictions of `policy` not taken yet (to tell the planner once).
    pub fn take_evictions(&self, policy: &str) -> Vec<Evicted> {
        let mut inner = self.lock();
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.unseen)
            .into_iter()
            .partition(|e| e.policy == policy);
        inner.unseen = rest;
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actuation::drain::GiveUpReason;
    use crate::actuation::pods::PodRef;
    use crate::metrics::ScaleDownKind;
    use std::time::Duration;

    fn ts(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_drain_is_listed_or_counted_at_every_moment() {
        let t = Tracker::default();
        assert!(t.begin(Drain::new("p", "n1", ScaleDownKind::empty, ts(1))));
        assert!(t.begin(Drain::new("p", "n2", ScaleDownKind::empty, ts(1))));
        assert!(t.begin(Drain::new("q", "n3", ScaleDownKind::empty, ts(1))));
        let (draining, removed) = t.draining_and_removed_since("p");
        assert_eq!((draining.len(), removed), (2, 0));
        // n1 is removed after the loop took its report, before the status is built.
        for e in [
            DrainEvent::RecheckPassed,
            DrainEvent::PodsGone,
            DrainEvent::Finished,
        ] {
            let step = t.apply("n1", e.clone(), ts(2));
            assert!(matches!(step, Some(Ok(_))), "{e:?}: {step:?}");
        }
        let (draining, removed) = t.draining_and_removed_since("p");
        assert_eq!(
            draining.iter().map(|d| d.node.as_str()).collect::<Vec<_>>(),
            ["n2"]
        );
        assert_eq!(removed, 1, "no longer listed, so counted");
        // The next loop takes it (and counts it itself): no longer pending.
        assert_eq!(t.take_finished("p").len(), 1);
        assert_eq!(t.draining_and_removed_since("p").1, 0);
    }

    #[test]
    fn finished_drains_leave_the_in_flight_set_once() {
        let t = Tracker::default();
        assert!(t.begin(Drain::new("p", "n1", ScaleDownKind::empty, ts(1))));
        assert!(!t.begin(Drain::new("q", "n1", ScaleDownKind::empty, ts(2))));
        assert!(t.begin(Drain::new("q", "n2", ScaleDownKind::empty, ts(2))));
        assert_eq!(t.in_flight().len(), 2);
        assert_eq!(t.draining(Some("p")).len(), 1);
        assert!(
            t.apply("n1", DrainEvent::RecheckPassed, ts(3))
                .unwrap()
                .is_ok()
        );
        t.apply(
            "n1",
            DrainEvent::GiveUp(GiveUpReason::PodsLanded(vec![])),
            ts(4),
        );
        assert_eq!(t.in_flight(), ["n2".to_string()].into());
        assert!(t.take_finished("q").is_empty());
        let done = t.take_finished("p");
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].drain.node, "n1");
        assert_eq!(done[0].at, ts(4));
        assert!(t.take_finished("p").is_empty(), "taken once");
        assert!(t.apply("n1", DrainEvent::RecheckPassed, ts(5)).is_none());
    }

    #[tokio::test]
    async fn a_drain_is_recorded_once_a_written_status_lists_it_until_it_ends() {
        let t = Tracker::default();
        assert!(t.begin(Drain::new("p", "n1", ScaleDownKind::empty, ts(1))));
        let wait = Duration::from_millis(50);
        let waiter = tokio::spawn({
            let t = t.clone();
            async move { t.recorded("n1").await }
        });
        tokio::time::sleep(wait).await;
        assert!(!waiter.is_finished(), "nothing written yet");
        t.mark_recorded(["n2", "unknown"]);
        tokio::time::sleep(wait).await;
        assert!(
            !waiter.is_finished(),
            "another node's drain is not this one"
        );
        t.mark_recorded(["n1"]);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("recorded resolves once the status lists the drain")
            .unwrap();
        t.apply(
            "n1",
            DrainEvent::GiveUp(GiveUpReason::PodsLanded(vec![])),
            ts(2),
        );
        assert!(t.begin(Drain::new("p", "n1", ScaleDownKind::empty, ts(3))));
        assert!(
            tokio::time::timeout(wait, t.recorded("n1")).await.is_err(),
            "a new drain of the node is not recorded by the old one's status"
        );
        t.mark_recorded(["gone-node"]);
        assert!(
            tokio::time::timeout(wait, t.recorded("gone-node"))
                .await
                .is_err(),
            "a node with no drain in flight is never recorded"
        );
    }

    #[test]
    fn evictions_are_handed_over_once_per_policy() {
        let t = Tracker::default();
        for (i, at) in [10, 20, 30].into_iter().enumerate() {
            t.record_eviction(Evicted {
                policy: "p".into(),
                node: "n1".into(),
                pod: PodRef {
                    namespace: "default".into(),
                    name: format!("web-{i}"),
                    uid: format!("u{i}"),
                    grace: None,
                },
                object: None,
                at: ts(at),
            });
        }
        t.record_eviction(Evicted {
            policy: "q".into(),
            node: "n2".into(),
            pod: PodRef {
                namespace: "default".into(),
                name: "db-0".into(),
                uid: "u9".into(),
                grace: None,
            },
            object: None,
            at: ts(40),
        });
        assert_eq!(
            t.take_evictions("q")
                .iter()
                .map(|e| e.pod.name.as_str())
                .collect::<Vec<_>>(),
            vec!["db-0"]
        );
        assert_eq!(t.take_evictions("p").len(), 3);
        assert!(t.take_evictions("p").is_empty(), "taken once");
    }
}
