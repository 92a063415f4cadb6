//! Short builders of Kubernetes objects for tests and benchmarks (feature `testkit`):
//! `node("n1").cpu("4").mem("16Gi")`, `pod("web-1").on("n1").cpu("500m").owned_by_rs("web")`.

pub mod api;
mod node_states;
mod nodes;
mod pod_scheduling;
mod pods;
mod snapshots;
mod volumes;
mod workloads;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub use node_states::node_state_warm;
pub use nodes::{NodeBuilder, node, taint};
pub use pods::{PodBuilder, pod};
pub use snapshots::{config_selecting, objects, snapshot};
pub use volumes::{bound_claim, local_volume, storage_class, unbound_claim, volume_on};
pub use workloads::{daemon_set, pdb_min_available, replica_set, stateful_set};

/// Sets `key=value` in an optional label or annotation map.
fn put(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_default().insert(key.into(), value.into());
}

/// A label map from `(key, value)` pairs.
fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Selects objects labelled `key=value`.
fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(&[(key, value)])),
        ..Default::default()
    }
}
