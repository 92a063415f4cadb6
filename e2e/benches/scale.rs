//! ebb's policy loop on a real control plane at scale: `cargo bench -p ebb-e2e --bench scale`
//! creates 1,000 kwok nodes and 30,000 pods, runs the controller and prints its loop duration (the
//! policy status and the loop phases of its `/metrics`) and its peak RSS.
//!
//! Needs the control plane (`e2e/k8s/build.sh`) and the release controller (`cargo build
//! --release -p ebb-controller`). `EBB_SCALE_NODES` (default 1000) and `EBB_SCALE_PODS_PER_NODE`
//! (30) change the size; `EBB_SCALE_LOOPS` (5) how many loops are measured.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use ebb_e2e::harness::{Backend, wait_for};
use ebb_e2e::setup::{Cluster, create_policy, fetch_metrics, metrics_address};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const NS: &str = "scale";
/// Nodes per ReplicaSet: each owns the pods of ten nodes.
const NODES_PER_OWNER: usize = 10;

fn env_usize(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a count")),
        Err(_) => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("scale: run with `cargo bench -p ebb-e2e --bench scale`");
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let nodes = env_usize("EBB_SCALE_NODES", 1000)?;
    let per_node = env_usize("EBB_SCALE_PODS_PER_NODE", 30)?;
    let loops = env_usize("EBB_SCALE_LOOPS", 5)?.max(1);
    let t0 = Instant::now();
    let cluster = Cluster::start(Backend::Real, 1.0)
        .await
        .context("the real control plane with ebb's CRDs")?;
    let env = &cluster.env;
    let client = env.client.clone();
    println!("control plane up in {:.1} s", t0.elapsed().as_secs_f64());
    populate(&client, nodes, per_node).await?;
    let pods = nodes * per_node;
    println!(
        "{nodes} nodes and {pods} pods created after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let mut ctrl = env.spawn_binary(
        "ebb-controller",
        &[
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            "false",
            "--namespace",
            "ebb-system",
            "--log-filter",
            "warn,ebb_controller=info",
        ],
    )?;
    let log = ctrl.capture_output();
    let pid = ctrl.id().context("the controller's pid")?;
    let started = Instant::now();
    create_policy(
        &client,
        "scale",
        json!({"mode": "DryRun", "scanInterval": "10s",
               "nodeSelector": {"matchLabels": {"pool": "scale"}}}),
    )
    .await?;
    let policies = Api::<ebb_api::ScaleDownPolicy>::all(client.clone());
    let mut durations = Vec::new();
    let mut last: Option<String> = None;
    while durations.len() < loops {
        let (time, ms) = wait_for("the next loop", Duration::from_secs(300), || async {
            let s = policies.get("scale").await.ok()?.status?;
            let time = s.last_loop.time.as_ref()?.0.to_string();
            (Some(&time) != last.as_ref()).then_some((time, s.last_loop.duration_ms))
        })
        .await?;
        println!("loop at {time}: {ms} ms");
        durations.push(ms);
        last = Some(time);
    }
    let lines = log.lock().map(|l| l.clone()).unwrap_or_default();
    let addr = metrics_address(&lines).context("the controller's /metrics address")?;
    let metrics = fetch_metrics(&addr, None).await?;
    let running = Api::<Pod>::namespaced(client.clone(), NS)
        .list_metadata(&ListParams::default().fields("status.phase=Running"))
        .await
        .map(|l| l.items.len())
        .unwrap_or_default();
    let phases = phase_means(&metrics);
    let rss = peak_rss_kib(pid)?;
    ctrl.kill().await?;

    durations.sort_unstable();
    let median = durations[durations.len() / 2];
    let max = durations.last().copied().unwrap_or_default();
    let phases_text = phases
        .iter()
        .map(|(p, ms)| format!("{p} {ms:.1} ms"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "first loop done {:.1} s after start",
        started.elapsed().as_secs_f64()
    );
    println!(
        "scale {nodes} nodes, {pods} pods ({running} Running): loop median {median} ms, max {max} ms over {loops} loops; mean per phase: {phases_text}; controller peak RSS {} MiB",
        rss / 1024
    );
    Ok(())
}

/// Nodes `scale-<i>` (4 cpu, 16 GiB, label `pool: scale`) and ReplicaSets owning `per_node`
/// pods on each, bound in advance (the scheduler is not what is measured): a third of the nodes
/// light (10m per pod), the rest busy (100m).
async fn populate(client: &kube::Client, nodes: usize, per_node: usize) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await
        .context("creating the namespace")?;
    let node_api = Api::<Node>::all(client.clone());
    futures::stream::iter(0..nodes)
        .map(|i| {
            let api = node_api.clone();
            async move {
                let name = format!("scale-{i}");
                let res = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"pool": "scale", "type": "kwok",
                        "kubernetes.io/hostname": name},
                        "annotations": {"kwok.x-k8s.io/node": "fake"}},
                    "status": {"capacity": res, "allocatable": res}
                }))?;
                api.create(&PostParams::default(), &node)
                    .await
                    .with_context(|| format!("creating node {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let owners = nodes.div_ceil(NODES_PER_OWNER);
    let rs_api = Api::<ReplicaSet>::namespaced(client.clone(), NS);
    let pod_api = Api::<Pod>::namespaced(client.clone(), NS);
    for o in 0..owners {
        let first = o * NODES_PER_OWNER;
        let last = (first + NODES_PER_OWNER).min(nodes);
        let replicas = (last - first) * per_node;
        let app = format!("app-{o}");
        let cpu = if o % 3 == 0 { "10m" } else { "100m" };
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": app},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": {"app": app}},
                                  "spec": {"containers": [{"name": "c", "image": "fake",
                                      "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}
        }))?;
        // Created with its pods already bound: the ReplicaSet controller adopts them and,
        // counting `replicas`, creates none.
        let rs = rs_api
            .create(&PostParams::default(), &rs)
            .await
            .with_context(|| format!("creating ReplicaSet {app}"))?;
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        futures::stream::iter(first..last)
            .flat_map(|n| futures::stream::iter((0..per_node).map(move |k| (n, k))))
            .map(|(n, k)| {
                let api = pod_api.clone();
                let (app, uid) = (app.clone(), uid.clone());
                async move {
                    let pod: Pod = serde_json::from_value(json!({
                        "metadata": {"name": format!("{app}-{n}-{k}"), "labels": {"app": app},
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                "name": app, "uid": uid, "controller": true}]},
                        "spec": {"nodeName": format!("scale-{n}"),
                            "containers": [{"name": "c", "image": "fake",
                                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}
                    }))?;
                    api.create(&PostParams::default(), &pod)
                        .await
                        .with_context(|| format!("creating pod {app}-{n}-{k}"))?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        if o % 10 == 9 {
            println!("  {} of {owners} owners' pods created", o + 1);
        }
    }
    // Bound pods count on their nodes whatever their phase; kwok marks them Running meanwhile
    // (how many are is printed with the figures).
    let want = nodes * per_node;
    wait_for("every pod created", Duration::from_secs(600), || async {
        let list = pod_api.list_metadata(&ListParams::default()).await.ok()?;
        (list.items.len() >= want).then_some(())
    })
    .await?;
    Ok(())
}

/// Mean milliseconds of each loop phase, from `ebb_loop_phase_duration_seconds` sums and counts.
fn phase_means(metrics: &str) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in metrics.lines() {
        let (kind, rest) =
            if let Some(r) = line.strip_prefix("ebb_loop_phase_duration_seconds_sum{") {
                (0, r)
            } else if let Some(r) = line.strip_prefix("ebb_loop_phase_duration_seconds_count{") {
                (1, r)
            } else {
                continue;
            };
        let Some(phase) = rest
            .split("phase=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
        else {
            continue;
        };
        let Some(value) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let e = sums.entry(phase.to_string()).or_default();
        if kind == 0 {
            e.0 += value;
        } else {
            e.1 += value;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, n))| *n > 0.0)
        .map(|(p, (s, n))| (p, s / n * 1000.0))
        .collect()
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmHWM in /proc/<pid>/status")
}
