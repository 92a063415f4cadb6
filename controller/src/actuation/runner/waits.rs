//! The waits of a drain: until the node watch shows its taint, until its pods are gone, and
//! until nothing can still be on its way to the node before it goes.

use super::*;

/// Longest wait for the node watch to show the taint ebb wrote (the re-check runs then anyway).
const TAINT_SEEN_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the node cache is looked at while waiting for the taint to show.
const TAINT_SEEN_POLL: Duration = Duration::from_millis(10);

/// How often a drain waiting for its pods looks at the cache without a change tick.
const POD_GONE_RECHECK: Duration = Duration::from_secs(5);

/// Shortest time between two looks at the cache by a drain waiting for its pods to go.
const POD_GONE_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// Extra time, beyond the capped grace period, that evicted pods get to disappear.
pub const POD_GONE_SLACK: Duration = Duration::from_secs(30);

/// Longest wait, before a node goes, for a written policy status to list its drain (status
/// writes failing must not hold removals; a restart then may leave that removal uncounted).
pub const RECORDED_TIMEOUT: Duration = Duration::from_secs(30);

impl Actuator {
    /// Waits until the node cache shows ebb's `to-be-deleted` taint on `node` (or the node is
    /// gone from it), at most [`TAINT_SEEN_TIMEOUT`].
    pub(super) async fn taint_seen(&self, node: &str) {
        let cache = &self.stores.nodes;
        let deadline = tokio::time::Instant::now() + TAINT_SEEN_TIMEOUT;
        let key = kube::runtime::reflector::ObjectRef::new(node);
        loop {
            let seen = cache
                .get(&key)
                .is_none_or(|n| crate::actuation::taints::has(&n, EbbTaint::ToBeDeleted));
            if seen {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    node,
                    "the node watch has not shown the taint; re-checking all the same"
                );
                return;
            }
            tokio::time::sleep(TAINT_SEEN_POLL).await;
        }
    }

    /// Before a drained node goes (deleted or marked drained): a written status of its policy
    /// lists the drain, so that a process started after the removal counts it in
    /// `removedTotal` (usually at once: a loop writes its status right after starting drains;
    /// a drain resumed at start waits for the first loop). At most [`RECORDED_TIMEOUT`].
    pub(super) async fn recorded(&self, order: &DrainOrder) {
        let node = order.node.as_str();
        tokio::select! {
            _ = self.tracker.recorded(node) => {}
            _ = self.abandoned(order) => {}
            _ = tokio::time::sleep(RECORDED_TIMEOUT) => {
                tracing::warn!(
                    node,
                    "no status of the policy lists this drain yet; removing the node all the same (a restart right now would leave the removal out of removedTotal)"
                );
            }
        }
    }

    /// Before a drained node goes: [`ARRIVAL_WINDOW`] has passed since its taint (a binding the
    /// scheduler began before it saw the taint has landed by then), no pod is nominated to it,
    /// and no pod landed on it since the plan; else the drain gives up (the node stays).
    pub(super) async fn settle_arrivals(
        &self,
        order: &DrainOrder,
        began: tokio::time::Instant,
    ) -> Result<(), GiveUpReason> {
        let node = order.node.as_str();
        let window = Duration::try_from(ARRIVAL_WINDOW).unwrap_or_default();
        // Since the taint: as long as this task has run, or since the taint's own time for a
        // drain resumed after a restart, whichever is longer.
        let mut tainted_for = began.elapsed();
        if let Some(started) = self.tracker.get(node).map(|d| d.started) {
            let wall = jiff::Timestamp::now().duration_since(started);
            tainted_for = tainted_for.max(Duration::try_from(wall).unwrap_or_default());
        }
        if let Some(wait) = window.checked_sub(tainted_for).filter(|w| !w.is_zero()) {
            // Past its last eviction: the controller's stop alone does not stop it (it finishes
            // within the shutdown bound, as `abandoned` says).
            tokio::select! {
                _ = self.abandoned(order) => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let now = self.pods_now();
        let mut arriving = pods::nominated_to(node, now.iter().map(|p| &**p));
        arriving.extend(pods::landed_since_plan(
            node,
            &order.planned_pods,
            now.iter().map(|p| &**p),
        ));
        if arriving.is_empty() {
            Ok(())
        } else {
            arriving.sort();
            Err(GiveUpReason::PodsLanded(arriving))
        }
    }

    pub(super) async fn wait_pods_gone(&self, order: &DrainOrder) -> Result<(), GiveUpReason> {
        let deadline = tokio::time::Instant::now() + order.settings.grace_cap + POD_GONE_SLACK;
        let mut changes = self.pod_changes.clone();
        loop {
            changes.mark_unchanged();
            let looked = tokio::time::Instant::now();
            // One pass over the cache keeps this node's pods; both checks read only those.
            let here = self.pods_on(&order.node);
            // A pod placed here after the re-check (a binding already under way when the taint
            // was written): the node stays rather than move that pod again.
            let landed = pods::landed_since_plan(
                &order.node,
                &order.planned_pods,
                here.iter().map(|p| &**p),
            );
            if !landed.is_empty() {
                return Err(GiveUpReason::PodsLanded(landed));
            }
            let left = pods::remaining(&order.node, here.iter().map(|p| &**p));
            if left.is_empty() {
                return Ok(());
            }
            self.step(&order.node, DrainEvent::PodsRemaining(left.len() as i32));
            tokio::select! {
                _ = self.abandoned(order) => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(GiveUpReason::PodsDidNotTerminate { pods: left });
                }
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The pod watch is gone (shutting down); look again shortly.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    // Pods change hundreds of times a second in a big cluster, nearly always
                    // on other nodes: every drain scanning the cache on each change kept a core
                    // busy at 1,000 nodes. Look again at most this often.
                    tokio::time::sleep_until(looked + POD_GONE_MIN_INTERVAL).await;
                }
                // The cache may change without a tick (a re-list after a failed watch): look
                // again now and then.
                _ = tokio::time::sleep(POD_GONE_RECHECK) => {}
            }
        }
    }
}
