//! The planner's view of a `ScaleDownPolicySpec`: selector, durations, thresholds, drain rules
//! and budgets parsed once, with errors that name the field.

use std::time::Duration;

use ebb_api::{RemovalMethod, ScaleDownMode, ScaleDownPolicySpec};
use thiserror::Error;

use super::budgets::{Budgets, Limits, parse_budgets};
use super::drainability::DrainRules;
use super::eligibility::{Accelerators, UtilizationRules};
use super::pricing::PriceTable;
use crate::cluster::build::selector_from;
use crate::cluster::types::Selector;

/// A policy the planner cannot use.
#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("spec.nodeSelector: {0}")]
    NodeSelector(String),
    #[error("spec.{field}: {why}")]
    Invalid { field: &'static str, why: String },
}

/// Everything the planner needs from a policy.
#[derive(Clone, Debug)]
pub struct PlannerConfig {
    pub node_selector: Selector,
    pub node_group_label: Option<String>,
    pub utilization_threshold: f64,
    pub utilization: UtilizationRules,
    /// The extended resources that make a node an accelerator node, and their threshold.
    pub accelerators: Accelerators,
    /// Hourly prices by node label (the `ebb.dev/hourly-cost` annotation takes precedence).
    pub prices: Option<PriceTable>,
    pub rules: DrainRules,
    pub limits: Limits,
    pub simulation_timeout: Duration,
    pub min_nodes_evaluated: usize,
    pub recent_eviction_window: jiff::SignedDuration,
    /// Budgets, or why they are invalid (then deletions are held: fail closed).
    pub budgets: Budgets,
    /// The removal method nodes are checked against: `mode: DrainAndDelete` (default `Auto`),
    /// or `DryRun` with a `removal` to preview; `None` when nothing is removed.
    pub removal: Option<RemovalMethod>,
    /// Only this node (by name) is governed, if it is selected: the re-check of one drain.
    pub only_node: Option<String>,
}

impl PlannerConfig {
    /// Validates and prepares a policy spec. Invalid budgets are not an error here: they hold
    /// every deletion and are reported as Throttled (Budget).
    pub fn from_spec(spec: &ScaleDownPolicySpec) -> Result<Self, PolicyError> {
        let node_selector = selector_from(&spec.node_selector, "ScaleDownPolicy", "spec")
            .map_err(|e| PolicyError::NodeSelector(e.to_string()))?;
        if !(0.0..=1.0).contains(&spec.utilization_threshold) {
            return Err(PolicyError::Invalid {
                field: "utilizationThreshold",
                why: format!("{} is not between 0 and 1", spec.utilization_threshold),
            });
        }
        if !(0.0..=1.0).contains(&spec.accelerator_utilization_threshold) {
            return Err(PolicyError::Invalid {
                field: "acceleratorUtilizationThreshold",
                why: format!(
                    "{} is not between 0 and 1",
                    spec.accelerator_utilization_threshold
                ),
            });
        }
        let prices = spec
            .prices
            .as_ref()
            .map(PriceTable::from_spec)
            .transpose()
            .map_err(|(field, why)| PolicyError::Invalid { field, why })?;
        if spec.max_scale_down_parallelism < 1 {
            return Err(PolicyError::Invalid {
                field: "maxScaleDownParallelism",
                why: "must be at least 1".into(),
            });
        }
        if spec.max_drain_parallelism < 0
            || spec.max_drain_parallelism > spec.max_scale_down_parallelism
        {
            return Err(PolicyError::Invalid {
                field: "maxDrainParallelism",
                why: "must be between 0 and maxScaleDownParallelism".into(),
            });
        }
        Ok(PlannerConfig {
            node_selector,
            node_group_label: spec.node_group_label.clone(),
            utilization_threshold: spec.utilization_threshold,
            utilization: UtilizationRules {
                ignore_daemon_sets: spec.ignore_daemon_sets_utilization,
                ignore_mirror_pods: spec.ignore_mirror_pods_utilization,
            },
            accelerators: Accelerators {
                resources: spec.accelerator_resources.clone(),
                threshold: spec.accelerator_utilization_threshold,
            },
            prices,
            rules: DrainRules {
                skip_nodes_with_local_storage: spec.skip_nodes_with_local_storage,
                skip_nodes_with_system_pods: spec.skip_nodes_with_system_pods,
                skip_nodes_with_custom_controller_pods: spec.skip_nodes_with_custom_controller_pods,
            },
            limits: Limits {
                max_scale_down_parallelism: i64::from(spec.max_scale_down_parallelism),
                max_drain_parallelism: i64::from(spec.max_drain_parallelism),
                unneeded_time: spec.unneeded_time.as_span(),
                unready_time: spec.unready_time.as_span(),
                min_nodes_per_group: i64::from(spec.min_nodes_per_group.max(0)),
                annotated_group_min: true,
            },
            simulation_timeout: spec.simulation_timeout.as_duration(),
            min_nodes_evaluated: spec.min_nodes_evaluated.max(0) as usize,
            recent_eviction_window: spec.recent_eviction_window.as_span(),
            budgets: parse_budgets(&spec.budgets),
            removal: match (spec.mode, &spec.removal) {
                (ScaleDownMode::DrainAndDelete, r) => Some(r.clone().unwrap_or_default().method),
                (ScaleDownMode::DryRun, Some(r)) => Some(r.method),
                _ => None,
            },
            only_node: None,
        })
    }
}

impl Default for PlannerConfig {
    fn default() -> Self {
        // The default spec is valid by construction.
        match Self::from_spec(&ScaleDownPolicySpec::default()) {
            Ok(c) => c,
            Err(e) => unreachable!("default policy is invalid: {e}"),
        }
    }
}
