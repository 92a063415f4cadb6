//! The end of a `DrainAndDelete` drain: delete the Node, or hand its machine off (Cluster API,
//! Karpenter) and wait for the machine and the Node to go.

use super::*;

/// Attempts at a hand-off failing with a retryable error (it is idempotent).
const HAND_OFF_ATTEMPTS: u32 = 5;

/// How often a handed-off removal looks whether the machine and the Node are gone.
const REMOVAL_POLL: Duration = Duration::from_secs(2);

impl Actuator {
    /// `DrainAndDelete` once the pods are gone: delete the Node, or hand its machine off and
    /// wait for it and the Node to go.
    pub(super) async fn remove(&self, order: &DrainOrder) -> Result<(), GiveUpReason> {
        let node = order.node.as_str();
        let target = order.target.clone().unwrap_or(Target::Node);
        self.step(
            node,
            DrainEvent::Removing(crate::actuation::removal::status_for(node, &target)),
        );
        let node_uid = self.remover.node_uid(node).await.ok().flatten();
        let handed = self.hand_off(order, &target).await.inspect_err(|_| {
            self.count_removal(order, &target, RemovalOutcome::failed);
        })?;
        if target == Target::Node {
            self.count_removal(order, &target, RemovalOutcome::removed);
            return Ok(());
        }
        tracing::info!(
            method = %target.method(),
            object = %handed.status.object,
            scaled = handed.status.scaled.as_deref().unwrap_or(""),
            replicas = ?handed.replicas,
            "machine handed off"
        );
        if let Some(r) = &handed.status.scaled
            && let Some(d) = self.tracker.get(node)
            && let Some(mut status) = d.removal
        {
            status.scaled = Some(r.clone());
            self.step(node, DrainEvent::Removing(status));
        }
        self.step(node, DrainEvent::HandedOff(jiff::Timestamp::now()));
        self.count_removal(order, &target, RemovalOutcome::handed_off);
        self.wait_removed(order, &target, &handed, node_uid.as_deref())
            .await?;
        self.count_removal(order, &target, RemovalOutcome::removed);
        Ok(())
    }

    /// The hand-off, retried while it fails in a way worth retrying (it is idempotent).
    async fn hand_off(
        &self,
        order: &DrainOrder,
        target: &Target,
    ) -> Result<HandedOff, GiveUpReason> {
        let mut attempt = 1;
        loop {
            match self
                .remover
                .hand_off(&order.node, target, order.group_min)
                .await
            {
                Ok(h) => return Ok(h),
                Err(e) if e.retryable() && attempt < HAND_OFF_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "hand-off failed; trying again");
                    tokio::select! {
                        _ = self.abandoned(order) => return Err(GiveUpReason::Cancelled),
                        _ = tokio::time::sleep(Duration::from_secs(u64::from(attempt))) => {}
                    }
                    attempt += 1;
                }
                Err(e) => return Err(GiveUpReason::RemovalFailed(e.to_string())),
            }
        }
    }

    /// Waits until the Machine or NodeClaim and the Node are gone; past `removal.timeout` the
    /// drain is marked stuck (once) and keeps waiting.
    async fn wait_removed(
        &self,
        order: &DrainOrder,
        target: &Target,
        handed: &HandedOff,
        node_uid: Option<&str>,
    ) -> Result<(), GiveUpReason> {
        let deadline = tokio::time::Instant::now() + order.removal_timeout;
        let mut stuck = false;
        loop {
            match self
                .remover
                .remaining(&order.node, node_uid, target, handed.uid.as_deref())
                .await
            {
                Ok(left) if left.is_empty() => return Ok(()),
                Ok(left) if !stuck && tokio::time::Instant::now() >= deadline => {
                    stuck = true;
                    let message = format!(
                        "{} still there {}s after the hand-off",
                        left.join(" and "),
                        order.removal_timeout.as_secs()
                    );
                    tracing::warn!(%message, "removal stuck");
                    self.step(&order.node, DrainEvent::RemovalStuck(message));
                    self.count_removal(order, target, RemovalOutcome::stuck);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot check the removal"),
            }
            // A stop leaves a handed-off machine to go; the next leader watches it.
            tokio::select! {
                _ = order.cancel.cancelled() => return Err(GiveUpReason::Cancelled),
                _ = tokio::time::sleep(REMOVAL_POLL) => {}
            }
        }
    }

    fn count_removal(&self, order: &DrainOrder, target: &Target, outcome: RemovalOutcome) {
        let labels = |outcome| RemovalLabels {
            policy: order.policy.clone(),
            method: target.method().as_str().to_string(),
            outcome,
        };
        // Every outcome of this policy and method starts at 0 with its first removal, so the
        // rare ones (stuck, failed) are series a dashboard and `increase()` see from then on.
        for o in [
            RemovalOutcome::handed_off,
            RemovalOutcome::removed,
            RemovalOutcome::stuck,
            RemovalOutcome::failed,
        ] {
            self.metrics.removals.get_or_create(&labels(o)).inc_by(0);
        }
        self.metrics.removals.get_or_create(&labels(outcome)).inc();
    }
}
