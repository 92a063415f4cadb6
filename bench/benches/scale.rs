//! ebb's policy loop and a drain wave on a real control plane at scale: `cargo bench -p ebb-bench
//! --bench scale` creates kwok nodes and pre-bound pods, runs the controller and prints its start,
//! loop and memory figures, the API requests per loop, and a DrainAndDelete wave's removal rate.
//!
//! Needs the control plane (`e2e/k8s/build.sh`) and the release controller (`cargo build
//! --release -p ebb-controller`). `EBB_SCALE_NODES` (default 1000) and `EBB_SCALE_PODS_PER_NODE`
//! (30) set the size, `EBB_SCALE_LOOPS` (5) how many loops are measured. With
//! `EBB_SCALE_BASELINE=<path of another ebb-controller>` that binary is measured first on the same
//! cluster (before figures); `EBB_SCALE_COMPARE_LISTS=1` measures this build with paged lists
//! (`--initial-list list`) before its default, `EBB_SCALE_COMPARE_ENCODINGS=1` with its pod cache
//! in JSON (`--pod-encoding json`); `EBB_SCALE_DRAIN=0` leaves the drain wave out;
//! `EBB_SCALE_CONTROLLER=<path>` measures that binary as this build (for example the musl build
//! the images ship) instead of the workspace's release build; `EBB_SCALE_WAVE_SECS` caps the
//! drain wave (default 300 s and 2 s a drain-pool node); for the wave kwok is stopped and the
//! bench plays the drain pool's kubelet (`ebb_bench::kubelet`), `EBB_SCALE_KWOK_WAVE=1` leaves
//! it to kwok. `EBB_SCALE_PERF=<dir>` records a CPU
//! profile of each controller over its measured loops (`perf record`, DWARF call graphs) into
//! `<dir>`.
//!
//! The last tenth of the nodes (`pool: drain`) hold light pods of their own ReplicaSets (namespace
//! `scale-drain`, a PodDisruptionBudget of `maxUnavailable: 10%` each); the others (`pool:
//! scale`, a third of them light, labelled for kwok to leave alone: they never move) are watched
//! by a DryRun policy. After the loops are measured a DrainAndDelete policy (`maxDrainParallelism`
//! and `maxScaleDownParallelism` 50) removes the drain pool; the budgets are replayed from the
//! audit log for violations.
//!
//! Set-up is paid once per size: once every pod runs, etcd's data is saved under
//! `EBB_SCALE_SNAPSHOTS` (default `~/.cache/ebb-scale`), keyed by the size, the populate
//! version and the control plane's build; a later run starts its control plane from that copy
//! (`EBB_K8S_ETCD_RESTORE`), waits until kwok's writes to the restored pods stop (no pod change
//! for `EBB_SCALE_QUIET_SECS`, default 15) and prints how long its set-up took.
//! `EBB_SCALE_FRESH=1` populates again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ebb_bench::etcd_load::{self, EtcdLoader, Put};
use ebb_e2e::harness::{Backend, ChildProcess, TestEnv, wait_for, workspace_binary};
use ebb_e2e::setup::{Cluster, create_policy, fetch_metrics, metrics_address};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// Namespace of the pods on the DryRun pool (left out of the audit log: bulk).
const NS: &str = "scale";
/// Namespace of the pods on the drain pool (audited: their budgets are replayed).
const DRAIN_NS: &str = "scale-drain";
/// Nodes per ReplicaSet: each owns the pods of ten nodes.
const NODES_PER_OWNER: usize = 10;
/// Concurrent etcd transactions while populating (one owner and its pods each).
const ETCD_CONCURRENCY: usize = 4;
/// What `populate` makes; a saved cluster of another version is not reused.
const POPULATE_VERSION: &str = "p9";
/// kwok processes (`EBB_SCALE_KWOK_SHARDS`, default 1), each managing the nodes labelled
/// `ebb.dev/kwok-shard=<k>` (`populate` labels node `i` with `i % shards`). Four did not start a
/// 5,000-node wave's replacements sooner on 2 cores: every kwok reads every pod event, and the
/// API server closed their pod watches ten times as often as one kwok's.
fn kwok_shards() -> anyhow::Result<usize> {
    let n = env_usize("EBB_SCALE_KWOK_SHARDS", 1)?;
    anyhow::ensure!(
        (1..=4).contains(&n),
        "EBB_SCALE_KWOK_SHARDS must be 1 to 4, not {n}"
    );
    Ok(n)
}
/// The user the controller acts as (the chart's ServiceAccount).
const CONTROLLER_USER: &str = "system:serviceaccount:ebb-system:ebb-controller";

fn env_usize(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a count")),
        Err(_) => Ok(default),
    }
}

/// The control plane's flags for a bench of `nodes` nodes (each unless already set): etcd's
/// space quota above its 2 GiB default, more requests in flight, the controller's reads in the
/// audit log, the bulk namespace out of it; kwok's pod workers raised only to populate (not
/// when the cluster is `restored`).
fn cluster_flags(nodes: usize, restored: bool) -> anyhow::Result<Vec<(&'static str, String)>> {
    let inflight = if nodes > 2000 { 1600 } else { 800 };
    let mut flags = vec![
        (
            "EBB_K8S_ETCD_ARGS",
            // The set-up writes an owner and its pods (300) in one transaction.
            "--quota-backend-bytes=8589934592 --max-txn-ops=1000 --max-request-bytes=16777216"
                .into(),
        ),
        (
            "EBB_K8S_APISERVER_ARGS",
            format!(
                "--max-requests-inflight={inflight} --max-mutating-requests-inflight={}",
                inflight / 2
            ),
        ),
        // A node's heartbeat may be late while tens of thousands of pods are created (kwok
        // renews every lease from one process): with the default 40 s the node lifecycle
        // controller marked nodes NotReady, tainted them and their pods were evicted and made
        // again, and the set-up never ended (3 pods/s Running at 1,000 nodes). The bench
        // measures ebb, not node failure: nodes stay Ready for an hour without a heartbeat.
        (
            "EBB_K8S_CONTROLLER_MANAGER_ARGS",
            "--kube-api-qps=300 --kube-api-burst=600 --node-monitor-grace-period=3600s".into(),
        ),
        (
            "EBB_K8S_SCHEDULER_ARGS",
            "--kube-api-qps=300 --kube-api-burst=600".into(),
        ),
        // Thousands of node leases to renew and node stages to play from one process.
        ("EBB_K8S_KWOK_PARALLELISM", "16".into()),
        // kwok renews a lease every quarter of its duration: at the default 40 s, 5,000
        // nodes are 500 lease writes a second, which took the 2 cores from kwok's pod stages
        // (replacements ContainerCreating for minutes, 0.5 started a second in a drain wave).
        // Kubelets renew their own leases on their own machines; here every 5 minutes, well
        // inside the grace period above.
        (
            "EBB_K8S_KWOK_ARGS",
            "--node-lease-duration-seconds=1200".into(),
        ),
        ("EBB_K8S_KWOK_SHARDS", kwok_shards()?.to_string()),
        ("EBB_K8S_AUDIT_READS_OF", CONTROLLER_USER.into()),
        ("EBB_K8S_AUDIT_SKIP_NAMESPACES", NS.into()),
        ("EBB_K8S_TIMEOUT", "300".into()),
    ];
    // kwok's 4 pod-stage workers make pods Running at a few hundred per second at best: raised
    // to populate 150,000 pods. Not for a drain wave: at 16 kwok played a new pod's stages
    // concurrently, patched it hundreds of times and left replacements ContainerCreating
    // (Pending) for minutes. A restored cluster's pods are Running already.
    if !restored {
        flags.push(("EBB_K8S_KWOK_POD_PARALLELISM", "16".into()));
    }
    Ok(flags)
}

fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        println!("scale: run with `cargo bench -p ebb-bench --bench scale`");
        return Ok(());
    }
    let nodes = env_usize("EBB_SCALE_NODES", 1000)?;
    let per_node = env_usize("EBB_SCALE_PODS_PER_NODE", 30)?;
    let snapshot = snapshot_dir(nodes, per_node)?;
    let restore =
        snapshot.join("member/snap/db").is_file() && env_usize("EBB_SCALE_FRESH", 0)? == 0;
    if restore {
        println!(
            "restoring the populated cluster from {}",
            snapshot.display()
        );
        // SAFETY: no other thread exists yet; cluster.sh, started later, inherits it.
        unsafe { std::env::set_var("EBB_K8S_ETCD_RESTORE", &snapshot) };
    }
    for (k, v) in cluster_flags(nodes, restore)? {
        if std::env::var_os(k).is_none() {
            println!("{k}={v}");
            // SAFETY: no other thread exists yet (the runtime is built below); cluster.sh,
            // started later, inherits these.
            unsafe { std::env::set_var(k, v) };
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(run(nodes, per_node, snapshot, restore))
}

/// Where the populated cluster of this size is saved: `EBB_SCALE_SNAPSHOTS` (default
/// `~/.cache/ebb-scale`)/`<nodes>x<pods per node>-<populate version>-<control plane>`, the
/// control plane named by its binaries' directory (its version).
fn snapshot_dir(nodes: usize, per_node: usize) -> anyhow::Result<PathBuf> {
    let root = match std::env::var_os("EBB_SCALE_SNAPSHOTS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
            .join(".cache/ebb-scale"),
    };
    let bins = std::process::Command::new("bash")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/k8s/build.sh"))
        .arg("--print-bin-dir")
        .output()
        .context("cannot run e2e/k8s/build.sh --print-bin-dir")?;
    let bins = String::from_utf8_lossy(&bins.stdout).trim().to_string();
    // ~/.cache/ebb-k8s/<version>/bin: the version.
    let plane = std::path::Path::new(&bins)
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "unknown".into());
    let shards = kwok_shards()?;
    Ok(root.join(format!(
        "{nodes}x{per_node}-{POPULATE_VERSION}-k{shards}-{plane}"
    )))
}

/// What one controller run measured.
struct Figures {
    first_loop: Duration,
    /// From the start to the controller's `caches synced` log line.
    synced: Option<Duration>,
    /// From the start to its `acting` log line (start-up recovery done, reconcilers acting).
    acting: Option<Duration>,
    loops: Vec<i64>,
    phases: BTreeMap<String, f64>,
    rss_kib: u64,
    /// VmRSS after the last measured loop.
    steady_rss_kib: u64,
    requests_per_loop: f64,
    /// Requests in the measured loops by verb and resource, most first.
    requests_by_kind: Vec<(String, usize)>,
    /// CPU seconds each process used over the measured loops, and the wall seconds they took.
    cpu: LoopCpu,
}

async fn run(
    nodes: usize,
    per_node: usize,
    snapshot: PathBuf,
    restored: bool,
) -> anyhow::Result<()> {
    let loops = env_usize("EBB_SCALE_LOOPS", 5)?.max(2);
    let drain = env_usize("EBB_SCALE_DRAIN", 1)? != 0;
    let t0 = Instant::now();
    let cluster = Cluster::start(Backend::Real, 1.0)
        .await
        .context("the real control plane with ebb's CRDs")?;
    let env = &cluster.env;
    let client = env.client.clone();
    println!("control plane up in {:.1} s", t0.elapsed().as_secs_f64());
    let pods = nodes * per_node;
    let drain_nodes = if restored {
        // kwok takes over the saved nodes: Ready again before anything is measured.
        wait_for(
            "the saved nodes Ready",
            Duration::from_secs(600),
            || async {
                let ready = Api::<Node>::all(client.clone())
                    .list(&ListParams::default().labels("type=kwok"))
                    .await
                    .ok()?
                    .items
                    .iter()
                    .filter(|n| node_ready(n))
                    .count();
                (ready >= nodes).then_some(())
            },
        )
        .await?;
        println!(
            "{nodes} nodes and {pods} pods restored, nodes Ready after {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        drain_pool(nodes)
    } else {
        let d = populate(env, nodes, per_node).await?;
        println!(
            "{nodes} nodes and {pods} pods created after {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        d
    };
    let t = Instant::now();
    wait_for(
        "the drain pool's pods Running",
        Duration::from_secs(1800),
        || async {
            let n = running(&client, DRAIN_NS).await;
            (n >= drain_nodes.len() * per_node).then_some(())
        },
    )
    .await?;
    println!(
        "the drain pool's pods Running after {:.1} s more",
        t.elapsed().as_secs_f64()
    );
    // The rest too, for at most EBB_SCALE_SETTLE_SECS (kwok's status writes are watch events
    // the controller applies while it is measured).
    let settle = Duration::from_secs(env_usize("EBB_SCALE_SETTLE_SECS", 900)? as u64);
    let all = wait_for("every pod Running", settle, || async {
        let n = running(&client, NS).await + running(&client, DRAIN_NS).await;
        (n >= pods).then_some(())
    })
    .await;
    println!(
        "{} pods Running after {:.1} s more{}",
        running(&client, NS).await + running(&client, DRAIN_NS).await,
        t.elapsed().as_secs_f64(),
        if all.is_ok() {
            ""
        } else {
            " (not all: measuring anyway)"
        }
    );
    println!(
        "set-up: {nodes} nodes and {} of {pods} pods Running {:.1} s after start ({})",
        running(&client, NS).await + running(&client, DRAIN_NS).await,
        t0.elapsed().as_secs_f64(),
        if restored {
            "restored from a saved etcd"
        } else {
            "populated"
        }
    );
    if !restored && all.is_ok() {
        let t = Instant::now();
        match env.real() {
            Some(real) => match real.save_etcd(&snapshot).await {
                Ok(()) => println!(
                    "saved the populated cluster to {} in {:.1} s (later runs start from it)",
                    snapshot.display(),
                    t.elapsed().as_secs_f64()
                ),
                Err(e) => println!("could not save the populated cluster: {e:#}"),
            },
            None => println!("not a real control plane: nothing saved"),
        }
    }
    if restored {
        // kwok takes over the restored pods and writes their status again (measured: its RSS
        // peaked at 2.8 GiB against 167 MiB populated, and the controller's watch-event phase
        // took 213 ms a loop): the loops are measured only once those writes stop.
        let quiet = Duration::from_secs(env_usize("EBB_SCALE_QUIET_SECS", 15)? as u64);
        let (events, waited) = wait_quiet(&client, quiet, settle).await?;
        println!(
            "pod writes quiet for {} s after {:.1} s more ({events} pod watch events meanwhile){}",
            quiet.as_secs(),
            waited.as_secs_f64(),
            if waited >= settle {
                " (never quiet: measuring anyway)"
            } else {
                ""
            }
        );
    }
    report_cluster_rss(env);
    // The first client to list every pod after the control plane starts pays for the API
    // server's growing its heap (and kwok's first writes): measured, the controller that ran
    // first took 15 to 30 s longer to its first loop than the same binary run second. A real
    // cluster's API server is warm (the scheduler, the controller manager and the kubelets
    // list and watch all day), so the bench lists every pod twice before it measures anything.
    // In pages of 500, each dropped once read: one response of 150,000 pods held here would take
    // gigabytes beside the cluster.
    for round in 1..=2 {
        let t = Instant::now();
        let api = Api::<Pod>::all(client.clone());
        let mut listed = 0;
        let mut next: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(500);
            if let Some(c) = next.take() {
                lp = lp.continue_token(&c);
            }
            let page = api
                .list(&lp)
                .await
                .context("listing every pod to warm the API server")?;
            listed += page.items.len();
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() => next = Some(c),
                _ => break,
            }
        }
        println!(
            "warm-up list {round}: {listed} pods in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    // The same pages in protobuf, as client-go lists them: what the API server's encoding
    // costs against JSON's, for whether the controller should list pods that way.
    match list_pods_protobuf(&client).await {
        Ok((listed, bytes, secs)) => println!(
            "warm-up list in protobuf: {listed} pods in {secs:.1} s ({:.0} MiB)",
            bytes as f64 / (1024.0 * 1024.0)
        ),
        Err(e) => println!("warm-up list in protobuf failed: {e:#}"),
    }

    let mut controllers: Vec<(&str, PathBuf, &[&str])> = Vec::new();
    if let Some(base) = std::env::var_os("EBB_SCALE_BASELINE") {
        controllers.push(("before", PathBuf::from(base), &[]));
    }
    // The binary measured as this build: the workspace's release build, or the one given (the
    // static musl build the images ship).
    let this = match std::env::var_os("EBB_SCALE_CONTROLLER") {
        Some(p) => PathBuf::from(p),
        None => workspace_binary("ebb-controller")?,
    };
    // The pod cache in JSON (kube-runtime's watcher) against protobuf (the default).
    if env_usize("EBB_SCALE_COMPARE_ENCODINGS", 0)? != 0 {
        controllers.push((
            "this build, JSON pods",
            this.clone(),
            &["--pod-encoding", "json"],
        ));
    }
    if env_usize("EBB_SCALE_COMPARE_LISTS", 0)? != 0 {
        controllers.push((
            "this build, paged lists",
            this.clone(),
            &["--initial-list", "list"],
        ));
    }
    controllers.push(("this build", this, &[]));
    let last = controllers.len() - 1;
    for (i, (label, path, extra)) in controllers.into_iter().enumerate() {
        let (mut ctrl, log) = spawn_controller(env, &path, extra)?;
        let figures = measure(env, &mut ctrl, &log, loops, label).await;
        let figures = match figures {
            Ok(f) => f,
            Err(e) => {
                let lines = log.lock().map(|l| l.clone()).unwrap_or_default();
                let tail = lines
                    .iter()
                    .rev()
                    .take(30)
                    .rev()
                    .cloned()
                    .collect::<Vec<_>>();
                bail!("{label} ({}): {e:#}\n{}", path.display(), tail.join("\n"));
            }
        };
        let running = Api::<Pod>::all(client.clone())
            .list_metadata(&ListParams::default().fields("status.phase=Running"))
            .await
            .map(|l| l.items.len())
            .unwrap_or_default();
        print_figures(label, &path, extra, nodes, pods, running, &figures);
        if i < last || !drain {
            // Deleted while its controller runs (it holds the policy's finalizer).
            let policies = Api::<ebb_api::ScaleDownPolicy>::all(client.clone());
            policies
                .delete("scale", &DeleteParams::default())
                .await
                .context("deleting the DryRun policy between controllers")?;
            wait_for(
                "the DryRun policy gone",
                Duration::from_secs(120),
                || async { matches!(policies.get_opt("scale").await, Ok(None)).then_some(()) },
            )
            .await?;
            ctrl.kill().await?;
            continue;
        }
        let addr = log
            .lock()
            .ok()
            .and_then(|l| metrics_address(&l))
            .unwrap_or_default();
        let wave = drain_wave(env, &drain_nodes, &addr).await;
        let rss = peak_rss_kib(ctrl.id().unwrap_or_default()).unwrap_or_default();
        ctrl.kill().await?;
        // The controller's log of the wave, for what a figure alone does not say.
        let saved = std::env::temp_dir().join(format!("ebb-scale-{nodes}-wave-controller.log"));
        let lines = log.lock().map(|l| l.join("\n")).unwrap_or_default();
        match std::fs::write(&saved, lines) {
            Ok(()) => println!("the controller's log of the wave: {}", saved.display()),
            Err(e) => println!("could not save the controller's log: {e}"),
        }
        let wave = wave?;
        println!(
            "drain wave {nodes} nodes: {} of {} drain-pool nodes removed in {:.1} s ({:.1} nodes/min, first after {:.1} s), maxDrainParallelism 50, PDB violations {}, controller peak RSS {} MiB",
            wave.removed,
            drain_nodes.len(),
            wave.took.as_secs_f64(),
            wave.removed as f64 / wave.took.as_secs_f64().max(0.001) * 60.0,
            wave.first.as_secs_f64(),
            wave.violations,
            rss / 1024
        );
    }
    report_cluster_rss(env);
    Ok(())
}

fn print_figures(
    label: &str,
    path: &std::path::Path,
    extra: &[&str],
    nodes: usize,
    pods: usize,
    running: usize,
    f: &Figures,
) {
    let mut sorted = f.loops.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    let max = sorted.last().copied().unwrap_or_default();
    let phases = f
        .phases
        .iter()
        .map(|(p, ms)| format!("{p} {ms:.1} ms"))
        .collect::<Vec<_>>()
        .join(", ");
    println!("{label}: {} {}", path.display(), extra.join(" "));
    println!(
        "  loops {:?} ms; mean per phase: {phases}; {running} pods Running",
        f.loops
    );
    println!("  {}", f.cpu.line());
    // The window runs from the end of the first loop to the end of the last.
    if let Some(ms) = f
        .cpu
        .per_loop_ms("ebb-controller", f.loops.len().saturating_sub(1))
    {
        println!(
            "  ebb-controller CPU {ms:.0} ms a loop (watches, loop and /metrics; a loop's time is longer when the machine is busy)"
        );
    }
    println!(
        "  requests in the measured loops: {}",
        f.requests_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let secs = |d: Option<Duration>| {
        d.map_or("(not seen)".to_string(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    println!(
        "  start-up: caches synced {}, acting {} (start-up recovery done), first loop seen {:.1} s after the start",
        secs(f.synced),
        secs(f.acting),
        f.first_loop.as_secs_f64()
    );
    println!(
        "scale {nodes} nodes, {pods} pods: caches synced {}, first loop {:.1} s, loop median {median} ms, max {max} ms, peak RSS {} MiB, steady RSS {} MiB, {:.1} KiB/pod, requests/loop {:.1}",
        secs(f.synced),
        f.first_loop.as_secs_f64(),
        f.rss_kib / 1024,
        f.steady_rss_kib / 1024,
        f.rss_kib as f64 / pods.max(1) as f64,
        f.requests_per_loop
    );
}

/// Starts the controller at `path` with the chart's ServiceAccount, capturing its output.
fn spawn_controller(
    env: &TestEnv,
    path: &std::path::Path,
    extra: &[&str],
) -> anyhow::Result<(ChildProcess, std::sync::Arc<std::sync::Mutex<Vec<String>>>)> {
    let mut args = vec![
        "run",
        "--metrics-addr",
        "127.0.0.1:0",
        "--leader-election",
        "false",
        "--namespace",
        "ebb-system",
        "--log-filter",
        "warn,ebb_controller=info",
    ];
    args.extend_from_slice(extra);
    let kubeconfig = env.binary_kubeconfig("admin", "ebb-controller", &args)?;
    let child = tokio::process::Command::new(path)
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", path.display()))?;
    let mut ctrl = ChildProcess {
        name: "ebb-controller".into(),
        child,
    };
    let log = ctrl.capture_output();
    Ok((ctrl, log))
}

/// Creates the DryRun policy and measures `loops` of its loops.
async fn measure(
    env: &TestEnv,
    ctrl: &mut ChildProcess,
    log: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    loops: usize,
    label: &str,
) -> anyhow::Result<Figures> {
    let client = env.client.clone();
    let pid = ctrl.id().context("the controller's pid")?;
    let mut processes = control_plane_pids(env);
    processes.insert(0, ("ebb-controller", pid));
    let mut cpu_start = None;
    let mut profile = None;
    let started = Instant::now();
    // When the controller logs that its caches are synced, and that it acts (polled from its
    // captured output).
    let seen_in_log = |line: fn(&str) -> bool| {
        let log = log.clone();
        tokio::spawn(async move {
            while started.elapsed() < Duration::from_secs(1800) {
                let seen = log
                    .lock()
                    .map(|l| l.iter().any(|x| line(x)))
                    .unwrap_or(false);
                if seen {
                    return Some(started.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            None
        })
    };
    let synced = seen_in_log(|x| x.contains("caches synced"));
    let acting = seen_in_log(|x| x.trim_end().ends_with(" acting"));
    create_policy(
        &client,
        "scale",
        json!({"mode": "DryRun", "scanInterval": "10s",
               "nodeSelector": {"matchLabels": {"pool": "scale"}}}),
    )
    .await?;
    // Loops are read from the controller's phase histograms, not from `status.lastLoop`: the
    // status is written only when it changes (or every 5 minutes), so a settled cluster shows
    // no new loop there for minutes while the controller runs one every scan interval.
    let addr = wait_for(
        "the controller's /metrics address",
        Duration::from_secs(120),
        || async {
            let lines = log.lock().map(|l| l.clone()).ok()?;
            metrics_address(&lines)
        },
    )
    .await?;
    let mut durations = Vec::new();
    let mut times: Vec<jiff::Timestamp> = Vec::new();
    let mut first_loop = None;
    let (mut count, mut sum) = (0.0, 0.0);
    while durations.len() < loops {
        let (c, s) = next_loop(&addr, count).await?;
        let time = jiff::Timestamp::now();
        if first_loop.is_none() {
            first_loop = Some(started.elapsed());
            // From the end of the first loop, as the requests below.
            cpu_start = Some(CpuReading::take(&processes));
            profile = Profile::start(pid, label)?;
        }
        // Two loops between polls (50 ms apart) count as two of their mean.
        let n = (c - count).round().max(1.0) as usize;
        let ms = ((s - sum) * 1000.0 / n as f64).round() as i64;
        (count, sum) = (c, s);
        for _ in 0..n.min(loops - durations.len()) {
            println!("  loop seen at {time}: {ms} ms");
            durations.push(ms);
            times.push(time);
        }
    }
    let cpu = cpu_start
        .map(|s| s.until(&CpuReading::take(&processes)))
        .unwrap_or_default();
    if let Some(p) = profile {
        p.stop();
    }
    let metrics = fetch_metrics(&addr, None).await?;
    // Requests between the end of the first loop and the end of the last, per loop.
    let (from, to) = (times[0], times[times.len() - 1]);
    let requests = controller_requests(env, from, to)?;
    let total: usize = requests.values().sum();
    let mut requests_by_kind: Vec<(String, usize)> = requests.into_iter().collect();
    requests_by_kind.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Figures {
        first_loop: first_loop.unwrap_or_default(),
        // Seen long before the last loop; a controller that never logs it gives none.
        synced: seen_by_now(synced).await,
        acting: seen_by_now(acting).await,
        loops: durations,
        phases: phase_means(&metrics),
        rss_kib: peak_rss_kib(pid)?,
        steady_rss_kib: status_kib(pid, "VmRSS:")?,
        requests_per_loop: total as f64 / (times.len() - 1) as f64,
        requests_by_kind,
        cpu,
    })
}

/// When a log line was seen, if it was by now (a controller that never logs it gives none).
async fn seen_by_now(task: tokio::task::JoinHandle<Option<Duration>>) -> Option<Duration> {
    if task.is_finished() {
        task.await.ok().flatten()
    } else {
        task.abort();
        None
    }
}

/// The controller's loop count and summed seconds once its next loop (after `count`) is seen,
/// polling its `/metrics` once a second. Polled every 50 ms, the scrapes alone took a fifth of
/// the controller's CPU at 5,000 nodes (profiled); a loop's time comes from the histogram's
/// sum, not from when the poll saw it, so a slower poll costs no precision.
async fn next_loop(addr: &str, count: f64) -> anyhow::Result<(f64, f64)> {
    let limit = ebb_e2e::harness::scaled(Duration::from_secs(600));
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(m) = fetch_metrics(addr, None).await {
            let (c, s) = loop_totals(&m);
            if c > count {
                return Ok((c, s));
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller ran no loop for {} s (its /metrics at {addr}, loops seen {count})",
            limit.as_secs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// CPU seconds of some processes and of the whole machine at one moment.
struct CpuReading {
    at: Instant,
    /// Per process: name, user plus system seconds (`None`: gone or unreadable).
    processes: Vec<(&'static str, Option<f64>)>,
    /// Every CPU's busy seconds (`/proc/stat`: all but idle and iowait).
    machine: Option<f64>,
}

/// What [`CpuReading::until`] measured between two readings.
#[derive(Default)]
struct LoopCpu {
    wall: f64,
    processes: Vec<(&'static str, f64)>,
    machine: Option<f64>,
}

impl CpuReading {
    fn take(processes: &[(&'static str, u32)]) -> Self {
        CpuReading {
            at: Instant::now(),
            processes: processes
                .iter()
                .map(|&(name, pid)| (name, ebb_e2e::setup::cpu_seconds(pid)))
                .collect(),
            machine: machine_busy_seconds(),
        }
    }

    fn until(&self, later: &CpuReading) -> LoopCpu {
        LoopCpu {
            wall: later.at.duration_since(self.at).as_secs_f64(),
            processes: self
                .processes
                .iter()
                .zip(&later.processes)
                .filter_map(|((name, a), (_, b))| Some((*name, (*b)? - (*a)?)))
                .collect(),
            machine: later.machine.zip(self.machine).map(|(b, a)| b - a),
        }
    }
}

impl LoopCpu {
    /// `process`'s CPU milliseconds per loop over `loops` loops.
    fn per_loop_ms(&self, process: &str, loops: usize) -> Option<f64> {
        let (_, s) = self.processes.iter().find(|(n, _)| *n == process)?;
        (loops > 0).then(|| s * 1000.0 / loops as f64)
    }

    /// `CPU in the measured loops (<wall> s): machine <s> s of <s>, ebb-controller <s> s, ...`.
    fn line(&self) -> String {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let machine = self.machine.map_or(String::new(), |m| {
            format!("machine {m:.1} s of {:.1}, ", self.wall * cores as f64)
        });
        let each = self
            .processes
            .iter()
            .map(|(name, s)| format!("{name} {s:.1} s"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "CPU in the measured loops ({:.1} s): {machine}{each}",
            self.wall
        )
    }
}

/// Busy seconds of every CPU since boot, from the first line of `/proc/stat` (user, nice,
/// system, idle, iowait, irq, softirq, steal, in clock ticks of 1/100 s).
fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((ticks.iter().sum::<f64>() - idle) / 100.0)
}

/// A `perf record` of the controller (`EBB_SCALE_PERF`), stopped with SIGINT so that it writes
/// its file.
struct Profile {
    child: std::process::Child,
    file: PathBuf,
}

impl Profile {
    fn start(pid: u32, label: &str) -> anyhow::Result<Option<Profile>> {
        let Some(dir) = std::env::var_os("EBB_SCALE_PERF").map(PathBuf::from) else {
            return Ok(None);
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let slug: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let file = dir.join(format!("{slug}.perf.data"));
        let child = std::process::Command::new("perf")
            .args(["record", "-F", "499", "--call-graph", "dwarf,32768", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("EBB_SCALE_PERF is set but `perf record` cannot start (is perf installed?)")?;
        Ok(Some(Profile { child, file }))
    }

    fn stop(mut self) {
        let stopped = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        match stopped.then(|| self.child.wait()) {
            Some(Ok(_)) => println!(
                "  CPU profile of the measured loops: {} (perf report -i it)",
                self.file.display()
            ),
            _ => {
                let _ = self.child.kill();
                println!(
                    "  the CPU profile could not be stopped cleanly; {} may be incomplete",
                    self.file.display()
                );
            }
        }
    }
}

/// The controller's API requests (reads and writes) received in `[from, to)`, from the audit
/// log (one record per request id), counted by verb and resource.
fn controller_requests(
    env: &TestEnv,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let real = env
        .real()
        .context("the audit log of a real control plane")?;
    let path = real.dir().join("audit.log");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut ids = BTreeSet::new();
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if !line.contains(CONTROLLER_USER) {
            continue;
        }
        let Ok(e) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if e.pointer("/user/username").and_then(Value::as_str) != Some(CONTROLLER_USER) {
            continue;
        }
        let Some(at) = e
            .get("requestReceivedTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        else {
            continue;
        };
        if at >= from && at < to {
            let id = e.get("auditID").and_then(Value::as_str).unwrap_or_default();
            let field = |p: &str| e.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let sub = field("/objectRef/subresource");
            let kind = format!(
                "{} {}{}{}",
                field("/verb"),
                field("/objectRef/resource"),
                if sub.is_empty() { "" } else { "/" },
                sub
            );
            if ids.insert(id.to_string()) {
                *by_kind.entry(kind).or_default() += 1;
            }
        }
    }
    Ok(by_kind)
}

struct Wave {
    removed: usize,
    took: Duration,
    first: Duration,
    violations: usize,
}

/// A DrainAndDelete policy on the drain pool: how fast its nodes go, and the budgets kept.
async fn drain_wave(
    env: &TestEnv,
    drain_nodes: &[String],
    metrics_addr: &str,
) -> anyhow::Result<Wave> {
    let client = env.client.clone();
    let node_api = Api::<Node>::all(client.clone());
    // The budgets as they stand before the wave: a cluster restored from a saved etcd has no
    // record of the disruption controller publishing them in this run's audit log.
    let budgets_before = drain_pool_objects::<PodDisruptionBudget>(&client).await?;
    // Its pods likewise: the set-up wrote them to etcd, so the log has no record of them.
    let pods_before = drain_pool_objects::<Pod>(&client).await?;
    // kwok opens its pod watch at resourceVersion 0: each reopened watch replays every pod, and
    // at 150,000 pods the replays could loop and leave the wave's pods unplayed for minutes. For
    // the wave kwok is stopped and the bench plays the kubelet of the drain pool's pods, with
    // kwok's delays (nodes keep their status: the node monitor's grace period is an hour).
    // EBB_SCALE_KWOK_WAVE=1 leaves it to kwok.
    let kubelet = if env_usize("EBB_SCALE_KWOK_WAVE", 0)? == 0 {
        env.real()
            .context("stopping kwok needs the real control plane")?
            .stop_kwok()
            .await?;
        println!("  kwok stopped: the bench plays the kubelet of {DRAIN_NS}'s pods");
        Some(tokio::spawn(ebb_bench::kubelet::run(
            client.clone(),
            DRAIN_NS,
            ebb_bench::kubelet::Pacing::default(),
        )))
    } else {
        None
    };
    let started = Instant::now();
    create_policy(
        &client,
        "drain",
        json!({"mode": "DrainAndDelete", "scanInterval": "10s", "unneededTime": "0s",
               "maxDrainParallelism": 50, "maxScaleDownParallelism": 50,
               "nodeSelector": {"matchLabels": {"pool": "drain"}}}),
    )
    .await?;
    let want: BTreeSet<&str> = drain_nodes.iter().map(String::as_str).collect();
    // The drain pool's pods by phase, from a watch: a list of its 15,000 pods every 30 s (69 MB
    // of JSON, 7.7 s of the API server each at 5,000 nodes) took the CPU kwok's and the other
    // watchers needed.
    let (pods, writer) = kube::runtime::reflector::store::<Pod>();
    let pod_watch = tokio::spawn(
        kube::runtime::reflector(
            writer,
            kube::runtime::watcher(
                Api::<Pod>::namespaced(client.clone(), DRAIN_NS),
                kube::runtime::watcher::Config::default(),
            ),
        )
        .for_each(|_| futures::future::ready(())),
    );
    let mut first = None;
    let mut last_change = Instant::now();
    let mut last_progress = Instant::now();
    let mut removed = 0;
    // At most EBB_SCALE_WAVE_SECS (default: 300 s and 2 s a node); the wave also ends after
    // 300 s without a removal.
    let timeout = Duration::from_secs(
        std::env::var("EBB_SCALE_WAVE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300 + 2 * drain_nodes.len() as u64),
    );
    loop {
        let left = node_api
            .list_metadata(&ListParams::default().labels("pool=drain"))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| n.metadata.name.as_deref().is_some_and(|x| want.contains(x)))
                    .count()
            })
            .unwrap_or(drain_nodes.len());
        let now_removed = drain_nodes.len() - left;
        if now_removed > removed {
            removed = now_removed;
            last_change = Instant::now();
            first.get_or_insert_with(|| started.elapsed());
        }
        if left == 0 {
            break;
        }
        if last_progress.elapsed() >= Duration::from_secs(30) {
            last_progress = Instant::now();
            println!(
                "  wave at {:.0} s: {removed} of {} removed; {}; {}",
                started.elapsed().as_secs_f64(),
                drain_nodes.len(),
                pacing_progress(metrics_addr).await,
                policy_progress(&client, &pods).await
            );
        }
        if started.elapsed() > timeout || last_change.elapsed() > Duration::from_secs(300) {
            println!(
                "drain wave stopped: {removed} of {} removed after {:.0} s",
                drain_nodes.len(),
                started.elapsed().as_secs_f64()
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    pod_watch.abort();
    if let Some(k) = kubelet {
        k.abort();
    }
    let took = if removed == drain_nodes.len() {
        started.elapsed()
    } else {
        last_change.duration_since(started)
    };
    Ok(Wave {
        removed,
        took,
        first: first.unwrap_or_default(),
        violations: drain_violations(env, &budgets_before, &pods_before)?,
    })
}

/// What the drain policy's status says of the wave, and the drain pool's pods by phase.
/// The pacing's counts and bound, from the controller's /metrics.
async fn pacing_progress(addr: &str) -> String {
    let Ok(text) = fetch_metrics(addr, None).await else {
        return "pacing: /metrics not read".into();
    };
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map_or("?".to_string(), |v| format!("{v}"))
    };
    format!(
        "pacing: {} starting of {}",
        gauge("ebb_replacements_starting"),
        gauge("ebb_starting_replacements_limit")
    )
}

async fn policy_progress(
    client: &kube::Client,
    pods: &kube::runtime::reflector::Store<Pod>,
) -> String {
    let policy = Api::<ebb_api::ScaleDownPolicy>::all(client.clone())
        .get_opt("drain")
        .await
        .ok()
        .flatten()
        .and_then(|p| serde_json::to_value(p).ok())
        .unwrap_or_default();
    let status = &policy["status"];
    let conditions: Vec<String> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} {}",
                c["type"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .collect();
    let mut by = BTreeMap::<String, usize>::new();
    for p in pods.state() {
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let phase = if p.metadata.deletion_timestamp.is_some() {
            format!("{phase}+deleting")
        } else {
            phase
        };
        *by.entry(phase).or_default() += 1;
    }
    let pods = format!("{by:?}");
    let unremovable: Vec<String> = status["unremovable"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| format!("{}: {}", r["reason"].as_str().unwrap_or("?"), r["count"]))
        .collect();
    format!(
        "status: selected {}, candidates {}, draining {}, removed {}, unremovable [{}], conditions [{}]; drain-pool pods {pods}",
        status["nodesSelected"],
        status["candidates"],
        status["draining"],
        status["removedTotal"],
        unremovable.join(", "),
        conditions.join(", ")
    )
}

/// The drain pool's objects of kind `K` as the API server returns them.
async fn drain_pool_objects<K>(client: &kube::Client) -> anyhow::Result<Vec<Value>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api = Api::<K>::namespaced(client.clone(), DRAIN_NS);
    // An API server holding 150,000 pods on 2 cores can time a list out (504): try again.
    let mut tries = 0;
    let list = loop {
        tries += 1;
        match api.list(&ListParams::default()).await {
            Ok(l) => break l,
            Err(e) if tries < 4 => {
                eprintln!(
                    "listing the drain pool's {} (try {tries}): {e}; again in 10 s",
                    K::plural(&())
                );
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "listing the drain pool's {} ({tries} tries)",
                        K::plural(&())
                    )
                });
            }
        }
    };
    list.items
        .iter()
        .map(|o| serde_json::to_value(o).context("encoding a listed object"))
        .collect()
}

/// Budget violations by the controller, replayed from the audit log's records of the drain
/// pool's namespace (every budget and pod of the wave is there).
fn drain_violations(
    env: &TestEnv,
    budgets_before: &[Value],
    pods_before: &[Value],
) -> anyhow::Result<usize> {
    let real = env
        .real()
        .context("the audit log of a real control plane")?;
    let path = real.dir().join("audit.log");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let needle = format!("\"namespace\":\"{DRAIN_NS}\"");
    let mut text = String::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if line.contains(&needle) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    let v = ebb_e2e::pdb_safety::check_audit_text_from(
        &text,
        &[CONTROLLER_USER],
        budgets_before,
        pods_before,
    )?;
    for x in v.iter().take(5) {
        println!("  violation: {x:?}");
    }
    if !v.is_empty() {
        // The cluster's directory goes with it: keep the log the violations were found in.
        let kept = std::env::temp_dir().join(format!("ebb-scale-audit-{}.log", std::process::id()));
        match std::fs::copy(&path, &kept) {
            Ok(_) => println!("  the audit log is kept at {}", kept.display()),
            Err(e) => println!("  the audit log could not be kept: {e}"),
        }
    }
    Ok(v.len())
}

/// Waits until no pod changes for `quiet` (at most `max`): the pod watch events seen and the
/// time waited. Watches from the current version, without a first list.
async fn wait_quiet(
    client: &kube::Client,
    quiet: Duration,
    max: Duration,
) -> anyhow::Result<(usize, Duration)> {
    let api = Api::<Pod>::all(client.clone());
    let start = Instant::now();
    let mut events = 0;
    while start.elapsed() < max {
        let version = api
            .list_metadata(&ListParams::default().limit(1))
            .await
            .context("listing a pod for the current resource version")?
            .metadata
            .resource_version
            .context("a pod list without a resource version")?;
        let params = kube::api::WatchParams::default().timeout(290);
        let mut stream = api
            .watch_metadata(&params, &version)
            .await
            .context("watching pods")?
            .boxed();
        loop {
            match tokio::time::timeout(quiet, stream.next()).await {
                Err(_) => return Ok((events, start.elapsed())),
                // The watch failed (an expired version arrives as an error event) or ended
                // (its timeout): watched again from now.
                Ok(Some(Ok(kube::api::WatchEvent::Error(_)) | Err(_)) | None) => break,
                Ok(Some(Ok(_))) => events += 1,
            }
            if start.elapsed() >= max {
                break;
            }
        }
    }
    Ok((events, start.elapsed()))
}

/// Running pods in `ns`.
async fn running(client: &kube::Client, ns: &str) -> usize {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list_metadata(&ListParams::default().fields("status.phase=Running"))
        .await
        .map(|l| l.items.len())
        .unwrap_or_default()
}

/// Nodes `scale-<i>` (4 cpu, 16 GiB) and ReplicaSets owning `per_node` pods on each, bound in
/// advance (the scheduler is not what is measured): the last tenth `pool: drain` with light
/// pods (10m) of their own ReplicaSets in `scale-drain`, each with a budget; of the rest
/// (`pool: scale`) a third light, the others busy (100m). Returns the drain pool's names.
async fn populate(env: &TestEnv, nodes: usize, per_node: usize) -> anyhow::Result<Vec<String>> {
    let client = &env.client;
    let shards = kwok_shards()?;
    for ns in [NS, DRAIN_NS] {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await
            .with_context(|| format!("creating the namespace {ns}"))?;
    }
    let owners = nodes.div_ceil(NODES_PER_OWNER);
    // Whole owners in the drain pool: about a tenth of the nodes.
    let first_drain = first_drain_node(nodes);
    let real = env
        .real()
        .context("the set-up writes to the etcd of the real control plane")?;
    let etcd = EtcdLoader::new(etcd_port(env)?)?;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    // No controller runs while the objects are written: kube-controller-manager, started again
    // once they are all there, lists them at once before any of its controllers acts. (Running,
    // its ReplicaSet controller saw some owners before their pods, made pods of its own and
    // fought its own cache for minutes at 5,000 nodes.)
    real.stop_controllers().await?;
    let t_nodes = Instant::now();
    let node_puts = (0..nodes)
        .map(|i| {
            let name = format!("scale-{i}");
            let pool = if i >= first_drain { "drain" } else { "scale" };
            let res = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
            // kwok gives a pod it starts an IP from its node's podCIDR: without one it never
            // starts the replacements the drain wave's evictions make (the wave stalled after
            // the first node). The bench's own pods have IPs of another range.
            let cidr = format!("10.{}.{}.0/24", 128 + i / 256, i % 256);
            Put::cluster(
                "minions",
                json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "uid": etcd_load::uid(3, i),
                        "creationTimestamp": now,
                        "labels": {"pool": pool, "type": "kwok", "kubernetes.io/hostname": name,
                            "ebb.dev/kwok-shard": (i % shards).to_string()},
                        "annotations": {"kwok.x-k8s.io/node": "fake"}},
                    "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
                    "status": {"capacity": res, "allocatable": res}}),
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for chunk in node_puts.chunks(500) {
        etcd.put_all(chunk).await.context("writing the nodes")?;
    }
    println!(
        "  {nodes} nodes written in {:.1} s",
        t_nodes.elapsed().as_secs_f64()
    );
    let created = Instant::now();
    // Each owner with its pods in one etcd transaction, written as kube-apiserver stores them
    // (an API create and a status write per pod made 50 pods per second at 5,000 nodes, API
    // server bound).
    futures::stream::iter(0..owners)
        .map(|o| {
            let etcd = &etcd;
            let now = now.as_str();
            async move {
                let first = o * NODES_PER_OWNER;
                let last = (first + NODES_PER_OWNER).min(nodes);
                let drains = first >= first_drain;
                let ns = if drains { DRAIN_NS } else { NS };
                let app = format!("app-{o}");
                let cpu = if drains || o % 3 == 0 { "10m" } else { "100m" };
                // Drained pods end 5 s after their eviction (kwok honours the grace period).
                let grace = if drains { 5 } else { 30 };
                let template_spec = json!({"terminationGracePeriodSeconds": grace,
                    "containers": [{"name": "c", "image": "fake",
                        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]});
                let rs_uid = etcd_load::uid(1, o);
                let mut puts = Vec::with_capacity((last - first) * per_node + 1);
                for n in first..last {
                    for k in 0..per_node {
                        let pod = pod_object(PodOf {
                            name: &format!("{app}-{n}-{k}"),
                            namespace: ns,
                            uid: &etcd_load::uid(2, n * per_node + k),
                            owner: (&app, &rs_uid),
                            template_spec: &template_spec,
                            node: n,
                            k,
                            now,
                        });
                        puts.push(Put::namespaced("pods", pod)?);
                    }
                }
                puts.push(Put::namespaced(
                    "replicasets",
                    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "metadata": {"name": app, "namespace": ns, "uid": rs_uid,
                            "creationTimestamp": now, "generation": 1},
                        "spec": {"replicas": (last - first) * per_node,
                            "selector": {"matchLabels": {"app": app}},
                            "template": {"metadata": {"labels": {"app": app}},
                                "spec": template_spec}}}),
                )?);
                etcd.put_all(&puts)
                    .await
                    .with_context(|| format!("writing ReplicaSet {ns}/{app} and its pods"))?;
                if o % 50 == 49 {
                    println!(
                        "  {} of {owners} owners written ({:.0} pods/s)",
                        o + 1,
                        ((o + 1) * NODES_PER_OWNER * per_node) as f64
                            / created.elapsed().as_secs_f64().max(0.001)
                    );
                }
                anyhow::Ok(())
            }
        })
        .buffered(ETCD_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    real.start_controllers().await?;
    // The drain pool's budgets, once their pods are there.
    for o in drain_owners_range(nodes) {
        let app = format!("app-{o}");
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": app},
            "spec": {"maxUnavailable": "10%", "selector": {"matchLabels": {"app": app}}}
        }))?;
        Api::<PodDisruptionBudget>::namespaced(client.clone(), DRAIN_NS)
            .create(&PostParams::default(), &pdb)
            .await
            .with_context(|| format!("creating PodDisruptionBudget {app}"))?;
    }
    let want = nodes * per_node;
    wait_for("every pod created", Duration::from_secs(600), || async {
        let mut n = 0;
        for ns in [NS, DRAIN_NS] {
            n += Api::<Pod>::namespaced(client.clone(), ns)
                .list_metadata(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
        }
        (n >= want).then_some(())
    })
    .await?;
    Ok(drain_pool(nodes))
}

/// The status a kubelet reports for a started pod, written by the bench itself: kwok's two pod
/// stages (created, then ready, each a templated status write and the first an Event) made pods
/// Running at about 7 per second on the 2-core machine. With a pod IP and a started container no
/// kwok pod stage matches the pod any more; its deletion is still kwok's.
fn running_status(node: usize, k: usize) -> Value {
    ebb_bench::kubelet::running_status(
        &format!("10.{}.{}.{}", 64 + node / 256, node % 256, k + 1),
        &[("c", "fake")],
        jiff::Timestamp::now(),
    )
}

/// What a bench pod is made of.
struct PodOf<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    /// Its ReplicaSet's name and uid.
    owner: (&'a str, &'a str),
    template_spec: &'a Value,
    node: usize,
    /// Its index on the node.
    k: usize,
    now: &'a str,
}

/// A Running pod as kube-apiserver would hold it after the ReplicaSet controller made it, the
/// scheduler bound it and a kubelet started it: what admission adds (the service account's
/// projected volume and its mount, the default tolerations) and the three managers'
/// `managedFields`. Without them a pod is half the size, and listing 150,000 of them is
/// cheaper than on a real cluster.
fn pod_object(p: PodOf<'_>) -> Value {
    let (app, rs_uid) = p.owner;
    let now = p.now;
    let mut spec = p.template_spec.clone();
    spec["nodeName"] = json!(format!("scale-{}", p.node));
    spec["serviceAccountName"] = json!("default");
    spec["tolerations"] = json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    ]);
    let volume = format!("kube-api-access-{}", &p.uid[p.uid.len() - 5..]);
    spec["volumes"] = json!([{"name": volume, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}}]);
    spec["containers"][0]["volumeMounts"] = json!([{"name": volume,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]);
    let mut status = running_status(p.node, p.k)["status"].take();
    status["qosClass"] = json!("Burstable");
    let pod_ip = status["podIP"].clone();
    let host_ip = format!("10.1.{}.{}", p.node / 256, p.node % 256);
    status["hostIP"] = json!(host_ip);
    status["hostIPs"] = json!([{"ip": host_ip}]);
    let cond_fields = json!({".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
        "f:status": {}, "f:type": {}});
    let managed = json!([
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kube-controller-manager",
         "operation": "Update", "time": now, "fieldsV1": {
            "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}},
                "f:ownerReferences": {".": {}, format!("k:{{\"uid\":\"{rs_uid}\"}}"): {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {},
                    "f:imagePullPolicy": {}, "f:name": {},
                    "f:resources": {".": {}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
                    "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                "f:schedulerName": {}, "f:securityContext": {},
                "f:terminationGracePeriodSeconds": {}}}},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kube-scheduler",
         "operation": "Update", "subresource": "status", "time": now, "fieldsV1": {
            "f:status": {"f:conditions": {".": {},
                "k:{\"type\":\"PodScheduled\"}": cond_fields.clone()}}}},
        {"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kubelet",
         "operation": "Update", "subresource": "status", "time": now, "fieldsV1": {
            "f:status": {"f:conditions": {
                    "k:{\"type\":\"ContainersReady\"}": cond_fields.clone(),
                    "k:{\"type\":\"Initialized\"}": cond_fields.clone(),
                    "k:{\"type\":\"Ready\"}": cond_fields},
                "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:phase": {},
                "f:podIP": {}, "f:podIPs": {".": {},
                    format!("k:{{\"ip\":{pod_ip}}}"): {".": {}, "f:ip": {}}},
                "f:startTime": {}}}}
    ]);
    // The DryRun pool's pods never move: kwok leaves them alone (its disregard label; a label,
    // not an annotation, so that the pods stay as the earlier runs measured them). kwok opens
    // its pod watch at resourceVersion 0, so each time that watch ends (every 5 to 10 minutes,
    // or when the API server drops it as slow) it is sent every pod again and matches each
    // against its stages on one goroutine: at 150,000 pods that took minutes, the drain wave's
    // pods waited behind it, and the replays came faster than kwok got through them.
    let labels = if p.namespace == NS {
        json!({"app": app, "ebb.dev/e2e-unmanaged": "true"})
    } else {
        json!({"app": app})
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "generateName": format!("{app}-"),
            "namespace": p.namespace, "uid": p.uid, "creationTimestamp": now,
            "labels": labels, "managedFields": managed,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app,
                "uid": rs_uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": spec, "status": status})
}

/// The drain pool's owners: the last tenth, rounded up.
fn drain_owners_range(nodes: usize) -> std::ops::Range<usize> {
    let owners = nodes.div_ceil(NODES_PER_OWNER);
    owners - owners.div_ceil(10)..owners
}

/// The port of the control plane's etcd (`cluster.sh` writes it to the cluster's `env`).
fn etcd_port(env: &TestEnv) -> anyhow::Result<u16> {
    let real = env
        .real()
        .context("writing to etcd needs the real control plane")?;
    let path = real.dir().join("env");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("export EBB_K8S_ETCD_PORT="))
        .context("the cluster's env names no EBB_K8S_ETCD_PORT")?
        .trim()
        .parse()
        .context("EBB_K8S_ETCD_PORT is not a port")
}

/// The first node of the drain pool: whole owners, about a tenth of the nodes.
fn first_drain_node(nodes: usize) -> usize {
    drain_owners_range(nodes).start * NODES_PER_OWNER
}

/// The drain pool's node names (`populate` labels them `pool: drain`).
fn drain_pool(nodes: usize) -> Vec<String> {
    (first_drain_node(nodes)..nodes)
        .map(|i| format!("scale-{i}"))
        .collect()
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Prints the control plane's resident memory (etcd, kube-apiserver and the rest), now and at
/// peak, from their recorded pids.
/// The control plane's processes and their pids (those running).
fn control_plane_pids(env: &TestEnv) -> Vec<(&'static str, u32)> {
    let Some(real) = env.real() else {
        return Vec::new();
    };
    [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "kwok-1",
        "kwok-2",
        "kwok-3",
    ]
    .into_iter()
    .take(4 + kwok_shards().unwrap_or(1))
    .filter_map(|c| {
        let pid = std::fs::read_to_string(real.dir().join("pids").join(format!("{c}.pid")))
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()?;
        Some((c, pid))
    })
    .collect()
}

fn report_cluster_rss(env: &TestEnv) {
    let mut parts = Vec::new();
    for (c, pid) in control_plane_pids(env) {
        let field = |f: &str| status_kib(pid, f).map(|k| k / 1024).unwrap_or_default();
        parts.push(format!(
            "{c} {} MiB (peak {})",
            field("VmRSS:"),
            field("VmHWM:")
        ));
    }
    println!("control plane RSS: {}", parts.join(", "));
}

/// The loops the controller ran and their seconds in all, from the policy's
/// `ebb_loop_phase_duration_seconds`: the count of its `status_write` phase (the last of every
/// loop) and the sum over every phase.
fn loop_totals(metrics: &str) -> (f64, f64) {
    let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    let mut count = 0.0;
    let mut sum = 0.0;
    for line in metrics.lines() {
        if line.starts_with("ebb_loop_phase_duration_seconds_count{")
            && line.contains("phase=\"status_write\"")
        {
            count += value(line).unwrap_or_default();
        } else if line.starts_with("ebb_loop_phase_duration_seconds_sum{") {
            sum += value(line).unwrap_or_default();
        }
    }
    (count, sum)
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

fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmHWM:")
}

/// Lists every pod in pages of 500 with `Accept: application/vnd.kubernetes.protobuf`: the pods
/// listed, the bytes read and the seconds it took.
async fn list_pods_protobuf(client: &kube::Client) -> anyhow::Result<(usize, usize, f64)> {
    use http_body_util::BodyExt;
    use prost::Message;
    let t = Instant::now();
    let (mut listed, mut bytes) = (0usize, 0usize);
    let mut next: Option<String> = None;
    loop {
        let mut uri = "/api/v1/pods?limit=500".to_string();
        if let Some(c) = next.take() {
            uri += &format!("&continue={c}");
        }
        let req = http::Request::get(&uri)
            .header("Accept", "application/vnd.kubernetes.protobuf")
            .body(kube::client::Body::empty())?;
        let resp = client.send(req).await.context("a protobuf page of pods")?;
        anyhow::ensure!(resp.status().is_success(), "{} for {uri}", resp.status());
        let body = resp.into_body().collect().await?.to_bytes();
        bytes += body.len();
        let rest = body
            .strip_prefix(b"k8s\0")
            .context("a protobuf answer starts with k8s\\0")?;
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(rest)?;
        let list = k8s_pb::api::core::v1::PodList::decode(unknown.raw())?;
        listed += list.items.len();
        match list.metadata.and_then(|m| m.r#continue) {
            Some(c) if !c.is_empty() => {
                next = Some(url::form_urlencoded::byte_serialize(c.as_bytes()).collect())
            }
            _ => break,
        }
    }
    Ok((listed, bytes, t.elapsed().as_secs_f64()))
}
