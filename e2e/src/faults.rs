//! Faults the end-to-end tests inject into a running cluster on either backend: a node that
//! stops (NotReady), as ebb-sim's switch or as a real node lifecycle controller would see it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::harness::{TestEnv, wait_for};

/// Makes `node` NotReady and waits (up to 30 s) until the API server shows it so: ebb-sim's
/// switch, or on the real backend what a node lifecycle controller writes after missed
/// heartbeats: kwok is told to leave the node alone (annotation `ebb.dev/e2e-unmanaged`, see
/// `e2e/k8s/cluster.sh`) and its Ready condition becomes False as a stopped kubelet's would.
pub async fn stop_node(env: &TestEnv, node: &str) -> anyhow::Result<()> {
    set_not_ready(env, node).await?;
    let nodes = Api::<Node>::all(env.client.clone());
    wait_for(
        &format!("node {node} NotReady"),
        Duration::from_secs(30),
        || async {
            let ready = nodes
                .get(node)
                .await
                .ok()?
                .status?
                .conditions?
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (!ready).then_some(())
        },
    )
    .await
}

async fn set_not_ready(env: &TestEnv, node: &str) -> anyhow::Result<()> {
    if let Some(sim) = env.sim() {
        sim.set_node_ready(node, false)?;
        return Ok(());
    }
    let nodes = Api::<Node>::all(env.client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"ebb.dev/e2e-unmanaged": "true"}}})),
        )
        .await?;
    let now = jiff::Timestamp::now().to_string();
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready", "status": "False", "reason": "KubeletStopped",
                "message": "the e2e test stopped this node", "lastHeartbeatTime": now,
                "lastTransitionTime": now}]}})),
        )
        .await?;
    Ok(())
}
