//! Objects the controller's edge tests share: a ScaleDownPolicy over one pool and the
//! DaemonSet pod every node runs.

use std::time::Duration;

use ebb_api::names::FINALIZER_SCALEDOWN;
use ebb_api::{ScaleDownMode, ScaleDownPolicy, ScaleDownPolicySpec};
use ebb_controller::cluster::CachedPod;
use ebb_controller::testkit::pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A policy in `mode` over the nodes labelled `pool=<pool>`, acting at once (no unneeded
/// time), with ebb's finalizer and generation 1.
pub fn policy(name: &str, mode: ScaleDownMode, pool: &str) -> ScaleDownPolicy {
    let mut spec = ScaleDownPolicySpec {
        mode,
        node_selector: LabelSelector {
            match_labels: Some([("pool".to_string(), pool.to_string())].into()),
            ..Default::default()
        },
        ..ScaleDownPolicySpec::default()
    };
    spec.unneeded_time = Duration::ZERO.into();
    let mut p = ScaleDownPolicy::new(name, spec);
    p.metadata.finalizers = Some(vec![FINALIZER_SCALEDOWN.to_string()]);
    p.metadata.generation = Some(1);
    p
}

/// The `logs` DaemonSet's pod on `node` (`logs-<node>`, 100m cpu).
pub fn logs_pod(node: &str) -> CachedPod {
    pod(&format!("logs-{node}"))
        .on(node)
        .cpu("100m")
        .owned_by_ds("logs")
        .build()
}
