//! Which nodes each policy selects, the nodes several policies select (overlaps, left alone by
//! all), who governs each node, and the bad input that stops a policy from acting. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ebb_api::reasons::DegradedReason;
use ebb_api::{ScaleDownMode, ScaleDownPolicy};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::actuation::recover::Governor;
use crate::cluster::types::Selector;
use crate::scaledown::budgets::Budgets;
use crate::scaledown::{PlannerConfig, PolicyError};

/// A policy as the selection sees it.
#[derive(Clone, Debug)]
pub struct PolicyView<'a> {
    pub name: &'a str,
    /// `None` when the selector is invalid (the policy selects nothing and is Degraded).
    pub selector: Option<&'a Selector>,
    /// May drain: not `DryRun`, not being deleted, not degraded by bad input.
    pub acts: bool,
}

/// The nodes of every policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selections {
    /// Policy → nodes it selects.
    pub by_policy: BTreeMap<String, BTreeSet<String>>,
    /// Node → policies selecting it (only nodes selected at least once).
    pub by_node: BTreeMap<String, Vec<String>>,
    acts: BTreeMap<String, bool>,
}

impl Selections {
    pub fn compute<'a>(
        policies: &[PolicyView<'_>],
        nodes: impl IntoIterator<Item = &'a Node>,
    ) -> Self {
        let mut out = Selections::default();
        for p in policies {
            out.by_policy.entry(p.name.to_string()).or_default();
            out.acts.insert(p.name.to_string(), p.acts);
        }
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let empty = BTreeMap::new();
            let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
            for p in policies {
                if p.selector.is_some_and(|s| s.matches(labels)) {
                    out.by_policy
                        .entry(p.name.to_string())
                        .or_default()
                        .insert(name.to_string());
                    out.by_node
                        .entry(name.to_string())
                        .or_default()
                        .push(p.name.to_string());
                }
            }
        }
        out
    }

    /// Nodes of `policy`.
    pub fn nodes_of(&self, policy: &str) -> BTreeSet<String> {
        self.by_policy.get(policy).cloned().unwrap_or_default()
    }

    /// Nodes `policy` shares with other policies, with those others.
    pub fn overlaps_of(&self, policy: &str) -> BTreeMap<String, Vec<String>> {
        self.nodes_of(policy)
            .into_iter()
            .filter_map(|n| {
                let all = self.by_node.get(&n)?;
                (all.len() > 1).then(|| {
                    let others = all.iter().filter(|p| *p != policy).cloned().collect();
                    (n, others)
                })
            })
            .collect()
    }

    /// The one policy that governs each node selected by exactly one policy.
    pub fn governors(&self) -> BTreeMap<String, Governor> {
        self.by_node
            .iter()
            .filter(|(_, ps)| ps.len() == 1)
            .map(|(n, ps)| {
                let policy = ps[0].clone();
                let acts = self.acts.get(&policy).copied().unwrap_or(false);
                (n.clone(), Governor { policy, acts })
            })
            .collect()
    }
}

/// Why a policy is Degraded, and what to tell the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    pub reason: DegradedReason,
    pub message: String,
    /// True when the policy must act on nothing at all (bad input); false when it only leaves
    /// some nodes alone (overlaps).
    pub stops_policy: bool,
}

fn list(names: impl IntoIterator<Item = String>) -> String {
    let all: Vec<String> = names.into_iter().collect();
    const SHOWN: usize = 5;
    let mut s = all
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > SHOWN {
        s.push_str(&format!(" and {} more", all.len() - SHOWN));
    }
    s
}

/// Why a `DrainAndDelete` policy could not remove what it drains: Nodes may not be deleted
/// (RBAC), or its explicit `removal.method` is not enabled in this controller.
pub fn removal_refusal(
    deletion_forbidden: bool,
    method_not_enabled: Option<ebb_api::RemovalMethod>,
) -> Option<Degraded> {
    if deletion_forbidden {
        return Some(Degraded {
            reason: DegradedReason::NodeDeletionForbidden,
            message: "mode DrainAndDelete needs permission to delete Nodes, which the controller's service account lacks; install the chart with controller.allowNodeDeletion=true, or use mode: Drain. Nothing is drained until then.".into(),
            stops_policy: true,
        });
    }
    let method = method_not_enabled?;
    let how = match method {
        ebb_api::RemovalMethod::ClusterApi => {
            "--cluster-api (chart: removal.clusterAPI.enabled=true)"
        }
        _ => "--karpenter (chart: removal.karpenter.enabled=true)",
    };
    Some(Degraded {
        reason: DegradedReason::RemovalMethodNotEnabled,
        message: format!(
            "spec.removal.method is {method}, but the controller was not started with {how}, or could not find that API; see its log. Nothing is drained until then."
        ),
        stops_policy: true,
    })
}

/// Bad input and conflicts of one policy, worst first. `spec_error` is the planner's verdict on
/// the spec; `refusal` what keeps it from removing nodes ([`removal_refusal`]); `nodes` are the
/// Node objects the policy selects.
pub fn degraded<'a>(
    spec_error: Option<String>,
    refusal: Option<Degraded>,
    budgets: Option<&Budgets>,
    group_label: Option<&str>,
    nodes: impl IntoIterator<Item = &'a Node>,
    overlaps: &BTreeMap<String, Vec<String>>,
) -> Option<Degraded> {
    if let Some(e) = spec_error {
        return Some(Degraded {
            reason: DegradedReason::InvalidSpec,
            message: format!("{e}; fix the ScaleDownPolicy spec. Nothing is done until then."),
            stops_policy: true,
        });
    }
    if refusal.is_some() {
        return refusal;
    }
    if let Some(Budgets::Invalid(why)) = budgets {
        return Some(Degraded {
            reason: DegradedReason::InvalidBudget,
            message: format!("spec.budgets: {why}; every deletion is held until it is fixed."),
            stops_policy: true,
        });
    }
    let nodes: Vec<&Node> = nodes.into_iter().collect();
    if nodes.is_empty() {
        return Some(Degraded {
            reason: DegradedReason::SelectorMatchesNothing,
            message: "spec.nodeSelector matches no node; check its labels against `kubectl get nodes --show-labels`.".into(),
            stops_policy: true,
        });
    }
    if let Some(label) = group_label {
        let missing: Vec<String> = nodes
            .iter()
            .filter(|n| {
                !n.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(label))
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        if !missing.is_empty() {
            return Some(Degraded {
                reason: DegradedReason::GroupLabelMissing,
                message: format!(
                    "{} selected node(s) lack the nodeGroupLabel {label:?}: {}; label them or narrow spec.nodeSelector.",
                    missing.len(),
                    list(missing.clone())
                ),
                stops_policy: true,
            });
        }
    }
    if !overlaps.is_empty() {
        let others: BTreeSet<String> = overlaps.values().flatten().cloned().collect();
        return Some(Degraded {
            reason: DegradedReason::OverlappingPolicies,
            message: format!(
                "{} node(s) are also selected by ScaleDownPolicy {}: {}; neither policy acts on them until the selectors are made disjoint.",
                overlaps.len(),
                list(others),
                list(overlaps.keys().cloned())
            ),
            stops_policy: false,
        });
    }
    None
}

/// Planner configs of every policy (for overlaps), with whether each may act.
pub struct AllPolicies {
    configs: Vec<(String, Result<PlannerConfig, PolicyError>, bool)>,
}

impl AllPolicies {
    pub fn from_store(
        store: &kube::runtime::reflector::Store<ScaleDownPolicy>,
        current: &ScaleDownPolicy,
    ) -> Self {
        let mut policies: BTreeMap<String, Arc<ScaleDownPolicy>> = store
            .state()
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        // The store may lag behind the object being reconciled.
        policies.insert(current.name_any(), Arc::new(current.clone()));
        Self::from_policies(policies.into_values())
    }

    pub fn from_policies(policies: impl IntoIterator<Item = Arc<ScaleDownPolicy>>) -> Self {
        let configs = policies
            .into_iter()
            .map(|p| {
                let cfg = PlannerConfig::from_spec(&p.spec);
                let acts = p.spec.mode != ScaleDownMode::DryRun
                    && p.metadata.deletion_timestamp.is_none()
                    && cfg.is_ok();
                (p.name_any(), cfg, acts)
            })
            .collect();
        Self { configs }
    }

    /// The planner configuration of `policy`, when its spec is valid.
    pub fn config(&self, policy: &str) -> Option<&PlannerConfig> {
        let (_, cfg, _) = self.configs.iter().find(|(name, _, _)| name == policy)?;
        cfg.as_ref().ok()
    }

    pub fn selections<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) -> Selections {
        let views: Vec<PolicyView<'_>> = self
            .configs
            .iter()
            .map(|(name, cfg, acts)| PolicyView {
                name,
                selector: cfg.as_ref().ok().map(|c| &c.node_selector),
                acts: *acts,
            })
            .collect();
        Selections::compute(&views, nodes)
    }
}

pub fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::types::{Operator, Requirement};
    use crate::testkit::node;

    fn sel(key: &str, value: &str) -> Selector {
        Selector {
            requirements: vec![Requirement {
                key: key.into(),
                operator: Operator::In,
                values: vec![value.into()],
            }],
        }
    }

    #[test]
    fn overlapping_nodes_are_found_and_governed_by_nobody() {
        let nodes = vec![
            node("a1").label("pool", "a").build(),
            node("a2").label("pool", "a").label("spot", "yes").build(),
            node("b1").label("pool", "b").build(),
            node("c1").label("pool", "c").build(),
        ];
        let pool_a = sel("pool", "a");
        let spot = sel("spot", "yes");
        let pool_b = sel("pool", "b");
        let policies = vec![
            PolicyView {
                name: "pool-a",
                selector: Some(&pool_a),
                acts: true,
            },
            PolicyView {
                name: "spot",
                selector: Some(&spot),
                acts: true,
            },
            PolicyView {
                name: "pool-b",
                selector: Some(&pool_b),
                acts: false,
            },
            PolicyView {
                name: "broken",
                selector: None,
                acts: true,
            },
        ];
        let s = Selections::compute(&policies, &nodes);
        assert_eq!(s.nodes_of("pool-a"), ["a1", "a2"].map(String::from).into());
        assert!(s.nodes_of("broken").is_empty());
        assert_eq!(
            s.overlaps_of("pool-a"),
            [("a2".to_string(), vec!["spot".to_string()])].into()
        );
        assert_eq!(
            s.overlaps_of("spot"),
            [("a2".to_string(), vec!["pool-a".to_string()])].into()
        );
        assert!(s.overlaps_of("pool-b").is_empty());
        let g = s.governors();
        assert_eq!(
            g["a1"],
            Governor {
                policy: "pool-a".into(),
                acts: true
            }
        );
        assert_eq!(
            g["b1"],
            Governor {
                policy: "pool-b".into(),
                acts: false
            }
        );
        assert!(!g.contains_key("a2"), "overlapping: governed by nobody");
        assert!(!g.contains_key("c1"), "selected by nobody");
    }

    #[test]
    fn bad_input_is_reported_worst_first_with_what_to_do() {
        let good = vec![node("n1").label("pool", "a").build()];
        let unlabelled = vec![node("n1").label("pool", "a").build(), node("n2").build()];
        let none = BTreeMap::new();
        let d = degraded(
            Some("spec.nodeSelector: bad operator".into()),
            removal_refusal(true, None),
            None,
            None,
            &good,
            &none,
        )
        .unwrap();
        assert_eq!(d.reason, DegradedReason::InvalidSpec);
        assert!(d.message.contains("bad operator") && d.stops_policy);
        let d = degraded(None, removal_refusal(true, None), None, None, &good, &none).unwrap();
        assert_eq!(d.reason, DegradedReason::NodeDeletionForbidden);
        assert!(d.stops_policy && d.message.contains("controller.allowNodeDeletion=true"));
        let capi = removal_refusal(false, Some(ebb_api::RemovalMethod::ClusterApi));
        let d = degraded(None, capi, None, None, &good, &none).unwrap();
        assert_eq!(d.reason, DegradedReason::RemovalMethodNotEnabled);
        assert!(d.stops_policy && d.message.contains("removal.clusterAPI.enabled=true"));
        let d = degraded(None, None, None, None, &Vec::<Node>::new(), &none).unwrap();
        assert_eq!(d.reason, DegradedReason::SelectorMatchesNothing);
        let d = degraded(None, None, None, Some("pool"), &unlabelled, &none).unwrap();
        assert_eq!(d.reason, DegradedReason::GroupLabelMissing);
        assert!(
            d.message.contains("n2") && !d.message.contains("n1,"),
            "{}",
            d.message
        );
        let invalid = Budgets::Invalid("budgets[0].schedule: bad cron".into());
        let d = degraded(None, None, Some(&invalid), None, &good, &none).unwrap();
        assert_eq!(d.reason, DegradedReason::InvalidBudget);
        let overlaps = [("n1".to_string(), vec!["other".to_string()])].into();
        let d = degraded(None, None, None, Some("pool"), &good, &overlaps).unwrap();
        assert_eq!(d.reason, DegradedReason::OverlappingPolicies);
        assert!(d.message.contains("other") && d.message.contains("n1"));
        assert!(!d.stops_policy);
        assert_eq!(degraded(None, None, None, Some("pool"), &good, &none), None);
    }
}
