//! Where a pod's PersistentVolumeClaims let it run, as the scheduler's volume binding sees it:
//! bound to a volume with node affinity, waiting for its first consumer, or waiting for binding.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use super::SnapshotError;
use super::selectors::node_terms;
use crate::cluster::model::{NodeSelectorTerm, Requirement};

/// The provisioner of statically created local volumes: nothing is provisioned on demand.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// What a claim says about where its pod can run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimPlacement {
    /// Bound to PersistentVolume `pv`, whose node affinity (ORed terms) every node of the pod
    /// must satisfy (a local volume: usually one node).
    Bound {
        pv: String,
        terms: Vec<NodeSelectorTerm>,
    },
    /// Not bound yet, and its StorageClass binds when the first pod is scheduled
    /// (`WaitForFirstConsumer`): the pod can go where a volume can be bound or provisioned for
    /// it, `terms` (ORed; empty: nowhere) or anywhere (`None`).
    WaitingForConsumer {
        terms: Option<Vec<NodeSelectorTerm>>,
    },
    /// Not bound, and bound by the volume controller on its own (`Immediate`, or no class): the
    /// scheduler does not place the pod until it is, so it fits nowhere now.
    WaitingForBinding,
}

impl ClaimPlacement {
    /// The node affinity the claim adds to its pod (ORed terms; empty: nowhere), if any.
    pub fn terms(&self) -> Option<Vec<NodeSelectorTerm>> {
        match self {
            ClaimPlacement::Bound { terms, .. } => Some(terms.clone()),
            ClaimPlacement::WaitingForConsumer { terms } => terms.clone(),
            ClaimPlacement::WaitingForBinding => Some(Vec::new()),
        }
    }
}

/// Claims that constrain their pods, by (namespace, claim). Claims bound to a volume without
/// node affinity (network storage) constrain nothing and are left out.
pub type VolumeIndex = HashMap<(String, String), ClaimPlacement>;

/// A PersistentVolume as volume binding reads it.
struct PvFacts<'a> {
    terms: Option<Vec<NodeSelectorTerm>>,
    class: &'a str,
    /// Bound to a claim already (`spec.claimRef` set).
    claimed: bool,
    available: bool,
}

/// Indexes what each claim says about where its pod can run, from the volumes, the claims and
/// their StorageClasses.
pub fn volume_index<'a>(
    pvs: impl IntoIterator<Item = &'a PersistentVolume>,
    pvcs: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    classes: impl IntoIterator<Item = &'a StorageClass>,
) -> Result<VolumeIndex, SnapshotError> {
    let mut volumes: BTreeMap<&str, PvFacts<'a>> = BTreeMap::new();
    for pv in pvs {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let spec = pv.spec.as_ref();
        let terms = match spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
        {
            Some(req) => Some(node_terms(req, "PersistentVolume", name)?),
            None => None,
        };
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        volumes.insert(
            name,
            PvFacts {
                terms,
                class: spec
                    .and_then(|s| s.storage_class_name.as_deref())
                    .unwrap_or_default(),
                claimed: spec.is_some_and(|s| s.claim_ref.is_some()),
                available: phase.is_none_or(|p| p == "Available"),
            },
        );
    }
    let classes: HashMap<&str, &StorageClass> = classes
        .into_iter()
        .map(|c| (c.metadata.name.as_deref().unwrap_or_default(), c))
        .collect();
    let mut index = HashMap::new();
    for pvc in pvcs {
        let ns = pvc.metadata.namespace.clone().unwrap_or_default();
        let name = pvc.metadata.name.clone().unwrap_or_default();
        let spec = pvc.spec.as_ref();
        let placement = match spec.and_then(|s| s.volume_name.as_deref()) {
            Some(pv) if !pv.is_empty() => match volumes.get(pv) {
                Some(PvFacts {
                    terms: Some(terms), ..
                }) => Some(ClaimPlacement::Bound {
                    pv: pv.to_string(),
                    terms: terms.clone(),
                }),
                Some(_) => None,
                // Bound to a volume that is not there (deleted, or not listed yet): the pod
                // cannot be scheduled again until that is sorted out.
                None => Some(ClaimPlacement::Bound {
                    pv: pv.to_string(),
                    terms: Vec::new(),
                }),
            },
            _ => Some(unbound(
                spec.and_then(|s| s.storage_class_name.as_deref()),
                &classes,
                &volumes,
            )),
        };
        if let Some(p) = placement {
            index.insert((ns, name), p);
        }
    }
    Ok(index)
}

/// An unbound claim of `class`: `WaitForFirstConsumer` classes bind where the pod goes (to an
/// available static volume of the class, or a volume provisioned within the class's allowed
/// topologies); others bind on their own first.
fn unbound(
    class: Option<&str>,
    classes: &HashMap<&str, &StorageClass>,
    volumes: &BTreeMap<&str, PvFacts<'_>>,
) -> ClaimPlacement {
    let Some(sc) = class.filter(|c| !c.is_empty()).and_then(|c| classes.get(c)) else {
        return ClaimPlacement::WaitingForBinding;
    };
    if sc.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
        return ClaimPlacement::WaitingForBinding;
    }
    let class_name = sc.metadata.name.as_deref().unwrap_or_default();
    if sc.provisioner == NO_PROVISIONER {
        // Only where an available volume of the class is (each volume's own node affinity;
        // one without affinity can be used anywhere).
        let mut terms = Vec::new();
        for v in volumes
            .values()
            .filter(|v| v.class == class_name && !v.claimed && v.available)
        {
            match &v.terms {
                Some(t) => terms.extend(t.iter().cloned()),
                None => return ClaimPlacement::WaitingForConsumer { terms: None },
            }
        }
        return ClaimPlacement::WaitingForConsumer { terms: Some(terms) };
    }
    // A provisioner: where the class's allowed topologies say (anywhere without them).
    let terms: Vec<NodeSelectorTerm> = sc
        .allowed_topologies
        .iter()
        .flatten()
        .map(|t| NodeSelectorTerm {
            match_expressions: t
                .match_label_expressions
                .iter()
                .flatten()
                .map(|e| Requirement {
                    key: e.key.clone(),
                    operator: crate::cluster::model::Operator::In,
                    values: e.values.clone(),
                })
                .collect(),
            match_fields: Vec::new(),
        })
        .filter(|t| !t.match_expressions.is_empty())
        .collect();
    ClaimPlacement::WaitingForConsumer {
        terms: (!terms.is_empty()).then_some(terms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::model::terms_match;
    use crate::testkit::{bound_claim, local_volume, storage_class, unbound_claim, volume_on};

    fn matches(p: &ClaimPlacement, node: &str, zone: &str) -> bool {
        let labels = [
            ("kubernetes.io/hostname".to_string(), node.to_string()),
            ("topology.kubernetes.io/zone".to_string(), zone.to_string()),
        ]
        .into_iter()
        .collect();
        p.terms().is_none_or(|t| terms_match(&t, node, &labels))
    }

    fn index(
        pvs: &[PersistentVolume],
        pvcs: &[PersistentVolumeClaim],
        classes: &[StorageClass],
    ) -> VolumeIndex {
        volume_index(pvs, pvcs, classes).unwrap_or_else(|e| panic!("{e}"))
    }

    fn key(claim: &str) -> (String, String) {
        ("default".into(), claim.into())
    }

    #[test]
    fn a_claim_bound_to_a_local_volume_runs_only_on_its_node() {
        let i = index(
            &[local_volume("pv-1", "n1", Some("data"))],
            &[bound_claim("data", "pv-1")],
            &[],
        );
        let p = &i[&key("data")];
        assert!(matches!(p, ClaimPlacement::Bound { pv, .. } if pv == "pv-1"));
        assert!(matches(p, "n1", "a"));
        assert!(!matches(p, "n2", "a"));
    }

    #[test]
    fn a_claim_bound_to_a_volume_without_affinity_constrains_nothing() {
        let mut pv = local_volume("nfs", "n1", Some("data"));
        if let Some(s) = pv.spec.as_mut() {
            s.node_affinity = None;
        }
        let i = index(&[pv], &[bound_claim("data", "nfs")], &[]);
        assert!(!i.contains_key(&key("data")));
    }

    #[test]
    fn a_claim_bound_to_a_missing_volume_fits_nowhere() {
        let i = index(&[], &[bound_claim("data", "gone")], &[]);
        let p = &i[&key("data")];
        assert!(!matches(p, "n1", "a") && !matches(p, "n2", "b"));
    }

    #[test]
    fn an_unbound_claim_waiting_for_its_consumer_goes_where_a_volume_is_free() {
        let class = storage_class("local", NO_PROVISIONER, true, &[]);
        let i = index(
            &[
                local_volume("taken", "n1", Some("other")),
                local_volume("free", "n2", None),
                volume_on("elsewhere", "fast", "kubernetes.io/hostname", "n3", None),
            ],
            &[unbound_claim("data", "local")],
            &[class],
        );
        let p = &i[&key("data")];
        assert!(matches!(p, ClaimPlacement::WaitingForConsumer { .. }));
        assert!(
            !matches(p, "n1", "a"),
            "its volume is bound to another claim"
        );
        assert!(
            matches(p, "n2", "a"),
            "an available volume of the class is there"
        );
        assert!(!matches(p, "n3", "a"), "that volume is of another class");
    }

    #[test]
    fn a_provisioned_claim_waiting_for_its_consumer_follows_the_allowed_topologies() {
        let zonal = storage_class("zonal", "csi.example.com", true, &["a"]);
        let anywhere = storage_class("anywhere", "csi.example.com", true, &[]);
        let i = index(
            &[],
            &[unbound_claim("z", "zonal"), unbound_claim("w", "anywhere")],
            &[zonal, anywhere],
        );
        assert!(matches(&i[&key("z")], "n1", "a"));
        assert!(!matches(&i[&key("z")], "n2", "b"));
        assert!(matches(&i[&key("w")], "n2", "b"));
    }

    #[test]
    fn an_unbound_claim_bound_immediately_waits_for_the_volume_controller() {
        let i = index(
            &[],
            &[
                unbound_claim("now", "immediate"),
                unbound_claim("nameless", "missing-class"),
            ],
            &[storage_class("immediate", "csi.example.com", false, &[])],
        );
        assert_eq!(i[&key("now")], ClaimPlacement::WaitingForBinding);
        assert_eq!(i[&key("nameless")], ClaimPlacement::WaitingForBinding);
        assert!(!matches(&i[&key("now")], "n1", "a"));
    }
}
