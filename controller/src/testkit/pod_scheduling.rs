//! Pod builder, scheduling constraints: node selector and affinity, tolerations, host ports,
//! inter-pod (anti-)affinity and hard topology spread.

use k8s_openapi::api::core::v1::{
    ContainerPort, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodAffinityTerm, Toleration, TopologySpreadConstraint,
};

use super::pods::PodBuilder;
use super::selector;

/// A pod (anti-)affinity term on pods labelled `key=value`, by `topology_key`.
fn pod_term(key: &str, value: &str, topology_key: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: Some(selector(key, value)),
        topology_key: topology_key.into(),
        ..Default::default()
    }
}

impl PodBuilder {
    pub fn node_selector(mut self, k: &str, v: &str) -> Self {
        self.spec()
            .node_selector
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    /// Required node affinity with one term holding one expression (a field for
    /// `metadata.name`).
    pub fn node_affinity(mut self, key: &str, op: &str, values: &[&str]) -> Self {
        let req = NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        let term = if key == "metadata.name" {
            NodeSelectorTerm {
                match_fields: Some(vec![req]),
                ..Default::default()
            }
        } else {
            NodeSelectorTerm {
                match_expressions: Some(vec![req]),
                ..Default::default()
            }
        };
        self.spec().affinity.get_or_insert_default().node_affinity = Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![term],
            }),
            ..Default::default()
        });
        self
    }
    pub fn tolerate(mut self, key: &str, effect: &str) -> Self {
        self.spec()
            .tolerations
            .get_or_insert_default()
            .push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()).filter(|e: &String| !e.is_empty()),
                ..Default::default()
            });
        self
    }
    pub fn host_port(mut self, port: i32) -> Self {
        self.spec().containers[0]
            .ports
            .get_or_insert_default()
            .push(ContainerPort {
                container_port: port,
                host_port: Some(port),
                ..Default::default()
            });
        self
    }
    /// Required anti-affinity against pods with label `key=value`, by `topology_key`.
    pub fn anti_affinity(mut self, key: &str, value: &str, topology_key: &str) -> Self {
        self.spec()
            .affinity
            .get_or_insert_default()
            .pod_anti_affinity
            .get_or_insert_default()
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(pod_term(key, value, topology_key));
        self
    }
    /// Required affinity to pods with label `key=value`, by `topology_key`.
    pub fn affinity(mut self, key: &str, value: &str, topology_key: &str) -> Self {
        self.spec()
            .affinity
            .get_or_insert_default()
            .pod_affinity
            .get_or_insert_default()
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(pod_term(key, value, topology_key));
        self
    }
    /// Hard topology spread over pods with label `key=value`.
    pub fn spread(mut self, key: &str, value: &str, topology_key: &str, max_skew: i32) -> Self {
        self.spec()
            .topology_spread_constraints
            .get_or_insert_default()
            .push(TopologySpreadConstraint {
                label_selector: Some(selector(key, value)),
                max_skew,
                topology_key: topology_key.into(),
                when_unsatisfiable: "DoNotSchedule".into(),
                ..Default::default()
            });
        self
    }
}
