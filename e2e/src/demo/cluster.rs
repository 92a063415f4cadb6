//! The demo cluster: a pool of nodes, then Deployments with PDBs, a StatefulSet, DaemonSets and a
//! few pods that cannot move; loaded into the simulator and waited on until everything runs.

use std::time::Duration;

use anyhow::{Context, bail};
use ebb_e2e::Sim;
use ebb_e2e::scenario::Scenario;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// The label of the pool the policy selects.
pub const POOL_LABEL: &str = "ebb.dev/pool";
pub const POOL: &str = "general";
/// The namespace of the shop's workloads.
const SHOP: &str = "shop";
/// The namespace of the DaemonSets (and nothing else).
pub const DAEMONS: &str = "monitoring";

/// What was created, for the headline.
#[derive(Debug, Default)]
pub struct Layout {
    pub nodes: usize,
    pub deployments: usize,
    pub pods: usize,
    pub daemonsets: usize,
    pub unmovable: usize,
}

/// Deployments in the shop: one per six nodes, at least two.
fn deployment_count(nodes: usize) -> usize {
    (nodes / 6).max(2)
}

const REPLICAS: usize = 4;
const DB_REPLICAS: usize = 3;

/// The nodes: `nodes` of 4 CPUs and 16 GiB in the pool.
pub fn nodes_scenario(nodes: usize) -> String {
    format!(
        "nodes: {{count: {nodes}, namePrefix: node-, cpu: '4', memory: 16Gi, labels: {{{POOL_LABEL}: {POOL}}}}}\n"
    )
}

fn container(cpu: &str, memory: &str) -> Value {
    json!({"name": "app", "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"cpu": cpu, "memory": memory}}})
}

fn workload(kind: &str, ns: &str, name: &str, replicas: Option<usize>, pod_spec: Value) -> Value {
    let mut spec = json!({"selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}});
    if let Some(r) = replicas {
        spec["replicas"] = json!(r);
    }
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
        spec["podManagementPolicy"] = json!("Parallel");
    }
    json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn pdb(ns: &str, name: &str, budget: Value) -> Value {
    let mut spec = budget;
    spec["selector"] = json!({"matchLabels": {"app": name}});
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// The workloads, as objects to create in order.
pub fn workload_objects(nodes: usize) -> (Vec<Value>, Layout) {
    let mut o = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SHOP}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DAEMONS}}),
        // ebb's own namespace, as an install has it (the controller keeps a Secret there).
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ebb-system"}}),
    ];
    let deployments = deployment_count(nodes);
    for i in 0..deployments {
        let name = format!("web-{i}");
        o.push(workload(
            "Deployment",
            SHOP,
            &name,
            Some(REPLICAS),
            json!({"containers": [container("500m", "1Gi")]}),
        ));
        // Alternate the two kinds of budget.
        let budget = if i % 2 == 0 {
            json!({"maxUnavailable": 1})
        } else {
            json!({"minAvailable": REPLICAS - 1})
        };
        o.push(pdb(SHOP, &name, budget));
    }
    o.push(workload(
        "StatefulSet",
        SHOP,
        "db",
        Some(DB_REPLICAS),
        json!({"containers": [container("500m", "2Gi")]}),
    ));
    o.push(pdb(SHOP, "db", json!({"maxUnavailable": 1})));
    for name in ["log-agent", "node-exporter"] {
        o.push(workload(
            "DaemonSet",
            DAEMONS,
            name,
            None,
            json!({"containers": [container("50m", "64Mi")]}),
        ));
    }
    // Pods that pin their node: no controller, and node-local storage.
    o.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "debug-shell", "namespace": "default"},
        "spec": {"containers": [container("100m", "128Mi")]}}));
    o.push(workload(
        "Deployment",
        SHOP,
        "cache",
        Some(1),
        json!({"containers": [container("250m", "512Mi")],
            "volumes": [{"name": "scratch", "emptyDir": {}}]}),
    ));
    let layout = Layout {
        nodes,
        deployments: deployments + 1,
        pods: deployments * REPLICAS + DB_REPLICAS + 2,
        daemonsets: 2,
        unmovable: 2,
    };
    (o, layout)
}

fn ready_node(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ready_pod(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Polls until `done` holds, or fails naming `what`.
async fn until(
    what: &str,
    timeout: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done().await? {
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the demo cluster did not come up: timed out after {timeout:?} waiting for {what}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Loads the nodes, waits for them to be Ready (so pods spread), then the workloads, and waits
/// until every pod of them (DaemonSet pods included) is Ready.
pub async fn build(sim: &Sim, client: &kube::Client, nodes: usize) -> anyhow::Result<Layout> {
    let crds = ebb_api::crdgen::yaml_stream().context("cannot render ebb's CRDs")?;
    Scenario::from_manifests(&crds)
        .context("ebb's CRDs do not parse")?
        .load(&sim.api)
        .context("cannot create ebb's CRDs")?;
    Scenario::from_yaml(&nodes_scenario(nodes))
        .context("the node scenario does not parse")?
        .load(&sim.api)
        .context("cannot create the nodes")?;
    let node_api: Api<Node> = Api::all(client.clone());
    until(
        "the nodes to be Ready",
        Duration::from_secs(120),
        async || {
            let list = node_api.list(&ListParams::default()).await?;
            Ok(list.items.iter().filter(|n| ready_node(n)).count() >= nodes)
        },
    )
    .await?;
    let (objects, layout) = workload_objects(nodes);
    Scenario {
        objects,
        ..Scenario::default()
    }
    .load(&sim.api)
    .context("cannot create the demo workloads")?;
    let expected = layout.pods + layout.daemonsets * nodes;
    let pod_api: Api<Pod> = Api::all(client.clone());
    until(
        &format!("{expected} pods to be Ready"),
        Duration::from_secs(120),
        async || {
            let list = pod_api.list(&ListParams::default()).await?;
            Ok(list.items.iter().filter(|p| ready_pod(p)).count() >= expected)
        },
    )
    .await?;
    Ok(layout)
}
