//! Prometheus metrics of the agent on `/metrics`: store health and commit counts, what the store
//! tracks, cache and deletion backlog, and the last recovery's duration and findings.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub struct AgentMetrics {
    registry: Registry,
    pub store_healthy: Gauge,
    pub commits: Gauge,
    pub transitions: Gauge,
    pub containers_tracked: Gauge,
    pub cached_resources: Gauge,
    pub failed_resources: Gauge,
    pub pending_deletions: Gauge,
    pub recovery_seconds: Gauge<f64, AtomicU64>,
    pub recovery_lost: Gauge,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ebb_node_agent");
        let m = AgentMetrics {
            store_healthy: Gauge::default(),
            commits: Gauge::default(),
            transitions: Gauge::default(),
            containers_tracked: Gauge::default(),
            cached_resources: Gauge::default(),
            failed_resources: Gauge::default(),
            pending_deletions: Gauge::default(),
            recovery_seconds: Gauge::default(),
            recovery_lost: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "store_healthy",
            "1 while the state store accepts writes",
            m.store_healthy.clone(),
        );
        registry.register(
            "store_commits",
            "Write transactions committed since start",
            m.commits.clone(),
        );
        registry.register(
            "store_transitions",
            "State transitions committed since start (group commit puts several in one transaction)",
            m.transitions.clone(),
        );
        registry.register(
            "containers_tracked",
            "Containers in the state store",
            m.containers_tracked.clone(),
        );
        registry.register(
            "cached_resources",
            "Resources in the node cache",
            m.cached_resources.clone(),
        );
        registry.register(
            "failed_resources",
            "Resources whose fetch failed",
            m.failed_resources.clone(),
        );
        registry.register(
            "pending_deletions",
            "Deletion tasks waiting to run",
            m.pending_deletions.clone(),
        );
        registry.register(
            "recovery_seconds",
            "Duration of the last recovery",
            m.recovery_seconds.clone(),
        );
        registry.register(
            "recovery_lost_containers",
            "Containers found lost by the last recovery",
            m.recovery_lost.clone(),
        );
        AgentMetrics { registry, ..m }
    }
}

impl AgentMetrics {
    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_named_metrics_with_values() {
        let m = AgentMetrics::default();
        m.pending_deletions.set(3);
        m.store_healthy.set(1);
        let text = m.render();
        assert!(
            text.contains("ebb_node_agent_pending_deletions 3"),
            "{text}"
        );
        assert!(text.contains("ebb_node_agent_store_healthy 1"), "{text}");
        assert!(
            text.contains("# HELP ebb_node_agent_recovery_seconds"),
            "{text}"
        );
    }
}
