//! Karpenter's KWOK provider on the real control plane: its CRDs, the controller process, a
//! NodePool and KWOKNodeClass, and nodes it provisions for pending pods.
//!
//! `e2e/k8s/build.sh peers karpenter` builds `karpenter-kwok` (sigs.k8s.io/karpenter's `kwok`
//! package) and copies Karpenter's CRDs into the cache ([`build`]). [`Karpenter::start`] runs it
//! as a child process against a control plane of the suite (`setup::Cluster::start(Backend::Real,
//! ..)`): out of cluster, without leader election, its metrics and health probe on free ports,
//! its log in the cluster's directory (`karpenter.log`). Its KWOK provider creates the Node of a
//! NodeClaim itself (annotated `kwok.x-k8s.io/node: fake`, provider ID `kwok://<node>`), and the
//! control plane's kwok (`--manage-all-nodes`) makes it Ready.
//!
//! Karpenter acts only on the nodes it manages, those labelled
//! `karpenter.kwok.sh/kwoknodeclass` (so with a NodeClaim): the suite's own kwok nodes
//! (`kwok-node-*`, nodes made by `setup::Cluster::add_nodes`) are never written by it, although
//! they share the `kwok://` provider ID prefix and count as capacity when it simulates scheduling.
//!
//! Deleting a NodeClaim (what ebb's `removal.method: Karpenter` does) makes Karpenter delete the
//! Node, taint it `karpenter.sh/disrupted:NoSchedule`, evict what still runs there, wait at least
//! 5 s (its minimum drain time), then remove the Node's finalizer and, once the Node is gone, the
//! NodeClaim's: the Node goes first, the NodeClaim a moment later.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};

use crate::harness::{TestEnv, free_port, wait_for};
use crate::harness::{tail, wait_http_ready};

/// The label Karpenter puts on the nodes (and NodeClaims) of a NodePool: its name.
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
/// The label the KWOK provider puts on its nodes: their KWOKNodeClass. Karpenter manages exactly
/// the nodes that carry it.
pub const NODECLASS_LABEL: &str = "karpenter.kwok.sh/kwoknodeclass";
/// The taint Karpenter puts (`NoSchedule`) on a node it disrupts or terminates.
pub const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// The instance type a [`PoolSpec`] asks for unless told otherwise: 2 CPUs, 4Gi (1900m and
/// about 4Gi allocatable), amd64, Linux; a pod requesting 1 CPU fills one.
pub const DEFAULT_INSTANCE_TYPE: &str = "c-2x-amd64-linux";
/// The zone and capacity type a [`PoolSpec`] pins (the KWOK provider offers four zones and spot
/// or on-demand at different prices).
pub const ZONE: &str = "test-zone-a";
pub const CAPACITY_TYPE: &str = "on-demand";

const FIELD_MANAGER: &str = "ebb-e2e";

// ---- build --------------------------------------------------------------------------------

/// Where `e2e/k8s/build.sh peers karpenter` put Karpenter.
#[derive(Clone, Debug)]
pub struct Build {
    /// The control plane's bin dir (`.../v1.36.3/bin`).
    pub bin_dir: PathBuf,
    /// `karpenter-kwok`.
    pub binary: PathBuf,
    /// Karpenter's CRDs (`.../v1.36.3/karpenter-crds/*.yaml`): NodePool, NodeClaim,
    /// NodeOverlay, KWOKNodeClass, CapacityBuffer.
    pub crds: PathBuf,
}

/// One build (and one read of the CRDs, which build.sh copies afresh) at a time in this process;
/// the first successful build is kept.
static BUILD: tokio::sync::Mutex<Option<Build>> = tokio::sync::Mutex::const_new(None);

fn k8s_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s").join(name)
}

/// Builds `karpenter-kwok` and copies Karpenter's CRDs when they are not cached (`e2e/k8s/build.sh
/// peers karpenter`: minutes cold, well under a second warm), once per process. Fails with
/// build.sh's reason (Go missing or too old, the module proxy unreachable, ...).
pub async fn build() -> anyhow::Result<Build> {
    let mut built = BUILD.lock().await;
    if let Some(b) = built.as_ref() {
        return Ok(b.clone());
    }
    let script = k8s_script("build.sh");
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .args(["peers", "karpenter"])
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        bail!(
            "Karpenter's KWOK provider could not be built: `{} peers karpenter` failed ({}); it \
             needs Go 1.26+ and the Go module proxy (see e2e/k8s/README.md):\n{tail}",
            script.display(),
            out.status
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let bin_dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .context("build.sh peers printed no bin dir")?;
    let b = Build {
        binary: bin_dir.join("karpenter-kwok"),
        crds: bin_dir
            .parent()
            .context("the bin dir has no parent")?
            .join("karpenter-crds"),
        bin_dir,
    };
    if !b.binary.is_file() {
        bail!(
            "build.sh reported success but {} is missing",
            b.binary.display()
        );
    }
    if !b.crds.is_dir() {
        bail!(
            "build.sh reported success but {} is missing",
            b.crds.display()
        );
    }
    *built = Some(b.clone());
    Ok(b)
}

// ---- CRDs ---------------------------------------------------------------------------------

/// Applies Karpenter's CRDs (from [`build`]) to `env`'s cluster (server-side, so again is fine)
/// and waits until each is Established.
pub async fn install_crds(env: &TestEnv) -> anyhow::Result<()> {
    let b = build().await?;
    // Read under the build lock: build.sh copies the CRDs afresh on every run.
    let texts = {
        let _one = BUILD.lock().await;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&b.crds)
            .with_context(|| format!("cannot read {}", b.crds.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        let mut texts = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            texts.push((f, text));
        }
        texts
    };
    if texts.is_empty() {
        bail!("no CRDs in {}", b.crds.display());
    }
    let api = Api::<CustomResourceDefinition>::all(env.client.clone());
    let mut names = Vec::new();
    for (file, text) in &texts {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(text).with_context(|| format!("parsing {}", file.display()))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying CRD {name} ({})", file.display()))?;
        names.push(name);
    }
    for name in names {
        wait_for(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            || async {
                let crd = api.get_opt(&name).await.ok()??;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await?;
    }
    Ok(())
}

// ---- the controller -----------------------------------------------------------------------

/// How [`Karpenter::start`] runs `karpenter-kwok` (each maps to one of its flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--batch-idle-duration`: how long the provisioner waits for more pending pods (Karpenter's
    /// default 1 s).
    pub batch_idle: Duration,
    /// `--batch-max-duration`: the longest batch (default 10 s).
    pub batch_max: Duration,
    /// `--log-level`: `debug`, `info` or `error`.
    pub log_level: String,
    /// `--feature-gates`, e.g. `NodeRepair=true`; `None` keeps Karpenter's defaults
    /// (NodeRepair, SpotToSpotConsolidation, NodeOverlay, StaticCapacity, CapacityBuffer off;
    /// ReservedCapacity on).
    pub feature_gates: Option<String>,
    /// More flags, appended last.
    pub extra_args: Vec<String>,
    /// How long to wait for its `/readyz` (stretched by `harness::scaled` on a busy machine).
    pub ready_timeout: Duration,
}

impl Default for Settings {
    /// Batches of 200 ms idle, 2 s at most (tests provision in a few seconds), `info` logs.
    fn default() -> Self {
        Self {
            batch_idle: Duration::from_millis(200),
            batch_max: Duration::from_secs(2),
            log_level: "info".into(),
            feature_gates: None,
            extra_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
        }
    }
}

/// `karpenter-kwok` running against a control plane of the suite; killed when dropped (its log
/// stays in the cluster's directory, and its last lines are printed when a test panics).
pub struct Karpenter {
    child: tokio::process::Child,
    log: PathBuf,
    metrics_port: u16,
    health_port: u16,
}

/// A Go duration (`250ms`).
fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl Karpenter {
    /// Builds (when needed) and starts `karpenter-kwok` against `env`, a control plane the suite
    /// started (not a cluster of `EBB_E2E_KUBECONFIG`), as cluster-admin, and returns once its
    /// `/readyz` answers 200. Karpenter's CRDs must be installed ([`install_crds`]). Flags: no
    /// leader election (out of cluster it has no namespace for its Lease), metrics and health
    /// probe on free ports, the batch windows and log level of `settings`; its environment is
    /// only `KUBECONFIG`, so that no variable of the test's (`LOG_LEVEL`, `FEATURE_GATES`, ...)
    /// changes its defaults. Its log (JSON lines) goes to `DIR/karpenter.log`, appended to.
    pub async fn start(env: &TestEnv, settings: &Settings) -> anyhow::Result<Self> {
        let real = env.real().context(
            "Karpenter's KWOK provider runs only on a control plane the suite starts, whose kwok \
             makes its nodes Ready; unset EBB_E2E_KUBECONFIG",
        )?;
        let b = build().await?;
        let crds = Api::<CustomResourceDefinition>::all(env.client.clone());
        for crd in ["nodepools.karpenter.sh", "nodeclaims.karpenter.sh"] {
            if crds.get_opt(crd).await?.is_none() {
                bail!("CRD {crd} is not installed: call karpenter::install_crds first");
            }
        }
        let metrics_port = free_port()?;
        let health_port = loop {
            let p = free_port()?;
            if p != metrics_port {
                break p;
            }
        };
        let mut args = vec![
            "--disable-leader-election=true".to_string(),
            format!("--metrics-port={metrics_port}"),
            format!("--health-probe-port={health_port}"),
            format!("--batch-idle-duration={}", go_duration(settings.batch_idle)),
            format!("--batch-max-duration={}", go_duration(settings.batch_max)),
            format!("--log-level={}", settings.log_level),
        ];
        if let Some(g) = &settings.feature_gates {
            args.push(format!("--feature-gates={g}"));
        }
        args.extend(settings.extra_args.iter().cloned());
        let log = real.dir().join("karpenter.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let err = out.try_clone()?;
        let kubeconfig = real.kubeconfig();
        let _ = std::fs::write(
            real.dir().join("karpenter.cmd"),
            format!(
                "KUBECONFIG={} {} {}\n",
                kubeconfig.display(),
                b.binary.display(),
                args.join(" ")
            ),
        );
        let child = tokio::process::Command::new(&b.binary)
            .args(&args)
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", b.binary.display()))?;
        let mut k = Self {
            child,
            log,
            metrics_port,
            health_port,
        };
        let log = k.log.clone();
        wait_http_ready(
            &mut k.child,
            "karpenter-kwok",
            &log,
            health_port,
            "/readyz",
            // Stretched for a busy machine like the harness's other waits: in the full suite on
            // 3 lanes it once needed more than 60 s.
            crate::harness::scaled(settings.ready_timeout),
        )
        .await?;
        Ok(k)
    }

    /// Its log file (`DIR/karpenter.log`, JSON lines).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// The lines of its log at level ERROR (Karpenter logs JSON: `"level":"ERROR"`).
    pub fn errors(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(r#""level":"ERROR""#))
            .map(str::to_string)
            .collect()
    }

    /// `127.0.0.1:<port>` of its Prometheus `/metrics` (for `setup::fetch_metrics`).
    pub fn metrics_address(&self) -> String {
        format!("127.0.0.1:{}", self.metrics_port)
    }

    /// The port of its health probe (`/healthz`, `/readyz`).
    pub fn health_port(&self) -> u16 {
        self.health_port
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills it (SIGKILL) and waits for it to go.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.child
            .kill()
            .await
            .context("cannot kill karpenter-kwok")
    }
}

impl Drop for Karpenter {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- {} (last 40 lines) ----\n{}",
                self.log.display(),
                tail(&self.log, 40)
            );
        }
    }
}

// ---- NodePools ----------------------------------------------------------------------------

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn node_pools(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("karpenter.sh", "v1", "NodePool", "nodepools"),
    )
}

fn node_claims_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("karpenter.sh", "v1", "NodeClaim", "nodeclaims"),
    )
}

fn node_classes(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource(
            "karpenter.kwok.sh",
            "v1alpha1",
            "KWOKNodeClass",
            "kwoknodeclasses",
        ),
    )
}

/// `spec.disruption.consolidationPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consolidation {
    /// Only nodes without pods (other than DaemonSet pods).
    WhenEmpty,
    /// Empty nodes, and nodes whose pods fit elsewhere (Karpenter's default).
    WhenEmptyOrUnderutilized,
}

impl Consolidation {
    fn as_str(self) -> &'static str {
        match self {
            Self::WhenEmpty => "WhenEmpty",
            Self::WhenEmptyOrUnderutilized => "WhenEmptyOrUnderutilized",
        }
    }
}

/// One of `spec.disruption.budgets`: how many of the pool's nodes Karpenter's own disruption
/// (consolidation, drift) may take down at once. Deleting a NodeClaim directly is not held to
/// them, but a NodeClaim being deleted counts against them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// A count (`"1"`) or a percentage (`"10%"`).
    pub nodes: String,
    /// `Underutilized`, `Empty`, `Drifted`; empty: all.
    pub reasons: Vec<String>,
    /// A cron schedule during which it applies (with `duration`).
    pub schedule: Option<String>,
    /// How long it applies from each `schedule` (`1h`, `30m`).
    pub duration: Option<String>,
}

impl Budget {
    /// `nodes` at once, for every reason, always.
    pub fn nodes(nodes: &str) -> Self {
        Self {
            nodes: nodes.into(),
            reasons: Vec::new(),
            schedule: None,
            duration: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut b = json!({"nodes": self.nodes});
        if !self.reasons.is_empty() {
            b["reasons"] = json!(self.reasons);
        }
        if let Some(s) = &self.schedule {
            b["schedule"] = json!(s);
        }
        if let Some(d) = &self.duration {
            b["duration"] = json!(d);
        }
        b
    }
}

/// A NodePool and its KWOKNodeClass (both named `name`).
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub name: String,
    pub consolidation_policy: Consolidation,
    /// `spec.disruption.consolidateAfter`: a duration (`30s`, `5m`) or `Never`, which turns
    /// Karpenter's own consolidation off.
    pub consolidate_after: String,
    /// `spec.disruption.budgets`; empty: Karpenter's default (`nodes: 10%`).
    pub budgets: Vec<Budget>,
    /// The instance types it may launch (requirement `node.kubernetes.io/instance-type In`); the
    /// cheapest that fits is chosen. Zone [`ZONE`] and capacity type [`CAPACITY_TYPE`] are
    /// pinned too, so the nodes are predictable.
    pub instance_types: Vec<String>,
    /// Labels of its nodes besides Karpenter's (an object), e.g. what a ScaleDownPolicy selects.
    pub labels: Value,
    /// Taints of its nodes (an array of `{key, value, effect}`).
    pub taints: Value,
    /// `spec.limits` (an object such as `{cpu: "20"}`), if any.
    pub limits: Option<Value>,
    /// `spec.template.spec.expireAfter`: `Never` (default) or a duration.
    pub expire_after: String,
    /// The KWOKNodeClass's `nodeRegistrationDelay` (`5s`): how long after launch the provider
    /// creates the Node.
    pub registration_delay: Option<String>,
}

impl PoolSpec {
    /// `name`: [`DEFAULT_INSTANCE_TYPE`] nodes, `WhenEmptyOrUnderutilized` but
    /// `consolidateAfter: Never` (Karpenter never removes a node by itself), default budgets,
    /// no expiry, no extra labels or taints.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            consolidation_policy: Consolidation::WhenEmptyOrUnderutilized,
            consolidate_after: "Never".into(),
            budgets: Vec::new(),
            instance_types: vec![DEFAULT_INSTANCE_TYPE.into()],
            labels: json!({}),
            taints: json!([]),
            limits: None,
            expire_after: "Never".into(),
            registration_delay: None,
        }
    }

    /// The KWOKNodeClass, as applied.
    pub fn node_class_json(&self) -> Value {
        let mut spec = json!({});
        if let Some(d) = &self.registration_delay {
            spec["nodeRegistrationDelay"] = json!(d);
        }
        json!({
            "apiVersion": "karpenter.kwok.sh/v1alpha1",
            "kind": "KWOKNodeClass",
            "metadata": {"name": self.name},
            "spec": spec,
        })
    }

    /// The NodePool, as applied.
    pub fn node_pool_json(&self) -> Value {
        let mut disruption = json!({
            "consolidationPolicy": self.consolidation_policy.as_str(),
            "consolidateAfter": self.consolidate_after,
        });
        if !self.budgets.is_empty() {
            disruption["budgets"] = self.budgets.iter().map(Budget::to_json).collect();
        }
        let mut template_spec = json!({
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                "name": self.name},
            "expireAfter": self.expire_after,
            "requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In",
                    "values": self.instance_types},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [CAPACITY_TYPE]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
            ],
        });
        if self.taints.as_array().is_some_and(|t| !t.is_empty()) {
            template_spec["taints"] = self.taints.clone();
        }
        let mut spec = json!({
            "template": {"metadata": {"labels": self.labels}, "spec": template_spec},
            "disruption": disruption,
        });
        if let Some(l) = &self.limits {
            spec["limits"] = l.clone();
        }
        json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": self.name},
            "spec": spec,
        })
    }
}

/// Applies (server-side: creates or updates) `spec`'s KWOKNodeClass and NodePool. Karpenter
/// provisions for the pool once it is Ready ([`wait_node_pool_ready`]).
pub async fn node_pool(client: &kube::Client, spec: &PoolSpec) -> anyhow::Result<()> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    node_classes(client)
        .patch(&spec.name, &pp, &Patch::Apply(spec.node_class_json()))
        .await
        .with_context(|| format!("applying KWOKNodeClass {}", spec.name))?;
    node_pools(client)
        .patch(&spec.name, &pp, &Patch::Apply(spec.node_pool_json()))
        .await
        .with_context(|| format!("applying NodePool {}", spec.name))?;
    Ok(())
}

/// Waits until Karpenter reports the NodePool `name` Ready (its KWOKNodeClass Ready and the pool
/// validated); needs Karpenter running.
pub async fn wait_node_pool_ready(
    client: &kube::Client,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api = node_pools(client);
    wait_for(&format!("NodePool {name} Ready"), timeout, || async {
        let p = api.get_opt(name).await.ok()??;
        p.data["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
            .then_some(())
    })
    .await
}

/// Deletes the NodePool `name` (Karpenter then deletes its NodeClaims) and its KWOKNodeClass.
pub async fn delete_node_pool(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    for api in [node_pools(client), node_classes(client)] {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {name}")),
        }
    }
    Ok(())
}

// ---- NodeClaims ---------------------------------------------------------------------------

/// What a test needs of a NodeClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeClaimInfo {
    pub name: String,
    /// Its NodePool (label [`NODEPOOL_LABEL`]).
    pub pool: Option<String>,
    /// `status.nodeName`: its Node once registered.
    pub node_name: Option<String>,
    /// `metadata.deletionTimestamp` (RFC 3339), when it is being deleted.
    pub deletion_timestamp: Option<String>,
    /// Its `Ready` condition is True (launched, registered and initialized).
    pub ready: bool,
}

impl NodeClaimInfo {
    fn of(o: &DynamicObject) -> Self {
        let s = |v: &Value| v.as_str().filter(|x| !x.is_empty()).map(str::to_string);
        Self {
            name: o.metadata.name.clone().unwrap_or_default(),
            pool: o
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(NODEPOOL_LABEL).cloned()),
            node_name: s(&o.data["status"]["nodeName"]),
            deletion_timestamp: o
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
            ready: o.data["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            }),
        }
    }
}

/// Every NodeClaim, by name.
pub async fn node_claims(client: &kube::Client) -> anyhow::Result<Vec<NodeClaimInfo>> {
    let list = node_claims_api(client)
        .list(&ListParams::default())
        .await
        .context("listing NodeClaims")?;
    let mut v: Vec<NodeClaimInfo> = list.items.iter().map(NodeClaimInfo::of).collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(v)
}

/// The NodeClaim whose `status.nodeName` is `node`, if any.
pub async fn node_claim_of(
    client: &kube::Client,
    node: &str,
) -> anyhow::Result<Option<NodeClaimInfo>> {
    Ok(node_claims(client)
        .await?
        .into_iter()
        .find(|c| c.node_name.as_deref() == Some(node)))
}

/// Deletes the NodeClaim `name` (what ebb's `removal.method: Karpenter` does after a drain);
/// returns at once, Karpenter terminates it.
pub async fn delete_node_claim(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    node_claims_api(client)
        .delete(name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting NodeClaim {name}"))?;
    Ok(())
}

/// When, after [`wait_gone`] was called, a NodeClaim and its Node went, and what the Node
/// carried meanwhile.
#[derive(Clone, Debug)]
pub struct Gone {
    /// The Node was first seen with a deletion timestamp (`None`: not seen before it was gone).
    pub node_deleting: Option<Duration>,
    /// The Node was first seen tainted [`DISRUPTED_TAINT`].
    pub node_disrupted: Option<Duration>,
    pub node_gone: Duration,
    pub node_claim_gone: Duration,
    /// Every taint seen on the Node while it went (`key=value:Effect`, `key:Effect` without
    /// value), in the order first seen.
    pub taints: Vec<String>,
}

fn taint_strings(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| match t.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
            _ => format!("{}:{}", t.key, t.effect),
        })
        .collect()
}

/// Waits until both the NodeClaim `node_claim` and the Node `node` are gone (polling every
/// 100 ms), recording when each went and the Node's taints meanwhile; fails after `timeout`
/// saying what is left.
pub async fn wait_gone(
    client: &kube::Client,
    node_claim: &str,
    node: &str,
    timeout: Duration,
) -> anyhow::Result<Gone> {
    let t0 = Instant::now();
    let claims = node_claims_api(client);
    let nodes = Api::<Node>::all(client.clone());
    let mut g = Gone {
        node_deleting: None,
        node_disrupted: None,
        node_gone: Duration::ZERO,
        node_claim_gone: Duration::ZERO,
        taints: Vec::new(),
    };
    let (mut node_there, mut claim_there) = (true, true);
    loop {
        if node_there {
            match nodes.get_opt(node).await {
                Ok(Some(n)) => {
                    let now = t0.elapsed();
                    if n.metadata.deletion_timestamp.is_some() {
                        g.node_deleting.get_or_insert(now);
                    }
                    for t in taint_strings(&n) {
                        if t.starts_with(&format!("{DISRUPTED_TAINT}:"))
                            || t.starts_with(&format!("{DISRUPTED_TAINT}="))
                        {
                            g.node_disrupted.get_or_insert(now);
                        }
                        if !g.taints.contains(&t) {
                            g.taints.push(t);
                        }
                    }
                }
                Ok(None) => {
                    node_there = false;
                    g.node_gone = t0.elapsed();
                }
                Err(_) => {}
            }
        }
        if claim_there && let Ok(None) = claims.get_opt(node_claim).await {
            claim_there = false;
            g.node_claim_gone = t0.elapsed();
        }
        if !node_there && !claim_there {
            return Ok(g);
        }
        if t0.elapsed() >= timeout {
            let left: Vec<String> = [
                claim_there.then(|| format!("NodeClaim {node_claim}")),
                node_there.then(|| format!("Node {node}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            bail!(
                "{} still there {timeout:?} after the wait began (taints seen: {:?})",
                left.join(" and "),
                g.taints
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- workloads ----------------------------------------------------------------------------

/// A Deployment whose pods only a NodePool's nodes take, sized to need a node each.
#[derive(Clone, Debug)]
pub struct Provision {
    /// The Deployment's name; its pods are labelled `app: <name>`.
    pub name: String,
    pub namespace: String,
    /// The NodePool (node selector [`NODEPOOL_LABEL`]`: <pool>`).
    pub pool: String,
    /// Replicas, and so nodes.
    pub nodes: usize,
    /// Each pod's requests. 1 CPU fills a [`DEFAULT_INSTANCE_TYPE`] node (1900m allocatable).
    pub cpu: String,
    pub memory: String,
    /// Required pod anti-affinity on `kubernetes.io/hostname`: one pod per node whatever the
    /// requests.
    pub one_per_node: bool,
    pub grace_secs: i64,
    /// Extra labels of the pods (an object).
    pub labels: Value,
    /// The pods' tolerations (an array), for a pool with taints.
    pub tolerations: Value,
    /// How long to wait for the nodes and pods.
    pub timeout: Duration,
}

impl Provision {
    /// `nodes` pods of 1 CPU and 256Mi in `default`, one per node, a 1 s grace period, 60 s to
    /// come up.
    pub fn new(name: &str, pool: &str, nodes: usize) -> Self {
        Self {
            name: name.into(),
            namespace: "default".into(),
            pool: pool.into(),
            nodes,
            cpu: "1".into(),
            memory: "256Mi".into(),
            one_per_node: true,
            grace_secs: 1,
            labels: json!({}),
            tolerations: json!([]),
            timeout: Duration::from_secs(60),
        }
    }

    /// The Deployment, as applied.
    pub fn deployment_json(&self) -> Value {
        let mut labels = self.labels.as_object().cloned().unwrap_or_default();
        labels.insert("app".into(), json!(self.name));
        let mut pod_spec = json!({
            "nodeSelector": {NODEPOOL_LABEL: self.pool},
            "terminationGracePeriodSeconds": self.grace_secs,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": self.cpu, "memory": self.memory}}}],
        });
        if self.tolerations.as_array().is_some_and(|t| !t.is_empty()) {
            pod_spec["tolerations"] = self.tolerations.clone();
        }
        if self.one_per_node {
            pod_spec["affinity"] = json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"app": self.name}},
                    "topologyKey": "kubernetes.io/hostname"}]}});
        }
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": labels},
            "spec": {"replicas": self.nodes, "selector": {"matchLabels": {"app": self.name}},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
        })
    }
}

/// What [`provision`] brought up: `nodes[i]` is `node_claims[i]`'s Node and runs `pods[i]`.
#[derive(Clone, Debug)]
pub struct Provisioned {
    pub deployment: String,
    pub namespace: String,
    pub nodes: Vec<String>,
    pub node_claims: Vec<String>,
    pub pods: Vec<String>,
    /// From the Deployment's apply to all pods Running and Ready.
    pub took: Duration,
}

impl Provisioned {
    /// The NodeClaim of `node`, if it is one of these.
    pub fn node_claim_of(&self, node: &str) -> Option<&str> {
        let i = self.nodes.iter().position(|n| n == node)?;
        Some(&self.node_claims[i])
    }
}

fn ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn running_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Applies `p`'s Deployment (again: scales it) and waits until its `p.nodes` pods run, Ready,
/// each on a Ready Node of a Ready NodeClaim of `p.pool` (Karpenter launching one per pending
/// pod; a NodeClaim is Ready once Karpenter saw its Node registered and initialized).
/// Fails after `p.timeout` describing the NodeClaims and pods it saw.
pub async fn provision(client: &kube::Client, p: &Provision) -> anyhow::Result<Provisioned> {
    let t0 = Instant::now();
    Api::<Deployment>::namespaced(client.clone(), &p.namespace)
        .patch(
            &p.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(p.deployment_json()),
        )
        .await
        .with_context(|| format!("applying Deployment {}/{}", p.namespace, p.name))?;
    let pods_api = Api::<Pod>::namespaced(client.clone(), &p.namespace);
    let nodes_api = Api::<Node>::all(client.clone());
    let lp = ListParams::default().labels(&format!("app={}", p.name));
    let mut last = String::new();
    loop {
        let state: anyhow::Result<Option<Provisioned>> = async {
            let pods = pods_api.list(&lp).await?.items;
            let claims = node_claims(client).await?;
            let nodes: BTreeMap<String, Node> = nodes_api
                .list(&ListParams::default().labels(&format!("{NODEPOOL_LABEL}={}", p.pool)))
                .await?
                .items
                .into_iter()
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                .collect();
            let live: Vec<&Pod> = pods
                .iter()
                .filter(|x| x.metadata.deletion_timestamp.is_none())
                .collect();
            let pool_claims: Vec<&NodeClaimInfo> = claims
                .iter()
                .filter(|c| c.pool.as_deref() == Some(p.pool.as_str()))
                .collect();
            last = format!(
                "pods: {}; NodeClaims of {}: {}",
                live.iter()
                    .map(|x| format!(
                        "{}@{}:{}",
                        x.metadata.name.as_deref().unwrap_or_default(),
                        x.spec
                            .as_ref()
                            .and_then(|s| s.node_name.as_deref())
                            .unwrap_or("-"),
                        x.status
                            .as_ref()
                            .and_then(|s| s.phase.as_deref())
                            .unwrap_or("?")
                    ))
                    .collect::<Vec<_>>()
                    .join(", "),
                p.pool,
                pool_claims
                    .iter()
                    .map(|c| format!(
                        "{}->{}{}{}",
                        c.name,
                        c.node_name.as_deref().unwrap_or("-"),
                        if c.ready { " ready" } else { "" },
                        if c.deletion_timestamp.is_some() {
                            " deleting"
                        } else {
                            ""
                        }
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if live.len() != p.nodes || !live.iter().all(|x| running_ready(x)) {
                return Ok(None);
            }
            let mut out = Vec::new();
            let mut seen = BTreeSet::new();
            for pod in live {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                let Some(claim) = pool_claims
                    .iter()
                    .find(|c| c.node_name.as_deref() == Some(node.as_str()))
                else {
                    return Ok(None);
                };
                if !claim.ready
                    || claim.deletion_timestamp.is_some()
                    || !nodes.get(&node).is_some_and(ready)
                {
                    return Ok(None);
                }
                if p.one_per_node && !seen.insert(node.clone()) {
                    return Ok(None);
                }
                out.push((
                    node,
                    claim.name.clone(),
                    pod.metadata.name.clone().unwrap_or_default(),
                ));
            }
            out.sort();
            Ok(Some(Provisioned {
                deployment: p.name.clone(),
                namespace: p.namespace.clone(),
                nodes: out.iter().map(|x| x.0.clone()).collect(),
                node_claims: out.iter().map(|x| x.1.clone()).collect(),
                pods: out.iter().map(|x| x.2.clone()).collect(),
                took: t0.elapsed(),
            }))
        }
        .await;
        if let Ok(Some(done)) = state {
            return Ok(done);
        }
        if t0.elapsed() >= p.timeout {
            bail!(
                "Karpenter did not bring up {} node(s) of pool {} for {}/{} within {:?}: {last}",
                p.nodes,
                p.pool,
                p.namespace,
                p.name,
                p.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Takes `p`'s pods off `node` as a scale-in would, without replacements: gives them the lowest
/// `controller.kubernetes.io/pod-deletion-cost`, scales the Deployment down by their number and
/// waits until they are gone. The node is left empty (what ebb's drain leaves before it deletes
/// the NodeClaim) and, with `consolidateAfter: Never`, Karpenter leaves it be.
pub async fn empty_node(client: &kube::Client, p: &Provisioned, node: &str) -> anyhow::Result<()> {
    let pods_api = Api::<Pod>::namespaced(client.clone(), &p.namespace);
    let lp = ListParams::default().labels(&format!("app={}", p.deployment));
    let on_node: Vec<String> = pods_api
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|x| x.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|x| x.metadata.name)
        .collect();
    if on_node.is_empty() {
        return Ok(());
    }
    for name in &on_node {
        pods_api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations":
                    {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}})),
            )
            .await
            .with_context(|| format!("annotating pod {name}"))?;
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), &p.namespace);
    let d = deployments.get(&p.deployment).await?;
    let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1);
    let to = (replicas - on_node.len() as i32).max(0);
    deployments
        .patch(
            &p.deployment,
            // a merge patch: an apply of only the replicas would drop the template we applied
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": to}})),
        )
        .await
        .with_context(|| format!("scaling {} to {to}", p.deployment))?;
    wait_for(
        &format!("the pods of {} off {node}", p.deployment),
        Duration::from_secs(60),
        || async {
            let left = pods_api.list(&lp).await.ok()?.items;
            (!left
                .iter()
                .any(|x| x.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)))
            .then_some(())
        },
    )
    .await
}

// ---- NodeClaims created directly ----------------------------------------------------------

impl Karpenter {
    /// Its process id while it runs (for its CPU time in `/proc/<pid>/stat`).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The NodeClaim Karpenter's provisioner would create for a node of `pool` (a NodePool as read
/// from the API server), without resource requests: `generateName: <pool>-`; the template's
/// labels and the [`NODEPOOL_LABEL`]; the pool's hash annotations; the NodePool as owner;
/// the template's `nodeClassRef`, `expireAfter`, taints and requirements, plus one `In`
/// requirement for the pool and for each template label.
pub fn node_claim_json(pool: &DynamicObject) -> anyhow::Result<Value> {
    let name = pool
        .metadata
        .name
        .clone()
        .context("the NodePool has no name")?;
    let uid = pool
        .metadata
        .uid
        .clone()
        .context("the NodePool has no uid")?;
    let template = &pool.data["spec"]["template"];
    let tspec = &template["spec"];
    let mut labels = template["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut requirements = tspec["requirements"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (k, v) in &labels {
        requirements.push(json!({"key": k, "operator": "In", "values": [v]}));
    }
    requirements.push(json!({"key": NODEPOOL_LABEL, "operator": "In", "values": [name]}));
    labels.insert(NODEPOOL_LABEL.into(), json!(name));
    let mut annotations = template["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for key in [
        "karpenter.sh/nodepool-hash",
        "karpenter.sh/nodepool-hash-version",
    ] {
        if let Some(v) = pool.metadata.annotations.as_ref().and_then(|a| a.get(key)) {
            annotations.insert(key.into(), json!(v));
        }
    }
    let mut spec = json!({
        "nodeClassRef": tspec["nodeClassRef"],
        "requirements": requirements,
    });
    for field in [
        "expireAfter",
        "terminationGracePeriod",
        "taints",
        "startupTaints",
    ] {
        if !tspec[field].is_null() {
            spec[field] = tspec[field].clone();
        }
    }
    Ok(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "generateName": format!("{name}-"),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "name": name, "uid": uid, "blockOwnerDeletion": true}],
        },
        "spec": spec,
    }))
}

/// Creates `count` NodeClaims of the NodePool `pool` ([`node_claim_json`]) and returns their
/// names. Karpenter launches a NodeClaim whoever created it (its KWOK provider then creates the
/// Node), and treats it as the pool's: its consolidation and disruption budgets apply. This
/// gives exactly `count` nodes without pending pods to provision for; the pool's `limits` are
/// not checked (Karpenter checks them only when it provisions).
pub async fn create_node_claims(
    client: &kube::Client,
    pool: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    create_node_claims_of_type(client, pool, count, None).await
}

/// [`create_node_claims`], each NodeClaim asking for `instance_type` when given: its
/// `node.kubernetes.io/instance-type In` requirement (the pool's types) narrowed to that one.
/// Narrowed, not added: Karpenter does not intersect two requirements on the same key (with both,
/// it launched the cheapest of the pool's types).
pub async fn create_node_claims_of_type(
    client: &kube::Client,
    pool: &str,
    count: usize,
    instance_type: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let p = node_pools(client)
        .get(pool)
        .await
        .with_context(|| format!("reading NodePool {pool}"))?;
    let mut json = node_claim_json(&p)?;
    if let Some(t) = instance_type {
        narrow_instance_type(&mut json, t);
    }
    let claim: DynamicObject = serde_json::from_value(json)?;
    let api = node_claims_api(client);
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let created = api
            .create(&kube::api::PostParams::default(), &claim)
            .await
            .with_context(|| format!("creating a NodeClaim of {pool}"))?;
        names.push(created.metadata.name.unwrap_or_default());
    }
    Ok(names)
}

/// Makes a NodeClaim's requirements ask for instance type `t` alone: its `In` requirement on
/// `node.kubernetes.io/instance-type` becomes `[t]` (one is added when there is none).
pub fn narrow_instance_type(claim: &mut Value, t: &str) {
    const KEY: &str = "node.kubernetes.io/instance-type";
    let wanted = json!({"key": KEY, "operator": "In", "values": [t]});
    let Some(reqs) = claim["spec"]["requirements"].as_array_mut() else {
        claim["spec"]["requirements"] = json!([wanted]);
        return;
    };
    reqs.retain(|r| r["key"] != KEY);
    reqs.push(wanted);
}

/// Waits until each NodeClaim of `names` is Ready (launched, registered, initialized), not being
/// deleted, and its Node Ready; returns them in the order of `names`. Fails after `timeout`
/// saying how many are not there yet.
pub async fn wait_node_claims_ready(
    client: &kube::Client,
    names: &[String],
    timeout: Duration,
) -> anyhow::Result<Vec<NodeClaimInfo>> {
    let nodes_api = Api::<Node>::all(client.clone());
    let t0 = Instant::now();
    loop {
        let claims = node_claims(client).await?;
        let ready_nodes: BTreeSet<String> = nodes_api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| ready(n))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(c) = claims.iter().find(|c| &c.name == name)
                && c.ready
                && c.deletion_timestamp.is_none()
                && c.node_name
                    .as_ref()
                    .is_some_and(|n| ready_nodes.contains(n))
            {
                out.push(c.clone());
            }
        }
        if out.len() == names.len() {
            return Ok(out);
        }
        if t0.elapsed() >= timeout {
            bail!(
                "{} of {} NodeClaims Ready with a Ready Node after {timeout:?}",
                out.len(),
                names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sets NodeClaim `name`'s `status.lastPodEventTime` (RFC 3339), which Karpenter's
/// `consolidateAfter` counts from: as if a pod had been bound to its node at `time`.
pub async fn set_last_pod_event_time(
    client: &kube::Client,
    name: &str,
    time: &str,
) -> anyhow::Result<()> {
    node_claims_api(client)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"lastPodEventTime": time}})),
        )
        .await
        .with_context(|| format!("setting lastPodEventTime of NodeClaim {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_narrowed_to_one_instance_type_not_given_a_second_requirement() {
        let mut claim = json!({"spec": {"requirements": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["a", "b"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ]}});
        narrow_instance_type(&mut claim, "b");
        let reqs = claim["spec"]["requirements"].as_array().unwrap();
        let types: Vec<&Value> = reqs
            .iter()
            .filter(|r| r["key"] == "node.kubernetes.io/instance-type")
            .collect();
        assert_eq!(types.len(), 1, "{reqs:?}");
        assert_eq!(types[0]["values"], json!(["b"]));
        assert!(
            reqs.iter()
                .any(|r| r["key"] == "karpenter.sh/capacity-type")
        );
        let mut bare = json!({"spec": {}});
        narrow_instance_type(&mut bare, "c");
        assert_eq!(bare["spec"]["requirements"][0]["values"], json!(["c"]));
    }
}
