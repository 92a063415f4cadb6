//! The periodic NodeState report: store health, the metrics, the status built from the core, and
//! its write (skipped when nothing changed, retried after a failed write). What it keeps between
//! reports is in `reporting.rs`.

use ebb_api::NodeStateStatus;
use ebb_api::nodestate::{KeyIds, LocalizedResource};
use tracing::Instrument;

use super::running::Agent;
use crate::kube_edge;
use crate::report::{ReportInput, StoreHealth, build_status};

impl Agent {
    /// Refreshes the token keys and the metrics, and writes NodeState when it changed.
    pub(super) async fn report(&mut self) {
        self.refresh_keys().await;
        let now = jiff::Timestamp::now();
        let store_health = self.reporting.store_health();
        let localized = self.rt.core.cache.report();
        self.update_metrics(&store_health, &localized);
        let status = self.status(store_health, localized, now);
        if let Some(status) = self.reporting.reporter.next(status, now) {
            self.write_status(&status).await;
        }
    }

    fn update_metrics(&self, store_health: &StoreHealth, localized: &[LocalizedResource]) {
        let (metrics, core, health) = (&self.metrics, &self.rt.core, &self.reporting.health);
        metrics.store_healthy.set(store_health.healthy as i64);
        metrics.commits.set(health.commits() as i64);
        metrics.transitions.set(health.transitions() as i64);
        metrics.containers_tracked.set(core.containers.len() as i64);
        metrics.cached_resources.set(core.cache.len() as i64);
        metrics
            .failed_resources
            .set(localized.iter().filter(|l| l.state == "Failed").count() as i64);
        metrics
            .pending_deletions
            .set(core.deletions.pending() as i64);
    }

    fn status(
        &self,
        store_health: StoreHealth,
        localized: Vec<LocalizedResource>,
        now: jiff::Timestamp,
    ) -> NodeStateStatus {
        let core = &self.rt.core;
        let policies = core.policies();
        let input = ReportInput {
            agent_version: env!("CARGO_PKG_VERSION"),
            schema_version: self.reporting.schema,
            recovery: self.reporting.recovery.clone(),
            ready: true,
            store: store_health,
            containers: &core.containers,
            policies: &policies,
            localized,
            pending_deletions: core.deletions.pending(),
            key_ids: KeyIds {
                current: core.keys.current.as_ref().map(|k| k.id.clone()),
                previous: core.keys.previous.as_ref().map(|k| k.id.clone()),
            },
            now,
        };
        build_status(input, self.reporting.reporter.conditions())
    }

    /// Writes the status (creating the NodeState when missing); a failed write is tried again
    /// with the next report.
    async fn write_status(&mut self, status: &NodeStateStatus) {
        let (client, node, policy) = (&self.client, &self.args.node_name, &self.policy);
        let write = async {
            let node_obj = kube_edge::ensure_node_state(client, node).await?;
            policy.set_node_addresses(kube_edge::node_addresses(&node_obj));
            kube_edge::write_status(client, node, status).await
        };
        match write
            .instrument(tracing::info_span!("report", node = %node))
            .await
        {
            Ok(()) => {
                tracing::debug!(
                    uptime_s = self.reporting.started.elapsed().as_secs(),
                    "NodeState reported"
                )
            }
            Err(e) => {
                self.reporting.reporter.forget();
                tracing::warn!(error = %e, "cannot write NodeState; will retry");
            }
        }
    }
}
