//! ebb against the scale-down of Cluster Autoscaler and Karpenter on the same real control plane:
//! one fresh cluster per scenario and scaler, judged from the audit log and the final state only.

pub mod observe;
pub mod scenario;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{ChildProcess, TestEnv, wait_for};
use scenario::{GROUP, GROUP_LABEL, Scenario};

/// The settings every scaler gets, in ebb's terms (Cluster Autoscaler's flags and Karpenter's
/// NodePool fields are set from these).
#[derive(Clone, Debug)]
pub struct Settings {
    pub scan_interval: Duration,
    pub unneeded_time: Duration,
    pub max_scale_down_parallelism: u32,
    pub max_drain_parallelism: u32,
    /// ebb only: wait between eviction retries after a PDB said no (Cluster Autoscaler's is a
    /// fixed 10 s in its code; Karpenter's eviction queue backs off by itself).
    pub eviction_retry_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            scan_interval: Duration::from_secs(10),
            unneeded_time: Duration::from_secs(30),
            max_scale_down_parallelism: 10,
            max_drain_parallelism: 10,
            eviction_retry_interval: Duration::from_secs(1),
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scaler {
    Ebb,
    ClusterAutoscaler,
    Karpenter,
}

impl Scaler {
    pub const ALL: [Scaler; 3] = [Scaler::Ebb, Scaler::ClusterAutoscaler, Scaler::Karpenter];

    pub fn name(self) -> &'static str {
        match self {
            Scaler::Ebb => "ebb",
            Scaler::ClusterAutoscaler => "cluster-autoscaler",
            Scaler::Karpenter => "karpenter",
        }
    }

    /// The settings this scaler runs with, as written in the output.
    pub fn settings_line(self, s: &Settings) -> String {
        match self {
            Scaler::Ebb => format!(
                "ebb {}: ScaleDownPolicy mode DrainAndDelete, scanInterval {}, unneededTime {}, maxScaleDownParallelism {}, maxDrainParallelism {}, evictionRetryInterval {}, utilizationThreshold 0.5 and the rest at their defaults; controller --recheck-delay 200ms",
                env!("CARGO_PKG_VERSION"),
                secs(s.scan_interval),
                secs(s.unneeded_time),
                s.max_scale_down_parallelism,
                s.max_drain_parallelism,
                secs(s.eviction_retry_interval)
            ),
            Scaler::ClusterAutoscaler => format!(
                "cluster-autoscaler: --cloud-provider=kwok --scan-interval={} --scale-down-unneeded-time={} --max-scale-down-parallelism={} --max-drain-parallelism={} --scale-down-delay-after-add=0s --leader-elect=false, the rest at its defaults",
                secs(s.scan_interval),
                secs(s.unneeded_time),
                s.max_scale_down_parallelism,
                s.max_drain_parallelism
            ),
            Scaler::Karpenter => format!(
                "karpenter: NodePool disruption consolidationPolicy WhenEmptyOrUnderutilized, consolidateAfter {}, budgets nodes \"{}\"",
                secs(s.unneeded_time),
                s.max_scale_down_parallelism
            ),
        }
    }
}

/// What one scaler did to one scenario, from the audit log and the cluster's final state.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub node_deletes: usize,
    /// From the scaler's start to the last Node deletion the API server accepted.
    pub time_to_final: Option<Duration>,
    pub evictions: usize,
    pub refused_evictions: usize,
    /// Pods deleted directly (not through the Eviction API) by the scaler's user.
    pub direct_pod_deletes: usize,
    pub pdb_violations: usize,
    pub longest_pending: Option<Duration>,
    pub never_came_back: usize,
    pub cpu_seconds: Option<f64>,
    /// The run was cut at the scenario's cap while the node count still changed.
    pub cut: bool,
}

/// One cell of the comparison.
#[derive(Clone, Debug)]
pub enum Outcome {
    Ran(Measured),
    /// The scaler could not run here, and why.
    NotRun(String),
}

/// A running scaler: its process (CPU time from `/proc`).
struct Running {
    child: ChildProcess,
    _log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Running {
    fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.id()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // fields after the ")" that ends the command name: state is field 3, utime 14, stime 15
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = f.get(11)?.parse().ok()?;
        let stime: f64 = f.get(12)?.parse().ok()?;
        Some((utime + stime) / clock_ticks())
    }
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The directory of the peers' binaries (`e2e/k8s/build.sh peers`).
pub fn peers_bin_dir() -> anyhow::Result<PathBuf> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("k8s")
        .join("build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--print-bin-dir")
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Why a peer cannot run on this machine, if it cannot.
pub fn unavailable(scaler: Scaler) -> Option<String> {
    match scaler {
        Scaler::Ebb => None,
        Scaler::ClusterAutoscaler => {
            let bin = peers_bin_dir().ok()?.join("cluster-autoscaler");
            (!bin.is_file()).then(|| {
                "not built: k8s.io/autoscaler/cluster-autoscaler cannot be resolved from the Go module proxy here (the proxy serves one commit, 1959f5f61f6c of 2025-06-13; its apis module at that commit is not served and the published apis version its go.mod requires lacks provisioningrequest v1); see e2e/k8s/build.sh".to_string()
            })
        }
        Scaler::Karpenter => Some(
            "not run: Karpenter consolidates only nodes it provisioned itself (NodeClaims from its own instance types), so it cannot be given this scenario's nodes; a Karpenter-provisioned variant of the scenarios is not written yet".to_string(),
        ),
    }
}

async fn start_ebb(env: &TestEnv, s: &Settings) -> anyhow::Result<Running> {
    let c = env.client.clone();
    for crd in ebb_api::crdgen::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        Api::<CustomResourceDefinition>::all(c.clone())
            .patch(
                &name,
                &PatchParams::apply("ebb-versus").force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("cannot apply CRD {name}"))?;
    }
    Api::<Namespace>::all(c.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "ebb-system"}}))?,
        )
        .await
        .context("cannot create namespace ebb-system")?;
    let mut child = env.spawn_binary(
        "ebb-controller",
        &[
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            "false",
            "--namespace",
            "ebb-system",
            "--identity",
            "ebb-controller",
            "--recheck-delay",
            "200ms",
            "--log-filter",
            "warn",
        ],
    )?;
    let log = child.capture_output();
    let policy: ebb_api::ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "ScaleDownPolicy",
        "metadata": {"name": "versus"},
        "spec": {"nodeSelector": {"matchLabels": {GROUP_LABEL: GROUP}}, "mode": "DrainAndDelete",
                 "scanInterval": secs(s.scan_interval), "unneededTime": secs(s.unneeded_time),
                 "maxScaleDownParallelism": s.max_scale_down_parallelism,
                 "maxDrainParallelism": s.max_drain_parallelism,
                 "evictionRetryInterval": secs(s.eviction_retry_interval),
                 "utilizationThreshold": 0.5}
    }))?;
    wait_for(
        "the ScaleDownPolicy to be accepted",
        Duration::from_secs(30),
        || async {
            Api::<ebb_api::ScaleDownPolicy>::all(c.clone())
                .create(&PostParams::default(), &policy)
                .await
                .ok()
        },
    )
    .await?;
    Ok(Running { child, _log: log })
}

async fn node_count(client: &kube::Client) -> anyhow::Result<usize> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={GROUP}")))
        .await?
        .items
        .len())
}

fn parse_time(t: &str) -> Option<jiff::Timestamp> {
    t.parse().ok()
}

/// Runs `scaler` on a fresh real cluster holding `scenario`; `progress` gets one line per step.
pub async fn run(
    scenario: &Scenario,
    scaler: Scaler,
    settings: &Settings,
) -> anyhow::Result<Outcome> {
    if let Some(why) = unavailable(scaler) {
        return Ok(Outcome::NotRun(why));
    }
    let t_setup = Instant::now();
    let env = TestEnv::start_real(0).await?;
    let client = env.client.clone();
    let budgets = scenario::build(&client, scenario).await?;
    eprintln!(
        "versus {} / {}: {} nodes, {} pods ready in {:.0}s",
        scenario.name,
        scaler.name(),
        scenario.nodes,
        scenario.pods(),
        t_setup.elapsed().as_secs_f64()
    );
    let nodes_before = node_count(&client).await?;
    let observer = observe::Observer::start(client.clone(), budgets).await?;

    let started_at = jiff::Timestamp::now();
    let t0 = Instant::now();
    // The name the audit log records for the scaler's own writes.
    let scaler_user = match scaler {
        Scaler::Ebb => env.audit_user("ebb-controller"),
        Scaler::ClusterAutoscaler | Scaler::Karpenter => "kubernetes-admin".to_string(),
    };
    let running = match scaler {
        Scaler::Ebb => start_ebb(&env, settings).await?,
        Scaler::ClusterAutoscaler | Scaler::Karpenter => {
            bail!("{} cannot be started here", scaler.name())
        }
    };

    // Until the node count has not changed for the settle window (and the first chance to remove
    // anything has passed), or the cap.
    let settle = settings.unneeded_time + settings.scan_interval * 3 + Duration::from_secs(20);
    let mut last = nodes_before;
    let mut last_change = Instant::now();
    let mut cut = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = node_count(&client).await?;
        if n != last {
            last = n;
            last_change = Instant::now();
        }
        if last_change.elapsed() >= settle && t0.elapsed() >= settle {
            break;
        }
        if t0.elapsed() >= scenario.cap {
            cut = true;
            break;
        }
    }
    let cpu_seconds = running.cpu_seconds();
    drop(running);
    // Replacements get their chance to run before "never came back" is counted.
    let mut never_came_back = scenario::missing_pods(&client, scenario).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while never_came_back > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        never_came_back = scenario::missing_pods(&client, scenario).await?;
    }
    let observed = observer.stop();
    let nodes_after = node_count(&client).await?;

    let records = env.audit()?;
    let after_start = |r: &crate::AuditRecord| parse_time(&r.time).is_some_and(|t| t >= started_at);
    let mut m = Measured {
        nodes_before,
        nodes_after,
        never_came_back,
        cpu_seconds,
        cut,
        pdb_violations: observed.violations.len(),
        longest_pending: observed.longest_pending.map(|(d, _)| d),
        ..Measured::default()
    };
    for v in &observed.violations {
        eprintln!(
            "versus {} / {}: PDB violation: {} left {} with {} healthy (desired {})",
            scenario.name,
            scaler.name(),
            v.pod,
            v.budget,
            v.healthy_after,
            v.desired_healthy
        );
    }
    let mut last_delete: Option<jiff::Timestamp> = None;
    for r in records.iter().filter(|r| after_start(r)) {
        match (r.verb.as_str(), r.resource.as_str(), r.subresource.as_str()) {
            ("create", "pods", "eviction") if r.code == 201 => m.evictions += 1,
            ("create", "pods", "eviction") if r.code == 429 => m.refused_evictions += 1,
            ("delete", "pods", "") if r.user == scaler_user && (200..300).contains(&r.code) => {
                m.direct_pod_deletes += 1
            }
            ("delete", "nodes", "") if (200..300).contains(&r.code) => {
                m.node_deletes += 1;
                let t = parse_time(&r.time);
                if t > last_delete {
                    last_delete = t;
                }
            }
            _ => {}
        }
    }
    m.time_to_final = last_delete.and_then(|t| {
        let d = t.duration_since(started_at);
        Duration::try_from(d).ok()
    });
    Ok(Outcome::Ran(m))
}

fn cell<T>(o: &Outcome, f: impl Fn(&Measured) -> T, show: impl Fn(T) -> String) -> String {
    match o {
        Outcome::Ran(m) => show(f(m)),
        Outcome::NotRun(_) => "n/a".into(),
    }
}

fn opt_secs(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64()))
}

/// The table of one scenario (Markdown), then the reasons for any scaler that did not run.
pub fn table(scenario: &Scenario, results: &[(Scaler, Outcome)]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "### {}\n\n{}\n\n",
        scenario.name, scenario.description
    ));
    out.push_str("| |");
    for (s, _) in results {
        out.push_str(&format!(" {} |", s.name()));
    }
    out.push_str("\n|---|");
    for _ in results {
        out.push_str("---:|");
    }
    out.push('\n');
    type Row = (&'static str, Box<dyn Fn(&Outcome) -> String>);
    let rows: Vec<Row> = vec![
        (
            "nodes before → after",
            Box::new(|o| {
                cell(
                    o,
                    |m| (m.nodes_before, m.nodes_after),
                    |(a, b)| format!("{a} → {b}"),
                )
            }),
        ),
        (
            "nodes removed",
            Box::new(|o| cell(o, |m| m.node_deletes, |n| n.to_string())),
        ),
        (
            "time to final node count (s)",
            Box::new(|o| {
                cell(
                    o,
                    |m| (m.time_to_final, m.cut),
                    |(t, cut)| format!("{}{}", opt_secs(t), if cut { " (cut)" } else { "" }),
                )
            }),
        ),
        (
            "evictions",
            Box::new(|o| cell(o, |m| m.evictions, |n| n.to_string())),
        ),
        (
            "refused evictions (429)",
            Box::new(|o| cell(o, |m| m.refused_evictions, |n| n.to_string())),
        ),
        (
            "direct pod deletes",
            Box::new(|o| cell(o, |m| m.direct_pod_deletes, |n| n.to_string())),
        ),
        (
            "PDB violations",
            Box::new(|o| cell(o, |m| m.pdb_violations, |n| n.to_string())),
        ),
        (
            "longest Pending (s)",
            Box::new(|o| cell(o, |m| m.longest_pending, opt_secs)),
        ),
        (
            "pods that never came back",
            Box::new(|o| cell(o, |m| m.never_came_back, |n| n.to_string())),
        ),
        (
            "scaler CPU (s)",
            Box::new(|o| {
                cell(
                    o,
                    |m| m.cpu_seconds,
                    |c| c.map_or("-".into(), |c| format!("{c:.2}")),
                )
            }),
        ),
    ];
    for (label, f) in &rows {
        out.push_str(&format!("| {label} |"));
        for (_, o) in results {
            out.push_str(&format!(" {} |", f(o)));
        }
        out.push('\n');
    }
    for (s, o) in results {
        if let Outcome::NotRun(why) = o {
            out.push_str(&format!("\n{}: {why}\n", s.name()));
        }
    }
    out
}

/// `versus <scenario>: ebb <s> s, cluster-autoscaler <s> s, karpenter <s|n/a> s; removed
/// <n>/<n>/<n>; pdb violations <n>/<n>/<n>` (ebb, Cluster Autoscaler, Karpenter).
pub fn summary_line(scenario: &Scenario, results: &[(Scaler, Outcome)]) -> String {
    let get = |s: Scaler| results.iter().find(|(x, _)| *x == s).map(|(_, o)| o);
    let time = |s| match get(s) {
        Some(Outcome::Ran(m)) => m
            .time_to_final
            .map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())),
        _ => "n/a".into(),
    };
    let num = |s, f: fn(&Measured) -> usize| match get(s) {
        Some(Outcome::Ran(m)) => f(m).to_string(),
        _ => "n/a".into(),
    };
    let [e, c, k] = Scaler::ALL;
    format!(
        "versus {}: ebb {} s, cluster-autoscaler {} s, karpenter {} s; removed {}/{}/{}; pdb violations {}/{}/{}",
        scenario.name,
        time(e),
        time(c),
        time(k),
        num(e, |m| m.node_deletes),
        num(c, |m| m.node_deletes),
        num(k, |m| m.node_deletes),
        num(e, |m| m.pdb_violations),
        num(c, |m| m.pdb_violations),
        num(k, |m| m.pdb_violations),
    )
}
