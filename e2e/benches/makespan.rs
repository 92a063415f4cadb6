//! Drain makespan on ebb-sim: 100 removable nodes whose pods take their 30 s (sim) grace period,
//! drained by the controller (in-process) with maxDrainParallelism 1 and 20 in the same run.

use std::time::{Duration, Instant};

use ebb_api::ScaleDownPolicy;
use ebb_controller::cli::run::{Clients, Exit, Settings, serve};
use ebb_e2e::scenario::Scenario;
use ebb_e2e::{Sim, SimConfig};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Removable nodes.
const NODES: usize = 100;
/// Sim time runs this much faster than real time: a 30 s grace period lasts 1 s.
const TIME_FACTOR: f64 = 30.0;
/// The pods' grace period (the simulator's default `terminationGracePeriodSeconds`).
const GRACE_SIM: Duration = Duration::from_secs(30);

/// One measured drain of the whole pool.
struct Makespan {
    parallelism: i32,
    real: Duration,
    sim: Duration,
}

async fn count_nodes(client: &kube::Client, prefix: &str) -> usize {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes listed")
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|x| x.starts_with(prefix))
        })
        .count()
}

async fn count_ready_nodes(client: &kube::Client, prefix: &str) -> usize {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes listed")
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|x| x.starts_with(prefix))
        })
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count()
}

async fn count_ready(client: &kube::Client) -> usize {
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("pods listed")
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
        })
        .count()
}

async fn until(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh cluster: `NODES` small nodes with one pod each (selected by the policy), then two
/// large nodes that take every pod; the controller drains the small ones with `parallelism`.
async fn makespan(parallelism: i32) -> Makespan {
    let sim = Sim::start(SimConfig {
        time_factor: TIME_FACTOR,
        ..SimConfig::default()
    })
    .await
    .expect("simulator started");
    let crds = ebb_api::crdgen::yaml_stream().expect("CRDs");
    Scenario::from_manifests(&crds)
        .and_then(|s| s.load(&sim.api))
        .expect("CRDs loaded");
    let client = sim.client().await.expect("client");
    // Every node ready before the pods come, so they spread one per node.
    Scenario::from_yaml(&format!(
        "nodes: {{count: {NODES}, namePrefix: drain-, cpu: '2', memory: 8Gi, labels: {{pool: drain}},\n\
         \x20 taints: [{{key: retiring, value: 'true', effect: PreferNoSchedule}}]}}\n"
    ))
    .and_then(|s| s.load(&sim.api))
    .expect("pool loaded");
    until("the pool ready", Duration::from_secs(120), async || {
        count_ready_nodes(&client, "drain-").await == NODES
    })
    .await;
    Scenario::from_yaml(&format!(
        "deployments: {{count: 1, replicas: {NODES}, requests: {{cpu: 500m, memory: 256Mi}}}}\n"
    ))
    .and_then(|s| s.load(&sim.api))
    .expect("pods loaded");
    until("the pods ready", Duration::from_secs(120), async || {
        count_ready(&client).await == NODES
    })
    .await;
    Scenario::from_yaml(
        "nodes: {count: 2, namePrefix: keep-, cpu: '64', memory: 256Gi, labels: {pool: keep}}\n",
    )
    .and_then(|s| s.load(&sim.api))
    .expect("large nodes loaded");
    until(
        "the large nodes ready",
        Duration::from_secs(60),
        async || count_ready_nodes(&client, "keep-").await == 2,
    )
    .await;

    let stop = CancellationToken::new();
    let settings = Settings {
        metrics_addr: "127.0.0.1:0".parse().expect("address"),
        leader: None,
        recheck_delay: Duration::from_millis(100),
        identity: "bench".into(),
        debounce: Duration::from_millis(100),
        placement: Default::default(),
    };
    let controller = tokio::spawn(serve(
        Clients::single(sim.client_as("ebb-controller").await.expect("client")),
        settings,
        stop.clone(),
    ));
    // Caches synced and acting before the clock starts.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let policy: ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "metadata": {"name": "pool"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "drain"}},
            "mode": "DrainAndDelete",
            "scanInterval": "1s",
            "unneededTime": "0s",
            "utilizationThreshold": 0.6,
            "maxScaleDownParallelism": parallelism,
            "maxDrainParallelism": parallelism,
            "maxBulkSoftTaintCount": NODES,
        },
    }))
    .expect("policy");
    let real0 = Instant::now();
    let sim0 = sim.api.clock.now();
    Api::<ScaleDownPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("policy created");
    until("every node removed", Duration::from_secs(900), async || {
        count_nodes(&client, "drain-").await == 0
    })
    .await;
    let real = real0.elapsed();
    let sim_elapsed = sim.api.clock.now().duration_since(sim0);
    stop.cancel();
    match controller.await {
        Ok(Ok(Exit::Stopped)) => {}
        other => panic!("controller ended badly: {other:?}"),
    }
    until(
        "the pods running elsewhere",
        Duration::from_secs(60),
        async || count_ready(&client).await == NODES,
    )
    .await;
    assert!(sim.pdb_violations().is_empty());
    Makespan {
        parallelism,
        real,
        sim: Duration::try_from(sim_elapsed).unwrap_or_default(),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // `cargo test --benches` runs benches with `--bench` absent: keep that a quick smoke check.
    if !std::env::args().any(|a| a == "--bench") {
        println!("makespan: run with `cargo bench -p ebb-e2e --bench makespan`");
        return;
    }
    let runs: Vec<Makespan> = [1, 20]
        .into_iter()
        .map(|p| runtime.block_on(makespan(p)))
        .collect();
    println!();
    println!(
        "Drain makespan: {NODES} nodes, one pod each, grace period {}s (sim), time factor {TIME_FACTOR}",
        GRACE_SIM.as_secs()
    );
    for r in &runs {
        println!(
            "  maxDrainParallelism {:>2}: {:>7.1} s real, {:>7.0} s sim",
            r.parallelism,
            r.real.as_secs_f64(),
            r.sim.as_secs_f64()
        );
    }
    let ratio = runs[0].real.as_secs_f64() / runs[1].real.as_secs_f64();
    println!("  speed-up 20 vs 1: {ratio:.1}x (target >= 15x)");
}
