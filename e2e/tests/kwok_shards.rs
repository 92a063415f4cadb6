//! The control plane's kwok split in shards (`EBB_K8S_KWOK_SHARDS`, which the scale bench runs
//! with): every node is labelled with its shard, is Ready, and a pod bound to a node of each
//! shard starts, so no node is left without its kwok.

use std::collections::BTreeSet;
use std::time::Duration;

use ebb_e2e::harness::{TestEnv, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const SHARDS: usize = 3;
const NODES: usize = 6;

#[tokio::test(flavor = "multi_thread")]
async fn every_node_of_every_kwok_shard_is_ready_and_starts_its_pods() {
    // Read by cluster.sh when this binary's only test starts its control plane.
    unsafe { std::env::set_var("EBB_K8S_KWOK_SHARDS", SHARDS.to_string()) };
    let env = TestEnv::start_real(NODES).await.unwrap();
    let real = env.real().expect("a real control plane");
    let pids = std::fs::read_dir(real.dir().join("pids")).unwrap();
    let kwoks: BTreeSet<String> = pids
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with("kwok") && f.ends_with(".pid"))
        .collect();
    assert_eq!(kwoks.len(), SHARDS, "one kwok process per shard: {kwoks:?}");

    let nodes: Api<Node> = Api::all(env.client.clone());
    let listed = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), NODES);
    let mut shards = BTreeSet::new();
    for n in &listed.items {
        let name = n.metadata.name.clone().unwrap();
        let shard = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("ebb.dev/kwok-shard"))
            .unwrap_or_else(|| panic!("{name} has no shard label"));
        shards.insert(shard.clone());
    }
    let want: BTreeSet<String> = (0..SHARDS).map(|k| k.to_string()).collect();
    assert_eq!(shards, want, "every shard has nodes");

    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    for i in 0..NODES {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}")},
            "spec": {"nodeName": format!("kwok-node-{i}"),
                "containers": [{"name": "c", "image": "x"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let not_running = wait_for(
        "a pod on a node of every shard Running",
        Duration::from_secs(60),
        || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == NODES).then_some(())
        },
    )
    .await;
    if let Err(e) = not_running {
        let list = pods.list(&ListParams::default()).await.unwrap();
        let phases: Vec<_> = list
            .items
            .iter()
            .map(|p| {
                (
                    p.metadata.name.clone(),
                    p.status.as_ref().and_then(|s| s.phase.clone()),
                )
            })
            .collect();
        panic!("{e:#}: {phases:?}");
    }
}
