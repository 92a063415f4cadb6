//! ebb against the scale-down of Cluster Autoscaler and Karpenter on the same real control plane:
//! one fresh cluster per scenario and column (a scaler on one kind of nodes), judged from the
//! audit log and the final state only.
//!
//! Each scenario has two variants of its nodes: kwok nodes the bench creates (which ebb and
//! Cluster Autoscaler's kwok provider accept), and the same number and size of nodes launched by
//! Karpenter's KWOK provider as NodeClaims of one NodePool ([`karpenter_nodes`]), which Karpenter
//! can consolidate and ebb removes by deleting their NodeClaims (`removal.method: Auto`).

pub mod cluster_autoscaler;
pub mod karpenter_nodes;
pub mod observe;
pub mod packing;
pub mod record;
pub mod scenario;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use ebb_e2e::harness::{ChildProcess, TestEnv, wait_for};
use scenario::{GPU_TYPE_LABEL, GROUP, GROUP_LABEL, SHAPE_LABEL, Scenario};

/// The settings deliberately matched between the scalers, in ebb's terms (Cluster Autoscaler's
/// flags and Karpenter's NodePool fields are set from these). Everything else runs at each
/// scaler's defaults.
#[derive(Clone, Debug)]
pub struct Settings {
    pub scan_interval: Duration,
    pub unneeded_time: Duration,
    pub max_scale_down_parallelism: u32,
    pub max_drain_parallelism: u32,
    /// ebb's `utilizationThreshold` and Cluster Autoscaler's `--scale-down-utilization-threshold`
    /// (ebb's default unless set; Karpenter has none). At ebb's default the policy leaves the
    /// field out.
    pub utilization_threshold: f64,
    /// ebb's `minNodesPerGroup` at its default, the minimum size of Cluster Autoscaler's node
    /// group (the kwok provider's `min-count` annotation); Karpenter has none.
    pub min_nodes_per_group: i32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            scan_interval: Duration::from_secs(10),
            unneeded_time: Duration::from_secs(30),
            max_scale_down_parallelism: 10,
            max_drain_parallelism: 10,
            utilization_threshold: ebb_default_threshold(),
            min_nodes_per_group: ebb_api::ScaleDownPolicySpec::default().min_nodes_per_group,
        }
    }
}

/// ebb's default `utilizationThreshold` (what a ScaleDownPolicy without the field gets).
pub fn ebb_default_threshold() -> f64 {
    ebb_api::ScaleDownPolicySpec::default().utilization_threshold
}

/// The thresholds to measure: `EBB_VERSUS_UTILIZATION_THRESHOLD`, a comma-separated list of
/// numbers in (0, 1], else ebb's default alone. ebb's columns and Cluster Autoscaler's run once
/// per threshold (it sets ebb's `utilizationThreshold` and Cluster Autoscaler's
/// `--scale-down-utilization-threshold`); Karpenter's once.
pub fn thresholds_from_env() -> anyhow::Result<Vec<f64>> {
    let Ok(v) = std::env::var("EBB_VERSUS_UTILIZATION_THRESHOLD") else {
        return Ok(vec![ebb_default_threshold()]);
    };
    let mut out = Vec::new();
    for t in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let x: f64 = t.parse().map_err(|_| {
            anyhow::anyhow!("EBB_VERSUS_UTILIZATION_THRESHOLD: {t} is not a number")
        })?;
        anyhow::ensure!(
            x > 0.0 && x <= 1.0,
            "EBB_VERSUS_UTILIZATION_THRESHOLD: {t} is not in (0, 1]"
        );
        out.push(x);
    }
    anyhow::ensure!(
        !out.is_empty(),
        "EBB_VERSUS_UTILIZATION_THRESHOLD={v} names no threshold"
    );
    Ok(out)
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

    /// The settings this scaler runs with, as written in the output: the matched ones, then what
    /// else it is given and why; everything not named is at the scaler's defaults.
    pub fn settings_line(self, s: &Settings) -> String {
        match self {
            Scaler::Ebb => format!(
                "ebb {}: ScaleDownPolicy with nodeSelector {GROUP_LABEL}={GROUP} (the scenario's nodes) and mode DrainAndDelete (the default, DryRun, removes nothing); matched: scanInterval {}, unneededTime {}, maxScaleDownParallelism {}, maxDrainParallelism {}, utilizationThreshold {}{}; every other field at its default (minNodesPerGroup {}, evictionRetryInterval 10s, maxPodEvictionTime 2m, ...); steering on (the chart's webhook configuration, served by the controller); the controller started before the clock, which starts when the policy is created (as Karpenter runs before its clock starts); controller flags at their defaults except what running out of cluster needs (--leader-election false, --namespace ebb-system, --identity, --metrics-addr 127.0.0.1:0) and --log-filter {} (its log level: EBB_VERSUS_EBB_LOG_FILTER)",
                env!("CARGO_PKG_VERSION"),
                secs(s.scan_interval),
                secs(s.unneeded_time),
                s.max_scale_down_parallelism,
                s.max_drain_parallelism,
                s.utilization_threshold,
                if s.utilization_threshold == ebb_default_threshold() {
                    " (its default: the field is left out)"
                } else {
                    ""
                },
                s.min_nodes_per_group,
                ebb_log_filter(),
            ),
            Scaler::ClusterAutoscaler => format!(
                "cluster-autoscaler ({}, kwok provider): matched: --scan-interval={} --scale-down-unneeded-time={} --max-scale-down-parallelism={} --max-drain-parallelism={} --scale-down-utilization-threshold={}, node group min size {} (ebb's minNodesPerGroup); also --scale-down-delay-after-add=0s (no node is added before a run) and --leader-elect=false; every other flag at its default (--unremovable-node-recheck-timeout=5m, --scale-down-delay-after-failure=3m, --max-pod-eviction-time=2m, --node-delete-delay-after-taint=5s, --daemonset-eviction-for-occupied-nodes=true, --scale-down-non-empty-candidates-count=30, ...); kwok provider ConfigMap: readNodesFrom cluster, node groups by label {SHAPE_LABEL} (one per node shape), GPU nodes by label {GPU_TYPE_LABEL} (gpuConfig), the rest at its defaults (--scale-down-gpu-utilization-threshold=0.5 too); out of cluster: --cloud-provider=kwok --kubeconfig, --address=127.0.0.1:<free port>, KWOK_PROVIDER_MODE=local, POD_NAMESPACE={}; --v={} (log verbosity, for the reasons it keeps nodes)",
                cluster_autoscaler::checked_binary()
                    .map(|(_, info)| info.describe())
                    .unwrap_or_else(|_| format!(
                        "sigs.k8s.io/cluster-autoscaler {}",
                        &cluster_autoscaler::EXPECTED_COMMIT[..12]
                    )),
                secs(s.scan_interval),
                secs(s.unneeded_time),
                s.max_scale_down_parallelism,
                s.max_drain_parallelism,
                s.utilization_threshold,
                s.min_nodes_per_group,
                cluster_autoscaler::NAMESPACE,
                cluster_autoscaler::LOG_VERBOSITY,
            ),
            Scaler::Karpenter => format!(
                "karpenter v1.14.1 (KWOK provider): NodePool disruption consolidationPolicy WhenEmptyOrUnderutilized; matched: consolidateAfter {} (unneededTime), budgets [nodes \"{}\"] (maxScaleDownParallelism); the rest of the NodePool and every flag at their defaults (--batch-idle-duration=1s --batch-max-duration=10s --log-level=info given explicitly at their default values; out of cluster: --disable-leader-election, metrics and health probe on free ports)",
                secs(s.unneeded_time),
                s.max_scale_down_parallelism
            ),
        }
    }
}

/// Whose nodes a run's scenario is built on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Nodes {
    /// Node objects the bench creates, which kwok runs: what ebb and Cluster Autoscaler's kwok
    /// provider accept.
    Kwok,
    /// NodeClaims of one NodePool, launched by Karpenter's KWOK provider ([`karpenter_nodes`]);
    /// Karpenter runs throughout. Their `kubernetes.io/hostname` label is the NodeClaim's name,
    /// not the Node's.
    Karpenter,
    /// The same, with each Node's `kubernetes.io/hostname` label set to the Node's name before
    /// the workload is created (as a kubelet names a node after its host). ebb's re-check once
    /// selected the node by that label and abandoned every drain on Karpenter's KWOK nodes; it
    /// selects by name now, and this column checks that both label schemes give the same run.
    KarpenterHostnameIsName,
}

impl Nodes {
    pub fn name(self) -> &'static str {
        match self {
            Nodes::Kwok => "kwok nodes",
            Nodes::Karpenter => "Karpenter nodes",
            Nodes::KarpenterHostnameIsName => "Karpenter nodes, hostname label = node name",
        }
    }

    /// Launched by Karpenter, which runs throughout.
    pub fn karpenter(self) -> bool {
        self != Nodes::Kwok
    }
}

/// One column of the comparison: a scaler on one kind of nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub scaler: Scaler,
    pub nodes: Nodes,
}

impl Column {
    pub const fn new(scaler: Scaler, nodes: Nodes) -> Self {
        Self { scaler, nodes }
    }

    /// The bench's columns: ebb and Cluster Autoscaler on kwok nodes, ebb and Karpenter on
    /// Karpenter's nodes, and ebb on Karpenter's nodes relabelled so that their hostname label
    /// is their name.
    pub const ALL: [Column; 5] = [
        Column::new(Scaler::Ebb, Nodes::Kwok),
        Column::new(Scaler::ClusterAutoscaler, Nodes::Kwok),
        Column::new(Scaler::Ebb, Nodes::Karpenter),
        Column::new(Scaler::Ebb, Nodes::KarpenterHostnameIsName),
        Column::new(Scaler::Karpenter, Nodes::Karpenter),
    ];

    /// `ebb (kwok nodes)`.
    pub fn name(self) -> String {
        format!("{} ({})", self.scaler.name(), self.nodes.name())
    }

    /// A short name for `EBB_VERSUS_COLUMNS`: `ebb`, `cluster-autoscaler`, `ebb-karpenter`,
    /// `ebb-karpenter-hostname`, `karpenter` (and the combinations that never run, such as
    /// `karpenter-kwok`).
    pub fn key(self) -> String {
        match (self.scaler, self.nodes) {
            (Scaler::Karpenter, Nodes::Karpenter) => "karpenter".into(),
            (Scaler::Karpenter, Nodes::Kwok) => "karpenter-kwok".into(),
            (s, Nodes::Kwok) => s.name().into(),
            (s, Nodes::Karpenter) => format!("{}-karpenter", s.name()),
            (s, Nodes::KarpenterHostnameIsName) => format!("{}-karpenter-hostname", s.name()),
        }
    }

    /// The settings this column runs with, as written in the output.
    pub fn settings_line(self, s: &Settings) -> String {
        match (self.scaler, self.nodes) {
            (Scaler::Ebb, Nodes::Karpenter | Nodes::KarpenterHostnameIsName) => format!(
                "{}; on Karpenter nodes also controller --karpenter (with spec.removal absent, method Auto, ebb drains, then deletes the node's NodeClaim and Karpenter terminates it), Karpenter running as below but with consolidateAfter Never",
                Scaler::Ebb.settings_line(s)
            ),
            (scaler, _) => scaler.settings_line(s),
        }
    }
}

/// What one scaler did to one scenario, from the audit log and the cluster's final state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measured {
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Nodes whose deletion the API server accepted during the run, by anyone (on Karpenter's
    /// nodes Karpenter deletes the Node, after ebb or its own consolidation deleted the
    /// NodeClaim).
    pub node_deletes: usize,
    /// Nodes created during the run (Karpenter launching nodes for pods it could not place).
    pub node_launches: usize,
    /// From the scaler's start to the last Node deletion the API server accepted.
    pub time_to_final: Option<Duration>,
    /// From the scaler's start to the last time the bench saw the node count drop (polled each
    /// second; a Node with a finalizer, as Karpenter's have, is gone some seconds after its
    /// deletion was accepted).
    pub last_gone: Option<Duration>,
    /// Evictions (and refusals) by the scaler's user.
    pub evictions: usize,
    /// Of `evictions`, those of DaemonSet pods (Karpenter's termination evicts them; ebb leaves
    /// them to go with the node).
    pub daemonset_evictions: usize,
    pub refused_evictions: usize,
    /// Evictions by any other user (Karpenter's termination of a NodeClaim ebb deleted), and how
    /// many of theirs were refused.
    pub other_evictions: usize,
    pub other_refused: usize,
    /// Pods created during the run (replacements) that were disrupted in turn: moved twice.
    pub disrupted_again: usize,
    /// Pods deleted directly (not through the Eviction API) by the scaler's user.
    pub direct_pod_deletes: usize,
    /// NodeClaims the scaler's user deleted (ebb's Karpenter removals; Karpenter's own), by name.
    pub node_claim_deletes: usize,
    pub pdb_violations: usize,
    pub longest_pending: Option<Duration>,
    pub never_came_back: usize,
    /// The scaler's CPU seconds over the run (ebb's process from its start; Karpenter's from the
    /// run's start, as it ran during setup too).
    pub cpu_seconds: Option<f64>,
    /// karpenter-kwok's CPU seconds over the run, on Karpenter's nodes.
    pub karpenter_cpu_seconds: Option<f64>,
    /// The run was cut at the scenario's cap (plus the settle window) while the node count still
    /// changed or a node was being drained.
    pub cut: bool,
    /// How long the node count had to stay the same to end the run ([`settle_window`]).
    pub settle: Duration,
    /// The most nodes drained at once ([`most_drains_at_once`]).
    pub most_drains_at_once: usize,
    /// The longest time between two waves of node deletions ([`removal_waves`]).
    pub longest_gap: Option<Duration>,
    /// Of the removed nodes, those with GPUs, their GPUs and their price per hour (shaped
    /// scenarios; read from the nodes' allocatable and instance type before the run).
    #[serde(default)]
    pub gpu_nodes_removed: usize,
    #[serde(default)]
    pub gpus_freed: u64,
    #[serde(default)]
    pub cost_freed_per_hour: f64,
    /// GPUs and price per hour of all the scenario's nodes before the run.
    #[serde(default)]
    pub gpus_before: u64,
    #[serde(default)]
    pub cost_before_per_hour: f64,
    /// What a cost-first packing of the pods at the run's start onto the scenario's own nodes
    /// keeps per hour ([`packing::cost_first`]; shaped scenarios).
    #[serde(default)]
    pub packing_kept_per_hour: Option<f64>,
    /// The same packing with GPU nodes kept for GPU pods ([`packing::Rule::GpuNodesForGpuPods`]).
    #[serde(default)]
    pub packing_gpu_rule_kept_per_hour: Option<f64>,
    /// What the table says below itself about this column (the nodes, Karpenter's decisions).
    pub notes: Vec<String>,
}

/// One cell of the comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Outcome {
    Ran(Box<Measured>),
    /// The scaler could not run here, and why.
    NotRun(String),
}

/// A running scaler: its process (CPU time from `/proc`).
struct Running {
    child: ChildProcess,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Running {
    fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds_of(self.child.id()?)
    }
}

/// User plus system CPU seconds of process `pid`, from `/proc/<pid>/stat`.
/// CPU seconds spent between two readings of [`cpu_seconds_of`].
fn cpu_since(now: Option<f64>, then: Option<f64>) -> Option<f64> {
    now.zip(then).map(|(b, a)| b - a)
}

fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the ")" that ends the command name: state is field 3, utime 14, stime 15
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
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
    let script = ebb_e2e::harness::k8s_script("build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--print-bin-dir")
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || dir.is_empty() {
        anyhow::bail!(
            "{} --print-bin-dir printed no directory ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(PathBuf::from(dir))
}

/// Why a column cannot run on this machine, if it can be known before trying (Karpenter's
/// build is tried when a run on its nodes starts): for Cluster Autoscaler, no binary, or one
/// built from another commit or without its kwok provider ([`cluster_autoscaler::checked_binary`]).
pub fn unavailable(column: Column) -> Option<String> {
    match (column.scaler, column.nodes) {
        (Scaler::Ebb, _) | (Scaler::Karpenter, Nodes::Karpenter) => None,
        (Scaler::Karpenter, Nodes::KarpenterHostnameIsName) => Some(
            "not run: the relabelled nodes are a workaround for ebb only".to_string(),
        ),
        (Scaler::ClusterAutoscaler, Nodes::Kwok) => cluster_autoscaler::checked_binary().err(),
        (Scaler::ClusterAutoscaler, Nodes::Karpenter | Nodes::KarpenterHostnameIsName) => Some(
            "not run: Cluster Autoscaler's kwok provider scales its own node groups, not Karpenter's NodeClaims".to_string(),
        ),
        (Scaler::Karpenter, Nodes::Kwok) => Some(
            "not run: Karpenter consolidates only nodes it launched (NodeClaims), not these; see the Karpenter-provisioned variant".to_string(),
        ),
    }
}

/// Starts ebb before a cell's clock: its CRDs, its namespace and the controller, until it acts
/// (it has registered the steering webhook, which it does once its caches synced and start-up
/// recovery is done). A platform team's controller runs before a cluster has nodes to spare, as
/// Karpenter runs before its own clock starts; the clock starts when [`create_policy`] is called.
async fn start_ebb(env: &TestEnv, karpenter: bool) -> anyhow::Result<Running> {
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
    let filter = ebb_log_filter();
    let mut args = vec![
        "run",
        "--metrics-addr",
        "127.0.0.1:0",
        "--leader-election",
        "false",
        "--namespace",
        "ebb-system",
        "--identity",
        "ebb-controller",
        "--log-filter",
        filter.as_str(),
    ];
    if karpenter {
        args.push("--karpenter");
    }
    let mut child = env.spawn_binary("ebb-controller", &args)?;
    let log = child.capture_output();
    // The chart's configuration, installed before (`run_on`), which the controller points at
    // itself.
    wait_for(
        "ebb to register the steering webhook (it acts from then on)",
        Duration::from_secs(60),
        || async { ebb_e2e::setup::steering_registered_url(&c).await },
    )
    .await?;
    Ok(Running { child, log })
}

/// Creates ebb's policy for `scenario`: the start of an ebb cell's clock.
async fn create_policy(env: &TestEnv, scenario: &Scenario, s: &Settings) -> anyhow::Result<()> {
    let c = env.client.clone();
    // The matched settings only: every other field (removal among them: absent means method
    // Auto) at its default.
    let mut spec = json!({"nodeSelector": {"matchLabels": {GROUP_LABEL: GROUP}}, "mode": "DrainAndDelete",
             "scanInterval": secs(s.scan_interval), "unneededTime": secs(s.unneeded_time),
             "maxScaleDownParallelism": s.max_scale_down_parallelism,
             "maxDrainParallelism": s.max_drain_parallelism});
    if s.utilization_threshold != ebb_default_threshold() {
        spec["utilizationThreshold"] = json!(s.utilization_threshold);
    }
    if scenario.priced() {
        // What a user tells ebb about their nodes: the price of each instance type.
        let per_hour: serde_json::Map<String, serde_json::Value> = scenario
            .shapes
            .iter()
            .map(|sh| (sh.name.to_string(), json!(sh.per_hour)))
            .collect();
        spec["prices"] = json!({"label": scenario::INSTANCE_TYPE_LABEL, "perHour": per_hour});
    }
    let policy: ebb_api::ScaleDownPolicy = serde_json::from_value(json!({
        "apiVersion": "ebb.dev/v1alpha1", "kind": "ScaleDownPolicy",
        "metadata": {"name": "versus"},
        "spec": spec
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
    Ok(())
}

async fn scenario_nodes(client: &kube::Client) -> anyhow::Result<Vec<Node>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={GROUP}")))
        .await?
        .items)
}

/// The taints the scalers put on a node they are draining and deleting: ebb's, Cluster
/// Autoscaler's and Karpenter's.
pub const DELETION_TAINTS: [&str; 3] = [
    ebb_api::names::TAINT_TO_BE_DELETED,
    cluster_autoscaler::DELETION_TAINT,
    ebb_e2e::karpenter::DISRUPTED_TAINT,
];

/// Whether any of `nodes` is being drained or deleted by a scaler (carries one of
/// [`DELETION_TAINTS`]).
fn removal_in_progress(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| DELETION_TAINTS.contains(&t.key.as_str())))
    })
}

/// Karpenter re-evaluates consolidation at least this often even when nothing in the cluster
/// changed (v1.14.1: `state.Cluster.ConsolidationState` resets after five minutes).
pub const KARPENTER_RECONSIDER: Duration = Duration::from_secs(300);

/// How long the node count must stay the same, with no node being drained, before a run of
/// `column` is over: longer than any timer of the scaler after which it could still remove a
/// node. For every scaler that is its `unneededTime` (a node must stay unneeded that long), three
/// scans and 20 s; on Karpenter's nodes 40 s more (Karpenter looks for consolidation every 10 s,
/// validates a decision for 15 s, and its termination waits at least 5 s). Cluster Autoscaler
/// adds its unremovable-node recheck (5 minutes: a node its simulation found unremovable is not
/// looked at again before then, whatever changed) and Karpenter its 5-minute re-evaluation. A
/// drain in progress is seen by its taint and keeps the run going (ebb gives up a drain after
/// maxPodEvictionTime, Cluster Autoscaler after --max-pod-eviction-time).
pub fn settle_window(column: Column, s: &Settings) -> Duration {
    let base = s.unneeded_time
        + s.scan_interval * 3
        + match column.nodes {
            Nodes::Kwok => Duration::from_secs(20),
            Nodes::Karpenter | Nodes::KarpenterHostnameIsName => Duration::from_secs(60),
        };
    base + match column.scaler {
        Scaler::Ebb => Duration::ZERO,
        Scaler::ClusterAutoscaler => cluster_autoscaler::UNREMOVABLE_RECHECK,
        Scaler::Karpenter => KARPENTER_RECONSIDER,
    }
}

/// How long Cluster Autoscaler runs, whatever it does: long enough for two of its own
/// unremovable-node rechecks after its first `unneededTime` (a node it found unremovable once is
/// not looked at again for 5 minutes), plus three scans and a minute for the deletions then.
/// Its pace is set by that recheck, so it is reported for this fixed window and never
/// extrapolated. `EBB_VERSUS_CA_WINDOW` (seconds) sets another.
pub fn ca_window(s: &Settings) -> Duration {
    std::env::var("EBB_VERSUS_CA_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(
            s.unneeded_time
                + cluster_autoscaler::UNREMOVABLE_RECHECK * 2
                + s.scan_interval * 3
                + Duration::from_secs(60),
        )
}

/// ebb's `--log-filter` in the bench: `EBB_VERSUS_EBB_LOG_FILTER` (for example
/// `info,ebb_controller=debug` to follow a run's decisions), else `warn`.
pub fn ebb_log_filter() -> String {
    std::env::var("EBB_VERSUS_EBB_LOG_FILTER")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "warn".to_string())
}

/// Writes the scenario's cluster as the scaler meets it to `path`: a `List` of its nodes, pods,
/// PodDisruptionBudgets, ReplicaSets and DaemonSets, the objects `ebb-controller plan
/// --snapshot` reads, so that a cell's plan can be made again offline.
async fn keep_start(
    client: &kube::Client,
    nodes: &[Node],
    pods: &[Pod],
    path: &std::path::Path,
) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let lp = ListParams::default();
    let mut items: Vec<serde_json::Value> = Vec::new();
    for n in nodes {
        items.push(serde_json::to_value(n)?);
    }
    for p in pods {
        items.push(serde_json::to_value(p)?);
    }
    for b in Api::<PodDisruptionBudget>::all(client.clone())
        .list(&lp)
        .await?
        .items
    {
        items.push(serde_json::to_value(b)?);
    }
    for r in Api::<ReplicaSet>::all(client.clone())
        .list(&lp)
        .await?
        .items
    {
        items.push(serde_json::to_value(r)?);
    }
    for d in Api::<DaemonSet>::all(client.clone()).list(&lp).await?.items {
        items.push(serde_json::to_value(d)?);
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    std::fs::create_dir_all(log_dir())?;
    std::fs::write(path, serde_json::to_vec(&list)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Where the scalers' logs of a run are kept: `EBB_VERSUS_LOG_DIR`, else `ebb-versus` in the
/// temporary directory.
pub fn log_dir() -> PathBuf {
    std::env::var_os("EBB_VERSUS_LOG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ebb-versus"))
}

/// Node deletions (by time) grouped into waves: deletions less than 2 s apart are one wave.
/// Returns each wave's start (seconds after `start`) and size.
pub fn removal_waves(deletes: &[jiff::Timestamp], start: jiff::Timestamp) -> Vec<(f64, usize)> {
    let mut sorted = deletes.to_vec();
    sorted.sort();
    let mut waves: Vec<(f64, usize)> = Vec::new();
    let mut last: Option<f64> = None;
    for t in sorted {
        let at = t.duration_since(start).as_secs_f64();
        match (waves.last_mut(), last) {
            (Some(w), Some(l)) if at - l < 2.0 => w.1 += 1,
            _ => waves.push((at, 1)),
        }
        last = Some(at);
    }
    waves
}

/// The most nodes drained at once: each deleted node counts from the first disruption of a pod
/// on it (eviction or delete, as the pod watch saw it) to its deletion; nodes deleted with no pod
/// disrupted before (empty ones) do not count.
pub fn most_drains_at_once(
    first_disruption: &std::collections::HashMap<String, jiff::Timestamp>,
    deleted: &std::collections::BTreeMap<String, jiff::Timestamp>,
) -> usize {
    let mut events: Vec<(jiff::Timestamp, i32)> = Vec::new();
    for (node, end) in deleted {
        if let Some(begin) = first_disruption.get(node).filter(|b| *b <= end) {
            events.push((*begin, 1));
            events.push((*end, -1));
        }
    }
    // Ends before begins at the same instant.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// What a scenario node is worth removing: its allocatable GPUs and its shape's price per hour
/// (by its instance-type label; 0 on a uniform scenario).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeWorth {
    pub gpus: u64,
    pub per_hour: f64,
}

impl NodeWorth {
    pub fn of(scenario: &Scenario, node: &Node) -> Self {
        let gpus = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(scenario::GPU_RESOURCE))
            .and_then(|q| q.0.parse().ok())
            .unwrap_or(0);
        let per_hour = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(scenario::INSTANCE_TYPE_LABEL))
            .and_then(|t| scenario.shapes.iter().find(|sh| sh.name == t))
            .map_or(0.0, |sh| sh.per_hour);
        Self { gpus, per_hour }
    }
}

/// GPUs and cost per hour freed: what the removed nodes held less what the nodes launched
/// during the run and still there hold (a replacement is not a saving).
pub fn net_freed(removed: impl Iterator<Item = NodeWorth>, launched: &[NodeWorth]) -> (u64, f64) {
    let (gpus, cost) = removed.fold((0u64, 0.0f64), |(g, c), w| (g + w.gpus, c + w.per_hour));
    let (lg, lc) = launched
        .iter()
        .fold((0u64, 0.0f64), |(g, c), w| (g + w.gpus, c + w.per_hour));
    (gpus.saturating_sub(lg), cost - lc)
}

fn parse_time(t: &str) -> Option<jiff::Timestamp> {
    t.parse().ok()
}

/// Runs `scaler` on a fresh real cluster holding `scenario` on kwok nodes.
pub async fn run(
    scenario: &Scenario,
    scaler: Scaler,
    settings: &Settings,
) -> anyhow::Result<Outcome> {
    run_on(scenario, Column::new(scaler, Nodes::Kwok), settings).await
}

/// Runs `column` (a scaler on one kind of nodes) on a fresh real cluster holding `scenario`;
/// progress goes to stderr.
pub async fn run_on(
    scenario: &Scenario,
    column: Column,
    settings: &Settings,
) -> anyhow::Result<Outcome> {
    if let Some(why) = unavailable(column) {
        return Ok(Outcome::NotRun(why));
    }
    if column.nodes.karpenter()
        && let Err(e) = ebb_e2e::karpenter::build().await
    {
        return Ok(Outcome::NotRun(format!("not run: {e:#}")));
    }
    let label = format!("versus {} / {}", scenario.name, column.name());
    let t_setup = Instant::now();
    // The control plane starts once more if it fails to (on a busy machine a component can
    // exit during startup).
    let env = match TestEnv::start_real(0).await {
        Ok(env) => env,
        Err(e) => {
            eprintln!("{label}: the control plane did not start, once more: {e:#}");
            TestEnv::start_real(0).await?
        }
    };
    let client = env.client.clone();
    // ebb's chart installs the steering webhook by default; so does the bench for ebb's columns.
    if column.scaler == Scaler::Ebb {
        ebb_e2e::setup::install_steering_webhook(&client).await?;
    }
    let mut notes = Vec::new();
    if scenario.priced() && column.scaler == Scaler::Ebb {
        notes.push(format!(
            "the policy's prices (label {}): {}",
            scenario::INSTANCE_TYPE_LABEL,
            scenario
                .shapes
                .iter()
                .map(|sh| format!("{} {}/h", sh.name, sh.per_hour))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let (budgets, mut karpenter, node_claims) = match column.nodes {
        Nodes::Kwok => (
            scenario::build(&client, scenario, settings.min_nodes_per_group).await?,
            None,
            Vec::new(),
        ),
        Nodes::Karpenter | Nodes::KarpenterHostnameIsName => {
            let relabel = column.nodes == Nodes::KarpenterHostnameIsName;
            let b = karpenter_nodes::build(&env, scenario, settings, relabel).await?;
            notes.push(format!(
                "nodes: {} NodeClaims of NodePool `{}`, instance type {}",
                b.nodes.len(),
                karpenter_nodes::POOL,
                b.description
            ));
            (b.budgets, Some(b.karpenter), b.node_claims)
        }
    };
    eprintln!(
        "{label}: {} nodes, {} pods ready in {:.0}s",
        scenario.nodes,
        scenario.pods(),
        t_setup.elapsed().as_secs_f64()
    );
    let before = scenario_nodes(&client).await?;
    let nodes_before = before.len();
    let worth: std::collections::BTreeMap<String, NodeWorth> = before
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, NodeWorth::of(scenario, n))))
        .collect();
    let packing_kept = if scenario.priced() {
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let start_file = log_dir().join(format!(
            "{}-{}-{}-start.json",
            scenario.name,
            column.key(),
            jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ")
        ));
        match keep_start(&client, &before, &pods, &start_file).await {
            Ok(()) => notes.push(format!(
                "the cluster at the start (what `ebb-controller plan --snapshot` reads): {}",
                start_file.display()
            )),
            Err(e) => eprintln!(
                "warning: the cluster at the start was not kept in {}: {e:#}",
                start_file.display()
            ),
        }
        let (pack_nodes, pack_pods) = packing::input(
            &before,
            &pods,
            |n| NodeWorth::of(scenario, n).per_hour,
            scenario::GPU_RESOURCE,
        );
        Some(
            [
                packing::Rule::ResourcesOnly,
                packing::Rule::GpuNodesForGpuPods,
            ]
            .map(|r| packing::cost_first(&pack_nodes, &pack_pods, r).kept_per_hour),
        )
    } else {
        None
    };
    let observer = observe::Observer::start(client.clone(), budgets).await?;
    let karpenter_cpu = |k: &Option<ebb_e2e::karpenter::Karpenter>| {
        k.as_ref().and_then(|k| k.pid()).and_then(cpu_seconds_of)
    };
    // ebb runs before the clock starts, as Karpenter does; its clock starts with its policy.
    let running = match column.scaler {
        Scaler::Ebb => Some(start_ebb(&env, column.nodes.karpenter()).await?),
        Scaler::Karpenter | Scaler::ClusterAutoscaler => None,
    };
    // CPU from the clock's start (ebb's start-up and Karpenter's launches before it not counted).
    let karpenter_cpu0 = karpenter_cpu(&karpenter);
    let ebb_cpu0 = running.as_ref().and_then(Running::cpu_seconds);
    let started_at = jiff::Timestamp::now();
    let t0 = Instant::now();
    // The name the audit log records for the scaler's own writes.
    let scaler_user = match column.scaler {
        Scaler::Ebb => env.audit_user("ebb-controller"),
        Scaler::ClusterAutoscaler | Scaler::Karpenter => "kubernetes-admin".to_string(),
    };
    if column.nodes.karpenter() {
        karpenter_nodes::start(
            &client,
            scenario,
            settings,
            &node_claims,
            column.scaler == Scaler::Karpenter,
            &started_at,
        )
        .await?;
    }
    if running.is_some() {
        create_policy(&env, scenario, settings).await?;
    }
    // The scaler's log of this cell (Cluster Autoscaler's as it runs, ebb's once it ends).
    let scaler_log = log_dir().join(format!(
        "{}-{}-{}.log",
        scenario.name,
        column.key(),
        started_at.strftime("%Y%m%dT%H%M%SZ")
    ));
    let mut ca = match column.scaler {
        Scaler::ClusterAutoscaler => {
            let (binary, _) = cluster_autoscaler::checked_binary().map_err(anyhow::Error::msg)?;
            Some(
                cluster_autoscaler::ClusterAutoscaler::start(&env, &binary, settings, &scaler_log)
                    .await?,
            )
        }
        Scaler::Ebb | Scaler::Karpenter => None,
    };

    // Until the node count has not changed, with no node being drained, for the settle window
    // (and the first chance to remove anything has passed), or the cap: the scenario's cap plus
    // the settle window, so that a run still changing then is reported as cut.
    let settle = scenario.settle.unwrap_or(settle_window(column, settings));
    let cap = scenario.cap + settle;
    // Cluster Autoscaler runs for its fixed window (or the cap, when shorter: the small pool).
    let window = (column.scaler == Scaler::ClusterAutoscaler).then(|| ca_window(settings).min(cap));
    let mut last = nodes_before;
    let mut last_change = Instant::now();
    let mut last_gone = None;
    let mut cut = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let nodes = scenario_nodes(&client).await?;
        let n = nodes.len();
        if n != last {
            if n < last {
                last_gone = Some(t0.elapsed());
            }
            last = n;
            last_change = Instant::now();
        }
        if removal_in_progress(&nodes) {
            last_change = Instant::now();
        }
        if let Some(w) = window {
            if t0.elapsed() >= w {
                // Still changing within the recheck before the window ended: not final.
                cut = last_change.elapsed() < cluster_autoscaler::UNREMOVABLE_RECHECK.min(w);
                notes.push(format!(
                    "ran for a fixed window of {:.0} s (two of its 5-minute rechecks){}",
                    w.as_secs_f64(),
                    if cut {
                        "; it was still removing nodes when the window ended, so its final count and the time to it are not measured"
                    } else {
                        ""
                    }
                ));
                break;
            }
            continue;
        }
        if last_change.elapsed() >= settle && t0.elapsed() >= settle {
            break;
        }
        if t0.elapsed() >= cap {
            cut = true;
            break;
        }
    }
    let karpenter_cpu_seconds = cpu_since(karpenter_cpu(&karpenter), karpenter_cpu0);
    let cpu_seconds = match (&running, &ca) {
        (Some(r), _) => cpu_since(r.cpu_seconds(), ebb_cpu0),
        (None, Some(c)) => c.pid().and_then(cpu_seconds_of),
        (None, None) => karpenter_cpu_seconds,
    };
    // Killed (SIGKILL) before anything else is counted: stopping it any other way would make its
    // kwok provider delete the node group's nodes.
    if let Some(c) = ca.as_mut() {
        let exited = !c.running();
        c.stop().await?;
        if exited {
            notes.push("cluster-autoscaler had exited by the end of the run".to_string());
        }
    }
    if let Some(r) = &running {
        let lines = r.log.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(first) = lines.first() {
            notes.push(format!(
                "ebb logged {} lines at --log-filter {}, the first: {}",
                lines.len(),
                ebb_log_filter(),
                first.chars().take(300).collect::<String>()
            ));
        }
        // ebb's whole log beside the peers' (the notes hold its first line only).
        let kept = std::fs::create_dir_all(log_dir())
            .and_then(|()| std::fs::write(&scaler_log, lines.join("\n") + "\n"));
        match kept {
            Ok(()) => notes.push(format!("its log: {}", scaler_log.display())),
            Err(e) => eprintln!(
                "{label}: cannot keep ebb's log in {}: {e}",
                scaler_log.display()
            ),
        }
        if std::env::var_os("EBB_VERSUS_DEBUG").is_some() {
            for l in &lines {
                eprintln!("{label}: ebb: {l}");
            }
            let policies = Api::<ebb_api::ScaleDownPolicy>::all(client.clone())
                .list(&ListParams::default())
                .await?;
            for p in policies.items {
                eprintln!(
                    "{label}: policy status: {}",
                    serde_json::to_string_pretty(&p.status).unwrap_or_default()
                );
            }
        }
    }
    drop(running);
    // Replacements get their chance to run before "never came back" is counted (Karpenter, when
    // it runs, may still launch a node for them).
    let mut never_came_back = scenario::missing_pods(&client, scenario).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while never_came_back > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        never_came_back = scenario::missing_pods(&client, scenario).await?;
    }
    if never_came_back > 0 {
        let by = scenario::missing_by_workload(&client, scenario).await?;
        notes.push(format!(
            "pods that never came back: {}",
            by.iter()
                .map(|(w, n)| format!("{n} of {w}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let observed = observer.stop();
    let after: Vec<Node> = scenario_nodes(&client).await?;
    let remaining: Vec<String> = after
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let nodes_after = remaining.len();
    // Nodes there at the end that were not there before: launched during the run (Karpenter's
    // replacements), counted against what was freed.
    let launched: Vec<NodeWorth> = after
        .iter()
        .filter(|n| {
            n.metadata
                .name
                .as_ref()
                .is_some_and(|name| !worth.contains_key(name))
        })
        .map(|n| NodeWorth::of(scenario, n))
        .collect();
    if let Some(k) = karpenter.as_mut() {
        let log = std::fs::read_to_string(k.log_path()).unwrap_or_default();
        let commands = karpenter_nodes::commands(&log);
        notes.push(if commands.is_empty() {
            "Karpenter's disruption decisions: none".to_string()
        } else {
            format!("Karpenter's disruption decisions: {}", commands.join(", "))
        });
        let errors = k.errors();
        if !errors.is_empty() {
            notes.push(format!(
                "karpenter-kwok logged {} errors, the first: {}",
                errors.len(),
                errors[0].chars().take(300).collect::<String>()
            ));
        }
        if !k.running() {
            notes.push("karpenter-kwok had exited by the end of the run".to_string());
        }
    }
    drop(karpenter);

    if let Some((d, pod)) = &observed.longest_pending {
        notes.push(format!(
            "longest Pending: {pod}, {:.1} s from its creation to Running",
            d.as_secs_f64()
        ));
    }
    if !observed.moved_again.is_empty() {
        notes.push(format!(
            "replacements moved again ({} in all; the first named, on the node they were moved from again): {}",
            observed.disrupted_again,
            observed.moved_again.join(", ")
        ));
    }
    let records = env.audit()?;
    let after_start =
        |r: &ebb_e2e::AuditRecord| parse_time(&r.time).is_some_and(|t| t >= started_at);
    let mut m = Measured {
        nodes_before,
        nodes_after,
        never_came_back,
        cpu_seconds,
        karpenter_cpu_seconds,
        cut,
        last_gone,
        pdb_violations: observed.violations.len(),
        disrupted_again: observed.disrupted_again,
        longest_pending: observed.longest_pending.map(|(d, _)| d),
        notes,
        ..Measured::default()
    };
    for v in &observed.violations {
        eprintln!(
            "{label}: PDB violation: {} left {} with {} healthy (desired {})",
            v.pod, v.budget, v.healthy_after, v.desired_healthy
        );
    }
    let mut last_delete: Option<jiff::Timestamp> = None;
    let daemonsets: Vec<String> = scenario
        .daemonsets
        .iter()
        .map(|d| format!("{}-", d.name))
        .collect();
    // By name, first deletion: Karpenter deletes a NodeClaim (and its Node) again while its
    // finalizer runs.
    let mut deleted: std::collections::BTreeMap<String, jiff::Timestamp> = Default::default();
    let mut claims_deleted = std::collections::BTreeSet::new();
    for r in records.iter().filter(|r| after_start(r)) {
        let ok = (200..300).contains(&r.code);
        let by_scaler = r.user == scaler_user;
        match (r.verb.as_str(), r.resource.as_str(), r.subresource.as_str()) {
            ("create", "pods", "eviction") if r.code == 201 => match by_scaler {
                true => {
                    m.evictions += 1;
                    if daemonsets.iter().any(|d| r.name.starts_with(d.as_str())) {
                        m.daemonset_evictions += 1;
                    }
                }
                false => m.other_evictions += 1,
            },
            ("create", "pods", "eviction") if r.code == 429 => match by_scaler {
                true => m.refused_evictions += 1,
                false => m.other_refused += 1,
            },
            ("delete", "pods", "") if by_scaler && ok => m.direct_pod_deletes += 1,
            ("delete", "nodeclaims.karpenter.sh", "") if by_scaler && ok => {
                claims_deleted.insert(r.name.clone());
            }
            ("create", "nodes", "") if ok => m.node_launches += 1,
            ("delete", "nodes", "") if ok => {
                let t = parse_time(&r.time);
                if let Some(t) = t {
                    deleted.entry(r.name.clone()).or_insert(t);
                }
                if t > last_delete {
                    last_delete = t;
                }
            }
            _ => {}
        }
    }
    m.node_deletes = deleted.len();
    m.gpus_before = worth.values().map(|w| w.gpus).sum();
    m.cost_before_per_hour = worth.values().map(|w| w.per_hour).sum();
    let (gpus_freed, cost_freed) = net_freed(
        deleted.keys().filter_map(|n| worth.get(n)).copied(),
        &launched,
    );
    m.gpu_nodes_removed = deleted
        .keys()
        .filter_map(|n| worth.get(n))
        .filter(|w| w.gpus > 0)
        .count();
    m.gpus_freed = gpus_freed;
    m.cost_freed_per_hour = cost_freed;
    m.packing_kept_per_hour = packing_kept.map(|k| k[0]);
    m.packing_gpu_rule_kept_per_hour = packing_kept.map(|k| k[1]);
    if !launched.is_empty() {
        m.notes.push(format!(
            "{} node(s) launched during the run and still there ({} GPUs, {:.1}/h): GPUs and cost freed are net of them",
            launched.len(),
            launched.iter().map(|w| w.gpus).sum::<u64>(),
            launched.iter().map(|w| w.per_hour).sum::<f64>()
        ));
    }
    m.node_claim_deletes = claims_deleted.len();
    m.time_to_final = last_delete.and_then(|t| {
        let d = t.duration_since(started_at);
        Duration::try_from(d).ok()
    });
    m.settle = window.unwrap_or(settle);
    m.most_drains_at_once = most_drains_at_once(&observed.first_disruption, &deleted);
    let times: Vec<jiff::Timestamp> = deleted.values().copied().collect();
    let waves = removal_waves(&times, started_at);
    m.longest_gap = waves
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(None, |a: Option<f64>, g| Some(a.map_or(g, |a| a.max(g))))
        .map(Duration::from_secs_f64);
    if !waves.is_empty() {
        m.notes.push(format!(
            "node deletions (s after start: nodes): {}",
            waves
                .iter()
                .map(|(t, n)| format!("{t:.0}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if column.scaler == Scaler::ClusterAutoscaler {
        let text = std::fs::read_to_string(&scaler_log)
            .with_context(|| format!("cannot read {}", scaler_log.display()))?;
        let report = cluster_autoscaler::read_log(
            &text,
            started_at.to_zoned(jiff::tz::TimeZone::UTC).year(),
        );
        m.notes.extend(report.notes(started_at, &remaining));
        m.notes.push(format!("its log: {}", scaler_log.display()));
    }
    Ok(Outcome::Ran(Box::new(m)))
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

fn opt_cpu(c: Option<f64>) -> String {
    c.map_or("-".into(), |c| format!("{c:.2}"))
}

/// The table of one scenario (Markdown), columns named as given, then the notes of each column
/// that ran and the reasons for any that did not.
pub fn table(scenario: &Scenario, results: &[(String, Outcome)]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "### {}\n\n{}\n\n",
        scenario.name, scenario.description
    ));
    out.push_str("| |");
    for (c, _) in results {
        out.push_str(&format!(" {c} |"));
    }
    out.push_str("\n|---|");
    for _ in results {
        out.push_str("---:|");
    }
    out.push('\n');
    type Row = (&'static str, Box<dyn Fn(&Outcome) -> String>);
    let count = |f: fn(&Measured) -> usize| -> Box<dyn Fn(&Outcome) -> String> {
        Box::new(move |o| cell(o, f, |n| n.to_string()))
    };
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
        ("nodes removed", count(|m| m.node_deletes)),
        (
            "most nodes drained at once",
            count(|m| m.most_drains_at_once),
        ),
        (
            "longest gap between removals (s)",
            Box::new(|o| cell(o, |m| m.longest_gap, opt_secs)),
        ),
        ("nodes launched", count(|m| m.node_launches)),
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
            "last node gone, polled (s)",
            Box::new(|o| cell(o, |m| m.last_gone, opt_secs)),
        ),
        (
            "settle or fixed window (s)",
            Box::new(|o| cell(o, |m| Some(m.settle), opt_secs)),
        ),
        ("evictions", count(|m| m.evictions)),
        ("of which DaemonSet pods", count(|m| m.daemonset_evictions)),
        ("refused evictions (429)", count(|m| m.refused_evictions)),
        (
            "evictions by others (refused)",
            Box::new(|o| {
                cell(
                    o,
                    |m| (m.other_evictions, m.other_refused),
                    |(n, r)| format!("{n} ({r})"),
                )
            }),
        ),
        ("direct pod deletes", count(|m| m.direct_pod_deletes)),
        ("replacements moved again", count(|m| m.disrupted_again)),
        ("NodeClaims deleted", count(|m| m.node_claim_deletes)),
        ("PDB violations", count(|m| m.pdb_violations)),
        (
            "longest Pending (s)",
            Box::new(|o| cell(o, |m| m.longest_pending, opt_secs)),
        ),
        ("pods that never came back", count(|m| m.never_came_back)),
        (
            "scaler CPU (s)",
            Box::new(|o| cell(o, |m| m.cpu_seconds, opt_cpu)),
        ),
        (
            "karpenter-kwok CPU (s)",
            Box::new(|o| cell(o, |m| m.karpenter_cpu_seconds, opt_cpu)),
        ),
    ];
    let mut rows = rows;
    if scenario.priced() {
        let priced: Vec<Row> = vec![
            ("GPU nodes removed", count(|m| m.gpu_nodes_removed)),
            (
                "GPUs freed (of)",
                Box::new(|o| {
                    cell(
                        o,
                        |m| (m.gpus_freed, m.gpus_before),
                        |(f, b)| format!("{f} ({b})"),
                    )
                }),
            ),
            (
                "cost freed per hour (of)",
                Box::new(|o| {
                    cell(
                        o,
                        |m| (m.cost_freed_per_hour, m.cost_before_per_hour),
                        |(f, b)| format!("{f:.1} ({b:.1})"),
                    )
                }),
            ),
            (
                "cost kept per hour (cost-first packing keeps: resources only / GPU nodes for GPU pods)",
                Box::new(|o| {
                    cell(
                        o,
                        |m| {
                            (
                                m.cost_before_per_hour - m.cost_freed_per_hour,
                                m.packing_kept_per_hour,
                                m.packing_gpu_rule_kept_per_hour,
                            )
                        },
                        |(k, p, g)| {
                            let f =
                                |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
                            format!("{k:.1} ({} / {})", f(p), f(g))
                        },
                    )
                }),
            ),
        ];
        rows.splice(2..2, priced);
    }
    for (label, f) in &rows {
        out.push_str(&format!("| {label} |"));
        for (_, o) in results {
            out.push_str(&format!(" {} |", f(o)));
        }
        out.push('\n');
    }
    for (c, o) in results {
        match o {
            Outcome::NotRun(why) => out.push_str(&format!("\n{c}: {why}\n")),
            Outcome::Ran(m) if !m.notes.is_empty() => {
                out.push_str(&format!("\n{c}: {}\n", m.notes.join("; ")))
            }
            Outcome::Ran(_) => {}
        }
    }
    out
}

/// The column whose figures stand for ebb in [`summary_line`]: ebb on Karpenter's nodes, as
/// Karpenter launched them, when it ran (the same nodes, and the same termination by Karpenter,
/// as Karpenter's own column), else ebb on kwok nodes.
pub fn summary_ebb_column(results: &[(Column, Outcome)]) -> Column {
    let on_karpenter = Column::new(Scaler::Ebb, Nodes::Karpenter);
    let ran = results
        .iter()
        .any(|(c, o)| *c == on_karpenter && matches!(o, Outcome::Ran(_)));
    if ran {
        on_karpenter
    } else {
        Column::new(Scaler::Ebb, Nodes::Kwok)
    }
}

/// `versus <scenario>: ebb <s> s, cluster-autoscaler <s> s, karpenter <s|n/a> s; removed
/// <n>/<n>/<n>; pdb violations <n>/<n>/<n>` (ebb, Cluster Autoscaler, Karpenter): ebb from
/// [`summary_ebb_column`], Cluster Autoscaler on kwok nodes, Karpenter on its own nodes.
pub fn summary_line(scenario: &Scenario, results: &[(Column, Outcome)]) -> String {
    let get = |c: Column| results.iter().find(|(x, _)| *x == c).map(|(_, o)| o);
    let time = |c| match get(c) {
        Some(Outcome::Ran(m)) => format!(
            "{} s{}",
            m.time_to_final
                .map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())),
            if m.cut { " (cut)" } else { "" }
        ),
        _ => "n/a s".into(),
    };
    let num = |c, f: fn(&Measured) -> usize| match get(c) {
        Some(Outcome::Ran(m)) => f(m).to_string(),
        _ => "n/a".into(),
    };
    let e = summary_ebb_column(results);
    let c = Column::new(Scaler::ClusterAutoscaler, Nodes::Kwok);
    let k = Column::new(Scaler::Karpenter, Nodes::Karpenter);
    let priced = match scenario.priced() {
        false => String::new(),
        true => {
            let gpus = |c| match get(c) {
                Some(Outcome::Ran(m)) => m.gpus_freed.to_string(),
                _ => "n/a".into(),
            };
            let cost = |c| match get(c) {
                Some(Outcome::Ran(m)) => format!("{:.1}", m.cost_freed_per_hour),
                _ => "n/a".into(),
            };
            format!(
                "; gpus freed {}/{}/{}; cost freed per hour {}/{}/{}",
                gpus(e),
                gpus(c),
                gpus(k),
                cost(e),
                cost(c),
                cost(k)
            )
        }
    };
    format!(
        "versus {}: ebb {}, cluster-autoscaler {}, karpenter {}; removed {}/{}/{}; pdb violations {}/{}/{}{priced}",
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

/// `versus <scenario> on kwok nodes: ebb <s> s, cluster-autoscaler <s> s (<x>× sooner);
/// removed <n>/<n>; pdb violations <n>/<n>; never came back <n>/<n>`: ebb and Cluster
/// Autoscaler on the same kwok nodes, or `None` when either did not run.
pub fn kwok_summary_line(scenario: &Scenario, results: &[(Column, Outcome)]) -> Option<String> {
    let get = |c: Column| match results.iter().find(|(x, _)| *x == c) {
        Some((_, Outcome::Ran(m))) => Some(m),
        _ => None,
    };
    let e = get(Column::new(Scaler::Ebb, Nodes::Kwok))?;
    let c = get(Column::new(Scaler::ClusterAutoscaler, Nodes::Kwok))?;
    let time = |m: &Measured| {
        format!(
            "{} s{}",
            m.time_to_final
                .map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())),
            if m.cut { " (cut)" } else { "" }
        )
    };
    let ratio = match (e.time_to_final, c.time_to_final) {
        (Some(a), Some(b)) if a > Duration::ZERO => {
            format!(" ({:.1}× sooner)", b.as_secs_f64() / a.as_secs_f64())
        }
        _ => String::new(),
    };
    Some(format!(
        "versus {} on kwok nodes: ebb {}, cluster-autoscaler {}{ratio}; removed {}/{}; pdb violations {}/{}; never came back {}/{}",
        scenario.name,
        time(e),
        time(c),
        e.node_deletes,
        c.node_deletes,
        e.pdb_violations,
        c.pdb_violations,
        e.never_came_back,
        c.never_came_back,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn deletions_less_than_two_seconds_apart_are_one_wave() {
        let start = at("2026-11-25T10:00:00Z");
        let deletes = [
            at("2026-11-25T10:00:41Z"),
            at("2026-11-25T10:00:40Z"),
            at("2026-11-25T10:00:41.5Z"),
            at("2026-11-25T10:01:40Z"),
        ];
        assert_eq!(removal_waves(&deletes, start), vec![(40.0, 3), (100.0, 1)]);
    }

    #[test]
    fn drains_count_from_the_first_disruption_to_the_deletion() {
        let first: std::collections::HashMap<String, jiff::Timestamp> = [
            ("a".to_string(), at("2026-11-25T10:00:00Z")),
            ("b".to_string(), at("2026-11-25T10:00:05Z")),
            ("c".to_string(), at("2026-11-25T10:00:20Z")),
            // disrupted only after its deletion (the pod garbage collector): not a drain
            ("e".to_string(), at("2026-11-25T10:01:00Z")),
        ]
        .into();
        let deleted: std::collections::BTreeMap<String, jiff::Timestamp> = [
            ("a".to_string(), at("2026-11-25T10:00:10Z")),
            ("b".to_string(), at("2026-11-25T10:00:20Z")),
            ("c".to_string(), at("2026-11-25T10:00:30Z")),
            ("d".to_string(), at("2026-11-25T10:00:30Z")),
            ("e".to_string(), at("2026-11-25T10:00:50Z")),
        ]
        .into();
        // a and b overlap; b ends as c begins.
        assert_eq!(most_drains_at_once(&first, &deleted), 2);
    }

    #[test]
    fn a_scaler_waits_out_its_own_timers() {
        let s = Settings::default();
        let ebb = settle_window(Column::new(Scaler::Ebb, Nodes::Kwok), &s);
        let ca = settle_window(Column::new(Scaler::ClusterAutoscaler, Nodes::Kwok), &s);
        let karpenter = settle_window(Column::new(Scaler::Karpenter, Nodes::Karpenter), &s);
        assert_eq!(ebb, Duration::from_secs(30 + 30 + 20));
        assert!(ca > cluster_autoscaler::UNREMOVABLE_RECHECK + s.unneeded_time);
        assert!(karpenter > KARPENTER_RECONSIDER + s.unneeded_time);
    }

    #[test]
    fn a_replacement_launched_during_the_run_is_not_a_saving() {
        let w = |gpus, per_hour| NodeWorth { gpus, per_hour };
        let removed = [w(8, 24.0), w(4, 10.0), w(0, 1.6)];
        assert_eq!(net_freed(removed.into_iter(), &[]), (12, 35.6));
        let (gpus, cost) = net_freed(removed.into_iter(), &[w(2, 4.0), w(0, 1.6)]);
        assert_eq!(gpus, 10);
        assert!((cost - 30.0).abs() < 1e-9, "{cost}");
        // More launched than removed: nothing freed (GPUs never go below 0).
        assert_eq!(net_freed([w(2, 4.0)].into_iter(), &[w(8, 24.0)]).0, 0);
    }

    #[test]
    fn a_node_is_worth_its_gpus_and_its_shapes_price() {
        let s = scenario::gpu_pool();
        let node = |labels: serde_json::Value, alloc: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels},
                "status": {"allocatable": alloc}}))
            .unwrap()
        };
        let gpu = node(
            json!({"node.kubernetes.io/instance-type": "gpu-4x"}),
            json!({"cpu": "31900m", "nvidia.com/gpu": "4"}),
        );
        assert_eq!(
            NodeWorth::of(&s, &gpu),
            NodeWorth {
                gpus: 4,
                per_hour: 10.0
            }
        );
        // An instance type the scenario does not price, and no GPUs.
        let other = node(
            json!({"node.kubernetes.io/instance-type": "s-4x-amd64-linux"}),
            json!({"cpu": "4"}),
        );
        assert_eq!(NodeWorth::of(&s, &other), NodeWorth::default());
        // A uniform scenario prices nothing.
        assert_eq!(NodeWorth::of(&scenario::mixed_60(), &gpu).per_hour, 0.0);
    }

    #[test]
    fn a_tainted_node_is_a_removal_in_progress() {
        let node = |taint: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"},
                "spec": {"taints": [{"key": taint, "effect": "NoSchedule"}]}}))
            .unwrap()
        };
        assert!(removal_in_progress(&[node(
            "ToBeDeletedByClusterAutoscaler"
        )]));
        assert!(removal_in_progress(&[node("ebb.dev/to-be-deleted")]));
        assert!(removal_in_progress(&[node("karpenter.sh/disrupted")]));
        assert!(!removal_in_progress(&[node(
            "DeletionCandidateOfClusterAutoscaler"
        )]));
    }
}
