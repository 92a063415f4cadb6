//! The agent's only Kubernetes calls: list and watch this node's pods (field selector
//! `spec.nodeName`), watch PlacementHistories, read the token Secret, and create and report the
//! node's NodeState (owner reference to the Node; server-side apply on `/status`).

use std::collections::BTreeMap;

use ebb_api::names::FIELD_MANAGER_NODE_AGENT;
use ebb_api::{NodeState, NodeStateStatus, PlacementHistory};
use futures::Stream;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde_json::json;

fn node_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// The pods bound to `node`, once (for recovery).
pub async fn list_node_pods(client: &Client, node: &str) -> kube::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().fields(&node_selector(node)))
        .await?;
    Ok(list.items)
}

/// Watch of the pods bound to `node`, with backoff on errors.
pub fn watch_node_pods(
    client: &Client,
    node: &str,
) -> impl Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Send + use<> {
    let api: Api<Pod> = Api::all(client.clone());
    watcher(api, watcher::Config::default().fields(&node_selector(node))).default_backoff()
}

/// A cache of every PlacementHistory, kept current by a background task.
pub fn watch_histories(client: &Client) -> (Store<PlacementHistory>, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    let api: Api<PlacementHistory> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                tracing::warn!(error = %e, "PlacementHistory watch failed; retrying");
            }
        }
    });
    (store, task)
}

/// Reads the token Secret's data; `None` when it does not exist (yet).
pub async fn read_secret(
    client: &Client,
    namespace: &str,
    name: &str,
) -> kube::Result<Option<BTreeMap<String, Vec<u8>>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    Ok(api.get_opt(name).await?.map(|s| {
        s.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()
    }))
}

/// The node's own addresses (`InternalIP`, `ExternalIP`): the localizer never fetches from them.
pub fn node_addresses(node: &Node) -> Vec<std::net::IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// This agent's Node.
pub async fn get_node(client: &Client, node: &str) -> kube::Result<Node> {
    Api::<Node>::all(client.clone()).get(node).await
}

/// Creates (or keeps) the node's NodeState, owned by its Node so it goes away with it; returns
/// the Node as read.
pub async fn ensure_node_state(client: &Client, node: &str) -> kube::Result<Node> {
    let n = get_node(client, node).await?;
    let owner = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "name": node,
        "uid": n.metadata.uid.clone().unwrap_or_default(),
    });
    let api: Api<NodeState> = Api::all(client.clone());
    let body = json!({
        "apiVersion": NodeState::api_version(&()),
        "kind": NodeState::kind(&()),
        "metadata": { "name": node, "ownerReferences": [owner] },
        "spec": { "nodeName": node },
    });
    api.patch(
        node,
        &PatchParams::apply(FIELD_MANAGER_NODE_AGENT).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(n)
}

/// Writes the status by server-side apply on `/status`.
pub async fn write_status(
    client: &Client,
    node: &str,
    status: &NodeStateStatus,
) -> kube::Result<()> {
    let api: Api<NodeState> = Api::all(client.clone());
    let body = json!({
        "apiVersion": NodeState::api_version(&()),
        "kind": NodeState::kind(&()),
        "status": status,
    });
    api.patch_status(
        node,
        &PatchParams::apply(FIELD_MANAGER_NODE_AGENT).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
