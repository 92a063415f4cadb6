//! `ebb-demo`: a simulated cluster of about 60 nodes, ebb's CRDs, a ScaleDownPolicy and the
//! controller in one process; shows the drains live, then a summary (exit 1 on a PDB violation).

#[path = "../demo/mod.rs"]
mod demo;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use ebb_api::ScaleDownPolicy;
use ebb_controller::cli::RunArgs;
use ebb_controller::cli::run::{Clients, Exit, Settings, serve};
use ebb_e2e::{Sim, SimConfig};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use demo::cluster::{self, POOL, POOL_LABEL};
use demo::progress::{Display, Until, follow};
use demo::summary::Summary;

/// The controller's user on the simulator (its writes carry this name in the audit log).
const CONTROLLER: &str = "ebb-controller";
const POLICY: &str = "general";
/// The policy's loop interval and how long a node must be unneeded (real time).
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
const UNNEEDED_TIME: Duration = Duration::from_secs(2);

#[derive(Parser)]
#[command(
    name = "ebb-demo",
    about = "Scale down a simulated cluster with ebb and watch it happen"
)]
struct Cli {
    /// Nodes in the simulated cluster (at least 4).
    #[arg(long, default_value_t = 60)]
    nodes: usize,
    /// Simulated time runs this many times faster than real time (pods' 30 s grace periods
    /// last 30/F seconds).
    #[arg(long, default_value_t = 20.0)]
    time_factor: f64,
    /// After the summary, keep the simulator (and the controller) running for kubectl until
    /// Ctrl-C.
    #[arg(long)]
    keep: bool,
    /// Port of the simulated API server on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where `--keep` writes the kubeconfig.
    #[arg(long, default_value_os_t = std::env::temp_dir().join("ebb-demo.kubeconfig"))]
    kubeconfig_out: PathBuf,
    /// The policy's mode.
    #[arg(long, default_value = "DrainAndDelete", value_parser = ["Drain", "DrainAndDelete"])]
    mode: String,
    /// Give up (exit 1) when the policy has not settled after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// `ebb-controller run`'s flags, to build the in-process controller's settings as the binary
/// would.
#[derive(Parser)]
struct ControllerArgs {
    #[command(flatten)]
    run: RunArgs,
}

/// The controller's settings: one replica (no leader election), a short re-check delay and
/// loop debounce so the demo moves quickly.
fn controller_settings() -> anyhow::Result<Settings> {
    let args = ControllerArgs::try_parse_from([
        "ebb-controller",
        "--metrics-addr",
        "127.0.0.1:0",
        "--leader-election",
        "false",
        "--identity",
        "ebb-demo",
        "--recheck-delay",
        "300ms",
    ])
    .context("the in-process controller's flags do not parse")?;
    // The demo cluster has the chart's namespace for the token Secret.
    let mut settings = Settings::from_args(&args.run, "ebb-system");
    settings.debounce = Duration::from_millis(200);
    Ok(settings)
}

fn policy(mode: &str) -> anyhow::Result<ScaleDownPolicy> {
    serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1",
        "kind": "ScaleDownPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "nodeSelector": {"matchLabels": {POOL_LABEL: POOL}},
            "mode": mode,
            "scanInterval": format!("{}s", SCAN_INTERVAL.as_secs()),
            "unneededTime": format!("{}s", UNNEEDED_TIME.as_secs()),
            "utilizationThreshold": 0.5,
            "maxScaleDownParallelism": 10,
            "maxDrainParallelism": 10,
            "evictionRetryInterval": "500ms",
            "maxPodEvictionTime": "60s",
            "recentEvictionWindow": "5s",
        },
    }))
    .context("the demo's ScaleDownPolicy does not parse")
}

async fn count_ready_pods(client: &kube::Client) -> anyhow::Result<usize> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(pods
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
        .count())
}

async fn count_nodes(client: &kube::Client) -> anyhow::Result<usize> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len())
}

/// Waits (up to 30 s) for the evicted pods' replacements to be Ready; returns (ready, expected).
async fn settle_pods(
    client: &kube::Client,
    layout: &cluster::Layout,
) -> anyhow::Result<(usize, usize)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let expected = layout.pods + layout.daemonsets * count_nodes(client).await?;
        let ready = count_ready_pods(client).await?;
        if ready >= expected || tokio::time::Instant::now() >= deadline {
            return Ok((ready, expected));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn demo(cli: Cli) -> anyhow::Result<bool> {
    if cli.nodes < 4 {
        bail!(
            "--nodes {} is too few: the demo needs at least 4",
            cli.nodes
        );
    }
    if !(cli.time_factor.is_finite() && cli.time_factor > 0.0) {
        bail!(
            "--time-factor {} must be a positive number",
            cli.time_factor
        );
    }
    let sim = Sim::start(SimConfig {
        port: cli.port,
        time_factor: cli.time_factor,
        ..SimConfig::default()
    })
    .await?;
    let client = sim.client().await?;
    println!(
        "ebb demo: a simulated cluster on {} (time factor {}), {} nodes",
        sim.url(),
        cli.time_factor,
        cli.nodes
    );
    let mut display = Display::new(cli.nodes);
    let layout = cluster::build(&sim, &client, cli.nodes).await?;
    display.line(
        &format!(
            "cluster ready: {} nodes, {} Deployments and a StatefulSet with PDBs ({} pods), {} DaemonSets, {} pods that cannot move",
            layout.nodes, layout.deployments, layout.pods, layout.daemonsets, layout.unmovable
        ),
        None,
    );

    let stop = CancellationToken::new();
    let settings = controller_settings()?;
    // The simulator's clients never retry on their own, so one serves both purposes.
    let controller = tokio::spawn(serve(
        Clients::single(sim.client_as(CONTROLLER).await?),
        settings,
        stop.clone(),
    ));
    // Let it sync its caches and finish start-up recovery first: a policy that arrives before
    // the controller acts is only looked at again on its next requeue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mode = cli.mode.clone();
    Api::<ScaleDownPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy(&mode)?)
        .await
        .context("cannot create the demo's ScaleDownPolicy")?;
    display.line(
        &format!(
            "ScaleDownPolicy {POLICY} applied: nodes {POOL_LABEL}={POOL}, mode {mode}, maxDrainParallelism 10, controller running"
        ),
        None,
    );
    let sim0 = sim.api.clock.now();
    let status = follow(
        &client,
        POLICY,
        &mut display,
        Until {
            settle: UNNEEDED_TIME + SCAN_INTERVAL * 3,
            timeout: Duration::from_secs(cli.timeout),
        },
    )
    .await?;
    let pods = settle_pods(&client, &layout).await?;
    let elapsed = display.elapsed();
    let sim_elapsed =
        Duration::try_from(sim.api.clock.now().duration_since(sim0)).unwrap_or_default();
    let summary = Summary::new(
        cli.nodes,
        &status,
        &sim.audit(),
        CONTROLLER,
        cluster::DAEMONS,
        sim.pdb_violations(),
        pods,
        (elapsed, sim_elapsed),
        cli.time_factor,
    );
    println!();
    println!("Summary");
    for l in summary.lines() {
        println!("  {l}");
    }
    println!();
    let ok = summary.violations.is_empty();

    if cli.keep {
        sim.write_kubeconfig(&cli.kubeconfig_out, &["admin", CONTROLLER])?;
        let kc = cli.kubeconfig_out.display();
        println!("The simulator keeps serving (Ctrl-C to stop). Inspect it with:");
        println!("  export KUBECONFIG={kc}");
        println!("  kubectl get scaledownpolicies,nodes");
        println!("  kubectl get events -n default --sort-by=.metadata.creationTimestamp");
        println!("  kubectl get pods -A -o wide");
        tokio::signal::ctrl_c()
            .await
            .context("cannot wait for Ctrl-C")?;
    } else {
        println!("Run it with --keep to inspect the cluster with kubectl afterwards.");
    }
    stop.cancel();
    match controller.await {
        Ok(Ok(Exit::Stopped)) => {}
        Ok(Ok(other)) => bail!("the controller ended unexpectedly: {other:?}"),
        Ok(Err(e)) => return Err(e.context("the controller failed")),
        Err(e) => bail!("the controller task failed: {e}"),
    }
    Ok(ok)
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    // Quiet unless RUST_LOG asks for logs (they go to stderr).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let cli = Cli::parse();
    if demo(cli).await? {
        Ok(std::process::ExitCode::SUCCESS)
    } else {
        eprintln!("ebb-demo: PodDisruptionBudgets were violated (see the summary)");
        Ok(std::process::ExitCode::FAILURE)
    }
}
