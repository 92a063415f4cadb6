//! Local volumes: PersistentVolumes with node affinity indexed by the claims bound to them, so
//! pods using them are known to be pinned to their nodes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::SnapshotError;
use super::selectors::node_terms;
use crate::cluster::model::NodeSelectorTerm;

/// Local volumes by claim: (namespace, claim) → node affinity of the bound PV.
pub type VolumeIndex = HashMap<(String, String), Vec<NodeSelectorTerm>>;

/// Indexes PVs with node affinity by the claim bound to them.
pub fn volume_index(
    pvs: &[PersistentVolume],
    pvcs: &[PersistentVolumeClaim],
) -> Result<VolumeIndex, SnapshotError> {
    let mut by_pv: HashMap<String, Vec<NodeSelectorTerm>> = HashMap::new();
    for pv in pvs {
        let name = pv.metadata.name.clone().unwrap_or_default();
        if let Some(req) = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
        {
            by_pv.insert(name.clone(), node_terms(req, "PersistentVolume", &name)?);
        }
    }
    let mut index = HashMap::new();
    for pvc in pvcs {
        let ns = pvc.metadata.namespace.clone().unwrap_or_default();
        let name = pvc.metadata.name.clone().unwrap_or_default();
        if let Some(terms) = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_ref())
            .and_then(|v| by_pv.get(v))
        {
            index.insert((ns, name), terms.clone());
        }
    }
    Ok(index)
}
