//! Generates the CustomResourceDefinitions of every ebb kind, as objects and as YAML files.
//! `crds/` at the repository root is this output; a test fails when it is stale.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{NodeState, PlacementHistory, ScaleDownPolicy};

/// Every CRD, in the order of their file names (`<plural>.<group>.yaml`, alphabetical).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut all = vec![
        NodeState::crd(),
        PlacementHistory::crd(),
        ScaleDownPolicy::crd(),
    ];
    all.sort_by_key(file_name);
    all
}

/// File name of a CRD in `crds/`: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// One CRD as a YAML document (starting with `---`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::ser::Error> {
    Ok(format!("---\n{}", serde_saphyr::to_string(crd)?))
}

/// Every CRD as one multi-document YAML stream: what `ebb-controller crds` prints, and the
/// concatenation of the files in `crds/`.
pub fn yaml_stream() -> Result<String, serde_saphyr::ser::Error> {
    crds().iter().map(to_yaml).collect()
}
