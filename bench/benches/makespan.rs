//! Drain makespan on ebb-sim: 100 removable nodes whose pods take their 30 s (sim) grace period,
//! drained by the controller (in-process) with maxDrainParallelism 1 and 20 in the same run; and
//! PDB-paced pools (one pod per node, a budget of k disruptions) against the budget's bound.

use std::time::{Duration, Instant};

use ebb_api::ScaleDownPolicy;
use ebb_controller::cli::run::{Clients, Exit, Settings, serve};
use ebb_e2e::scenario::Scenario;
use ebb_e2e::setup::PodLog;
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
    let (sim, client) = pool_cluster(
        TIME_FACTOR,
        &format!(
            "nodes: {{count: {NODES}, namePrefix: drain-, cpu: '2', memory: 8Gi, labels: {{pool: drain}},\n\
             \x20 taints: [{{key: retiring, value: 'true', effect: PreferNoSchedule}}]}}\n"
        ),
        ("drain-", NODES),
        &format!(
            "deployments: {{count: 1, replicas: {NODES}, requests: {{cpu: 500m, memory: 256Mi}}}}\n"
        ),
    )
    .await;
    let (stop, controller) = start_controller(&sim).await;

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

/// One PDB-paced run: `nodes` nodes, one pod each, a budget allowing `k` disruptions.
struct PdbPaced {
    nodes: usize,
    k: usize,
    removed: usize,
    makespan: Duration,
    /// Median time from an eviction to its replacement being Ready.
    replacement: Duration,
    refused: usize,
    violations: usize,
}

impl PdbPaced {
    /// The budget's lower bound: ⌈removed / k⌉ rounds of one replacement each.
    fn bound(&self) -> Duration {
        self.replacement * self.removed.div_ceil(self.k.max(1)) as u32
    }

    fn line(&self) -> String {
        let (m, b) = (self.makespan.as_secs_f64(), self.bound().as_secs_f64());
        format!(
            "pdb-paced N={} k={}: makespan {m:.1} s, bound {b:.1} s, ratio {:.2}, refused {}, violations {}",
            self.nodes,
            self.k,
            if b > 0.0 { m / b } else { f64::NAN },
            self.refused,
            self.violations
        )
    }
}

/// The median of the times from each evicted pod's termination to the next replacement being
/// Ready (the i-th evicted pod is paired with the i-th new pod to be Ready).
fn median_replacement(log: &PodLog, since: Instant) -> Duration {
    let pods = log.all();
    let mut gone: Vec<Instant> = pods.values().filter_map(|p| p.terminating_at).collect();
    let mut ready: Vec<Instant> = pods
        .values()
        .filter(|p| p.first_seen.is_some_and(|t| t >= since))
        .filter_map(|p| p.running_at)
        .collect();
    gone.sort();
    ready.sort();
    let mut waits: Vec<Duration> = gone
        .iter()
        .zip(&ready)
        .map(|(g, r)| r.saturating_duration_since(*g))
        .collect();
    waits.sort();
    waits.get(waits.len() / 2).copied().unwrap_or_default()
}

/// Sim time factor of the PDB-paced family: the pods' 30 s grace period lasts 3 s.
const PACED_TIME_FACTOR: f64 = 10.0;
/// A pod starts (Running and Ready) this long after it is bound, in sim time: 2 s real.
const PACED_START_DELAY: &str = "20s";
/// Drains (and deletions) at once in the PDB-paced family: well above k, so that the budget
/// paces the pool rather than the drain limit (a drain keeps its slot until its node is deleted,
/// after its pod's grace period: with k = 10 about 20 drains are in flight).
const PACED_DRAIN_PARALLELISM: i64 = 50;

/// A fresh cluster of `nodes` pool nodes with one pod each under a PDB of `maxUnavailable: k`,
/// two large nodes that can take every pod, and a DrainAndDelete policy (`unneededTime` 5 s,
/// `maxDrainParallelism` 50): how long until every pool node is gone, against the bound.
async fn pdb_paced(nodes: usize, k: usize) -> PdbPaced {
    let (sim, client) = pool_cluster(
        PACED_TIME_FACTOR,
        &format!(
            "nodes: {{count: {nodes}, namePrefix: paced-, cpu: '2', memory: 8Gi, labels: {{pool: paced}}}}\n"
        ),
        ("paced-", nodes),
        &format!(
            "deployments: {{count: 1, replicas: {nodes}, requests: {{cpu: 500m, memory: 256Mi}}, \
             pdb: {{maxUnavailable: {k}}}, podAnnotations: {{sim.ebb.dev/start-delay: {PACED_START_DELAY}}}}}\n"
        ),
    )
    .await;
    let (log, _watch) = PodLog::watch(&client);
    let (stop, controller) = start_controller(&sim).await;
    let policy: ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "metadata": {"name": "paced"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "paced"}},
            "mode": "DrainAndDelete",
            "unneededTime": "5s",
            "utilizationThreshold": 0.6,
            "maxScaleDownParallelism": PACED_DRAIN_PARALLELISM,
            "maxDrainParallelism": PACED_DRAIN_PARALLELISM,
        },
    }))
    .expect("policy");
    let t0 = Instant::now();
    Api::<ScaleDownPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("policy created");
    until(
        "every pool node removed",
        Duration::from_secs(1800),
        async || count_nodes(&client, "paced-").await == 0,
    )
    .await;
    let makespan = t0.elapsed();
    stop.cancel();
    match controller.await {
        Ok(Ok(Exit::Stopped)) => {}
        other => panic!("controller ended badly: {other:?}"),
    }
    let audit = sim.audit();
    let refused = audit
        .iter()
        .filter(|r| r.subresource == "eviction" && r.code == 429)
        .count();
    PdbPaced {
        nodes,
        k,
        removed: nodes - count_nodes(&client, "paced-").await,
        makespan,
        replacement: median_replacement(&log, t0),
        refused,
        violations: sim.pdb_violations().len(),
    }
}

/// A fresh simulator with the CRDs: the pool nodes (`pool_yaml`; `pool` names their prefix and
/// count), then one Deployment (`deployment_yaml`) with a pod on each of them (every node ready
/// before the pods come, so they spread one per node), then two large nodes that can take every
/// pod.
async fn pool_cluster(
    time_factor: f64,
    pool_yaml: &str,
    pool: (&str, usize),
    deployment_yaml: &str,
) -> (Sim, kube::Client) {
    let sim = Sim::start(SimConfig {
        time_factor,
        ..SimConfig::default()
    })
    .await
    .expect("simulator started");
    let crds = ebb_api::crdgen::yaml_stream().expect("CRDs");
    Scenario::from_manifests(&crds)
        .and_then(|s| s.load(&sim.api))
        .expect("CRDs loaded");
    let client = sim.client().await.expect("client");
    let (prefix, nodes) = pool;
    let load = |yaml: &str, what: &str| {
        Scenario::from_yaml(yaml)
            .and_then(|s| s.load(&sim.api))
            .unwrap_or_else(|e| panic!("{what} not loaded: {e}"));
    };
    load(pool_yaml, "the pool");
    until("the pool ready", Duration::from_secs(120), async || {
        count_ready_nodes(&client, prefix).await == nodes
    })
    .await;
    load(deployment_yaml, "the pods");
    until("the pods ready", Duration::from_secs(120), async || {
        count_ready(&client).await == nodes
    })
    .await;
    load(
        "nodes: {count: 2, namePrefix: keep-, cpu: '64', memory: 256Gi, labels: {pool: keep}}\n",
        "the large nodes",
    );
    until(
        "the large nodes ready",
        Duration::from_secs(60),
        async || count_ready_nodes(&client, "keep-").await == 2,
    )
    .await;
    (sim, client)
}

/// The controller, in-process and at its defaults, acting on `sim`; running once this returns.
async fn start_controller(
    sim: &Sim,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<Exit>>,
) {
    let stop = CancellationToken::new();
    let settings = Settings {
        metrics_addr: "127.0.0.1:0".parse().expect("address"),
        leader: None,
        recheck_delay: ebb_controller::actuation::runner::DEFAULT_RECHECK_DELAY,
        max_evictions_in_flight: ebb_controller::actuation::evict::DEFAULT_MAX_IN_FLIGHT,
        min_starting_replacements: ebb_controller::actuation::pacing::DEFAULT_MIN_STARTING,
        max_starting_replacements: ebb_controller::actuation::pacing::DEFAULT_MAX_STARTING,
        identity: "bench".into(),
        debounce: ebb_controller::cli::run::DEFAULT_DEBOUNCE,
        placement: Default::default(),
        removal: Default::default(),
        initial_list: Default::default(),
        pod_encoding: Default::default(),
        shutdown_timeout: ebb_controller::cli::run::DEFAULT_SHUTDOWN_TIMEOUT,
        steering: None,
    };
    let controller = tokio::spawn(serve(
        Clients::single(sim.client_as("ebb-controller").await.expect("client")),
        settings,
        stop.clone(),
    ));
    // Caches synced and acting before the clock starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    (stop, controller)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // `cargo test --benches` runs benches with `--bench` absent: keep that a quick smoke check.
    if !std::env::args().any(|a| a == "--bench") {
        println!("makespan: run with `cargo bench -p ebb-bench --bench makespan`");
        return;
    }
    // `EBB_MAKESPAN=pdb-paced` (or `parallelism`) runs one family only.
    let only = std::env::var("EBB_MAKESPAN").unwrap_or_default();
    if only.is_empty() || only == "parallelism" {
        parallelism_family(&runtime);
    }
    if only.is_empty() || only == "pdb-paced" {
        pdb_paced_family(&runtime);
    }
}

/// maxDrainParallelism 1 against 20 on the same pool.
fn parallelism_family(runtime: &tokio::runtime::Runtime) {
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

/// PDB-paced pools against the budget's bound.
fn pdb_paced_family(runtime: &tokio::runtime::Runtime) {
    let paced: Vec<PdbPaced> = [(24, 2), (100, 10)]
        .into_iter()
        .map(|(n, k)| runtime.block_on(pdb_paced(n, k)))
        .collect();
    println!();
    println!(
        "PDB-paced pools: one pod per node (start delay {PACED_START_DELAY} sim), PDB maxUnavailable k, unneededTime 5s, maxDrainParallelism {PACED_DRAIN_PARALLELISM}, time factor {PACED_TIME_FACTOR} (all times real)"
    );
    for r in &paced {
        println!(
            "  N={:>3} k={:>2}: removed {:>3}, makespan {:>6.1} s, R (eviction to replacement Ready, median) {:>5.2} s, bound {:>6.1} s, refused {}, violations {}",
            r.nodes,
            r.k,
            r.removed,
            r.makespan.as_secs_f64(),
            r.replacement.as_secs_f64(),
            r.bound().as_secs_f64(),
            r.refused,
            r.violations
        );
    }
    for r in &paced {
        println!("{}", r.line());
    }
}
